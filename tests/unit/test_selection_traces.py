"""selection-traces (issue 22 item 6) and the wait models in the decisions (item 5)."""

from __future__ import annotations

import json
import pickle
import random
import statistics
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gridcore.cli import main
from gridcore.errors import ConfigError
from gridcore.experiments.selection import canonical_trace
from gridcore.experiments.selection_traces import (
    LogAt,
    LoggedCluster,
    WarmModels,
    _done,
    _vjm_figures,
    _window,
    common_span,
    load_grid,
    selection_traces,
    window_starts,
)
from gridcore.model import JobRequest, SiteSnapshot
from gridcore.policies.coreservation import (
    LIFETIME_CEILING_S,
    ClusterView,
    QueueStats,
    pilot_time_limit,
    select_clusters,
)
from gridcore.policies.queue_stats import WINDOW, QueueRecord
from gridcore.policies.selection import SelectionProtocol, select_site
from gridcore.policies.transfer import free_bandwidth
from gridcore.policies.wait_prediction import BackfillModel, QueuedJob, QueueView, WaitForecast
from gridcore.sim.cluster import Cluster, Owner, Queued, QueuePolicy
from gridcore.sim.core import Simulator
from gridcore.sim.coreservation import ParallelJob, VjmCluster, VjmParams, simulate_vjm
from gridcore.sim.queue_view import queue_view
from gridcore.sim.workload import SimSite

SWF = Path(__file__).parent.parent / "data" / "swf"
# The two shipped heads whose spans overlap (aligned at their starts): 599850-790585 s.
HEADS = [str(SWF / "kth-sp2-head.swf.gz"), str(SWF / "sdsc-sp2-head.swf.gz")]


def test_the_grid_is_one_cluster_per_log_of_its_max_procs_and_the_span_is_common() -> None:
    clusters = load_grid(HEADS)
    assert [(c.site.name, c.site.processors) for c in clusters] == [
        ("kth-sp2-head", 100),
        ("sdsc-sp2-head", 128),
    ]
    assert common_span(clusters) == (599850.0, 790585.0)


def test_the_submit_times_windows_cut_at_are_kept_once_not_rebuilt_per_window() -> None:
    for cluster in load_grid(HEADS):
        assert cluster.submits is cluster.submits
        assert cluster.submits == [job.submit_s for job in cluster.jobs]


def test_a_multi_cluster_log_gives_one_cluster_per_partition(tmp_path: Path) -> None:
    # two-clusters.swf's partition 2 has no job to replay (no wait, no size, a part of a
    # job): one it can replay is added
    log = tmp_path / "two-clusters.swf"
    log.write_text(
        (SWF / "two-clusters.swf").read_text() + "8 50 0 20 16 -1 -1 16 60 -1 1 4 2 3 1 2 -1 -1\n"
    )
    clusters = load_grid([str(log)])
    assert len(clusters) == 2
    assert all(c.site.name.startswith("two-clusters-p") for c in clusters)
    (alone,) = load_grid([str(SWF / "two-clusters.swf")])  # one partition to replay
    assert alone.site.processors == 96  # its MaxProcs


def test_partitions_are_told_by_the_jobs_and_a_log_without_max_procs_is_sized_from_its_jobs(
    tmp_path: Path,
) -> None:
    # no MaxPartitions, no MaxProcs: two partition numbers make two clusters, each of the
    # processors its jobs held at once (gridcore.workloads.machines; p1's 8 and 3 overlap
    # for 8 of their 12 s), at least its largest job; the -1 (no partition) job belongs
    # to neither
    log = tmp_path / "headless.swf"
    log.write_text(
        "1 0 0 10 8 -1 -1 8 100 -1 1 1 -1 -1 -1 1 -1 -1\n"
        "2 1 0 10 6 -1 -1 6 100 -1 1 1 -1 -1 -1 2 -1 -1\n"
        "3 2 0 10 3 -1 -1 3 100 -1 1 1 -1 -1 -1 1 -1 -1\n"
        "4 3 0 10 9 -1 -1 9 100 -1 1 1 -1 -1 -1 -1 -1 -1\n"
    )
    clusters = load_grid([str(log)])
    assert [(c.site.name, c.site.processors, len(c.jobs)) for c in clusters] == [
        ("headless-p1", 11, 2),
        ("headless-p2", 6, 1),
    ]
    one = tmp_path / "one.swf"
    one.write_text(
        "1 0 0 10 8 -1 -1 8 100 -1 1 1 -1 -1 -1 1 -1 -1\n"
        "2 1 0 10 5 -1 -1 5 100 -1 1 1 -1 -1 -1 -1 -1 -1\n"
    )
    ((cluster,),) = [load_grid([str(one)])]
    # one machine ran both (the -1 partition and 1): 8 + 5 held at once for 9 of 11 s
    assert (cluster.site.name, cluster.site.processors, len(cluster.jobs)) == ("one", 13, 2)


