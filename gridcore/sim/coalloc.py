"""A multicluster co-allocation model: KOALA's placement queue over a fluctuating local load.

Seed: Sonmez, Mohamed, Epema, "Communication-aware job placement policies for the KOALA
grid scheduler", e-Science 2006
(``shared/seeds/koala-communication-aware-placement-escience2006.md``).

The model supplies what a placement policy cannot see; the decision itself is always
:func:`gridcore.policies.placement.place`, called on a snapshot of the idle processors of
every cluster at the instant of the try:

* **Clusters** are space-shared (SGE runs applications "on the nodes in an exclusive
  fashion", Sec. 5.3): a processor runs at most one job at a time.
* **Grid jobs** get one placement try when they arrive ("upon receiving a job request ...
  the scheduler uses one of the placement policies", Sec. 3.2). A job that does not fit
  goes to the tail of the **placement queue**, which is scanned from head to tail every
  ``scan_interval_s`` (4 s in the paper's experiments, Sec. 5). Each queued job is tried
  on a fresh snapshot, so a job placed earlier in the same scan has already taken its
  processors; a job that still does not fit keeps its place and does not block the ones
  behind it (the scan looks for "whether any job is able to be placed"). Tries are
  unlimited (Sec. 5 sets the maximum number of placement tries to infinite).
* **Claiming is immediate**: a placed job starts all its components at the placement
  instant and holds their processors for its execution time. The paper's wait time also
  holds the GRAM start-up overhead between placement and start (Fig. 6, Fig. 8); it is not
  modelled, so ``wait_s`` here is the paper's *queue time* and the response time is the
  queue time plus the execution time. The applications read no input files (Sec. 5), so
  nothing is staged either.
* **Execution time** is a function of the job's size and the number of clusters its
  placement combines, the quantity Fig. 5 measures. :class:`Fig5ExecutionTime` encodes
  that growth (see :data:`FIG5_EXECUTION_S` for where its numbers come from) and scales the
  wide-area part by ``comm_factor``.
* **Local load** (Sec. 5.5): jobs of the clusters' own users hold processors too. Explicit
  :class:`LocalJob` entries can be given (tests), and a :class:`BackgroundLoad` generates them:
  local jobs arrive by a Poisson process at a cluster drawn in proportion to its size,
  each of 1-4 whole dual-processor nodes (exclusive nodes) for 1-15 minutes (the DAS's
  15-minute limit, Sec. 6.2), and the paper's control is applied system-wide: a local job
  is admitted only if it fits the cluster's idle processors and keeps the local load at
  or under ``high_fraction`` (the paper kills its dummy jobs above 20 %); whenever the
  local load falls under ``low_fraction`` (15 %), dummy local jobs are injected at once
  on clusters drawn in proportion to their idle processors until it is back in the band.
  Releasing processors therefore lets local users in first, as the local resource
  manager starts its own queue at once while KOALA only sees the processors at its next
  scan. Idle counts fluctuate with the local load, as on the real testbed.

Randomness: the local arrival stream draws from its own ``random.Random`` the same numbers
in the same order whatever the policy does (gap, cluster, nodes, duration per job), so runs
of different policies with the same seed see the same offered local load; dummy jobs draw
from a second generator. The same inputs and seed give the same run.

At equal times events run in this order: releases (job ends), local submissions, grid
arrivals, then the queue scan, so a scan sees everything that happened at its instant.
"""

from __future__ import annotations

import enum
import itertools
import math
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType

from gridcore.errors import ConfigError
from gridcore.model import (
    ClusterSnapshot,
    CoAllocationRequest,
    Component,
    Outcome,
    Placement,
    RequestKind,
)
from gridcore.policies.placement import PlacementPolicy, place
from gridcore.sim.core import SimulationError, Simulator

SCAN_INTERVAL_S = 4.0
"""Interval between successive scans of the placement queue in the paper (Sec. 5)."""

ExecutionTime = Callable[[int, int], float]
"""``(job size in processors, clusters combined) -> execution time in seconds``."""

