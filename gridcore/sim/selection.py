"""A multicluster model for site selection with monitoring lag and hysteresis.

Design, equations and the choices where a paper is ambiguous: ``docs/selection.md``
(section ``gridcore/sim/selection.py``).
"""

from __future__ import annotations

import enum
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from gridcore.errors import ConfigError
from gridcore.model import (
    JobRequest,
    JobState,
    ObservedJob,
    SiteObservation,
    SiteSelection,
    SiteSnapshot,
)
from gridcore.policies.selection import InsufficientMode, SelectionProtocol, select_site
from gridcore.policies.transfer import free_bandwidth
from gridcore.policies.wait_prediction import (
    WAIT_MODELS,
    QueuedJob,
    WaitForecast,
    WaitModel,
)
from gridcore.sim.cluster import Cluster, ClusterModel, Owner, Queued, QueuePolicy
from gridcore.sim.core import SimulationError
from gridcore.sim.log_load import OtherUsersLog, local_work, start_log
from gridcore.sim.queue_view import queue_view, watch_models
from gridcore.sim.workload import (
    JobTimes,
    LocalJob,
    SimSite,
    validate_local_jobs,
    validate_sites,
    validate_unique,
)

MDS_INTERVAL_S = 60.0
"""MDS collects data every sixty seconds by default (Sec. 3.2)."""

_END = 0
_REACH_QUEUE = 1
_MONITOR = 2
_SELECT = 3
_LOG = _REACH_QUEUE  # logged jobs reach their queues as external jobs do


@dataclass(frozen=True)
class SimJob:
    """One job of a selecting stream (Table 2: arrival, runtime, hysteresis, CPUs, system).

    ``runtime_s`` is the reference runtime; on a site it takes ``runtime_s * slowness``.
    """

    name: str
    arrival_s: float
    runtime_s: float
    processors: int
    hysteresis_s: float = 0.0
    stream: int = 0


class View(enum.StrEnum):
    """What a stream decides on."""

    MONITOR = "monitor"  # the monitor's last report, plus the state's own work in flight
    SCHEDULERS = "schedulers"  # each cluster's true queue now, as its scheduler knows it
    # (sbatch -M's peer: perfect knowledge of every scheduler, none of our work in flight)


@dataclass(frozen=True)
class StreamConfig:
    """How one stream selects. Streams with the same ``state`` share in-flight knowledge;
    ``None`` keeps it private to the stream. ``wait_model``: a
    :data:`~gridcore.policies.wait_prediction.WAIT_MODELS` name whose forecast on each
    site's true queue (plus the state's members in flight there, with the monitor's
    view) is the queue delay of Eq. (C); ``None``: Eq. W on the snapshot."""

    protocol: SelectionProtocol = SelectionProtocol.STATEFUL
    mode: InsufficientMode = InsufficientMode.BEST
    state: str | None = None
    wait_model: str | None = None
    view: View = View.MONITOR


@dataclass(frozen=True)
class JobRecord(JobTimes):
    """What happened to one job. For external jobs ``arrival_s`` is the submit time,
    ``stream`` is ``None`` and there is no selection."""

    name: str
    stream: int | None
    site: str
    processors: int
    arrival_s: float
    queue_arrival_s: float
    start_s: float
    end_s: float
    selection: SiteSelection | None = None

    @property
    def queued_s(self) -> float:
        """Time in the site's batch queue (reaching the queue to start)."""
        return self.start_s - self.queue_arrival_s

    @property
    def compute_s(self) -> float:
        return self.execution_s


@dataclass(frozen=True)
class SelectionRun:
    """The outcome of one simulated run."""

    jobs: tuple[JobRecord, ...]
    external: tuple[JobRecord, ...]
    reports: tuple[SiteObservation, ...]

    @property
    def completion_s(self) -> float:
        """Time from the first arrival until the last of our jobs completes."""
        if not self.jobs:
            return 0.0
        return max(j.end_s for j in self.jobs) - min(j.arrival_s for j in self.jobs)

    @property
    def total_queue_s(self) -> float:
        return sum(j.queued_s for j in self.jobs)

    @property
    def mean_queue_s(self) -> float:
        return self.total_queue_s / len(self.jobs) if self.jobs else 0.0

    @property
    def total_compute_s(self) -> float:
        return sum(j.compute_s for j in self.jobs)

    @property
    def mean_compute_s(self) -> float:
        return self.total_compute_s / len(self.jobs) if self.jobs else 0.0

    def by_name(self, name: str) -> JobRecord:
        for record in (*self.jobs, *self.external):
            if record.name == name:
                return record
        raise KeyError(name)

    def reports_at(self, at: float) -> dict[str, SiteObservation]:
        """The monitor report published at time ``at``, by site."""
        return {r.site: r for r in self.reports if r.observed_at == at}