def test_a_grid_too_small_for_the_co_reserved_job_is_refused_naming_traces(
    tmp_path: Path,
) -> None:
    log = tmp_path / "small.swf"
    log.write_text(
        "; MaxProcs: 8\n"
        "1 0 0 10 2 -1 -1 2 60 -1 1 1 -1 -1 -1 -1 -1 -1\n"
        "2 100 5 10 2 -1 -1 2 60 -1 1 1 -1 -1 -1 -1 -1 -1\n"
    )
    with pytest.raises(ConfigError, match="--traces: the 2 largest clusters have 16 processors"):
        selection_traces([str(log), str(log)], windows=2)


def test_a_partition_with_no_job_to_replay_makes_no_cluster(tmp_path: Path) -> None:
    # partition 3's only job has no wait: it made an empty cluster, and the run was
    # refused ("a log has no job to replay"); wait-prediction replays such a log
    log = tmp_path / "three.swf"
    log.write_text(
        "1 0 0 10 8 -1 -1 8 100 -1 1 1 -1 -1 -1 1 -1 -1\n"
        "2 1 0 10 6 -1 -1 6 100 -1 1 1 -1 -1 -1 2 -1 -1\n"
        "3 2 -1 10 4 -1 -1 4 100 -1 1 1 -1 -1 -1 3 -1 -1\n"
        "4 3 0 10 2 -1 -1 2 100 -1 2 1 -1 -1 -1 3 -1 -1\n"
        "5 900 0 10 2 -1 -1 2 100 -1 1 1 -1 -1 -1 1 -1 -1\n"
        "6 900 0 10 2 -1 -1 2 100 -1 1 1 -1 -1 -1 2 -1 -1\n"
    )
    clusters = load_grid([str(log)])
    assert [c.site.name for c in clusters] == ["three-p1", "three-p2"]
    assert common_span(clusters) == (1.0, 900.0)


def test_an_unknown_requested_time_is_filled_from_the_kept_jobs_before_it(
    tmp_path: Path,
) -> None:
    # job 1 is larger than the machine: left out, it lends no requested time to job 2
    log = tmp_path / "four.swf"
    log.write_text(
        "; MaxProcs: 4\n"
        "1 0 0 10 8 -1 -1 8 5000 -1 1 1 -1 -1 -1 -1 -1 -1\n"
        "2 1 0 10 2 -1 -1 2   -1 -1 1 1 -1 -1 -1 -1 -1 -1\n"
        "3 2 0 10 2 -1 -1 2  100 -1 1 1 -1 -1 -1 -1 -1 -1\n"
        "4 3 0 10 2 -1 -1 2    0 -1 1 1 -1 -1 -1 -1 -1 -1\n"
    )
    (cluster,) = load_grid([str(log)])
    assert cluster.left_out == 1
    assert [j.requested_s for j in cluster.jobs] == [600.0, 100.0, 100.0]


def test_windows_are_drawn_after_the_warm_up_and_reproduce() -> None:
    span = (1000.0, 2000.0)
    starts = window_starts(span, 30, seed=4)
    assert starts == window_starts(span, 30, seed=4)
    assert all(1100.0 <= t <= 2000.0 for t in starts)
    assert starts != window_starts(span, 30, seed=5)


