"""A storage plan as stages (gridcore.policies.dataplan_stages): the traversals of the
paper's Fig. 2 written as fetch / jobs / evict steps, and the WAN pacing of live copies."""

from __future__ import annotations

import pytest

from gridcore.errors import ConfigError
from gridcore.model import MB
from gridcore.policies.dataplan import Strategy
from gridcore.policies.dataplan_stages import Stage, StageKind, plan_stages
from gridcore.staging import Throttle

F, J, E = StageKind.FETCH, StageKind.JOBS, StageKind.EVICT


def shape(
    stages: tuple[Stage, ...],
) -> list[tuple[str, str, tuple[int, ...], tuple[int, ...], int]]:
    return [(s.kind.value, s.name, s.depths, s.pipelines, s.concurrency) for s in stages]


def test_all_batch_fetches_everything_then_runs_pipelines_depth_first_at_eq15_c() -> None:
    stages = plan_stages(Strategy.ALL_BATCH, W=3, D=3, N_CPU=4, concurrency=2.0)
    assert shape(stages) == [
        ("fetch", "fetch", (0, 1, 2), (), 1),
        ("jobs", "pipelines", (0, 1, 2), (0, 1, 2), 2),
        ("evict", "evict", (0, 1, 2), (), 1),
    ]


def test_all_runs_as_many_pipelines_as_processors() -> None:
    stages = plan_stages(Strategy.ALL, W=9, D=2, N_CPU=4, concurrency=1.0)
    assert shape(stages)[1] == ("jobs", "pipelines", (0, 1), tuple(range(9)), 4)


def test_slice_is_breadth_first_with_a_barrier_per_depth() -> None:
    # Fig. 2's Slice for W = D = 3: each depth's batch volume, every pipeline's job at
    # that depth, the volume evicted before the next depth's is fetched
    stages = plan_stages(Strategy.SLICE, W=3, D=3, N_CPU=8, concurrency=1.5)
    assert shape(stages) == [
        (
            kind,
            f"{kind}_d{d}",
            (d,),
            (0, 1, 2) if kind == "jobs" else (),
            3 if kind == "jobs" else 1,
        )
        for d in range(3)
        for kind in ("fetch", "jobs", "evict")
    ]


def test_minimal_runs_groups_of_eq23_c_each_a_slice_refetching_every_batch_volume() -> None:
    stages = plan_stages(Strategy.MINIMAL, W=3, D=3, N_CPU=8, concurrency=2)
    groups = [s.pipelines for s in stages if s.kind is J]
    assert groups == [(0, 1)] * 3 + [(2,)] * 3
    assert [s.name for s in stages if s.kind is F] == [
        "fetch_g0_d0",
        "fetch_g0_d1",
        "fetch_g0_d2",
        "fetch_g1_d0",
        "fetch_g1_d1",
        "fetch_g1_d2",
    ]
    assert [s.concurrency for s in stages if s.kind is J] == [2, 2, 2, 1, 1, 1]


def test_a_chosen_group_width_overrides_eq23_and_jobs_stay_within_the_processors() -> None:
    stages = plan_stages(Strategy.MINIMAL, W=10, D=1, N_CPU=4, concurrency=2, group_width=6)
    assert [(s.pipelines, s.concurrency) for s in stages if s.kind is J] == [
        (tuple(range(6)), 4),
        (tuple(range(6, 10)), 4),
    ]


def test_depths_without_a_batch_volume_get_no_fetch_or_evict() -> None:
    stages = plan_stages(Strategy.SLICE, W=2, D=2, N_CPU=2, concurrency=2, batch_depths=[1])
    assert [s.name for s in stages] == ["jobs_d0", "fetch_d1", "jobs_d1", "evict_d1"]
    remote = plan_stages(Strategy.REMOTE, W=5, D=2, N_CPU=2, concurrency=1)
    assert shape(remote) == [("jobs", "pipelines", (0, 1), tuple(range(5)), 2)]


def test_stage_names_are_unique_task_ids() -> None:
    for strategy in Strategy:
        names = [s.name for s in plan_stages(strategy, W=7, D=3, N_CPU=3, concurrency=2)]
        assert len(names) == len(set(names))
        assert all(n.replace("_", "").isalnum() for n in names)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"W": 0}, "W"),
        ({"D": True}, "D"),
        ({"N_CPU": -1}, "N_CPU"),
        ({"group_width": 0}, "group_width"),
        ({"batch_depths": [3]}, "batch_depths"),
    ],
)
def test_bad_arguments_are_refused_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"W": 3, "D": 3, "N_CPU": 2, "concurrency": 1.0} | kwargs
    with pytest.raises(ConfigError, match=rf"plan_stages: {field} "):
        plan_stages(Strategy.MINIMAL, **args)  # type: ignore[arg-type]


def test_throttle_paces_a_copy_to_its_rate() -> None:
    now = [100.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    throttle = Throttle(2.0, clock=lambda: now[0], sleep=sleep)
    throttle(1 * MB, 4 * MB)  # 1 MB at 2 MB/s is due at 0.5 s; instantly copied
    assert slept == [pytest.approx(0.5)]
    now[0] += 1.0  # a slow chunk: already behind, no sleep
    throttle(2 * MB, 4 * MB)
    assert len(slept) == 1
    throttle(4 * MB, 4 * MB)  # 4 MB due at 2 s, 1.5 s elapsed
    assert slept[-1] == pytest.approx(0.5)


@pytest.mark.parametrize("rate", [0.0, -1.0, float("inf"), float("nan")])
def test_throttle_refuses_a_rate_that_is_not_finite_and_positive(rate: float) -> None:
    with pytest.raises(ConfigError, match="mbps must be a finite rate > 0"):
        Throttle(rate)
