"""A multicluster model of KOALA: placement queues, the claiming queue and ICP, with
unreliable sites and other users' load.

Seed: Mohamed, Epema, CCGrid 2005 (``docs/papers.md``).

Every decision is one of :mod:`gridcore.policies.claiming` (which places and re-places
with :mod:`gridcore.policies.placement`); the model only supplies time, processors,
failures and other users:

* **Submission** (Sec. 3.1, 4.2): an arriving job is submitted unless the placement queues
  already hold ``params.queue_cap`` jobs; then it waits, in arrival order, until a scan
  brings them below the cap. A submitted job gets one placement try at once; if it does
  not fit it joins the tail of its priority's placement queue.
* **Scans** (Sec. 3.1): every ``params.scan_interval_s`` from time 0 one queue is scanned,
  chosen by :func:`~gridcore.policies.claiming.scan_order`, on one snapshot of the usable
  clusters' idle processors. Placed jobs hold nothing until claimed (no reservations,
  Sec. 2.7), so later placements may count on the same idle processors.
* **Claiming** (Sec. 3.2, 3.3): a placed job's transfers start at its placement and take
  exactly their estimates, so every file is in place at the JST. Claiming tries run at
  ``JCT_0, JCT_1, ...`` and the JST; each is one
  :func:`~gridcore.policies.claiming.claim_decision` on the idle processors at that
  instant, and the model applies it: preempted low-priority jobs are aborted and return to
  the low-priority queue, started components hold their processors. A job whose
  components are all started runs at its JST (the barrier of Sec. 3.3: components started
  earlier hold their processors idle until then) for its runtime.
* **Failures** (Sec. 3.4, 5.2): each component start at a site fails with that site's
  probability, at a time drawn uniformly between the start and the job's planned end, so
  failures hit both claiming and execution. The failure aborts the whole job, which
  returns to its placement queue; the site's consecutive errors grow and at the
  threshold the site leaves every snapshot for good. A component that ends without an
  error from its site (it completed, or KOALA aborted it after another component's
  failure, a preemption or the JST) breaks the run: those errors are no longer
  consecutive.
* **Other users** (Sec. 4.2): background jobs queue FIFO at one site and start when its
  idle processors allow; KOALA's claims see only idle processors (a claim never waits).

At equal times: releases of processors first, then failures, other users' arrivals,
barrier releases, claiming tries (claiming-queue order), scans and submissions.
"""

from __future__ import annotations

import enum
import itertools
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from gridcore.errors import ConfigError
from gridcore.model import (
    CoAllocationRequest,
    Component,
    InputFile,
    PlacedComponent,
    Placement,
    Priority,
    Replica,
    RequestKind,
    SiteHealth,
    SiteSnapshot,
    component_job_name,
)
from gridcore.policies.claiming import (
    ClaimDecision,
    ClaimingJob,
    ClaimOutcome,
    CoAllocationParams,
    FailureOutcome,
    QueuedJob,
    RunningLowJob,
    claim_decision,
    first_claim_try,
    on_component_failure,
    record_site_success,
    scan_order,
    scan_placement_queue,
)
from gridcore.policies.placement import PlacementPolicy
from gridcore.policies.transfer import Bandwidth
from gridcore.sim.cluster import (
    Admission,
    ClusterModel,
    LoadStreams,
    OtherUsers,
    Owner,
    QueuePolicy,
)
from gridcore.sim.log_load import OtherUsersLog, start_log
from gridcore.sim.workload import (
    BackgroundLoad,
    LocalJob,
    SimSite,
    TraceEvent,
    validate_loads,
    validate_local_jobs,
    validate_sites,
    validate_unique,
)

_RELEASE = 0
_FAIL = 1
_OTHERS = 2
_RUN = 3
_CLAIM = 4
_SCAN = 5
_SUBMIT = 6

HORIZON_S = 30 * 86_400.0
"""The model stops here even with jobs unfinished (every site unusable, say)."""


@dataclass(frozen=True)
class KoalaJob:
    """One co-allocated job: component sizes, runtime, and its single input file (Sec. 2.3)
    of ``file_bytes`` with replicas at ``file_sites`` (none: no input file)."""

    name: str
    arrival_s: float
    priority: Priority
    components: tuple[int, ...]
    runtime_s: float
    file_bytes: int = 0
    file_sites: tuple[str, ...] = ()

    @property
    def processors(self) -> int:
        return sum(self.components)


