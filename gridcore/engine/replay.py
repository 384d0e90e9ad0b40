"""Submit a replay plan (:mod:`gridcore.workloads.replay`) to live sites: each job at its
time, as another user's job, followed to its end; and stop by itself.

* Other users' load: a replayed job carries no submission key (its name starts with
  ``gcreplay-``), and no hold of the capacity ledger names it, so every engine counts
  it as others' work: pending, in a site's ``external_pending`` processors; running, in
  the site's busy processors (``gridcore.engine.selection.store_observation``); and as
  an external job in the queue-wait history (``gridcore.engine.queue_stats``).
* The end: once every job is submitted the runner waits for them until the replay's
  ``max_duration_s`` has passed since it started (``AtEnd.WAIT``, the default) or stops
  at once (``AtEnd.CANCEL``); then it cancels whatever of its jobs is still pending or
  running and follows them until the sites show them ended. An interrupt
  (:meth:`ReplayRunner.interrupt`, which the command's SIGINT and SIGTERM handlers
  call) does the same at the runner's next step (within ``poll_interval_s``, or once
  the site call under way returns): it only sets a flag, so a submission is never cut
  in the middle and a job a site accepted is always recorded, and cancelled too.
* Following: one ``observe`` per site and poll (which also drives a local site's own
  scheduling: it starts queued jobs when someone looks); a job the observation no
  longer lists is asked for by id.
* A lost answer: a submission whose answer was lost (``AnswerLost``, a Slurm call that
  timed out) may still have made a job. Its name is unique (``gcreplay-<run>-<n>``), so
  each later poll of its site (the stop's included) looks for a keyless job of exactly
  that name in the observation (``ObservedJob.name``); found, its id is adopted and it
  is followed and cancelled as any other (``lost_found``); never listed, it stays
  ``lost`` and ends at its own time limit at the latest.
* A replay killed outright (SIGKILL, a lost machine) cancels nothing; it prints its run
  id at its start, and :func:`cancel_run` (``gridcore replay-cancel RUN``) lists each
  site's pending and running keyless jobs named ``gcreplay-<run>-``, cancels them and
  follows them until ended, as :meth:`ReplayRunner.stop` does.
"""

from __future__ import annotations

import enum
import logging
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from gridcore.engine.submission import resources_at
from gridcore.errors import AnswerLost, GridError, RequestError, SiteError, UnknownJob
from gridcore.model import (
    JobResources,
    JobState,
    JobSubmission,
    ObservedJob,
    SiteKind,
    SiteSpec,
)
from gridcore.sites.base import SiteAdapter
from gridcore.workloads.replay import (
    SLURM_LIMIT_STEP_S,
    PlannedJob,
    ReplayPlan,
    ReplaySite,
    SkipReason,
    check_run,
    run_prefix,
)

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5
"""How often the runner looks at its sites between submissions."""
CONFIRM_TIMEOUT_S = 60.0
"""How long the runner follows the jobs it cancelled at the end before it reports the
ones a site still shows pending or running as ``left_running``."""
MAX_CANCEL_ATTEMPTS = 5
"""How many times the runner asks a site to cancel one of its jobs at the end: once,
then again after each poll that still shows it pending or running (a cancel that
failed, or one the site has not acted on yet), so one transient site error does not
leave a replayed job running until its time limit."""


class AtEnd(enum.StrEnum):
    """What the runner does once every planned job is submitted."""

    WAIT = "wait"  # follow them until max_duration_s, then cancel what still runs
    CANCEL = "cancel"  # cancel what is still pending or running at once


@dataclass
class ReplayedJob:
    """One planned job at its site: the runner's record (mutable, its own)."""

    planned: PlannedJob
    name: str
    job_id: str | None = None
    submitted_at: float | None = None  # runner clock, when the site accepted it
    state: JobState = JobState.SELECTED
    cancelled_by_replay: bool = False
    cancel_attempts: int = 0
    cancel_error: str | None = None  # the last cancel's error; None once one was accepted
    lost: bool = False  # its submission's answer was lost: looked up by name at each poll

    @property
    def live(self) -> bool:
        return self.job_id is not None and not self.state.finished

    @property
    def missing(self) -> bool:
        """Its answer was lost and no poll has found it by name yet."""
        return self.lost and self.job_id is None

    def as_json(self, started: float) -> dict[str, object]:
        at = None if self.submitted_at is None else round(self.submitted_at - started, 3)
        return self.planned.as_json() | {
            "name": self.name,
            "job_id": self.job_id,
            "submitted_s": at,
            "state": self.state.value,
        }