FIG5_EXECUTION_S: Mapping[int, tuple[float, ...]] = MappingProxyType(
    {
        # job size: execution time (s) on 1, 2, 3 and 4 clusters combined
        36: (100.0, 140.0, 170.0, 195.0),
        64: (140.0, 195.0, 235.0, 270.0),
        72: (150.0, 210.0, 255.0, 290.0),
    }
)
"""Execution time by total job size and number of clusters combined (Fig. 5's axes).

Fig. 5 itself is a plot whose values the seed's text does not carry, so this table is a
reconstruction bound by what the text states:

* it is measured per total size (36, 64, 72 processors) and per number of clusters
  combined, with fixed requests (Sec. 5.4), so it is keyed the same way;
* it "increases remarkably with multiple clusters" (Sec. 5.4) and single-cluster runs
  are "really advantageous" (Sec. 6.2): +40 % on two clusters, about double on four, each
  further cluster adding less (the first split puts the 100 Mbit/s backbone on every
  iteration's critical path, later ones add boundaries);
* larger jobs run longer, single-cluster times are of the order of the 30-192 s the same
  group's DAS co-allocation test application took (CCGrid 2005, Sec. 4.2), and nothing
  comes near the DAS's 15-minute limit (Sec. 6.2);
* the penalty and level agree with Sec. 6.2's account of the results: under W1 "all
  policies have similar (low) queue times", below a middleware overhead, while under W2
  the queue time dominates; every policy's execution time grows from W1 to W2; and FCM's
  extra clusters under W2 do "not have a serious effect". A first version with twice
  these increments (``comm_factor=2``) contradicted the first statement: W1's queue time
  under WF was three to four times CM's, and W2 ran past saturation.

With a mean job of about 54 processors, W1 then keeps the roughly 265 processors left by
the local load about 40 % busy and W2 80-95 %: the low and high contention the paper
intends (Sec. 5.4). Replace the table with measured values if you have them.
"""

_END = 0
_LOCAL = 1
_ARRIVE = 2
_SCAN = 3


@dataclass(frozen=True)
class Fig5ExecutionTime:
    """Execution time from a table like :data:`FIG5_EXECUTION_S`.

    ``comm_factor`` scales the wide-area part: the time on ``c`` clusters is
    ``t1 + comm_factor * (t_c - t1)``, so 0 removes the co-allocation penalty and 2 doubles
    it. Beyond the table's last column (FCM may combine all five DAS clusters while the
    paper measured at most four components) each extra cluster adds the table's last step.
    """

    table: Mapping[int, tuple[float, ...]] = field(default_factory=lambda: FIG5_EXECUTION_S)
    comm_factor: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.comm_factor) and self.comm_factor >= 0):
            raise ConfigError(f"comm_factor must be finite and >= 0, got {self.comm_factor}")
        for size, row in self.table.items():
            if len(row) < 2 or any(not b >= a for a, b in itertools.pairwise(row)):
                raise ConfigError(
                    f"execution table row for size {size} needs >= 2 non-decreasing times"
                )
            if row[0] <= 0:
                raise ConfigError(f"execution table row for size {size}: times must be > 0")

    def __call__(self, size: int, clusters: int) -> float:
        row = self.table.get(size)
        if row is None:
            raise ConfigError(f"no execution time for job size {size}; known {sorted(self.table)}")
        if clusters < 1:
            raise ConfigError(f"clusters combined must be >= 1, got {clusters}")
        last = len(row)
        measured = (
            row[clusters - 1]
            if clusters <= last
            else row[-1] + (clusters - last) * (row[-1] - row[-2])
        )
        return row[0] + self.comm_factor * (measured - row[0])


@dataclass(frozen=True)
class SimCluster:
    """One cluster: a name and its (functioning) processors."""

    name: str
    processors: int


@dataclass(frozen=True)
class GridJob:
    """A co-allocated job: its arrival and its components' sizes (Sec. 5.4: equal sizes).

    Under WF and CM it is a non-fixed request with these components; under FCM a flexible
    request for their total (:func:`coallocation_request`).
    """

    name: str
    arrival_s: float
    component_sizes: tuple[int, ...]
    application: str = ""

    @property
    def size(self) -> int:
        return sum(self.component_sizes)


@dataclass(frozen=True)
class LocalJob:
    """A job of a cluster's own users, submitted to that cluster's resource manager."""

    name: str
    cluster: str
    submit_s: float
    processors: int
    duration_s: float


