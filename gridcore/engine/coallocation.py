"""The live KOALA co-allocator: placement queues, claiming queue, ICP, start barrier and
fault tolerance applied to real sites (KOALA 2005 Sec. 2.5, 3).

Design, equations and the choices where a paper is ambiguous: ``docs/coallocation.md``
(section ``gridcore/engine/coallocation.py``).
"""

from __future__ import annotations

import logging
import sys
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    RowMapping,
    and_,
    delete,
    insert,
    select,
    update,
)

from gridcore.engine import health, pilot_pool
from gridcore.engine.barrier_command import barrier_command
from gridcore.engine.coallocation_records import (
    CoAllocationRecord,
    ComponentRecord,
    job_record,
    placement_to_json,
    request_from_json,
    request_to_json,
)
from gridcore.engine.phases import LIVE_JOB, STARTED_COMPONENT, ComponentState, JobPhase
from gridcore.engine.runtime import GridRuntime
from gridcore.engine.scan import (
    FencedScan,
    ScanLog,
    ScanReport,
    SiteJobs,
    holder_id,
)
from gridcore.engine.submission import adopt_stale, refuse_gpus_on_local, submit_once
from gridcore.errors import AnswerLost, GridError, RequestError, SiteError, StateError
from gridcore.model import (
    CoAllocationRequest,
    JobState,
    JobSubmission,
    Outcome,
    PlacedComponent,
    Placement,
    Priority,
    Replica,
    SiteKind,
    SiteSnapshot,
    component_job_name,
)
from gridcore.policies.claiming import (
    ClaimDecision,
    ClaimingJob,
    ClaimOutcome,
    CoAllocationParams,
    QueuedJob,
    RunningLowJob,
    ScanResult,
    claim_decision,
    first_claim_try,
    job_start_time,
    on_component_failure,
    scan_order,
    scan_placement_queue,
)
from gridcore.policies.placement import PlacementPolicy, place
from gridcore.sites.keys import component_key
from gridcore.staging import ReplicaCatalog, stage
from gridcore.state import capacity
from gridcore.state.capacity import HolderKind, component_holder
from gridcore.state.schema import (
    coalloc_components,
    coalloc_jobs,
    sites,
)
from gridcore.validation import check_choice, check_coallocation_submission

# Re-exported: the Airflow layer and the tests import the records from here.
__all__ = [
    "LEASE_SCANS",
    "CoAllocationEngine",
    "CoAllocationRecord",
    "ComponentRecord",
    "ComponentState",
    "JobPhase",
    "request_from_json",
    "request_to_json",
]

log = logging.getLogger(__name__)

SCAN_LEASE = "koala-scan"
# The scan lease lasts this many scan intervals: a scanner that stopped (killed) is
# replaced after that; one that is alive renews it while it scans. Its length is no
# longer what keeps two scans apart: the lease's fencing token is (engine/lease.py).
LEASE_SCANS = 3
# What one scan reports, by job id (gridcore.engine.scan.ScanReport.events).
SCAN_EVENTS = ("placed", "claimed", "completed", "requeued", "failed")
# A barrier waits up to the JST plus this long for the other components.
BARRIER_SLACK_S = 600.0
# Where the barrier of a component on a cluster binds its data port: every address, and
# it advertises the one on its route to the center (its node's, not 127.0.0.1). Local
# sites run on this host and keep the barrier's default, 127.0.0.1.
REMOTE_BARRIER_BIND = "0.0.0.0"