@dataclass(frozen=True)
class ReplayReport:
    """What a replay did; :meth:`as_json` is ``gridcore replay --json``'s object."""

    plan: ReplayPlan
    run: str
    jobs: tuple[ReplayedJob, ...]
    skipped: Mapping[str, int]
    refused: Mapping[str, int]
    submit_failed: Mapping[str, int]
    lost: int
    lost_found: int
    left_running: tuple[ReplayedJob, ...]
    interrupted: str | None
    wall_s: float
    started: float
    at_end: AtEnd

    @property
    def ok(self) -> bool:
        return not self.left_running

    def as_json(self) -> dict[str, object]:
        submitted = [j for j in self.jobs if j.job_id is not None]
        states = Counter(j.state for j in submitted)
        lags = sorted(
            j.submitted_at - self.started - j.planned.at_s
            for j in submitted
            if j.submitted_at is not None
        )
        speedup = self.plan.settings.speedup
        settings = self.plan.settings
        return {
            "run": self.run,
            "speedup": speedup,
            "window": self.plan.window_json,
            "max_jobs": settings.max_jobs,
            "max_duration_s": settings.max_duration_s,
            "oversize": settings.oversize.value,
            "at_end": self.at_end.value,
            "stopped_by": self.plan.stopped_by.value,
            "planned": len(self.plan.jobs),
            "submitted": len(submitted),
            "skipped": dict(self.skipped),
            "capped": sum(1 for j in submitted if j.planned.capped),
            "limit_from_run_time": sum(1 for j in submitted if j.planned.limit_from_run_time),
            "expected_timeouts": sum(1 for j in submitted if j.planned.expected_timeout),
            "completed": states[JobState.COMPLETED],
            "failed": states[JobState.FAILED],
            "cancelled": states[JobState.CANCELLED],
            "cancelled_by_replay": sum(1 for j in submitted if j.cancelled_by_replay),
            "lost": self.lost,
            "lost_found": self.lost_found,
            "left_running": [
                {"site": j.planned.site, "job_id": j.job_id, "cancel_error": j.cancel_error}
                for j in self.left_running
            ],
            "interrupted": self.interrupted,
            "wall_s": round(self.wall_s, 3),
            "lag_s": _spread(lags),
            "lag_log_s": _spread([lag * speedup for lag in lags]),
            "sites": {site: self._site_json(site) for site in self._site_names()},
            "jobs": [j.as_json(self.started) for j in self.jobs if j.job_id is not None],
        }

    def _site_names(self) -> list[str]:
        names = [*self.plan.sites, *self.refused, *self.submit_failed]
        return list(dict.fromkeys(names))

    def _site_json(self, site: str) -> dict[str, int]:
        mine = [j for j in self.jobs if j.planned.site == site and j.job_id is not None]
        states = Counter(j.state for j in mine)
        return {
            "submitted": len(mine),
            "capped": sum(1 for j in mine if j.planned.capped),
            "completed": states[JobState.COMPLETED],
            "failed": states[JobState.FAILED],
            "cancelled": states[JobState.CANCELLED],
            "refused": self.refused.get(site, 0),
            "submit_failed": self.submit_failed.get(site, 0),
        }


def replay_site(adapter: SiteAdapter) -> ReplaySite:
    """What a plan needs of a live site: the largest job it can run (a Slurm job runs
    on one node, so the largest node of the site's partition; a local site: its
    processors), found with the site's own check, and the step of its time limits."""
    spec = adapter.spec
    resources = spec.defaults
    low, high = 0, spec.processors
    while low < high:  # the largest size the site's check accepts (0: none)
        size = (low + high + 1) // 2
        try:
            adapter.check_request("gcreplay-size", size, resources)
        except RequestError:
            high = size - 1
        else:
            low = size
    if low == 0:
        raise RequestError(f"site {spec.name}: refuses even a 1-processor job")
    step = SLURM_LIMIT_STEP_S if spec.kind is SiteKind.SLURM else 1
    return ReplaySite(spec.name, low, step)


