"""Bent et al.'s storage plans executed on the shared simulated cluster: a canonical
batch-pipeline workload run under All, AllBatch, Slice, Minimal or Remote, job by job.

Design, equations and the choices where a paper is ambiguous: ``docs/dataplan.md``
(section ``gridcore/sim/dataplan.py``).
"""

from __future__ import annotations

import abc
import enum
import math
import random
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from types import MappingProxyType

from gridcore.errors import ConfigError
from gridcore.policies.dataplan import (
    Environment,
    Strategy,
    Workload,
    all_batch_concurrency,
    check_feasibility,
    minimal_concurrency,
    serial_bandwidth,
)
from gridcore.policies.dataplan_stages import Stage, StageKind, plan_stages
from gridcore.sim.cluster import Cluster, Owner
from gridcore.sim.core import SimulationError, Simulator
from gridcore.sim.workload import SimSite, TraceEvent

SITE = "cluster"
"""The simulated cluster's name in the trace."""

_STEP = 0  # job steps and transfers
_RESET = 1  # node resets, after everything else at one instant


class WanSharing(enum.StrEnum):
    """How concurrent transfers share the WAN (docs/dataplan.md)."""

    SERIAL = "serial"  # one link, one transfer at a time, FIFO, at BW (Eq. 8)
    INDEPENDENT = "independent"  # every transfer at BW at once, as the models assume


class EventKind(enum.StrEnum):
    """What a :class:`~gridcore.sim.workload.TraceEvent` of this model records; ``job``
    names the volume, job, pipeline, node or group it concerns."""

    ALLOC = "alloc"  # a volume claimed (detail: its bytes)
    FREE = "free"  # a volume released (detail: its bytes)
    GROUP = "group"  # Slice / Minimal: a group begins at depth 0 (detail: its pipelines)
    BARRIER = "barrier"  # Slice / Minimal: every job of a depth is done (job: "depth d")
    START = "start"  # a job takes a processor (detail: its node)
    FETCH = "fetch"  # a batch volume is requested over the WAN (detail: the job that asks)
    CACHED = "cached"  # a fetched batch volume has arrived in the cluster's cache
    END = "end"  # a job is done (its output written)
    DONE = "done"  # a pipeline is done (its last output home)
    RESET = "reset"  # a node reset (job: "node k"; detail: the job it evicts, or "idle")
    EVICT = "evict"  # a job evicted by a reset
    LOST = "lost"  # a pipeline lost its private data (detail: how it restarts)


@dataclass(frozen=True)
class DataplanRun:
    """One run of a plan. ``makespan_s``: when the last pipeline's output reached home
    (``inf`` when the run stopped at its horizon, ``completed`` ``False``).
    ``batch_fetches``: batch volumes that crossed the WAN (by depth in
    ``batch_fetches_by_depth``; every job's batch read under Remote); ``wan_bytes``: bytes
    over the WAN in both directions, aborted transfers' sent part included;
    ``peak_storage_bytes``: the most bytes held at once, of ``storage_bytes`` (``S`` in
    whole bytes); ``peak_concurrency``: the most jobs running at once; ``busy_cpu_s``:
    processor-seconds held by jobs (their I/O included), ``evicted_cpu_s`` the part held
    by evicted jobs; ``jobs_run``: job executions that completed (``J`` without failures);
    ``failures``: node resets, ``evictions``: jobs they evicted, ``restarts``: pipelines
    that lost their data; ``groups``: Slice's slices or Minimal's groups (0 otherwise)."""

    strategy: Strategy
    seed: int
    wan: WanSharing
    completed: bool
    makespan_s: float
    batch_fetches: int
    batch_fetches_by_depth: tuple[int, ...]
    wan_bytes: float
    peak_storage_bytes: int
    storage_bytes: int
    peak_concurrency: int
    busy_cpu_s: float
    evicted_cpu_s: float
    jobs_run: int
    failures: int
    evictions: int
    restarts: int
    groups: int
    trace: tuple[TraceEvent, ...]