class CoAllocationEngine:
    """Applies KOALA's policies to live sites; every step resumes from the state DB."""

    def __init__(
        self,
        runtime: GridRuntime,
        catalog: ReplicaCatalog | None = None,
        params: CoAllocationParams | None = None,
        holder: str | None = None,
        *,
        center_url: str,
        site_center_urls: Mapping[str, str] | None = None,
        lease_s: float | None = None,
        python: str | None = None,
        barrier_slack_s: float = BARRIER_SLACK_S,
        renew_lease: bool = True,
    ) -> None:
        """``center_url``: the VJ center's URL as the components' barriers reach it;
        ``site_center_urls``: another URL for the components of a site that reaches it
        by another address (as :class:`~gridcore.engine.coreservation.CoReservationEngine`)."""
        self.runtime = runtime
        self.center_url = _center_url(center_url, "center_url")
        self.site_center_urls = {
            site: _center_url(url, f"site_center_urls[{site!r}]")
            for site, url in (site_center_urls or {}).items()
        }
        self.store = runtime.store
        self.grid = runtime.grid
        self.catalog = catalog
        self.params = params or CoAllocationParams()
        self.lease_s = LEASE_SCANS * self.params.scan_interval_s if lease_s is None else lease_s
        # renew_lease False only in tests that stand for a stalled scanner
        self.scanner = FencedScan(
            self.store,
            SCAN_LEASE,
            holder or holder_id(),
            self.lease_s,
            runtime.clock,
            events=SCAN_EVENTS,
            jobs=coalloc_jobs,
            fail=self._fail_handled,
            cancel=self._cancel_site_jobs,
            renew=renew_lease,
        )
        self.python = python or sys.executable
        self.barrier_slack_s = barrier_slack_s

    # -- submission ----------------------------------------------------------------------

    def submit(
        self,
        request: CoAllocationRequest,
        policy: PlacementPolicy,
        command: str,
        quota: float | None = None,
    ) -> int:
        """Check ``request`` and put it in its placement queue; returns the job id.
        Raises RequestError, writing nothing, for a malformed or impossible request."""
        policy = check_choice(PlacementPolicy, policy, "policy")
        request, command, quota = check_coallocation_submission(
            request, command, quota, self.grid.site_names
        )
        self._check(request, policy, command, quota)
        with self.store.begin() as conn:
            key = conn.execute(
                insert(coalloc_jobs).values(
                    name=request.name,
                    request=request_to_json(request),
                    command=command,
                    policy=policy.value,
                    quota=quota,
                    priority=request.priority.value,
                    state=JobPhase.QUEUED.value,
                    epoch=0,
                    placement_tries=0,
                    claim_tries=0,
                    L=self.params.L,
                    submitted_at=self.runtime.clock(),
                    retries=0,
                )
            ).inserted_primary_key
        if key is None:
            raise StateError("the database returned no id for the new co-allocation job")
        return int(key[0])

    def _check(
        self,
        request: CoAllocationRequest,
        policy: PlacementPolicy,
        command: str,
        quota: float | None,
    ) -> None:
        if request.input_file is not None:
            if self.catalog is None:
                raise RequestError(
                    f"request.input_file: {request.input_file.logical_name!r} needs a replica"
                    " catalog (CoAllocationEngine(catalog=...))"
                )
            self.catalog.require(request.input_file.logical_name)
        named = [self.grid.site(c.site) for c in request.components if c.site is not None]
        refuse_gpus_on_local(
            request.resources,
            named or self.grid.sites,
            every=not named,
            field="request.resources.gpus",
        )
        # The policy on the whole grid idle: a request that cannot fit even then never will.
        idle = [SiteSnapshot(s.name, s.processors, s.processors) for s in self.grid.sites]
        trial = place(
            request,
            idle,
            policy,
            quota,
            replicas=self._replicas(request),
            bandwidth=self._bandwidth(),
        )
        if trial.outcome is not Outcome.FIT:
            raise RequestError(
                f"request {request.name!r} cannot be placed even on the idle grid: "
                + "; ".join(trial.reasons)
            )

    # -- the scan ------------------------------------------------------------------------

    def scan(self, now: float | None = None) -> ScanReport:
        """One KOALA scan (docs/coallocation.md), or a skipped one if another engine holds
        the scan lease."""
        now = self.runtime.clock() if now is None else now
        return self.scanner.run(now, lambda grant, work: self._steps(now, grant.index, work))

    def _steps(self, now: float, scan_index: int, work: ScanLog) -> None:
        looked = self.runtime.refresh()
        # Sites that did not answer are not asked again in this scan (one timeout each).
        silent = {site for site, error in looked.items() if error is not None}
        self._place(now, scan_index, work)
        self._stage(work)
        self._claim(now, work, silent)
        self._follow(work)

    def release_lease(self) -> None:
        """Give up the scan lease now (another engine may scan at once)."""
        self.scanner.release_lease()

    def _fail_handled(self, conn: Connection, job_id: int, message: str) -> SiteJobs | None:
        """The handling-error guard's end of a job (gridcore.engine.scan): failed, its
        started components cancelled; None if it had finished already."""
        row = conn.execute(select(coalloc_jobs).where(coalloc_jobs.c.id == job_id)).mappings().one()
        if JobPhase(row["state"]).finished:
            return None
        return _end(conn, row, LIVE_JOB, JobPhase.FAILED, message, self.runtime.clock())

    # (b) placement queues ---------------------------------------------------------------

    def _place(self, now: float, scan_index: int, work: ScanLog) -> None:
        with self.store.begin() as conn:
            queued = _jobs(conn, JobPhase.QUEUED)
            clusters = self._clusters(conn)
        high = [r for r in queued if r["priority"] == Priority.HIGH.value]
        low = [r for r in queued if r["priority"] != Priority.HIGH.value]
        due = scan_order(high, low, self.params, scan_index)
        if due is None:
            return
        work.reasons.append(f"the {due.value}-priority placement queue is due")
        bandwidth = self._bandwidth()
        for row in high if due is Priority.HIGH else low:
            with self.scanner.handling(row["id"], work):
                request = request_from_json(row["request"])
                job = QueuedJob(request, self._replicas(request), row["placement_tries"])
                # One job at a time so each keeps its own policy and quota; the snapshot
                # carries over, as in one scan of the queue.
                result = scan_placement_queue(
                    [job],
                    clusters,
                    PlacementPolicy(row["policy"]),
                    self.params,
                    quota=row["quota"],
                    bandwidth=bandwidth,
                )
                with self.scanner.tx() as conn:
                    self._record_scan(conn, row, result, now, work)
                clusters = list(result.clusters)

    def _record_scan(
        self, conn: Connection, row: RowMapping, result: ScanResult, now: float, work: ScanLog
    ) -> None:
        work.reasons.extend(result.reasons[1:])
        if result.placed:
            tried, placement = result.placed[0]
            if self._commit_placement(conn, row, tried.placement_tries, placement, now):
                work.add("placed", row["id"])
            return
        tries = (result.failed or result.waiting)[0].placement_tries
        values: dict[str, Any] = {"placement_tries": tries, "message": result.reasons[-1]}
        if result.failed:
            values.update(state=JobPhase.FAILED.value, finished_at=now)
            work.add("failed", row["id"])
        else:
            values["message"] = f"waiting in the placement queue ({tries} placement tries)"
        conn.execute(update(coalloc_jobs).where(_is(row, JobPhase.QUEUED)).values(**values))

    def _commit_placement(
        self, conn: Connection, row: RowMapping, tries: int, placement: Placement, now: float
    ) -> bool:
        ftt = placement.file_transfer_s
        if not _claim_placement(conn, row, placement):
            return False  # a concurrent claim took the processors: it stays queued
        done = conn.execute(
            update(coalloc_jobs)
            .where(_is(row, JobPhase.QUEUED))
            .values(
                state=JobPhase.PLACED.value,
                placement_tries=tries,
                jpt=now,
                ftt=ftt,
                jst=job_start_time(now, ftt),
                jct=first_claim_try(now, ftt, row["L"], self.params),
                placement=placement_to_json(placement),
                placed_at=now,
                message=placement.reasons[0] if placement.reasons else "",
            )
        )
        if done.rowcount != 1:
            _release_components(conn, row["id"])
            return False
        conn.execute(delete(coalloc_components).where(coalloc_components.c.job_id == row["id"]))
        conn.execute(
            insert(coalloc_components),
            [
                {
                    "job_id": row["id"],
                    "idx": c.index,
                    "epoch": row["epoch"],
                    "size": c.size,
                    "site": c.site,
                    "file_site": c.file_site,
                    "transfer_s": c.transfer_s,
                    "state": ComponentState.PLACED.value,
                }
                for c in placement.components
            ],
        )
        return True

    # (c) staging ------------------------------------------------------------------------

    def _stage(self, work: ScanLog) -> None:
        with self.store.begin() as conn:
            placed = _jobs(conn, JobPhase.PLACED)
        for row in placed:
            with self.scanner.handling(row["id"], work):
                self._stage_job(row, work)

    def _stage_job(self, row: RowMapping, work: ScanLog) -> None:
        try:
            self._stage_inputs(row)
        except GridError as exc:
            with self.scanner.tx() as conn:
                cancels = _requeue(conn, row, (JobPhase.PLACED,), f"staging failed: {exc}")
            self._cancel_site_jobs(cancels)
            work.add("requeued", row["id"])
            return
        with self.scanner.tx() as conn:
            conn.execute(
                update(coalloc_jobs)
                .where(_is(row, JobPhase.PLACED))
                .values(state=JobPhase.CLAIMING.value)
            )

    def _stage_inputs(self, row: RowMapping, only: Sequence[PlacedComponent] | None = None) -> None:
        request = request_from_json(row["request"])
        if request.input_file is None:
            return
        if self.catalog is None:
            raise RequestError(
                "input files need a replica catalog (CoAllocationEngine(catalog=...))"
            )
        if only is None:
            with self.store.begin() as conn:
                only = [_placed(c) for c in _components(conn, row)]
        for site in sorted({c.site for c in only if c.file_site != c.site}):
            stage(self.catalog, self.grid, request.input_file.logical_name, site)

    # (d) claiming -----------------------------------------------------------------------

    def _claim(self, now: float, work: ScanLog, silent: set[str]) -> None:
        jc = coalloc_jobs.c
        with self.store.begin() as conn:
            due = (
                conn.execute(
                    select(coalloc_jobs)
                    .where(and_(jc.state == JobPhase.CLAIMING.value, jc.jct <= now))
                    .order_by(jc.jct, jc.id)
                )
                .mappings()
                .all()
            )
        for row in due:
            with self.scanner.handling(row["id"], work):
                self._claim_job(row, now, work, silent)

    def _claim_job(self, row: RowMapping, now: float, work: ScanLog, silent: set[str]) -> None:
        # The components started for the job before count; ``silent`` sites are not
        # asked again (their report stays as it was, and health already counted them).
        looked = self.runtime.refresh(skip=silent)
        silent.update(site for site, error in looked.items() if error is not None)
        request = request_from_json(row["request"])
        replicas, bandwidth = self._replicas(request), self._bandwidth()
        with self.scanner.tx() as conn:
            job = _claiming_job(conn, row, request, replicas)
            candidates = _preemptible(conn) if request.priority is Priority.HIGH else []
            decision = claim_decision(
                job,
                self._clusters(conn, row["id"]),
                now,
                self.params,
                candidates,
                bandwidth=bandwidth,
            )
            cancels = _preempt(conn, decision, row["id"])
            more, starts = self._apply_claim(conn, row, decision, now)
            cancels += more
        work.reasons.extend(decision.reasons)
        work.add(_claim_event(decision.outcome), row["id"])
        self._cancel_site_jobs(cancels)
        for component, token in starts:
            self._start_component(row, component, token, len(job.components), now)

    def _apply_claim(
        self, conn: Connection, row: RowMapping, decision: ClaimDecision, now: float
    ) -> tuple[list[tuple[str, str]], list[tuple[PlacedComponent, str]]]:
        """Apply the claim decision; the site jobs to cancel, and the components to
        submit with their barrier tokens (each token's hash stored in the same UPDATE
        that claims the component, so a barrier's token opens exactly the row claimed)."""
        message = decision.reasons[-1]
        if decision.outcome is ClaimOutcome.ABORT:
            return _requeue(
                conn, row, (JobPhase.CLAIMING,), message, L=decision.L, tries=decision.claim_tries
            ), []
        if decision.outcome is ClaimOutcome.FAILED:
            return _end(conn, row, (JobPhase.CLAIMING,), JobPhase.FAILED, message, now), []
        if not _move_holds(conn, row, decision.start):
            return [], []  # a concurrent claim took the processors: try again next scan
        values: dict[str, Any] = {"claim_tries": decision.claim_tries, "message": message}
        if decision.outcome is ClaimOutcome.COMPLETE:
            values["state"] = JobPhase.RUNNING.value
        else:
            values["jct"] = decision.next_claim_s
        done = conn.execute(
            update(coalloc_jobs).where(_is(row, JobPhase.CLAIMING)).values(**values)
        )
        if done.rowcount != 1:
            return [], []
        starts = []
        for c in decision.start:
            token, digest = pilot_pool.new_token()
            claimed = conn.execute(
                update(coalloc_components)
                .where(_component(row, c.index, ComponentState.PLACED))
                .values(
                    site=c.site,
                    file_site=c.file_site,
                    transfer_s=c.transfer_s,
                    state=ComponentState.SUBMITTING.value,
                    claimed_at=now,
                    token_hash=digest,
                )
            )
            if claimed.rowcount == 1:
                starts.append((c, token))
        return [], starts

    def _start_component(
        self, row: RowMapping, component: PlacedComponent, token: str, count: int, now: float
    ) -> None:
        """Submit one claimed component through its site's adapter (outside any
        transaction), its barrier holding ``token``; record the site's job id, or the
        component's failure."""
        where = _component(row, component.index, ComponentState.SUBMITTING)
        try:
            # A component re-placed by ICP gets its file now (Sec. 3.3); others have it.
            self._stage_inputs(row, [component])
            # Under the component's key, looked up first: a job found is adopted.
            job = self._submission(row, component, token, count, now)
            site_job_id, _ = submit_once(self.runtime.adapter(component.site), job)
        except AnswerLost as exc:
            # Unknown, not failed: left ``submitting``, so this scan's follow step looks
            # its key up again (adopted if found, re-placed if not, never counted
            # against the site), as for a submitter that died.
            log.warning("job %s component %s: %s", row["id"], component.index, exc)
            return
        except GridError as exc:
            with self.scanner.tx() as conn:
                conn.execute(
                    update(coalloc_components)
                    .where(where)
                    .values(state=ComponentState.FAILED.value, message=f"submission failed: {exc}")
                )
                _release_component(conn, row, component.index)
            return
        with self.scanner.tx() as conn:
            done = conn.execute(
                update(coalloc_components)
                .where(where)
                .values(site_job_id=site_job_id, state=ComponentState.SUBMITTED.value)
            )
            # its hold ends when an observation shows the job running (or it ends)
            holder = component_holder(row["id"], row["epoch"], component.index)
            capacity.set_site_job(conn, HolderKind.COMPONENT, holder, site_job_id)
        if done.rowcount != 1:  # the job was cancelled while we submitted
            self._cancel_site_jobs([(component.site, site_job_id)])

    def _submission(
        self, row: RowMapping, component: PlacedComponent, token: str, count: int, now: float
    ) -> JobSubmission:
        timeout = max(0.0, (row["jst"] or now) - now) + self.barrier_slack_s
        local = self.grid.site(component.site).kind is SiteKind.LOCAL
        barrier = barrier_command(
            job_id=row["id"],
            component=component.index,
            count=count,
            epoch=row["epoch"],
            timeout_s=timeout,
            center_url=self.site_center_urls.get(component.site, self.center_url),
            token=token,
            python=self.python,
            command=row["command"],
            bind=None if local else REMOTE_BARRIER_BIND,
        )
        return JobSubmission(
            component_job_name(row["name"], component.index),
            barrier.shell,
            component.size,
            env=barrier.env,
            key=component_key(self.runtime.install_id, row["id"], row["epoch"], component.index),
            # as the request asks: its time limit covers the barrier's wait and the
            # command (submit_once puts the site's defaults under it)
            resources=request_from_json(row["request"]).resources,
        )

    # (e) following started components --------------------------------------------------

    def _follow(self, work: ScanLog) -> None:
        with self.store.begin() as conn:
            active = _jobs(conn, JobPhase.CLAIMING, JobPhase.RUNNING)
        for row in active:
            with self.scanner.handling(row["id"], work):
                self._follow_job(row, work)

    def _follow_job(self, row: RowMapping, work: ScanLog) -> None:
        with self.store.begin() as conn:
            parts = _components(conn, row)
        for part in parts:
            if part["state"] == ComponentState.SUBMITTED.value:
                self._poll_component(row, part)
            elif part["state"] == ComponentState.SUBMITTING.value:
                self._adopt_submitting(row, part)
        with self.store.begin() as conn:
            parts = _components(conn, row)
        self._settle(row, parts, work)

    def _adopt_submitting(self, row: RowMapping, part: RowMapping) -> None:
        """A component left ``submitting`` by an engine that died mid-submission: the
        site job its key names is adopted (submitted), with the token hash the row keeps
        (that job's barrier holds the token); none found (or the site cannot be asked),
        ``_settle`` counts it failed and the job is re-placed (new rows, new tokens; a
        job the site does have is an orphan for the next refresh)."""
        key = component_key(self.runtime.install_id, row["id"], row["epoch"], part["idx"])

        def record(found: str) -> None:
            with self.scanner.tx() as conn:
                conn.execute(
                    update(coalloc_components)
                    .where(_component(row, part["idx"], ComponentState.SUBMITTING))
                    .values(site_job_id=found, state=ComponentState.SUBMITTED.value)
                )
                # its hold ends when an observation shows the job running (or it ends)
                holder = component_holder(row["id"], row["epoch"], part["idx"])
                capacity.set_site_job(conn, HolderKind.COMPONENT, holder, found)

        adopt_stale(self.runtime.adapter, part["site"], key, record, since=row["submitted_at"])

    def _poll_component(self, row: RowMapping, part: RowMapping) -> None:
        try:
            status = self.runtime.adapter(part["site"]).status(part["site_job_id"])
        except SiteError as exc:
            with self.scanner.tx() as conn:
                health.record_failure(conn, part["site"], str(exc))
            return
        if not status.state.finished:
            return
        ok = status.state is JobState.COMPLETED
        with self.scanner.tx() as conn:
            conn.execute(
                update(coalloc_components)
                .where(_component(row, part["idx"], ComponentState.SUBMITTED))
                .values(
                    state=(ComponentState.COMPLETED if ok else ComponentState.FAILED).value,
                    exit_code=status.exit_code,
                    finished_at=status.finished_at or self.runtime.clock(),
                    message=status.reason or status.state.value,
                )
            )
            _release_component(conn, row, part["idx"])
            if ok:
                health.record_success(conn, part["site"])

    def _settle(self, row: RowMapping, parts: Sequence[RowMapping], work: ScanLog) -> None:
        # A "submitting" row here was left by an engine that died mid-submission.
        broken = [
            p
            for p in parts
            if p["state"] in (ComponentState.FAILED.value, ComponentState.SUBMITTING.value)
        ]
        if broken:
            self._fail(row, broken[0])
            work.add("requeued", row["id"])
            return
        if row["state"] != JobPhase.RUNNING.value:
            return
        if all(p["state"] == ComponentState.COMPLETED.value for p in parts):
            ends = [p["finished_at"] for p in parts if p["finished_at"] is not None]
            with self.scanner.tx() as conn:
                done = conn.execute(
                    update(coalloc_jobs)
                    .where(_is(row, JobPhase.RUNNING))
                    .values(
                        state=JobPhase.COMPLETED.value,
                        finished_at=max(ends, default=self.runtime.clock()),
                        message=f"all {len(parts)} components completed",
                    )
                )
            if done.rowcount == 1:
                work.add("completed", row["id"])
        released = [p["released_at"] for p in parts]
        if row["started_at"] is None and all(t is not None for t in released):
            with self.scanner.tx() as conn:
                conn.execute(
                    update(coalloc_jobs)
                    .where(coalloc_jobs.c.id == row["id"])
                    .values(started_at=max(t for t in released if t is not None))
                )

    def _fail(self, row: RowMapping, part: RowMapping) -> None:
        """Sec. 3.4: a failed component aborts the whole job, back to its placement
        queue; the site's consecutive errors grow. A component still ``submitting`` here
        was lost by an engine that stopped before the site had it (its key found no job):
        the job is re-queued the same way, but that is not the site's error."""
        with self.scanner.tx() as conn:
            if part["state"] == ComponentState.SUBMITTING.value:
                message = (
                    f"component {part['idx']}: lost while being submitted (its engine stopped,"
                    f" or the answer was lost, and site {part['site']} has no job with its"
                    " key); not counted against the site"
                )
            else:
                message = self._site_failure(conn, row, part)
            cancels = _requeue(
                conn, row, (JobPhase.CLAIMING, JobPhase.RUNNING), message, retry=True
            )
        self._cancel_site_jobs(cancels)

    def _site_failure(self, conn: Connection, row: RowMapping, part: RowMapping) -> str:
        """Count a component the site failed (or refused) against the site's health."""
        decision = on_component_failure(
            request_from_json(row["request"]),
            part["idx"],
            health.site_health(conn, part["site"]),
            health.live_params(self.params),
        )
        why = part["message"] or "failed"
        health.record_failure(conn, part["site"], f"component {part['idx']}: {why}")
        return "; ".join((*decision.reasons, f"component {part['idx']}: {why}"))

    # -- views and control ----------------------------------------------------------------

    def status(self, job_id: int) -> CoAllocationRecord:
        with self.store.begin() as conn:
            row = (
                conn.execute(select(coalloc_jobs).where(coalloc_jobs.c.id == job_id))
                .mappings()
                .one_or_none()
            )
            if row is None:
                raise StateError(f"no co-allocation job {job_id} in the state database")
            parts = _components(conn, row)
        return job_record(row, parts, self.grid)

    def cancel(self, job_id: int) -> CoAllocationRecord:
        """Cancel the job and every started component (a finished job is left alone)."""
        current = self.status(job_id)
        if current.finished:
            return current
        with self.store.begin() as conn:
            row = (
                conn.execute(select(coalloc_jobs).where(coalloc_jobs.c.id == job_id))
                .mappings()
                .one()
            )
            cancels = _end(
                conn, row, LIVE_JOB, JobPhase.CANCELLED, "cancelled", self.runtime.clock()
            )
        self._cancel_site_jobs(cancels)
        return self.status(job_id)

    # -- helpers ------------------------------------------------------------------------

    def _clusters(self, conn: Connection, own_job: int | None = None) -> list[SiteSnapshot]:
        """The usable grid sites as a KOALA decision sees them now, from the site rows:
        reported idle, others' queued work, and ours in flight = every hold the ledger
        counts (claimed or queued, placed components included) but, for ``own_job``'s
        claim decision, what its own placed components hold already. Their
        ``free_processors`` are the ledger's (capacity.FREE) plus those own holds."""
        own = {}
        if own_job is not None:
            own = capacity.held_by_prefix(conn, HolderKind.COMPONENT, f"{own_job}:")
        s = sites.c
        rows = {
            r.name: r
            for r in conn.execute(
                select(
                    s.name,
                    s.total_processors,
                    s.usable,
                    s.reported_idle,
                    s.external_pending,
                    s.claimed,
                    s.queued,
                )
            )
        }
        snaps = []
        for name in self.grid.site_names:
            r = rows.get(name)
            if r is None or not r.usable:
                continue
            snaps.append(
                SiteSnapshot(
                    name,
                    r.total_processors,
                    r.reported_idle,
                    in_flight_processors=r.claimed + r.queued - own.get(name, 0),
                    external_pending_processors=r.external_pending,
                )
            )
        return snaps

    def _replicas(self, request: CoAllocationRequest) -> tuple[Replica, ...]:
        if request.input_file is None or self.catalog is None:
            return ()
        return self.catalog.replicas(request.input_file.logical_name)

    def _bandwidth(self) -> Callable[[str, str], float]:
        """MB/s between sites: measured means where staging sampled a pair, else the grid
        matrix. Read once per decision, never inside its transaction."""
        if self.catalog is None:
            return self.grid.bandwidth
        measured = self.catalog.measured_rates()
        grid = self.grid

        def bandwidth(src: str, dst: str) -> float:
            return measured.get((src, dst)) or grid.bandwidth(src, dst)

        return bandwidth

    def _cancel_site_jobs(self, jobs: Sequence[tuple[str, str]]) -> None:
        self.runtime.cancel_site_jobs(jobs, "its co-allocated job ended or moved on")