class ReplayRunner:
    """Submits ``plan`` through ``adapter(site)``: :meth:`check` first (nothing is
    submitted when a site cannot be asked), then :meth:`run`; tests drive the steps
    (:meth:`start`, :meth:`submit_due`, :meth:`poll`, :meth:`stop`) themselves."""

    def __init__(
        self,
        plan: ReplayPlan,
        adapter: Callable[[str], SiteAdapter],
        *,
        run: str | None = None,
        at_end: AtEnd = AtEnd.WAIT,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        poll_interval_s: float = POLL_INTERVAL_S,
        confirm_timeout_s: float = CONFIRM_TIMEOUT_S,
    ) -> None:
        self.plan = plan
        self.adapter = adapter
        self.run_id = run or uuid.uuid4().hex[:6]
        self.at_end = at_end
        self.clock = clock
        self.sleep = sleep
        self.poll_interval_s = poll_interval_s
        self.confirm_timeout_s = confirm_timeout_s
        self.jobs = [ReplayedJob(p, p.name(self.run_id)) for p in plan.jobs]
        self.skipped: Counter[str] = Counter({r.value: n for r, n in plan.skipped.items()})
        self.refused: Counter[str] = Counter()
        self.submit_failed: Counter[str] = Counter()
        self.started: float | None = None
        self.interrupted: str | None = None
        self._next = 0
        self._polled = float("-inf")

    # -- the whole replay --------------------------------------------------------------

    def check(self) -> None:
        """Ask each site whether it could ever run each planned job (its own limits:
        partition MaxTime, node sizes); a job it refuses is dropped and counted. A site
        that cannot be asked raises (nothing is submitted then)."""
        seen: dict[tuple[str, int, int], str | None] = {}
        kept: list[ReplayedJob] = []
        for job in self.jobs:
            planned = job.planned
            key = (planned.site, planned.processors, planned.time_limit_s)
            if key not in seen:
                seen[key] = self._refusal(planned)
            if seen[key] is None:
                kept.append(job)
                continue
            log.warning("replay: log job %d not submitted: %s", planned.number, seen[key])
            self.refused[planned.site] += 1
            self.skipped[SkipReason.REFUSED.value] += 1
        self.jobs = kept

    def run(self) -> ReplayReport:
        """Submit every job at its time, then end as ``at_end`` says; interrupted
        (:meth:`interrupt`, or a KeyboardInterrupt where no handler calls it) or failed,
        it cancels what it submitted before returning or raising."""
        self.start()
        try:
            self._submit_all()
            if self.at_end is AtEnd.WAIT:
                self._wait_until(self._deadline(), all_submitted=True)
        except KeyboardInterrupt:
            self.interrupt("SIGINT")
        finally:
            self.stop()
        return self.report()

    def interrupt(self, signal_name: str) -> None:
        """Stop at the next step: submit nothing more, cancel what was submitted. Safe
        to call from a signal handler (it only sets a flag); the first call is kept."""
        if self.interrupted is None:
            self.interrupted = signal_name
            log.warning("replay %s: interrupted by %s", self.run_id, signal_name)

    def report(self) -> ReplayReport:
        started = self.started if self.started is not None else self.clock()
        return ReplayReport(
            plan=self.plan,
            run=self.run_id,
            jobs=tuple(self.jobs),
            skipped=dict(self.skipped),
            refused=dict(self.refused),
            submit_failed=dict(self.submit_failed),
            lost=sum(1 for j in self.jobs if j.missing),
            lost_found=sum(1 for j in self.jobs if j.lost and j.job_id is not None),
            left_running=tuple(j for j in self.jobs if j.live),
            interrupted=self.interrupted,
            wall_s=self.clock() - started,
            started=started,
            at_end=self.at_end,
        )

    # -- steps -------------------------------------------------------------------------

    def start(self) -> None:
        self.started = self.clock()

    def submit_due(self) -> int:
        """Submit every job whose time has come; returns how many were submitted."""
        assert self.started is not None, "start() first"
        done = 0
        while self._next < len(self.jobs) and self.interrupted is None:
            job = self.jobs[self._next]
            if self.started + job.planned.at_s > self.clock():
                break
            self._next += 1
            done += self._submit(job)
        return done

    def poll(self) -> None:
        """Read every site that has live (or lost) jobs of this replay (one observation
        each) and update their states, adopting a lost one listed by its name; a site
        that cannot be read now is read next time."""
        self._polled = self.clock()
        by_site: dict[str, list[ReplayedJob]] = {}
        for job in self.jobs:
            if job.live or job.missing:
                by_site.setdefault(job.planned.site, []).append(job)
        for site, jobs in by_site.items():
            try:
                self._poll_site(self.adapter(site), jobs)
            except GridError as exc:
                log.warning("replay: site %s not read now: %s", site, exc)

    def stop(self) -> None:
        """Submit nothing more, cancel every live job and follow them until the sites
        show them ended (at most ``confirm_timeout_s``), cancelling again after each
        poll what is still live (at most ``MAX_CANCEL_ATTEMPTS`` times per job)."""
        self._next = len(self.jobs)
        self.poll()
        _cancel_until_ended(
            self.jobs, self._cancel, self.poll, self.clock, self.sleep,
            self.poll_interval_s, self.confirm_timeout_s,
        )  # fmt: skip

    # -- helpers -----------------------------------------------------------------------

    def _deadline(self) -> float:
        assert self.started is not None
        return self.started + self.plan.settings.max_duration_s

    def _submit_all(self) -> None:
        while self._next < len(self.jobs):
            self.submit_due()
            if self._next >= len(self.jobs) or self.interrupted is not None:
                return
            assert self.started is not None
            self._wait_until(self.started + self.jobs[self._next].planned.at_s)

    def _wait_until(self, moment: float, *, all_submitted: bool = False) -> None:
        """Poll every ``poll_interval_s`` until ``moment`` (or, once all is submitted,
        until no job of the replay is pending or running)."""
        while self.interrupted is None:
            if all_submitted and not any(j.live for j in self.jobs):
                return
            now = self.clock()
            if now >= moment:
                return
            if now - self._polled >= self.poll_interval_s:
                self.poll()
                continue
            self.sleep(max(0.0, min(moment, self._polled + self.poll_interval_s) - now))

    def _submit(self, job: ReplayedJob) -> int:
        planned = job.planned
        submission = JobSubmission(
            job.name,
            planned.command,
            planned.processors,
            resources=JobResources(time_limit_s=planned.time_limit_s),
        )
        try:
            job.job_id = self.adapter(planned.site).submit(submission)
        except AnswerLost as exc:
            job.lost, job.submitted_at = True, self.clock()  # about when, if it was made
            log.warning(
                "replay: log job %d: answer lost (looked for as %s at the next polls): %s",
                planned.number, job.name, exc,
            )  # fmt: skip
            return 0
        except (SiteError, RequestError) as exc:
            self.submit_failed[planned.site] += 1
            self.skipped[SkipReason.SUBMIT_FAILED.value] += 1
            log.warning("replay: log job %d not submitted: %s", planned.number, exc)
            return 0
        job.submitted_at = self.clock()
        job.state = JobState.PENDING
        log.info(
            "replay: log job %d -> site %s job %s (%d processors, %s, limit %d s)",
            planned.number, planned.site, job.job_id, planned.processors,
            planned.command, planned.time_limit_s,
        )  # fmt: skip
        return 1

    def _poll_site(self, adapter: SiteAdapter, jobs: list[ReplayedJob]) -> None:
        listed = adapter.observe().jobs
        by_name = {j.name: j for j in listed if _replayed(j, adapter.user)}
        for job in jobs:
            found = by_name.get(job.name) if job.missing else None
            if found is not None:
                job.job_id, job.state = found.job_id, found.state
                log.warning(
                    "replay: log job %d (answer lost) found at site %s as job %s",
                    job.planned.number, job.planned.site, found.job_id,
                )  # fmt: skip
        followed = [j for j in jobs if j.job_id is not None]
        states = _states(adapter, listed, [j.job_id for j in followed if j.job_id])
        for job in followed:
            job.state = states[str(job.job_id)]

    def _refusal(self, planned: PlannedJob) -> str | None:
        adapter = self.adapter(planned.site)
        resources = resources_at(JobResources(time_limit_s=planned.time_limit_s), adapter.spec)
        _check_workdir(adapter.spec)
        try:
            adapter.check_request(planned.name(self.run_id), planned.processors, resources)
        except RequestError as exc:
            return str(exc)
        return None

    def _cancel(self, job: ReplayedJob) -> None:
        assert job.job_id is not None
        job.cancel_attempts += 1
        job.cancel_error = _ask_cancel(
            self.adapter(job.planned.site), job.job_id, job.cancel_attempts
        )
        job.cancelled_by_replay = job.cancelled_by_replay or job.cancel_error is None


