"""The plan of a live replay: which jobs of a workload log (SWF) go to which live site,
when, with what size, sleep and time limit. Pure: no I/O, no clock; the runner that
submits the plan is :mod:`gridcore.engine.replay` and ``gridcore replay`` the command.

How a log job becomes a site job (``docs/workloads.md``, section "gridcore replay"):

* when: its submit time less the window's start (by default the first job's submit
  time), divided by the speedup: seconds after the replay starts. Jobs submitted before
  the window's start are passed over; the plan stops at the window's end, at
  ``max_jobs`` planned jobs, or at the first job due past ``max_duration_s``, and
  reads the log no further;
* where: its partition (field 16) through the site map (``*``: every partition the map
  does not name, the unknown one included); a partition mapped to several sites sends
  its jobs to them in turn;
* its size: the allocated processors, else the requested ones; a job larger than its
  site is capped to the site's size or skipped (:class:`Oversize`);
* its work: ``sleep`` of its run time divided by the speedup;
* its time limit: its requested time divided by the speedup, rounded up to whole
  seconds (at least 1); a log that does not know the requested time gives the job its
  own run time as limit (counted). A Slurm site enforces whole minutes (the adapter
  rounds up, ``gridcore.sites.slurm_api.submission_body``): ``site_limit_s`` is the
  limit the site will enforce, so a job that ran past its requested time in the log
  is killed at its limit on a local site and may not be on a Slurm site, where the
  limit can be up to 59 s longer.

Skipped (counted by :class:`SkipReason`): lines of partial executions (SWF status 2-4:
the job's own line carries the whole job), jobs of unknown size or run time, jobs of an
unmapped partition, and oversized jobs under ``Oversize.SKIP``.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from gridcore.errors import ConfigError
from gridcore.workloads.durations import log_span
from gridcore.workloads.swf import SwfJob

DEFAULT_MAX_JOBS = 100
"""Planned jobs unless ``--max-jobs`` says otherwise: enough load for a live experiment,
few enough that a forgotten replay does not flood a cluster."""
DEFAULT_MAX_DURATION_S = 600.0
"""How long a replay lasts unless ``--max-duration`` says otherwise (wall seconds)."""
JOB_NAME_PREFIX = "gcreplay-"
"""Every replayed job's name starts with this (``gcreplay-<run>-<log job number>``): a
person reading ``squeue`` tells them apart. The engines tell them apart by their key:
replayed jobs carry none, so every engine counts them as other users' load."""
ANY_PARTITION = "*"
SLURM_LIMIT_STEP_S = 60
"""Slurm takes time limits in whole minutes."""


class ReplayError(ConfigError):
    """A replay's option is malformed; the message names the option (a malformed log
    raises :class:`gridcore.workloads.swf.SwfError`, naming file, line and field)."""


class Oversize(enum.StrEnum):
    """What a job larger than its site becomes."""

    CAP = "cap"  # the site's whole size
    SKIP = "skip"  # not submitted (counted)


class SkipReason(enum.StrEnum):
    """Why a log job of the window is not submitted (the summary's ``skipped`` keys)."""

    PARTIAL_LINE = "partial_line"
    SIZE_UNKNOWN = "size_unknown"
    RUN_TIME_UNKNOWN = "run_time_unknown"
    PARTITION_UNMAPPED = "partition_unmapped"
    OVERSIZE = "oversize"
    REFUSED = "refused"  # the site says it could never run it (the runner's check)
    SUBMIT_FAILED = "submit_failed"  # the site refused or could not be reached (runner)


class StopReason(enum.StrEnum):
    """Why the plan ends where it does."""

    END_OF_LOG = "end_of_log"
    WINDOW_END = "window_end"
    MAX_JOBS = "max_jobs"
    MAX_DURATION = "max_duration"


@dataclass(frozen=True)
class ReplaySite:
    """What the plan needs of a site: its size and the step its time limits take."""

    name: str
    processors: int
    limit_step_s: int = 1  # SLURM_LIMIT_STEP_S for a Slurm site


@dataclass(frozen=True)
class Window:
    """Log seconds (field 2's clock): jobs submitted at ``start_s <= t < end_s``. No
    start: from the log's first job; no end: to the end of the log."""

    start_s: float | None = None
    end_s: float | None = None


@dataclass(frozen=True)
class SiteMap:
    """Partition (field 16) -> the sites its jobs go to, in turn; ``ANY_PARTITION`` for
    every partition not named (the unknown one, -1, included)."""

    routes: Mapping[str, tuple[str, ...]]

    def sites_for(self, partition: int | None) -> tuple[str, ...]:
        key = str(partition) if partition is not None else None
        if key is not None and key in self.routes:
            return self.routes[key]
        return self.routes.get(ANY_PARTITION, ())

    @property
    def site_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s for sites in self.routes.values() for s in sites))