def simulate_dataplan(
    strategy: Strategy,
    workload: Workload,
    env: Environment,
    *,
    seed: int = 0,
    wan: WanSharing = WanSharing.SERIAL,
    resets: Sequence[tuple[float, int]] = (),
    horizon_s: float = math.inf,
    trace: bool = True,
    minimal_width: int | None = None,
) -> DataplanRun:
    """Run ``workload`` under ``strategy`` on ``env``'s cluster until every pipeline is
    done, or until ``horizon_s``. ``resets``: node resets ``(time, node)`` on top of the
    ones drawn at rate ``F``. ``trace=False`` keeps no trace (long sweeps).
    ``minimal_width``: Minimal's group width instead of Eq. 23's ``C`` (module
    docstring). The same inputs and ``seed`` give the same run. Raises
    :class:`ConfigError` before simulating when the strategy is infeasible for this
    workload and environment (Eq. 1-4)."""
    whole, whole_env = _whole_bytes(strategy, workload, env)
    _validate(env, resets, horizon_s)
    stages = _stage_plan(strategy, whole, whole_env, minimal_width)
    model = _Model(strategy, whole, whole_env, seed, wan, trace, stages)
    return model.run(resets, horizon_s)


def _whole_bytes(
    strategy: Strategy, workload: Workload, env: Environment
) -> tuple[Workload, Environment]:
    check = check_feasibility(strategy, workload, env)
    if not check.possible:
        raise ConfigError(f"cannot simulate {strategy.label}: {check.reason}")
    whole = replace(
        workload, S_B=float(math.ceil(workload.S_B)), S_P=float(math.ceil(workload.S_P))
    )
    whole_env = replace(env, S=float(math.floor(env.S)))
    check = check_feasibility(strategy, whole, whole_env)
    if not check.possible:
        raise ConfigError(f"cannot simulate {strategy.label} in whole bytes: {check.reason}")
    return whole, whole_env


def _stage_plan(
    strategy: Strategy, workload: Workload, env: Environment, minimal_width: int | None
) -> tuple[Stage, ...]:
    """The policy's stages for this run: Minimal's groups of Eq. 23's ``C`` or of
    ``minimal_width`` when that is a possible slice (Eq. 3 on that many pipelines)."""
    if minimal_width is not None:
        if strategy is not Strategy.MINIMAL:
            raise ConfigError(f"minimal_width applies to Minimal only, not {strategy.label}")
        if (
            isinstance(minimal_width, bool)
            or not isinstance(minimal_width, int)
            or minimal_width < 1
        ):
            raise ConfigError(f"minimal_width must be an integer >= 1, got {minimal_width!r}")
    stages = plan_stages(
        strategy,
        W=workload.W,
        D=workload.D,
        N_CPU=env.N_CPU,
        concurrency=_CONCURRENCY.get(strategy, _no_concurrency)(workload, env),
        group_width=minimal_width,
    )
    if minimal_width is not None:
        width = len(_jobs_stages(stages)[0].pipelines)
        check = check_feasibility(Strategy.SLICE, replace(workload, W=width), env)
        if not check.possible:
            raise ConfigError(
                f"minimal_width {width}: a partial slice that does not fit: {check.reason}"
            )
    return stages


# The C a stage plan runs at where it reads one (AllBatch Eq. 15, Minimal Eq. 23).
_CONCURRENCY: Mapping[Strategy, Callable[[Workload, Environment], float]] = MappingProxyType(
    {Strategy.ALL_BATCH: all_batch_concurrency, Strategy.MINIMAL: minimal_concurrency}
)


def _no_concurrency(workload: Workload, env: Environment) -> float:
    return 1.0  # plan_stages reads no C for All, Slice and Remote


def _jobs_stages(stages: Sequence[Stage]) -> list[Stage]:
    # The stages that run jobs, one per group and depth (one in all when pipelined).
    return [stage for stage in stages if stage.kind is StageKind.JOBS]