# -- after a replay killed outright: its jobs found by name, cancelled -------------------


@dataclass
class FoundJob:
    """One pending or running job of a replay's run that :func:`cancel_run` found at a
    site (mutable, its own record)."""

    site: str
    job_id: str
    name: str
    state: JobState
    cancel_attempts: int = 0
    cancel_error: str | None = None  # the last cancel's error; None once one was accepted
    cancel_accepted: bool = False

    @property
    def live(self) -> bool:
        return not self.state.finished

    def as_json(self) -> dict[str, object]:
        return {
            "site": self.site,
            "job_id": self.job_id,
            "name": self.name,
            "state": self.state.value,
            "cancel_error": self.cancel_error,
        }


@dataclass(frozen=True)
class CancelRunReport:
    """What :func:`cancel_run` did; :meth:`as_json` is ``gridcore replay-cancel
    --json``'s object."""

    run: str
    sites: tuple[str, ...]
    jobs: tuple[FoundJob, ...]
    unread: Mapping[str, str]  # site -> why it could not be listed (its jobs unknown)
    wall_s: float

    @property
    def left_running(self) -> tuple[FoundJob, ...]:
        return tuple(j for j in self.jobs if j.live)

    @property
    def ok(self) -> bool:
        """Nothing of the run is left: every site listed, every job found ended."""
        return not self.left_running and not self.unread

    def as_json(self) -> dict[str, object]:
        ended = [j for j in self.jobs if not j.live]
        return {
            "run": self.run,
            "prefix": run_prefix(self.run),
            "sites": list(self.sites),
            "found": len(self.jobs),
            "cancelled": sum(1 for j in ended if j.cancel_accepted),
            "ended_by_themselves": sum(1 for j in ended if not j.cancel_accepted),
            "left_running": [j.as_json() for j in self.left_running],
            "unread_sites": dict(self.unread),
            "wall_s": round(self.wall_s, 3),
            "jobs": [j.as_json() for j in self.jobs],
        }