def simulate_selection(
    sites: Sequence[SimSite],
    jobs: Sequence[SimJob],
    streams: Mapping[int, StreamConfig] | None = None,
    *,
    external: Sequence[LocalJob] = (),
    log: OtherUsersLog | None = None,
    wait_models: Mapping[str, Mapping[str, WaitModel]] | None = None,
    monitor_interval_s: float = MDS_INTERVAL_S,
    seed: int = 0,
) -> SelectionRun:
    """Run ``jobs`` (and ``external`` load) on ``sites`` until every job has completed.

    ``log``: other users' jobs from a real log, submitted while our jobs are unfinished
    (not recorded in the run's ``external``); the sites' queues then backfill as EASY
    (:class:`~gridcore.sim.cluster.QueuePolicy`) and the run starts at ``log.start_s``.
    ``wait_models``: name -> site -> the wait model of a stream naming it (with the
    history the caller gave it; it hears of every start and end on its site); a stream's
    model not given starts without history.

    ``streams`` maps each stream id used by ``jobs`` to its configuration; ``None`` gives
    every stream the default (stateful, best). The monitor publishes at time 0 and then
    every ``monitor_interval_s``. Each stream's ``random.Random`` is seeded from ``seed``
    and the stream id, so the same inputs and seed give the same run.
    """
    configs = _stream_configs(jobs, streams)
    _validate(sites, jobs, external, monitor_interval_s)
    models = _wait_models(sites, configs, wait_models)
    model = _SelectionModel(sites, configs, monitor_interval_s, seed, log, models)
    return model.run(jobs, external)


def _wait_models(
    sites: Sequence[SimSite],
    configs: Mapping[int, StreamConfig],
    given: Mapping[str, Mapping[str, WaitModel]] | None,
) -> dict[str, dict[str, WaitModel]]:
    models: dict[str, dict[str, WaitModel]] = {}
    for config in configs.values():
        name = config.wait_model
        if name is None or name in models:
            continue
        if name not in WAIT_MODELS:
            raise ConfigError(f"wait model {name!r}: known are {', '.join(WAIT_MODELS)}")
        mine = dict((given or {}).get(name, {}))
        models[name] = {s.name: mine.get(s.name) or WAIT_MODELS[name]() for s in sites}
    return models


def _stream_configs(
    jobs: Sequence[SimJob], streams: Mapping[int, StreamConfig] | None
) -> dict[int, StreamConfig]:
    used = sorted({job.stream for job in jobs})
    if streams is None:
        return {stream: StreamConfig() for stream in used}
    missing = [stream for stream in used if stream not in streams]
    if missing:
        raise ConfigError(f"streams: no configuration for stream(s) {missing}")
    return dict(streams)


def _validate(
    sites: Sequence[SimSite],
    jobs: Sequence[SimJob],
    external: Sequence[LocalJob],
    monitor_interval_s: float,
) -> None:
    if not monitor_interval_s > 0:
        raise ConfigError(f"monitor_interval_s must be > 0, got {monitor_interval_s}")
    validate_sites(sites)
    validate_unique([job.name for job in jobs] + [job.name for job in external])
    largest = max(site.processors for site in sites)
    for job in jobs:
        if job.arrival_s < 0 or job.runtime_s < 0 or job.processors < 1:
            raise ConfigError(
                f"job {job.name}: needs time >= 0, runtime_s >= 0 and processors >= 1"
                f" (got {job.arrival_s}, {job.runtime_s}, {job.processors})"
            )
        if job.hysteresis_s < 0:
            raise ConfigError(f"job {job.name}: hysteresis_s must be >= 0")
        if job.processors > largest:
            raise ConfigError(
                f"job {job.name}: {job.processors} processors > largest site ({largest})"
            )
    validate_local_jobs(external, sites)


@dataclass
class _Placed:
    """A job's life on its site; ``job`` is ours (SimJob) or external (LocalJob)."""

    job: SimJob | LocalJob
    site: str
    arrival_s: float
    selection: SiteSelection | None = None
    queue_arrival_s: float | None = None
    start_s: float | None = None
    end_s: float | None = None

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def processors(self) -> int:
        return self.job.processors

    def record(self) -> JobRecord:
        if self.queue_arrival_s is None or self.start_s is None or self.end_s is None:
            raise SimulationError(f"job {self.name} did not complete")
        stream = self.job.stream if isinstance(self.job, SimJob) else None
        return JobRecord(
            self.name,
            stream,
            self.site,
            self.processors,
            self.arrival_s,
            self.queue_arrival_s,
            self.start_s,
            self.end_s,
            self.selection,
        )