# -- rows -------------------------------------------------------------------------------------


def _claim_event(outcome: ClaimOutcome) -> str:
    """The report's event of a claiming try's outcome (Sec. 3.3)."""
    if outcome >= ClaimOutcome.RETRY:
        return "claimed"
    return "requeued" if outcome is ClaimOutcome.ABORT else "failed"


def _center_url(url: str, field: str) -> str:
    """A VJ center URL the barriers can call (http or https), or RequestError now,
    before any component is submitted with it."""
    if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise RequestError(f"CoAllocationEngine {field}: the VJ center's http(s) URL, not {url!r}")
    return url.rstrip("/")


def _jobs(conn: Connection, *states: JobPhase) -> Sequence[RowMapping]:
    jc = coalloc_jobs.c
    query = select(coalloc_jobs).where(jc.state.in_([s.value for s in states])).order_by(jc.id)
    return conn.execute(query).mappings().all()


def _components(conn: Connection, row: RowMapping) -> Sequence[RowMapping]:
    cc = coalloc_components.c
    query = (
        select(coalloc_components)
        .where(and_(cc.job_id == row["id"], cc.epoch == row["epoch"]))
        .order_by(cc.idx)
    )
    return conn.execute(query).mappings().all()


def _is(row: RowMapping, *states: JobPhase) -> ColumnElement[bool]:
    """The job row as read: same id, epoch and one of ``states`` (conditional UPDATEs)."""
    jc = coalloc_jobs.c
    return and_(
        jc.id == row["id"], jc.epoch == row["epoch"], jc.state.in_([s.value for s in states])
    )