def _replayed(job: ObservedJob, user: str | None) -> bool:
    """Could ``job`` be one a replay submitted through an adapter acting as ``user``: no
    key, a name, and (where both are known) that user's. Another user's job of the same
    name (slurmrestd lists everyone's) is never adopted or cancelled."""
    if job.key is not None or job.name is None:
        return False
    return user is None or job.user is None or job.user == user


def cancel_run(
    run: str,
    sites: Sequence[str],
    adapter: Callable[[str], SiteAdapter],
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_interval_s: float = POLL_INTERVAL_S,
    confirm_timeout_s: float = CONFIRM_TIMEOUT_S,
) -> CancelRunReport:
    """Cancel what a replay that could not stop itself left: each site's pending and
    running jobs with no key whose name starts ``gcreplay-<run>-`` (one ``observe``
    each), asked as :meth:`ReplayRunner.stop` asks (again after each poll that still
    shows one, at most ``MAX_CANCEL_ATTEMPTS`` times) and followed until the sites show
    them ended (at most ``confirm_timeout_s``). Jobs of another run, and keyed or
    differently named jobs, are never touched. A site that cannot be listed is
    reported in ``unread`` (its jobs are unknown: run it again)."""
    prefix = run_prefix(check_run(run))
    started = clock()
    found: list[FoundJob] = []
    unread: dict[str, str] = {}
    for site in dict.fromkeys(sites):
        try:
            listed = adapter(site).observe().jobs
        except GridError as exc:
            unread[site] = str(exc)
            log.warning("replay-cancel: site %s not listed: %s", site, exc)
            continue
        user = adapter(site).user
        found += [
            FoundJob(site, j.job_id, j.name, j.state)
            for j in listed
            if _replayed(j, user) and j.name is not None and j.name.startswith(prefix)
            and not j.state.finished
        ]  # fmt: skip
    log.info("replay-cancel %s: %d job(s) pending or running", run, len(found))

    def cancel(job: FoundJob) -> None:
        job.cancel_attempts += 1
        job.cancel_error = _ask_cancel(adapter(job.site), job.job_id, job.cancel_attempts)
        job.cancel_accepted = job.cancel_accepted or job.cancel_error is None

    def poll() -> None:
        for site in dict.fromkeys(j.site for j in found if j.live):
            mine = [j for j in found if j.site == site and j.live]
            try:
                site_adapter = adapter(site)
                states = _states(
                    site_adapter, site_adapter.observe().jobs, [j.job_id for j in mine]
                )
            except GridError as exc:
                log.warning("replay-cancel: site %s not read now: %s", site, exc)
                continue
            for job in mine:
                job.state = states[job.job_id]

    _cancel_until_ended(found, cancel, poll, clock, sleep, poll_interval_s, confirm_timeout_s)
    return CancelRunReport(
        run, tuple(dict.fromkeys(sites)), tuple(found), unread, clock() - started
    )


