"""The one simulated cluster every model runs on, and the other users who load it.

A :class:`Cluster` is to the models what a SimPy resource is to SimPy processes: the
selection model (``sim/selection.py``), the KOALA claiming model (``sim/claiming.py``) and
the co-allocation placement model (``sim/coallocation.py``) all count processors and bytes
here, never on their own:

* **Holdings**: every holder of processors or storage bytes is a named row with a kind
  (:class:`Owner`), as in the live capacity ledger. A claim beyond the idle
  processors is a model bug (:class:`~gridcore.sim.core.SimulationError`); a storage
  claim beyond the free bytes is refused (``False``), as a full disk refuses a write.
* **The local queue** is strict FIFO by default: its head starts as soon as enough
  processors are idle, and nothing overtakes it (no backfill). With
  :attr:`QueuePolicy.EASY` (used where other users' load is a real log, whose machines ran
  EASY) it backfills as EASY does (Lifka 1995; Mu'alem and Feitelson 2001): the blocked
  head gets a reservation at the earliest instant the running work's requested end times
  free enough processors for it, and a later job starts now if it fits now and does not
  delay that reservation (it ends, by its requested time, before it, or it uses only
  processors the head does not need then). Only work with a known requested time
  backfills; when work of unknown end holds processors the head needs, the reservation is
  unknown and nothing backfills. Work started from the queue ends by itself after its
  duration; a model's claims (KOALA's components) bypass it, as a claim never waits.
* **Releases never start the queue**: the model calls :meth:`Cluster.start_queued` when
  it is done, so a preemptor takes the processors its victims free before other users
  (:meth:`Cluster.preempt`), and several releases at one instant start the queues in the
  model's order.
* **A scheduler interval** (optional, :class:`ScheduleTicks`): the queue is then started
  only on ticks at ``phase_s + k * interval_s``, as Slurm's builtin scheduler with
  ``SchedulerParameters=defer,sched_interval=N`` starts nothing between its periodic
  passes; :meth:`Cluster.start_queued` then asks for the next tick instead of starting.
  Work may hold its processors until the model releases it (``duration_s=None``, a
  pilot) and may leave the queue before it starts (:meth:`Cluster.withdraw`).
* **Busy-time integrals**: processor-seconds per kind of holder and byte-seconds of
  storage, integrated at every change (and by :meth:`Cluster.close`), plus the peak of
  processors in use.

:class:`OtherUsers` draws another user's jobs from one
:class:`~gridcore.sim.workload.BackgroundLoad` and submits them: queued FIFO at their
cluster, or admitted at once or dropped (the band-controlled load of e-Science 2006).
"""

from __future__ import annotations

import enum
import math
import random
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from gridcore.sim.core import SimulationError, Simulator
from gridcore.sim.workload import BackgroundLoad, LocalJob, SimSite

Hook = Callable[[], object]


class Owner(enum.StrEnum):
    GRID = "grid"  # the modelled scheduler's jobs and components
    LOCAL = "local"  # other users' jobs, submitted to the cluster's own queue


class QueuePolicy(enum.StrEnum):
    FIFO = "fifo"  # strict first come, first served: nothing overtakes the head
    EASY = "easy"  # EASY backfilling: the head's reservation, later jobs fill around it


class Admission(enum.Enum):
    QUEUE = "queue"  # wait in the cluster's FIFO local queue
    DROP = "drop"  # start at once, or never (the band-controlled load)


@dataclass(frozen=True)
class Holding:
    holder: str
    processors: int
    kind: Owner


@dataclass(frozen=True)
class ScheduleTicks:
    """A cluster whose scheduler starts queued work only every ``interval_s`` seconds,
    at ``phase_s + k * interval_s`` (``0 <= phase_s < interval_s``); the ticks run at
    event ``priority``."""

    interval_s: float
    phase_s: float = 0.0
    priority: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise SimulationError(f"scheduler interval must be > 0 s, got {self.interval_s}")
        if not 0.0 <= self.phase_s < self.interval_s:
            raise SimulationError(
                f"scheduler phase must be in [0, {self.interval_s}), got {self.phase_s}"
            )

    def next_tick(self, now: float) -> float:
        """The first tick at or after ``now``."""
        k = math.ceil((now - self.phase_s) / self.interval_s - 1e-9)
        return self.phase_s + max(0, k) * self.interval_s


