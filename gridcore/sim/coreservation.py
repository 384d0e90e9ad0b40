"""VJM on the shared simulated clusters: virtual jobs (pilots) that co-reserve processors
for a multi-cluster parallel job, with expected-wait selection and reorganization.

Design, equations and the choices where a paper is ambiguous: ``docs/coreservation.md``
(section ``gridcore/sim/coreservation.py``).
"""

from __future__ import annotations

import enum
import math
import random
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from gridcore.errors import ConfigError
from gridcore.model import Outcome
from gridcore.policies.coreservation import (
    DEFAULT_RULE,
    LIFETIME_CEILING_S,
    PILOT_TIME_MARGIN_S,
    ClusterReservation,
    ClusterView,
    PendingJob,
    Reorganization,
    ReorganizeRule,
    pilot_time_limit,
    reorganize,
    reservation_lifetime,
    round_robin_order,
    select_substitutes,
    settle_lifetime,
)
from gridcore.policies.queue_stats import WINDOW, QueueRecord, estimate_queue_stats
from gridcore.policies.wait_prediction import WAIT_MODELS, QueuedJob, WaitModel
from gridcore.sim.cluster import Cluster, Owner, Queued, QueuePolicy, ScheduleTicks
from gridcore.sim.core import Simulator
from gridcore.sim.log_load import OtherUsersLog, local_work, start_log
from gridcore.sim.queue_view import queue_view, watch_models
from gridcore.sim.workload import LocalJob, SimSite, TraceEvent, validate_local_jobs

_RELEASE = 0
_TICK = 1
_ARRIVE = 2
_SUBMIT = 3
_CHECK = 4

HORIZON_S = 7 * 86_400.0
"""The model stops here even with jobs never started (a deadlock without reorganization)."""


class Selection(enum.StrEnum):
    VJM = "vjm"  # Eq. 1 expected waits, steps 1-3 (Sec. 3.2)
    ROUND_ROBIN = "round_robin"  # MPICH-G2's static machine file (Sec. 1)


class Mode(enum.StrEnum):
    PILOTS = "pilots"  # virtual jobs that hold processors for the real job (VJM)
    COMPONENTS = "components"  # the real job's parts submitted directly (the KOALA baseline)


@dataclass(frozen=True)
class VjmCluster:
    """One cluster: its site and, optionally, its scheduler interval and tick phase."""

    site: SimSite
    interval_s: float | None = None
    phase_s: float = 0.0

    @property
    def name(self) -> str:
        return self.site.name


@dataclass(frozen=True)
class ParallelJob:
    """A multi-cluster parallel job: all ``processors`` must start together.
    ``delays_s``: fixed submission delays of its first virtual jobs in the order they are
    issued (replaces the drawn delay; replays a trace or builds a given interleaving)."""

    name: str
    submit_s: float
    processors: int
    runtime_s: float
    delays_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class VjmParams:
    """``vj_processors``: g; ``max_clusters``: M; ``lifetime_floor_s``: Eq. 2's floor;
    ``lifetime_ceiling_s``: Eq. 2's ceiling (``LIFETIME_CEILING_S`` of
    :mod:`gridcore.policies.coreservation`); ``submit_delay_s``: the uniform range of a
    pilot's (component's) submission delay."""

    vj_processors: int = 1
    max_clusters: int = 2
    selection: Selection = Selection.VJM
    reorganize: bool = True
    lifetime_floor_s: float = 300.0
    lifetime_ceiling_s: float = LIFETIME_CEILING_S  # not in the paper (policies)
    mode: Mode = Mode.PILOTS
    submit_delay_s: tuple[float, float] = (0.0, 0.0)
    restart_lifetime_on_shift: bool = True
    # How Sec. 3.3 is read (policies.coreservation; PAPER_RULE: as printed).
    rule: ReorganizeRule = DEFAULT_RULE
    # A WAIT_MODELS name whose forecasts on each cluster's true queue replace Eq. 1's
    # T_avail (policies.coreservation.ClusterView.t_avails); None: Eq. 1 on the history.
    wait_model: str | None = None

    def __post_init__(self) -> None:
        low, high = self.submit_delay_s
        if self.vj_processors < 1 or self.max_clusters < 1:
            raise ConfigError(
                f"vj_processors and max_clusters must be >= 1"
                f" (got {self.vj_processors}, {self.max_clusters})"
            )
        if not (math.isfinite(high) and 0.0 <= low <= high):
            raise ConfigError(f"submit_delay_s must be 0 <= low <= high, got {self.submit_delay_s}")
        reservation_lifetime([], self.lifetime_floor_s, self.lifetime_ceiling_s)  # refuses bad