@dataclass(frozen=True)
class BackgroundLoad:
    """Sec. 5.5's local load, kept system-wide between ``low_fraction`` and
    ``high_fraction`` of all processors (see the module docstring for the mechanism).

    Local jobs take ``nodes`` (inclusive range) whole nodes of ``node_processors`` for a
    duration uniform in ``duration_s``. ``mean_interarrival_s`` of ``None`` derives the
    Poisson rate that offers the band's midpoint (:meth:`interarrival_s`). At time 0 the
    local load is filled to the band's midpoint.
    """

    low_fraction: float = 0.15
    high_fraction: float = 0.20
    node_processors: int = 2
    nodes: tuple[int, int] = (1, 4)
    duration_s: tuple[float, float] = (60.0, 900.0)
    mean_interarrival_s: float | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.low_fraction < self.high_fraction <= 1:
            raise ConfigError(
                "background: need 0 <= low_fraction < high_fraction <= 1"
                f" (got {self.low_fraction}, {self.high_fraction})"
            )
        if self.node_processors < 1 or not 1 <= self.nodes[0] <= self.nodes[1]:
            raise ConfigError(
                f"background: bad node_processors {self.node_processors} or nodes {self.nodes}"
            )
        if not 0 < self.duration_s[0] <= self.duration_s[1]:
            raise ConfigError(f"background: bad duration_s range {self.duration_s}")
        if self.mean_interarrival_s is not None and not self.mean_interarrival_s > 0:
            raise ConfigError(
                f"background: mean_interarrival_s must be > 0, got {self.mean_interarrival_s}"
            )

    def band(self, total_processors: int) -> tuple[int, int]:
        """The band in processors: ``(ceil(low * total), floor(high * total))``."""
        return (
            math.ceil(self.low_fraction * total_processors),
            math.floor(self.high_fraction * total_processors),
        )

    def interarrival_s(self, total_processors: int) -> float:
        """Mean gap between local arrivals (offered load = band midpoint unless given)."""
        if self.mean_interarrival_s is not None:
            return self.mean_interarrival_s
        mean_processors = self.node_processors * (self.nodes[0] + self.nodes[1]) / 2
        mean_duration = (self.duration_s[0] + self.duration_s[1]) / 2
        offered = (self.low_fraction + self.high_fraction) / 2 * total_processors
        return mean_processors * mean_duration / offered


class EventKind(enum.StrEnum):
    ARRIVE = "arrive"  # a grid job is submitted (processors: its size)
    QUEUE = "queue"  # its arrival try failed: it joins the placement queue
    START = "start"  # a grid job takes processors on a site (one event per site)
    END = "end"  # ... and releases them
    LOCAL_START = "local_start"
    LOCAL_END = "local_end"
    LOCAL_DROP = "local_drop"  # a local job not admitted (no room, or the band is full)


@dataclass(frozen=True)
class SimEvent:
    """One line of the run's trace; ``site`` is empty for grid arrivals and queueing."""

    at: float
    kind: EventKind
    job: str
    site: str = ""
    processors: int = 0


@dataclass(frozen=True)
class CoallocRecord:
    """What happened to one grid job."""

    name: str
    size: int
    requested_components: int
    arrival_s: float
    start_s: float
    end_s: float
    placement: Placement
    tries: int  # placement tries: on arrival, then at every scan until placed

    @property
    def wait_s(self) -> float:
        return self.start_s - self.arrival_s

    @property
    def execution_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def response_s(self) -> float:
        return self.end_s - self.arrival_s

    @property
    def clusters_combined(self) -> int:
        return self.placement.clusters_combined


@dataclass(frozen=True)
class CoallocRun:
    """The outcome of one simulated run: grid jobs in input order and the event trace."""

    policy: PlacementPolicy
    jobs: tuple[CoallocRecord, ...]
    events: tuple[SimEvent, ...]

    @property
    def mean_response_s(self) -> float:
        return statistics.fmean(j.response_s for j in self.jobs)

    @property
    def mean_wait_s(self) -> float:
        return statistics.fmean(j.wait_s for j in self.jobs)

    @property
    def mean_execution_s(self) -> float:
        return statistics.fmean(j.execution_s for j in self.jobs)

    @property
    def mean_clusters_combined(self) -> float:
        return statistics.fmean(j.clusters_combined for j in self.jobs)

    def by_name(self, name: str) -> CoallocRecord:
        for record in self.jobs:
            if record.name == name:
                return record
        raise KeyError(name)


def coallocation_request(job: GridJob, policy: PlacementPolicy) -> CoAllocationRequest:
    """FCM gets a flexible request for the job's total; the others the non-fixed split."""
    if policy is PlacementPolicy.FCM:
        return CoAllocationRequest(job.name, RequestKind.FLEXIBLE, total=job.size)
    components = tuple(Component(size) for size in job.component_sizes)
    return CoAllocationRequest(job.name, RequestKind.NON_FIXED, components=components)


