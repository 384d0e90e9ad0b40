"""The idle-soon view for KOALA placement (docs/coallocation.md, "Idle soon from a wait
model"): the view, the deferral rule, and the simulator's use of both."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gridcore.cli import main
from gridcore.errors import ConfigError
from gridcore.experiments import coallocation_idle_soon as idle_soon_module
from gridcore.experiments.coallocation_idle_soon import idle_soon_experiment, verdict
from gridcore.experiments.coallocation_placement import koala_placement_experiment
from gridcore.model import CoAllocationRequest, Component, RequestKind, SiteSnapshot
from gridcore.policies.idle_soon import (
    IdleSoon,
    defer_for_fewer_clusters,
    idle_at,
    soon_snapshot,
)
from gridcore.policies.placement import PlacementPolicy, place
from gridcore.policies.wait_prediction import QueuedJob, QueueView, RunningJob, UserRuntimes
from gridcore.sim.coallocation import EventKind, GridJob, simulate_coallocation
from gridcore.sim.workload import LocalJob, SimSite

CM = PlacementPolicy.CM


def _flat(size: int, clusters: int) -> float:
    return 100.0


# --- the view ------------------------------------------------------------------------------


def test_running_jobs_free_their_processors_at_their_requested_end_without_runtimes() -> None:
    view = QueueView(
        100.0,
        10,
        running=(RunningJob("a", 4, 0.0, 150.0), RunningJob("b", 3, 0.0, 200.0)),
    )
    assert idle_at(view, 100.0, None) == 3
    assert idle_at(view, 160.0, None) == 7  # a ends at 150
    assert idle_at(view, 200.0, None) == 10  # b ends at 200: free at 200


def test_predicted_run_times_end_jobs_before_their_requested_end() -> None:
    runtimes = UserRuntimes()
    runtimes.add("u", 20.0)
    runtimes.add("u", 40.0)  # Tsafrir: the mean of the last two, 30 s
    view = QueueView(10.0, 10, running=(RunningJob("a", 6, 0.0, 500.0, "u"),))
    assert idle_at(view, 40.0, None) == 4  # requested end 500
    assert idle_at(view, 40.0, runtimes) == 10  # predicted end 30


def test_queued_jobs_planned_ahead_take_the_processors_first() -> None:
    view = QueueView(
        0.0,
        10,
        running=(RunningJob("a", 8, 0.0, 50.0),),
        queued=(QueuedJob("q", 6, 0.0, 100.0),),
    )
    # a ends at 50; q (6 processors) is planned from 50 to 150
    assert idle_at(view, 60.0, None) == 4
    assert idle_at(view, 150.0, None) == 10


def test_a_queued_job_larger_than_the_cluster_is_left_out_of_the_plan() -> None:
    view = QueueView(0.0, 10, queued=(QueuedJob("huge", 20, 0.0, 100.0),))
    assert idle_at(view, 5.0, None) == 10


def test_only_plan_models_and_positive_horizons_are_accepted() -> None:
    with pytest.raises(ConfigError, match="no backfill plan"):
        IdleSoon(model="eq1")
    with pytest.raises(ConfigError, match="horizon_s"):
        IdleSoon(horizon_s=0.0)
    assert IdleSoon().model == "predicted_backfill"


# --- the deferral rule --------------------------------------------------------------------


def _request() -> CoAllocationRequest:
    return CoAllocationRequest("j", RequestKind.NON_FIXED, components=(Component(4), Component(4)))


def test_a_job_split_now_defers_when_the_view_fits_it_on_fewer_clusters() -> None:
    now_clusters = [SiteSnapshot("A", 10, 4), SiteSnapshot("B", 10, 4)]
    now = place(_request(), now_clusters, CM)
    assert now.clusters_combined == 2
    soon = [soon_snapshot(now_clusters[0], 10), soon_snapshot(now_clusters[1], 4)]
    choice = defer_for_fewer_clusters(_request(), now, soon, CM)
    assert choice.defer
    assert choice.soon is not None and choice.soon.clusters_combined == 1


def test_no_deferral_when_the_view_needs_as_many_clusters_or_the_job_fits_on_one() -> None:
    split = [SiteSnapshot("A", 10, 4), SiteSnapshot("B", 10, 4)]
    now = place(_request(), split, CM)
    assert not defer_for_fewer_clusters(_request(), now, split, CM).defer
    whole = [SiteSnapshot("A", 10, 8), SiteSnapshot("B", 10, 4)]
    one = place(_request(), whole, CM)
    assert one.clusters_combined == 1
    empty_soon = [SiteSnapshot("A", 10, 10), SiteSnapshot("B", 10, 10)]
    assert not defer_for_fewer_clusters(_request(), one, empty_soon, CM).defer


def test_the_cell_verdict_needs_intervals_apart() -> None:
    off = {"mean": 100.0, "ci95": [90.0, 110.0]}
    assert verdict(off, {"mean": 80.0, "ci95": [75.0, 85.0]}) == "improved"
    assert verdict(off, {"mean": 95.0, "ci95": [85.0, 105.0]}) == "no difference"
    assert verdict(off, {"mean": 130.0, "ci95": [120.0, 140.0]}) == "harmed"


# --- the simulator ------------------------------------------------------------------------


def _two_split_clusters(
    a_requested_s: float, a_runtime_s: float
) -> tuple[list[SimSite], list[LocalJob]]:
    # A and B have 4 idle each: the job (4 + 4) fits now only across both. The local job
    # on A asks for a_requested_s; the one on B holds its 6 for a long time.
    local = [
        LocalJob("LA", "A", 0.0, a_runtime_s, 6, requested_s=a_requested_s),
        LocalJob("LB", "B", 0.0, 5000.0, 6, requested_s=5000.0),
    ]
    return [SimSite("A", 10), SimSite("B", 10)], local


def test_without_the_view_the_job_starts_at_once_across_two_clusters() -> None:
    clusters, local = _two_split_clusters(30.0, 30.0)
    run = simulate_coallocation(
        clusters,
        [GridJob("j", 0.0, (4, 4))],
        CM,
        _flat,
        local_jobs=local,
    )
    record = run.by_name("j")
    assert (record.start_s, record.clusters_combined, run.deferrals) == (0.0, 2, 0)


@pytest.mark.parametrize(
    ("a_runtime_s", "start_s", "clusters_combined", "deferrals"),
    [
        # LA ends at 30 (within 60 s): deferred on arrival and at the scans 4..28; the
        # scan at 32 sees A with 10 idle and places both components there.
        (30.0, 32.0, 1, 8),
        # LA asks for 30 s but runs 1000: the view keeps promising A; after 60 s of
        # deferral (arrival, then 4, 8, ..., 56) the job takes what fits now, across both.
        (1000.0, 60.0, 2, 15),
    ],
    ids=["waits-for-A", "at-most-the-horizon"],
)
def test_with_the_view_a_job_defers_for_fewer_clusters_for_at_most_the_horizon(
    a_runtime_s: float, start_s: float, clusters_combined: int, deferrals: int
) -> None:
    clusters, local = _two_split_clusters(30.0, a_runtime_s)
    run = simulate_coallocation(
        clusters,
        [GridJob("j", 0.0, (4, 4))],
        CM,
        _flat,
        local_jobs=local,
        idle_soon=IdleSoon(horizon_s=60.0),
    )
    record = run.by_name("j")
    assert (record.start_s, record.clusters_combined) == (start_s, clusters_combined)
    assert run.deferrals == deferrals
    assert record.tries == deferrals + 1
    started_on = {e.site for e in run.events if e.kind is EventKind.START}
    assert started_on == ({"A"} if clusters_combined == 1 else {"A", "B"})


# --- the experiment -----------------------------------------------------------------------


def _cli_json(*args: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["experiment", "koala-idle-soon", *args, "--json", "--plot", ""]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_the_registered_experiment_reports_every_cell_over_the_seeds_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = _cli_json("--seed", "3", "--seeds", "2", capsys=capsys)
    assert set(result) == {"cells", "improved", "harmed", "enable_by_default", "setup"}
    assert set(result["cells"]) == {f"{w}/{p}" for w in ("W1", "W2") for p in ("WF", "CM", "FCM")}
    for cell in result["cells"].values():
        assert set(cell) == {
            "mean_response_s",
            "mean_wait_s",
            "mean_execution_s",
            "mean_clusters_combined",
            "deferrals_per_run",
            "verdict",
        }
        assert set(cell["mean_response_s"]) == {"off", "on", "on_minus_off", "per_seed"}
        assert [len(cell["mean_response_s"]["per_seed"][arm]) for arm in ("off", "on")] == [2, 2]
    assert result["setup"]["seeds"] == [3, 4]
    assert result["setup"]["background"] is None


def test_without_seeds_the_command_runs_the_fixed_rules_ten(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[list[int]] = []

    def experiment(seeds: range, log: object = None) -> dict[str, Any]:
        asked.append(list(seeds))
        return idle_soon_experiment(range(0, 2), jobs=5)

    monkeypatch.setattr(idle_soon_module, "idle_soon_experiment", experiment)
    _cli_json(capsys=capsys)
    assert asked == [list(range(10))]


def test_the_arm_without_the_view_is_koala_placement_seed_by_seed() -> None:
    result = idle_soon_experiment(range(1, 3), jobs=20)
    placement = [koala_placement_experiment(seed=seed, jobs=20) for seed in (1, 2)]
    for name, cell in result["cells"].items():
        workload, policy = name.split("/")
        for metric in ("mean_response_s", "mean_wait_s", "mean_clusters_combined"):
            off = [run["workloads"][workload][policy][metric] for run in placement]
            assert cell[metric]["per_seed"]["off"] == off, (name, metric)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--seeds", "1"], "--seeds must be >= 2"),
        (["--seeds", "2", "--background", "no-such-log.swf"], "--background no-such-log.swf"),
        (["--seeds", "2", "--runs", "2"], "--runs: this one takes no repetitions"),
        (["--seeds", "2", "--comm-factor", "2"], "--comm-factor: this one does not take"),
    ],
)
def test_bad_input_is_one_line_naming_the_option_and_exit_2(
    args: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["experiment", "koala-idle-soon", *args, "--plot", ""]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"gridcore: error: {option}")