@dataclass(frozen=True)
class Queued:
    """Work waiting in a local queue, and what to call when it starts and ends;
    ``duration_s`` ``None``: it holds its processors until the model releases them.
    ``requested_s``: the time it asked for (its time limit), which an EASY queue plans
    with; ``None``: not known, so it never backfills."""

    name: str
    processors: int
    duration_s: float | None
    kind: Owner
    on_start: Hook | None = None
    on_end: Hook | None = None
    requested_s: float | None = None
    submitted_s: float | None = None  # when it was submitted (None: when it was queued)
    user: int | None = None


class Watcher(Protocol):
    """Hears of work run from a cluster's queue (a wait model's history)."""

    def started(self, work: Queued, submitted_s: float, started_s: float) -> None: ...

    def ended(self, work: Queued, started_s: float, ended_s: float) -> None: ...


@dataclass(frozen=True)
class Running:
    """A holder of processors as a scheduler sees it: since when, and until when it
    asked for (``None``: unknown, a claim or a pilot without a limit)."""

    holder: str
    processors: int
    kind: Owner
    started_s: float
    requested_end_s: float | None


@dataclass
class _Integral:
    value: float = 0.0


class Cluster:
    """One site's processors, storage, local queue (FIFO or EASY) and busy-time
    integrals."""

    def __init__(
        self,
        sim: Simulator,
        site: SimSite,
        end_priority: int = 0,
        ticks: ScheduleTicks | None = None,
        policy: QueuePolicy = QueuePolicy.FIFO,
    ) -> None:
        self.site = site
        self.ticks = ticks
        self.policy = policy
        self._tick_pending = False
        self.name = site.name
        self.processors = site.processors
        self._sim = sim
        self._end_priority = end_priority
        # Keyed by kind too: another user may name a job as the model names its own.
        self._held: dict[tuple[Owner, str], Holding] = {}
        # When each holder started and until when it asked for (EASY plans with it).
        self._times: dict[tuple[Owner, str], tuple[float, float | None]] = {}
        self._submitted: dict[tuple[Owner, str], float] = {}
        self._work: dict[tuple[Owner, str], Queued] = {}
        self._watchers: list[Watcher] = []
        self._used: Counter[Owner] = Counter()
        self._stored: dict[str, int] = {}
        self._queue: deque[Queued] = deque()
        self._busy = {kind: _Integral() for kind in Owner}
        self._byte_s = _Integral()
        self._since = sim.now
        self.peak = 0
        self.started: Counter[Owner] = Counter()
        self.preempted = 0

    @property
    def idle(self) -> int:
        return self.site.processors - sum(self._used.values())

    def used(self, kind: Owner) -> int:
        return self._used[kind]

    def holdings(self) -> tuple[Holding, ...]:
        """Processor holders in the order they claimed."""
        return tuple(self._held.values())

    def waiting(self) -> tuple[Queued, ...]:
        """The local queue, head first."""
        return tuple(self._queue)

    def running(self) -> tuple[Running, ...]:
        """Processor holders in the order they claimed, with their times."""
        return tuple(
            Running(h.holder, h.processors, h.kind, *self._times[h.kind, h.holder])
            for h in self._held.values()
        )

    # -- processors ----------------------------------------------------------------------

    def claim(
        self,
        holder: str,
        processors: int,
        kind: Owner,
        requested_s: float | None = None,
        started_s: float | None = None,
    ) -> None:
        """``holder`` takes ``processors`` idle processors now, for ``requested_s``
        seconds if it says (an EASY queue plans with that; ``None``: unknown) from
        ``started_s`` (default now: earlier for work already running when a run starts)."""
        if (kind, holder) in self._held:
            raise SimulationError(f"site {self.name}: {kind} {holder} already holds processors")
        if not 0 < processors <= self.idle:
            raise SimulationError(
                f"site {self.name}: {processors} processors taken, only {self.idle} idle"
            )
        self._integrate()
        self._held[kind, holder] = Holding(holder, processors, kind)
        start = self._sim.now if started_s is None else started_s
        end = None if requested_s is None else start + requested_s
        self._times[kind, holder] = (start, end)
        self._used[kind] += processors
        self.peak = max(self.peak, sum(self._used.values()))

    def release(self, holder: str, kind: Owner) -> int:
        """``holder`` gives its processors back; returns how many. The local queue waits
        for :meth:`start_queued`."""
        holding = self._held.pop((kind, holder), None)
        if holding is None:
            raise SimulationError(f"site {self.name}: {kind} {holder} holds no processors")
        started, _ = self._times.pop((kind, holder))
        work = self._work.pop((kind, holder), None)
        self._submitted.pop((kind, holder), None)
        if work is not None:
            for watcher in self._watchers:
                watcher.ended(work, started, self._sim.now)
        self._integrate()
        self._used[holding.kind] -= holding.processors
        return holding.processors

    def preempt(self, holders: Iterable[str], kind: Owner) -> int:
        """Release ``holders`` for a preemptor, who claims the processors before the local
        queue sees them (call :meth:`start_queued` after its claims)."""
        freed = 0
        for holder in holders:
            freed += self.release(holder, kind)
            self.preempted += 1
        return freed

    def close(self) -> None:
        """Bring the integrals up to now (the end of a run)."""
        self._integrate()

    def busy_s(self, kind: Owner) -> float:
        """Processor-seconds held by ``kind`` up to the last change or :meth:`close`."""
        return self._busy[kind].value

    # -- storage ---------------------------------------------------------------------------

    @property
    def free_bytes(self) -> int:
        return self.site.storage_bytes - sum(self._stored.values())

    def claim_storage(self, holder: str, nbytes: int) -> bool:
        """``holder`` stores ``nbytes`` more; refused (``False``, nothing held) when they
        exceed the free bytes."""
        if nbytes < 0:
            raise SimulationError(f"site {self.name}: {holder} claims {nbytes} bytes")
        if nbytes > self.free_bytes:
            return False
        self._integrate()
        self._stored[holder] = self._stored.get(holder, 0) + nbytes
        return True

    def release_storage(self, holder: str) -> int:
        """Every byte ``holder`` stores is freed; returns how many."""
        self._integrate()
        return self._stored.pop(holder, 0)

    def stored(self, holder: str) -> int:
        return self._stored.get(holder, 0)

    @property
    def stored_byte_s(self) -> float:
        """Byte-seconds of storage held up to the last change or :meth:`close`."""
        return self._byte_s.value

    # -- the local queue -------------------------------------------------------------------

    def enqueue(self, work: Queued) -> None:
        """``work`` joins the tail of the local queue, which then starts what fits."""
        self._submitted[work.kind, work.name] = (
            self._sim.now if work.submitted_s is None else work.submitted_s
        )
        self._queue.append(work)
        self.start_queued()

    def watch(self, watcher: Watcher) -> None:
        """``watcher`` hears of every start and end of work run from the queue."""
        self._watchers.append(watcher)

    def submitted_at(self, work: Queued) -> float:
        """When queued ``work`` (or work run from the queue) was submitted."""
        return self._submitted.get((work.kind, work.name), self._sim.now)

    def started_work(self) -> tuple[tuple[Queued, float, float | None], ...]:
        """Work started from the queue and still running: (work, start, requested end)."""
        return tuple((work, *self._times[key]) for key, work in self._work.items())

    def start_queued(self) -> None:
        """Start the queue's head while it fits, then (EASY) backfill around it; with a
        scheduler interval, at the next tick."""
        if self.ticks is None:
            self._start_fitting()
        elif self._queue and not self._tick_pending:
            self._tick_pending = True
            at = self.ticks.next_tick(self._sim.now)
            self._sim.schedule(at, self._tick, self.ticks.priority)

    def withdraw(self, name: str, kind: Owner) -> bool:
        """Take queued ``name`` out of the queue before it starts (a cancelled job);
        ``False`` if it is not queued. Call :meth:`start_queued` after: the head may
        have changed."""
        for work in self._queue:
            if work.name == name and work.kind is kind:
                self._queue.remove(work)
                self._submitted.pop((kind, name), None)
                return True
        return False

    def run_now(self, work: Queued, started_s: float | None = None) -> None:
        """Start ``work`` at once (it must fit); it ends by itself after its duration,
        or holds until released when it has none. ``started_s``: it started earlier, at
        that instant, and its duration is what is left (:meth:`claim`)."""
        self.claim(work.name, work.processors, work.kind, work.requested_s, started_s)
        self.started[work.kind] += 1
        key = (work.kind, work.name)
        self._work[key] = work
        self._submitted.setdefault(key, self._sim.now)
        if started_s is None:
            for watcher in self._watchers:
                watcher.started(work, self._submitted[key], self._sim.now)
        if work.on_start is not None:
            work.on_start()
        if work.duration_s is not None:
            self._sim.schedule_in(work.duration_s, partial(self._end, work), self._end_priority)

    def _start_fitting(self) -> None:
        while self._queue and self._queue[0].processors <= self.idle:
            self.run_now(self._queue.popleft())
        if self.policy is QueuePolicy.EASY and len(self._queue) > 1 and self.idle > 0:
            self._backfill()

    def _backfill(self) -> None:
        """EASY: later jobs that fit now and do not delay the blocked head's reservation."""
        reservation = self._reservation(self._queue[0].processors)
        if reservation is None:
            return  # work of unknown end holds what the head needs: no safe backfill
        shadow, extra = reservation
        now = self._sim.now
        head = self._queue.popleft()
        kept: deque[Queued] = deque([head])
        while self._queue:
            work = self._queue.popleft()
            fits = work.requested_s is not None and work.processors <= self.idle
            in_time = fits and now + (work.requested_s or 0.0) <= shadow
            if fits and (in_time or work.processors <= extra):
                if not in_time:
                    extra -= work.processors
                self.run_now(work)
            else:
                kept.append(work)
        self._queue = kept

    def _reservation(self, needed: int) -> tuple[float, int] | None:
        """The head's shadow time (when the running work's requested ends free
        ``needed`` processors; an end already past counts as now) and the processors
        spare then; ``None`` when only work of unknown end could free them."""
        now = self._sim.now
        ends = sorted(
            (max(now, end), self._held[key].processors)
            for key, (_, end) in self._times.items()
            if end is not None
        )
        free = self.idle
        for end, processors in ends:
            free += processors
            if free >= needed:
                return end, free - needed
        return None

    def _tick(self) -> None:
        self._tick_pending = False
        self._start_fitting()

    def _end(self, work: Queued) -> None:
        self.release(work.name, work.kind)
        if work.on_end is not None:
            work.on_end()
        self.start_queued()

    def _integrate(self) -> None:
        now = self._sim.now
        for kind, integral in self._busy.items():
            integral.value += self._used[kind] * (now - self._since)
        self._byte_s.value += sum(self._stored.values()) * (now - self._since)
        self._since = now