@dataclass(frozen=True)
class VjmJobRecord:
    """What happened to one parallel job. ``clusters``: processors per cluster when it
    started (or at the end); ``reorganizations``: lifetime checks that changed something;
    ``shifts_given`` / ``shifts_received``: pilots moved away from / to it."""

    name: str
    submit_s: float
    processors: int
    start_s: float | None
    end_s: float | None
    clusters: Mapping[str, int]
    first_lifetime_s: float | None
    reorganizations: int
    shifts_given: int
    shifts_received: int
    substitutes: int

    @property
    def coallocation_s(self) -> float | None:
        """Submit to the instant every pilot (component) holds its processors."""
        return None if self.start_s is None else self.start_s - self.submit_s


@dataclass(frozen=True)
class VjmRun:
    """One run: the jobs, the trace, the processor-seconds pilots held idle, the most
    processors in use at once per cluster, the reorganization steps taken, and when the
    run stopped."""

    jobs: tuple[VjmJobRecord, ...]
    trace: tuple[TraceEvent, ...]
    idle_held_cpu_s: float
    peak_used: Mapping[str, int]
    steps: Mapping[str, int]
    end_s: float

    @property
    def submitted(self) -> int:
        return len(self.jobs)

    @property
    def started(self) -> int:
        return sum(1 for j in self.jobs if j.start_s is not None)

    @property
    def mean_coallocation_s(self) -> float:
        times = [j.coallocation_s for j in self.jobs if j.coallocation_s is not None]
        return sum(times) / len(times) if times else 0.0

    def by_name(self, name: str) -> VjmJobRecord:
        for job in self.jobs:
            if job.name == name:
                return job
        raise KeyError(name)


def simulate_vjm(
    clusters: Sequence[VjmCluster],
    jobs: Sequence[ParallelJob],
    params: VjmParams | None = None,
    *,
    background: Sequence[LocalJob] = (),
    log: OtherUsersLog | None = None,
    wait_models: Mapping[str, WaitModel] | None = None,
    seed: int = 0,
    horizon_s: float = HORIZON_S,
) -> VjmRun:
    """Run ``jobs`` (and other users' ``background`` jobs) on ``clusters`` until every job
    has ended or ``horizon_s``. The same inputs and ``seed`` give the same run.

    ``log``: other users' jobs from a real log, submitted while our jobs are unfinished;
    the clusters' queues then backfill as EASY, a pilot asking for its time limit
    (:func:`~gridcore.policies.coreservation.pilot_time_limit` of its lifetime and its
    job's runtime), and the run starts at ``log.start_s``. ``wait_models``: cluster ->
    the wait model ``params.wait_model`` names (with the history the caller gave it; it
    hears of every start and end there); one not given starts without history."""
    params = params or VjmParams()
    _validate(clusters, jobs, background, params)
    models: dict[str, WaitModel] = {}
    if params.wait_model is not None:
        if params.wait_model not in WAIT_MODELS:
            raise ConfigError(f"wait model {params.wait_model!r}: known are {list(WAIT_MODELS)}")
        given = wait_models or {}
        models = {c.name: given.get(c.name) or WAIT_MODELS[params.wait_model]() for c in clusters}
    return _VjmModel(clusters, params, seed, log, models).run(jobs, background, horizon_s)