@dataclass(frozen=True)
class ReplaySettings:
    speedup: float
    window: Window = Window()
    max_jobs: int = DEFAULT_MAX_JOBS
    max_duration_s: float = DEFAULT_MAX_DURATION_S
    oversize: Oversize = Oversize.CAP


@dataclass(frozen=True)
class PlannedJob:
    """One log job as a site job. ``at_s``: wall seconds after the replay's start;
    ``time_limit_s``: what the job asks; ``site_limit_s``: what its site enforces."""

    number: int
    line: int
    partition: int | None
    site: str
    at_s: float
    processors: int
    log_processors: int
    sleep_s: float
    time_limit_s: int
    site_limit_s: int
    limit_from_run_time: bool = False

    @property
    def capped(self) -> bool:
        return self.processors < self.log_processors

    @property
    def expected_timeout(self) -> bool:
        """The sleep outlasts the limit the site enforces: the site will kill it."""
        return self.sleep_s > self.site_limit_s

    @property
    def command(self) -> str:
        return f"sleep {_seconds_text(self.sleep_s)}"

    def name(self, run: str) -> str:
        return f"{run_prefix(run)}{self.number}"

    def as_json(self) -> dict[str, object]:
        return {
            "number": self.number,
            "line": self.line,
            "site": self.site,
            "at_s": self.at_s,
            "processors": self.processors,
            "log_processors": self.log_processors,
            "sleep_s": self.sleep_s,
            "time_limit_s": self.time_limit_s,
            "site_limit_s": self.site_limit_s,
        }


