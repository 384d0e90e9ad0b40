"""The Grid page's data: one consistent snapshot of the state database, as plain JSON.

How it works, in full: ``docs/grid-page.md``
(section ``gridcore/api/dashboard.py``).
"""

from __future__ import annotations

import enum
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, RowMapping, and_, desc, func, or_, select

from gridcore.engine import health
from gridcore.engine.coallocation_records import job_record, request_from_json
from gridcore.engine.coreservation_records import reservation_record
from gridcore.engine.dataplan import STREAM_PREFIX, run_id_from
from gridcore.engine.phases import (
    FINISHED_RESERVATION,
    LIVE_PILOT,
    STARTED_COMPONENT,
    WAITING_PILOT,
    JobPhase,
    ReservationPhase,
)
from gridcore.model import UNFINISHED_STATES, HolderKind, Priority
from gridcore.state import capacity, site_definitions
from gridcore.state.capacity import Hold, Ledger, Usage
from gridcore.state.schema import (
    coalloc_components,
    coalloc_jobs,
    pilots,
    reservation_shifts,
    reservations,
    selections,
    sites,
)
from gridcore.state.store import Store

VERSION = 1
RECENT = 50  # decisions and finished reservations shown by default
RECENT_MAX = 500
WINDOW_S = 6 * 3600.0  # utilization looks back this far by default
WINDOW_MAX_S = 30 * 86400.0
TASK_MATCHES = 20  # records of one task matched by name (every DAG run), newest first
PAGE_REFRESH_S = 10.0
"""How often the page fetches a new answer (``data-refresh-s`` of grid.html/task.html)."""
REPORT_STALE_AFTER_S = 6 * PAGE_REFRESH_S
"""A site report older than this is shown as stale (greyed, with its age). While any
engine decides at a site its report is seconds old: every selection re-observes a site
whose report is older than 5 s (``runtime.DEFAULT_MAX_AGE_S``) and every KOALA or VJM scan
refreshes each poll (1-2 s). Six page refreshes of slack keep a row from blinking grey
between scans; a report older than that means nothing of ours is looking at the site,
so its idle processors describe a past moment, not now."""
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_NAME_MAX = 200
_LIVE_RESERVATION = [p.value for p in ReservationPhase if p not in FINISHED_RESERVATION]
_LIVE_PILOTS = [s.value for s in (*WAITING_PILOT, *LIVE_PILOT)]
_STARTED_COMPONENT = [s.value for s in STARTED_COMPONENT]


class ReportState(enum.StrEnum):
    """How current a site's report is on the page (:func:`report_view`)."""

    CURRENT = "current"
    STALE = "stale"
    NEVER = "never"  # not observed yet: its idle count is the grid file's size


@dataclass(frozen=True)
class TaskRef:
    """An Airflow task instance: ``run_id`` None on a task (not task-instance) view,
    ``map_index`` -1 for an unmapped task."""

    dag_id: str
    run_id: str | None
    task_id: str
    map_index: int = -1


@dataclass(frozen=True)
class TaskIds:
    """The gridcore ids Airflow recorded for one task instance (its task state store:
    ``SiteJobOperator``'s selection, ``SelectSitesOperator``'s burst,
    ``CoAllocationOperator``'s and ``CoReservationOperator``'s job)."""

    selections: tuple[int, ...] = ()
    coallocations: tuple[int, ...] = ()
    reservations: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.selections or self.coallocations or self.reservations)


def task_job_name(dag_id: str, task_id: str, map_index: int) -> str:
    """The name the operators give a task instance's selection, co-allocated job and
    co-reserved job: ``dag.task`` for an unmapped task (Airflow's map index -1 is no
    index, and ``dag.task.-1`` read as one in every job list), ``dag.task.map_index``
    for a mapped one; anything a batch system might mangle as ``_``
    (``gridcore_airflow.operators.base.job_name`` calls this)."""
    name = f"{dag_id}.{task_id}" if map_index < 0 else f"{dag_id}.{task_id}.{map_index}"
    return _NAME_UNSAFE.sub("_", name)[:_NAME_MAX]


def dataplan_stream(dag_id: str, run_id: str) -> str:
    """The selection stream of the data-plan run an Airflow DAG run makes
    (``gridcore_airflow.operators.dataplan``)."""
    return STREAM_PREFIX + run_id_from(f"{dag_id}-{run_id}")