def _validate(
    clusters: Sequence[VjmCluster],
    jobs: Sequence[ParallelJob],
    background: Sequence[LocalJob],
    params: VjmParams,
) -> None:
    sites = [c.site for c in clusters]
    names = [s.name for s in sites]
    if not sites or len(set(names)) != len(names):
        raise ConfigError(f"clusters: need at least one, names unique (got {names})")
    for cluster in clusters:
        if cluster.interval_s is not None:
            ScheduleTicks(cluster.interval_s, cluster.phase_s)  # refuses a bad interval
    seen: set[str] = set()
    room = sum(s.processors // params.vj_processors for s in sites) * params.vj_processors
    for job in jobs:
        if job.name in seen:
            raise ConfigError(f"job names must be unique; repeated: {job.name}")
        seen.add(job.name)
        if not (job.submit_s >= 0 and job.runtime_s >= 0 and job.processors >= 1) or any(
            not (math.isfinite(d) and d >= 0) for d in job.delays_s
        ):
            raise ConfigError(
                f"job {job.name}: needs submit_s, runtime_s, delays_s >= 0, processors >= 1"
            )
        if job.processors > room:
            raise ConfigError(f"job {job.name}: {job.processors} processors > the grid's {room}")
    validate_local_jobs(background, sites, "cluster")


class _PilotState(enum.StrEnum):
    SENT = "sent"  # submitted, not yet in the cluster's queue
    QUEUED = "queued"
    HELD = "held"
    RUNNING = "running"  # its job runs
    GONE = "gone"  # cancelled, released, or its job ended


@dataclass(eq=False)
class _Pilot:
    name: str
    cluster: str
    processors: int
    job: _Job
    sent_s: float
    state: _PilotState = _PilotState.SENT
    held_since: float = 0.0


@dataclass(eq=False)
class _Job:
    spec: ParallelJob
    number: int
    pilots: list[_Pilot] = field(default_factory=list)
    start_s: float | None = None
    end_s: float | None = None
    token: int = 0
    issued: int = 0
    missing: int = 0
    first_lifetime_s: float | None = None
    lifetime_s: float = 0.0
    reorganizations: int = 0
    shifts_given: int = 0
    shifts_received: int = 0
    substitutes: int = 0
    avoid: tuple[str, ...] = ()  # clusters its last reorganization released

    @property
    def name(self) -> str:
        return self.spec.name

    def on(self, cluster: str) -> list[_Pilot]:
        return [p for p in self.pilots if p.cluster == cluster]

    def record(self) -> VjmJobRecord:
        where: Counter[str] = Counter()
        for pilot in self.pilots:
            where[pilot.cluster] += pilot.processors
        return VjmJobRecord(
            self.name,
            self.spec.submit_s,
            self.spec.processors,
            self.start_s,
            self.end_s,
            dict(where),
            self.first_lifetime_s,
            self.reorganizations,
            self.shifts_given,
            self.shifts_received,
            self.substitutes,
        )


class _VjmModel:
    def __init__(
        self,
        clusters: Sequence[VjmCluster],
        params: VjmParams,
        seed: int,
        log: OtherUsersLog | None = None,
        wait_models: Mapping[str, WaitModel] | None = None,
    ) -> None:
        self._sim = Simulator(0.0 if log is None else log.start_s)
        self._params = params
        self._seed = seed
        self._users_log = log
        policy = QueuePolicy.FIFO if log is None else QueuePolicy.EASY
        self._clusters: dict[str, Cluster] = {}
        for spec in clusters:
            ticks = None
            if spec.interval_s is not None:
                ticks = ScheduleTicks(spec.interval_s, spec.phase_s, _TICK)
            self._clusters[spec.name] = Cluster(self._sim, spec.site, _RELEASE, ticks, policy)
        self._history: dict[str, dict[str, QueueRecord]] = {name: {} for name in self._clusters}
        self._wait_models = dict(wait_models or {})
        watch_models(self._clusters, {"vjm": self._wait_models})
        # Logged jobs' started records, oldest start first: Eq. 1 reads only the last
        # WINDOW starts, so older ones are dropped (a long log in bounded memory).
        self._logged_starts: dict[str, deque[str]] = {name: deque() for name in self._clusters}
        self._jobs: list[_Job] = []
        self._unfinished = 0
        self._idle_held = 0.0
        self._trace: list[TraceEvent] = []
        self._steps: Counter[str] = Counter()

    # -- the run ---------------------------------------------------------------------------

    def run(
        self, jobs: Sequence[ParallelJob], background: Sequence[LocalJob], horizon_s: float
    ) -> VjmRun:
        self._unfinished = len(jobs)
        for number, spec in enumerate(jobs):
            job = _Job(spec, number)
            self._jobs.append(job)
            self._sim.schedule(spec.submit_s, partial(self._submit, job), _SUBMIT)
        for other in background:
            self._sim.schedule(other.submit_s, partial(self._local_arrives, other), _ARRIVE)
        if self._users_log is not None:
            start_log(
                self._sim,
                self._users_log,
                self._clusters,
                self._logged_arrives,
                priority=_ARRIVE,
                active=lambda: self._unfinished > 0,
            )
        while self._unfinished and self._sim.pending and self._sim.peek() < horizon_s:
            self._sim.step()
        end = self._sim.now if not self._unfinished else max(self._sim.now, horizon_s)
        for job in self._jobs:
            for pilot in job.pilots:
                if pilot.state is _PilotState.HELD:
                    self._idle_held += (end - pilot.held_since) * pilot.processors
        return VjmRun(
            tuple(job.record() for job in self._jobs),
            tuple(self._trace),
            self._idle_held,
            {name: c.peak for name, c in self._clusters.items()},
            dict(self._steps),
            end,
        )

    def _log(
        self, kind: str, job: str, site: str = "", processors: int = 0, detail: str = ""
    ) -> None:
        self._trace.append(TraceEvent(self._sim.now, kind, job, site, processors, detail))

    # -- other users ---------------------------------------------------------------------

    def _local_arrives(self, other: LocalJob) -> None:
        records = self._history[other.site]
        key = f"local:{other.name}"
        records[key] = QueueRecord(self._sim.now)
        started = partial(self._record_start, other.site, key)
        work = Queued(other.name, other.processors, other.runtime_s, Owner.LOCAL, started)
        self._clusters[other.site].enqueue(work)

    def _record_start(self, cluster: str, key: str) -> None:
        records = self._history[cluster]
        records[key] = QueueRecord(records[key].submitted_at, self._sim.now)

    def _logged_arrives(self, other: LocalJob) -> None:
        key = f"log:{other.name}"
        self._history[other.site][key] = QueueRecord(other.submit_s)
        work = local_work(other, partial(self._logged_starts_now, other.site, key))
        self._clusters[other.site].enqueue(work)

    def _logged_starts_now(self, cluster: str, key: str) -> None:
        self._record_start(cluster, key)
        starts = self._logged_starts[cluster]
        starts.append(key)
        if len(starts) > 2 * WINDOW:
            del self._history[cluster][starts.popleft()]

    # -- submission and selection (Sec. 3.2) -------------------------------------------------

    def _submit(self, job: _Job) -> None:
        g = self._params.vj_processors
        count = math.ceil(job.spec.processors / g)
        if self._params.selection is Selection.ROUND_ROBIN:
            order, t_avails = self._round_robin(count), [0.0]
        else:
            chosen = self._select(count, {}, job=job)
            if chosen is None:
                self._log("no-fit", job.name, detail="no cluster set holds the job")
                job.missing = count
                self._schedule_check(job, self._params.lifetime_floor_s)
                return
            order, t_avails = chosen
        shares = Counter(order)
        detail = ", ".join(f"{n}x{g}@{c}" for c, n in shares.items())
        self._log("submit", job.name, processors=job.spec.processors, detail=detail)
        if self._params.mode is Mode.COMPONENTS:
            for cluster, n in shares.items():
                self._send(job, cluster, n * g, f"{job.name}.{cluster}")
            return
        self._send_pilots(job, order)
        self._start_lifetime(job, t_avails)

    def _select(
        self,
        count: int,
        kept: Mapping[str, int],
        avoid: Sequence[str] = (),
        *,
        job: _Job | None = None,
    ) -> tuple[list[str], list[float]] | None:
        """The cluster of each virtual job in issue order, and their waits (Eq. 1, or
        the wait model's forecasts, for pilots as long as the ones then sent:
        :func:`~gridcore.policies.coreservation.settle_lifetime`)."""
        params = self._params
        if job is None or not self._wait_models or not params.reorganize:
            # without reorganization the lifetime stays the floor's (_pilot_limit)
            return self._select_for(count, kept, avoid, job, None)
        return settle_lifetime(
            lambda lifetime: self._select_for(count, kept, avoid, job, lifetime),
            lambda chosen: (
                0.0
                if chosen is None
                else reservation_lifetime(
                    chosen[1], params.lifetime_floor_s, params.lifetime_ceiling_s
                )
            ),
            max(job.lifetime_s, params.lifetime_floor_s),
        )

    def _select_for(
        self,
        count: int,
        kept: Mapping[str, int],
        avoid: Sequence[str],
        job: _Job | None,
        lifetime: float | None,
    ) -> tuple[list[str], list[float]] | None:
        now = self._sim.now
        g = self._params.vj_processors
        views = [
            ClusterView(
                name,
                estimate_queue_stats(self._history[name].values(), now),
                cluster.processors // g,
                self._t_avails(name, count, kept.get(name, 0), job, lifetime),
            )
            for name, cluster in self._clusters.items()
        ]
        selection = select_substitutes(count, views, self._params.max_clusters, kept, avoid)
        if selection.outcome is not Outcome.FIT:
            return None
        return [c.cluster for c in selection.choices], [c.t_avail for c in selection.choices]

    def _t_avails(
        self, cluster: str, count: int, kept: int, job: _Job | None, lifetime: float | None
    ) -> tuple[float, ...] | None:
        """The wait model's forecast for this selection's 1st, 2nd, ... virtual job on
        ``cluster``, each with the earlier ones queued ahead (``None``: Eq. 1), each
        asking the pilot's time limit for ``lifetime`` (``None``: the job's own)."""
        model = self._wait_models.get(cluster)
        if model is None:
            return None
        site = self._clusters[cluster]
        g = self._params.vj_processors
        room = min(count, site.processors // g - kept)
        now = self._sim.now
        # each virtual job asks for its pilot's time limit
        limit = float(PILOT_TIME_MARGIN_S) if job is None else self._pilot_limit(job, lifetime)
        ahead: list[QueuedJob] = []
        waits: list[float] = []
        for index in range(max(0, room)):
            virtual = QueuedJob(f"?vj{index}", g, now, limit)
            forecast = model.forecast(virtual, queue_view(site, now, ahead))
            # a later virtual job never waits less than an earlier one (the heap's rule)
            waits.append(max(forecast.wait_s, waits[-1] if waits else 0.0))
            ahead.append(virtual)
        return tuple(waits)

    def _round_robin(self, count: int) -> list[str]:
        """MPICH-G2's machine file (validation guarantees every virtual job fits)."""
        g = self._params.vj_processors
        return round_robin_order(count, {n: c.processors // g for n, c in self._clusters.items()})

    def _send_pilots(self, job: _Job, order: Sequence[str]) -> None:
        g = self._params.vj_processors
        for cluster in order:
            # The last virtual job takes the remainder of P / g.
            size = min(g, job.spec.processors - self._issued_processors(job))
            job.issued += 1
            fixed = job.spec.delays_s
            delay = fixed[job.issued - 1] if job.issued <= len(fixed) else None
            self._send(job, cluster, size, f"{job.name}.vj{job.issued}", delay)

    def _issued_processors(self, job: _Job) -> int:
        return sum(p.processors for p in job.pilots)

    def _send(
        self, job: _Job, cluster: str, processors: int, name: str, delay: float | None = None
    ) -> None:
        pilot = _Pilot(name, cluster, processors, job, self._sim.now)
        job.pilots.append(pilot)
        if delay is None:
            low, high = self._params.submit_delay_s
            # the seed string keeps the former module path, so seeded runs reproduce
            rng = random.Random(f"gridcore.sim.vjm:delay:{self._seed}:{name}")
            delay = rng.uniform(low, high)
        self._sim.schedule_in(delay, partial(self._arrive, pilot), _ARRIVE)

    def _arrive(self, pilot: _Pilot) -> None:
        if pilot.state is not _PilotState.SENT:
            return  # cancelled in flight
        pilot.state = _PilotState.QUEUED
        self._history[pilot.cluster][pilot.name] = QueueRecord(self._sim.now)
        work = Queued(
            pilot.name,
            pilot.processors,
            None,
            Owner.GRID,
            partial(self._pilot_starts, pilot),
            requested_s=None if self._users_log is None else self._pilot_limit(pilot.job),
        )
        self._clusters[pilot.cluster].enqueue(work)

    def _pilot_limit(self, job: _Job, lifetime: float | None = None) -> float:
        """The time limit ``job``'s pilots ask for a reservation of ``lifetime`` (the
        job's own, at least the floor, when not given)."""
        if lifetime is None:
            lifetime = max(job.lifetime_s, self._params.lifetime_floor_s)
        return float(pilot_time_limit(lifetime, job.spec.runtime_s or 1.0))

    # -- pilots hold; the job starts when all hold (Sec. 3.1) -----------------------------------

    def _pilot_starts(self, pilot: _Pilot) -> None:
        self._record_start(pilot.cluster, pilot.name)
        pilot.state = _PilotState.HELD
        pilot.held_since = self._sim.now
        self._log("hold", pilot.job.name, pilot.cluster, pilot.processors, pilot.name)
        self._start_if_complete(pilot.job)

    def _start_if_complete(self, job: _Job) -> None:
        if job.start_s is not None or job.missing:
            return
        if any(p.state is not _PilotState.HELD for p in job.pilots):
            return
        now = self._sim.now
        for pilot in job.pilots:
            self._idle_held += (now - pilot.held_since) * pilot.processors
            pilot.state = _PilotState.RUNNING
        job.start_s = now
        job.token += 1  # no lifetime check after the start
        self._log("start", job.name, processors=job.spec.processors)
        self._sim.schedule_in(job.spec.runtime_s, partial(self._end, job), _RELEASE)

    def _end(self, job: _Job) -> None:
        freed: set[str] = set()
        for pilot in job.pilots:
            self._clusters[pilot.cluster].release(pilot.name, Owner.GRID)
            pilot.state = _PilotState.GONE
            freed.add(pilot.cluster)
        job.end_s = self._sim.now
        self._unfinished -= 1
        self._log("end", job.name)
        for name in sorted(freed):
            self._clusters[name].start_queued()

    # -- lifetime and reorganization (Sec. 3.3) ------------------------------------------------

    def _start_lifetime(self, job: _Job, t_avails: Sequence[float]) -> None:
        if not self._params.reorganize:
            return
        lifetime = reservation_lifetime(
            t_avails, self._params.lifetime_floor_s, self._params.lifetime_ceiling_s
        )
        if job.first_lifetime_s is None:
            job.first_lifetime_s = lifetime
        job.lifetime_s = lifetime
        self._schedule_check(job, lifetime)

    def _schedule_check(self, job: _Job, after_s: float) -> None:
        job.token += 1
        self._sim.schedule_in(after_s, partial(self._check, job, job.token), _CHECK)

    def _check(self, job: _Job, token: int) -> None:
        if token != job.token or job.start_s is not None:
            return
        if job.missing:
            self._substitute(job, job.missing)
            return
        others = [self._pending(j) for j in self._jobs if j is not job and self._is_pending(j)]
        plan = reorganize(self._pending(job), others, self._params.rule)
        self._steps[plan.step] += 1
        self._log("reorganize", job.name, detail="; ".join(plan.reasons))
        job.reorganizations += 1
        self._apply(job, plan)

    def _is_pending(self, job: _Job) -> bool:
        return job.start_s is None and bool(job.pilots)

    def _pending(self, job: _Job) -> PendingJob:
        now = self._sim.now
        clusters: dict[str, ClusterReservation] = {}
        for name in dict.fromkeys(p.cluster for p in job.pilots):
            mine = job.on(name)
            held = sum(1 for p in mine if p.state is _PilotState.HELD)
            waits = tuple(now - p.sent_s for p in mine if p.state is not _PilotState.HELD)
            clusters[name] = ClusterReservation(len(mine), held, waits)
        return PendingJob(job.number, job.spec.submit_s, clusters)

    def _apply(self, job: _Job, plan: Reorganization) -> None:
        touched: set[str] = set()
        receivers: list[_Job] = []
        for shift in plan.shifts:
            receiver = self._jobs[shift.to_job]
            self._shift(job, receiver, shift.cluster, shift.pilots, touched)
            receivers.append(receiver)
        job.avoid = plan.release
        for cluster in plan.release:
            for pilot in job.on(cluster):
                self._drop(pilot, touched)
            job.pilots = [p for p in job.pilots if p.cluster != cluster]
        for receiver in receivers:
            self._start_if_complete(receiver)
            if receiver.start_s is None and self._params.restart_lifetime_on_shift:
                self._schedule_check(receiver, receiver.lifetime_s)
        for name in sorted(touched):
            self._clusters[name].start_queued()
        if plan.substitutes:
            self._substitute(job, plan.substitutes)
        else:
            self._schedule_check(job, self._params.lifetime_floor_s)

    def _shift(self, giver: _Job, receiver: _Job, cluster: str, n: int, touched: set[str]) -> None:
        held = [p for p in giver.on(cluster) if p.state is _PilotState.HELD][:n]
        waiting = [p for p in receiver.on(cluster) if p.state is not _PilotState.HELD]
        for pilot in waiting[len(waiting) - len(held) :]:
            self._drop(pilot, touched)
            receiver.pilots.remove(pilot)
        for pilot in held:
            giver.pilots.remove(pilot)
            pilot.job = receiver
            receiver.pilots.append(pilot)
        giver.shifts_given += len(held)
        receiver.shifts_received += len(held)
        self._log("shift", giver.name, cluster, len(held), f"to {receiver.name}")

    def _drop(self, pilot: _Pilot, touched: set[str]) -> None:
        """Release a held pilot, or cancel one waiting in a queue or still in flight."""
        site = self._clusters[pilot.cluster]
        if pilot.state is _PilotState.HELD:
            self._idle_held += (self._sim.now - pilot.held_since) * pilot.processors
            site.release(pilot.name, Owner.GRID)
            touched.add(pilot.cluster)
        elif pilot.state is _PilotState.QUEUED:
            site.withdraw(pilot.name, Owner.GRID)
            del self._history[pilot.cluster][pilot.name]
            touched.add(pilot.cluster)
        pilot.state = _PilotState.GONE

    def _substitute(self, job: _Job, count: int) -> None:
        kept: Counter[str] = Counter(p.cluster for p in job.pilots)
        chosen = self._select(count, kept, job.avoid, job=job)
        if chosen is None:
            job.missing = count
            self._log("no-fit", job.name, detail=f"no substitute for {count} virtual jobs")
            self._schedule_check(job, self._params.lifetime_floor_s)
            return
        order, t_avails = chosen
        job.missing = 0
        job.substitutes += count
        detail = ", ".join(f"{n}@{c}" for c, n in Counter(order).items())
        self._log("substitute", job.name, processors=count, detail=detail)
        self._send_pilots(job, order)
        self._start_lifetime(job, t_avails)
