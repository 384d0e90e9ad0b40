"""KOALA's pure scheduling decisions (KOALA 2005 Sec. 3): the claiming queue's times,
placement-queue scans, the Incremental Claiming Policy and fault tolerance."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridcore.errors import ConfigError
from gridcore.model import (
    MB,
    CoAllocationRequest,
    Component,
    FileDelivery,
    InputFile,
    Outcome,
    PlacedComponent,
    Priority,
    Replica,
    RequestKind,
    SiteHealth,
    SiteSnapshot,
)
from gridcore.policies.claiming import (
    ClaimingJob,
    ClaimOutcome,
    CoAllocationParams,
    FailureOutcome,
    QueuedJob,
    RunningLowJob,
    claim_decision,
    claim_schedule,
    first_claim_try,
    initial_claim_time,
    job_start_time,
    lowered_L,
    next_claim_time,
    next_claim_try,
    on_component_failure,
    record_site_error,
    record_site_success,
    scan_order,
    scan_placement_queue,
)
from gridcore.policies.placement import PlacementPolicy, place

PAPER = CoAllocationParams()
FOUR_GB = 4 * 10**9
BACKBONE = 12.5  # MB/s: the DAS's 100 Mbit/s (KOALA 2005 Sec. 2.1)


def backbone(src: str, dst: str) -> float:
    return BACKBONE


def request(
    name: str, *sizes: int, priority: Priority = Priority.HIGH, file: bool = True
) -> CoAllocationRequest:
    return CoAllocationRequest(
        name,
        RequestKind.NON_FIXED,
        tuple(Component(size) for size in sizes),
        input_file=InputFile(f"{name}.in") if file else None,
        priority=priority,
    )


def replicas(name: str, *sites: str) -> tuple[Replica, ...]:
    return tuple(Replica(f"{name}.in", s, f"file:///{s}/{name}.in", FOUR_GB, "") for s in sites)


def clusters(**idle: int) -> list[SiteSnapshot]:
    return [SiteSnapshot(site, 64, n) for site, n in idle.items()]


def claiming(
    name: str,
    placed: Sequence[tuple[int, str]],
    *,
    jst: float = 1000.0,
    L: float = 0.75,
    started: Sequence[int] = (),
    tries: int = 0,
    priority: Priority = Priority.HIGH,
    files: Sequence[str] = ("a",),
) -> ClaimingJob:
    sizes = [size for size, _ in placed]
    components = tuple(
        PlacedComponent(i, size, site, files[0], 0.0 if site == files[0] else 320.0)
        for i, (size, site) in enumerate(placed)
    )
    return ClaimingJob(
        request(name, *sizes, priority=priority),
        components,
        jst,
        L,
        frozenset(started),
        tries,
        replicas(name, *files),
    )


# -- parameters ---------------------------------------------------------------------------


def test_defaults_are_the_papers_experiment() -> None:
    assert (PAPER.L, PAPER.L_decrement, PAPER.L_min, PAPER.T, PAPER.S) == (
        0.75,
        0.125,
        0.25,
        0.0,
        2,
    )
    assert PAPER.placement_try_limit is None and PAPER.claim_try_limit is None
    assert PAPER.scan_interval_s == 240.0  # "fixed ... at 4 minutes" (Sec. 4)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"L": 1.0}, "CoAllocationParams.L "),
        ({"L": 0.0}, "CoAllocationParams.L "),
        ({"L_min": 0.8}, "CoAllocationParams.L_min"),
        ({"L_decrement": -0.1}, "CoAllocationParams.L_decrement"),
        ({"T": 1.5}, "CoAllocationParams.T"),
        ({"S": 1}, "CoAllocationParams.S"),
        ({"placement_try_limit": -1}, "CoAllocationParams.placement_try_limit"),
        ({"claim_try_limit": -1}, "CoAllocationParams.claim_try_limit"),
        ({"queue_cap": 0}, "CoAllocationParams.queue_cap"),
        ({"unusable_after_errors": 0}, "CoAllocationParams.unusable_after_errors"),
        ({"scan_interval_s": 0.0}, "CoAllocationParams.scan_interval_s"),
        ({"claim_resolution_s": 0.0}, "CoAllocationParams.claim_resolution_s"),
    ],
)
def test_invalid_parameters_name_the_field(changes: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        CoAllocationParams(**changes)  # type: ignore[arg-type]


# -- the claiming queue's times (Sec. 3.2) --------------------------------------------------


def test_jpt_0_ftt_100_l_075_gives_the_jct_sequence() -> None:
    assert job_start_time(0.0, 100.0) == 100.0
    assert initial_claim_time(0.0, 100.0, 0.75) == 75.0
    assert next_claim_time(75.0, 100.0, 0.75) == 93.75
    assert next_claim_time(93.75, 100.0, 0.75) == 98.4375
    assert next_claim_time(98.4375, 100.0, 0.75) == 99.609375


def test_claiming_tries_end_with_one_at_the_jst() -> None:
    # 100 - 99.609375 < 1 s (claim_resolution_s): the try after 98.4375 is the JST.
    assert claim_schedule(0.0, 100.0, 0.75, PAPER) == (75.0, 93.75, 98.4375, 100.0)
    assert next_claim_try(98.4375, 100.0, 0.75, PAPER) == 100.0


def test_a_4gb_transfer_on_the_backbone_claims_at_three_quarters() -> None:
    ftt = FOUR_GB / MB / BACKBONE  # 320 s
    assert first_claim_try(1000.0, ftt, 0.75, PAPER) == 1240.0
    assert claim_schedule(1000.0, ftt, 0.25, PAPER)[:3] == (1080.0, 1140.0, 1185.0)


def test_files_already_in_place_give_one_try_at_placement() -> None:
    assert claim_schedule(500.0, 0.0, 0.75, PAPER) == (500.0,)


def test_l_drops_by_the_fixed_fraction_down_to_its_bound() -> None:
    values = [PAPER.L]
    for _ in range(6):
        values.append(lowered_L(values[-1], PAPER))
    assert values == [0.75, 0.625, 0.5, 0.375, 0.25, 0.25, 0.25]


# -- placement queues (Sec. 3.1) --------------------------------------------------------------


def test_s_2_scans_the_high_queue_twice_per_low_scan() -> None:
    order = [scan_order([1], [1], PAPER, k) for k in range(6)]
    assert order == [Priority.HIGH, Priority.HIGH, Priority.LOW] * 2
    three = CoAllocationParams(S=3)
    assert [scan_order([1], [1], three, k) for k in range(4)] == [
        Priority.HIGH,
        Priority.HIGH,
        Priority.HIGH,
        Priority.LOW,
    ]


def test_an_empty_queue_due_gives_its_scan_to_the_other() -> None:
    assert scan_order([], [1], PAPER, 0) is Priority.LOW
    assert scan_order([1], [], PAPER, 2) is Priority.HIGH
    assert scan_order([], [], PAPER, 0) is None


def test_scan_goes_head_to_tail_on_a_snapshot_updated_as_jobs_are_placed() -> None:
    # No input files: CF places as WF (the most idle first).
    queue = [
        QueuedJob(request("A", 24, 24, file=False)),
        QueuedJob(request("B", 24, 24, file=False)),
        QueuedJob(request("C", 9, 9, file=False)),
    ]
    result = scan_placement_queue(queue, clusters(a=48, b=30), PlacementPolicy.CF, PAPER)
    assert [job.name for job, _ in result.placed] == ["A", "C"]
    assert [(c.size, c.site) for c in result.placed[0][1].components] == [(24, "a"), (24, "b")]
    assert [(c.size, c.site) for c in result.placed[1][1].components] == [(9, "a"), (9, "a")]
    assert [job.name for job in result.waiting] == ["B"]
    assert [(c.site, c.idle_processors) for c in result.clusters] == [("a", 6), ("b", 6)]
    assert result.tries == 3
    assert all(
        job.placement_tries == 1 for job in (*result.waiting, *(j for j, _ in result.placed))
    )
    assert result.reasons[0].startswith("scanned 3 jobs on 2 clusters with CF: 2 placed, 1 wait")


def test_a_scan_takes_placed_processors_from_the_free_count_of_a_live_snapshot() -> None:
    # a: 48 reported idle, 8 ours in flight, 10 others queued = 30 free.
    live = [SiteSnapshot("a", 64, 48, in_flight_processors=8, external_pending_processors=10)]
    result = scan_placement_queue(
        [QueuedJob(request("A", 12, 12, file=False))], live, PlacementPolicy.CF, PAPER
    )
    (after,) = result.clusters
    assert (after.idle_processors, after.free_processors) == (24, 6)
    assert (after.in_flight_processors, after.external_pending_processors) == (8, 10)


def test_cf_places_components_where_their_file_is() -> None:
    queue = [QueuedJob(request("J", 16, 16, 16), replicas("J", "b"))]
    result = scan_placement_queue(queue, clusters(a=64, b=40), bandwidth=backbone)
    placement = result.placed[0][1]
    assert [(c.site, c.transfer_s) for c in placement.components] == [
        ("b", 0.0),
        ("b", 0.0),
        ("a", 320.0),
    ]
    assert placement.file_transfer_s == 320.0


def test_a_job_fails_once_its_placement_tries_exceed_the_limit() -> None:
    params = CoAllocationParams(placement_try_limit=2)
    queue = [
        QueuedJob(request("old", 99, file=False), placement_tries=2),
        QueuedJob(request("new", 99, file=False), placement_tries=1),
    ]
    result = scan_placement_queue(queue, clusters(a=10), PlacementPolicy.CF, params)
    assert [j.name for j in result.failed] == ["old"]
    assert [(j.name, j.placement_tries) for j in result.waiting] == [("new", 2)]
    assert "old: 3 placement tries > 2" in result.reasons


def _naive_scan(
    queue: Sequence[QueuedJob], snapshot: Sequence[SiteSnapshot]
) -> tuple[list[str], list[int]]:
    idle = {c.site: c.idle_processors for c in snapshot}
    placed = []
    for job in queue:
        now = [SiteSnapshot(c.site, c.total_processors, idle[c.site]) for c in snapshot]
        decision = place(
            job.request, now, PlacementPolicy.CF, replicas=job.replicas, bandwidth=backbone
        )
        if decision.outcome is Outcome.FIT:
            placed.append(job.name)
            for component in decision.components:
                idle[component.site] -= component.size
    return placed, [idle[c.site] for c in snapshot]


@settings(max_examples=60, deadline=None)
@given(
    idle=st.lists(st.integers(0, 64), min_size=1, max_size=6),
    shapes=st.lists(
        st.tuples(st.lists(st.integers(1, 30), min_size=1, max_size=5), st.integers(0, 5)),
        max_size=25,
    ),
)
def test_the_scan_skips_only_jobs_the_policy_would_not_place(
    idle: list[int], shapes: list[tuple[list[int], int]]
) -> None:
    snapshot = [SiteSnapshot(f"c{i}", 64, n) for i, n in enumerate(idle)]
    queue = [
        QueuedJob(request(f"j{k}", *sizes), replicas(f"j{k}", f"c{where % len(idle)}"))
        for k, (sizes, where) in enumerate(shapes)
    ]
    result = scan_placement_queue(queue, snapshot, bandwidth=backbone)
    placed, left = _naive_scan(queue, snapshot)
    assert [job.name for job, _ in result.placed] == placed
    assert [c.idle_processors for c in result.clusters] == left


# -- the Incremental Claiming Policy (Sec. 3.3) ----------------------------------------------


def test_all_components_claimable_start_and_complete() -> None:
    job = claiming("J", [(16, "a"), (16, "b")])
    decision = claim_decision(job, clusters(a=20, b=16), 750.0, PAPER)
    assert decision.outcome is ClaimOutcome.COMPLETE
    assert [(c.index, c.site) for c in decision.start] == [(0, "a"), (1, "b")]
    assert decision.fraction == 1.0 and decision.claim_tries == 1
    assert "component 1: site b: 16 idle >= 16 needed, claimed" in decision.reasons


def test_t_0_starts_what_it_can_and_retries_at_the_next_jct() -> None:
    job = claiming("J", [(16, "a"), (16, "b"), (16, "b")], priority=Priority.LOW)
    decision = claim_decision(job, clusters(a=16, b=20, c=0), 750.0, PAPER)
    assert decision.outcome is ClaimOutcome.RETRY
    assert [c.index for c in decision.start] == [0, 1]
    assert decision.fraction == pytest.approx(2 / 3)
    assert decision.next_claim_s == 750.0 + 0.75 * 250.0
    assert "component 2: site b: 4 idle < 16 needed" in decision.reasons


def test_components_started_before_count_towards_f() -> None:
    job = claiming("J", [(16, "a"), (16, "b")], started=[0], tries=1, priority=Priority.LOW)
    decision = claim_decision(job, clusters(a=0, b=16), 900.0, PAPER)
    assert decision.outcome is ClaimOutcome.COMPLETE
    assert [c.index for c in decision.start] == [1]
    assert decision.claim_tries == 2


@pytest.mark.parametrize("T", [0.5, 1.0])
def test_f_below_t_starts_nothing(T: float) -> None:
    job = claiming("J", [(16, "a"), (16, "b"), (16, "b")], priority=Priority.LOW)
    # Only component 0 fits: F = 1/3.
    decision = claim_decision(job, clusters(a=16, b=4), 750.0, CoAllocationParams(T=T))
    assert decision.outcome is ClaimOutcome.RETRY
    assert decision.start == ()
    assert any("nothing starts" in reason for reason in decision.reasons), decision.reasons


@pytest.mark.parametrize("T", [0.3, 1 / 3])
def test_f_at_or_above_t_starts_the_components_that_fit(T: float) -> None:
    job = claiming("J", [(16, "a"), (16, "b"), (16, "b")], priority=Priority.LOW)
    # Only component 0 fits: F = 1/3 >= T, so it starts and the rest wait for a retry.
    decision = claim_decision(job, clusters(a=16, b=4), 750.0, CoAllocationParams(T=T))
    assert decision.outcome is ClaimOutcome.RETRY
    assert [(c.index, c.site) for c in decision.start] == [(0, "a")]


def test_re_placement_whose_file_arrives_before_the_jst_is_taken() -> None:
    # Component 1's site b is full; c has room and the file (at a) reaches c in 320 s.
    job = claiming("J", [(16, "a"), (16, "b")], jst=1000.0, priority=Priority.LOW)
    decision = claim_decision(job, clusters(a=16, b=0, c=32), 600.0, PAPER, bandwidth=backbone)
    assert decision.outcome is ClaimOutcome.COMPLETE
    assert decision.replaced == (1,)
    moved = decision.start[1]
    assert (moved.index, moved.site, moved.file_site, moved.transfer_s) == (1, "c", "a", 320.0)


def test_re_placement_whose_file_would_arrive_after_the_jst_is_refused() -> None:
    job = claiming("J", [(16, "a"), (16, "b")], jst=1000.0, priority=Priority.LOW)
    decision = claim_decision(job, clusters(a=16, b=0, c=32), 750.0, PAPER, bandwidth=backbone)
    assert decision.outcome is ClaimOutcome.RETRY
    assert decision.replaced == ()
    assert [c.index for c in decision.start] == [0]
    assert any("arrive at 1070.0 s > JST 1000.0 s" in r for r in decision.reasons)


def test_re_placement_to_a_site_holding_the_file_costs_no_transfer() -> None:
    job = claiming("J", [(16, "b")], jst=1000.0, files=("c",), priority=Priority.LOW)
    decision = claim_decision(job, clusters(b=0, c=16), 999.5, PAPER, bandwidth=backbone)
    assert decision.outcome is ClaimOutcome.COMPLETE
    assert (decision.start[0].site, decision.start[0].transfer_s) == ("c", 0.0)


def test_a_component_on_an_unusable_site_is_re_placed() -> None:
    # Site b is missing from the snapshot: it was marked unusable.
    job = claiming("J", [(16, "a"), (16, "b")], priority=Priority.LOW)
    decision = claim_decision(job, clusters(a=32), 500.0, PAPER, bandwidth=backbone)
    assert "component 1: site b is not usable" in decision.reasons
    assert [(c.index, c.site) for c in decision.start] == [(0, "a"), (1, "a")]


LOW_HOLDERS = (
    RunningLowJob("early", 100.0, (("a", 8),)),
    RunningLowJob("latest", 300.0, (("a", 8), ("b", 4))),
    RunningLowJob("middle", 200.0, (("a", 8),)),
)


def test_high_priority_preempts_low_jobs_latest_jst_first() -> None:
    job = claiming("H", [(20, "a")], jst=1000.0)
    snapshot = clusters(a=4, b=0)
    decision = claim_decision(job, snapshot, 990.0, PAPER, LOW_HOLDERS, bandwidth=backbone)
    assert decision.outcome is ClaimOutcome.COMPLETE
    assert decision.preempt == ("latest", "middle")  # 4 + 8 + 8 >= 20; "early" is spared
    assert [(c.index, c.site) for c in decision.start] == [(0, "a")]


def test_processors_freed_by_a_preemption_serve_later_components_in_place() -> None:
    # Preempting "latest" for component 0 on a also frees its 4 processors on b, where
    # component 1 then starts without moving (a re-placement would not beat the JST).
    job = claiming("H", [(12, "a"), (4, "b")], jst=1000.0)
    snapshot = clusters(a=4, b=0)
    decision = claim_decision(job, snapshot, 990.0, PAPER, LOW_HOLDERS[1:2], bandwidth=backbone)
    assert decision.outcome is ClaimOutcome.COMPLETE
    assert decision.preempt == ("latest",)
    assert [(c.index, c.site) for c in decision.start] == [(0, "a"), (1, "b")]
    assert decision.replaced == ()
    assert "component 1: site b: 4 idle after preemption >= 4 needed, claimed" in decision.reasons


def test_no_preemption_when_idle_plus_low_processors_fall_short() -> None:
    job = claiming("H", [(40, "a")], jst=1000.0)
    decision = claim_decision(job, clusters(a=4), 990.0, PAPER, LOW_HOLDERS, bandwidth=backbone)
    assert decision.preempt == ()
    assert any("4 idle + 24 held by low-priority jobs < 40 needed" in r for r in decision.reasons)


def test_low_priority_jobs_never_preempt() -> None:
    job = claiming("L", [(20, "a")], jst=1000.0, priority=Priority.LOW)
    decision = claim_decision(job, clusters(a=4), 990.0, PAPER, LOW_HOLDERS, bandwidth=backbone)
    assert decision.preempt == () and decision.start == ()


def test_at_the_jst_without_all_components_the_job_aborts_and_l_drops() -> None:
    job = claiming("J", [(16, "a"), (16, "b")], jst=1000.0, started=[0], L=0.5)
    decision = claim_decision(job, clusters(a=0, b=8), 1000.0, PAPER, bandwidth=backbone)
    assert decision.outcome is ClaimOutcome.ABORT
    assert decision.L == 0.375
    assert decision.start == () and decision.preempt == () and decision.next_claim_s is None
    assert "back to the placement queue" in decision.reasons[-1]


def test_the_claim_try_limit_fails_the_job() -> None:
    params = CoAllocationParams(claim_try_limit=3)
    job = claiming("J", [(16, "a")], tries=3, priority=Priority.LOW)
    decision = claim_decision(job, clusters(a=0), 800.0, params)
    assert decision.outcome is ClaimOutcome.FAILED
    assert decision.claim_tries == 4
    # A try that succeeds is never turned into a failure.
    assert claim_decision(job, clusters(a=16), 800.0, params).outcome is ClaimOutcome.COMPLETE


def test_outcomes_are_ordered_from_worst_to_best() -> None:
    assert ClaimOutcome.FAILED < ClaimOutcome.ABORT < ClaimOutcome.RETRY < ClaimOutcome.COMPLETE
    assert FailureOutcome.SITE_UNUSABLE < FailureOutcome.REQUEUED


# -- fault tolerance (Sec. 3.4) -----------------------------------------------------------------


def test_a_component_failure_requeues_the_whole_job_in_its_priority_queue() -> None:
    low = request("L", 16, 16, priority=Priority.LOW)
    decision = on_component_failure(low, 1, SiteHealth("b"), PAPER)
    assert decision.outcome is FailureOutcome.REQUEUED
    assert decision.queue is Priority.LOW
    assert decision.site == SiteHealth("b", 1, True)
    assert "abort the whole job" in decision.reasons[0]


def test_a_site_is_unusable_once_consecutive_errors_reach_the_threshold() -> None:
    health = SiteHealth("b")
    outcomes = []
    for _ in range(4):
        decision = on_component_failure(request("J", 8), 0, health, PAPER)
        health = decision.site
        outcomes.append(decision.outcome)
    assert outcomes == [
        FailureOutcome.REQUEUED,
        FailureOutcome.REQUEUED,
        FailureOutcome.SITE_UNUSABLE,  # the third consecutive error (threshold 3)
        FailureOutcome.REQUEUED,  # already unusable: nothing new
    ]
    assert health == SiteHealth("b", 4, False)


def test_a_success_breaks_the_run_of_errors_but_does_not_restore_a_site() -> None:
    health = record_site_error(record_site_error(SiteHealth("b"), PAPER), PAPER)
    health = record_site_success(health)
    assert health == SiteHealth("b", 0, True)
    assert record_site_error(health, PAPER).usable
    dead = SiteHealth("c", 3, False)
    assert record_site_success(dead) == SiteHealth("c", 0, False)


def test_re_placement_of_a_chunked_file_moves_only_the_components_share() -> None:
    # Two 16-processor components reading halves of a 4 GB file: the moved component's
    # transfer is 2 GB (160 s), not the whole file (320 s), so it arrives by the JST.
    job = claiming("J", [(16, "a"), (16, "b")], jst=1000.0, priority=Priority.LOW)
    assert job.request.input_file is not None
    name = job.request.input_file.logical_name
    chunked = replace(job.request, input_file=InputFile(name, FileDelivery.CHUNKED))
    job = replace(job, request=chunked)
    decision = claim_decision(job, clusters(a=16, b=0, c=32), 750.0, PAPER, bandwidth=backbone)
    assert decision.outcome is ClaimOutcome.COMPLETE
    moved = decision.start[1]
    assert (moved.site, moved.file_site, moved.transfer_s) == ("c", "a", 160.0)