def simulate_coallocation(
    clusters: Sequence[SimCluster],
    jobs: Sequence[GridJob],
    policy: PlacementPolicy,
    execution_time: ExecutionTime,
    *,
    local_jobs: Sequence[LocalJob] = (),
    background: BackgroundLoad | None = None,
    scan_interval_s: float = SCAN_INTERVAL_S,
    seed: int = 0,
) -> CoallocRun:
    """Run ``jobs`` with ``policy`` on ``clusters`` until every grid job has completed.

    ``execution_time(size, clusters_combined)`` gives each placed job's execution time
    (e.g. :class:`Fig5ExecutionTime`). ``local_jobs`` are submitted at their times;
    ``background`` adds the generated, band-controlled local load (seeded by ``seed``).
    """
    _validate(clusters, jobs, local_jobs, scan_interval_s)
    _check_placeable(clusters, jobs, policy)
    model = _CoallocModel(clusters, policy, execution_time, background, scan_interval_s, seed)
    return model.run(jobs, local_jobs)


def _validate(
    clusters: Sequence[SimCluster],
    jobs: Sequence[GridJob],
    local_jobs: Sequence[LocalJob],
    scan_interval_s: float,
) -> None:
    if not (math.isfinite(scan_interval_s) and scan_interval_s > 0):
        raise ConfigError(f"scan_interval_s must be finite and > 0, got {scan_interval_s}")
    _validate_clusters(clusters)
    job_names = [j.name for j in jobs] + [j.name for j in local_jobs]
    repeated = sorted(name for name, count in Counter(job_names).items() if count > 1)
    if repeated:
        raise ConfigError(f"job names must be unique; repeated: {repeated}")
    for job in jobs:
        _validate_job(job, clusters)
    by_name = {c.name: c for c in clusters}
    for local in local_jobs:
        if local.cluster not in by_name:
            raise ConfigError(f"local job {local.name}: unknown cluster {local.cluster!r}")
        if local.submit_s < 0 or local.duration_s < 0 or local.processors < 1:
            raise ConfigError(
                f"local job {local.name}: needs submit_s >= 0, duration_s >= 0, processors >= 1"
            )


def _validate_clusters(clusters: Sequence[SimCluster]) -> None:
    if not clusters:
        raise ConfigError("clusters: at least one cluster is needed")
    names = [c.name for c in clusters]
    if len(set(names)) != len(names) or any(c.processors < 1 for c in clusters):
        raise ConfigError(f"clusters: names must be unique and processors >= 1, got {clusters}")


def _validate_job(job: GridJob, clusters: Sequence[SimCluster]) -> None:
    largest = max(c.processors for c in clusters)
    total = sum(c.processors for c in clusters)
    if not (math.isfinite(job.arrival_s) and job.arrival_s >= 0) or not job.component_sizes:
        raise ConfigError(f"job {job.name}: needs arrival_s >= 0 and >= 1 component")
    if min(job.component_sizes) < 1 or max(job.component_sizes) > largest:
        raise ConfigError(
            f"job {job.name}: component sizes {job.component_sizes} must be 1..{largest}"
            " (the largest cluster)"
        )
    if job.size > total:
        raise ConfigError(f"job {job.name}: {job.size} processors > all clusters ({total})")


def _check_placeable(
    clusters: Sequence[SimCluster], jobs: Sequence[GridJob], policy: PlacementPolicy
) -> None:
    # A job the policy cannot place on the empty grid would be scanned for ever.
    empty = [ClusterSnapshot(c.name, c.processors, c.processors) for c in clusters]
    for job in jobs:
        decision = place(coallocation_request(job, policy), empty, policy)
        if decision.outcome is not Outcome.FIT:
            raise ConfigError(
                f"job {job.name}: {policy} cannot place it even on idle clusters:"
                f" {'; '.join(decision.reasons)}"
            )


@dataclass
class _Pending:
    """A grid job's life: its request, placement tries and, once placed, its times."""

    job: GridJob
    request: CoAllocationRequest
    tries: int = 0
    # The idle vector of the last failed try: a pure policy fails again on the same one.
    last_failed: tuple[int, ...] | None = None
    placement: Placement | None = None
    start_s: float | None = None
    end_s: float | None = None

    def record(self) -> CoallocRecord:
        if self.placement is None or self.start_s is None or self.end_s is None:
            raise SimulationError(f"job {self.job.name} did not complete")
        return CoallocRecord(
            self.job.name,
            self.job.size,
            len(self.job.component_sizes),
            self.job.arrival_s,
            self.start_s,
            self.end_s,
            self.placement,
            self.tries,
        )