def _component(
    row: RowMapping, index: int, state: ComponentState | None = None
) -> ColumnElement[bool]:
    """Component ``index`` of the job row's epoch (and, for conditional UPDATEs, only
    while it is in ``state``)."""
    cc = coalloc_components.c
    where = and_(cc.job_id == row["id"], cc.idx == index, cc.epoch == row["epoch"])
    return where if state is None else and_(where, cc.state == state.value)


def _placed(part: RowMapping) -> PlacedComponent:
    return PlacedComponent(
        part["idx"], part["size"], part["site"], part["file_site"], part["transfer_s"]
    )


def _claiming_job(
    conn: Connection,
    row: RowMapping,
    request: CoAllocationRequest,
    replicas: tuple[Replica, ...],
) -> ClaimingJob:
    parts = _components(conn, row)
    started = frozenset(p["idx"] for p in parts if p["state"] != ComponentState.PLACED.value)
    return ClaimingJob(
        request,
        tuple(_placed(p) for p in parts),
        row["jst"],
        row["L"],
        started,
        row["claim_tries"],
        replicas,
    )


def _started(conn: Connection, row: RowMapping) -> list[tuple[str, str]]:
    """(site, site job id) of the job's components that a site has."""
    return [
        (p["site"], p["site_job_id"])
        for p in _components(conn, row)
        if p["state"] in STARTED_COMPONENT and p["site_job_id"]
    ]


