"""The co-allocation model: hand-checkable event traces and whole-run invariants."""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

import pytest

from gridcore.errors import ConfigError
from gridcore.experiments.coallocation_placement import das_clusters, workload_trace
from gridcore.model import RequestKind
from gridcore.policies.placement import PlacementPolicy
from gridcore.sim.coallocation import (
    FIG5_EXECUTION_S,
    CoallocRun,
    EventKind,
    Fig5ExecutionTime,
    GridJob,
    coallocation_request,
    simulate_coallocation,
)
from gridcore.sim.workload import BackgroundLoad, LocalJob, SimSite, TraceEvent

WF, CM, FCM = PlacementPolicy.WF, PlacementPolicy.CM, PlacementPolicy.FCM
E = EventKind


def _ten_per_cluster(size: int, clusters: int) -> float:
    return 10.0 * clusters


def _grid_events(run: CoallocRun) -> list[tuple[float, EventKind, str, str, int]]:
    return [(e.at, e.kind, e.job, e.site, e.processors) for e in run.events]


# --- waiting for processors ----------------------------------------------------------------


def test_a_job_that_does_not_fit_waits_until_a_local_job_releases_processors() -> None:
    clusters = [SimSite("A", 10), SimSite("B", 10)]
    local = [LocalJob("L", "A", 0.0, 30.0, 8)]
    job = GridJob("j", 1.0, (6, 6))
    run = simulate_coallocation(clusters, [job], CM, _ten_per_cluster, local_jobs=local)
    # t=1: idle A 2, B 10: CM puts one 6 on B (4 left) and has nowhere for the other.
    # The scans at 4, 8, ..., 28 see the same idle counts; L leaves at 30; the scan at 32
    # sees A 10, B 10 (A first, by order), puts a 6 on A, and the second 6 on B.
    assert _grid_events(run) == [
        (0.0, E.LOCAL_START, "L", "A", 8),
        (1.0, E.ARRIVE, "j", "", 12),
        (1.0, E.QUEUE, "j", "", 12),
        (30.0, E.LOCAL_END, "L", "A", 8),
        (32.0, E.START, "j", "A", 6),
        (32.0, E.START, "j", "B", 6),
        (52.0, E.END, "j", "A", 6),
        (52.0, E.END, "j", "B", 6),
    ]
    record = run.by_name("j")
    assert (record.wait_s, record.execution_s, record.response_s) == (31.0, 20.0, 51.0)
    assert record.clusters_combined == 2
    assert record.tries == 9  # on arrival, then the scans at 4, 8, ..., 32


def test_fcm_cuts_the_same_job_to_fit_at_once() -> None:
    clusters = [SimSite("A", 10), SimSite("B", 10)]
    local = [LocalJob("L", "A", 0.0, 30.0, 8)]
    run = simulate_coallocation(
        clusters, [GridJob("j", 1.0, (6, 6))], FCM, _ten_per_cluster, local_jobs=local
    )
    # The total of 12 fits as B's 10 idle plus 2 of A's: no queueing, two clusters.
    assert _grid_events(run)[1:4] == [
        (1.0, E.ARRIVE, "j", "", 12),
        (1.0, E.START, "j", "B", 10),
        (1.0, E.START, "j", "A", 2),
    ]
    record = run.by_name("j")
    assert (record.wait_s, record.execution_s, record.tries) == (0.0, 20.0, 1)


def test_a_queued_job_starts_at_the_scan_that_sees_another_job_release() -> None:
    clusters = [SimSite("A", 8)]
    jobs = [GridJob("j0", 0.0, (8,)), GridJob("j1", 2.0, (8,))]
    run = simulate_coallocation(clusters, jobs, WF, lambda size, c: 12.0)
    # j0 ends at 12, exactly on a scan tick: releases run before the scan, so the scan at
    # 12 places j1 (the scans at 4 and 8 failed).
    assert _grid_events(run) == [
        (0.0, E.ARRIVE, "j0", "", 8),
        (0.0, E.START, "j0", "A", 8),
        (2.0, E.ARRIVE, "j1", "", 8),
        (2.0, E.QUEUE, "j1", "", 8),
        (12.0, E.END, "j0", "A", 8),
        (12.0, E.START, "j1", "A", 8),
        (24.0, E.END, "j1", "A", 8),
    ]
    assert [r.wait_s for r in run.jobs] == [0.0, 10.0]
    assert run.by_name("j1").tries == 4  # arrival, 4, 8, 12


def test_a_stuck_head_of_the_queue_does_not_block_the_jobs_behind_it() -> None:
    clusters = [SimSite("A", 10)]
    jobs = [GridJob("big", 1.0, (10,)), GridJob("small", 2.0, (4,))]
    local = [LocalJob("L1", "A", 0.0, 50.0, 4), LocalJob("L2", "A", 0.0, 10.0, 6)]
    run = simulate_coallocation(clusters, jobs, CM, lambda size, c: 100.0, local_jobs=local)
    # Both queue on a full cluster. L2 leaves at 10: the scan at 12 finds big (10) still
    # stuck and places small (4) behind it. big waits for L1 (50) and for small, which
    # ends at 112, itself a scan tick.
    starts = [(e.at, e.job) for e in run.events if e.kind is E.START]
    assert starts == [(12.0, "small"), (112.0, "big")]