@dataclass
class _LocalLoad:
    """The band-controlled generator of local jobs (``None`` config: explicit jobs only)."""

    config: BackgroundLoad
    band: tuple[int, int]
    weights: tuple[int, ...]
    arrivals: random.Random
    dummies: random.Random
    counts: Counter[str] = field(default_factory=Counter)

    def name(self, prefix: str) -> str:
        # One counter per prefix: the arrival stream's names do not depend on the dummies.
        self.counts[prefix] += 1
        return f"{prefix}{self.counts[prefix]}"


@dataclass
class _State:
    idle: dict[str, int]
    local_busy: int = 0
    events: list[SimEvent] = field(default_factory=list)
    queue: list[_Pending] = field(default_factory=list)
    scan_scheduled: bool = False
    unfinished: int = 0


class _CoallocModel:
    def __init__(
        self,
        clusters: Sequence[SimCluster],
        policy: PlacementPolicy,
        execution_time: ExecutionTime,
        background: BackgroundLoad | None,
        scan_interval_s: float,
        seed: int,
    ) -> None:
        self._sim = Simulator()
        self._clusters = tuple(clusters)
        self._policy = policy
        self._execution_time = execution_time
        self._interval = scan_interval_s
        self._state = _State({c.name: c.processors for c in clusters})
        total = sum(c.processors for c in clusters)
        self._load: _LocalLoad | None = None
        if background is not None:
            self._load = _LocalLoad(
                background,
                background.band(total),
                tuple(c.processors for c in clusters),
                random.Random(f"gridcore.sim.coalloc:{seed}:local-arrivals"),
                random.Random(f"gridcore.sim.coalloc:{seed}:dummies"),
            )
        self._mean_gap = background.interarrival_s(total) if background is not None else 0.0

    def run(self, jobs: Sequence[GridJob], local_jobs: Sequence[LocalJob]) -> CoallocRun:
        pending = [_Pending(job, coallocation_request(job, self._policy)) for job in jobs]
        self._state.unfinished = len(pending)
        if self._load is not None:
            self._sim.schedule(0.0, self._start_background, _LOCAL)
        for local in local_jobs:
            self._sim.schedule(local.submit_s, partial(self._submit_local, local), _LOCAL)
        for item in pending:
            self._sim.schedule(item.job.arrival_s, partial(self._arrive, item), _ARRIVE)
        self._sim.run()
        return CoallocRun(
            self._policy, tuple(p.record() for p in pending), tuple(self._state.events)
        )

    def _log(self, kind: EventKind, job: str, site: str = "", processors: int = 0) -> None:
        self._state.events.append(SimEvent(self._sim.now, kind, job, site, processors))

    # -- grid jobs ---------------------------------------------------------------------

    def _arrive(self, item: _Pending) -> None:
        self._log(EventKind.ARRIVE, item.job.name, processors=item.job.size)
        if not self._try(item):
            self._state.queue.append(item)
            self._log(EventKind.QUEUE, item.job.name, processors=item.job.size)
            self._ensure_scan()

    def _try(self, item: _Pending) -> bool:
        idle = tuple(self._state.idle[c.name] for c in self._clusters)
        item.tries += 1
        if idle == item.last_failed:
            return False
        snapshots = [
            ClusterSnapshot(c.name, c.processors, free)
            for c, free in zip(self._clusters, idle, strict=True)
        ]
        decision = place(item.request, snapshots, self._policy)
        if decision.outcome is not Outcome.FIT:
            item.last_failed = idle
            return False
        self._start(item, decision)
        return True

    def _start(self, item: _Pending, decision: Placement) -> None:
        per_site: dict[str, int] = defaultdict(int)
        for component in decision.components:
            per_site[component.site] += component.size
        for site, processors in per_site.items():
            if processors > self._state.idle.get(site, -1):
                raise SimulationError(
                    f"job {item.job.name}: {self._policy} placed {processors} processors on"
                    f" {site!r} with {self._state.idle.get(site)} idle: {decision}"
                )
        if sum(per_site.values()) != item.job.size:
            raise SimulationError(f"job {item.job.name}: placement does not cover its size")
        for site, processors in per_site.items():
            self._state.idle[site] -= processors
            self._log(EventKind.START, item.job.name, site, processors)
        duration = self._execution_time(item.job.size, decision.clusters_combined)
        if not (math.isfinite(duration) and duration >= 0):
            raise SimulationError(f"job {item.job.name}: execution time {duration!r}")
        item.placement = decision
        item.start_s = self._sim.now
        self._sim.schedule_in(duration, partial(self._end, item, dict(per_site)), _END)

    def _end(self, item: _Pending, per_site: Mapping[str, int]) -> None:
        item.end_s = self._sim.now
        for site, processors in per_site.items():
            self._state.idle[site] += processors
            self._log(EventKind.END, item.job.name, site, processors)
        self._state.unfinished -= 1
        self._top_up()

    def _ensure_scan(self) -> None:
        if self._state.scan_scheduled:
            return
        # Scans are periodic on the global clock: the first tick strictly after now.
        tick = (math.floor(self._sim.now / self._interval) + 1) * self._interval
        self._sim.schedule(tick, self._scan, _SCAN)
        self._state.scan_scheduled = True

    def _scan(self) -> None:
        self._state.scan_scheduled = False
        waiting: list[_Pending] = []
        for item in self._state.queue:  # head to tail
            if not self._try(item):
                waiting.append(item)
        self._state.queue = waiting
        if waiting:
            self._ensure_scan()

    # -- local load --------------------------------------------------------------------

    def _start_background(self) -> None:
        load = self._load
        if load is None:  # pragma: no cover - only scheduled with a background
            return
        midpoint = (load.band[0] + load.band[1]) // 2
        self._inject_until(midpoint)
        self._schedule_next_local()

    def _schedule_next_local(self) -> None:
        load = self._load
        if load is None or self._state.unfinished == 0:
            return
        rng = load.arrivals
        # Always the same four draws per job, whatever the state: common random numbers.
        gap = rng.expovariate(1.0 / self._mean_gap)
        cluster = rng.choices(self._clusters, weights=load.weights)[0]
        nodes = rng.randint(*load.config.nodes)
        duration = rng.uniform(*load.config.duration_s)
        local = LocalJob(
            load.name("local-"),
            cluster.name,
            self._sim.now + gap,
            nodes * load.config.node_processors,
            duration,
        )
        self._sim.schedule(local.submit_s, partial(self._submit_local, local, True), _LOCAL)

    def _submit_local(self, local: LocalJob, generated: bool = False) -> None:
        band_full = self._load is not None and (
            self._state.local_busy + local.processors > self._load.band[1]
        )
        if band_full or local.processors > self._state.idle[local.cluster]:
            self._log(EventKind.LOCAL_DROP, local.name, local.cluster, local.processors)
        else:
            self._start_local(local)
        if generated:
            self._schedule_next_local()

    def _start_local(self, local: LocalJob) -> None:
        self._state.idle[local.cluster] -= local.processors
        self._state.local_busy += local.processors
        self._log(EventKind.LOCAL_START, local.name, local.cluster, local.processors)
        self._sim.schedule_in(local.duration_s, partial(self._end_local, local), _END)

    def _end_local(self, local: LocalJob) -> None:
        self._state.idle[local.cluster] += local.processors
        self._state.local_busy -= local.processors
        self._log(EventKind.LOCAL_END, local.name, local.cluster, local.processors)
        self._top_up()

    def _top_up(self) -> None:
        if self._load is not None and self._state.unfinished > 0:
            self._inject_until(self._load.band[0])

    def _inject_until(self, target: int) -> None:
        while self._state.local_busy < target:
            dummy = self._draw_dummy()
            if dummy is None:
                return  # no room now; the next release tries again
            self._start_local(dummy)

    def _draw_dummy(self) -> LocalJob | None:
        load = self._load
        if load is None:  # pragma: no cover - only called with a background
            return None
        node = load.config.node_processors
        candidates = [c for c in self._clusters if self._state.idle[c.name] >= node]
        room = (load.band[1] - self._state.local_busy) // node
        if not candidates or room < 1:
            return None
        rng = load.dummies
        nodes = rng.randint(*load.config.nodes)
        duration = rng.uniform(*load.config.duration_s)
        cluster = rng.choices(candidates, weights=[self._state.idle[c.name] for c in candidates])[0]
        nodes = min(nodes, room, self._state.idle[cluster.name] // node)
        return LocalJob(load.name("dummy-"), cluster.name, self._sim.now, nodes * node, duration)