def _validate(env: Environment, resets: Sequence[tuple[float, int]], horizon_s: float) -> None:
    if not horizon_s > 0:
        raise ConfigError(f"horizon_s must be > 0, got {horizon_s}")
    for at, node in resets:
        if not (math.isfinite(at) and at >= 0) or not 0 <= node < env.N_CPU:
            raise ConfigError(
                f"reset ({at}, {node}): needs a finite time >= 0 and a node in 0..{env.N_CPU - 1}"
            )


# -- the model's state ---------------------------------------------------------------------


@dataclass(eq=False)
class _Transfer:
    nbytes: int
    on_done: Callable[[], object]
    started_s: float | None = None
    finished: bool = False


class _Wan:
    """The link between the home server and the cluster (:class:`WanSharing`)."""

    def __init__(self, sim: Simulator, bandwidth: float, sharing: WanSharing) -> None:
        self._sim = sim
        self._bandwidth = bandwidth
        self._serial = sharing is WanSharing.SERIAL
        self._queue: deque[_Transfer] = deque()
        self._busy: _Transfer | None = None
        self.bytes_sent = 0.0

    def send(self, nbytes: int, on_done: Callable[[], object]) -> _Transfer:
        transfer = _Transfer(nbytes, on_done)
        if self._serial:
            self._queue.append(transfer)
            self._serve()
        else:
            self._begin(transfer)
        return transfer

    def cancel(self, transfer: _Transfer) -> None:
        """Abort ``transfer``: withdrawn if still queued; the part already sent counts."""
        if transfer.finished:
            return
        transfer.finished = True
        if transfer.started_s is None:
            self._queue.remove(transfer)
            return
        self.bytes_sent += (self._sim.now - transfer.started_s) * self._bandwidth
        if self._busy is transfer:
            self._busy = None
            self._serve()

    def _serve(self) -> None:
        if self._busy is None and self._queue:
            self._busy = self._queue.popleft()
            self._begin(self._busy)

    def _begin(self, transfer: _Transfer) -> None:
        transfer.started_s = self._sim.now
        delay = transfer.nbytes / self._bandwidth
        self._sim.schedule_in(delay, partial(self._arrive, transfer), _STEP)

    def _arrive(self, transfer: _Transfer) -> None:
        if transfer.finished:
            return  # aborted
        transfer.finished = True
        self.bytes_sent += transfer.nbytes
        if self._busy is transfer:
            self._busy = None
            self._serve()  # the next transfer is on the link before anyone asks again
        transfer.on_done()


@dataclass(eq=False)
class _Pipeline:
    index: int
    depth: int = 0  # the depth of its next job; D once done
    node: int | None = None  # where its private data is (None: none at the cluster)
    volumes: set[int] = field(default_factory=set)  # private volumes it holds
    job: _Job | None = None

    @property
    def name(self) -> str:
        return f"p{self.index}"


@dataclass(eq=False)
class _Job:
    pipeline: _Pipeline
    depth: int
    node: int
    runtime_s: float
    started_s: float
    alive: bool = True
    transfer: _Transfer | None = None

    @property
    def name(self) -> str:
        return f"{self.pipeline.name}d{self.depth}"


@dataclass(eq=False)
class _Batch:
    """A batch volume's data at the cluster: cached, being fetched, or absent."""

    cached: bool = False
    fetch: _Transfer | None = None
    waiters: list[_Job] = field(default_factory=list)


def _batch_name(depth: int) -> str:
    return f"B{depth}"


def _private_name(pipeline: _Pipeline, volume: int) -> str:
    return f"P{pipeline.index}.{volume}"


# -- the model -----------------------------------------------------------------------------