@dataclass(frozen=True)
class Attempt:
    """One pass of a job through placement (Fig. 1): queued (A) at ``queued_s``, placed
    (B) at ``placed_s`` with start time ``jst`` (D); ``ended`` says how it ended."""

    queued_s: float
    placed_s: float | None
    jst: float | None
    ended: str


class SimJobState(enum.StrEnum):
    """A simulated co-allocated job's place in KOALA's queues (Sec. 2.5, 3)."""

    ARRIVING = "arriving"
    HELD = "held"  # waits for the placement queue's room
    QUEUED = "queued"  # in its placement queue
    CLAIMING = "claiming"
    READY = "ready"  # every component claimed, waiting for the start
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class JobOutcome(enum.StrEnum):
    """How a simulated job ended: completed, failed (a try limit) or unfinished (the
    horizon came first)."""

    COMPLETED = "completed"
    FAILED = "failed"
    UNFINISHED = "unfinished"


_OUTCOME = {SimJobState.DONE: JobOutcome.COMPLETED, SimJobState.FAILED: JobOutcome.FAILED}


@dataclass(frozen=True)
class KoalaJobRecord:
    """What happened to one job. ``outcome``: completed, failed (a try limit) or
    unfinished (the horizon came first). ``runs``: passes in which components started."""

    name: str
    priority: Priority
    processors: int
    components: int
    arrival_s: float
    submit_s: float | None
    attempts: tuple[Attempt, ...]
    start_s: float | None
    end_s: float | None
    outcome: JobOutcome
    runs: int
    failures: int
    preemptions: int
    jst_aborts: int
    claim_tries: int
    placement_tries: int

    @property
    def placement_s(self) -> float:
        """Time spent being placed: A to B of Fig. 1, summed over every pass through the
        placement queue (re-placements after failures lengthen it, Sec. 5.3)."""
        return sum(a.placed_s - a.queued_s for a in self.attempts if a.placed_s is not None)

    @property
    def original_jst(self) -> float | None:
        placed = [a.jst for a in self.attempts if a.jst is not None]
        return placed[0] if placed else None

    @property
    def start_delay_s(self) -> float | None:
        """Sec. 3.2: "the difference between the last JST where the job execution succeeds
        and the original JST" (D of the successful pass minus D of the first)."""
        if self.start_s is None or self.original_jst is None:
            return None
        return self.start_s - self.original_jst

    @property
    def wait_s(self) -> float | None:
        """Submission (A of the first pass) to the start of execution."""
        if self.start_s is None or self.submit_s is None:
            return None
        return self.start_s - self.submit_s


@dataclass(frozen=True)
class KoalaRun:
    """One simulated run. ``runs``: passes in which components were started;
    ``failed_runs``: those a component failure ended (Sec. 5.2, Fig. 3).
    ``peak_used``: the most processors in use at once per site (ours + others');
    ``busy_s``: per site the processor-seconds used by KOALA's jobs and by others' until
    ``end_s`` (Fig. 2); ``policy``: the placement policy the run used."""

    jobs: tuple[KoalaJobRecord, ...]
    trace: tuple[TraceEvent, ...]
    component_starts: int
    component_failures: int
    runs: int
    failed_runs: int
    preemptions: int
    jst_aborts: int
    scans: int
    unusable: Mapping[str, float]
    peak_used: Mapping[str, int]
    background_jobs: int
    busy_s: Mapping[str, tuple[float, float]]
    end_s: float
    policy: PlacementPolicy

    @property
    def completed(self) -> int:
        return sum(1 for j in self.jobs if j.outcome is JobOutcome.COMPLETED)

    @property
    def failure_rate(self) -> float:
        """The fraction of runs ended by a component failure (Fig. 3's percentage)."""
        return self.failed_runs / self.runs if self.runs else 0.0

    def by_name(self, name: str) -> KoalaJobRecord:
        for job in self.jobs:
            if job.name == name:
                return job
        raise KeyError(name)


