"""Other users' load from real workload logs (SWF): the jobs a machine really ran, replayed
as other users' jobs on simulated clusters.

Design and the choices made: ``docs/experiments.md`` (section ``gridcore/sim/log_load.py``).

A :class:`LogLoad` is one ``--background LOG.swf[@SITE]`` with its window, offset and
scale; a :class:`LogReplay` streams the jobs of several into a model, one pending arrival
per replay (:class:`LogFeeder`), so a log of any length replays in bounded memory. Every
model that has other users takes an :class:`OtherUsersLog` (this replay, or an
experiment's own view of a log at an instant) and starts it with :func:`start_log`.
"""

from __future__ import annotations

import functools
import heapq
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from gridcore.errors import ConfigError
from gridcore.sim.cluster import Cluster, Owner, Queued, QueuePolicy
from gridcore.sim.core import Simulator
from gridcore.sim.workload import LocalJob, SimSite
from gridcore.workloads.durations import DURATION_HINT, log_seconds, log_span
from gridcore.workloads.requested import RequestedTimes
from gridcore.workloads.swf import JobLabels, SwfJob, iter_jobs, read_header


@dataclass(frozen=True)
class LogLoad:
    """One log replayed as other users' load.

    ``site``: every job goes there (``LOG.swf@SITE``); ``None``: a multi-partition log's
    partition ``p`` (field 16, 1-based) goes to the model's ``p``-th site, a
    single-partition log to its first. ``start_s``/``end_s``: the window, in seconds of
    the log (submit times ``start_s <= t < end_s``; ``end_s`` ``None``: to the log's end).
    ``offset_s``: the log's time that maps to simulated time 0 (``None``: the window's
    start). ``scale``: the load scale ``X``: a job submitted at log time ``t`` arrives at
    ``(t - offset_s) / X`` (inter-arrival times scaled by ``1/X``, the usual way of
    loading a machine more or less with one log); run and requested times are the log's.
    """

    path: str
    site: str | None = None
    start_s: float = 0.0
    end_s: float | None = None
    offset_s: float | None = None
    scale: float = 1.0

    @property
    def offset(self) -> float:
        return self.start_s if self.offset_s is None else self.offset_s

    def sim_time(self, log_s: float) -> float:
        """The simulated instant of log time ``log_s``."""
        return (log_s - self.offset) / self.scale

    @property
    def label(self) -> str:
        name = Path(self.path).name
        for suffix in (".gz", ".swf"):
            name = name.removesuffix(suffix)
        return name

    def describe(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "site": self.site,
            "window_s": [self.start_s, self.end_s],
            "offset_s": self.offset,
            "scale": self.scale,
        }


@dataclass(frozen=True)
class LoggedRunning:
    """A logged job already running when a replay starts: since ``started_s``
    (simulated time, at or before the start)."""

    job: LocalJob
    started_s: float


class OtherUsersLog(Protocol):
    """Real other users' load for a model: the instant it starts, the jobs running then,
    and every job to submit from then on in submit order (a job submitted before the start
    was queued then: it is submitted at the start, in its order)."""

    @property
    def start_s(self) -> float: ...

    def running(self, sites: Sequence[SimSite]) -> Sequence[LoggedRunning]: ...

    def jobs(self, sites: Sequence[SimSite]) -> Iterator[LocalJob]: ...


@dataclass
class LogCounts:
    """What one log gave a model, summed over every run that replayed it: jobs read in
    the window, replayed, and left out (larger than their cluster, no size, no run time,
    a partition with no site, a line of one part of a job: ``SwfJob.is_part``)."""

    read: int = 0
    replayed: int = 0
    too_large: int = 0
    unsized: int = 0
    no_runtime: int = 0
    unmapped: int = 0
    part_lines: int = 0
    runs: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


@dataclass
class LogReplay:
    """The :class:`LogLoad` of a model, streamed from their files (an
    :class:`OtherUsersLog`); :attr:`counts` add up over every run."""

    loads: tuple[LogLoad, ...]
    counts: list[LogCounts] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [LogCounts() for _ in self.loads]

    @property
    def start_s(self) -> float:
        """0, or earlier when a window starts before its offset (a warm-up)."""
        return min([0.0, *(load.sim_time(load.start_s) for load in self.loads)])

    def running(self, sites: Sequence[SimSite]) -> Sequence[LoggedRunning]:
        return ()

    def jobs(self, sites: Sequence[SimSite]) -> Iterator[LocalJob]:
        check_sites(self.loads, sites)
        streams = [
            _log_jobs(index, load, sites, self.counts[index])
            for index, load in enumerate(self.loads)
        ]
        for counts in self.counts:
            counts.runs += 1
        return heapq.merge(*streams, key=lambda job: job.submit_s)

    def describe(self) -> list[dict[str, Any]]:
        return [
            load.describe() | {"counts": counts.as_dict()}
            for load, counts in zip(self.loads, self.counts, strict=True)
        ]