@contextmanager
def snapshot(store: Store) -> Iterator[Connection]:
    """ONE transaction every read of an answer runs in: SQLite's ``BEGIN IMMEDIATE``
    (:class:`Store`), PostgreSQL's ``REPEATABLE READ`` (one snapshot for every
    statement, where the default READ COMMITTED takes one per statement)."""
    if store.is_sqlite:
        with store.begin() as conn:
            yield conn
        return
    with store.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            yield conn


# -- the grid ----------------------------------------------------------------------------


def read_grid(
    store: Store, now: float, *, recent: int = RECENT, window_s: float = WINDOW_S
) -> dict[str, Any]:
    """The whole grid as the state database says at ``now`` (docs/grid-page.md)."""
    recent = max(1, min(int(recent), RECENT_MAX))
    window_s = max(1.0, min(float(window_s), WINDOW_MAX_S))
    with snapshot(store) as conn:
        site_rows = conn.execute(select(sites).order_by(sites.c.name)).mappings().all()
        usage = capacity.usage(conn)
        healths = health.read_health(conn)
        defined = site_definitions.definitions(conn)
        live = capacity.live_holds(conn)
        koala = _koala_queues(conn)
        held_reservations = _reservations(conn, recent)
        live_pilots = _live_pilots(conn)
        plans = _dataplans(conn, live)
        decided = _decisions(conn, recent)
        intervals = _intervals(conn, now - window_s, now)
    totals = {r["name"]: int(r["total_processors"]) for r in site_rows}
    start = min((i.start for i in intervals), default=now)
    return {
        "version": VERSION,
        "taken_at": now,
        "report_stale_after_s": REPORT_STALE_AFTER_S,
        "sites": [
            site_view(
                r, usage[r["name"]], healths[r["name"]], live, defined.get(r["name"], []), now
            )
            for r in site_rows
        ],
        "koala": koala,
        "reservations": held_reservations,
        "pilots": live_pilots,
        "dataplans": plans,
        "decisions": decided,
        "utilization": utilization(intervals, totals, max(start, now - window_s), now),
    }


def site_view(
    row: RowMapping,
    usage: Usage,
    record: health.HealthRecord,
    live: Sequence[Hold],
    defined: Sequence[site_definitions.Definition],
    now: float,
) -> dict[str, Any]:
    """One site: its report and how old it is, the capacity ledger's counters and holds,
    its health, and the grid files that define it."""
    claimed_by: dict[str, int] = defaultdict(int)
    queued_by: dict[str, int] = defaultdict(int)
    held = False
    for hold in live:
        if hold.site == row["name"]:
            held = True
            by = claimed_by if hold.ledger is Ledger.CLAIMED else queued_by
            by[hold.kind.value] += hold.processors
    in_use = [d for d in defined if d.in_use(now)]
    return report_view(row, now) | {
        "name": row["name"],
        "kind": row["kind"],
        "release": row["release"],
        "api_version": row["api_version"],
        "total": row["total_processors"],
        "idle": row["reported_idle"],
        "free": usage.free_processors,
        "external_pending": row["external_pending"],
        "claimed": usage.claimed,
        "queued": usage.queued,
        "claimed_by_kind": dict(sorted(claimed_by.items())),
        "queued_by_kind": dict(sorted(queued_by.items())),
        "holds": {
            kind: {"holds": n, "processors": procs, "bytes": nbytes}
            for kind, (n, procs, nbytes) in sorted(usage.by_kind.items())
        },
        "storage_used": usage.storage_claimed,
        "storage_limit": usage.storage_total,
        "usable": record.usable,
        "consecutive_errors": record.consecutive_errors,
        "unusable_after": health.UNUSABLE_AFTER_ERRORS,
        "last_error": record.last_error,
        "last_error_at": record.last_error_at,
        "probe_job_id": record.probe_job_id,
        "health": health_reason(record),
        "mean_queue_wait_s": row["mean_queue_wait_s"],
        "mean_runtime_s": row["mean_runtime_s"],
        "finished_jobs": row["finished_jobs"],
        "definitions": [definition_view(d, now) for d in defined],
        # no grid file in use defines it and nothing of ours holds it there
        "retired": not in_use and not held,
    }