def simulate_koala(
    sites: Sequence[SimSite],
    jobs: Sequence[KoalaJob],
    params: CoAllocationParams | None = None,
    *,
    bandwidth: Bandwidth,
    background: Sequence[LocalJob] = (),
    background_load: Sequence[BackgroundLoad] = (),
    policy: PlacementPolicy = PlacementPolicy.CF,
    log: OtherUsersLog | None = None,
    seed: int = 0,
    horizon_s: float = HORIZON_S,
) -> KoalaRun:
    """Run ``jobs`` through KOALA on ``sites`` until all are done or ``horizon_s``.

    ``bandwidth`` gives MB/s between sites (the placement policies' transfer estimates,
    which the model takes as exact). Failures and generated background load draw from
    ``random.Random`` instances seeded by ``seed``: the same inputs give the same run.
    ``log``: other users' jobs from a real log besides them, submitted while KOALA's jobs
    are unfinished; the sites' queues then backfill as EASY (components are claims of
    unknown end to it) and the run starts at ``log.start_s``.
    """
    params = params or CoAllocationParams()
    _validate(sites, jobs, background, background_load)
    model = _KoalaModel(sites, params, bandwidth, policy, seed, log)
    return model.run(jobs, background, background_load, horizon_s)


def _validate(
    sites: Sequence[SimSite],
    jobs: Sequence[KoalaJob],
    background: Sequence[LocalJob],
    loads: Sequence[BackgroundLoad],
) -> None:
    validate_sites(sites)
    validate_unique(j.name for j in jobs)
    for job in jobs:
        _validate_job(job, {s.name for s in sites})
    validate_local_jobs(background, sites)
    validate_loads(loads, sites)


def _validate_job(job: KoalaJob, sites: set[str]) -> None:
    if job.arrival_s < 0 or job.runtime_s < 0 or not job.components:
        raise ConfigError(f"job {job.name}: needs arrival_s, runtime_s >= 0 and components")
    if min(job.components) < 1:
        raise ConfigError(f"job {job.name}: component sizes must be >= 1")
    unknown = [s for s in job.file_sites if s not in sites]
    if unknown or (job.file_bytes > 0) != bool(job.file_sites):
        raise ConfigError(
            f"job {job.name}: an input file needs file_bytes > 0 and known file_sites"
            f" (unknown: {unknown})"
        )


@dataclass
class _Job:
    spec: KoalaJob
    request: CoAllocationRequest
    replicas: tuple[Replica, ...]
    L: float
    state: SimJobState = SimJobState.ARRIVING
    token: int = 0
    submit_s: float | None = None
    queued_s: float = 0.0
    placed_s: float | None = None
    jst: float = 0.0
    components: dict[int, PlacedComponent] = field(default_factory=dict)
    started: dict[int, PlacedComponent] = field(default_factory=dict)
    ran: bool = False
    runs: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    start_s: float | None = None
    end_s: float | None = None
    failures: int = 0
    preemptions: int = 0
    jst_aborts: int = 0
    claim_tries: int = 0
    placement_tries: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    def record(self) -> KoalaJobRecord:
        outcome = _OUTCOME.get(self.state, JobOutcome.UNFINISHED)
        return KoalaJobRecord(
            self.name,
            self.spec.priority,
            self.spec.processors,
            len(self.spec.components),
            self.spec.arrival_s,
            self.submit_s,
            tuple(self.attempts),
            self.start_s,
            self.end_s,
            outcome,
            self.runs,
            self.failures,
            self.preemptions,
            self.jst_aborts,
            self.claim_tries,
            self.placement_tries,
        )