def test_the_log_at_an_instant_shows_its_running_and_queued_jobs_then() -> None:
    clusters = load_grid(HEADS)
    t0 = 700_000.0
    log = LogAt(t0, clusters)
    sites = [c.site for c in clusters]
    running = log.running(sites)
    assert running and all(r.started_s <= t0 < r.started_s + r.job.runtime_s for r in running)
    jobs = list(log.jobs(sites))
    first_later = next(i for i, j in enumerate(jobs) if j.submit_s > t0)
    assert all(j.submit_s <= t0 for j in jobs[:first_later])  # queued then, in order
    later = [j.submit_s for j in jobs[first_later:]]
    assert later == sorted(later)


def _overcommitted_log(tmp_path: Path) -> Path:
    """A 40-processor machine whose log shows 20 + 20 + 30 processors in use from 100 to
    10,000 s (logs do: CTC SP2's cleaned log shows up to 592 of its 338 at once), then
    small jobs every 50 s to give the experiment a span to draw windows from."""
    lines = ["; MaxProcs: 40"]
    for number, (submit, processors) in enumerate([(0, 20), (10, 20), (20, 30)], start=1):
        wait = 100 - submit
        lines.append(f"{number} {submit} {wait} 9900 {processors} -1 -1 {processors} 9999"
                     " -1 1 1 -1 -1 -1 -1 -1 -1")  # fmt: skip
    for number in range(4, 60):
        lines.append(f"{number} {number * 50} 0 30 1 -1 -1 1 60 -1 1 2 -1 -1 -1 -1 -1 -1")
    path = tmp_path / "overcommitted.swf"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jobs_a_log_shows_running_beyond_the_machine_are_queued_not_run(
    tmp_path: Path,
) -> None:
    (cluster,) = load_grid([str(_overcommitted_log(tmp_path))])
    log = LogAt(540.0, [cluster])  # no small job runs then (each runs 30 s of 50)
    running = log.running([cluster.site])
    # in start order while they fit: the 20 + 20 run, the 30-processor job (started at the
    # same instant, submitted last) is queued at the window's start, its whole run ahead
    assert [(r.job.name, r.job.processors) for r in running] == [
        ("overcommitted#1", 20),
        ("overcommitted#2", 20),
    ]
    assert sum(r.job.processors for r in running) <= cluster.site.processors
    queued = [j for j in log.jobs([cluster.site]) if j.submit_s <= 540.0]
    assert (queued[0].name, queued[0].runtime_s) == ("overcommitted#3", 9900.0)
    assert log.over_capacity == 1


def test_the_experiment_runs_on_a_log_that_overcommits_its_machine(tmp_path: Path) -> None:
    log = str(_overcommitted_log(tmp_path))
    result = selection_traces([log, log], windows=2, seed=0)
    # every window falls while the log overcommits: at least the 30-processor job is
    # queued on each cluster (a small job running then too)
    assert all(row["logged_running_queued"] >= 2 for row in result["per_window"])
    assert set(result["protocols"]) == {"naive", "default", "sbatch-m"}


def test_a_log_that_repeats_job_numbers_replays_each_line_as_its_own_job(
    tmp_path: Path,
) -> None:
    # every job number twice (a log's error, or parts of jobs): named by number alone,
    # two running jobs were one holder and the cluster refused the second
    lines = ["; MaxProcs: 40"]
    for number in range(1, 40):
        for _ in range(2):
            lines.append(f"{number} {number * 50} 0 400 4 -1 -1 4 600 -1 1 1 -1 -1 -1 -1 -1 -1")
    log = tmp_path / "repeats.swf"
    log.write_text("\n".join(lines) + "\n")
    (cluster,) = load_grid([str(log)])
    names = [job.name for job in cluster.jobs]
    assert len(names) == len(set(names)) == 78
    assert names[:2] == ["repeats#1", "repeats#1@3"]
    result = selection_traces([str(log), str(log)], windows=2, seed=0)
    assert len(result["per_window"]) == 2