@dataclass
class LocalHooks:
    """What a model observes of other users' jobs (all optional)."""

    started: Callable[[LocalJob], object] | None = None
    ended: Callable[[LocalJob], object] | None = None
    dropped: Callable[[LocalJob], object] | None = None


@dataclass
class LoadStreams:
    """The random streams and job names of one load (see :class:`OtherUsers`)."""

    arrivals: random.Random
    names: Iterator[str]
    dummies: random.Random | None = None
    dummy_names: Iterator[str] = field(default_factory=lambda: iter(()))


class ClusterModel:
    """A model on the shared clusters: its event core (starting at ``start_s``) and one
    :class:`Cluster` per site (in the sites' order) queueing by ``policy``, whose work
    ends at ``end_priority``."""

    def __init__(
        self,
        sites: Sequence[SimSite],
        end_priority: int,
        *,
        start_s: float = 0.0,
        policy: QueuePolicy = QueuePolicy.FIFO,
    ) -> None:
        self._sim = Simulator(start_s)
        self._clusters = {
            site.name: Cluster(self._sim, site, end_priority, policy=policy) for site in sites
        }


class OtherUsers:
    """Other users' jobs on ``clusters``: explicit ones (:meth:`submit`) and, with a
    ``load``, the ones it draws while ``active()`` holds.

    Per arrival the load draws from ``arrivals``, in this order: the gap, the cluster
    (when the load names none), then with exponential runtimes the runtime and the size,
    otherwise the size and the runtime; so runs that differ only in the model's decisions
    see the same offered load. Dummy jobs (band control) draw from ``dummies``.
    """

    def __init__(
        self,
        sim: Simulator,
        clusters: Sequence[Cluster],
        load: BackgroundLoad | None,
        admission: Admission,
        *,
        streams: LoadStreams | None = None,
        priority: int = 0,
        active: Callable[[], bool] = lambda: True,
        hooks: LocalHooks | None = None,
    ) -> None:
        if load is not None and load.low_fraction is not None and admission is Admission.QUEUE:
            raise SimulationError("a band-controlled load admits or drops; it cannot queue")
        self._sim = sim
        self._clusters = {c.name: c for c in clusters}
        self._order = tuple(clusters)
        self._load = load
        self._admission = admission
        self._streams = streams
        self._priority = priority
        self._active = active
        self._hooks = hooks or LocalHooks()
        total = sum(c.processors for c in clusters)
        self._band = load.band(total) if load is not None else (0, total)
        self._gap = load.interarrival_s(total) if load is not None else 0.0

    @property
    def busy(self) -> int:
        """Processors other users hold on all the clusters."""
        return sum(c.used(Owner.LOCAL) for c in self._order)

    def start(self) -> None:
        """Fill a band to its midpoint, then draw the first arrival."""
        if self._banded:
            self._inject_until((self._band[0] + self._band[1]) // 2)
        self._draw_next()

    def submit(self, job: LocalJob) -> None:
        """``job`` reaches its cluster now."""
        cluster = self._clusters[job.site]
        work = self._work(job)
        if self._admission is Admission.QUEUE:
            cluster.enqueue(work)
        elif self.busy + job.processors > self._band[1] or job.processors > cluster.idle:
            if self._hooks.dropped is not None:
                self._hooks.dropped(job)
        else:
            cluster.run_now(work)

    def top_up(self) -> None:
        """A band's load fell (a release): inject dummies back to its bottom."""
        if self._banded and self._active():
            self._inject_until(self._band[0])

    @property
    def _banded(self) -> bool:
        return self._load is not None and self._load.low_fraction is not None

    def _work(self, job: LocalJob) -> Queued:
        started = self._hooks.started
        return Queued(
            job.name,
            job.processors,
            job.runtime_s,
            Owner.LOCAL,
            None if started is None else partial(started, job),
            partial(self._ended, job),
            job.requested_s,
        )

    def _ended(self, job: LocalJob) -> None:
        if self._hooks.ended is not None:
            self._hooks.ended(job)
        self.top_up()

    def _draw_next(self) -> None:
        load, streams = self._load, self._streams
        if load is None or streams is None or not self._active():
            return
        rng = streams.arrivals
        at = self._sim.now + rng.expovariate(1.0 / self._gap)
        site = load.site
        if site is None:
            site = rng.choices(self._order, weights=[c.processors for c in self._order])[0].name
        if load.mean_runtime_s is not None:
            runtime = rng.expovariate(1.0 / load.mean_runtime_s)
            size = rng.randint(*load.nodes) * load.node_processors
        else:
            size = rng.randint(*load.nodes) * load.node_processors
            runtime = rng.uniform(*load.duration_s)
        job = LocalJob(next(streams.names), site, at, runtime, size)
        self._sim.schedule(at, partial(self._arrive, job), self._priority)

    def _arrive(self, job: LocalJob) -> None:
        self.submit(job)
        self._draw_next()

    def _inject_until(self, target: int) -> None:
        while self.busy < target:
            dummy = self._draw_dummy()
            if dummy is None:
                return  # no room now; the next release tries again
            self._clusters[dummy.site].run_now(self._work(dummy))

    def _draw_dummy(self) -> LocalJob | None:
        load, streams = self._load, self._streams
        if load is None or streams is None or streams.dummies is None:
            return None
        node = load.node_processors
        candidates = [c for c in self._order if c.idle >= node]
        room = (self._band[1] - self.busy) // node
        if not candidates or room < 1:
            return None
        rng = streams.dummies
        nodes = rng.randint(*load.nodes)
        duration = rng.uniform(*load.duration_s)
        cluster = rng.choices(candidates, weights=[c.idle for c in candidates])[0]
        nodes = min(nodes, room, cluster.idle // node)
        name = next(streams.dummy_names)
        return LocalJob(name, cluster.name, self._sim.now, duration, nodes * node)