def report_view(row: RowMapping, now: float) -> dict[str, Any]:
    """How current the site's report is: its age at ``now`` and :class:`ReportState`
    (stale: older than :data:`REPORT_STALE_AFTER_S`)."""
    observed = row["observed_at"] or None  # 0.0: a new row, never observed
    age = None if observed is None else max(0.0, now - observed)
    if age is None:
        state = ReportState.NEVER
    else:
        state = ReportState.STALE if age > REPORT_STALE_AFTER_S else ReportState.CURRENT
    return {"observed_at": row["observed_at"], "report_age_s": age, "report_state": state.value}


def definition_view(definition: site_definitions.Definition, now: float) -> dict[str, Any]:
    """One grid file's definition of a site (gridcore.state.site_definitions)."""
    return {
        "source": definition.source,
        "kind": definition.kind,
        "processors": definition.processors,
        "url": definition.url,
        "partition": definition.partition,
        "storage_limit": definition.storage_total,
        "used_at": definition.used_at,
        "in_use": definition.in_use(now),
    }


def health_reason(record: health.HealthRecord) -> str:
    """The site's health and why, in words (as ``gridcore sites`` says it)."""
    limit = health.UNUSABLE_AFTER_ERRORS
    if not record.usable:
        probe = (
            f"probe job {record.probe_job_id} running" if record.probe_job_id else "probe pending"
        )
        return (
            f"unusable: set aside {record.set_aside_because()};"
            f" {probe}: usable again when a probe completes"
        )
    if record.consecutive_errors:
        when = "" if record.last_error_at is None else f" at {health.utc(record.last_error_at)}"
        return (
            f"usable: {record.consecutive_errors} consecutive errors (unusable at {limit});"
            f" last{when}: {record.last_error}"
        )
    return "usable: no error since its last completed job"


# -- KOALA -------------------------------------------------------------------------------


def _koala_queues(conn: Connection) -> dict[str, Any]:
    jc = coalloc_jobs.c
    live = [JobPhase.QUEUED.value, JobPhase.PLACED.value, JobPhase.CLAIMING.value]
    rows = conn.execute(select(coalloc_jobs).where(jc.state.in_(live)).order_by(jc.id))
    jobs = [coallocation_view(conn, row) for row in rows.mappings().all()]
    queued = [j for j in jobs if j["state"] == JobPhase.QUEUED.value]
    claiming = [j for j in jobs if j["state"] == JobPhase.CLAIMING.value]
    return {
        # scanned in id order, the high queue S times per low one (Sec. 3.1)
        "placement": {
            p.value: [j for j in queued if j["priority"] == p.value]
            for p in (Priority.HIGH, Priority.LOW)
        },
        "staging": [j for j in jobs if j["state"] == JobPhase.PLACED.value],
        # claimed in JCT order (Sec. 3.3)
        "claiming": sorted(claiming, key=lambda j: (j["jct"] or 0.0, j["job_id"])),
    }


def coallocation_view(conn: Connection, row: RowMapping) -> dict[str, Any]:
    """A co-allocated job's record, what it asked for, and why it waits (if it does)."""
    cc = coalloc_components.c
    parts = (
        conn.execute(
            select(coalloc_components)
            .where(and_(cc.job_id == row["id"], cc.epoch == row["epoch"]))
            .order_by(cc.idx)
        )
        .mappings()
        .all()
    )
    data = job_record(row, parts).as_json()
    request = request_from_json(row["request"])
    data["requested"] = {
        "kind": request.kind.value,
        "components": [{"size": c.size, "site": c.site} for c in request.components],
        "total": request.total,
    }
    data["wait_reason"] = wait_reason(data)
    return data


def wait_reason(job: Mapping[str, Any]) -> str | None:
    """Why a co-allocated job is not running, from its record (None once it runs)."""
    state, message = job["state"], job["message"]
    if state == JobPhase.QUEUED.value:
        if job["placement_tries"] == 0 and not message:
            return "submitted: no placement scan has tried it yet"
        return message or f"waiting in the placement queue ({job['placement_tries']} tries)"
    if state == JobPhase.PLACED.value:
        return "placed: its input file is being staged to the execution sites"
    if state == JobPhase.CLAIMING.value:
        claim = f"next claiming try at {job['jct']:.0f}" if job["jct"] is not None else ""
        return "; ".join(t for t in (message, claim) if t) or None
    return None


# -- VJM ---------------------------------------------------------------------------------


