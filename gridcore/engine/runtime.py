"""The live engine for independent jobs: select a site, submit, follow, cancel.

Site I/O (observe, submit, status, cancel) happens outside transactions; every state
change is one committed transaction on the state database, so a killed worker or
triggerer resumes from the rows (``poll`` is idempotent).

A selection's site job carries the key ``gc-<install>-s<selection id>``
(:mod:`gridcore.sites.keys`): ``submit`` (and the expiry of a selection whose worker
died) first asks the site for it and adopts the job found, so a kill at any point makes
at most one site job per selection; ``refresh`` cancels our keyed jobs whose holder is
gone (:mod:`gridcore.engine.submission`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from sqlalchemy import and_, select, update

from gridcore import credentials
from gridcore.config import GRID_ENV, default_grid, load_grid
from gridcore.engine import health, queue_stats, submission, wait_models
from gridcore.engine import selection as selection_engine
from gridcore.errors import (
    AnswerLost,
    ConfigError,
    CredentialError,
    CredentialRejected,
    GridError,
    RequestError,
    SiteError,
    SiteUnavailable,
    StateError,
    UnknownJob,
)
from gridcore.model import (
    UNFINISHED_STATES,
    GridSpec,
    JobRequest,
    JobResources,
    JobState,
    JobStatus,
    JobSubmission,
    JobUsage,
    ObservedJob,
    SiteKind,
    SiteObservation,
    SiteSelection,
    SiteSpec,
)
from gridcore.policies.selection import DEFAULT_PROTOCOL, InsufficientMode, SelectionProtocol
from gridcore.policies.wait_prediction import WaitForecast
from gridcore.sites.base import SiteAdapter
from gridcore.sites.keys import probe_key, selection_key
from gridcore.sites.output import OutputFiles
from gridcore.state import capacity
from gridcore.state.schema import selections, sites
from gridcore.state.store import Store, open_store, state_dir
from gridcore.validation import check_job_request, check_job_submission, check_selection_stream

# Observations older than this are refreshed before a decision (monitoring period).
DEFAULT_MAX_AGE_S = 5.0
# A selection not submitted within this time lost its worker; its claim is returned.
SUBMIT_DEADLINE_S = 600.0
# What a health probe runs (gridcore.engine.health: the way back of an unusable site).
PROBE_COMMAND = "true"
PROBE_TIME_LIMIT_S = 300
"""A probe asks for 5 minutes (its site's other defaults, account or QOS, still apply):
a short job the cluster can backfill, not the site's default limit for real work."""
PROBE_RETRY_S = 60.0
"""An unusable site gets a new probe at most this often (after a failed or lost one)."""

log = logging.getLogger(__name__)


# What a pending job's record says when the site queued it again or holds it.
_PENDING_NOTES = ("requeued by Slurm", "held")
# the states of a selection whose job the site has (or may have) and has not ended
_SUBMITTED = (JobState.PENDING.value, JobState.RUNNING.value)
UNPOLLED_AFTER_S = 300.0
"""A selection whose job the site shows ended this long ago has no task polling it any
more (a deferred task's trigger polls every few seconds to a minute): a refresh ends it
(:meth:`GridRuntime._end_unpolled`). Slurm keeps an ended job listed for ``MinJobAge``,
300 s by default; the local site lists no ended job, so its ends are found at once."""


def _unfinished(selection_id: int) -> Any:
    """The selection's row, while it has not ended: only such a row takes a poll's news
    (a task's trigger and another process's refresh can both carry news of one job)."""
    return and_(selections.c.id == selection_id, selections.c.state.in_(UNFINISHED_STATES))


def _ended_unpolled(job: ObservedJob, observed_at: float) -> bool:
    """The site showed ``job`` ended at least :data:`UNPOLLED_AFTER_S` before
    ``observed_at``. A listed job ended at a time the site does not give (Slurm: one
    cancelled while pending) is left until the site no longer lists it: its own poller
    may still come, and the site's accounting may not have it yet."""
    ended = job.ended_at
    return job.state.finished and ended is not None and observed_at - ended >= UNPOLLED_AFTER_S


@dataclass(frozen=True)
class JobRecord:
    """A selection and its job as the state DB knows it; plain JSON via ``as_json``."""

    selection_id: int
    name: str
    site: str
    processors: int
    outcome: str
    state: str
    job_id: str | None
    exit_code: int | None
    message: str
    reasons: tuple[str, ...]
    selected_at: float
    submitted_at: float | None
    started_at: float | None
    finished_at: float | None
    # what the finished job used (JobUsage.as_json), where the site has accounting
    usage: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return JobState(self.state).finished

    @property
    def queued_s(self) -> float | None:
        if self.started_at is None or self.submitted_at is None:
            return None
        return max(0.0, self.started_at - self.submitted_at)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["reasons"] = list(self.reasons)
        data["queued_s"] = self.queued_s
        return data


@dataclass(frozen=True)
class SiteRow:
    """One site for ``gridcore sites``: its report, the capacity ledger, its health.

    ``free``: the processors a claim may take now (capacity.FREE); ``claimed``/``queued``:
    processors our holds keep; ``holds``: kind of holder -> {"holds", "processors",
    "bytes"} of the live holds; ``storage_total`` None = unlimited."""

    name: str
    kind: str
    total: int
    idle: int
    free: int
    external_pending: int
    claimed: int
    queued: int
    storage_total: int | None
    storage_claimed: int
    holds: dict[str, dict[str, int]]
    usable: bool
    consecutive_errors: int
    last_error: str | None
    probe_job_id: str | None
    observed_at: float
    # Slurm sites: the release (meta.slurm.release) and the REST API version in use
    release: str | None = None
    api_version: str | None = None
    last_error_at: float | None = None


class GridRuntime:
    """Grid description + state store + lazily built site adapters."""

    def __init__(
        self,
        grid: GridSpec,
        store: Store,
        adapters: Mapping[str, SiteAdapter] | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.grid = grid
        self.store = store
        self.clock = clock
        self.rng = rng or random.Random()
        self._adapters: dict[str, SiteAdapter] = dict(adapters or {})
        # snapshots by database row, reused across this engine's decisions
        self.snapshots = selection_engine.SnapshotReader(grid)
        self.probe_retry_s = PROBE_RETRY_S
        store.check_migrated()
        with store.begin() as conn:
            capacity.register_sites(conn, grid, self.clock())
            self.install_id = submission.install_id(conn)

    @classmethod
    def open(
        cls, grid_file: str | None = None, db_url: str | None = None, *, upgrade: bool = True
    ) -> GridRuntime:
        """The grid from ``grid_file`` / $GRIDCORE_GRID, else the embedded default."""
        path = grid_file or os.environ.get(GRID_ENV)
        grid = load_grid(path) if path else default_grid(state_dir())
        return cls(grid, open_store(db_url, upgrade=upgrade))

    # -- adapters ------------------------------------------------------------------

    def adapter(self, site: str) -> SiteAdapter:
        if site not in self._adapters:
            self._adapters[site] = self._build_adapter(self.grid.site(site))
        return self._adapters[site]

    def output_files(self, site: str, job_id: str) -> OutputFiles:
        """Where job ``job_id`` of ``site`` writes its stdout and stderr
        (:mod:`gridcore.sites.output` follows them into task logs)."""
        return self.adapter(site).output_files(job_id)

    def _build_adapter(self, spec: SiteSpec) -> SiteAdapter:
        if spec.kind is SiteKind.LOCAL:
            from gridcore.sites.local import LocalSite

            return LocalSite(spec, self.store, self.clock)
        from gridcore.sites.slurm import SlurmSite

        if spec.token is None:
            raise RequestError(f"site {spec.name}: slurm sites need a token reference")
        return SlurmSite(spec, credentials.token_source(spec.token, spec.name))

    # -- monitoring ------------------------------------------------------------------

    def refresh(
        self,
        max_age_s: float = 0.0,
        *,
        count_health: bool = True,
        skip: Collection[str] = (),
    ) -> dict[str, str | None]:
        """Observe every site whose stored report is older than ``max_age_s``, but the
        sites in ``skip`` (a scan's sites that did not answer its first look: a silent
        site costs one timeout per scan, not one per job the scan handles).
        Returns site -> error message (None when the observation succeeded).

        ``count_health``: a failed observation counts as the site's error and unusable
        sites are probed (the engines). False for a look that must leave every site's
        health as it was (``gridcore sites``): a failure is only returned, no probe job is
        sent; the reports it reads are stored as any observation's."""
        now = self.clock()
        self.store_forecasts()  # a scan's (VJM's) since the last refresh
        self._adopt_unrecorded(now - SUBMIT_DEADLINE_S)
        with self.store.begin() as conn:
            ages = dict(conn.execute(select(sites.c.name, sites.c.observed_at)).all())
            # The same cutoff as the look-ups: every selection expired here was looked up.
            selection_engine.expire_unsubmitted(conn, now - SUBMIT_DEADLINE_S, now)
        results: dict[str, str | None] = {}
        for spec in self.grid.sites:
            if spec.name not in skip and now - ages.get(spec.name, 0.0) >= max_age_s:
                results[spec.name] = self._observe(spec.name, count_health=count_health)
        if not count_health:
            return results
        # Unusable sites come back by a completed probe, for every user of the runtime.
        for reason in self.probe_unusable_sites(now):
            log.info("%s", reason)
        return results

    def store_forecasts(self) -> None:
        """Store the forecasts of pending jobs the wait models made since the last call
        and not stored yet (a selection stores its own; VJM's and KOALA's scans rebuild
        models too), each site in its own short transaction: the conformal bound's
        residuals, for every process (gridcore.engine.wait_models)."""
        if self.snapshots.waits is not None:
            wait_models.store_forecasts(self.store, self.snapshots.waits)

    def probe_unusable_sites(
        self, now: float, retry_after_s: float | None = None, command: str = PROBE_COMMAND
    ) -> list[str]:
        """One probing step for every unusable grid site; returns readable reasons.

        A site without a probe gets one (at most every ``retry_after_s``, by default
        ``probe_retry_s``); a completed probe restores the site; a failed or lost one
        leaves it unusable until the next probe (gridcore.engine.health records it)."""
        retry_after_s = self.probe_retry_s if retry_after_s is None else retry_after_s
        with self.store.begin() as conn:
            unusable = [h for h in health.read_health(conn).values() if not h.usable]
        reasons: list[str] = []
        for record in unusable:
            if record.site not in self.grid.site_names:
                continue
            if record.probe_job_id is None:
                reasons += self._start_probe(record, now, retry_after_s, command)
            else:
                reasons += self._check_probe(record)
        return reasons

    def _start_probe(
        self, record: health.HealthRecord, now: float, retry_after_s: float, command: str
    ) -> list[str]:
        site = record.site
        last = record.probe_started_at
        if last is not None and now - last < retry_after_s:
            return []
        token = uuid.uuid4().hex[:16]
        holder = f"{site}:{token}"  # gridcore.engine.submission judges its job by this name
        with self.store.begin() as conn:
            health.start_probe(conn, site, holder, now)
        try:
            probe = JobSubmission(
                "gridcore-probe",
                command,
                1,
                key=probe_key(self.install_id, site, token),
                resources=JobResources(time_limit_s=PROBE_TIME_LIMIT_S),
            )
            job_id, _ = submission.submit_once(self.adapter(site), probe)
        except GridError as exc:
            why = f"probe could not be submitted: {exc}"
            with self.store.begin() as conn:
                health.probe_not_submitted(conn, site, holder, now, why)
            return [f"site {site}: {why}"]
        with self.store.begin() as conn:
            health.probe_submitted(conn, site, holder, job_id, now)
        return [f"site {site}: unusable, probe job {job_id} submitted"]

    def _check_probe(self, record: health.HealthRecord) -> list[str]:
        site, job_id = record.site, str(record.probe_job_id)
        try:
            status = self.adapter(site).status(job_id)
        except GridError as exc:
            why = f"probe job {job_id} lost: {exc}"
            with self.store.begin() as conn:
                health.probe_ended(conn, site, False, record.probe_started_at, why)
            return [f"site {site}: {why}"]
        if not status.state.finished:
            return []
        completed = status.state is JobState.COMPLETED
        why = f"probe job {job_id} {status.state.value}"
        with self.store.begin() as conn:
            health.probe_ended(conn, site, completed, record.probe_started_at, why)
        if completed:
            return [f"site {site}: probe job {job_id} completed, usable again"]
        return [f"site {site}: {why}, still unusable"]

    def _observe(self, site: str, *, count_health: bool = True) -> str | None:
        try:
            obs = self.adapter(site).observe()
        except GridError as exc:
            if count_health:
                with self.store.begin() as conn:
                    health.record_failure(conn, site, str(exc))
            return str(exc)
        with self.store.begin() as conn:
            # our own jobs (not others' pending work): the site jobs of live holds
            selection_engine.store_observation(conn, obs)
            queue_stats.record_observation(conn, obs)  # VJM Eq. 1's queue-wait history
        self._cancel_orphans(site, obs.jobs)
        if count_health:  # a look that must change nothing (gridcore sites) ends nothing
            self._end_unpolled(site, obs)
        return None

    def _end_unpolled(self, site: str, obs: SiteObservation) -> None:
        """End the site's live selections that no task polls any more (its task killed
        and not retried; an Airflow task resumed with another's event,
        docs/operators.md), so that they release their processors: those whose job this
        observation no longer lists, or shows ended :data:`UNPOLLED_AFTER_S` ago. Only
        the site's own status of the job changes a record, as :meth:`poll` does; a job
        the site forgot (no accounting) ends failed, its end unknown. Nothing here counts
        toward the site's health, and nothing raised here reaches the caller, whose
        refresh is for other work: a site that stops answering is left to the next
        refresh."""
        listed = {job.job_id: job for job in obs.jobs}
        try:
            with self.store.begin() as conn:
                live = conn.execute(
                    select(selections.c.id, selections.c.job_id)
                    .where(
                        and_(
                            selections.c.site == site,
                            selections.c.state.in_(_SUBMITTED),
                            selections.c.job_id.is_not(None),
                            # submitted after the look began: not listed, and not gone
                            selections.c.submitted_at < obs.observed_at,
                        )
                    )
                    .order_by(selections.c.id)
                ).all()
        except Exception as exc:  # the caller's refresh is for other work
            log.warning("site %s: reading its live selections failed: %s", site, exc)
            return
        for selection_id, job_id in live:
            seen = listed.get(job_id)
            if seen is not None and not _ended_unpolled(seen, obs.observed_at):
                continue  # live, or ended so lately that its own poller still comes
            try:
                self._end_if_ended(site, selection_id, job_id)
            except Exception as exc:  # the caller's refresh is for other work
                log.warning(
                    "site %s: status of unpolled job %s (selection %s) failed: %s",
                    site,
                    job_id,
                    selection_id,
                    exc,
                    exc_info=not isinstance(exc, GridError),
                )
                if isinstance(exc, SiteUnavailable):
                    return  # the site stopped answering: the next refresh asks again
                # this job's answer is the problem: the site's other jobs still end

    def _end_if_ended(self, site: str, selection_id: int, job_id: str) -> None:
        try:
            status = self.adapter(site).status(job_id)
        except UnknownJob as exc:
            why = f"{exc}: its end is unknown (no task asked while the site knew it)"
            self._finish(selection_id, JobState.FAILED, None, why, count=False)
            return
        self._apply_status(self.record(selection_id), status, count=False)

    def _cancel_orphans(self, site: str, jobs: tuple[ObservedJob, ...]) -> None:
        """Cancel the site's jobs with our key and no live holder; a selection still
        waiting for its job adopts it instead."""
        with self.store.begin() as conn:
            orphans = submission.judge_keyed_jobs(conn, self.install_id, site, jobs, self.clock())
        for job_id in orphans:
            self.cancel_site_job(site, job_id, "no live holder (orphan)")

    def cancel_site_job(self, site: str, job_id: str | None, why: str) -> None:
        """Cancel ``job_id`` at ``site`` (nothing for None), saying ``why`` in the log; a
        site that refuses or cannot be reached is logged, not raised: the job is an
        orphan the next refresh finds again. Every engine cancels through here."""
        if job_id is None:
            return
        try:
            self.adapter(site).cancel(job_id)
        except GridError as exc:
            log.warning("site %s: cancelling job %s (%s) failed: %s", site, job_id, why, exc)
            return
        log.info("site %s: cancelled job %s: %s", site, job_id, why)

    def cancel_site_jobs(self, jobs: Iterable[tuple[str, str]], why: str) -> None:
        """:meth:`cancel_site_job` for each (site, job id) of ``jobs``."""
        for site, job_id in jobs:
            self.cancel_site_job(site, job_id, why)

    def _adopt_unrecorded(self, older_than: float) -> None:
        """Before selections past the submission deadline expire, ask their sites for
        their keys: a worker may have died after the site accepted the job."""
        with self.store.begin() as conn:
            stale = conn.execute(
                select(selections.c.id, selections.c.site, selections.c.selected_at).where(
                    and_(
                        selections.c.state == JobState.SELECTED.value,
                        selections.c.job_id.is_(None),
                        selections.c.selected_at < older_than,
                    )
                )
            ).all()
        for sid, site, selected_at in stale:
            # Not found (or the site cannot be asked): it expires; a job the site does
            # have is an orphan the next refresh cancels.
            submission.adopt_stale(
                self.adapter,
                site,
                selection_key(self.install_id, sid),
                functools.partial(self._adopt_selection_job, sid),
                since=selected_at,
            )

    def _adopt_selection_job(self, selection_id: int, job_id: str) -> None:
        with self.store.begin() as conn:
            submission.adopt_selection_job(conn, selection_id, job_id, self.clock())

    # -- jobs --------------------------------------------------------------------------

    def select(
        self,
        request: JobRequest,
        protocol: SelectionProtocol = DEFAULT_PROTOCOL,
        mode: InsufficientMode = InsufficientMode.BEST,
        stream: str = "default",
        site: str | None = None,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        *,
        among: Collection[str] | None = None,
    ) -> JobRecord:
        """Choose a site (or record the pinned ``site``) and commit the decision.
        A malformed request (gridcore.validation) is refused before anything is written.
        ``mode`` decides only for the paper's protocols when no site fits (the default
        protocol ranks every site by its completion estimate and ignores it).
        ``among``: the policy chooses only among these sites of the grid (an unknown
        name is refused before anything is written)."""
        request = check_job_request(request, self.grid.site_names)
        stream = check_selection_stream(stream)
        snapshots = self.snapshots if among is None else self._snapshots_among(among, site)
        if site is not None:
            self.grid.site(site)
            with self.store.begin() as conn:
                rec = selection_engine.record_pinned(conn, request, site, stream, self.clock())
            return self.record(rec.id)
        self.refresh(max_age_s)
        rec = selection_engine.select_and_record(
            self.store, snapshots, request, protocol, mode, stream, self.clock(), self.rng
        )
        return self.record(rec.id)

    def estimate(
        self,
        request: JobRequest,
        protocol: SelectionProtocol = DEFAULT_PROTOCOL,
        mode: InsufficientMode = InsufficientMode.BEST,
        site: str | None = None,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        *,
        among: Collection[str] | None = None,
    ) -> tuple[SiteSelection, Mapping[str, WaitForecast]]:
        """The decision :meth:`select` would make now (the pinned ``site`` taken as it
        would, whatever its health), and the wait model's forecast per site that has one;
        no selection is recorded, and the sites' health is left as it was (a failed
        observation counts for nothing, no probe job is sent), as ``gridcore sites``
        does (``gridcore submit --test-only``)."""
        request = check_job_request(request, self.grid.site_names)
        if site is not None:
            among = [site]  # _snapshots_among refuses an unknown name
        snapshots = self.snapshots if among is None else self._snapshots_among(among, site)
        self.refresh(max_age_s, count_health=False)
        return selection_engine.decide(
            self.store, snapshots, request, protocol, mode, self.clock(), self.rng, site
        )

    def sites_that_can_run(
        self, name: str, processors: int, resources: JobResources, names: Collection[str]
    ) -> tuple[list[str], list[str]]:
        """Which of ``names`` could ever run the job (each site's own limits, over its
        defaults: ``SiteAdapter.check_request``), and why each other one cannot; a site
        that cannot be asked now is kept (the policy and its health judge it). Like
        ``sbatch -M a,b,c``, a choice among clusters skips those that would refuse it."""
        fit: list[str] = []
        refused: list[str] = []
        for site in names:
            spec = self.grid.site(site)
            try:
                self.adapter(site).check_request(
                    name, processors, submission.resources_at(resources, spec)
                )
            except RequestError as exc:
                refused.append(str(exc))
                continue
            except SiteError as exc:
                log.warning("site %s: cannot check the request now: %s", site, exc)
            fit.append(site)
        return fit, refused

    def _snapshots_among(
        self, names: Collection[str], site: str | None
    ) -> selection_engine.SnapshotReader:
        """A snapshot reader that sees only ``names`` (the same decision, fewer
        candidates); a pinned ``site`` must be one of them."""
        chosen = {self.grid.site(name).name for name in names}
        if not chosen:
            raise RequestError("among: give at least one site to choose from")
        if site is not None and site not in chosen:
            raise RequestError(f"site {site!r} is pinned, but not among {sorted(chosen)}")
        grid = replace(self.grid, sites=tuple(s for s in self.grid.sites if s.name in chosen))
        reader = selection_engine.SnapshotReader(grid)
        reader.waits = self.snapshots.waits  # the sites' models, trained once per process
        return reader

    def select_batch(
        self,
        requests: Sequence[JobRequest],
        protocol: SelectionProtocol = DEFAULT_PROTOCOL,
        mode: InsufficientMode = InsufficientMode.BEST,
        stream: str = "default",
        max_age_s: float = DEFAULT_MAX_AGE_S,
    ) -> list[JobRecord]:
        """:meth:`select` for a burst of members that arrive together (one mapped task
        expansion, one forcing event): decided on ONE snapshot, each member in turn seeing
        the ones before it in flight, and committed in ONE transaction
        (:func:`gridcore.engine.selection.select_and_record_batch`). Every request is checked
        first; a malformed one, or one no site can run, is refused naming it and nothing
        of the burst is written. Records in the order of ``requests``."""
        checked = [check_job_request(r, self.grid.site_names) for r in requests]
        stream = check_selection_stream(stream)
        if not checked:
            return []
        repeated = sorted(n for n, k in Counter(r.name for r in checked).items() if k > 1)
        if repeated:
            # one selection per member: the burst's rows are matched to their holds by name
            raise RequestError(f"requests: member names must be unique in a burst: {repeated}")
        self.refresh(max_age_s)
        recorded = selection_engine.select_and_record_batch(
            self.store, self.snapshots, checked, protocol, mode, stream, self.clock(), self.rng
        )
        return self.records([rec.id for rec in recorded])

    def submit(self, selection_id: int, job: JobSubmission) -> JobRecord:
        """Submit the selected job to its site, once: under the selection's key, looked
        up at the site first (a job found is adopted). A submission whose answer was
        lost and whose key the site does not show (yet) raises :class:`AnswerLost` and
        leaves the selection as it was, selected with its claim: the next call (a
        retry), a refresh or the submission deadline finds its job by the key, or
        expires it. On any other error the selection is marked failed and its
        processors released before the error propagates."""
        current = self.record(selection_id)
        if current.job_id is not None or current.finished:
            return current
        keyed = replace(job, key=selection_key(self.install_id, selection_id))
        try:
            checked = check_job_submission(keyed)  # a malformed field fails the selection
            job_id, _ = submission.submit_once(
                self.adapter(current.site), checked, since=current.selected_at
            )
        except AnswerLost as exc:
            # Unknown, not failed: releasing it now and selecting afresh under a new key
            # is how a lost answer became two jobs. Not the site's error either.
            log.warning("selection %s: submission unknown: %s", selection_id, exc)
            raise
        except Exception as exc:  # whatever it is, the claim must not leak
            why = str(exc) if isinstance(exc, GridError) else f"{type(exc).__name__}: {exc}"
            # A request the site refuses, or our credential, says nothing of the site's
            # health: it is not set aside for them.
            healthy = isinstance(exc, RequestError | ConfigError | CredentialError)
            healthy = healthy or isinstance(exc, CredentialRejected)
            self._finish(
                selection_id, JobState.FAILED, None, f"submit failed: {why}", count=not healthy
            )
            raise
        with self.store.begin() as conn:
            recorded = submission.adopt_selection_job(conn, selection_id, job_id, self.clock())
        record = self.record(selection_id)
        if not recorded and record.job_id != job_id:
            # The selection expired, failed or got another job meanwhile: ours has no holder.
            self.cancel_site_job(current.site, job_id, f"selection {selection_id} moved on")
        return record

    def poll(self, selection_id: int) -> JobRecord:
        """Ask the site for the job's state and commit what changed."""
        current = self.record(selection_id)
        if current.job_id is None or current.finished:
            return current
        try:
            status = self.adapter(current.site).status(current.job_id)
        except CredentialRejected:
            raise  # our credential, not the site's health
        except SiteError as exc:
            with self.store.begin() as conn:
                health.record_failure(conn, current.site, str(exc))
            raise
        self._apply_status(current, status)
        return self.record(selection_id)

    def _apply_status(self, current: JobRecord, status: JobStatus, *, count: bool = True) -> None:
        """Commit what the site's ``status`` of the selection's job changes, to a row not
        ended meanwhile by another poller; ``count``: an end counts toward the site's
        health (:meth:`_finish`)."""
        selection_id = current.selection_id
        if status.state.finished:
            started = status.started_at or current.started_at
            self._finish(
                selection_id,
                status.state,
                status.exit_code,
                status.reason,
                status.finished_at,
                started,
                status.usage,
                count=count,
            )
        elif status.state is JobState.RUNNING and current.state != JobState.RUNNING.value:
            with self.store.begin() as conn:
                conn.execute(
                    update(selections)
                    .where(_unfinished(selection_id))
                    .values(
                        state=JobState.RUNNING.value,
                        started_at=status.started_at or self.clock(),
                        # running again after a requeue or hold: that note is history
                        message=""
                        if current.message.startswith(_PENDING_NOTES)
                        else current.message,
                    )
                )
        elif status.state is JobState.PENDING:
            self._note_pending(current, status)

    def _note_pending(self, current: JobRecord, status: JobStatus) -> None:
        """A job the site queued again (requeued after a node failure or preemption) or
        holds is pending, not failed: its record says so, in words the task log shows."""
        note = ""
        if status.requeued_by:
            note = f"requeued by Slurm: {status.requeued_by}"
        if status.held:
            note = f"{note}; held" if note else "held"
            note += f" ({status.reason})" if status.reason else ""
        if current.state == JobState.PENDING.value and current.message == note:
            return
        stale = current.message.startswith(_PENDING_NOTES)
        if current.state != JobState.RUNNING.value and not note and not stale:
            return
        with self.store.begin() as conn:
            conn.execute(
                update(selections)
                .where(_unfinished(current.selection_id))
                .values(state=JobState.PENDING.value, message=note)
            )

    def cancel(self, selection_id: int) -> JobRecord:
        current = self.record(selection_id)
        if current.finished:
            return current
        if current.job_id is not None:
            self.adapter(current.site).cancel(current.job_id)
        self._finish(selection_id, JobState.CANCELLED, None, "cancelled")
        return self.record(selection_id)

    def _finish(
        self,
        selection_id: int,
        state: JobState,
        exit_code: int | None,
        message: str,
        finished_at: float | None = None,
        started_at: float | None = None,
        usage: JobUsage | None = None,
        *,
        count: bool = True,
    ) -> None:
        """Record the job's end and release its processors; ``count``: the end says
        something of the site's health (gridcore.engine.health)."""
        with self.store.begin() as conn:
            row = (
                conn.execute(select(selections).where(selections.c.id == selection_id))
                .mappings()
                .one()
            )
            if JobState(row["state"]).finished:
                return
            done = finished_at or self.clock()
            # Only a live row is finished: two pollers (a task's trigger and another
            # process's refresh, below) may both see the end, and only one counts it.
            ended = conn.execute(
                update(selections)
                .where(_unfinished(selection_id))
                .values(
                    state=state.value,
                    exit_code=exit_code,
                    message=message,
                    finished_at=done,
                    started_at=started_at or row["started_at"],
                    usage=None if usage is None else json.dumps(usage.as_json()),
                )
            )
            if ended.rowcount != 1:
                return
            selection_engine.release(conn, selection_id)
            if count:
                _count_health(conn, row["site"], state, message)
            start = started_at or row["started_at"]
            if (
                state is JobState.COMPLETED
                and start is not None
                and row["submitted_at"] is not None
            ):
                selection_engine.record_finished_stats(
                    conn, row["site"], max(0.0, start - row["submitted_at"]), done - start
                )

    # -- views ----------------------------------------------------------------------------

    def record(self, selection_id: int) -> JobRecord:
        return self.records([selection_id])[0]

    def records(self, selection_ids: Sequence[int]) -> list[JobRecord]:
        """The selections in the order of ``selection_ids``, read in one statement."""
        with self.store.begin() as conn:
            rows = {
                row["id"]: row
                for row in conn.execute(
                    select(selections).where(selections.c.id.in_(selection_ids))
                ).mappings()
            }
        missing = [sid for sid in selection_ids if sid not in rows]
        if missing:
            raise StateError(f"no selection {missing[0]} in the state database")
        return [_job_record(rows[sid]) for sid in selection_ids]

    def site_rows(self) -> list[SiteRow]:
        names = set(self.grid.site_names)
        with self.store.begin() as conn:
            usage = capacity.usage(conn)
            healths = health.read_health(conn)
            rows = conn.execute(select(sites).order_by(sites.c.name)).mappings().all()
        return [
            _site_row(r, usage[r["name"]], healths[r["name"]]) for r in rows if r["name"] in names
        ]


def _job_record(row: Any) -> JobRecord:
    return JobRecord(
        row["id"],
        row["name"],
        row["site"],
        row["processors"],
        row["outcome"],
        row["state"],
        row["job_id"],
        row["exit_code"],
        row["message"] or "",
        tuple(json.loads(row["reasons"])),
        row["selected_at"],
        row["submitted_at"],
        row["started_at"],
        row["finished_at"],
        json.loads(row["usage"]) if row["usage"] else None,
    )


def _count_health(conn: Any, site: str, state: JobState, message: str) -> None:
    """A finished job of ours counts for its site's health (gridcore.engine.health)."""
    if state is JobState.COMPLETED:
        health.record_success(conn, site)
    elif state is JobState.FAILED:
        health.record_failure(conn, site, message)


def _site_row(row: Any, usage: capacity.Usage, site_health: health.HealthRecord) -> SiteRow:
    return SiteRow(
        row["name"],
        row["kind"],
        row["total_processors"],
        row["reported_idle"],
        usage.free_processors,
        row["external_pending"],
        usage.claimed,
        usage.queued,
        usage.storage_total,
        usage.storage_claimed,
        {
            kind: {"holds": n, "processors": procs, "bytes": nbytes}
            for kind, (n, procs, nbytes) in sorted(usage.by_kind.items())
        },
        site_health.usable,
        site_health.consecutive_errors,
        site_health.last_error,
        site_health.probe_job_id,
        row["observed_at"],
        row["release"],
        row["api_version"],
        site_health.last_error_at,
    )