def test_no_protocol_beats_the_no_wait_floor_and_the_floor_is_the_members_own() -> None:
    result = selection_traces(HEADS, windows=4, seed=0)
    for row in result["per_window"]:
        trace = canonical_trace(row["window"])  # seed 0: canonical_trace(0 * 1000 + k)
        # slowness 1 on every cluster: a member's floor is its hysteresis plus its run
        assert row["no_wait_s"] == statistics.median(
            j.hysteresis_s + j.runtime_s for j in trace.jobs
        )
        for completion in row["completion_s"].values():
            # a member that waits not at all completes at its floor up to rounding
            # (its end and arrival are absolute times of about 1e7 s)
            assert completion >= row["no_wait_s"] - 1e-6
    ratios = [r["no_wait_s"] / r["completion_s"]["naive"] for r in result["per_window"]]
    floor = result["references"]["no_wait"]["ratio_to_naive"]
    assert floor["median"] == statistics.median(ratios) and floor["median"] <= 1.0 + 1e-9


def test_the_no_wait_floor_runs_on_the_fastest_cluster() -> None:
    clusters = load_grid(HEADS)
    clusters[0].site = replace(clusters[0].site, slowness=0.5)
    clusters[1].site = replace(clusters[1].site, slowness=3.0)
    t0 = window_starts(common_span(clusters), 2, 0)[0]
    row = _window(clusters, t0, 0, 0, WarmModels(clusters).at(t0))
    trace = canonical_trace(0)
    assert row["no_wait_s"] == statistics.median(
        j.hysteresis_s + j.runtime_s * 0.5 for j in trace.jobs
    )


def test_warm_models_know_only_the_past_and_give_copies() -> None:
    clusters = load_grid(HEADS)
    warm = WarmModels(clusters)
    early = warm.at(650_000.0)
    late = warm.at(750_000.0)
    model = early["predicted_backfill"]["kth-sp2-head"]
    assert model is not late["predicted_backfill"]["kth-sp2-head"]
    learned = 0
    for t0, models in ((650_000.0, early), (750_000.0, late)):
        learned = sum(
            _assert_learned_exactly_the_log_before(cluster, t0, models, cluster.site.name)
            for cluster in clusters
        )
    assert warm.fed == learned  # every start and end before 750,000 s, once, no more


def _assert_learned_exactly_the_log_before(
    cluster: LoggedCluster, t0: float, models: dict[str, dict[str, Any]], site: str
) -> int:
    """Eq. 1 holds the last WINDOW logged starts before t0 (the newest start before t0
    last), Eq. W the waits of the jobs started and not ended before t0, and Tsafrir's
    history each user's last two run times of the jobs that ended before t0: nothing at
    or after t0. Returns how many starts and ends that is."""
    started = sorted((j for j in cluster.jobs if j.start_s < t0), key=lambda j: j.start_s)
    ended = sorted((j for j in cluster.jobs if j.end_s < t0), key=lambda j: j.end_s)
    assert started and ended and any(j.start_s >= t0 for j in cluster.jobs)
    eq1 = models["eq1"][site]
    assert list(eq1._started) == [QueueRecord(j.submit_s, j.start_s) for j in started[-WINDOW:]]
    assert eq1._started[-1].started_at < t0
    running = {j.name for j in started if not j.end_s < t0}
    assert set(models["eq_w"][site]._waits) == running and running
    recent: dict[int, deque[float]] = {}
    for job in ended:
        if job.user is not None:
            recent.setdefault(job.user, deque(maxlen=2)).append(job.end_s - job.start_s)
    assert models["predicted_backfill"][site].runtimes._recent == recent
    return len(started) + len(ended)


def test_a_window_leaves_the_warm_models_it_is_given_as_they_were() -> None:
    # Every protocol and every VJM run of a window starts from the models as they stood
    # at t0: the default selection's run must not teach VJM's copy of its model the
    # starts and ends of another simulation, which run past VJM's submit (the future).
    clusters = load_grid(HEADS)
    t0 = 700_000.0
    models = WarmModels(clusters).at(t0)
    before = pickle.dumps(models)
    _window(clusters, t0, 0, 0, models)
    assert pickle.dumps(models) == before