def _reservations(conn: Connection, recent: int) -> list[dict[str, Any]]:
    rc = reservations.c
    live = conn.execute(
        select(rc.id).where(rc.state.in_(_LIVE_RESERVATION)).order_by(rc.id)
    ).scalars()
    done = conn.execute(
        select(rc.id)
        .where(rc.state.not_in(_LIVE_RESERVATION))
        .order_by(desc(func.coalesce(rc.finished_at, rc.submitted_at)), desc(rc.id))
        .limit(recent)
    ).scalars()
    return [reservation_view(conn, job_id) for job_id in [*live, *done]]


def reservation_view(conn: Connection, job_id: int) -> dict[str, Any]:
    """A co-reserved job as the engine records it, with its latest selection's reasons."""
    record = reservation_record(conn, job_id)
    row = conn.execute(
        select(reservations.c.deadline_at, reservations.c.state).where(reservations.c.id == job_id)
    ).one()
    return record.as_json() | {
        "submitted_at": record.submitted_at,
        "held_at": record.held_at,
        "finished_at": record.finished_at,
        "deadline_at": row.deadline_at,
        "reasons": list(record.selection.get("reasons", [])),
    }


def _live_pilots(conn: Connection) -> list[dict[str, Any]]:
    pc = pilots.c
    rows = conn.execute(
        select(
            pc.id,
            pc.job_id,
            pc.site,
            pc.processors,
            pc.state,
            pc.site_job_id,
            pc.submitted_at,
            pc.registered_at,
            pc.heartbeat_at,
            pc.message,
        )
        .where(pc.state.in_(_LIVE_PILOTS))
        .order_by(pc.site, pc.id)
    ).mappings()
    return [dict(r) for r in rows]


# -- data plans --------------------------------------------------------------------------


def _dataplans(conn: Connection, live: Sequence[Hold]) -> list[dict[str, Any]]:
    """Data-plan runs in progress: a job of the run not finished, or a live volume of it."""
    sc = selections.c
    busy = conn.execute(
        select(sc.stream)
        .where(and_(sc.stream.startswith(STREAM_PREFIX), sc.state.in_(UNFINISHED_STATES)))
        .distinct()
    ).scalars()
    streams = set(busy)
    for hold in live:
        run = _volume_run(hold)
        if run is not None:
            streams.add(STREAM_PREFIX + run)
    return [dataplan_view(conn, stream, live) for stream in sorted(streams)]


def dataplan_view(conn: Connection, stream: str, live: Sequence[Hold]) -> dict[str, Any]:
    """One data-plan run: its jobs (pinned selections in its stream) and live volumes."""
    run_id = stream.removeprefix(STREAM_PREFIX)
    sc = selections.c
    rows = conn.execute(select(selections).where(sc.stream == stream).order_by(sc.id))
    jobs = [selection_view(r) for r in rows.mappings().all()]
    volumes = [hold_view(h) for h in live if _volume_run(h) == run_id]
    counts: dict[str, int] = defaultdict(int)
    for job in jobs:
        counts[job["state"]] += 1
    return {
        "run_id": run_id,
        "stream": stream,
        "sites": sorted({j["site"] for j in jobs} | {v["site"] for v in volumes}),
        "jobs": dict(sorted(counts.items())),
        "selections": jobs,
        "volumes": volumes,
        "volume_bytes": sum(v["storage_bytes"] for v in volumes),
    }


def _volume_run(hold: Hold) -> str | None:
    """The run whose private volume (``dataplan/<run>/<pipeline>/v<d>``) a hold is."""
    if hold.kind is not HolderKind.VOLUME:
        return None
    parts = hold.holder.rsplit("@", 1)[0].split("/")
    if len(parts) == 4 and parts[0] == "dataplan" and parts[3].startswith("v"):
        return parts[1]
    return None


def hold_view(hold: Hold) -> dict[str, Any]:
    return {
        "id": hold.id,
        "site": hold.site,
        "kind": hold.kind.value,
        "holder": hold.holder,
        "processors": hold.processors,
        "storage_bytes": hold.storage_bytes,
        "ledger": None if hold.ledger is None else hold.ledger.value,
        "site_job_id": hold.site_job_id,
        "created_at": hold.created_at,
    }


def selection_view(row: RowMapping) -> dict[str, Any]:
    return {
        "selection_id": row["id"],
        "stream": row["stream"],
        "name": row["name"],
        "site": row["site"],
        "processors": row["processors"],
        "protocol": row["protocol"],
        "mode": row["mode"],
        "outcome": row["outcome"],
        "reasons": json.loads(row["reasons"]),
        "state": row["state"],
        "job_id": row["job_id"],
        "exit_code": row["exit_code"],
        "message": row["message"],
        "selected_at": row["selected_at"],
        "submitted_at": row["submitted_at"],
        "started_at": row["started_at"],
        "finished_at": row["finished_at"],
    }