class _Model:
    def __init__(
        self,
        strategy: Strategy,
        workload: Workload,
        env: Environment,
        seed: int,
        wan: WanSharing,
        trace: bool,
        stages: Sequence[Stage],
    ) -> None:
        self.strategy = strategy
        self.stages = tuple(stages)
        self.workload = workload
        self.env = env
        self.D = workload.D
        self.S_B = int(workload.S_B)
        self.S_P = int(workload.S_P)
        self.S = int(env.S)
        self._seed = seed
        self._sharing = wan
        self._tracing = trace
        self.sim = Simulator()
        self.cluster = Cluster(self.sim, SimSite(SITE, env.N_CPU, storage_bytes=self.S), _STEP)
        self._wan = _Wan(self.sim, serial_bandwidth(env), wan)
        self._runtimes = random.Random(f"gridcore.sim.dataplan:runtimes:{seed}")
        self._failures = random.Random(f"gridcore.sim.dataplan:failures:{seed}")
        self.pipelines = [_Pipeline(p) for p in range(workload.W)]
        self._first_runtime = {
            (p, d): self._draw_runtime() for p in range(workload.W) for d in range(workload.D)
        }
        self._nodes: list[_Job | None] = [None] * env.N_CPU
        self._batches = [_Batch() for _ in range(workload.D)]
        self.held: set[str] = set()
        self._trace: list[TraceEvent] = []
        self._unfinished = workload.W
        self._makespan = math.inf
        self.peak_storage = 0
        self.fetches = [0] * workload.D
        self.groups = 0
        self._evicted_cpu_s = 0.0
        self._jobs_run = 0
        self._resets = 0
        self._evictions = 0
        self._restarts = 0
        self.rule = _RULES[strategy](self)

    # -- the run -----------------------------------------------------------------------------

    def run(self, resets: Sequence[tuple[float, int]], horizon_s: float) -> DataplanRun:
        for at, node in resets:
            self.sim.schedule(at, partial(self._reset, node), _RESET)
        self._next_failure()
        self.rule.begin()
        self.dispatch()
        self._check()
        while self._unfinished and self.sim.peek() < horizon_s:
            self.sim.step()
            self._check()
        if self._unfinished and not self.sim.pending:
            raise SimulationError(f"{self.strategy.label}: no event left with pipelines unfinished")
        self.cluster.close()
        return self._result()

    def _result(self) -> DataplanRun:
        return DataplanRun(
            strategy=self.strategy,
            seed=self._seed,
            wan=self._sharing,
            completed=not self._unfinished,
            makespan_s=self._makespan,
            batch_fetches=sum(self.fetches),
            batch_fetches_by_depth=tuple(self.fetches),
            wan_bytes=self._wan.bytes_sent,
            peak_storage_bytes=self.peak_storage,
            storage_bytes=self.S,
            peak_concurrency=self.cluster.peak,
            busy_cpu_s=self.cluster.busy_s(Owner.GRID),
            evicted_cpu_s=self._evicted_cpu_s,
            jobs_run=self._jobs_run,
            failures=self._resets,
            evictions=self._evictions,
            restarts=self._restarts,
            groups=self.groups,
            trace=tuple(self._trace),
        )

    def _check(self) -> None:
        used = self.S - self.cluster.free_bytes
        if not 0 <= used <= self.S:
            raise SimulationError(f"storage in use {used} B outside 0..S = {self.S} B")
        busy = sum(1 for job in self._nodes if job is not None)
        if busy != self.cluster.processors - self.cluster.idle:
            raise SimulationError(f"{busy} nodes run jobs, the cluster counts otherwise")

    def log(self, kind: EventKind, job: str, detail: str = "", processors: int = 0) -> None:
        if self._tracing:
            site = SITE if processors else ""
            self._trace.append(TraceEvent(self.sim.now, kind, job, site, processors, detail))

    # -- storage -----------------------------------------------------------------------------

    def claim(self, volume: str, nbytes: int) -> None:
        if not self.cluster.claim_storage(volume, nbytes):
            raise SimulationError(
                f"{self.strategy.label}: {volume} ({nbytes} B) refused with"
                f" {self.cluster.free_bytes} B free of {self.S} B: the storage rule was broken"
            )
        self.held.add(volume)
        self.peak_storage = max(self.peak_storage, self.S - self.cluster.free_bytes)
        self.log(EventKind.ALLOC, volume, str(nbytes))

    def free(self, volume: str) -> None:
        if volume not in self.held:
            raise SimulationError(f"{self.strategy.label}: {volume} released but not held")
        self.held.discard(volume)
        self.log(EventKind.FREE, volume, str(self.cluster.release_storage(volume)))

    def claim_batch(self, depth: int) -> None:
        self.claim(_batch_name(depth), self.S_B)

    def free_batch(self, depth: int) -> None:
        """Release a batch volume: its data leaves the cache (a fetch under way stops)."""
        batch = self._batches[depth]
        if batch.fetch is not None:
            self._wan.cancel(batch.fetch)
        self._batches[depth] = _Batch()
        self.free(_batch_name(depth))

    def claim_private(self, pipeline: _Pipeline, volume: int) -> None:
        self.claim(_private_name(pipeline, volume), self.S_P)
        pipeline.volumes.add(volume)

    def free_private(self, pipeline: _Pipeline, volume: int) -> None:
        pipeline.volumes.discard(volume)
        self.free(_private_name(pipeline, volume))

    def free_privates(self, pipeline: _Pipeline) -> None:
        for volume in sorted(pipeline.volumes):
            self.free_private(pipeline, volume)

    # -- starting jobs -----------------------------------------------------------------------

    def dispatch(self) -> None:
        """Start every job the strategy allows now, in its order, while processors last."""
        for pipeline in self.rule.candidates():
            if self.cluster.idle == 0:
                return
            if pipeline.job is not None or pipeline.depth >= self.D:
                continue
            missing = self._missing(pipeline)
            if not self.rule.may_start(pipeline, len(missing) * self.S_P):
                return  # every later candidate needs as many bytes (the rules' candidates)
            for volume in missing:
                self.claim_private(pipeline, volume)
            self._start(pipeline)

    def _missing(self, pipeline: _Pipeline) -> list[int]:
        if not self.rule.stores_data:
            return []
        wanted = (pipeline.depth, pipeline.depth + 1)
        return [v for v in wanted if v not in pipeline.volumes]

    def _start(self, pipeline: _Pipeline) -> None:
        node = pipeline.node
        if node is None or self._nodes[node] is not None:
            node = self._nodes.index(None)
        depth = pipeline.depth
        job = _Job(pipeline, depth, node, self._runtime(pipeline.index, depth), self.sim.now)
        self._require_volumes(job)
        self.cluster.claim(job.name, 1, Owner.GRID)
        self._nodes[node] = job
        pipeline.job = job
        if self.rule.stores_data:
            pipeline.node = node  # its input is staged here, its output written here
        self.log(EventKind.START, job.name, f"node {node}", processors=1)
        self._stage_batch(job)

    def _require_volumes(self, job: _Job) -> None:
        if not self.rule.stores_data:
            return
        p = job.pipeline
        needed = (
            _batch_name(job.depth),
            _private_name(p, job.depth),
            _private_name(p, job.depth + 1),
        )
        absent = [name for name in needed if name not in self.held]
        if absent:
            raise SimulationError(f"{job.name} would start without {', '.join(absent)}")

    def _runtime(self, pipeline: int, depth: int) -> float:
        first = self._first_runtime.pop((pipeline, depth), None)
        return self._draw_runtime() if first is None else first

    def _draw_runtime(self) -> float:
        mean, sd = self.workload.R_bar, self.workload.SD_R
        if sd == 0:
            return mean
        while True:  # truncated > 0 by redrawing; accepted with probability >= 1/2
            runtime = self._runtimes.normalvariate(mean, sd)
            if runtime > 0:
                return runtime

    # -- a job's steps (Eq. 6: batch, input, compute, output) ------------------------------

    def _stage_batch(self, job: _Job) -> None:
        depth = job.depth
        if not self.rule.caches_batch:
            self.log(EventKind.FETCH, _batch_name(depth), job.name)
            job.transfer = self._wan.send(self.S_B, partial(self._remote_batch, job))
            return
        batch = self._batches[depth]
        if batch.cached:
            self._after(job, self.S_B / self.env.BW_L, self._stage_input)
            return
        batch.waiters.append(job)
        if batch.fetch is None:
            self.log(EventKind.FETCH, _batch_name(depth), job.name)
            batch.fetch = self._wan.send(self.S_B, partial(self._batch_arrived, depth))

    def _remote_batch(self, job: _Job) -> None:
        self.fetches[job.depth] += 1
        self._transferred(job, self._stage_input)

    def _batch_arrived(self, depth: int) -> None:
        batch = self._batches[depth]
        batch.fetch, batch.cached = None, True
        self.fetches[depth] += 1
        self.log(EventKind.CACHED, _batch_name(depth))
        waiters, batch.waiters = batch.waiters, []
        for job in waiters:
            if job.alive:
                self._stage_input(job)  # it read the volume as it arrived

    def _stage_input(self, job: _Job) -> None:
        if job.depth == 0 or not self.rule.stores_data:
            job.transfer = self._wan.send(self.S_P, partial(self._transferred, job, self._compute))
        else:
            self._after(job, self.S_P / self.env.BW_L, self._compute)

    def _compute(self, job: _Job) -> None:
        self._after(job, job.runtime_s, self._stage_output)

    def _stage_output(self, job: _Job) -> None:
        if job.depth == self.D - 1 or not self.rule.stores_data:
            job.transfer = self._wan.send(self.S_P, partial(self._transferred, job, self._end))
        else:
            self._after(job, self.S_P / self.env.BW_L, self._end)

    def _after(self, job: _Job, delay: float, step: Callable[[_Job], None]) -> None:
        self.sim.schedule_in(delay, partial(self._resume, job, step), _STEP)

    def _resume(self, job: _Job, step: Callable[[_Job], None]) -> None:
        if job.alive:
            step(job)

    def _transferred(self, job: _Job, step: Callable[[_Job], None]) -> None:
        job.transfer = None
        step(job)

    def _end(self, job: _Job) -> None:
        self._vacate(job)
        self._jobs_run += 1
        pipeline = job.pipeline
        pipeline.depth += 1
        self.log(EventKind.END, job.name, f"node {job.node}", processors=1)
        self.rule.job_done(pipeline, job.depth)
        if pipeline.depth == self.D:
            pipeline.node = None  # its last output is home
            self._unfinished -= 1
            self.log(EventKind.DONE, pipeline.name)
        self.rule.progress()
        if not self._unfinished:
            self._makespan = self.sim.now
            self.rule.end()
            return
        self.dispatch()

    def _vacate(self, job: _Job) -> None:
        job.alive = False
        self.cluster.release(job.name, Owner.GRID)
        self._nodes[job.node] = None
        job.pipeline.job = None

    # -- failures ------------------------------------------------------------------------------

    def _next_failure(self) -> None:
        if self.env.F > 0:
            gap = self._failures.expovariate(self.env.F)
            self.sim.schedule_in(gap, self._drawn_reset, _RESET)

    def _drawn_reset(self) -> None:
        self._reset(self._failures.randrange(self.env.N_CPU))
        self._next_failure()

    def _reset(self, node: int) -> None:
        if not self._unfinished:
            return
        self._resets += 1
        job = self._nodes[node]
        self.log(EventKind.RESET, f"node {node}", "idle" if job is None else job.name)
        if job is not None:
            self._evict(job)
        for pipeline in self.pipelines:
            if pipeline.node == node and pipeline.depth < self.D:
                self._lose(pipeline)
        self.rule.progress()
        self.dispatch()

    def _evict(self, job: _Job) -> None:
        if job.transfer is not None:
            self._wan.cancel(job.transfer)
        self._vacate(job)
        self._evictions += 1
        self._evicted_cpu_s += self.sim.now - job.started_s
        self.log(EventKind.EVICT, job.name, f"node {job.node}", processors=1)

    def _lose(self, pipeline: _Pipeline) -> None:
        self._restarts += 1
        pipeline.node = None
        pipeline.depth = 0
        self.log(EventKind.LOST, pipeline.name, self.rule.lost(pipeline))