def test_the_experiment_runs_on_the_shipped_heads_with_the_fixed_keys() -> None:
    result = selection_traces(HEADS, windows=2, seed=0)
    assert result["windows"] == 2
    for name in ("default", "naive", "sbatch-m"):
        figures = result["protocols"][name]
        assert set(figures["ratio_to_naive"]) >= {"median", "p90"}
        assert set(figures["ratio_to_peer"]) >= {"median", "p90"}
    assert result["protocols"]["naive"]["ratio_to_naive"]["median"] == 1.0
    for model in ("eq1", "eq_w", "backfill", "qbets", "predicted_backfill"):
        assert set(result["vjm"][model]["coallocation_s"]) >= {"median", "p90"}
    assert len(result["per_window"]) == 2


def test_the_protocols_figures_do_not_depend_on_the_order_of_the_traces() -> None:
    # naive's "random when nothing fits" drew from the clusters in --traces order: with
    # the same seed, window 10 sent members elsewhere (918 s vs 853 s). VJM's ties go to
    # the cluster listed first by its documented rule (docs/coreservation.md): its
    # figures may depend on the order, the protocols' must not.
    forward = selection_traces(HEADS, windows=11, seed=0)["per_window"]
    backward = selection_traces(HEADS[::-1], windows=11, seed=0)["per_window"]
    assert [(r["t0_s"], r["completion_s"]) for r in forward] == [
        (r["t0_s"], r["completion_s"]) for r in backward
    ]


def test_a_vjm_job_that_never_started_counts_as_infinite_not_as_absent() -> None:
    # five windows; eq1's job started in two: over started jobs only its median would be
    # 150 s and it would beat every model that started in the hard windows
    times = {
        "eq1": [100.0, 200.0, None, None, None],
        "eq_w": [100.0, 200.0, 300.0, 400.0, None],
        "backfill": [100.0, 200.0, 300.0, 400.0, 500.0],
        "qbets": [None] * 5,
        "predicted_backfill": [150.0, 250.0, 350.0, 450.0, 550.0],
    }
    rows = [{"coallocation_s": {m: t[k] for m, t in times.items()}} for k in range(5)]
    vjm = _vjm_figures(rows)
    assert vjm["eq1"] == {
        "coallocation_s": {"median": None, "p90": None, "mean": None, "halfwidth_95": None},
        "never_started": 3,
    }
    assert (vjm["eq_w"]["coallocation_s"]["median"], vjm["eq_w"]["never_started"]) == (300.0, 1)
    assert vjm["eq_w"]["coallocation_s"]["p90"] is None  # between 400 s and never: never
    assert vjm["backfill"]["coallocation_s"]["p90"] == pytest.approx(460.0)
    assert vjm["qbets"]["never_started"] == 5
    json.dumps(vjm, allow_nan=False)  # no Infinity in the JSON
    protocol = {"completion_s": {"naive": 2.0, "default": 1.0, "sbatch-m": 1.0}}
    # the default model (350 s) beats eq1 (never, in most windows)
    assert _done([{**row, **protocol} for row in rows])["done_when"][
        "vjm_default_model_median_le_eq1"
    ]


def test_traces_are_required_and_windows_at_least_two(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["experiment", "selection-traces", "--plot", ""]) == 2
    assert "--traces" in capsys.readouterr().err
    assert main(["experiment", "selection-traces", "--traces", *HEADS, "--windows", "1"]) == 2
    assert "--windows" in capsys.readouterr().err


# -- item 5: the decisions take a wait model's forecasts --------------------------------------


def _forecast(wait: float) -> WaitForecast:
    return WaitForecast("test", wait, None, None, "given")


