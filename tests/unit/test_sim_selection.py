"""The site-selection model: hand-checkable scenarios and whole-run invariants."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import pytest

from gridcore.errors import ConfigError
from gridcore.experiments.selection import canonical_trace
from gridcore.model import JobState, ObservedJob
from gridcore.policies.selection import InsufficientMode, SelectionProtocol
from gridcore.sim.selection import (
    JobRecord,
    SelectionRun,
    SimJob,
    StreamConfig,
    simulate_selection,
)
from gridcore.sim.workload import LocalJob, SimSite

NAIVE = StreamConfig(SelectionProtocol.NAIVE, InsufficientMode.RANDOM)
STATEFUL = StreamConfig(SelectionProtocol.STATEFUL, InsufficientMode.BEST)
EARLIEST = StreamConfig(SelectionProtocol.STATEFUL, InsufficientMode.EARLIEST)


def _sites(run: SelectionRun) -> dict[str, str]:
    return {job.name: job.site for job in run.jobs}


def _times(record: JobRecord) -> tuple[float, float, float]:
    return (record.queue_arrival_s, record.start_s, record.end_s)


def _burst(n: int, spacing: float = 10.0, hysteresis: float = 30.0) -> list[SimJob]:
    return [SimJob(f"j{i}", i * spacing, 100.0, 2, hysteresis) for i in range(n)]


# --- a burst inside the monitor window ---------------------------------------------------


def test_three_jobs_inside_one_monitor_window_naive_sends_all_to_one_site() -> None:
    sites = [SimSite("A", 4), SimSite("B", 4)]
    run = simulate_selection(sites, _burst(3), {0: NAIVE})
    # Every selection sees the report of t=0: both sites idle; the tie goes to A.
    assert _sites(run) == {"j0": "A", "j1": "A", "j2": "A"}
    assert _times(run.by_name("j0")) == (30.0, 30.0, 130.0)
    assert _times(run.by_name("j1")) == (40.0, 40.0, 140.0)
    # A has 4 CPUs: the third job queues until the first ends while B stays idle.
    assert _times(run.by_name("j2")) == (50.0, 130.0, 230.0)
    assert run.completion_s == 230.0
    assert run.total_queue_s == 80.0


def test_three_jobs_inside_one_monitor_window_stateful_spreads_them() -> None:
    sites = [SimSite("A", 4), SimSite("B", 4)]
    run = simulate_selection(sites, _burst(3), {0: STATEFUL})
    # j1 sees A at 4 - 2 in flight; j2 sees A and B both at 2 and takes A by name.
    assert _sites(run) == {"j0": "A", "j1": "B", "j2": "A"}
    assert [r.queued_s for r in run.jobs] == [0.0, 0.0, 0.0]
    assert run.completion_s == 150.0
    est = run.by_name("j1").selection
    assert est is not None
    a_view = est.estimate_for("A")
    assert a_view is not None and a_view.effective_idle == 2


# --- what the monitor shows ----------------------------------------------------------------


def test_a_job_in_hysteresis_is_invisible_and_only_its_own_stream_discounts_it() -> None:
    sites = [SimSite("A", 8)]
    jobs = [
        SimJob("j0", 0.0, 200.0, 2, hysteresis_s=90.0, stream=0),
        SimJob("other", 70.0, 200.0, 2, hysteresis_s=90.0, stream=1),
        SimJob("j2", 70.0, 200.0, 2, hysteresis_s=90.0, stream=0),
        SimJob("j3", 130.0, 200.0, 2, hysteresis_s=90.0, stream=0),
    ]
    run = simulate_selection(sites, jobs, {0: STATEFUL, 1: NAIVE})
    assert run.reports_at(60.0)["A"].idle_processors == 8
    assert run.reports_at(60.0)["A"].jobs == ()
    assert run.reports_at(120.0)["A"].idle_processors == 6
    assert run.reports_at(120.0)["A"].jobs == (ObservedJob("j0", 2, JobState.RUNNING),)

    def seen(name: str) -> int:
        selection = run.by_name(name).selection
        assert selection is not None
        estimate = selection.estimate_for("A")
        assert estimate is not None
        return estimate.effective_idle

    assert seen("other") == 8  # naive: the report of t=60 shows nothing running
    assert seen("j2") == 8 - 2  # stateful: j0 is selected but not yet seen running
    # Report of t=120 shows j0 running (not discounted twice); j2 is still in flight and
    # stream 1's job, equally in hysteresis, is unknown to stream 0.
    assert seen("j3") == 6 - 2


def test_a_job_started_after_the_last_report_is_invisible() -> None:
    sites = [SimSite("A", 4)]
    jobs = [
        SimJob("early", 0.0, 500.0, 2, hysteresis_s=10.0, stream=0),
        SimJob("look", 30.0, 100.0, 2, hysteresis_s=0.0, stream=1),
    ]
    run = simulate_selection(sites, jobs, {0: NAIVE, 1: NAIVE})
    assert run.by_name("early").start_s == 10.0
    selection = run.by_name("look").selection
    assert selection is not None
    estimate = selection.estimate_for("A")
    assert estimate is not None and estimate.effective_idle == 4
    assert run.reports_at(60.0)["A"].idle_processors == 0


def test_external_load_reduces_the_reported_idle_count() -> None:
    sites = [SimSite("A", 4, 1.0), SimSite("B", 4, 1.2)]
    job = SimJob("j0", 5.0, 100.0, 2, hysteresis_s=10.0)
    alone = simulate_selection(sites, [job], {0: NAIVE})
    assert alone.by_name("j0").site == "A"  # faster
    loaded = simulate_selection(
        sites, [job], {0: NAIVE}, external=[LocalJob("x", "A", 0.0, 500.0, 3)]
    )
    report = loaded.reports_at(0.0)["A"]
    assert report.idle_processors == 1
    assert report.jobs == (ObservedJob("x", 3, JobState.RUNNING),)
    assert loaded.by_name("j0").site == "B"
    x = loaded.by_name("x")
    assert (x.stream, x.start_s, x.end_s) == (None, 0.0, 500.0)
    assert loaded.by_name("j0").compute_s == pytest.approx(120.0)


def test_a_blocked_queue_head_fools_naive_but_not_stateful() -> None:
    # A reports 2 idle, but a 4-CPU external job waits at the head of its FIFO queue.
    sites = [SimSite("A", 4, 1.0), SimSite("B", 4, 1.2)]
    external = [LocalJob("x1", "A", 0.0, 100.0, 2), LocalJob("x2", "A", 0.0, 100.0, 4)]
    job = [SimJob("j0", 5.0, 100.0, 2)]
    naive = simulate_selection(sites, job, {0: NAIVE}, external=external)
    assert naive.by_name("j0").site == "A"
    # FIFO: j0 waits behind x2, which waits for x1.
    assert _times(naive.by_name("x2"))[1:] == (100.0, 200.0)
    assert _times(naive.by_name("j0")) == (5.0, 200.0, 300.0)
    stateful = simulate_selection(sites, job, {0: STATEFUL}, external=external)
    assert stateful.by_name("j0").site == "B"
    assert stateful.by_name("j0").start_s == 5.0


# --- streams -----------------------------------------------------------------------------


def _two_streams() -> tuple[list[SimSite], list[SimJob]]:
    sites = [SimSite("A", 4, 1.0), SimSite("B", 4, 1.5)]
    jobs = [SimJob(f"j{i}", i * 10.0, 100.0, 2, 30.0, stream=i % 2) for i in range(4)]
    return sites, jobs


def test_independent_stateful_streams_overload_the_site_they_both_prefer() -> None:
    sites, jobs = _two_streams()
    run = simulate_selection(sites, jobs, {0: STATEFUL, 1: STATEFUL})
    assert _sites(run) == {"j0": "A", "j1": "A", "j2": "A", "j3": "A"}
    assert [r.start_s for r in run.jobs] == [30.0, 40.0, 130.0, 140.0]
    assert run.completion_s == 240.0


def test_streams_sharing_one_state_see_each_others_jobs() -> None:
    sites, jobs = _two_streams()
    shared = StreamConfig(SelectionProtocol.STATEFUL, InsufficientMode.BEST, state="db")
    run = simulate_selection(sites, jobs, {0: shared, 1: shared})
    assert _sites(run) == {"j0": "A", "j1": "A", "j2": "B", "j3": "B"}
    assert [r.start_s for r in run.jobs] == [30.0, 40.0, 50.0, 60.0]
    assert run.completion_s == 210.0


def test_observed_queue_waits_of_finished_jobs_feed_the_earliest_mode() -> None:
    sites = [SimSite("A", 2), SimSite("B", 2)]
    external = [
        LocalJob("x1", "A", 1.0, 400.0, 2),  # after the t=0 report: j0 walks into it
        LocalJob("x2", "A", 590.0, 1000.0, 2),
        LocalJob("x3", "B", 590.0, 1000.0, 2),
    ]
    jobs = [SimJob("j0", 5.0, 100.0, 2), SimJob("j1", 610.0, 100.0, 2)]
    run = simulate_selection(sites, jobs, {0: EARLIEST}, external=external)
    assert run.by_name("j0").site == "A"
    assert run.by_name("j0").queued_s == 396.0
    selection = run.by_name("j1").selection
    assert selection is not None
    a_view, b_view = selection.estimate_for("A"), selection.estimate_for("B")
    assert a_view is not None and b_view is not None
    assert a_view.queue_delay_s == pytest.approx(396.0)  # observed at A
    assert b_view.queue_delay_s == pytest.approx(100.0)  # drain estimate only
    assert run.by_name("j1").site == "B"


# --- records -----------------------------------------------------------------------------


def test_queued_time_runs_from_reaching_the_queue_and_runtime_scales_with_slowness() -> None:
    sites = [SimSite("A", 2, 1.5)]
    jobs = [SimJob("j0", 0.0, 100.0, 2, 10.0), SimJob("j1", 0.0, 100.0, 2, 10.0)]
    run = simulate_selection(sites, jobs, {0: NAIVE})
    assert _times(run.by_name("j0")) == (10.0, 10.0, 160.0)
    assert _times(run.by_name("j1")) == (10.0, 160.0, 310.0)
    assert run.by_name("j1").queued_s == 150.0
    assert run.by_name("j1").response_s == 310.0
    assert (run.completion_s, run.total_queue_s, run.mean_queue_s) == (310.0, 150.0, 75.0)
    assert (run.total_compute_s, run.mean_compute_s) == (300.0, 150.0)
    # The monitor stops at its first tick after everything completed.
    assert sorted({r.observed_at for r in run.reports}) == [60.0 * k for k in range(7)]


def test_records_keep_input_order() -> None:
    sites = [SimSite("A", 4)]
    jobs = [SimJob("late", 50.0, 10.0, 1), SimJob("early", 0.0, 10.0, 1)]
    run = simulate_selection(sites, jobs)
    assert [r.name for r in run.jobs] == ["late", "early"]


# --- determinism and invariants over whole runs ----------------------------------------------


def _busy_case() -> tuple[list[SimSite], list[SimJob], list[LocalJob]]:
    trace = canonical_trace(3)
    external = [
        LocalJob("ext-a", "mileva", 200.0, 900.0, 10),
        LocalJob("ext-b", "scoops", 400.0, 600.0, 8),
        LocalJob("ext-c", "canbc01", 500.0, 300.0, 5),
    ]
    return list(trace.sites), list(trace.jobs), external


@pytest.mark.parametrize("config", [NAIVE, STATEFUL, EARLIEST], ids=["naive", "best", "earliest"])
def test_the_same_seed_gives_the_same_run(config: StreamConfig) -> None:
    sites, jobs, external = _busy_case()
    streams = {0: config, 1: config}
    first = simulate_selection(sites, jobs, streams, external=external, seed=11)
    assert first == simulate_selection(sites, jobs, streams, external=external, seed=11)


def test_random_choices_depend_on_the_seed() -> None:
    sites, jobs, external = _busy_case()
    # Stateful+random: the grid is oversubscribed, so the random fallback is used.
    config = StreamConfig(SelectionProtocol.STATEFUL, InsufficientMode.RANDOM)
    streams = {0: config, 1: config}
    placements = {
        tuple(_sites(simulate_selection(sites, jobs, streams, external=external, seed=s)).items())
        for s in range(5)
    }
    assert len(placements) > 1


def _assert_capacity_and_fifo(run: SelectionRun, sites: Sequence[SimSite]) -> None:
    records = (*run.jobs, *run.external)
    events: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
    for r in records:
        assert r.queue_arrival_s <= r.start_s <= r.end_s
        # At equal times ends (0) are replayed before starts (1), as the model runs them.
        events[r.site].append((r.start_s, 1, r.processors))
        events[r.site].append((r.end_s, 0, -r.processors))
    capacity = {site.name: site.processors for site in sites}
    for site, replay in events.items():
        used = 0
        for _, _, delta in sorted(replay):
            used += delta
            assert 0 <= used <= capacity[site], f"{site} over capacity: {used}"
    for site in capacity:
        # FIFO: in queue-arrival order, start times never go down.
        starts = [
            start
            for _, start in sorted(
                (r.queue_arrival_s, r.start_s) for r in records if r.site == site
            )
        ]
        assert starts == sorted(starts), f"{site}: a later arrival overtook an earlier one"


@pytest.mark.parametrize(
    "config",
    [NAIVE, STATEFUL, EARLIEST, StreamConfig(SelectionProtocol.STATEFUL, InsufficientMode.RANDOM)],
    ids=["naive", "best", "earliest", "stateful-random"],
)
def test_no_site_ever_runs_more_processors_than_it_has(config: StreamConfig) -> None:
    sites, jobs, external = _busy_case()
    for seed in range(5):
        run = simulate_selection(sites, jobs, {0: config, 1: config}, external=external, seed=seed)
        assert len(run.jobs) == len(jobs) and len(run.external) == len(external)
        _assert_capacity_and_fifo(run, sites)


# --- validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("jobs", "external", "streams", "message"),
    [
        ([SimJob("big", 0.0, 10.0, 9)], [], None, "largest site"),
        ([SimJob("j", 0.0, 10.0, 1, stream=3)], [], {0: NAIVE}, "no configuration"),
        ([SimJob("j", 0.0, 10.0, 1), SimJob("j", 1.0, 10.0, 1)], [], None, "unique"),
        ([], [LocalJob("x", "Z", 0.0, 1.0, 1)], None, "unknown site"),
        ([], [LocalJob("x", "A", 0.0, 1.0, 5)], None, "processors >"),
        ([SimJob("j", -1.0, 10.0, 1)], [], None, "time >= 0"),
        ([SimJob("j", 0.0, 10.0, 1, hysteresis_s=-1.0)], [], None, "hysteresis"),
    ],
)
def test_malformed_scenarios_fail_fast(
    jobs: list[SimJob],
    external: list[LocalJob],
    streams: dict[int, StreamConfig] | None,
    message: str,
) -> None:
    sites = [SimSite("A", 4), SimSite("B", 8)]
    with pytest.raises(ConfigError, match=message):
        simulate_selection(sites, jobs, streams, external=external)


def test_bad_sites_and_monitor_interval_fail_fast() -> None:
    with pytest.raises(ConfigError, match="at least one site"):
        simulate_selection([], [])
    with pytest.raises(ConfigError, match="unique"):
        simulate_selection([SimSite("A", 1), SimSite("A", 2)], [])
    with pytest.raises(ConfigError, match="slowness"):
        simulate_selection([SimSite("A", 1, 0.0)], [])
    with pytest.raises(ConfigError, match="monitor_interval_s"):
        simulate_selection([SimSite("A", 1)], [], monitor_interval_s=0.0)