# -- the strategies' rules (Sec. 2, Fig. 2) ----------------------------------------------------


class _Rule(abc.ABC):
    """What one strategy decides; the model does the rest. ``stores_data``: private data
    lives at the cluster (all but Remote); ``caches_batch``: batch volumes are cached."""

    stores_data = True
    caches_batch = True

    def __init__(self, model: _Model) -> None:
        self.m = model

    def begin(self) -> None:  # noqa: B027 (a hook: by default nothing to do)
        """The claims made before anything runs."""

    @abc.abstractmethod
    def candidates(self) -> Iterator[_Pipeline]:
        """Pipelines whose next job may start now, in the order they are tried; once one
        may not start (:meth:`may_start`), none after it could: they need at least as
        many bytes."""

    @abc.abstractmethod
    def may_start(self, pipeline: _Pipeline, missing_bytes: int) -> bool:
        """Whether ``pipeline``'s next job may claim ``missing_bytes`` more and start."""

    def job_done(self, pipeline: _Pipeline, depth: int) -> None:  # noqa: B027 (a hook: by default nothing to do)
        """Releases after ``pipeline``'s job at ``depth`` (its depth already advanced)."""

    def progress(self) -> None:  # noqa: B027 (a hook: by default nothing to do)
        """After a job's end or a reset: barriers, groups, admissions."""

    @abc.abstractmethod
    def lost(self, pipeline: _Pipeline) -> str:
        """``pipeline`` lost its private data (depth already 0); returns how it restarts."""

    def end(self) -> None:  # noqa: B027 (a hook: by default nothing to do)
        """Releases once every pipeline is done."""