def test_selection_ranks_sites_by_the_wait_model_s_forecast_where_given() -> None:
    snaps = [SiteSnapshot("a", 8, 0), SiteSnapshot("b", 8, 0)]
    request = JobRequest("m", 4, 100.0)
    rng = random.Random(0)
    protocol = SelectionProtocol.EARLIEST_COMPLETION
    by_eq_w = select_site(request, snaps, free_bandwidth, protocol, rng=rng)
    waits = {"a": _forecast(5000.0), "b": _forecast(10.0)}
    by_model = select_site(request, snaps, free_bandwidth, protocol, rng=rng, waits=waits)
    assert by_eq_w.site == "a"  # Eq. W sees two equal sites: the first wins the tie
    assert by_model.site == "b"
    assert {e.site: e.queue_delay_s for e in by_model.estimates} == {"a": 5000.0, "b": 10.0}


def test_vjm_selection_uses_the_forecasts_per_virtual_job_instead_of_eq_1() -> None:
    stats = QueueStats(t_w=0.0, t_ffw=0.0, ql=0, dt=0.0)  # Eq. 1: 0 s everywhere
    plain = [ClusterView("a", stats, 4), ClusterView("b", stats, 4)]
    assert select_clusters(4, plain, 2).clusters == {"a": 4}
    forecast = [
        ClusterView("a", stats, 4, (100.0, 100.0, 900.0, 900.0)),
        ClusterView("b", stats, 4, (200.0, 200.0, 200.0, 200.0)),
    ]
    chosen = select_clusters(4, forecast, 2)
    assert chosen.clusters == {"a": 2, "b": 2}
    assert [c.t_avail for c in chosen.choices] == [100.0, 100.0, 200.0, 200.0]


def test_a_queue_view_shows_the_true_running_and_queued_work() -> None:
    sim = Simulator()
    cluster = Cluster(sim, SimSite("c", 4), policy=QueuePolicy.EASY)
    cluster.enqueue(Queued("r", 3, 100.0, Owner.LOCAL, requested_s=150.0, user=7))
    cluster.enqueue(Queued("q", 4, 50.0, Owner.LOCAL, requested_s=60.0, submitted_s=0.0))
    view = queue_view(cluster, sim.now)
    assert [(r.job_id, r.processors, r.requested_s, r.user) for r in view.running] == [
        ("r", 3, 150.0, 7)
    ]
    assert [(q.job_id, q.processors, q.requested_s) for q in view.queued] == [("q", 4, 60.0)]


class _Recording(BackfillModel):
    """The backfill wait model, remembering each virtual job's time limit it was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[float, float]] = []

    def forecast(self, job: QueuedJob, view: QueueView) -> WaitForecast:
        if str(job.job_id).startswith("?vj"):
            self.asked.append((view.now, job.requested_s))
        return super().forecast(job, view)


def test_vjm_asks_its_forecasts_for_pilots_as_long_as_the_ones_it_sends(
    tmp_path: Path,
) -> None:
    # both 40-processor clusters are full until 6,000 s by their logs' requested times:
    # every forecast is about 5,800 s, Eq. 2 gives the 3,600 s ceiling, so the pilots ask
    # pilot_time_limit(3600, 300); the forecasts must have been asked for that, not for
    # the 300 s floor's limit (as they were)
    log = tmp_path / "full.swf"
    log.write_text(
        "; MaxProcs: 40\n"
        "1 0 0 5000 40 -1 -1 40 6000 -1 1 1 -1 -1 -1 -1 -1 -1\n"
        "2 9000 0 10 1 -1 -1 1 60 -1 1 1 -1 -1 -1 -1 -1 -1\n"
    )
    clusters = load_grid([str(log), str(log)])
    models = {c.site.name: _Recording() for c in clusters}
    run = simulate_vjm(
        [VjmCluster(c.site) for c in clusters],
        [ParallelJob("J", 200.0, 20, 300.0)],
        VjmParams(max_clusters=2, wait_model="backfill"),
        log=LogAt(100.0, clusters),
        wait_models=models,
        horizon_s=20_000.0,
    )
    (job,) = run.jobs
    assert job.first_lifetime_s == LIFETIME_CEILING_S
    sent = pilot_time_limit(LIFETIME_CEILING_S, 300.0)
    at_submit = [limit for m in models.values() for now, limit in m.asked if now == 200.0]
    assert at_submit and max(at_submit) >= sent
