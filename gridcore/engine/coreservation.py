"""VJM co-reservation live: pilots that hold processors on several clusters until all
have started, then the real program in all of them at once (VJM Sec. 3).

Design, equations and the choices where a paper is ambiguous: ``docs/coreservation.md``
(section ``gridcore/engine/coreservation.py``).
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, RowMapping, and_, insert, select, update
from sqlalchemy.exc import OperationalError

from gridcore.engine import health, pilot_pool, queue_stats, submission
from gridcore.engine.coreservation_records import (
    ReservationRecord,
    request_from_row,
    reservation_record,
    sent_to_pilot,
)
from gridcore.engine.coreservation_reorganization import (
    apply_reorganization,
    pending_jobs,
    release_pilot,
)
from gridcore.engine.phases import (
    FINISHED_RESERVATION,
    LIVE_PILOT,
    WAITING_PILOT,
    PilotState,
    ReservationPhase,
)
from gridcore.engine.pilot_command import pilot_command
from gridcore.engine.runtime import GridRuntime
from gridcore.engine.scan import FencedScan, ScanLog, ScanReport, SiteJobs, holder_id
from gridcore.engine.wait_models import virtual_job_waits
from gridcore.errors import AnswerLost, GridError, RequestError, StateError, UnknownJob
from gridcore.model import (
    ASSUMED_RUNTIME_S,
    NO_RESOURCES,
    CoReservationRequest,
    HolderKind,
    JobResources,
    JobState,
    JobSubmission,
    Outcome,
    SiteKind,
    SiteSnapshot,
    SiteSpec,
)
from gridcore.policies.coreservation import (
    DEFAULT_RULE,
    LIFETIME_CEILING_S,
    ClusterSelection,
    ClusterView,
    QueueStats,
    ReorganizeRule,
    pilot_time_limit,
    reorganize,
    reservation_lifetime,
    select_clusters,
    select_substitutes,
    settle_lifetime,
    static_selection,
)
from gridcore.sites.keys import pilot_key
from gridcore.state import capacity
from gridcore.state.schema import pilots, reservations
from gridcore.state.store import DEADLOCK_DETECTED
from gridcore.validation import check_coreservation_request

log = logging.getLogger(__name__)

SCAN_LEASE = "vjm-scan"
SUBMIT_DEADLINE_S = 60.0
# What one scan reports (gridcore.engine.scan.ScanReport.events): job ids, but pilot
# ids for "lost" and "finished" (pilots let go because their job ended).
SCAN_EVENTS = ("dispatched", "lost", "substituted", "reorganized", "finished", "failed")
TOKEN_ENV = "GRIDCORE_PILOT_TOKEN"
PROCESSORS_ENV = "GRIDCORE_PILOT_PROCESSORS"
# A dispatched pilot's result comes over HTTP; its site job may be seen ended first.
RESULT_GRACE_S = 15.0


@dataclass(frozen=True)
class CoReservationParams:
    """``heartbeat_timeout_s``: a held or dispatched pilot silent this long is lost (the
    pilot heartbeats every few seconds, :mod:`gridcore.engine.pilot_pool`); also how long
    a pilot the site shows running may take to register. ``lease_s``: the scan lease.
    ``python``: the interpreter that runs the pilot program at the sites (None: this
    process's own for local sites, which are this host, and ``python3`` elsewhere)."""

    heartbeat_timeout_s: float = 30.0
    lease_s: float = 60.0
    python: str | None = None
    # False: no reorganization after the lifetime (the experiments' "no_reorganize")
    reorganize: bool = True
    # how Sec. 3.3 is read (policies.coreservation: the global order by default)
    rule: ReorganizeRule = DEFAULT_RULE
    # Eq. 2's ceiling (policies.coreservation.LIFETIME_CEILING_S; not in the paper)
    lifetime_ceiling_s: float = LIFETIME_CEILING_S

    def __post_init__(self) -> None:
        for name in ("heartbeat_timeout_s", "lease_s", "lifetime_ceiling_s"):
            if not getattr(self, name) > 0:
                raise RequestError(f"CoReservationParams.{name} must be > 0")


@dataclass(frozen=True)
class _NewPilot:
    id: int
    job_id: int
    site: str
    processors: int
    key: str
    token: str
    name: str
    workdir: str | None
    resources: JobResources = NO_RESOURCES


class CoReservationEngine:
    """Applies VJM's policies to live sites; every step resumes from the state DB."""

    def __init__(
        self,
        runtime: GridRuntime,
        center_url: str,
        params: CoReservationParams | None = None,
        holder: str | None = None,
        *,
        site_center_urls: Mapping[str, str] | None = None,
    ) -> None:
        """``center_url``: the VJ center's URL as pilots reach it; ``site_center_urls``:
        another URL for the pilots of a site that reaches it by another address."""
        self.runtime = runtime
        self.store = runtime.store
        self.grid = runtime.grid
        self.center_url = center_url
        self.site_center_urls = dict(site_center_urls or {})
        self.params = params or CoReservationParams()
        self.scanner = FencedScan(
            self.store,
            SCAN_LEASE,
            holder or holder_id(),
            self.params.lease_s,
            runtime.clock,
            events=SCAN_EVENTS,
            jobs=reservations,
            fail=self._fail_handled,
            cancel=self._cancel_site_jobs,
        )

    # -- submission ----------------------------------------------------------------------

    def submit(self, request: CoReservationRequest | Mapping[str, Any]) -> int:
        """Check ``request``, select its clusters, write the job and its pilots, submit the
        pilots; returns the job id. Raises RequestError, writing nothing, for a malformed
        request or one no cluster set can ever hold."""
        checked = check_coreservation_request(request, self.grid.site_names)
        self._check_feasible(checked)
        now = self.runtime.clock()
        with self.store.begin() as conn:
            job_id = _insert_reservation(conn, checked, now)
            made = self._select_and_record(conn, job_id, checked, checked.virtual_jobs, {}, (), now)
        self.runtime.store_forecasts()  # what the wait models forecast while selecting
        if made is None:
            with self.store.begin() as conn:
                self._end_job(
                    conn, job_id, ReservationPhase.FAILED, "no usable cluster can hold it", now
                )
            return job_id
        self._submit_pilots(made)
        return job_id

    def _check_feasible(self, request: CoReservationRequest) -> None:
        pinned = request.machine_file
        names = [s for s, _n in pinned] if pinned is not None else self._candidates(request)
        submission.refuse_gpus_on_local(
            request.resources,
            [self.grid.site(s) for s in names],
            every=pinned is None,
            field="resources.gpus",
        )
        idle = QueueStats(0.0, 0.0, 0, 0.0)
        views = [
            ClusterView(s, idle, self.grid.site(s).processors // request.vj_size)
            for s in self._candidates(request)
        ]
        if request.machine_file is not None:
            views = [
                ClusterView(s, idle, self.grid.site(s).processors // request.vj_size)
                for s, _n in request.machine_file
            ]
            trial = static_selection(dict(request.machine_file), views)
        else:
            trial = select_clusters(request.virtual_jobs, views, request.max_clusters)
        if trial.outcome is not Outcome.FIT:
            raise RequestError(
                f"request {request.name!r} ({request.virtual_jobs} virtual jobs of "
                f"{request.vj_size} processors, at most {request.max_clusters} clusters) "
                "cannot be held even by the idle grid: " + "; ".join(trial.reasons)
            )

    def _candidates(self, request: CoReservationRequest) -> list[str]:
        names = self.grid.site_names
        return [s for s in names if request.sites is None or s in request.sites]

    def _select_and_record(
        self,
        conn: Connection,
        job_id: int,
        request: CoReservationRequest,
        missing: int,
        already: Mapping[str, int],
        avoid: Sequence[str],
        now: float,
    ) -> list[_NewPilot] | None:
        """Select clusters for ``missing`` virtual jobs (Sec. 3.2), write their pilots
        and holds, and set the job's lifetime (Eq. 2); None when nothing can hold them.
        With a wait model the forecasts are for pilots as long as the ones then sent
        (:func:`~gridcore.policies.coreservation.settle_lifetime`)."""
        floor = request.lifetime_floor_s
        ceiling = self.params.lifetime_ceiling_s
        held = _waiting_t_avails(conn, job_id)  # a reorganization's pilots still waiting

        def lifetime_of(chosen: ClusterSelection) -> float:
            """Eq. 2 over the waiting pilots and the chosen ones (0: nothing to send)."""
            if chosen.outcome is not Outcome.FIT:
                return 0.0
            return reservation_lifetime(
                [*held, *(c.t_avail for c in chosen.choices)], floor, ceiling
            )

        select_at = self._selector(conn, request, missing, already, avoid, now)
        if self.runtime.snapshots.waits is None or request.machine_file is not None:
            selection = select_at(floor)  # Eq. 1 ignores the pilots' time limits
        else:
            # the pilots already waiting set the least lifetime (a reorganization)
            selection = settle_lifetime(
                select_at, lifetime_of, reservation_lifetime(held, floor, ceiling)
            )
        if selection.outcome is not Outcome.FIT:
            _set_selection(conn, job_id, selection, None, now)
            return None
        # The holds change several sites' counter rows: lock them in name order first,
        # as every multi-site writer of gc_sites does, or two submissions choosing the
        # same sites in another order deadlock on PostgreSQL.
        for site in sorted({choice.cluster for choice in selection.choices}):
            self.store.lock_site(conn, site)
        made = [
            _new_pilot(conn, job_id, request, choice.cluster, choice.t_avail, now)
            for choice in selection.choices
        ]
        lifetime = lifetime_of(selection)
        made = [
            replace(p, resources=_pilot_resources(request, lifetime, self.grid.site(p.site)))
            for p in made
        ]
        _set_selection(conn, job_id, selection, lifetime, now, {p.id: p.resources for p in made})
        return made

    def _selector(
        self,
        conn: Connection,
        request: CoReservationRequest,
        missing: int,
        already: Mapping[str, int],
        avoid: Sequence[str],
        now: float,
    ) -> Callable[[float], ClusterSelection]:
        """Sec. 3.2's selection as a function of the reservation's lifetime (the wait
        model's forecasts are for pilots asking its time limit): the sites' health,
        queue statistics and observations are read once, here, for every lifetime
        :func:`~gridcore.policies.coreservation.settle_lifetime` tries."""
        usable = {h.site for h in health.read_health(conn).values() if h.usable}
        names = [s for s in self._candidates(request) if s in usable or s in already]
        stats = queue_stats.queue_stats(conn, names, now)
        g = request.vj_size
        if request.machine_file is not None:  # pinned, not selected: Eq. 1 as it is
            views = [ClusterView(s, stats[s], self.grid.site(s).processors // g) for s in names]
            pinned = static_selection(dict(request.machine_file), views, already)
            return lambda _lifetime: pinned
        observed = self._observed(conn, names)

        def select_at(lifetime_s: float) -> ClusterSelection:
            t_avails, notes = self._t_avails(request, observed, missing, already, now, lifetime_s)
            views = [
                ClusterView(s, stats[s], self.grid.site(s).processors // g, t_avails.get(s))
                for s in names
            ]
            chosen = select_substitutes(missing, views, request.max_clusters, already, avoid)
            return replace(chosen, reasons=(*chosen.reasons, *notes))

        return select_at

    def _observed(self, conn: Connection, names: Sequence[str]) -> list[SiteSnapshot]:
        """The candidate sites' snapshots as the selection engine reads them (their
        processors and our work in flight), the wait models brought up to the sites'
        latest observations; none without a wait model."""
        book = self.runtime.snapshots.waits
        if book is None or not names:
            return []
        wanted = set(names)
        snaps, observed = self.runtime.snapshots.read_observed(conn)
        book.refresh(conn, {name: at for name, at in observed.items() if name in wanted})
        return [snap for snap in snaps if snap.site in wanted]

    def _t_avails(
        self,
        request: CoReservationRequest,
        observed: Sequence[SiteSnapshot],
        missing: int,
        already: Mapping[str, int],
        now: float,
        lifetime_s: float,
    ) -> tuple[dict[str, tuple[float, ...]], list[str]]:
        """The wait model's ``T_avail`` per cluster (``ClusterView.t_avails``) where it
        has what it needs, fed from the cluster's stored observations and history
        (:mod:`gridcore.engine.wait_models`), for pilots of a reservation of
        ``lifetime_s``; the others keep Eq. 1. One reason per cluster says which was
        used and why."""
        book = self.runtime.snapshots.waits
        if book is None:
            return {}, []
        g = request.vj_size
        found: dict[str, tuple[float, ...]] = {}
        notes: list[str] = []
        for snapshot in observed:
            site = self.grid.site(snapshot.site)
            command = submission.resources_at(request.resources, site).time_limit_s
            limit = pilot_time_limit(lifetime_s, command or ASSUMED_RUNTIME_S)
            room = min(missing, site.processors // g - already.get(snapshot.site, 0))
            waits, note = virtual_job_waits(book, snapshot, g, max(0, room), limit, now)
            notes.append(note)
            if waits is not None:
                found[snapshot.site] = waits
        return found, notes

    def _submit_pilots(self, made: Sequence[_NewPilot]) -> None:
        """Submit to the sites in parallel (one thread per site, each site's pilots in
        order): a job's pilots queue at every cluster at about the same moment, and the
        submission overhead is the slowest site's, not the sum."""
        by_site: dict[str, list[_NewPilot]] = defaultdict(list)
        for pilot in made:
            by_site[pilot.site].append(pilot)
        if len(by_site) <= 1:
            for pilot in made:
                self._submit_pilot(pilot)
            return
        with ThreadPoolExecutor(len(by_site), thread_name_prefix="vjm-submit") as pool:
            for done in [pool.submit(self._submit_in_order, ps) for ps in by_site.values()]:
                done.result()

    def _submit_in_order(self, made: Sequence[_NewPilot]) -> None:
        for pilot in made:
            self._submit_pilot(pilot)

    def _python(self, site: str) -> str:
        if self.params.python is not None:
            return self.params.python
        return sys.executable if self.grid.site(site).kind is SiteKind.LOCAL else "python3"

    def _submit_pilot(self, pilot: _NewPilot) -> None:
        job = JobSubmission(
            name=f"{pilot.name}-vj{pilot.id}"[:256],
            command=pilot_command(
                self.site_center_urls.get(pilot.site, self.center_url),
                pilot.id,
                self._python(pilot.site),
            ),
            processors=pilot.processors,
            workdir=None,
            env={TOKEN_ENV: pilot.token, PROCESSORS_ENV: str(pilot.processors)},
            key=pilot.key,
            resources=pilot.resources,
        )
        try:
            site_job_id, _ = submission.submit_once(self.runtime.adapter(pilot.site), job)
        except AnswerLost as exc:
            # Unknown, not failed: the pilot stays ``submitting`` and the stale look-up
            # (_resubmit_stale) adopts its job by key or sends it anew; not the site's error.
            log.warning("pilot %s: %s", pilot.id, exc)
            return
        except GridError as exc:
            now = self.runtime.clock()
            with self.store.begin() as conn:
                health.record_failure(conn, pilot.site, str(exc))
                _lose(conn, pilot.id, f"submission to {pilot.site} failed: {exc}", now)
            return
        with self.store.begin() as conn:
            _record_site_job(conn, pilot.id, site_job_id)

    # -- the scan ------------------------------------------------------------------------

    def scan(self, now: float | None = None) -> ScanReport:
        """One pass of docs/coreservation.md's steps, or a skipped one while another
        engine holds the scan lease."""
        now = self.runtime.clock() if now is None else now
        return self.scanner.run(now, lambda _grant, work: self._steps(now, work))

    def release_lease(self) -> None:
        self.scanner.release_lease()

    def _steps(self, now: float, report: ScanLog) -> None:
        self._observe(report)
        self._resubmit_stale(now)
        self._follow(now, report)
        self._dispatch(now, report)
        if self.params.reorganize:
            self._reorganize(now, report)
        self._substitute(now, report)
        self._finish(now, report)

    def _observe(self, report: ScanLog) -> None:
        """Step 1. An observation PostgreSQL chose as a deadlock's victim wrote nothing
        (it rolled back whole): this scan goes on without it and the next one observes
        again. (A report releases pilot holds it counts while the center's result
        transactions release others at the same site, in the other order.)"""
        try:
            self.runtime.refresh()
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != DEADLOCK_DETECTED:
                raise
            log.warning("observing the sites: a deadlock's victim, next scan: %s", exc.orig)
            report.reasons.append("site observation rolled back (deadlock victim)")

    def _fail_handled(self, conn: Connection, job_id: int, message: str) -> SiteJobs | None:
        """The handling-error guard's end of a job (gridcore.engine.scan): failed (the
        next scan's step 6 lets its pilots go); None if it had finished already."""
        if not self._end_job(conn, job_id, ReservationPhase.FAILED, message, self.runtime.clock()):
            return None
        return []

    def _resubmit_stale(self, now: float) -> None:
        """Pilots still ``submitting`` long after they were written: their submitter
        died. The site may have the job (adopt it by key), else submit it anew."""
        with self.store.begin() as conn:
            stale = (
                conn.execute(
                    select(
                        pilots,
                        reservations.c.name,
                        reservations.c.workdir,
                        reservations.c.selection,
                    )
                    .join(reservations, reservations.c.id == pilots.c.job_id)
                    .where(
                        and_(
                            pilots.c.state == PilotState.SUBMITTING.value,
                            pilots.c.site_job_id.is_(None),
                            pilots.c.submitted_at < now - SUBMIT_DEADLINE_S,
                        )
                    )
                )
                .mappings()
                .all()
            )
        for row in stale:
            found = submission.adopt_stale(
                self.runtime.adapter,
                row["site"],
                row["key"],
                functools.partial(self._record_site_job, row["id"]),
                since=row["submitted_at"],
            )
            if found is submission.Lookup.NOT_FOUND:
                self._resubmit(row, now)

    def _record_site_job(self, pilot_id: int, site_job_id: str) -> None:
        with self.scanner.tx() as conn:
            _record_site_job(conn, pilot_id, site_job_id)

    def _resubmit(self, row: RowMapping, now: float) -> None:
        """A stale pilot the site never got: submitted anew, with a fresh token."""
        token, digest = pilot_pool.new_token()
        with self.scanner.tx() as conn:
            done = conn.execute(
                update(pilots)
                .where(and_(pilots.c.id == row["id"], pilots.c.site_job_id.is_(None)))
                .values(token_hash=digest, submitted_at=now)
            )
        if done.rowcount == 1:
            self._submit_pilot(
                _NewPilot(
                    row["id"],
                    row["job_id"],
                    row["site"],
                    row["processors"],
                    row["key"],
                    token,
                    row["name"],
                    row["workdir"],
                    sent_to_pilot(row["selection"], row["id"]),
                )
            )

    def _follow(self, now: float, report: ScanLog) -> None:
        with self.store.begin() as conn:
            rows = (
                conn.execute(
                    select(pilots).where(
                        and_(
                            pilots.c.state.in_((*WAITING_PILOT, *LIVE_PILOT)),
                            pilots.c.site_job_id.is_not(None),
                        )
                    )
                )
                .mappings()
                .all()
            )
        for row in rows:
            verdict = self._judge_pilot(row, now)
            if verdict is None:
                continue
            state, message = verdict
            with self.scanner.tx() as conn:
                _lock_reservations(conn, [row["job_id"]])
                if state is PilotState.LOST and _lose(conn, row["id"], message, now):
                    report.add("lost", row["id"])
                elif state is PilotState.FAILED:
                    _fail_dispatched(conn, row["id"], message, now)
            self.runtime.cancel_site_job(row["site"], row["site_job_id"], message)

    def _judge_pilot(self, row: RowMapping, now: float) -> tuple[PilotState, str] | None:
        """What became of a pilot: None (carry on), or its new state and why."""
        state = PilotState(row["state"])
        try:
            status = self.runtime.adapter(row["site"]).status(row["site_job_id"])
            site_state, ended = status.state, status.finished_at
        except UnknownJob:
            site_state, ended = JobState.FAILED, None
        except GridError as exc:
            log.warning("pilot %s: status at %s failed: %s", row["id"], row["site"], exc)
            return None
        timeout = self.params.heartbeat_timeout_s
        where = f"pilot {row['id']} at {row['site']} (site job {row['site_job_id']})"
        if state is PilotState.DISPATCHED:
            silent = row["heartbeat_at"] is not None and now - row["heartbeat_at"] > timeout
            gone = site_state.finished and (ended is None or now - ended > RESULT_GRACE_S)
            if silent or gone:
                why = "stopped heartbeating" if silent else f"site job {site_state.value}"
                return PilotState.FAILED, f"{where} died running its command: {why}"
            return None
        if site_state.finished:
            return PilotState.LOST, f"{where}: its site job ended ({site_state.value})"
        if state is PilotState.HELD and now - (row["heartbeat_at"] or 0.0) > timeout:
            return PilotState.LOST, f"{where}: no heartbeat for {timeout:g} s"
        started = status.started_at if site_state is JobState.RUNNING else None
        if state in WAITING_PILOT and started is not None and now - started > timeout:
            return PilotState.LOST, f"{where}: running {now - started:.0f} s, never registered"
        return None

    def _dispatch(self, now: float, report: ScanLog) -> None:
        for job_id in _job_ids(self.store, ReservationPhase.RESERVING):
            with self.scanner.tx() as conn:
                if pilot_pool.dispatch_if_ready(conn, job_id, now):
                    report.add("dispatched", job_id)

    def _reorganize(self, now: float, report: ScanLog) -> None:
        """Sec. 3.3 for every job whose lifetime ran out, earliest-submitted first."""
        with self.store.begin() as conn:
            expired = (
                conn.execute(
                    select(reservations.c.id)
                    .where(
                        and_(
                            reservations.c.state == ReservationPhase.RESERVING.value,
                            reservations.c.deadline_at.is_not(None),
                            reservations.c.deadline_at <= now,
                        )
                    )
                    .order_by(reservations.c.submitted_at, reservations.c.id)
                )
                .scalars()
                .all()
            )
        for job_id in expired:
            with self.scanner.handling(job_id, report):
                self._reorganize_one(job_id, now, report)

    def _reorganize_one(self, job_id: int, now: float, report: ScanLog) -> None:
        with self.scanner.tx() as conn:
            # Shifts and releases change pilots of several jobs and holds at several
            # sites: take the locks in the order the center's transactions take them
            # (pilot_pool: reservation rows, then pilot rows), sites in name order.
            _lock_reservations(conn, _job_ids_in(conn, ReservationPhase.RESERVING))
            for site in sorted(self.grid.site_names):
                self.store.lock_site(conn, site)
            pending = pending_jobs(conn, now)
            mine = next((p for p in pending if p.job_id == job_id), None)
            if mine is None:
                return
            others = [p for p in pending if p.job_id != job_id]
            decision = reorganize(mine, others, self.params.rule)
            cancels = apply_reorganization(conn, decision, now)
            for shift in decision.shifts:
                pilot_pool.dispatch_if_ready(conn, shift.to_job, now)
        report.add("reorganized", job_id)
        report.reasons.extend(decision.reasons)
        for site, site_job_id in cancels:
            self.runtime.cancel_site_job(site, site_job_id, f"reorganization of job {job_id}")

    def _substitute(self, now: float, report: ScanLog) -> None:
        for job_id in _job_ids(self.store, ReservationPhase.RESERVING):
            with self.scanner.handling(job_id, report):
                with self.scanner.tx() as conn:
                    made = self._substitutes_for(conn, job_id, now)
                if made:
                    report.add("substituted", job_id)
                    self._submit_pilots(made)

    def _substitutes_for(self, conn: Connection, job_id: int, now: float) -> list[_NewPilot]:
        # locked before the sites' rows (the holds) and before its own update below: a
        # pilot's result locks it first too, then the pilot's site
        row = (
            conn.execute(select(reservations).where(reservations.c.id == job_id).with_for_update())
            .mappings()
            .one()
        )
        if row["state"] != ReservationPhase.RESERVING.value:
            return []
        request = request_from_row(row)
        live = (
            conn.execute(
                select(pilots.c.site).where(
                    and_(
                        pilots.c.job_id == job_id,
                        pilots.c.state.in_((*WAITING_PILOT, PilotState.HELD.value)),
                    )
                )
            )
            .scalars()
            .all()
        )
        missing = request.virtual_jobs - len(live)
        if missing <= 0:
            return []
        already: dict[str, int] = defaultdict(int)
        for site in live:
            already[site] += 1
        avoid = json.loads(row["selection"] or "{}").get("avoid", [])
        made = self._select_and_record(conn, job_id, request, missing, already, avoid, now)
        if made is None:
            return []  # nothing can take them now; the next scan tries again
        conn.execute(
            update(reservations)
            .where(reservations.c.id == job_id)
            .values(substitutes=reservations.c.substitutes + len(made))
        )
        return made

    def _finish(self, now: float, report: ScanLog) -> None:
        """Finished jobs let every pilot they still have go."""
        with self.store.begin() as conn:
            rows = conn.execute(
                select(pilots.c.id, pilots.c.job_id, pilots.c.site, pilots.c.site_job_id)
                .join(reservations, reservations.c.id == pilots.c.job_id)
                .where(
                    and_(
                        reservations.c.state.in_([p.value for p in FINISHED_RESERVATION]),
                        pilots.c.state.in_((*WAITING_PILOT, *LIVE_PILOT)),
                    )
                )
            ).all()
        for pilot_id, job_id, site, site_job_id in rows:
            with self.scanner.tx() as conn:
                _lock_reservations(conn, [job_id])
                release_pilot(conn, pilot_id, "its job ended", now)
            if site_job_id is not None:
                self.runtime.cancel_site_job(site, site_job_id, "its job ended")
            report.add("finished", pilot_id)

    def _cancel_site_jobs(self, jobs: SiteJobs) -> None:
        self.runtime.cancel_site_jobs(jobs, "its co-reserved job failed")

    # -- status and cancel ----------------------------------------------------------------

    def status(self, job_id: int) -> ReservationRecord:
        with self.store.begin() as conn:
            return reservation_record(conn, job_id)

    def cancel(self, job_id: int) -> ReservationRecord:
        """Cancel the job and release every pilot (their site jobs are cancelled; a held
        pilot's program also hears "exit" on its next heartbeat)."""
        now = self.runtime.clock()
        with self.store.begin() as conn:
            self._end_job(conn, job_id, ReservationPhase.CANCELLED, "cancelled", now)
            rows = conn.execute(
                select(pilots.c.id, pilots.c.site, pilots.c.site_job_id)
                .where(
                    and_(
                        pilots.c.job_id == job_id,
                        pilots.c.state.in_((*WAITING_PILOT, *LIVE_PILOT)),
                    )
                )
                # the sites' counter rows change in name order, as submissions lock them
                .order_by(pilots.c.site, pilots.c.id)
            ).all()
            for pilot_id, _site, _job in rows:
                release_pilot(conn, pilot_id, "its job was cancelled", now)
        for _pilot, site, site_job_id in rows:
            self.runtime.cancel_site_job(site, site_job_id, "job cancelled")
        return self.status(job_id)

    def _end_job(
        self, conn: Connection, job_id: int, phase: ReservationPhase, message: str, now: float
    ) -> bool:
        done = conn.execute(
            update(reservations)
            .where(
                and_(
                    reservations.c.id == job_id,
                    reservations.c.state.in_(
                        (ReservationPhase.RESERVING.value, ReservationPhase.DISPATCHED.value)
                    ),
                )
            )
            .values(state=phase.value, message=message, finished_at=now)
        )
        return done.rowcount == 1


# -- rows ------------------------------------------------------------------------------------


def _waiting_t_avails(conn: Connection, job_id: int) -> list[float]:
    """The ``T_avail`` of the job's pilots still waiting for their processors: Eq. 2's
    lifetime is twice the largest."""
    rows = conn.execute(
        select(pilots.c.t_avail).where(
            and_(pilots.c.job_id == job_id, pilots.c.state.in_(WAITING_PILOT))
        )
    ).scalars()
    return [t for t in rows if t is not None]


def _insert_reservation(conn: Connection, request: CoReservationRequest, now: float) -> int:
    key = conn.execute(
        insert(reservations).values(
            name=request.name,
            command=request.command,
            processors=request.processors,
            vj_size=request.vj_size,
            max_clusters=request.max_clusters,
            lifetime_floor_s=request.lifetime_floor_s,
            workdir=request.workdir,
            state=ReservationPhase.RESERVING.value,
            submitted_at=now,
            reorganizations=0,
            substitutes=0,
            handling_errors=0,
            selection=json.dumps(
                {
                    "sites": list(request.sites) if request.sites else None,
                    "machine_file": None
                    if request.machine_file is None
                    else [list(pair) for pair in request.machine_file],
                    "resources": request.resources.as_json(),
                }
            ),
        )
    ).inserted_primary_key
    if key is None:
        raise StateError("the database returned no id for the new reservation")
    return int(key[0])


def _pilot_resources(
    request: CoReservationRequest, lifetime_s: float, site: SiteSpec
) -> JobResources:
    """What one pilot of ``request`` asks of ``site``: the request's resources over the
    site's defaults, its time limit stretched to cover the pilot's whole life:
    :func:`~gridcore.policies.coreservation.pilot_time_limit` of the reservation's lifetime
    (Eq. 2, the longest its pilots hold before the reorganization reconsiders them) and
    the command's own time limit (the request's, else the site's default), i.e.
    ``ceil(T + L + max(300 s, 10 % of (T + L)))``. Without a command time limit the pilot
    asks none either (the cluster's default applies, as to any job asking none)."""
    asked = submission.resources_at(request.resources, site)
    if asked.time_limit_s is None:
        return asked
    return replace(asked, time_limit_s=pilot_time_limit(lifetime_s, asked.time_limit_s))


def _set_selection(
    conn: Connection,
    job_id: int,
    selection: ClusterSelection,
    lifetime: float | None,
    now: float,
    sent: Mapping[int, JobResources] | None = None,
) -> None:
    old = conn.execute(
        select(reservations.c.selection).where(reservations.c.id == job_id)
    ).scalar_one()
    stored = json.loads(old or "{}")
    stored["choices"] = stored.get("choices", []) + [
        {"cluster": c.cluster, "t_avail_s": c.t_avail} for c in selection.choices
    ]
    stored["reasons"] = list(selection.reasons)
    if sent:
        stored["pilots"] = stored.get("pilots", {}) | {
            str(pilot_id): resources.as_json() for pilot_id, resources in sent.items()
        }
    values: dict[str, Any] = {"selection": json.dumps(stored)}
    if lifetime is not None:
        values |= {"lifetime_s": lifetime, "deadline_at": now + lifetime}
    conn.execute(update(reservations).where(reservations.c.id == job_id).values(values))


def _new_pilot(
    conn: Connection,
    job_id: int,
    request: CoReservationRequest,
    site: str,
    t_avail: float,
    now: float,
) -> _NewPilot:
    """A pilot row (its key names its id, so it is written in two statements of one
    transaction) and its hold in the capacity ledger."""
    token, digest = pilot_pool.new_token()
    placeholder = f"new-{uuid.uuid4().hex}"
    key_row = conn.execute(
        insert(pilots).values(
            job_id=job_id,
            first_job_id=job_id,
            site=site,
            processors=request.vj_size,
            state=PilotState.SUBMITTING.value,
            key=placeholder,
            token_hash=digest,
            t_avail=t_avail,
            submitted_at=now,
        )
    ).inserted_primary_key
    if key_row is None:
        raise StateError("the database returned no id for the new pilot")
    pilot_id = int(key_row[0])
    key = pilot_key(submission.install_id(conn), pilot_id)
    conn.execute(update(pilots).where(pilots.c.id == pilot_id).values(key=key))
    capacity.claim(
        conn, HolderKind.PILOT, str(pilot_id), site, request.vj_size, queue_if_full=True, now=now
    )
    return _NewPilot(
        pilot_id, job_id, site, request.vj_size, key, token, request.name, request.workdir
    )


def _record_site_job(conn: Connection, pilot_id: int, site_job_id: str) -> None:
    """The site has the pilot: name its job (a registration may have come first)."""
    conn.execute(
        update(pilots)
        .where(and_(pilots.c.id == pilot_id, pilots.c.site_job_id.is_(None)))
        .values(site_job_id=site_job_id)
    )
    conn.execute(
        update(pilots)
        .where(and_(pilots.c.id == pilot_id, pilots.c.state == PilotState.SUBMITTING.value))
        .values(state=PilotState.PENDING.value)
    )
    row = capacity.hold(conn, HolderKind.PILOT, str(pilot_id))
    if row is not None and row.ledger is not None:
        capacity.set_site_job(conn, HolderKind.PILOT, str(pilot_id), site_job_id)


def _lose(conn: Connection, pilot_id: int, message: str, now: float) -> bool:
    """A waiting or held pilot is lost: its job needs a substitute."""
    done = conn.execute(
        update(pilots)
        .where(
            and_(
                pilots.c.id == pilot_id,
                pilots.c.state.in_((*WAITING_PILOT, PilotState.HELD.value)),
            )
        )
        .values(state=PilotState.LOST.value, message=message, finished_at=now)
    )
    capacity.release(conn, HolderKind.PILOT, str(pilot_id), now)
    if done.rowcount == 1:
        log.warning("%s", message)
    return done.rowcount == 1


def _fail_dispatched(conn: Connection, pilot_id: int, message: str, now: float) -> None:
    """A dispatched pilot died: the program lost a rank, so its job fails."""
    row = conn.execute(
        update(pilots)
        .where(and_(pilots.c.id == pilot_id, pilots.c.state == PilotState.DISPATCHED.value))
        .values(state=PilotState.FAILED.value, message=message, finished_at=now)
        .returning(pilots.c.job_id)
    ).scalar_one_or_none()
    capacity.release(conn, HolderKind.PILOT, str(pilot_id), now)
    if row is None:
        return
    conn.execute(
        update(reservations)
        .where(
            and_(
                reservations.c.id == row,
                reservations.c.state == ReservationPhase.DISPATCHED.value,
            )
        )
        .values(state=ReservationPhase.FAILED.value, message=message, finished_at=now)
    )


def _lock_reservations(conn: Connection, job_ids: Sequence[int]) -> None:
    """Lock these reservation rows, in id order, before any pilot row changes: the lock
    order of :mod:`gridcore.engine.pilot_pool` (reservation, then its pilots), so a scan
    and the center's registrations and results never wait on each other in a cycle."""
    if job_ids:
        conn.execute(
            select(reservations.c.id)
            .where(reservations.c.id.in_(sorted(set(job_ids))))
            .order_by(reservations.c.id)
            .with_for_update()
        ).all()


def _job_ids_in(conn: Connection, phase: ReservationPhase) -> list[int]:
    return list(
        conn.execute(select(reservations.c.id).where(reservations.c.state == phase.value)).scalars()
    )


def _job_ids(store: Any, phase: ReservationPhase) -> list[int]:
    with store.begin() as conn:
        return list(
            conn.execute(
                select(reservations.c.id)
                .where(reservations.c.state == phase.value)
                .order_by(reservations.c.submitted_at, reservations.c.id)
            ).scalars()
        )