# -- decisions ---------------------------------------------------------------------------


def _decisions(conn: Connection, recent: int) -> list[dict[str, Any]]:
    """The ``recent`` latest decisions of every kind, newest first."""
    sc, jc, rc, hc = selections.c, coalloc_jobs.c, reservations.c, reservation_shifts.c
    found: list[dict[str, Any]] = []
    for r in conn.execute(
        select(selections).order_by(desc(sc.selected_at), desc(sc.id)).limit(recent)
    ).mappings():
        found.append(
            _decision(
                r["selected_at"],
                "selection",
                r["id"],
                r["name"],
                [r["site"]],
                r["outcome"],
                json.loads(r["reasons"]),
            )
        )
    for r in conn.execute(
        select(coalloc_jobs)
        .where(or_(jc.placed_at.is_not(None), jc.state == JobPhase.FAILED.value))
        .order_by(desc(func.coalesce(jc.placed_at, jc.finished_at, jc.submitted_at)), desc(jc.id))
        .limit(recent)
    ).mappings():
        found.append(_placement_decision(r))
    for r in conn.execute(
        select(reservations).order_by(desc(rc.submitted_at), desc(rc.id)).limit(recent)
    ).mappings():
        found.append(_reservation_decision(r))
    for r in conn.execute(
        select(reservation_shifts).order_by(desc(hc.at), desc(hc.id)).limit(recent)
    ).mappings():
        outcome = "released" if r["to_job"] is None else f"shifted to job {r['to_job']}"
        found.append(
            _decision(
                r["at"], "reorganization", r["id"], f"job {r['from_job']}", [r["site"]],
                f"{r['step']}: {outcome}", [r["reason"]],
            )
        )  # fmt: skip
    found.sort(key=lambda d: (d["at"], d["kind"], d["ref"]), reverse=True)
    return found[:recent]


def _decision(
    at: float,
    kind: str,
    ref: int,
    subject: str,
    where: Iterable[str],
    outcome: str,
    reasons: Sequence[str],
) -> dict[str, Any]:
    return {
        "at": at,
        "kind": kind,
        "ref": ref,
        "subject": subject,
        "sites": sorted(set(where)),
        "outcome": outcome,
        "reasons": list(reasons),
    }


def _placement_decision(row: RowMapping) -> dict[str, Any]:
    placement = json.loads(row["placement"]) if row["placement"] else None
    if placement is None:  # it failed in its placement queue: its last reason
        at = row["finished_at"] or row["submitted_at"]
        why = [row["message"]] if row["message"] else []
        return _decision(at, "placement", row["id"], row["name"], [], "failed", why)
    where = [c["site"] for c in placement["components"]]
    reasons = list(placement["reasons"])
    return _decision(
        row["placed_at"], "placement", row["id"], row["name"], where, "placed", reasons
    )


def _reservation_decision(row: RowMapping) -> dict[str, Any]:
    stored = json.loads(row["selection"] or "{}")
    # the latest selection set the deadline: it was taken a lifetime before it
    at = row["submitted_at"]
    if row["deadline_at"] is not None and row["lifetime_s"] is not None:
        at = row["deadline_at"] - row["lifetime_s"]
    where = [c["cluster"] for c in stored.get("choices", [])]
    chosen = f"{len(where)} virtual jobs" if where else "no cluster chosen yet"
    return _decision(
        at, "co-reservation", row["id"], row["name"], where, chosen, stored.get("reasons", [])
    )


# -- utilization -------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """Processors one job of ours kept busy at a site from ``start`` to ``end``."""

    site: str
    processors: int
    start: float
    end: float


def _intervals(conn: Connection, since: float, now: float) -> list[Interval]:
    """Every job of ours that ran at some time in [since, now] (docs/grid-page.md)."""
    sc, cc, pc = selections.c, coalloc_components.c, pilots.c
    sources = (
        (sc.site, sc.processors, sc.started_at, sc.finished_at, sc.state, UNFINISHED_STATES),
        (cc.site, cc.size, cc.registered_at, cc.finished_at, cc.state, _STARTED_COMPONENT),
        (pc.site, pc.processors, pc.registered_at, pc.finished_at, pc.state, _LIVE_PILOTS),
    )
    found: list[Interval] = []
    for site, procs, start, end, state, live in sources:
        rows = conn.execute(
            select(site, procs, start, end, state.in_(live)).where(
                and_(start.is_not(None), or_(end.is_(None), end >= since))
            )
        ).all()
        for s, n, began, ended, running in rows:
            if ended is None and not running:
                continue  # ended without a recorded end: its length is unknown
            found.append(Interval(s, int(n), float(began), now if ended is None else ended))
    return found


