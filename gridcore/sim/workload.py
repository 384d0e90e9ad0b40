"""What every simulator model is given: sites and other users' jobs and load.

A model's own jobs and records (a selected ensemble member, a co-allocated KOALA job) stay
in its module; these are the types the models share, so one site description or one
trace of other users' jobs runs under any model.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gridcore.errors import ConfigError


@dataclass(frozen=True)
class SimSite:
    """One simulated cluster.

    ``slowness``: a grid job's runtime there is its reference runtime times this (RENCI
    TR-08-02 Table 2). ``failure_probability``: the chance that a component started there
    fails (KOALA, CCGrid 2005 Sec. 4.3). ``storage_bytes``: the bytes its storage holds.
    """

    name: str
    processors: int
    slowness: float = 1.0
    failure_probability: float = 0.0
    storage_bytes: int = 0


@dataclass(frozen=True)
class LocalJob:
    """Another user's job, submitted straight to ``site``'s local queue at ``submit_s``.

    ``runtime_s`` is its wall time on that site (not scaled: it is described where it
    runs); ``requested_s`` the time it asked for (a real log's field 9; ``None``:
    unknown), which only an EASY queue reads; ``user`` its user (a log's field 12), which
    only wait models read. Nobody selects or places it; models see it only through the
    cluster.
    """

    name: str
    site: str
    submit_s: float
    runtime_s: float
    processors: int
    requested_s: float | None = None
    user: int | None = None


class JobTimes:
    """What a finished job's record derives from its ``arrival_s``, ``start_s`` and
    ``end_s`` (fields of the record that mixes this in)."""

    arrival_s: float
    start_s: float
    end_s: float

    @property
    def wait_s(self) -> float:
        """Arrival to start."""
        return self.start_s - self.arrival_s

    @property
    def execution_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def response_s(self) -> float:
        """Arrival to end."""
        return self.end_s - self.arrival_s


@dataclass(frozen=True)
class TraceEvent:
    """One step of a run, for tests and for people: what (``kind``) happened to ``job``
    at ``at``; where and how many processors when it concerns a site, a readable
    ``detail`` when a model gives one."""

    at: float
    kind: str
    job: str
    site: str = ""
    processors: int = 0
    detail: str = ""


@dataclass(frozen=True)
class BackgroundLoad:
    """Other users' jobs, drawn while the model's own jobs are unfinished.

    Arrivals are Poisson with mean gap ``mean_interarrival_s``. Each job goes to ``site``,
    or, when it is ``None``, to a cluster drawn in proportion to its processors. A job
    takes a uniform integer number in ``nodes`` of whole nodes of ``node_processors``, and
    runs an exponential time of mean ``mean_runtime_s``, or when that is ``None`` a time
    uniform in ``duration_s``.

    With a band (``low_fraction`` and ``high_fraction`` of all processors, the KOALA
    placement paper's control, e-Science 2006 Sec. 5.5) the load is kept system-wide in
    it: a job is admitted only if it fits its cluster's idle processors and keeps the load
    at or under the top, otherwise dropped; whenever the load falls under the bottom,
    dummy jobs are injected at once on clusters drawn in proportion to their idle
    processors. At time 0 the load is filled to the band's midpoint, and a gap of
    ``None`` offers that midpoint. Without a band (``low_fraction`` ``None``) jobs wait in
    their cluster's FIFO local queue (CCGrid 2005 Sec. 4.2's other users).

    The defaults are e-Science 2006 Sec. 5.5's: 15-20 % of all processors in 1-4 dual
    nodes for 1-15 minutes; :meth:`at_site` builds the CCGrid 2005 kind.
    """

    site: str | None = None
    mean_interarrival_s: float | None = None
    nodes: tuple[int, int] = (1, 4)
    node_processors: int = 2
    duration_s: tuple[float, float] = (60.0, 900.0)
    mean_runtime_s: float | None = None
    low_fraction: float | None = 0.15
    high_fraction: float = 0.20

    @classmethod
    def at_site(
        cls,
        site: str,
        mean_interarrival_s: float,
        processors: tuple[int, int],
        mean_runtime_s: float,
    ) -> BackgroundLoad:
        """Poisson jobs queued at ``site``: uniform sizes in ``processors``, exponential
        runtimes, no band."""
        return cls(
            site,
            mean_interarrival_s,
            processors,
            node_processors=1,
            mean_runtime_s=mean_runtime_s,
            low_fraction=None,
        )

    def __post_init__(self) -> None:
        where = f"background load at {self.site!r}" if self.site else "background load"
        gap, mean = self.mean_interarrival_s, self.mean_runtime_s
        if self.low_fraction is not None and not (0 <= self.low_fraction < self.high_fraction <= 1):
            raise ConfigError(
                f"{where}: need 0 <= low_fraction < high_fraction <= 1"
                f" (got {self.low_fraction}, {self.high_fraction})"
            )
        if self.node_processors < 1 or not 1 <= self.nodes[0] <= self.nodes[1]:
            raise ConfigError(f"{where}: sizes {self.nodes} x {self.node_processors} processors")
        if not 0 < self.duration_s[0] <= self.duration_s[1]:
            raise ConfigError(f"{where}: bad duration_s range {self.duration_s}")
        if (gap is not None and not gap > 0) or (mean is not None and not mean > 0):
            raise ConfigError(f"{where}: means must be > 0 (got gap {gap}, runtime {mean})")
        if self.low_fraction is None and gap is None:
            raise ConfigError(f"{where}: a load without a band needs mean_interarrival_s")

    @property
    def largest(self) -> int:
        """Processors of the largest job it draws."""
        return self.nodes[1] * self.node_processors

    def band(self, total_processors: int) -> tuple[int, int]:
        """The band in processors: ``(ceil(low * total), floor(high * total))``."""
        if self.low_fraction is None:
            return (0, total_processors)
        return (
            math.ceil(self.low_fraction * total_processors),
            math.floor(self.high_fraction * total_processors),
        )

    def interarrival_s(self, total_processors: int) -> float:
        """Mean gap between arrivals (offered load = band midpoint unless given)."""
        if self.mean_interarrival_s is not None:
            return self.mean_interarrival_s
        low = self.low_fraction or 0.0
        mean_processors = self.node_processors * (self.nodes[0] + self.nodes[1]) / 2
        mean_duration = (self.duration_s[0] + self.duration_s[1]) / 2
        offered = (low + self.high_fraction) / 2 * total_processors
        return mean_processors * mean_duration / offered


def validate_sites(sites: Sequence[SimSite], noun: str = "site") -> None:
    """At least one site, unique names, and every figure in range."""
    if not sites:
        raise ConfigError(f"{noun}s: need at least one {noun}")
    names = [site.name for site in sites]
    if len(set(names)) != len(names):
        raise ConfigError(f"{noun}s: names must be unique, got {names}")
    for site in sites:
        if site.processors < 1 or not site.slowness > 0:
            raise ConfigError(
                f"{noun} {site.name}: processors must be >= 1 and slowness > 0"
                f" (got {site.processors}, {site.slowness})"
            )
        if not 0.0 <= site.failure_probability <= 1.0 or site.storage_bytes < 0:
            raise ConfigError(
                f"{noun} {site.name}: failure_probability in [0, 1] and storage_bytes >= 0"
                f" (got {site.failure_probability}, {site.storage_bytes})"
            )


def validate_unique(names: Iterable[str]) -> None:
    """Job names identify jobs in records and traces: no two alike."""
    repeated = sorted(name for name, count in Counter(names).items() if count > 1)
    if repeated:
        raise ConfigError(f"job names must be unique; repeated: {repeated}")


def validate_local_jobs(
    jobs: Sequence[LocalJob], sites: Sequence[SimSite], noun: str = "site"
) -> None:
    """Other users' jobs name a known site, fit it, and have sane times."""
    capacity = {site.name: site.processors for site in sites}
    for job in jobs:
        if job.site not in capacity:
            raise ConfigError(f"local job {job.name}: unknown {noun} {job.site!r}")
        if not (job.submit_s >= 0 and job.runtime_s >= 0 and job.processors >= 1):
            raise ConfigError(
                f"local job {job.name}: needs submit_s >= 0, runtime_s >= 0, processors >= 1"
            )
        if job.processors > capacity[job.site]:
            raise ConfigError(
                f"local job {job.name}: {job.processors} processors >"
                f" {noun} {job.site!r}'s {capacity[job.site]}"
            )


def validate_loads(loads: Sequence[BackgroundLoad], sites: Sequence[SimSite]) -> None:
    """A load at a site needs the site, and its largest job must fit there."""
    capacity: Mapping[str, int] = {site.name: site.processors for site in sites}
    for load in loads:
        if load.site is not None and load.largest > capacity.get(load.site, 0):
            raise ConfigError(
                f"background load at {load.site!r}: sizes {load.nodes} x"
                f" {load.node_processors} do not fit (site has {capacity.get(load.site, 0)})"
            )