class _PipelinedRule(_Rule):
    """All, AllBatch and Remote: no barriers; admitted pipelines first (depth-first), in
    the order they were admitted, then new pipelines in index order. An admitted
    pipeline may always go on (its room is its own); new ones all need the same room, so
    when the first waiting one does not fit, none does."""

    def __init__(self, model: _Model) -> None:
        super().__init__(model)
        self.admitted: list[_Pipeline] = []
        (jobs,) = _jobs_stages(model.stages)  # every pipeline, depth-first
        self.waiting: deque[_Pipeline] = deque(model.pipelines[p] for p in jobs.pipelines)

    def candidates(self) -> Iterator[_Pipeline]:
        yield from list(self.admitted)
        while self.waiting:
            yield self.waiting[0]  # admitted (popped) or the dispatch stops here

    def may_start(self, pipeline: _Pipeline, missing_bytes: int) -> bool:
        if pipeline in self.admitted:
            return True
        if self.waiting[0] is not pipeline:
            raise SimulationError(f"{pipeline.name} is neither admitted nor next to admit")
        if not self.admits(missing_bytes):
            return False
        self.admitted.append(self.waiting.popleft())
        return True

    def admits(self, missing_bytes: int) -> bool:
        return True

    def progress(self) -> None:
        self.admitted = [p for p in self.admitted if p.depth < self.m.D]