def _preemptible(conn: Connection) -> list[RunningLowJob]:
    """Low-priority jobs holding processors (claiming with components started, or
    running) as preemption candidates (Sec. 3.3), named by their job id."""
    candidates = []
    for low in _jobs(conn, JobPhase.CLAIMING, JobPhase.RUNNING):
        if request_from_json(low["request"]).priority is not Priority.LOW:
            continue
        held: dict[str, int] = {}
        for part in _components(conn, low):
            if part["state"] in STARTED_COMPONENT:
                held[part["site"]] = held.get(part["site"], 0) + part["size"]
        if held:
            jst = low["jst"] if low["jst"] is not None else 0.0
            candidates.append(RunningLowJob(str(low["id"]), jst, tuple(sorted(held.items()))))
    return candidates


def _preempt(conn: Connection, decision: ClaimDecision, by: int) -> list[tuple[str, str]]:
    """Send the low-priority jobs the decision preempts back to the low-priority queue;
    returns their site jobs to cancel."""
    cancels: list[tuple[str, str]] = []
    for name in decision.preempt:
        victim = conn.execute(select(coalloc_jobs).where(coalloc_jobs.c.id == int(name)))
        row = victim.mappings().one_or_none()
        if row is not None:
            message = f"preempted by high-priority job {by} (Sec. 3.3)"
            cancels += _requeue(conn, row, (JobPhase.CLAIMING, JobPhase.RUNNING), message)
    return cancels


