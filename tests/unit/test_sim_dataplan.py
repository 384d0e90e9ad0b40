"""Bent et al.'s storage plans on the shared simulated cluster (``gridcore.sim.dataplan``):
Fig. 2's traversals for W = D = 3 step by step, storage never above S on random
workloads, determinism, agreement with the policy's models where they are exact, node
resets, refetch counts, and bad input."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridcore.errors import ConfigError
from gridcore.model import MB
from gridcore.policies.dataplan import (
    Environment,
    Strategy,
    Workload,
    all_batch_concurrency,
    check_feasibility,
    minimal_concurrency,
    minimal_cycles,
    predict_all,
    predict_all_batch,
    predict_minimal,
    predict_remote,
    serial_bandwidth,
    slice_ramp_jobs,
)
from gridcore.policies.dataplan_stages import StageKind, plan_stages
from gridcore.sim.dataplan import DataplanRun, EventKind, WanSharing, simulate_dataplan

ALL, ALL_BATCH, SLICE, MINIMAL, REMOTE = (
    Strategy.ALL,
    Strategy.ALL_BATCH,
    Strategy.SLICE,
    Strategy.MINIMAL,
    Strategy.REMOTE,
)
TRAVERSAL = frozenset(
    {
        EventKind.ALLOC,
        EventKind.FREE,
        EventKind.GROUP,
        EventKind.BARRIER,
        EventKind.START,
        EventKind.FETCH,
        EventKind.CACHED,
        EventKind.END,
        EventKind.DONE,
    }
)

# Fig. 2's workload: W = D = 3; batch volumes of 100 MB, privates of 10 MB, 100 s jobs.
# BW_R = BW_L = 20 MB/s, so BW (Eq. 8) = 10 MB/s: a batch volume takes 10 s over the WAN
# and 5 s from the cache, a private volume 1 s over the WAN and 0.5 s in the cluster.
FIG2 = Workload(W=3, D=3, S_B=100 * MB, S_P=10 * MB, R_bar=100.0, SD_R=0.0)

# Each strategy's minimum allocation (Fig. 2's left column) and not a byte more.
MINIMUM_S = {
    ALL: 420 * MB,  # Eq. 1: S_TotB + S_TotP = 300 + 4 x 3 x 10
    ALL_BATCH: 320 * MB,  # Eq. 2: S_TotB + 2 S_P
    SLICE: 140 * MB,  # Eq. 3: S_B + 3 S_P + S_P
    MINIMAL: 120 * MB,  # Eq. 4: S_B + 2 S_P
}
EQUATION = {ALL: 1, ALL_BATCH: 2, SLICE: 3, MINIMAL: 4}


def cluster(S: float, N_CPU: int = 3, F: float = 0.0) -> Environment:
    return Environment(N_CPU=N_CPU, S=S, F=F, BW_R=20 * MB, BW_L=20 * MB)


def fig2(strategy: Strategy, **kwargs: Any) -> DataplanRun:
    S = MINIMUM_S.get(strategy, 1 * MB)
    return simulate_dataplan(strategy, FIG2, cluster(S), **kwargs)


def steps(run: DataplanRun, kinds: frozenset[str] = TRAVERSAL) -> list[str]:
    return [f"{round(e.at, 6):g} {e.kind} {e.job}" for e in run.trace if e.kind in kinds]


# -- Fig. 2's traversals, W = D = 3, maximally constrained ------------------------------------


def test_all_allocates_everything_and_runs_the_three_pipelines_side_by_side() -> None:
    run = fig2(ALL)
    everything = [
        *(f"0 alloc B{d}" for d in range(3)),
        *(f"0 alloc P{p}.{v}" for p in range(3) for v in range(4)),
    ]
    assert steps(run) == [
        # second picture: every volume allocated, the first job of each pipeline runs
        *everything,
        "0 start p0d0",
        "0 fetch B0",  # one fetch for the three readers
        "0 start p1d0",
        "0 start p2d0",
        "10 cached B0",
        # the three inputs cross the WAN one after another (11, 12, 13 s)
        "111.5 end p0d0",
        "111.5 start p0d1",  # a child runs as soon as its parent ends: no barrier
        "111.5 fetch B1",
        "112.5 end p1d0",
        "112.5 start p1d1",
        "113.5 end p2d0",
        "113.5 start p2d1",
        "121.5 cached B1",  # all three read it as it arrives: back in step
        "222.5 end p0d1",
        "222.5 start p0d2",
        "222.5 fetch B2",
        "222.5 end p1d1",
        "222.5 start p1d2",
        "222.5 end p2d1",
        "222.5 start p2d2",
        "232.5 cached B2",
        "334 end p0d2",  # the last outputs go home one after another
        "334 done p0",
        "335 end p1d2",
        "335 done p1",
        "336 end p2d2",
        "336 done p2",
        # every volume de-allocated once the final job finishes
        *(f"336 free P{p}.{v}" for p in range(3) for v in range(4)),
        *(f"336 free B{d}" for d in range(3)),
    ]
    assert run.peak_concurrency == 3
    assert run.peak_storage_bytes == run.storage_bytes == 420 * MB
    assert run.batch_fetches_by_depth == (1, 1, 1)


def test_all_batch_maximally_constrained_runs_one_pipeline_depth_first() -> None:
    run = fig2(ALL_BATCH)
    assert steps(run) == [
        "0 alloc B0",
        "0 alloc B1",
        "0 alloc B2",
        "0 alloc P0.0",  # the only private pair that fits
        "0 alloc P0.1",
        "0 start p0d0",
        "0 fetch B0",
        "10 cached B0",
        "111.5 end p0d0",
        "111.5 free P0.0",
        "111.5 alloc P0.2",
        "111.5 start p0d1",
        "111.5 fetch B1",
        "121.5 cached B1",
        "222.5 end p0d1",
        "222.5 free P0.1",
        "222.5 alloc P0.3",
        "222.5 start p0d2",
        "222.5 fetch B2",
        "232.5 cached B2",
        "334 end p0d2",
        "334 free P0.2",
        "334 free P0.3",
        "334 done p0",
        # fifth picture: only now may the second pipeline begin; batch from the cache
        "334 alloc P1.0",
        "334 alloc P1.1",
        "334 start p1d0",
        "440.5 end p1d0",
        "440.5 free P1.0",
        "440.5 alloc P1.2",
        "440.5 start p1d1",
        "546.5 end p1d1",
        "546.5 free P1.1",
        "546.5 alloc P1.3",
        "546.5 start p1d2",
        "653 end p1d2",
        "653 free P1.2",
        "653 free P1.3",
        "653 done p1",
        "653 alloc P2.0",
        "653 alloc P2.1",
        "653 start p2d0",
        "759.5 end p2d0",
        "759.5 free P2.0",
        "759.5 alloc P2.2",
        "759.5 start p2d1",
        "865.5 end p2d1",
        "865.5 free P2.1",
        "865.5 alloc P2.3",
        "865.5 start p2d2",
        "972 end p2d2",
        "972 free P2.2",
        "972 free P2.3",
        "972 done p2",
        "972 free B0",
        "972 free B1",
        "972 free B2",
    ]
    assert run.peak_concurrency == 1 == all_batch_concurrency(FIG2, cluster(MINIMUM_S[ALL_BATCH]))
    assert run.peak_storage_bytes == run.storage_bytes
    assert run.batch_fetches_by_depth == (1, 1, 1)


def test_slice_maximally_constrained_goes_breadth_first_two_one_two_at_a_time() -> None:
    run = fig2(SLICE)
    assert steps(run) == [
        "0 group group 1",
        "0 alloc B0",
        # ramp-up: nobody has begun, so two pairs fit beside the batch volume
        "0 alloc P0.0",
        "0 alloc P0.1",
        "0 start p0d0",
        "0 fetch B0",
        "0 alloc P1.0",
        "0 alloc P1.1",
        "0 start p1d0",
        "10 cached B0",
        "111.5 end p0d0",
        "111.5 free P0.0",  # p0 keeps its output; one volume free: not a pair
        "112.5 end p1d0",
        "112.5 free P1.0",
        "112.5 alloc P2.0",
        "112.5 alloc P2.1",
        "112.5 start p2d0",  # B0 still cached: read locally
        "219 end p2d0",
        "219 free P2.0",
        "219 barrier depth 0",  # the whole slice is done: descend
        "219 free B0",
        "219 alloc B1",
        # steady state: one volume per pipeline plus one more: one job at a time
        "219 alloc P0.2",
        "219 start p0d1",
        "219 fetch B1",
        "229 cached B1",
        "330 end p0d1",
        "330 free P0.1",
        "330 alloc P1.2",
        "330 start p1d1",
        "436 end p1d1",
        "436 free P1.1",
        "436 alloc P2.2",
        "436 start p2d1",
        "542 end p2d1",
        "542 free P2.1",
        "542 barrier depth 1",
        "542 free B1",
        "542 alloc B2",
        "542 alloc P0.3",
        "542 start p0d2",
        "542 fetch B2",
        "552 cached B2",
        "653.5 end p0d2",
        "653.5 free P0.2",  # the first pipeline ends: both its volumes go
        "653.5 free P0.3",
        "653.5 done p0",
        # ramp-down: two jobs at once again
        "653.5 alloc P1.3",
        "653.5 start p1d2",
        "653.5 alloc P2.3",
        "653.5 start p2d2",
        "760 end p1d2",
        "760 free P1.2",
        "760 free P1.3",
        "760 done p1",
        "761 end p2d2",
        "761 free P2.2",
        "761 free P2.3",
        "761 done p2",
        "761 free B2",
    ]
    # a pipeline goes back to the node that holds its data when that node is free
    assert [e.detail for e in run.trace if e.kind == EventKind.START] == [
        f"node {n}" for n in (0, 1, 0, 0, 1, 0, 0, 1, 0)
    ]
    assert run.peak_concurrency == 2
    assert run.peak_storage_bytes == run.storage_bytes
    assert run.batch_fetches_by_depth == (1, 1, 1)  # no refetch
    assert run.groups == 1


def test_minimal_maximally_constrained_refetches_every_batch_volume_for_every_pipeline() -> None:
    run = fig2(MINIMAL)

    def group(n: int, p: int, t: float) -> list[str]:
        """Pipeline p alone from t: the 334 s of a cold pipeline, batch fetched anew."""
        at = [f"{t + dt:g}" for dt in (0, 10, 111.5, 121.5, 222.5, 232.5, 334)]
        return [
            f"{at[0]} group group {n}",
            f"{at[0]} alloc B0",
            f"{at[0]} alloc P{p}.0",
            f"{at[0]} alloc P{p}.1",
            f"{at[0]} start p{p}d0",
            f"{at[0]} fetch B0",
            f"{at[1]} cached B0",
            f"{at[2]} end p{p}d0",
            f"{at[2]} free P{p}.0",
            f"{at[2]} barrier depth 0",
            f"{at[2]} free B0",  # removed before the group descends
            f"{at[2]} alloc B1",
            f"{at[2]} alloc P{p}.2",
            f"{at[2]} start p{p}d1",
            f"{at[2]} fetch B1",
            f"{at[3]} cached B1",
            f"{at[4]} end p{p}d1",
            f"{at[4]} free P{p}.1",
            f"{at[4]} barrier depth 1",
            f"{at[4]} free B1",
            f"{at[4]} alloc B2",
            f"{at[4]} alloc P{p}.3",
            f"{at[4]} start p{p}d2",
            f"{at[4]} fetch B2",
            f"{at[5]} cached B2",
            f"{at[6]} end p{p}d2",
            f"{at[6]} free P{p}.2",
            f"{at[6]} free P{p}.3",
            f"{at[6]} done p{p}",
            f"{at[6]} free B2",
        ]

    assert steps(run) == [*group(1, 0, 0), *group(2, 1, 334), *group(3, 2, 668)]
    assert run.makespan_s == 1002
    assert run.peak_concurrency == 1 == minimal_concurrency(FIG2, cluster(MINIMUM_S[MINIMAL]))
    assert run.batch_fetches_by_depth == (3, 3, 3)
    assert run.groups == 3


def test_remote_stores_nothing_and_every_job_reads_its_batch_over_the_shared_wan() -> None:
    run = fig2(REMOTE)
    assert steps(run, frozenset({EventKind.START, EventKind.END, EventKind.DONE})) == [
        "0 start p0d0",
        "0 start p1d0",
        "0 start p2d0",
        # one FIFO link: B0 three times (0-30 s), then the three inputs (30-33 s), ...
        "132 end p0d0",
        "132 start p0d1",
        "133 end p1d0",
        "133 start p1d1",
        "144 end p2d0",
        "144 start p2d1",
        "256 end p0d1",
        "256 start p0d2",
        "267 end p1d1",
        "267 start p1d2",
        "269 end p2d1",
        "269 start p2d2",
        "369 end p0d2",
        "369 done p0",
        "391 end p1d2",
        "391 done p1",
        "392 end p2d2",
        "392 done p2",
    ]
    assert not any(e.kind in (EventKind.ALLOC, EventKind.FREE) for e in run.trace)
    assert run.peak_storage_bytes == 0
    assert run.batch_fetches_by_depth == (3, 3, 3)
    assert run.wan_bytes == 9 * (100 + 2 * 10) * MB


@pytest.mark.parametrize("strategy", [ALL, ALL_BATCH, SLICE, MINIMAL])
def test_one_byte_less_than_the_minimum_allocation_is_refused_naming_the_equation(
    strategy: Strategy,
) -> None:
    env = cluster(MINIMUM_S[strategy] - 1)
    with pytest.raises(ConfigError, match=rf"{strategy.label} .*\(Eq\. {EQUATION[strategy]}\)"):
        simulate_dataplan(strategy, FIG2, env)


def test_sizes_feasible_as_given_but_not_in_whole_bytes_are_refused() -> None:
    tiny = Workload(W=1, D=1, S_B=0.5, S_P=0.25, R_bar=1.0, SD_R=0.0)
    env = Environment(N_CPU=1, S=1.0, F=0.0, BW_R=1.0, BW_L=1.0)
    assert check_feasibility(MINIMAL, tiny, env).possible
    with pytest.raises(ConfigError, match=r"Minimal in whole bytes: .*\(Eq\. 4\)"):
        simulate_dataplan(MINIMAL, tiny, env)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"resets": [(10.0, 3)]}, r"node in 0\.\.2"),
        ({"resets": [(-1.0, 0)]}, r"finite time >= 0"),
        ({"resets": [(math.inf, 0)]}, r"finite time >= 0"),
        ({"horizon_s": 0.0}, r"horizon_s must be > 0"),
    ],
)
def test_bad_resets_and_horizons_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        fig2(ALL, **kwargs)


def test_a_run_stopped_at_its_horizon_is_not_complete() -> None:
    run = fig2(ALL_BATCH, horizon_s=500.0)
    assert not run.completed
    assert run.makespan_s == math.inf
    assert sum(e.kind == EventKind.DONE for e in run.trace) == 1


# -- the policy's models where they are exact ---------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "W", "N_CPU", "S", "wan", "predict"),
    [
        # All, W <= N_CPU: one cold phase (Eq. 5-10), no contention as the model assumes
        (ALL, 3, 3, 420 * MB, WanSharing.INDEPENDENT, predict_all),
        # All, W = 2 N_CPU: a cold and a warm phase (Eq. 12-14)
        (ALL, 6, 3, 780 * MB, WanSharing.INDEPENDENT, predict_all),
        # AllBatch, C = 2 (Eq. 15): two cold pipelines, then a warm one
        (ALL_BATCH, 3, 3, 340 * MB, WanSharing.INDEPENDENT, predict_all_batch),
        # AllBatch and Minimal at C = 1 never have two transfers at once: exact even on
        # the serial WAN
        (ALL_BATCH, 3, 3, 320 * MB, WanSharing.SERIAL, predict_all_batch),
        (MINIMAL, 3, 3, 120 * MB, WanSharing.SERIAL, predict_minimal),
        # Remote: every pipeline doing all its I/O at BW (the policy's Remote model)
        (REMOTE, 3, 3, 1 * MB, WanSharing.INDEPENDENT, predict_remote),
        (REMOTE, 5, 2, 1 * MB, WanSharing.INDEPENDENT, predict_remote),
    ],
)
def test_without_contention_or_variability_the_simulator_runs_the_models_phases(
    strategy: Strategy,
    W: int,
    N_CPU: int,
    S: int,
    wan: WanSharing,
    predict: object,
) -> None:
    workload, env = replace(FIG2, W=W), cluster(S, N_CPU)
    run = simulate_dataplan(strategy, workload, env, wan=wan)
    assert callable(predict)
    assert run.makespan_s == pytest.approx(predict(workload, env).time_s, rel=1e-12)


def test_all_on_the_serial_wan_is_late_by_exactly_the_outputs_queued_ahead_of_the_last() -> None:
    """The model ignores contention. On the shared link the three first inputs queue
    (pipelines 1 and 2 start 1 s and 2 s late) but catch up at the next depth, whose
    batch volume all three read as it arrives; the three last outputs queue again, so
    the last pipeline ends two private transfers (2 x S_P / BW = 2 s) after the model."""
    env = cluster(MINIMUM_S[ALL])
    serial = simulate_dataplan(ALL, FIG2, env)
    model = predict_all(FIG2, env).time_s
    assert model == pytest.approx(334.0)
    assert serial.makespan_s - model == pytest.approx(2 * FIG2.S_P / serial_bandwidth(env))


# -- refetching ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "S", "by_depth", "groups"),
    [
        (ALL_BATCH, 400 * MB + 60 * MB, (1, 1, 1, 1), 0),  # C = 3
        (SLICE, 100 * MB + 80 * MB, (1, 1, 1, 1), 1),  # C' = 1
        # C = floor((S - S_B) / (2 S_P)) = 3 (Eq. 23): groups of 3, 3 and 1 (Eq. 22)
        (MINIMAL, 100 * MB + 70 * MB, (3, 3, 3, 3), 3),
    ],
)
def test_minimal_refetches_each_batch_volume_once_per_group_the_others_once(
    strategy: Strategy, S: int, by_depth: tuple[int, ...], groups: int
) -> None:
    workload = replace(FIG2, W=7, D=4, SD_R=20.0)
    env = cluster(S, N_CPU=8)
    run = simulate_dataplan(strategy, workload, env, seed=5)
    assert run.batch_fetches_by_depth == by_depth
    assert run.groups == groups
    if strategy is MINIMAL:
        assert groups == minimal_cycles(workload, env)
    assert sum(e.kind == EventKind.FETCH for e in run.trace) == sum(by_depth)
    private_wan = 2 * workload.W * workload.S_P  # each input in, each last output home
    assert run.wan_bytes == sum(by_depth) * workload.S_B + private_wan


@pytest.mark.parametrize(
    ("width", "groups", "peak"),
    [
        (None, 4, 2),  # Eq. 23: C = min(W, N_CPU, n) = min(7, 2, 3) = 2
        (3, 3, 2),  # n = 3 pairs beside a batch volume, 2 at a time on 2 processors
        (6, 2, 2),  # a partial slice of 6 (Eq. 3: 100 + 6 x 10 + 10 = 170 MB)
    ],
)
def test_minimal_groups_may_be_as_wide_as_storage_allows_and_refetch_less(
    width: int | None, groups: int, peak: int
) -> None:
    workload = replace(FIG2, W=7, D=4)
    env = cluster(170 * MB, N_CPU=2)
    run = simulate_dataplan(MINIMAL, workload, env, minimal_width=width)
    assert run.groups == groups
    assert run.batch_fetches_by_depth == (groups,) * 4
    assert run.peak_concurrency == peak
    assert run.peak_storage_bytes <= run.storage_bytes


@pytest.mark.parametrize(
    ("strategy", "width"), [(SLICE, None), (MINIMAL, None), (MINIMAL, 3), (MINIMAL, 6)]
)
def test_the_simulated_groups_are_the_stage_plan_s_that_the_live_engine_runs(
    strategy: Strategy, width: int | None
) -> None:
    # Seven pipelines, 180 MB (a slice of all 7 fits, Eq. 3), 2 processors: Minimal's
    # Eq. 23 C = 2 (or the width asked).
    workload = replace(FIG2, W=7, D=4)
    env = cluster(180 * MB, N_CPU=2)
    run = simulate_dataplan(strategy, workload, env, minimal_width=width)
    stages = plan_stages(
        strategy,
        W=workload.W,
        D=workload.D,
        N_CPU=env.N_CPU,
        concurrency=minimal_concurrency(workload, env),
        group_width=width,
    )
    planned = [
        ",".join(f"p{p}" for p in stage.pipelines)
        for stage in stages
        if stage.kind is StageKind.JOBS and stage.depths == (0,)
    ]
    assert [e.detail for e in run.trace if e.kind == EventKind.GROUP] == planned


@pytest.mark.parametrize(
    ("strategy", "width", "message"),
    [
        (MINIMAL, 7, r"minimal_width 7: .*Slice infeasible: .* = 180 MB > S = 170 MB \(Eq\. 3\)"),
        (MINIMAL, 0, r"minimal_width must be an integer >= 1"),
        (REMOTE, 3, r"minimal_width applies to Minimal only, not Remote"),
    ],
)
def test_a_minimal_width_that_does_not_fit_is_refused(
    strategy: Strategy, width: int, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        simulate_dataplan(strategy, replace(FIG2, W=7), cluster(170 * MB), minimal_width=width)


# -- runtimes and determinism ----------------------------------------------------------------


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    workload = replace(FIG2, W=6, SD_R=30.0)
    env = cluster(100 * MB + 90 * MB, N_CPU=4, F=1e-3)
    first = simulate_dataplan(SLICE, workload, env, seed=11)
    again = simulate_dataplan(SLICE, workload, env, seed=11)
    other = simulate_dataplan(SLICE, workload, env, seed=12)
    assert first == again
    assert first.trace != other.trace
    assert first.makespan_s != other.makespan_s


def test_runtimes_are_normal_truncated_above_zero_by_redrawing() -> None:
    """No I/O (sizes 0), so a job's duration is its runtime. Normal(1, 10) truncated to
    > 0 has mean 1 + 10 phi(0.1) / Phi(0.1) = 8.35; a clamp at 0 would give 0 s jobs
    and a mean of 1 Phi(0.1) + 10 phi(0.1) = 4.51."""
    workload = Workload(W=200, D=5, S_B=0, S_P=0, R_bar=1.0, SD_R=10.0)
    env = Environment(N_CPU=200, S=1.0, F=0.0, BW_R=1.0, BW_L=1.0)
    run = simulate_dataplan(ALL_BATCH, workload, env, seed=3, wan=WanSharing.INDEPENDENT)
    started = {e.job: e.at for e in run.trace if e.kind == EventKind.START}
    durations = [e.at - started[e.job] for e in run.trace if e.kind == EventKind.END]
    assert len(durations) == 1000
    assert min(durations) > 0
    normal = statistics.NormalDist()
    expected = 1 + 10 * normal.pdf(0.1) / normal.cdf(0.1)
    assert statistics.fmean(durations) == pytest.approx(expected, abs=0.6)


def test_without_variability_every_job_runs_exactly_the_mean() -> None:
    workload = Workload(W=4, D=2, S_B=0, S_P=0, R_bar=7.0, SD_R=0.0)
    env = Environment(N_CPU=2, S=1.0, F=0.0, BW_R=1.0, BW_L=1.0)
    run = simulate_dataplan(ALL, workload, env)
    assert run.makespan_s == 2 * 2 * 7.0
    assert run.busy_cpu_s == 4 * 2 * 7.0


# -- failures: node resets ---------------------------------------------------------------------


def test_a_reset_under_all_batch_restarts_the_pipeline_with_batch_from_the_cache() -> None:
    run = fig2(ALL_BATCH, resets=[(150.0, 0)])
    kinds = TRAVERSAL | {EventKind.RESET, EventKind.EVICT, EventKind.LOST}
    assert steps(run, kinds)[13:27] == [
        "121.5 cached B1",
        "150 reset node 0",  # p0d1 computing on node 0
        "150 evict p0d1",
        "150 free P0.1",  # its pipeline's data was on that disk
        "150 free P0.2",
        "150 lost p0",
        "150 alloc P0.0",  # its pair again, from depth 0, at once
        "150 alloc P0.1",
        "150 start p0d0",  # no fetch: B0 is cached
        "256.5 end p0d0",
        "256.5 free P0.0",
        "256.5 alloc P0.2",
        "256.5 start p0d1",  # nor B1
        "362.5 end p0d1",
    ]
    assert (run.failures, run.evictions, run.restarts) == (1, 1, 1)
    assert run.batch_fetches_by_depth == (1, 1, 1)
    assert run.evicted_cpu_s == 150 - 111.5
    assert run.jobs_run == 9 + 1  # p0d0 ran twice
    # p0 from 150 s: warm depths 0 and 1, then the first fetch of B2 (10 s, not 5 s)
    assert run.makespan_s == 150 + 106.5 + 106 + 111.5 + 2 * 319


def test_a_reset_under_slice_sends_a_waiting_pipeline_to_a_second_slice_that_refetches() -> None:
    run = fig2(SLICE, resets=[(300.0, 1)])
    kinds = TRAVERSAL | {EventKind.RESET, EventKind.EVICT, EventKind.LOST}
    trace = steps(run, kinds)
    at = trace.index("300 reset node 1")
    assert trace[at : at + 5] == [
        "300 reset node 1",  # idle, but p1 waits at depth 1 with its data on it
        "300 free P1.1",
        "300 lost p1",
        "300 alloc P2.2",  # the freed volume lets p2 run beside p0
        "300 start p2d1",
    ]
    assert trace[trace.index("518.5 group group 2") :][:3] == [
        "518.5 group group 2",  # after the first slice: p1 alone, from B0 again
        "518.5 alloc B0",
        "518.5 alloc P1.0",
    ]
    assert (run.failures, run.evictions, run.restarts, run.groups) == (1, 0, 1, 2)
    assert run.batch_fetches_by_depth == (2, 2, 2)
    assert run.completed


def test_a_reset_at_depth_zero_of_a_slice_redoes_depth_zero_in_the_same_slice() -> None:
    run = fig2(SLICE, resets=[(50.0, 1)])  # p1d0 computing on node 1
    assert "50 lost p1" in steps(run, frozenset({EventKind.LOST}))
    assert run.groups == 1
    assert run.batch_fetches_by_depth == (1, 1, 1)
    assert run.jobs_run == 9


def test_a_reset_under_minimal_sends_the_pipeline_behind_the_others_and_ends_its_group() -> None:
    run = fig2(MINIMAL, resets=[(150.0, 0)])  # p0d1, alone in group 1, computing
    kinds = frozenset({EventKind.RESET, EventKind.LOST, EventKind.GROUP, EventKind.FREE})
    trace = steps(run, kinds)
    at = trace.index("150 reset node 0")
    assert trace[at : at + 8] == [
        "150 reset node 0",
        "150 free P0.1",
        "150 free P0.2",
        "150 lost p0",
        "150 free B1",  # its group is empty: B1 goes, the next group begins
        "150 group group 2",
        "261.5 free P1.0",
        "261.5 free B0",
    ]
    groups = [e.detail for e in run.trace if e.kind == EventKind.GROUP]
    assert groups == ["p0", "p1", "p2", "p0"]
    assert run.batch_fetches_by_depth == (4, 4, 3)  # group 1 had fetched B0 and B1
    assert run.makespan_s == 150 + 3 * 334


def test_a_reset_during_a_transfer_aborts_it_and_the_bytes_sent_still_count() -> None:
    run = fig2(REMOTE, resets=[(5.0, 0)])  # p0d0's B0 half across the WAN
    assert run.batch_fetches_by_depth == (3, 3, 3)  # the aborted read is no fetch
    assert run.wan_bytes == 9 * (100 + 2 * 10) * MB + 5.0 * serial_bandwidth(cluster(MB))
    assert run.evicted_cpu_s == 5.0


def test_a_reset_under_remote_evicts_only_the_job() -> None:
    run = fig2(REMOTE, resets=[(50.0, 1), (60.0, 0)])
    kinds = frozenset({EventKind.RESET, EventKind.EVICT, EventKind.LOST, EventKind.START})
    assert steps(run, kinds)[3:8] == [
        "50 reset node 1",
        "50 evict p1d0",
        "50 start p1d0",  # the same job again, nothing was stored to lose
        "60 reset node 0",
        "60 evict p0d0",
    ]
    assert run.restarts == 0
    assert run.jobs_run == 9
    assert run.batch_fetches_by_depth[0] >= 4  # at least one evicted read had arrived


@pytest.mark.parametrize("strategy", [ALL, ALL_BATCH, SLICE, MINIMAL, REMOTE])
def test_poisson_resets_evict_jobs_and_every_workload_still_completes(strategy: Strategy) -> None:
    workload = replace(FIG2, W=6, SD_R=20.0)
    needs = {ALL: 780, ALL_BATCH: 340, SLICE: 180, MINIMAL: 160, REMOTE: 1}
    env = cluster(needs[strategy] * MB, N_CPU=3, F=1 / 400)
    runs = [simulate_dataplan(strategy, workload, env, seed=s) for s in range(12)]
    for run in runs:
        assert run.completed
        assert sum(e.kind == EventKind.DONE for e in run.trace) == workload.W
        assert run.jobs_run >= workload.J
        assert run.peak_storage_bytes <= run.storage_bytes
    assert sum(r.evictions for r in runs) > 0
    if strategy in (ALL, ALL_BATCH):  # batch data survives resets: never refetched
        assert all(r.batch_fetches_by_depth == (1, 1, 1) for r in runs)
    if strategy in (SLICE, MINIMAL):  # pipelines lost below depth 0 re-run and refetch
        groups = 1 if strategy is SLICE else minimal_cycles(workload, env)
        assert any(r.batch_fetches > workload.D * groups for r in runs)


def test_resets_arrive_at_rate_f_over_the_run() -> None:
    """A Poisson count stopped at the makespan has mean F x makespan (Wald): over 40
    seeds the count is within four standard deviations of it, and each of the three
    nodes takes about a third of the resets."""
    env = cluster(340 * MB, N_CPU=3, F=1 / 200)
    runs = [simulate_dataplan(ALL_BATCH, FIG2, env, seed=s) for s in range(40)]
    resets = sum(r.failures for r in runs)
    expected = env.F * sum(r.makespan_s for r in runs)
    assert abs(resets - expected) <= 4 * math.sqrt(expected)
    hits = Counter(e.job for r in runs for e in r.trace if e.kind == EventKind.RESET)
    assert sum(hits.values()) == resets
    for node in range(3):
        share = hits[f"node {node}"]
        assert abs(share - resets / 3) <= 4 * math.sqrt(resets * (1 / 3) * (2 / 3))


# -- storage never above S (property) ------------------------------------------------------------


@st.composite
def cases(draw: st.DrawFn) -> tuple[Strategy, Workload, Environment, int]:
    strategy = draw(st.sampled_from(list(Strategy)))
    S_B, S_P = draw(st.integers(0, 200)) * MB, draw(st.integers(0, 50)) * MB
    workload = Workload(
        W=draw(st.integers(1, 6)),
        D=draw(st.integers(1, 4)),
        S_B=S_B,
        S_P=S_P,
        R_bar=float(draw(st.integers(1, 100))),
        SD_R=float(draw(st.integers(0, 50))),
    )
    bandwidths = st.sampled_from([5 * MB, 10 * MB, 20 * MB, 40 * MB])
    env = Environment(1, 1.0, 0.0, draw(bandwidths), draw(bandwidths))
    needs = check_feasibility(strategy, workload, env).needs_bytes
    slack = draw(st.integers(0, 3)) * draw(st.sampled_from([S_P, S_B, 7 * MB, 1]))
    # About `resets_per_serial_run` resets while the jobs would run one after another.
    serial_s = workload.J * (workload.R_bar + 3 * workload.SD_R + (S_B + 2 * S_P) / 2.5e6)
    resets_per_serial_run = draw(st.sampled_from([0.0, 0.0, 0.5, 2.0]))
    env = replace(
        env,
        N_CPU=draw(st.integers(1, 5)),
        S=max(1.0, needs + slack),
        F=resets_per_serial_run / serial_s,
    )
    return strategy, workload, env, draw(st.integers(0, 2**16))


@settings(max_examples=300, deadline=None)
@given(cases())
def test_storage_never_exceeds_s_and_every_job_holds_its_volumes(
    case: tuple[Strategy, Workload, Environment, int],
) -> None:
    strategy, workload, env, seed = case
    run = simulate_dataplan(strategy, workload, env, seed=seed, horizon_s=1e10)
    assert run.completed
    held: dict[str, int] = {}
    used = peak = running = peak_running = 0
    for event in run.trace:
        if event.kind == EventKind.ALLOC:
            assert event.job not in held
            held[event.job] = int(event.detail)
            used += held[event.job]
            assert used <= run.storage_bytes == math.floor(env.S)
            peak = max(peak, used)
        elif event.kind == EventKind.FREE:
            used -= held.pop(event.job)
        elif event.kind == EventKind.START:
            running += 1
            peak_running = max(peak_running, running)
            if strategy is not REMOTE:
                p, d = (int(x) for x in event.job[1:].split("d"))
                assert {f"B{d}", f"P{p}.{d}", f"P{p}.{d + 1}"} <= held.keys()
        elif event.kind in (EventKind.END, EventKind.EVICT):
            running -= 1
    assert held == {}  # everything released by the end
    assert peak == run.peak_storage_bytes <= run.storage_bytes
    assert peak_running == run.peak_concurrency <= min(env.N_CPU, workload.W)
    assert sorted(e.job for e in run.trace if e.kind == EventKind.DONE) == sorted(
        f"p{p}" for p in range(workload.W)
    )
    _check_concurrency(strategy, workload, env, run)
    if env.F == 0:
        _check_transfers(strategy, workload, env, run)


def _check_concurrency(
    strategy: Strategy, workload: Workload, env: Environment, run: DataplanRun
) -> None:
    if strategy is ALL_BATCH:  # Eq. 15, reached at time 0 without resets
        C = all_batch_concurrency(workload, env)
        assert run.peak_concurrency == C if env.F == 0 else run.peak_concurrency <= C
    elif strategy is MINIMAL:  # Eq. 23, the first group all at once
        C = minimal_concurrency(workload, env)
        assert run.peak_concurrency == C if env.F == 0 else run.peak_concurrency <= C
    elif strategy is SLICE:  # at most Eq. 17's n pairs beside one batch volume
        assert run.peak_concurrency <= slice_ramp_jobs(workload, env)


def _check_transfers(
    strategy: Strategy, workload: Workload, env: Environment, run: DataplanRun
) -> None:
    fetches = {
        ALL: 1,
        ALL_BATCH: 1,
        SLICE: 1,
        MINIMAL: minimal_cycles(workload, env),
        REMOTE: workload.W,
    }[strategy]
    assert run.batch_fetches_by_depth == (fetches,) * workload.D
    private = 2 * workload.W * workload.S_P * (workload.D if strategy is REMOTE else 1)
    assert run.wan_bytes == fetches * workload.D * workload.S_B + private
    assert run.jobs_run == workload.J
    assert (run.failures, run.evictions, run.restarts) == (0, 0, 0)