def check_sites(loads: Sequence[LogLoad], sites: Sequence[SimSite]) -> None:
    """Every ``@SITE`` names one of ``sites``."""
    names = [site.name for site in sites]
    for load in loads:
        if load.site is not None and load.site not in names:
            raise ConfigError(
                f"--background {load.path}@{load.site}: no site {load.site!r} here"
                f" (sites: {', '.join(names)})"
            )


def _log_jobs(
    index: int, load: LogLoad, sites: Sequence[SimSite], counts: LogCounts
) -> Iterator[LocalJob]:
    capacity = {site.name: site.processors for site in sites}
    # one queue's de-facto limit per cluster, fed the jobs it replays (docs/workloads.md)
    requested_times = {site.name: RequestedTimes() for site in sites}
    partitions = {} if load.site is not None else _partition_order(load.path)
    labels = JobLabels()
    for logged in iter_jobs(load.path):
        label = labels(logged)
        if logged.submit_s < load.start_s:
            continue
        if load.end_s is not None and logged.submit_s >= load.end_s:
            return
        counts.read += 1
        site = _site_of(logged, load, sites, partitions)
        size, run = logged.size, logged.run_s
        if logged.is_part:
            counts.part_lines += 1
        elif site is None:
            counts.unmapped += 1
        elif size is None:
            counts.unsized += 1
        elif run is None:
            counts.no_runtime += 1
        elif size > capacity[site]:
            counts.too_large += 1
        else:
            counts.replayed += 1
            name = f"{index}:{load.label}#{label}"
            at = load.sim_time(logged.submit_s)
            requested = requested_times[site].fill(logged.requested_s)
            yield LocalJob(name, site, at, run, size, requested, logged.user)


def _site_of(
    logged: SwfJob, load: LogLoad, sites: Sequence[SimSite], partitions: Mapping[int, int]
) -> str | None:
    """``@SITE``'s; else the ``k``-th site for the log's ``k``-th partition number (in
    increasing order); a single-partition log's jobs all go to the first site."""
    if load.site is not None:
        return load.site
    if len(partitions) <= 1:
        return sites[0].name
    index = None if logged.partition is None else partitions.get(logged.partition)
    return None if index is None or index >= len(sites) else sites[index].name


def _replayable(job: SwfJob) -> bool:
    """A job ``_log_jobs`` can replay as load: not a part of a job, size and run time
    known (its wait is not needed)."""
    return not job.is_part and job.size is not None and job.run_s is not None