def test_at_a_scan_placed_jobs_take_their_processors_before_the_next_try() -> None:
    clusters = [SimSite("A", 10)]
    jobs = [GridJob("a", 1.0, (6,)), GridJob("b", 2.0, (6,))]
    local = [LocalJob("L", "A", 0.0, 3.0, 10)]
    run = simulate_coallocation(clusters, jobs, CM, lambda size, c: 50.0, local_jobs=local)
    # Both queue behind L; the scan at 4 places a (head) and b no longer fits.
    starts = [(e.at, e.job) for e in run.events if e.kind is E.START]
    assert starts == [(4.0, "a"), (56.0, "b")]


# --- execution time grows with clusters combined ---------------------------------------------


@pytest.mark.parametrize(
    ("size", "clusters", "comm_factor", "expected"),
    [
        (36, 1, 1.0, 100.0),
        (36, 2, 1.0, 140.0),
        (36, 4, 1.0, 195.0),
        (36, 5, 1.0, 220.0),  # past the table: the last step (195 - 170) once more
        (72, 3, 1.0, 255.0),
        (64, 2, 0.0, 140.0),  # no co-allocation penalty
        (64, 2, 2.0, 250.0),  # 140 + 2 * (195 - 140)
        (72, 4, 0.5, 220.0),  # 150 + 0.5 * (290 - 150)
    ],
)
def test_fig5_table_by_size_and_clusters_combined(
    size: int, clusters: int, comm_factor: float, expected: float
) -> None:
    assert Fig5ExecutionTime(comm_factor=comm_factor)(size, clusters) == pytest.approx(expected)


def test_the_table_grows_with_clusters_for_every_size() -> None:
    model = Fig5ExecutionTime()
    for size in FIG5_EXECUTION_S:
        times = [model(size, c) for c in range(1, 6)]
        assert times == sorted(times) and times[0] < times[1]
        assert times[-1] <= 900.0  # the DAS's 15-minute limit


@pytest.mark.parametrize(
    ("policy", "clusters_combined", "execution_s"),
    [
        # 36 as 2 x 18 on A 40 idle, B 30 idle.
        (WF, 2, 140.0),  # 18 on A (22 left), then B has more left: 18 on B
        (CM, 1, 100.0),  # both on A, the emptiest, which holds them
        (FCM, 1, 100.0),  # 36 on A at once
    ],
)
def test_execution_time_follows_the_placement_s_clusters_combined(
    policy: PlacementPolicy, clusters_combined: int, execution_s: float
) -> None:
    clusters = [SimSite("A", 40), SimSite("B", 30)]
    run = simulate_coallocation(
        clusters, [GridJob("j", 0.0, (18, 18))], policy, Fig5ExecutionTime()
    )
    record = run.by_name("j")
    assert (record.clusters_combined, record.execution_s) == (clusters_combined, execution_s)


def test_requests_are_non_fixed_for_wf_and_cm_and_flexible_for_fcm() -> None:
    job = GridJob("j", 0.0, (12, 12, 12))
    for policy in (WF, CM):
        request = coallocation_request(job, policy)
        assert request.kind is RequestKind.NON_FIXED
        assert [c.size for c in request.components] == [12, 12, 12]
    flexible = coallocation_request(job, FCM)
    assert (flexible.kind, flexible.total, flexible.components) == (RequestKind.FLEXIBLE, 36, ())


# --- whole runs ----------------------------------------------------------------------------------


def _w2_run(policy: PlacementPolicy, seed: int = 0) -> CoallocRun:
    return simulate_coallocation(
        das_clusters(),
        workload_trace(seed, 200, 40.0),
        policy,
        Fig5ExecutionTime(),
        background=BackgroundLoad(),
        seed=seed,
    )


def _busy_after_each_event(events: tuple[TraceEvent, ...]) -> list[dict[str, int]]:
    busy: dict[str, int] = defaultdict(int)
    states: list[dict[str, int]] = []
    take = {E.START: 1, E.LOCAL_START: 1, E.END: -1, E.LOCAL_END: -1}
    for event in events:
        busy[event.site] += take.get(event.kind, 0) * event.processors
        states.append(dict(busy))
    return states


@pytest.mark.parametrize("policy", [WF, CM, FCM])
def test_processors_in_use_never_exceed_a_cluster_s_size(policy: PlacementPolicy) -> None:
    run = _w2_run(policy)
    sizes = {c.name: c.processors for c in das_clusters()}
    states = _busy_after_each_event(run.events)
    for state in states:
        for site, busy in state.items():
            if site:
                assert 0 <= busy <= sizes[site]
    assert all(busy == 0 for site, busy in states[-1].items() if site)
    # Some cluster was full at some point: the bound is reached, not just respected.
    assert {site for state in states for site, busy in state.items() if busy == sizes.get(site)}
    assert len(run.jobs) == 200
    assert all(r.start_s >= r.arrival_s and r.end_s > r.start_s for r in run.jobs)
    assert [r.name for r in run.jobs] == sorted(r.name for r in run.jobs)