def _requeue(
    conn: Connection,
    row: RowMapping,
    states: tuple[JobPhase, ...],
    message: str,
    *,
    L: float | None = None,
    tries: int | None = None,
    retry: bool = False,
) -> list[tuple[str, str]]:
    """Back to the placement queue with a new epoch; returns the site jobs to cancel."""
    values: dict[str, Any] = {
        "state": JobPhase.QUEUED.value,
        "epoch": row["epoch"] + 1,
        "message": message,
        "jpt": None,
        "ftt": None,
        "jst": None,
        "jct": None,
        "started_at": None,
        "placement": None,
    }
    if L is not None:
        values["L"] = L
    if tries is not None:
        values["claim_tries"] = tries
    if retry:
        values["retries"] = coalloc_jobs.c.retries + 1
    done = conn.execute(update(coalloc_jobs).where(_is(row, *states)).values(**values))
    if done.rowcount != 1:
        return []
    cancels = _started(conn, row)
    _release_components(conn, row["id"])
    conn.execute(delete(coalloc_components).where(coalloc_components.c.job_id == row["id"]))
    return cancels


def _end(
    conn: Connection,
    row: RowMapping,
    states: tuple[JobPhase, ...],
    final: JobPhase,
    message: str,
    now: float,
) -> list[tuple[str, str]]:
    """Finish the job as ``final``; returns the site jobs to cancel."""
    done = conn.execute(
        update(coalloc_jobs)
        .where(_is(row, *states))
        .values(state=final.value, message=message, finished_at=now)
    )
    if done.rowcount != 1:
        return []
    cancels = _started(conn, row)
    _release_components(conn, row["id"])
    cc = coalloc_components.c
    conn.execute(
        update(coalloc_components)
        .where(
            and_(
                cc.job_id == row["id"],
                cc.state.in_([ComponentState.PLACED.value, *(p.value for p in STARTED_COMPONENT)]),
            )
        )
        .values(state=ComponentState.ABORTED.value, finished_at=now, message=message)
    )
    return cancels