def _partition_order(path: str) -> dict[int, int]:
    """Each partition number the replayable jobs carry (field 16) -> its rank among them:
    told by the jobs, whatever the header's ``MaxPartitions`` says (as selection-traces
    and wait-prediction tell a multi-cluster log). Read once per file version."""
    stat = os.stat(path)
    return dict(_partitions_of(os.path.abspath(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=16)
def _partitions_of(path: str, mtime_ns: int, size: int) -> tuple[tuple[int, int], ...]:
    numbers = sorted(
        {job.partition for job in iter_jobs(path) if job.partition is not None and _replayable(job)}
    )
    return tuple((number, rank) for rank, number in enumerate(numbers))


class LogFeeder:
    """Submits ``jobs`` (in submit order) through ``submit``, one pending arrival at a
    time, while ``active()``: a job submitted before now arrives now, in its order."""

    def __init__(
        self,
        sim: Simulator,
        jobs: Iterator[LocalJob],
        submit: Callable[[LocalJob], object],
        *,
        priority: int,
        active: Callable[[], bool],
    ) -> None:
        self._sim = sim
        self._jobs = jobs
        self._submit = submit
        self._priority = priority
        self._active = active

    def start(self) -> None:
        self._next()

    def _next(self) -> None:
        if not self._active():
            return
        job = next(self._jobs, None)
        if job is not None:
            at = max(job.submit_s, self._sim.now)
            self._sim.schedule(at, partial(self._arrive, job), self._priority)

    def _arrive(self, job: LocalJob) -> None:
        self._submit(job)
        self._next()


def start_log(
    sim: Simulator,
    log: OtherUsersLog,
    clusters: Mapping[str, Cluster],
    submit: Callable[[LocalJob], object],
    *,
    priority: int,
    active: Callable[[], bool],
) -> None:
    """At ``log.start_s`` (the simulator's start): the logged running jobs take their
    processors for what is left of their run (and of their requested time), then the
    feeder submits the rest through ``submit``."""
    sites = [cluster.site for cluster in clusters.values()]

    def begin() -> None:
        now = sim.now
        for running in log.running(sites):
            job = running.job
            left = max(0.0, running.started_s + job.runtime_s - now)
            work = Queued(
                job.name,
                job.processors,
                left,
                Owner.LOCAL,
                requested_s=job.requested_s,
                submitted_s=job.submit_s,
                user=job.user,
            )
            clusters[job.site].run_now(work, running.started_s)
        LogFeeder(sim, log.jobs(sites), submit, priority=priority, active=active).start()

    sim.schedule(sim.now, begin, priority)


def local_work(job: LocalJob, on_start: Callable[[], object] | None = None) -> Queued:
    """Another user's job as work for its cluster's queue."""
    return Queued(
        job.name,
        job.processors,
        job.runtime_s,
        Owner.LOCAL,
        on_start,
        requested_s=job.requested_s,
        submitted_s=job.submit_s,
        user=job.user,
    )


# -- the command line ----------------------------------------------------------------------


def parse_log_loads(
    specs: Sequence[str],
    window: str | None = None,
    offset: str | None = None,
    scale: float | None = None,
) -> tuple[LogLoad, ...]:
    """``--background LOG.swf[@SITE]`` (each), ``--background-window START:END``,
    ``--background-offset S``, ``--background-scale X``: times in seconds of the log,
    or with a unit ``s``, ``m``, ``h`` or ``d``; either end of the window may
    be left out. Each file's header is read now (a missing or malformed file is refused
    before anything runs). Errors name the option."""
    if not specs:
        for option, value in (
            ("--background-window", window),
            ("--background-offset", offset),
            ("--background-scale", scale),
        ):
            if value is not None:
                raise ConfigError(f"{option}: needs --background LOG.swf")
        return ()
    start, end = _window(window)
    at = None if offset is None else parse_duration(offset, "--background-offset")
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise ConfigError(f"--background-scale must be a finite number > 0, got {scale}")
    loads = []
    for spec in specs:
        path, site, first_submit = _spec(spec)
        # without a window's start, the log's first submission (logs start their clock
        # anywhere: a slice, or SDSC SP2's first job at 566,129 s): from log time 0 a
        # run shorter than that saw no job of the log at all
        begin = first_submit if start is None else start
        if start is None and end is not None and end <= begin:
            raise ConfigError(
                f"--background-window: ends at {end:g} s, not after {path}'s first"
                f" submission ({begin:g} s)"
            )
        loads.append(LogLoad(path, site, begin, end, at, 1.0 if scale is None else scale))
    return tuple(loads)


def parse_duration(text: str, option: str) -> float:
    """``text`` in seconds (:func:`gridcore.workloads.durations.log_seconds`)."""
    seconds = log_seconds(text)
    if seconds is None:
        raise ConfigError(f"{option}: {text!r} is not a time ({DURATION_HINT})")
    return seconds


def _window(window: str | None) -> tuple[float | None, float | None]:
    """The window's start and end in log seconds, ``None`` where left out."""
    return (None, None) if window is None else log_span(window, "--background-window")


def _spec(spec: str) -> tuple[str, str | None, float]:
    """``LOG.swf[@SITE]``: the log's path, the site, the log's first submission."""
    path, at, site = spec.rpartition("@")
    if not at:
        path, site = spec, ""
    if at and not site.strip():
        raise ConfigError(f"--background {spec}: no site after '@'")
    if not path:
        raise ConfigError(f"--background {spec!r}: no log file")
    if not os.path.isfile(path):
        raise ConfigError(f"--background {spec}: no such file {path!r}")
    # A file that is no log is refused now (SwfError names the file, line and field;
    # a log without a job line too), and its first job tells where it starts.
    read_header(path)
    first = next(iter_jobs(path))
    return path, site.strip() or None, first.submit_s


# -- a log on its own machine --------------------------------------------------------------


@dataclass(frozen=True)
class ReplayedWait:
    """One logged job replayed alone on a cluster: its wait in the log and in the replay."""

    name: str
    processors: int
    logged_wait_s: float | None
    replayed_wait_s: float


def replay_waits(load: LogLoad, processors: int, *, backfill: bool = True) -> list[ReplayedWait]:
    """Replay ``load`` alone on an otherwise idle cluster of ``processors`` with an EASY
    queue (FIFO without ``backfill``): every replayed job's wait, beside the log's. How
    close they come says how far the simulated queue stands in for the machine's own
    scheduler (docs/experiments.md, section ``gridcore/sim/log_load.py``)."""
    sim = Simulator(load.sim_time(load.start_s))
    site = SimSite("log", processors)
    policy = QueuePolicy.EASY if backfill else QueuePolicy.FIFO
    cluster = Cluster(sim, site, policy=policy)
    labels = JobLabels()  # every line labelled, as _log_jobs labels them
    logged = {labels(job): job.wait_s for job in iter_jobs(load.path)}
    waits: list[ReplayedWait] = []

    def started(job: LocalJob) -> None:
        label = job.name.rpartition("#")[2]
        wait = (sim.now - job.submit_s) * load.scale
        waits.append(ReplayedWait(job.name, job.processors, logged[label], wait))

    single = LogLoad(load.path, site.name, load.start_s, load.end_s, load.offset_s, load.scale)
    replay = LogReplay((single,))
    feeder = LogFeeder(
        sim,
        replay.jobs([site]),
        lambda job: cluster.enqueue(local_work(job, partial(started, job))),
        priority=1,
        active=lambda: True,
    )
    feeder.start()
    sim.run()
    return waits