def utilization(
    intervals: Iterable[Interval], totals: Mapping[str, int], start: float, end: float
) -> dict[str, Any]:
    """Busy processors per site over [start, end] as step points ``[t, busy]``: the
    first at ``start``, one at every change, the last at ``end``."""
    changes: dict[str, dict[float, int]] = {name: {} for name in totals}
    for i in intervals:
        if i.site not in changes or i.end <= start or i.start >= end:
            continue
        steps = changes[i.site]
        steps[max(i.start, start)] = steps.get(max(i.start, start), 0) + i.processors
        if i.end < end:
            steps[i.end] = steps.get(i.end, 0) - i.processors
    return {
        "start": start,
        "end": end,
        "sites": {
            name: {"total": totals[name], "points": _steps(changes[name], start, end)}
            for name in sorted(totals)
        },
    }


def _steps(deltas: Mapping[float, int], start: float, end: float) -> list[list[float]]:
    busy = 0
    points: list[list[float]] = []
    for t in sorted(deltas):
        busy += deltas[t]
        if points and points[-1][0] == t:
            points[-1][1] = busy
        else:
            points.append([t, busy])
    if not points or points[0][0] > start:
        points.insert(0, [start, 0])
    points.append([end, busy])
    return points


# -- one task instance -------------------------------------------------------------------


def read_task(store: Store, ref: TaskRef, ids: TaskIds, now: float) -> dict[str, Any]:
    """What ``ref`` decided, placed, reserved or planned (docs/grid-page.md)."""
    name = task_job_name(ref.dag_id, ref.task_id, ref.map_index)
    stream = None if ref.run_id is None else dataplan_stream(ref.dag_id, ref.run_id)
    by = "task state store" if not ids.empty else "name"
    with snapshot(store) as conn:
        chosen = _task_selections(conn, name, ids, by)
        live = capacity.live_holds(conn)
        jc, rc = coalloc_jobs.c, reservations.c
        coalloc = _task_ids(conn, jc.id, jc.name, name, ids.coallocations, by)
        reserved = _task_ids(conn, rc.id, rc.name, name, ids.reservations, by)
        jobs = conn.execute(select(coalloc_jobs).where(jc.id.in_(coalloc)).order_by(desc(jc.id)))
        coallocations = [coallocation_view(conn, r) for r in jobs.mappings().all()]
        plan = None
        if stream is not None:
            plan = dataplan_view(conn, stream, live)
            plan = plan if plan["selections"] or plan["volumes"] else None
        co_reserved = [reservation_view(conn, job_id) for job_id in reserved]
    held = {h.holder: hold_view(h) for h in live if h.kind is HolderKind.SELECTION}
    for s in chosen:
        s["hold"] = held.get(str(s["selection_id"]))
    return {
        "version": VERSION,
        "taken_at": now,
        "task": {
            "dag_id": ref.dag_id,
            "run_id": ref.run_id,
            "task_id": ref.task_id,
            "map_index": ref.map_index,
            "job_name": name,
            "dataplan_stream": stream,
        },
        "matched_by": by,
        "selections": chosen,
        "coallocations": coallocations,
        "reservations": co_reserved,
        "dataplan": plan,
    }


def _task_selections(conn: Connection, name: str, ids: TaskIds, by: str) -> list[dict[str, Any]]:
    sc = selections.c
    wanted = _task_ids(conn, sc.id, sc.name, name, ids.selections, by)
    rows = conn.execute(select(selections).where(sc.id.in_(wanted)).order_by(desc(sc.id)))
    return [selection_view(r) for r in rows.mappings().all()]


def _task_ids(
    conn: Connection, id_col: Any, name_col: Any, name: str, given: Sequence[int], by: str
) -> list[int]:
    """The ids Airflow recorded, or (matching by name) the latest rows of the name."""
    if by != "name":
        return list(given)
    found = conn.execute(
        select(id_col).where(name_col == name).order_by(desc(id_col)).limit(TASK_MATCHES)
    ).scalars()
    return [int(i) for i in found]