def _claim_placement(conn: Connection, row: RowMapping, placement: Placement) -> bool:
    """Claim every placed component's processors (capacity ledger, one conditional UPDATE
    each); all or none: a component that no longer fits undoes the others."""
    with conn.begin_nested() as savepoint:
        for c in placement.components:
            holder = component_holder(row["id"], row["epoch"], c.index)
            if capacity.claim(conn, HolderKind.COMPONENT, holder, c.site, c.size) is None:
                savepoint.rollback()
                return False
    return True


def _move_holds(conn: Connection, row: RowMapping, start: Sequence[PlacedComponent]) -> bool:
    """Components ICP starts on another site than placed (Sec. 3.3) move their holds
    there, by the conditional UPDATE; all or none."""
    with conn.begin_nested() as savepoint:
        for c in start:
            holder = component_holder(row["id"], row["epoch"], c.index)
            held = capacity.hold(conn, HolderKind.COMPONENT, holder)
            if held is not None and held.ledger is not None and held.site == c.site:
                continue
            capacity.release(conn, HolderKind.COMPONENT, holder)
            if capacity.claim(conn, HolderKind.COMPONENT, holder, c.site, c.size) is None:
                savepoint.rollback()
                return False
    return True


def _release_component(conn: Connection, row: RowMapping, index: int) -> None:
    capacity.release(conn, HolderKind.COMPONENT, component_holder(row["id"], row["epoch"], index))


def _release_components(conn: Connection, job_id: int) -> None:
    """Every hold of the job's components (any epoch) goes back to the ledger."""
    capacity.release_prefix(conn, HolderKind.COMPONENT, f"{job_id}:")
