"""KOALA's scheduling decisions: placement queues, the claiming queue and the Incremental
Claiming Policy (ICP), with its fault tolerance.

Seed: Mohamed, Epema, "Experiences with the KOALA co-allocating scheduler in
multiclusters", CCGrid 2005 (``docs/papers.md``).

* Placement queues (Sec. 3.1): a job that does not fit when submitted waits in the high-
  or low-priority placement queue. Every scan interval one queue is scanned head to tail;
  the high queue is scanned ``S`` times for every scan of the low one
  (:func:`scan_order`, :func:`scan_placement_queue`). A job whose placement tries exceed a
  threshold fails.
* Claiming queue (Sec. 3.2, Fig. 1): a placed job starts its file transfers at once, its
  Job Start Time is ``JST = JPT + FTT`` and its claiming tries happen at
  ``JCT_0 = JPT + L * FTT`` and ``JCT_(n+1) = JCT_n + L * (JST - JCT_n)``.
* ICP (Sec. 3.3): :func:`claim_decision` starts what fits, re-places with Close-to-Files
  the components whose sites lack room (when the new transfer still ends before the JST),
  lets high-priority components preempt low-priority jobs (latest JST first), and at the
  JST without every component started aborts the started ones, lowers ``L`` and sends
  the job back to its placement queue.
* Fault tolerance (Sec. 3.4): any component failure aborts the whole job and returns it to
  its placement queue; a site whose consecutive errors reach a threshold is unusable.

Pure: no I/O, no clock, no randomness. Placement and re-placement are always
:mod:`gridcore.policies.placement`; this module only decides when and on what snapshot.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence, Sized
from dataclasses import dataclass

from gridcore.errors import ConfigError
from gridcore.model import (
    CoAllocationRequest,
    Component,
    Outcome,
    PlacedComponent,
    Placement,
    Priority,
    Replica,
    RequestKind,
    SiteHealth,
    SiteSnapshot,
    component_job_name,
)
from gridcore.policies.placement import PlacementPolicy, close_to_files, place
from gridcore.policies.transfer import Bandwidth, best_replica


@dataclass(frozen=True)
class CoAllocationParams:
    """KOALA's parameters; the defaults are the paper's experiment (Sec. 4).

    ``L``: the fraction of the file transfer time after which claiming starts (Sec. 3.2);
    it drops by ``L_decrement`` (not below ``L_min``) each time claiming reaches the JST
    without success. ``T``: the lower bound of the fraction ``F`` of claimable components
    (Sec. 3.3; 0 claims whatever it can, 1 makes claiming atomic). ``S``: high-queue scans
    per low-queue scan (Sec. 3.1). Try limits and the queue cap are off (``None``) as in
    Sec. 4; the experiment caps the placement queues at 100 (Sec. 4.2).
    ``unusable_after_errors``: consecutive errors that make a site unusable (Sec. 3.4; the
    paper gives no value). ``scan_interval_s``: time between scans, 4 min in Sec. 4.
    ``claim_resolution_s`` (not in the paper): ``JCT_n`` only approaches the JST, so once
    the next step would leave less than this before the JST the next try is at the JST.
    """

    L: float = 0.75
    L_decrement: float = 0.125
    L_min: float = 0.25
    T: float = 0.0
    S: int = 2
    placement_try_limit: int | None = None
    claim_try_limit: int | None = None
    queue_cap: int | None = None
    unusable_after_errors: int = 3
    scan_interval_s: float = 240.0
    claim_resolution_s: float = 1.0

    def __post_init__(self) -> None:
        checks = (
            ("L", 0.0 < self.L < 1.0, "in (0, 1) (Sec. 3.2)"),
            ("L_min", 0.0 < self.L_min <= self.L, f"in (0, L={self.L}]"),
            ("L_decrement", 0.0 <= self.L_decrement < 1.0, "in [0, 1)"),
            ("T", 0.0 <= self.T <= 1.0, "in [0, 1] (Sec. 3.3)"),
            ("S", self.S >= 2, "an integer > 1 (Sec. 3.1)"),
            ("placement_try_limit", _limit_ok(self.placement_try_limit, 0), ">= 0 or None"),
            ("claim_try_limit", _limit_ok(self.claim_try_limit, 0), ">= 0 or None"),
            ("queue_cap", _limit_ok(self.queue_cap, 1), ">= 1 or None"),
            ("unusable_after_errors", self.unusable_after_errors >= 1, ">= 1"),
            ("scan_interval_s", self.scan_interval_s > 0.0, "> 0"),
            ("claim_resolution_s", self.claim_resolution_s > 0.0, "> 0"),
        )
        for name, ok, rule in checks:
            if not ok:
                raise ConfigError(
                    f"CoAllocationParams.{name} must be {rule}, got {getattr(self, name)}"
                )


def _limit_ok(limit: int | None, least: int) -> bool:
    return limit is None or limit >= least


# -- the claiming queue's times (Sec. 3.2, Fig. 1) ----------------------------------------


def job_start_time(jpt: float, ftt: float) -> float:
    """``JST = JPT + FTT`` (Sec. 3.2): when the last input file has arrived."""
    return jpt + ftt


def initial_claim_time(jpt: float, ftt: float, L: float) -> float:
    """``JCT_0 = JPT + L * FTT`` (Sec. 3.2)."""
    return jpt + L * ftt


def next_claim_time(jct: float, jst: float, L: float) -> float:
    """``JCT_(n+1) = JCT_n + L * (JST - JCT_n)`` (Sec. 3.2)."""
    return jct + L * (jst - jct)


def first_claim_try(jpt: float, ftt: float, L: float, params: CoAllocationParams) -> float:
    """The time of the first claiming try: ``JCT_0``, or the JST when they are closer than
    ``params.claim_resolution_s``."""
    return _snap_to_jst(initial_claim_time(jpt, ftt, L), job_start_time(jpt, ftt), params)


def next_claim_try(jct: float, jst: float, L: float, params: CoAllocationParams) -> float:
    """The try after the one at ``jct``: ``JCT_(n+1)``, or the JST once the remaining gap
    would be below ``params.claim_resolution_s`` (the try at the JST is the last)."""
    return _snap_to_jst(next_claim_time(jct, jst, L), jst, params)


def claim_schedule(
    jpt: float, ftt: float, L: float, params: CoAllocationParams
) -> tuple[float, ...]:
    """Every claiming try of one placement if none succeeds: ``JCT_0, JCT_1, ..., JST``."""
    jst = job_start_time(jpt, ftt)
    times = [first_claim_try(jpt, ftt, L, params)]
    while times[-1] < jst:
        times.append(next_claim_try(times[-1], jst, L, params))
    return tuple(times)


def lowered_L(L: float, params: CoAllocationParams) -> float:
    """``L`` after claiming reached the JST unsuccessfully: lower by the fixed fraction,
    not below the bound (Sec. 3.2; 0.75 -> 0.625 -> ... -> 0.25 in Sec. 4)."""
    return max(params.L_min, L - params.L_decrement)


def _snap_to_jst(jct: float, jst: float, params: CoAllocationParams) -> float:
    return jst if jst - jct < params.claim_resolution_s else jct


# -- placement queues (Sec. 3.1) ------------------------------------------------------------


def scan_order(
    high: Sized, low: Sized, params: CoAllocationParams, scan_index: int
) -> Priority | None:
    """Which placement queue scan number ``scan_index`` (from 0) scans.

    The cycle is ``S`` scans of the high queue, then one of the low queue (Sec. 3.1). When
    the queue due is empty the other one is scanned instead (the paper does not say; an
    empty scan would change nothing but the wait of the other queue); ``None`` when both
    are empty.
    """
    due = Priority.HIGH if scan_index % (params.S + 1) < params.S else Priority.LOW
    sizes = {Priority.HIGH: len(high), Priority.LOW: len(low)}
    if sizes[due]:
        return due
    other = Priority.LOW if due is Priority.HIGH else Priority.HIGH
    return other if sizes[other] else None


@dataclass(frozen=True)
class QueuedJob:
    """A job waiting in a placement queue, with its input file's replicas and the number
    of placement tries made so far (Sec. 3.1)."""

    request: CoAllocationRequest
    replicas: tuple[Replica, ...] = ()
    placement_tries: int = 0

    @property
    def name(self) -> str:
        return self.request.name


@dataclass(frozen=True)
class ScanResult:
    """One scan of a placement queue, in queue order.

    ``placed``: the jobs that fit, each with its placement (their tries include this one).
    ``waiting``: the jobs that stay queued, tries counted. ``failed``: jobs whose tries now
    exceed the limit (their submission fails). ``clusters``: the snapshot after the
    placed jobs took their processors. ``tries``: placement tries made in the scan.
    """

    placed: tuple[tuple[QueuedJob, Placement], ...]
    waiting: tuple[QueuedJob, ...]
    failed: tuple[QueuedJob, ...]
    clusters: tuple[SiteSnapshot, ...]
    tries: int
    reasons: tuple[str, ...]


def scan_placement_queue(
    queue: Sequence[QueuedJob],
    clusters: Sequence[SiteSnapshot],
    policy: PlacementPolicy = PlacementPolicy.CF,
    params: CoAllocationParams | None = None,
    *,
    quota: float | None = None,
    bandwidth: Bandwidth | None = None,
) -> ScanResult:
    """Scan ``queue`` from head to tail, placing every job that fits (Sec. 3.1).

    Each job placed takes its processors from the snapshot the rest of the scan sees (one
    snapshot per scan, updated as it goes). Before calling the placement policy the scan
    checks a necessary condition: for every component size ``c`` of the job, the clusters
    have room for as many components of size >= ``c`` as it has (``sum idle // c``). Idle
    counts only fall during a scan, so this skips, without changing any decision, the
    long tail of jobs that cannot fit once the clusters are full.
    """
    params = params or CoAllocationParams()
    room = _Room(clusters)
    placed: list[tuple[QueuedJob, Placement]] = []
    waiting: list[QueuedJob] = []
    failed: list[QueuedJob] = []
    limit = params.placement_try_limit
    for job in queue:
        tried = QueuedJob(job.request, job.replicas, job.placement_tries + 1)
        placement = room.place(tried, policy, quota, bandwidth)
        if placement is not None:
            placed.append((tried, placement))
        elif limit is not None and tried.placement_tries > limit:
            failed.append(tried)
        else:
            waiting.append(tried)
    reasons = (
        f"scanned {len(queue)} jobs on {len(clusters)} clusters with {policy.value}:"
        f" {len(placed)} placed, {len(waiting)} wait, {len(failed)} failed"
        f" (placement-try limit {limit})",
        *(f"{job.name}: placed on {_sites_of(p)}" for job, p in placed),
        *(f"{job.name}: {job.placement_tries} placement tries > {limit}" for job in failed),
    )
    return ScanResult(
        tuple(placed), tuple(waiting), tuple(failed), room.snapshot(), len(queue), reasons
    )


class _Room:
    """The scan's snapshot, with cached ``sum(idle // size)`` per component size."""

    def __init__(self, clusters: Sequence[SiteSnapshot]) -> None:
        self._clusters = list(clusters)
        self._position = {c.site: i for i, c in enumerate(self._clusters)}
        self._idle_total = sum(max(c.free_processors, 0) for c in self._clusters)
        self._slots: dict[int, int] = {}

    def snapshot(self) -> tuple[SiteSnapshot, ...]:
        return tuple(self._clusters)

    def place(
        self,
        job: QueuedJob,
        policy: PlacementPolicy,
        quota: float | None,
        bandwidth: Bandwidth | None,
    ) -> Placement | None:
        if not self._may_fit(job.request):
            return None
        placement = place(
            job.request, self._clusters, policy, quota, replicas=job.replicas, bandwidth=bandwidth
        )
        if placement.outcome is not Outcome.FIT:
            return None
        for component in placement.components:
            i = self._position[component.site]
            self._clusters[i] = self._clusters[i].take(component.size)
            self._idle_total -= component.size
        self._slots.clear()
        return placement

    def _may_fit(self, request: CoAllocationRequest) -> bool:
        if request.processors > self._idle_total:
            return False
        if request.kind is RequestKind.FLEXIBLE:
            return True
        sizes = sorted((c.size for c in request.components), reverse=True)
        # Components of size >= sizes[k] number k + 1; each needs its own slot of that size.
        return all(
            self._slots_of(size) >= k + 1
            for k, size in enumerate(sizes)
            if k + 1 == len(sizes) or sizes[k + 1] != size
        )

    def _slots_of(self, size: int) -> int:
        slots = self._slots.get(size)
        if slots is None:
            slots = sum(max(c.free_processors, 0) // size for c in self._clusters)
            self._slots[size] = slots
        return slots


def _sites_of(placement: Placement) -> str:
    return ", ".join(f"{c.size}@{c.site}" for c in placement.components)


# -- the Incremental Claiming Policy (Sec. 3.3) ---------------------------------------------


class ClaimOutcome(enum.IntEnum):
    """Ordered: a higher outcome is better for the job."""

    FAILED = 0  # the claim-try limit is exceeded: abort what started; the submission fails
    ABORT = 1  # the JST came without every component started: abort, lower L, re-place
    RETRY = 2  # components still unstarted: try again at ``next_claim_s``
    COMPLETE = 3  # every component started: the job runs at its JST (the barrier)


@dataclass(frozen=True)
class ClaimingJob:
    """A placed job in the claiming queue: its components' current execution and file
    sites, the ones already started, its JST and its ``L``."""

    request: CoAllocationRequest
    components: tuple[PlacedComponent, ...]
    jst: float
    L: float
    started: frozenset[int] = frozenset()
    claim_tries: int = 0
    replicas: tuple[Replica, ...] = ()

    @property
    def name(self) -> str:
        return self.request.name


@dataclass(frozen=True)
class RunningLowJob:
    """A low-priority job holding processors (components started, waiting at the barrier
    or running), as a preemption candidate. ``usage``: processors held per site."""

    name: str
    jst: float
    usage: tuple[tuple[str, int], ...]

    def at(self, site: str) -> int:
        return sum(n for s, n in self.usage if s == site)


@dataclass(frozen=True)
class ClaimDecision:
    """One claiming try. ``start``: components to start now, with their (possibly new)
    execution and file sites; ``replaced``: indices of those re-placed; ``preempt``: low-
    priority jobs to abort first, in order; ``fraction``: ``F``; ``L`` and
    ``claim_tries``: the job's values after this try."""

    job: str
    outcome: ClaimOutcome
    start: tuple[PlacedComponent, ...]
    replaced: tuple[int, ...]
    preempt: tuple[str, ...]
    fraction: float
    next_claim_s: float | None
    L: float
    claim_tries: int
    reasons: tuple[str, ...]


def claim_decision(
    job: ClaimingJob,
    clusters: Sequence[SiteSnapshot],
    now: float,
    params: CoAllocationParams,
    preemptible: Sequence[RunningLowJob] = (),
    *,
    bandwidth: Bandwidth | None = None,
) -> ClaimDecision:
    """One ICP claiming try for ``job`` at ``now`` (Sec. 3.3).

    ``clusters`` holds the usable clusters only; their free processors
    (:attr:`SiteSnapshot.free_processors`) are the papers' idle processors now. A
    component whose site is missing cannot be claimed there. ``preemptible`` lists the
    low-priority jobs holding processors (considered for high-priority jobs only).
    """
    work = _Claim(job, clusters, now, preemptible, bandwidth)
    unstarted = [c for c in job.components if c.index not in job.started]
    blocked = work.claim_fitting(unstarted)
    fraction = (len(job.started) + len(work.starts)) / len(job.components)
    if fraction < params.T:
        work.reasons.append(f"F = {fraction:.2f} < T = {params.T}: nothing starts in this try")
        work.starts.clear()
        return _unfinished(work, params, fraction)
    for component in blocked:
        if work.claim_freed(component) or work.replace(component):
            continue
        if job.request.priority is Priority.HIGH:
            work.preempt_for(component)
    if len(job.started) + len(work.starts) < len(job.components):
        return _unfinished(work, params, fraction)
    work.reasons.append(f"all {len(job.components)} components started; the job runs at the JST")
    return work.decision(ClaimOutcome.COMPLETE, fraction, None, job.L)


class _Claim:
    """The working state of one claiming try: idle processors as components take them."""

    def __init__(
        self,
        job: ClaimingJob,
        clusters: Sequence[SiteSnapshot],
        now: float,
        preemptible: Sequence[RunningLowJob],
        bandwidth: Bandwidth | None,
    ) -> None:
        self.job = job
        self.now = now
        self.clusters = {c.site: c for c in clusters}
        # The processors each site has free now, as components take them and preemptions
        # give them back (the papers' "idle").
        self.free = {site: c.free_processors for site, c in self.clusters.items()}
        # Sec. 3.3: preempt "in descending order of their JST".
        self.candidates = sorted(preemptible, key=lambda r: (-r.jst, r.name))
        self.bandwidth = bandwidth
        self.starts: list[PlacedComponent] = []
        self.replaced: list[int] = []
        self.preempted: list[str] = []
        self.reasons: list[str] = [
            f"claiming try {job.claim_tries + 1} at {now:.1f} s, JST {job.jst:.1f} s,"
            f" L = {job.L}, {len(job.started)}/{len(job.components)} started before"
        ]

    def claim_fitting(self, unstarted: Sequence[PlacedComponent]) -> list[PlacedComponent]:
        """Start every component whose site has room now; return the others."""
        blocked = []
        for component in unstarted:
            idle = self.free.get(component.site)
            if idle is None:
                self.reasons.append(
                    f"component {component.index}: site {component.site} is not usable"
                )
                blocked.append(component)
            elif idle >= component.size:
                self._take(component)
                self.reasons.append(
                    f"component {component.index}: site {component.site}:"
                    f" {idle} idle >= {component.size} needed, claimed"
                )
            else:
                self.reasons.append(
                    f"component {component.index}: site {component.site}:"
                    f" {idle} idle < {component.size} needed"
                )
                blocked.append(component)
        return blocked

    def claim_freed(self, component: PlacedComponent) -> bool:
        """Claim a blocked component at its own site if a preemption in this try has
        since freed enough processors there."""
        idle = self.free.get(component.site)
        if idle is None or idle < component.size:
            return False
        self._take(component)
        self.reasons.append(
            f"component {component.index}: site {component.site}: {idle} idle after"
            f" preemption >= {component.size} needed, claimed"
        )
        return True

    def replace(self, component: PlacedComponent) -> bool:
        """Re-place ``component`` with CF; keep it only if its file arrives by the JST."""
        request = self.job.request
        single = CoAllocationRequest(
            component_job_name(request.name, component.index),
            RequestKind.NON_FIXED,
            (Component(component.size),),
            input_file=request.input_file,
            priority=request.priority,
        )
        placement = close_to_files(
            single, self._snapshot(), replicas=self.job.replicas, bandwidth=self.bandwidth
        )
        if placement.outcome is not Outcome.FIT:
            self.reasons.append(f"component {component.index}: CF re-placement found no room")
            return False
        # The one-component request would price a CHUNKED file as whole: re-estimate the
        # transfer for this component's share of the ORIGINAL request.
        chosen = placement.components[0]
        replica, seconds = best_replica(
            request, component.size, chosen.site, self.job.replicas, self.bandwidth
        )
        file_site = replica.site if replica is not None else None
        new = PlacedComponent(chosen.index, chosen.size, chosen.site, file_site, seconds)
        arrival = self.now + new.transfer_s
        if arrival > self.job.jst:
            self.reasons.append(
                f"component {component.index}: CF re-placement on {new.site} needs"
                f" {new.transfer_s:.0f} s of transfer, the file would arrive at"
                f" {arrival:.1f} s > JST {self.job.jst:.1f} s"
            )
            return False
        moved = PlacedComponent(component.index, new.size, new.site, new.file_site, new.transfer_s)
        self._take(moved)
        self.replaced.append(component.index)
        self.reasons.append(
            f"component {component.index}: re-placed by CF from {component.site} to"
            f" {new.site} (file from {new.file_site}, {new.transfer_s:.0f} s, arrives by the JST)"
        )
        return True

    def preempt_for(self, component: PlacedComponent) -> None:
        """Free room at the component's site by preempting low-priority jobs, latest JST
        first, if idle plus their processors there cover it (Sec. 3.3)."""
        site = component.site
        idle = self.free.get(site)
        if idle is None:
            return
        victims = [r for r in self.candidates if r.name not in self.preempted and r.at(site)]
        low = sum(r.at(site) for r in victims)
        if component.size > idle + low:
            self.reasons.append(
                f"component {component.index}: site {site}: {idle} idle + {low} held by"
                f" low-priority jobs < {component.size} needed, no preemption"
            )
            return
        for victim in victims:
            if self.free[site] >= component.size:
                break
            self.preempted.append(victim.name)
            for held_site, held in victim.usage:
                if held_site in self.free:
                    self.free[held_site] += held
            self.reasons.append(
                f"component {component.index}: preempt low-priority {victim.name}"
                f" (JST {victim.jst:.1f} s, {victim.at(site)} processors on {site})"
            )
        self._take(component)

    def decision(
        self, outcome: ClaimOutcome, fraction: float, next_claim_s: float | None, L: float
    ) -> ClaimDecision:
        keep = outcome >= ClaimOutcome.RETRY
        return ClaimDecision(
            self.job.name,
            outcome,
            tuple(self.starts) if keep else (),
            tuple(self.replaced) if keep else (),
            tuple(self.preempted) if keep else (),
            fraction,
            next_claim_s,
            L,
            self.job.claim_tries + 1,
            tuple(self.reasons),
        )

    def _take(self, component: PlacedComponent) -> None:
        self.free[component.site] -= component.size
        self.starts.append(component)

    def _snapshot(self) -> list[SiteSnapshot]:
        return [c.take(c.free_processors - self.free[site]) for site, c in self.clusters.items()]


def _unfinished(work: _Claim, params: CoAllocationParams, fraction: float) -> ClaimDecision:
    """A try that leaves components unstarted: retry, abort at the JST, or fail."""
    job = work.job
    limit = params.claim_try_limit
    if limit is not None and job.claim_tries + 1 > limit:
        work.reasons.append(f"{job.claim_tries + 1} claiming tries > limit {limit}: job fails")
        return work.decision(ClaimOutcome.FAILED, fraction, None, job.L)
    if work.now >= job.jst:
        L = lowered_L(job.L, params)
        work.reasons.append(
            f"JST reached with components unstarted: abort the started ones, L {job.L} -> {L},"
            " back to the placement queue"
        )
        return work.decision(ClaimOutcome.ABORT, fraction, None, L)
    at = next_claim_try(work.now, job.jst, job.L, params)
    work.reasons.append(f"next claiming try at {at:.1f} s")
    return work.decision(ClaimOutcome.RETRY, fraction, at, job.L)


# -- fault tolerance (Sec. 3.4) -------------------------------------------------------------


def record_site_error(health: SiteHealth, params: CoAllocationParams) -> SiteHealth:
    """One more consecutive error; at the threshold the site becomes unusable (Sec. 3.4)."""
    errors = health.consecutive_errors + 1
    return SiteHealth(health.site, errors, health.usable and errors < params.unusable_after_errors)


def record_site_success(health: SiteHealth) -> SiteHealth:
    """A component ended without an error from the site (it completed, or KOALA aborted
    it): the site's errors are no longer consecutive. A site marked unusable stays so
    (Sec. 5.1: the cluster "was removed for selection")."""
    return SiteHealth(health.site, 0, health.usable)


class FailureOutcome(enum.IntEnum):
    """Ordered: a higher outcome is better for the grid."""

    SITE_UNUSABLE = 0  # the job is requeued and its failing site is now unusable
    REQUEUED = 1  # the job is requeued; the site stays usable


@dataclass(frozen=True)
class FailureDecision:
    """What a component failure does: the whole job is aborted and returns to the
    placement queue of its priority; the site's error count grows."""

    job: str
    outcome: FailureOutcome
    queue: Priority
    site: SiteHealth
    reasons: tuple[str, ...]


def on_component_failure(
    request: CoAllocationRequest,
    component: int,
    health: SiteHealth,
    params: CoAllocationParams,
) -> FailureDecision:
    """A site's resource manager reported a failure of ``component`` (Sec. 3.4, 5.2)."""
    after = record_site_error(health, params)
    reasons = [
        f"component {component} of {request.name} failed on {health.site}:"
        f" abort the whole job, back to the {request.priority.value}-priority placement queue",
        f"site {health.site}: {after.consecutive_errors} consecutive errors"
        f" (unusable at {params.unusable_after_errors})",
    ]
    outcome = FailureOutcome.REQUEUED
    if health.usable and not after.usable:
        outcome = FailureOutcome.SITE_UNUSABLE
        reasons.append(f"site {health.site} is now unusable")
    return FailureDecision(request.name, outcome, request.priority, after, tuple(reasons))