def _states(
    adapter: SiteAdapter, listed: Sequence[ObservedJob], job_ids: Sequence[str]
) -> dict[str, JobState]:
    """Each job's state: as ``listed`` (the site's observation) shows it, else asked for
    by id (no longer listed: it ended); a job the site has forgotten counts failed."""
    observed = {j.job_id: j.state for j in listed}
    states: dict[str, JobState] = {}
    for job_id in job_ids:
        state = observed.get(job_id)
        if state is None:
            try:
                state = adapter.status(job_id).state
            except UnknownJob:
                log.warning(
                    "replay: site %s forgot job %s: counted failed", adapter.spec.name, job_id
                )
                state = JobState.FAILED
        states[job_id] = state
    return states


class _Cancelling(Protocol):
    """A job record :func:`_cancel_until_ended` follows."""

    @property
    def live(self) -> bool: ...

    @property
    def cancel_attempts(self) -> int: ...


_Job = TypeVar("_Job", bound=_Cancelling)


def _cancel_until_ended(
    jobs: Sequence[_Job],
    cancel: Callable[[_Job], None],
    poll: Callable[[], None],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    poll_interval_s: float,
    confirm_timeout_s: float,
) -> None:
    """Ask ``cancel`` for each live job, then, until none is live or
    ``confirm_timeout_s`` has passed, ``poll`` every ``poll_interval_s`` and ask again
    for the ones still live: at most ``MAX_CANCEL_ATTEMPTS`` times a job (a replay's
    own end, :meth:`ReplayRunner.stop`, and :func:`cancel_run` after a killed one)."""

    def cancel_live() -> None:
        for job in jobs:
            if job.live and job.cancel_attempts < MAX_CANCEL_ATTEMPTS:
                cancel(job)

    cancel_live()
    deadline = clock() + confirm_timeout_s
    while any(job.live for job in jobs) and clock() < deadline:
        sleep(poll_interval_s)
        poll()
        cancel_live()


def _ask_cancel(adapter: SiteAdapter, job_id: str, attempt: int) -> str | None:
    """Ask the site to cancel ``job_id``: None once it accepted, else its error."""
    try:
        adapter.cancel(job_id)
    except GridError as exc:
        log.warning(
            "replay: site %s: cancelling job %s failed (attempt %d of %d): %s",
            adapter.spec.name, job_id, attempt, MAX_CANCEL_ATTEMPTS, exc,
        )  # fmt: skip
        return str(exc)
    return None


def _check_workdir(spec: SiteSpec) -> None:
    if spec.kind is SiteKind.SLURM and not spec.storage_dir:
        raise RequestError(
            f"site {spec.name}: replayed jobs run in the site's storage_dir, and it has none"
        )


def _spread(values: list[float]) -> dict[str, float | None]:
    """Median, 95th percentile (linear between order statistics) and maximum."""
    if not values:
        return {"median": None, "p95": None, "max": None}
    p95 = (
        values[0]
        if len(values) == 1
        else statistics.quantiles(values, n=20, method="inclusive")[18]
    )
    return {
        "median": round(statistics.median(values), 3),
        "p95": round(p95, 3),
        "max": round(max(values), 3),
    }


__all__ = [
    "AtEnd",
    "CancelRunReport",
    "FoundJob",
    "ReplayReport",
    "ReplayRunner",
    "cancel_run",
    "replay_site",
]