class _AllRule(_PipelinedRule):
    """Every volume claimed at time 0, released at the end (Eq. 1)."""

    def begin(self) -> None:
        for depth in range(self.m.D):
            self.m.claim_batch(depth)
        for pipeline in self.m.pipelines:
            for volume in range(self.m.D + 1):
                self.m.claim_private(pipeline, volume)

    def lost(self, pipeline: _Pipeline) -> str:
        return "restarts at depth 0 in its volumes"

    def end(self) -> None:
        for pipeline in self.m.pipelines:
            self.m.free_privates(pipeline)
        for depth in range(self.m.D):
            self.m.free_batch(depth)


class _AllBatchRule(_PipelinedRule):
    """Every batch volume for the whole run; a private pair per admitted pipeline (Eq. 2,
    Eq. 15)."""

    def begin(self) -> None:
        for depth in range(self.m.D):
            self.m.claim_batch(depth)

    def admits(self, missing_bytes: int) -> bool:
        # Admitted pipelines are tried first, so the volume one frees between two of its
        # jobs is its own again before a new pipeline is considered: a free pair is one
        # no admitted pipeline will need.
        return self.m.cluster.free_bytes >= missing_bytes

    def job_done(self, pipeline: _Pipeline, depth: int) -> None:
        _release_used(self.m, pipeline, depth)

    def lost(self, pipeline: _Pipeline) -> str:
        self.m.free_privates(pipeline)
        return "restarts at depth 0, batch from the cache"

    def end(self) -> None:
        for depth in range(self.m.D):
            self.m.free_batch(depth)