def test_local_load_stays_within_the_band_and_makes_idle_counts_fluctuate() -> None:
    run = _w2_run(CM)
    low, high = BackgroundLoad().band(320)
    assert (low, high) == (48, 64)
    local = 0
    levels: list[tuple[float, int]] = []
    for event in run.events:
        if event.kind is E.LOCAL_START:
            local += event.processors
        elif event.kind is E.LOCAL_END:
            local -= event.processors
        else:
            continue
        assert local <= high
        levels.append((event.at, local))
    # Time-weighted over the grid jobs' run, the local load sits in the band: a release
    # lets a dummy in at once whenever it has dipped under 15 %.
    last_grid = max(r.end_s for r in run.jobs)
    spans = [
        (min(b[0], last_grid) - a[0], a[1])
        for a, b in itertools.pairwise(levels)
        if a[0] < last_grid
    ]
    total = sum(d for d, _ in spans)
    assert low <= sum(d * level for d, level in spans) / total <= high
    assert sum(d for d, level in spans if level < low) / total < 0.01
    assert len({level for at, level in levels if at < last_grid}) > 5
    drops = [e for e in run.events if e.kind is E.LOCAL_DROP]
    assert drops  # arrivals above 20 % were turned away


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    first, again = _w2_run(FCM, seed=3), _w2_run(FCM, seed=3)
    assert first == again
    assert _w2_run(FCM, seed=4).events != first.events


def test_policies_see_the_same_offered_local_load() -> None:
    # The local arrival stream draws the same numbers whatever the policy does.
    def offered(run: CoallocRun) -> list[tuple[float, str, str, int]]:
        kinds = (E.LOCAL_START, E.LOCAL_DROP)
        return [
            (e.at, e.job, e.site, e.processors)
            for e in run.events
            if e.kind in kinds and e.job.startswith("local-")
        ]

    cm, fcm = offered(_w2_run(CM)), offered(_w2_run(FCM))
    shared = min(len(cm), len(fcm))
    assert shared > 100
    assert cm[:shared] == fcm[:shared]


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("clusters", "jobs", "local", "message"),
    [
        ([], [], [], "at least one cluster"),
        ([SimSite("A", 4), SimSite("A", 4)], [], [], "unique"),
        ([SimSite("A", 4)], [GridJob("j", 0.0, (5,))], [], "largest cluster"),
        ([SimSite("A", 4)], [GridJob("j", -1.0, (2,))], [], "arrival_s"),
        ([SimSite("A", 4)], [], [LocalJob("L", "Z", 0.0, 1.0, 1)], "unknown cluster"),
        (
            [SimSite("A", 4)],
            [GridJob("x", 0.0, (2,))],
            [LocalJob("x", "A", 0.0, 1.0, 1)],
            "repeated",
        ),
        # 3 x 10 on 12, 12 and 9 processors (33 in all): only two components ever fit.
        (
            [SimSite("A", 12), SimSite("B", 12), SimSite("C", 9)],
            [GridJob("j", 0.0, (10, 10, 10))],
            [],
            "cannot place it even on idle clusters",
        ),
    ],
)
def test_bad_input_is_rejected_before_running(
    clusters: list[SimSite], jobs: list[GridJob], local: list[LocalJob], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        simulate_coallocation(clusters, jobs, CM, _ten_per_cluster, local_jobs=local)


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ConfigError, match="scan_interval_s"):
        simulate_coallocation([SimSite("A", 4)], [], CM, _ten_per_cluster, scan_interval_s=0)
    with pytest.raises(ConfigError, match="comm_factor"):
        Fig5ExecutionTime(comm_factor=-1.0)
    with pytest.raises(ConfigError, match="no execution time for job size 10"):
        Fig5ExecutionTime()(10, 1)
    with pytest.raises(ConfigError, match="low_fraction"):
        BackgroundLoad(low_fraction=0.3, high_fraction=0.2)


def test_arrivals_and_scans_place_through_the_koala_queue_scan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The model applies policies.claiming.scan_placement_queue, as the KOALA model does:
    # one call per arrival try and per scan, each over the queue in order.
    import gridcore.sim.coallocation as coalloc

    scanned: list[list[str]] = []
    real = coalloc.scan_placement_queue

    def recording(queue: Any, *args: Any, **kwargs: Any) -> Any:
        scanned.append([job.name for job in queue])
        return real(queue, *args, **kwargs)

    monkeypatch.setattr(coalloc, "scan_placement_queue", recording)
    jobs = [GridJob("j0", 0.0, (8,)), GridJob("j1", 2.0, (8,))]
    run = simulate_coallocation([SimSite("A", 8)], jobs, WF, lambda size, c: 12.0)
    assert scanned == [["j0"], ["j1"], ["j1"], ["j1"], ["j1"]]  # arrivals, scans 4, 8, 12
    assert [r.tries for r in run.jobs] == [1, 4]