@dataclass
class _State:
    """What one state (one stream, or streams sharing a database) knows of its jobs."""

    placed: list[_Placed] = field(default_factory=list)
    names: set[str] = field(default_factory=set)


class _SelectionModel(ClusterModel):
    def __init__(
        self,
        sites: Sequence[SimSite],
        configs: Mapping[int, StreamConfig],
        monitor_interval_s: float,
        seed: int,
        log: OtherUsersLog | None = None,
        wait_models: Mapping[str, Mapping[str, WaitModel]] | None = None,
    ) -> None:
        if log is None:
            super().__init__(sites, _END)
        else:
            super().__init__(sites, _END, start_s=log.start_s, policy=QueuePolicy.EASY)
        self._log = log
        self._wait_models = wait_models or {}
        watch_models(self._clusters, self._wait_models)
        self._configs = configs
        self._rngs = {
            stream: random.Random(f"gridcore.sim.selection:{seed}:{stream}") for stream in configs
        }
        self._states: dict[str, _State] = {}
        self._interval = monitor_interval_s
        self._ticks = 0
        self._origin = 0.0
        self._report: dict[str, SiteObservation] = {}
        self._reports: list[SiteObservation] = []
        self._unfinished = 0
        self._ours_unfinished = 0

    def run(self, jobs: Sequence[SimJob], external: Sequence[LocalJob]) -> SelectionRun:
        ours: list[_Placed] = []
        others: list[_Placed] = []
        self._unfinished = len(jobs) + len(external)
        self._ours_unfinished = len(jobs)
        if self._log is not None:
            start_log(
                self._sim,
                self._log,
                self._clusters,
                self._log_arrives,
                priority=_LOG,
                active=lambda: self._ours_unfinished > 0,
            )
        # The monitor's ticks are at k * interval from the run's start (0 unless a log
        # starts it later), exactly, so repeated additions cannot drift.
        self._origin = max(0.0, self._sim.now)
        self._sim.schedule(self._origin, self._monitor, _MONITOR)
        for job in jobs:
            self._sim.schedule(job.arrival_s, partial(self._select, job, ours), _SELECT)
        for ext in external:
            placed = _Placed(ext, ext.site, ext.submit_s)
            others.append(placed)
            self._sim.schedule(ext.submit_s, partial(self._reach_queue, placed), _REACH_QUEUE)
        if self._log is None:
            self._sim.run()
        else:
            # Logged jobs still queued or running when ours are done are not followed.
            while self._unfinished > 0 and self._sim.pending:
                self._sim.step()
        # Ours are recorded in input order, whatever order they were selected in.
        order = {job.name: index for index, job in enumerate(jobs)}
        ours.sort(key=lambda placed: order[placed.name])
        return SelectionRun(
            tuple(p.record() for p in ours),
            tuple(p.record() for p in others),
            tuple(self._reports),
        )

    def _state_key(self, stream: int) -> str:
        return self._configs[stream].state or f"stream:{stream}"

    def _select(self, job: SimJob, ours: list[_Placed]) -> None:
        config = self._configs[job.stream]
        state = self._states.setdefault(self._state_key(job.stream), _State())
        if config.view is View.SCHEDULERS:
            snapshots = [
                SiteSnapshot(c.name, c.processors, c.idle, c.site.slowness)
                for c in self._clusters.values()
            ]
        else:
            snapshots = [self._snapshot(site, state, config) for site in self._clusters.values()]
        request = JobRequest(job.name, job.processors, job.runtime_s)
        waits = None
        if config.wait_model is not None:
            waits = {
                name: self._forecast(job, cluster, state, config)
                for name, cluster in self._clusters.items()
                if cluster.processors >= job.processors
            }
        decision = select_site(
            request,
            snapshots,
            # Transfers are part of the hysteresis (docs/selection.md): none is costed.
            free_bandwidth,
            config.protocol,
            config.mode,
            rng=self._rngs[job.stream],
            waits=waits,
        )
        if decision.site is None:
            # Validation guarantees some site is large enough, so this is a model bug.
            raise SimulationError(f"job {job.name}: no site selected: {decision.reasons}")
        placed = _Placed(job, decision.site, self._sim.now, decision)
        ours.append(placed)
        state.placed.append(placed)
        state.names.add(job.name)
        self._sim.schedule_in(job.hysteresis_s, partial(self._reach_queue, placed), _REACH_QUEUE)

    def _forecast(
        self, job: SimJob, cluster: Cluster, state: _State, config: StreamConfig
    ) -> WaitForecast:
        """``config``'s wait model on ``cluster``'s true queue now, with the state's
        members selected there and not yet queued behind it (monitor view)."""
        now = self._sim.now
        runtime = job.runtime_s * cluster.site.slowness
        ahead: list[QueuedJob] = []
        if config.view is View.MONITOR and config.protocol.counts_in_flight:
            for p in state.placed:
                if p.site == cluster.name and p.queue_arrival_s is None:
                    own = p.job.runtime_s * cluster.site.slowness
                    ahead.append(QueuedJob(p.name, p.processors, p.arrival_s, own))
        model = self._model(config.wait_model or "", cluster.name)
        view = queue_view(cluster, now, ahead)
        return model.forecast(QueuedJob(job.name, job.processors, now, runtime), view)

    def _model(self, name: str, site: str) -> WaitModel:
        by_site = self._wait_models.get(name)
        if by_site is None or site not in by_site:
            raise SimulationError(f"no wait model {name!r} for site {site}")
        return by_site[site]

    def _snapshot(self, site: Cluster, state: _State, config: StreamConfig) -> SiteSnapshot:
        report = self._report[site.site.name]
        running = {j.job_id for j in report.jobs if j.state is JobState.RUNNING}
        pending = report.pending()
        in_flight: list[_Placed] = []
        if config.protocol.counts_in_flight:
            in_flight = [
                p
                for p in state.placed
                if p.site == site.site.name and p.end_s is None and p.name not in running
            ]
        finished = [p for p in state.placed if p.site == site.site.name and p.end_s is not None]
        return SiteSnapshot(
            site=site.site.name,
            total_processors=site.site.processors,
            idle_processors=report.idle_processors,
            slowness=site.site.slowness,
            in_flight_processors=sum(p.processors for p in in_flight),
            external_pending_processors=sum(
                j.processors for j in pending if j.job_id not in state.names
            ),
            pending_jobs=len(pending),
            mean_queue_wait_s=_mean(_waits(finished)),
            mean_runtime_s=_mean(_runtimes(finished)),
        )

    def _log_arrives(self, job: LocalJob) -> None:
        self._clusters[job.site].enqueue(local_work(job))

    def _reach_queue(self, placed: _Placed) -> None:
        placed.queue_arrival_s = self._sim.now
        site = self._clusters[placed.site]
        job = placed.job
        if isinstance(job, SimJob):
            # Our members ask for exactly their runtime there.
            duration, kind = job.runtime_s * site.site.slowness, Owner.GRID
            requested: float | None = duration
        else:
            duration, requested, kind = job.runtime_s, job.requested_s, Owner.LOCAL
        site.enqueue(
            Queued(
                placed.name,
                placed.processors,
                duration,
                kind,
                partial(self._start, placed),
                partial(self._end, placed),
                requested,
            )
        )

    def _start(self, placed: _Placed) -> None:
        placed.start_s = self._sim.now

    def _end(self, placed: _Placed) -> None:
        placed.end_s = self._sim.now
        self._unfinished -= 1
        if isinstance(placed.job, SimJob):
            self._ours_unfinished -= 1

    def _monitor(self) -> None:
        now = self._sim.now
        for name, site in self._clusters.items():
            jobs = [ObservedJob(h.holder, h.processors, JobState.RUNNING) for h in site.holdings()]
            jobs += [ObservedJob(q.name, q.processors, JobState.PENDING) for q in site.waiting()]
            report = SiteObservation(name, site.processors, site.idle, tuple(jobs), now)
            self._report[name] = report
            self._reports.append(report)
        # Stop once everything has completed, or the heap would never drain. Tick k is at
        # k * interval exactly, so repeated additions cannot drift.
        if self._unfinished > 0:
            self._ticks += 1
            at = self._origin + self._ticks * self._interval
            self._sim.schedule(at, self._monitor, _MONITOR)


def _waits(placed: Iterable[_Placed]) -> list[float]:
    return [
        p.start_s - p.queue_arrival_s
        for p in placed
        if p.start_s is not None and p.queue_arrival_s is not None
    ]


def _runtimes(placed: Iterable[_Placed]) -> list[float]:
    return [p.end_s - p.start_s for p in placed if p.end_s is not None and p.start_s is not None]


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None