class _RemoteRule(_PipelinedRule):
    """Nothing stored: every read and write over the WAN."""

    stores_data = False
    caches_batch = False

    def lost(self, pipeline: _Pipeline) -> str:
        raise SimulationError("Remote stores no private data to lose")


class _GroupRule(_Rule):
    """Slice and Minimal: groups of pipelines, one depth at a time with a barrier between
    depths; each depth's batch volume claimed for the depth and released after it. The
    groups are the stage plan's, in its order (Slice: one of every pipeline; Minimal:
    Eq. 23's ``C`` or the width asked); pipelines that lost their data past depth 0 form
    further groups of at most that width, after the plan's."""

    def __init__(self, model: _Model) -> None:
        super().__init__(model)
        first_depth = [s for s in _jobs_stages(model.stages) if s.depths == (0,)]
        self.waiting: deque[_Pipeline] = deque(
            model.pipelines[p] for stage in first_depth for p in stage.pipelines
        )
        self.width = len(first_depth[0].pipelines)
        self.group: list[_Pipeline] | None = None
        self.depth = 0

    def begin(self) -> None:
        self._next_group()

    def candidates(self) -> Iterator[_Pipeline]:
        # Every candidate of one depth needs the same: two volumes at depth 0 (nobody at
        # depth 0 holds one while not running), one (its output) later.
        if self.group is not None:
            yield from (p for p in self.group if p.depth == self.depth)

    def may_start(self, pipeline: _Pipeline, missing_bytes: int) -> bool:
        return missing_bytes <= self.m.cluster.free_bytes

    def job_done(self, pipeline: _Pipeline, depth: int) -> None:
        _release_used(self.m, pipeline, depth)

    def progress(self) -> None:
        while self.group is not None and all(p.depth > self.depth for p in self.group):
            if self.group and self.depth < self.m.D - 1:
                self.m.log(EventKind.BARRIER, f"depth {self.depth}")
                self.m.free_batch(self.depth)
                self.depth += 1
                self.m.claim_batch(self.depth)
            else:
                self.m.free_batch(self.depth)
                self._next_group()

    def lost(self, pipeline: _Pipeline) -> str:
        self.m.free_privates(pipeline)
        if self.depth == 0 or self.group is None:
            return "redoes depth 0 in its group"
        self.group.remove(pipeline)
        self.waiting.append(pipeline)
        return "re-runs in a later group"

    def _next_group(self) -> None:
        if not self.waiting:
            self.group = None
            return
        take = min(self.width, len(self.waiting))
        self.group = [self.waiting.popleft() for _ in range(take)]
        self.depth = 0
        self.m.groups += 1
        self.m.log(EventKind.GROUP, f"group {self.m.groups}", ",".join(p.name for p in self.group))
        self.m.claim_batch(0)


def _release_used(model: _Model, pipeline: _Pipeline, depth: int) -> None:
    """A job's input is used up; at the last depth its output has gone home too."""
    model.free_private(pipeline, depth)
    if depth == model.D - 1:
        model.free_private(pipeline, depth + 1)


_RULES: Mapping[Strategy, Callable[[_Model], _Rule]] = MappingProxyType(
    {
        Strategy.ALL: _AllRule,
        Strategy.ALL_BATCH: _AllBatchRule,
        Strategy.SLICE: _GroupRule,
        Strategy.MINIMAL: _GroupRule,
        Strategy.REMOTE: _RemoteRule,
    }
)