@dataclass(frozen=True)
class ReplayPlan:
    """``origin_s``: the log second the replay's start stands for (the window's start,
    else its first job's submit time; None: the log had no job there); ``read``: how
    many of the log's jobs in the window the plan read (planned or skipped)."""

    jobs: tuple[PlannedJob, ...]
    skipped: Mapping[SkipReason, int]
    stopped_by: StopReason
    settings: ReplaySettings
    origin_s: float | None = None
    read: int = 0
    skipped_jobs: Mapping[SkipReason, tuple[int, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    @property
    def window_json(self) -> dict[str, float | None]:
        return {"start_s": self.origin_s, "end_s": self.settings.window.end_s}

    def why_empty(self) -> str:
        """Why nothing is planned, in words (the command's refusal)."""
        skipped = ", ".join(f"{n} {reason.value}" for reason, n in self.skipped.items())
        if self.stopped_by is StopReason.MAX_DURATION and not self.read:
            return (
                f"no job is due before --max-duration {self.settings.max_duration_s:g} s"
                f" after the window's start (log second {self.origin_s:g})"
            )
        if not self.read:
            return "the log has no job in the window"
        return f"skipped: {skipped or 'none'}; stopped by {self.stopped_by.value}"

    def capped(self, site: str | None = None) -> int:
        return sum(1 for j in self.jobs if j.capped and (site is None or j.site == site))

    @property
    def sites(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(j.site for j in self.jobs))


def plan_replay(
    jobs: Iterable[SwfJob],
    site_map: SiteMap,
    sites: Sequence[ReplaySite],
    settings: ReplaySettings,
) -> ReplayPlan:
    """The plan for ``jobs`` (a log's, in submit order; read only as far as the plan
    goes, so a long log is never read whole). ``sites``: every site the map names."""
    known = {s.name: s for s in sites}
    missing = [name for name in site_map.site_names if name not in known]
    if missing:
        raise ReplayError(f"--site-map: no size given for site(s) {', '.join(missing)}")
    builder = _Builder(site_map, known, settings)
    stopped_by = StopReason.END_OF_LOG
    for job in jobs:
        stop = builder.add(job)
        if stop is not None:
            stopped_by = stop
            break
    return ReplayPlan(
        tuple(builder.planned),
        MappingProxyType(Counter({r: len(n) for r, n in builder.skipped.items()})),
        stopped_by,
        settings,
        builder.origin_s,
        builder.read,
        MappingProxyType({r: tuple(n) for r, n in builder.skipped.items()}),
    )


class _Builder:
    """The plan so far: each log job either planned, skipped with a reason, or the end."""

    def __init__(
        self, site_map: SiteMap, sites: Mapping[str, ReplaySite], settings: ReplaySettings
    ) -> None:
        self.site_map = site_map
        self.sites = sites
        self.settings = settings
        self.planned: list[PlannedJob] = []
        self.skipped: dict[SkipReason, list[int]] = {}
        self.turns: Counter[tuple[str, ...]] = Counter()
        self.origin_s = settings.window.start_s
        self.read = 0

    def add(self, job: SwfJob) -> StopReason | None:
        window = self.settings.window
        if window.start_s is not None and job.submit_s < window.start_s:
            return None
        if window.end_s is not None and job.submit_s >= window.end_s:
            return StopReason.WINDOW_END
        if self.origin_s is None:
            self.origin_s = job.submit_s
        at_s = (job.submit_s - self.origin_s) / self.settings.speedup
        if at_s >= self.settings.max_duration_s:
            return StopReason.MAX_DURATION
        self.read += 1
        planned = self._planned(job, at_s)
        if isinstance(planned, SkipReason):
            self.skipped.setdefault(planned, []).append(job.number)
            return None
        self.planned.append(planned)
        return StopReason.MAX_JOBS if len(self.planned) >= self.settings.max_jobs else None

    def _planned(self, job: SwfJob, at_s: float) -> PlannedJob | SkipReason:
        if job.is_part:
            return SkipReason.PARTIAL_LINE
        size, run_s = job.size, job.run_s
        if size is None:
            return SkipReason.SIZE_UNKNOWN
        if run_s is None:
            return SkipReason.RUN_TIME_UNKNOWN
        targets = self.site_map.sites_for(job.partition)
        if not targets:
            return SkipReason.PARTITION_UNMAPPED
        site = self.sites[targets[self.turns[targets] % len(targets)]]
        if size > site.processors and self.settings.oversize is Oversize.SKIP:
            return SkipReason.OVERSIZE
        self.turns[targets] += 1
        speedup = self.settings.speedup
        sleep_s = round(run_s / speedup, 3)
        asked = job.requested_s if job.requested_s else None
        limit = max(1, math.ceil((run_s if asked is None else asked) / speedup))
        step = site.limit_step_s
        return PlannedJob(
            number=job.number,
            line=job.line,
            partition=job.partition,
            site=site.name,
            at_s=at_s,
            processors=min(size, site.processors),
            log_processors=size,
            sleep_s=sleep_s,
            time_limit_s=limit,
            site_limit_s=math.ceil(limit / step) * step,
            limit_from_run_time=asked is None,
        )


# -- the command line's options, parsed and checked here (one home, pure) -----------------


def parse_site_map(entries: Sequence[str], grid_sites: Iterable[str]) -> SiteMap:
    """``--site-map`` values: ``PARTITION=SITE[+SITE...]`` each, or several separated by
    commas; ``PARTITION`` a partition number (field 16) or ``*``. Every site must be one
    of ``grid_sites``; a partition given twice is refused."""
    known = list(grid_sites)
    routes: dict[str, tuple[str, ...]] = {}
    items = [item.strip() for entry in entries for item in entry.split(",")]
    if not [item for item in items if item]:
        raise ReplayError("--site-map: give at least one PARTITION=SITE (or *=SITE)")
    for item in items:
        if not item:
            continue
        key, sep, value = (part.strip() for part in item.partition("="))
        where = f"--site-map {item!r}"
        if not sep or not key or not value:
            raise ReplayError(f"{where}: not PARTITION=SITE (PARTITION a number or *)")
        if key != ANY_PARTITION and not key.isdigit():
            raise ReplayError(f"{where}: partition {key!r} is neither a number (field 16) nor *")
        key = key if key == ANY_PARTITION else str(int(key))
        if key in routes:
            raise ReplayError(f"{where}: partition {key} is mapped twice")
        names = tuple(name.strip() for name in value.split("+"))
        for name in names:
            if name not in known:
                raise ReplayError(
                    f"{where}: unknown site {name!r} (the grid has: {', '.join(known)})"
                )
        routes[key] = names
    return SiteMap(MappingProxyType(routes))


def run_prefix(run: str) -> str:
    """What every job name of replay ``run`` starts with, and no other run's: a run id
    has no ``-``, so ``gcreplay-ab-`` never starts ``gcreplay-abc-...``."""
    return f"{JOB_NAME_PREFIX}{run}-"


def check_run(run: str) -> str:
    """A run id as ``gridcore replay-cancel RUN`` takes it: letters and digits only (a
    replay's own are 6 hex digits), so its prefix names that run's jobs and no other's."""
    if not run.isascii() or not run.isalnum():
        raise ReplayError(
            f"RUN {run!r}: not a replay's run id (letters and digits, e.g. 3f9a1c: the"
            " replay prints it at its start and in its summary's run)"
        )
    return run


def parse_window(text: str) -> Window:
    """``--window START:END`` in log seconds (a number, or with s, m, h or d), each
    optional: no ``START``, from the log's first job; no ``END``, to the log's end."""
    return Window(*log_span(text, "--window", ReplayError))


def check_settings(speedup: float, max_jobs: int, max_duration_s: float) -> None:
    """ReplayError naming the option for a speedup, job count or duration that is not
    a positive finite number."""
    if not (math.isfinite(speedup) and speedup > 0):
        raise ReplayError(f"--speedup {speedup:g}: must be a positive number")
    if max_jobs < 1:
        raise ReplayError(f"--max-jobs {max_jobs}: must be at least 1")
    if not (math.isfinite(max_duration_s) and max_duration_s > 0):
        raise ReplayError(f"--max-duration {max_duration_s:g}: must be a positive number")


def _seconds_text(seconds: float) -> str:
    """A duration as ``sleep`` takes it: no exponent, no trailing zeros."""
    return f"{seconds:.3f}".rstrip("0").rstrip(".")