class _KoalaModel(ClusterModel):
    def __init__(
        self,
        sites: Sequence[SimSite],
        params: CoAllocationParams,
        bandwidth: Bandwidth,
        policy: PlacementPolicy,
        seed: int,
        log: OtherUsersLog | None = None,
    ) -> None:
        if log is None:
            super().__init__(sites, _RELEASE)
        else:
            super().__init__(sites, _RELEASE, start_s=log.start_s, policy=QueuePolicy.EASY)
        self._users_log = log
        self._health = {s.name: SiteHealth(s.name) for s in sites}
        self._params = params
        self._bandwidth = bandwidth
        self._policy = policy
        self._seed = seed
        self._failures = random.Random(f"gridcore.sim.claiming:failures:{seed}")
        self._queues: dict[Priority, list[QueuedJob]] = {Priority.HIGH: [], Priority.LOW: []}
        self._held: deque[_Job] = deque()
        self._jobs: dict[str, _Job] = {}
        self._trace: list[TraceEvent] = []
        self._unfinished = 0
        self._scans = 0
        self._counts = dict.fromkeys(
            ("starts", "failures", "runs", "failed_runs", "preemptions", "aborts"), 0
        )
        self._unusable: dict[str, float] = {}
        self._others = OtherUsers(self._sim, tuple(self._clusters.values()), None, Admission.QUEUE)

    # -- the run ----------------------------------------------------------------------

    def run(
        self,
        jobs: Sequence[KoalaJob],
        background: Sequence[LocalJob],
        loads: Sequence[BackgroundLoad],
        horizon_s: float,
    ) -> KoalaRun:
        self._unfinished = len(jobs)
        for spec in jobs:
            job = _new_job(spec, self._params)
            self._jobs[spec.name] = job
            self._sim.schedule(spec.arrival_s, partial(self._arrive, job), _SUBMIT)
        for other in background:
            self._sim.schedule(other.submit_s, partial(self._others.submit, other), _OTHERS)
        for load in loads:
            self._load(load).start()
        if self._users_log is not None:
            start_log(
                self._sim,
                self._users_log,
                self._clusters,
                self._others.submit,
                priority=_OTHERS,
                active=lambda: self._unfinished > 0,
            )
        self._sim.schedule(0.0, self._scan, _SCAN)
        while self._unfinished and self._sim.pending and self._sim.peek() < horizon_s:
            self._sim.step()
        return self._result(jobs)

    def _result(self, jobs: Sequence[KoalaJob]) -> KoalaRun:
        counts = self._counts
        for site in self._clusters.values():
            site.close()
        return KoalaRun(
            tuple(self._jobs[spec.name].record() for spec in jobs),
            tuple(self._trace),
            counts["starts"],
            counts["failures"],
            counts["runs"],
            counts["failed_runs"],
            counts["preemptions"],
            counts["aborts"],
            self._scans,
            dict(self._unusable),
            {name: site.peak for name, site in self._clusters.items()},
            sum(site.started[Owner.LOCAL] for site in self._clusters.values()),
            {
                name: (site.busy_s(Owner.GRID), site.busy_s(Owner.LOCAL))
                for name, site in self._clusters.items()
            },
            self._sim.now,
            self._policy,
        )

    def _log(self, kind: str, job: str, detail: str = "") -> None:
        self._trace.append(TraceEvent(self._sim.now, kind, job, detail=detail))

    def _snapshot(self) -> list[SiteSnapshot]:
        return [
            SiteSnapshot(name, site.processors, site.idle)
            for name, site in self._clusters.items()
            if self._health[name].usable
        ]

    # -- submission and placement (Sec. 3.1) ---------------------------------------------

    def _arrive(self, job: _Job) -> None:
        cap = self._params.queue_cap
        if self._held or (cap is not None and self._queued() >= cap):
            job.state = SimJobState.HELD
            self._held.append(job)
            self._log("held", job.name, f"placement queues hold {self._queued()} >= cap {cap}")
            return
        self._submit(job)

    def _queued(self) -> int:
        return len(self._queues[Priority.HIGH]) + len(self._queues[Priority.LOW])

    def _submit(self, job: _Job) -> None:
        job.submit_s = self._sim.now
        job.queued_s = self._sim.now
        self._log("submit", job.name, f"{job.spec.priority.value} priority")
        queued = QueuedJob(job.request, job.replicas, job.placement_tries)
        self._apply_scan([queued], job.spec.priority, fresh=True)

    def _release_held(self) -> None:
        cap = self._params.queue_cap
        while self._held and (cap is None or self._queued() < cap):
            self._submit(self._held.popleft())

    def _scan(self) -> None:
        queue = scan_order(
            self._queues[Priority.HIGH], self._queues[Priority.LOW], self._params, self._scans
        )
        self._scans += 1
        if queue is not None:
            waiting = self._queues[queue]
            self._queues[queue] = []
            self._apply_scan(waiting, queue, fresh=False)
        self._release_held()
        if self._unfinished:
            self._sim.schedule(self._scans * self._params.scan_interval_s, self._scan, _SCAN)

    def _apply_scan(self, queue: Sequence[QueuedJob], priority: Priority, fresh: bool) -> None:
        result = scan_placement_queue(
            queue, self._snapshot(), self._policy, self._params, bandwidth=self._bandwidth
        )
        for queued, placement in result.placed:
            self._placed(self._jobs[queued.name], queued, placement)
        for queued in result.failed:
            job = self._jobs[queued.name]
            job.placement_tries = queued.placement_tries
            self._finish_failed(job, f"{queued.placement_tries} placement tries")
        for queued in result.waiting:
            job = self._jobs[queued.name]
            job.placement_tries = queued.placement_tries
            job.state = SimJobState.QUEUED
            if fresh:
                self._log("queued", job.name, f"{priority.value}-priority placement queue")
        self._queues[priority].extend(result.waiting)

    def _placed(self, job: _Job, queued: QueuedJob, placement: Placement) -> None:
        now = self._sim.now
        job.placement_tries = queued.placement_tries
        job.state = SimJobState.CLAIMING
        job.placed_s = now
        job.components = {c.index: c for c in placement.components}
        ftt = placement.file_transfer_s
        job.jst = now + ftt
        at = first_claim_try(now, ftt, job.L, self._params)
        self._log(
            "placed",
            job.name,
            f"{_where(placement.components)}; FTT {ftt:.0f} s, JST {job.jst:.1f},"
            f" first claim {at:.1f}",
        )
        self._sim.schedule(at, partial(self._claim, job, job.token), _CLAIM)

    # -- claiming (Sec. 3.2, 3.3) ---------------------------------------------------------

    def _claim(self, job: _Job, token: int) -> None:
        if token != job.token:
            return
        claiming = ClaimingJob(
            job.request,
            tuple(job.components[i] for i in sorted(job.components)),
            job.jst,
            job.L,
            frozenset(job.started),
            job.claim_tries,
            job.replicas,
        )
        preemptible = self._low_holders() if job.spec.priority is Priority.HIGH else []
        decision = claim_decision(
            claiming,
            self._snapshot(),
            self._sim.now,
            self._params,
            preemptible,
            bandwidth=self._bandwidth,
        )
        job.claim_tries = decision.claim_tries
        self._apply_claim(job, decision)

    def _low_holders(self) -> list[RunningLowJob]:
        holders = []
        for job in self._jobs.values():
            if job.spec.priority is Priority.LOW and job.started:
                usage: dict[str, int] = {}
                for component in job.started.values():
                    usage[component.site] = usage.get(component.site, 0) + component.size
                holders.append(RunningLowJob(job.name, job.jst, tuple(usage.items())))
        return holders

    def _apply_claim(self, job: _Job, decision: ClaimDecision) -> None:
        # Processors freed by preemption go to this job's components before other users'
        # queues see them: the policy counted on them.
        freed: set[str] = set()
        for victim in decision.preempt:
            preempted = self._jobs[victim]
            preempted.preemptions += 1
            self._counts["preemptions"] += 1
            freed |= self._abort(preempted, "preempted", f"by {job.name}", defer=True)
        for component in decision.start:
            self._start_component(job, component)
        for name in sorted(freed):
            self._clusters[name].start_queued()
        started = ",".join(str(c.index) for c in decision.start) or "-"
        self._log(
            "claim",
            job.name,
            f"{decision.outcome.name} F={decision.fraction:.2f} started [{started}]"
            f" replaced {list(decision.replaced)} preempted {list(decision.preempt)}",
        )
        if decision.outcome is ClaimOutcome.COMPLETE:
            job.state = SimJobState.READY
            self._sim.schedule(job.jst, partial(self._run, job, job.token), _RUN)
        elif decision.outcome is ClaimOutcome.RETRY and decision.next_claim_s is not None:
            self._sim.schedule(decision.next_claim_s, partial(self._claim, job, job.token), _CLAIM)
        elif decision.outcome is ClaimOutcome.ABORT:
            job.jst_aborts += 1
            self._counts["aborts"] += 1
            job.L = decision.L
            self._abort(job, "jst", f"L lowered to {decision.L}")
        else:
            self._release_all(job)
            self._finish_failed(job, f"{decision.claim_tries} claiming tries")

    def _start_component(self, job: _Job, component: PlacedComponent) -> None:
        site = self._clusters[component.site]
        site.claim(_holder(job, component.index), component.size, Owner.GRID)
        job.components[component.index] = component
        job.started[component.index] = component
        self._counts["starts"] += 1
        if not job.ran:
            job.ran = True
            job.runs += 1
            self._counts["runs"] += 1
        if self._failures.random() < site.site.failure_probability:
            end = job.jst + job.spec.runtime_s
            at = self._failures.uniform(self._sim.now, end)
            fail = partial(self._component_fails, job, job.token, component.index)
            self._sim.schedule(at, fail, _FAIL)

    def _run(self, job: _Job, token: int) -> None:
        if token != job.token:
            return
        job.state = SimJobState.RUNNING
        job.start_s = self._sim.now
        self._log("run", job.name, f"all components pass the barrier; {job.spec.runtime_s:.0f} s")
        self._sim.schedule_in(job.spec.runtime_s, partial(self._end, job, token), _RELEASE)

    def _end(self, job: _Job, token: int) -> None:
        if token != job.token:
            return
        self._release_all(job)
        job.state = SimJobState.DONE
        job.end_s = self._sim.now
        job.attempts.append(Attempt(job.queued_s, job.placed_s, job.jst, "completed"))
        self._unfinished -= 1
        self._log("end", job.name, "completed")

    # -- failures and aborts (Sec. 3.4) -----------------------------------------------------

    def _component_fails(self, job: _Job, token: int, index: int) -> None:
        if token != job.token or index not in job.started:
            return
        site = job.started[index].site
        decision = on_component_failure(job.request, index, self._health[site], self._params)
        self._health[site] = decision.site
        job.failures += 1
        self._counts["failures"] += 1
        self._counts["failed_runs"] += 1
        if decision.outcome is FailureOutcome.SITE_UNUSABLE:
            self._unusable[site] = self._sim.now
            self._log("unusable", site, decision.reasons[-1])
        self._abort(job, "failure", f"component {index} failed on {site}", index)

    def _abort(
        self, job: _Job, why: str, detail: str, failed: int | None = None, defer: bool = False
    ) -> set[str]:
        """End the job's pass: free what it holds, back to its placement queue (tail).
        Returns the sites freed; with ``defer`` their other users' queues wait."""
        freed = self._release_all(job, failed, defer)
        job.attempts.append(Attempt(job.queued_s, job.placed_s, job.jst, why))
        job.token += 1
        job.state = SimJobState.QUEUED
        job.queued_s = self._sim.now
        job.placed_s = None
        self._queues[job.spec.priority].append(
            QueuedJob(job.request, job.replicas, job.placement_tries)
        )
        self._log("abort", job.name, f"{why}: {detail}")
        return freed

    def _release_all(self, job: _Job, failed: int | None = None, defer: bool = False) -> set[str]:
        freed = {component.site for component in job.started.values()}
        for index, component in job.started.items():
            site = self._clusters[component.site]
            if defer:
                site.preempt([_holder(job, index)], Owner.GRID)
            else:
                site.release(_holder(job, index), Owner.GRID)
            if index != failed:
                # It ends without an error from its site: the site's errors so far are no
                # longer consecutive (Sec. 3.4).
                self._health[site.name] = record_site_success(self._health[site.name])
        job.started.clear()
        job.ran = False
        if not defer:
            for name in sorted(freed):
                self._clusters[name].start_queued()
        return freed

    def _finish_failed(self, job: _Job, why: str) -> None:
        job.state = SimJobState.FAILED
        job.attempts.append(Attempt(job.queued_s, job.placed_s, job.jst, "failed"))
        self._unfinished -= 1
        self._log("failed", job.name, why)

    # -- other users (Sec. 4.2) -------------------------------------------------------------

    def _load(self, load: BackgroundLoad) -> OtherUsers:
        streams = LoadStreams(
            random.Random(f"gridcore.sim.claiming:others:{self._seed}:{load.site}"),
            (f"{load.site}-user{number}" for number in itertools.count()),
        )
        return OtherUsers(
            self._sim,
            tuple(self._clusters.values()),
            load,
            Admission.QUEUE,
            streams=streams,
            priority=_OTHERS,
            active=lambda: self._unfinished > 0,
        )


def _holder(job: _Job, index: int) -> str:
    return component_job_name(job.name, index)


def _new_job(spec: KoalaJob, params: CoAllocationParams) -> _Job:
    logical = f"{spec.name}.in"
    request = CoAllocationRequest(
        spec.name,
        RequestKind.NON_FIXED,
        tuple(Component(size) for size in spec.components),
        input_file=InputFile(logical) if spec.file_sites else None,
        priority=spec.priority,
    )
    replicas = tuple(
        Replica(logical, site, f"gsiftp://{site}/koala/{logical}", spec.file_bytes, "")
        for site in spec.file_sites
    )
    return _Job(spec, request, replicas, params.L)


def _where(components: Sequence[PlacedComponent]) -> str:
    return ", ".join(
        f"{c.index}:{c.size}@{c.site}" + (f"<{c.file_site}" if c.file_site else "")
        for c in components
    )
