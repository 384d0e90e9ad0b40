"""Rows of the co-reservation tables <-> values: the stored request, what each pilot
was sent, and the job record handed to operators, triggers, the dashboard and the CLI.

Kept apart from the scan (:mod:`gridcore.engine.coreservation`), as KOALA's are
(:mod:`gridcore.engine.coallocation_records`): the codecs are read by more than the
engine. The Airflow layer returns :class:`ReservationRecord` as XCom (plain JSON,
:meth:`ReservationRecord.as_json`), and the scan decodes the request it stored at
submission (VJM Sec. 3: ``n = processors / g`` virtual jobs on at most ``M`` clusters).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, RowMapping, and_, select

from gridcore.engine.phases import PilotState, ReservationPhase
from gridcore.errors import StateError
from gridcore.model import CoReservationRequest, JobResources
from gridcore.state.schema import pilots, reservation_shifts, reservations


@dataclass(frozen=True)
class PilotRecord:
    id: int
    job_id: int
    first_job_id: int
    site: str
    state: PilotState
    site_job_id: str | None
    t_avail: float | None
    submitted_at: float
    registered_at: float | None
    component: int | None
    dispatched_at: float | None
    started_at: float | None
    finished_at: float | None
    exit_code: int | None
    message: str | None
    # what its site job was sent (JobResources.as_json), its time limit included
    resources: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "job_id": self.job_id,
            "first_job_id": self.first_job_id,
            "site": self.site,
            "state": self.state.value,
            "site_job_id": self.site_job_id,
            "t_avail_s": self.t_avail,
            "submitted_at": self.submitted_at,
            "registered_at": self.registered_at,
            "component": self.component,
            "started_at": self.started_at,
            "exit_code": self.exit_code,
            "message": self.message,
            "resources": dict(self.resources),
        }


@dataclass(frozen=True)
class ReservationRecord:
    """A co-reserved job as stored, with the pilots it owns now."""

    job_id: int
    name: str
    state: ReservationPhase
    processors: int
    vj_size: int
    max_clusters: int
    submitted_at: float
    lifetime_s: float | None
    held_at: float | None
    dispatched_at: float | None
    finished_at: float | None
    message: str | None
    reorganizations: int
    substitutes: int
    shifts_received: int
    shifts_given: int
    selection: Mapping[str, Any]
    pilots: tuple[PilotRecord, ...] = ()

    @property
    def finished(self) -> bool:
        return self.state.finished

    @property
    def clusters(self) -> dict[str, int]:
        """Pilots per cluster among the ones doing (or that did) its work."""
        counts: dict[str, int] = {}
        for p in self.pilots:
            if p.state not in (PilotState.LOST, PilotState.RELEASED):
                counts[p.site] = counts.get(p.site, 0) + 1
        return counts

    @property
    def coallocation_s(self) -> float | None:
        """Submission to every pilot holding (the paper's co-allocation time)."""
        return None if self.held_at is None else self.held_at - self.submitted_at

    @property
    def dispatch_skew_s(self) -> float | None:
        """Between the first and the last start of the real command in its pilots."""
        starts = [p.started_at for p in self.pilots if p.started_at is not None]
        return max(starts) - min(starts) if len(starts) >= 2 else None

    def as_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "name": self.name,
            "state": self.state.value,
            "message": self.message,
            "processors": self.processors,
            "vj_size": self.vj_size,
            "max_clusters": self.max_clusters,
            "clusters": self.clusters,
            "t_avail_s": [c["t_avail_s"] for c in self.selection.get("choices", [])],
            "lifetime_s": self.lifetime_s,
            "coallocation_s": self.coallocation_s,
            "dispatch_skew_s": self.dispatch_skew_s,
            "shifts_received": self.shifts_received,
            "shifts_given": self.shifts_given,
            "substitutes": self.substitutes,
            "reorganizations": self.reorganizations,
            "pilots": [p.as_json() for p in self.pilots],
        }


def reservation_record(conn: Connection, job_id: int) -> ReservationRecord:
    row = (
        conn.execute(select(reservations).where(reservations.c.id == job_id))
        .mappings()
        .one_or_none()
    )
    if row is None:
        raise StateError(f"no co-reserved job {job_id} in the state database")
    owned = (
        conn.execute(select(pilots).where(pilots.c.job_id == job_id).order_by(pilots.c.id))
        .mappings()
        .all()
    )
    shifts = conn.execute(
        select(reservation_shifts.c.from_job, reservation_shifts.c.to_job).where(
            and_(
                reservation_shifts.c.to_job.is_not(None),
                (reservation_shifts.c.from_job == job_id) | (reservation_shifts.c.to_job == job_id),
            )
        )
    ).all()
    sent = _sent_to_pilots(conn, row, owned)
    return ReservationRecord(
        job_id=row["id"],
        name=row["name"],
        state=ReservationPhase(row["state"]),
        processors=row["processors"],
        vj_size=row["vj_size"],
        max_clusters=row["max_clusters"],
        submitted_at=row["submitted_at"],
        lifetime_s=row["lifetime_s"],
        held_at=row["held_at"],
        dispatched_at=row["dispatched_at"],
        finished_at=row["finished_at"],
        message=row["message"],
        reorganizations=row["reorganizations"],
        substitutes=row["substitutes"],
        shifts_received=sum(1 for _f, t in shifts if t == job_id),
        shifts_given=sum(1 for f, _t in shifts if f == job_id),
        selection=json.loads(row["selection"] or "{}"),
        pilots=tuple(_pilot_record(p, sent.get(str(p["id"]), {})) for p in owned),
    )


def request_from_row(row: RowMapping) -> CoReservationRequest:
    stored = json.loads(row["selection"] or "{}")
    sites = stored.get("sites")
    pinned = stored.get("machine_file")
    return CoReservationRequest(
        row["name"],
        row["command"],
        row["processors"],
        row["vj_size"],
        row["max_clusters"],
        row["lifetime_floor_s"],
        row["workdir"],
        tuple(sites) if sites else None,
        None if pinned is None else tuple((str(s), int(n)) for s, n in pinned),
        JobResources.from_json(stored.get("resources")),
    )


def sent_to_pilot(selection: str | None, pilot_id: int) -> JobResources:
    """The resources pilot ``pilot_id`` was first sent with (``selection.pilots``)."""
    sent = json.loads(selection or "{}").get("pilots", {})
    return JobResources.from_json(sent.get(str(pilot_id)))


def _sent_to_pilots(
    conn: Connection, row: RowMapping, owned: Sequence[RowMapping]
) -> dict[str, Any]:
    """Pilot id -> what it was sent, kept by the job each pilot was first sent for."""
    selections = {row["id"]: row["selection"]}
    others = {p["first_job_id"] for p in owned} - set(selections)
    if others:
        found = conn.execute(
            select(reservations.c.id, reservations.c.selection).where(
                reservations.c.id.in_(sorted(others))
            )
        ).all()
        selections |= {job_id: text for job_id, text in found}
    sent: dict[str, Any] = {}
    for text in selections.values():
        sent |= json.loads(text or "{}").get("pilots", {})
    return sent


def _pilot_record(row: RowMapping, resources: Mapping[str, Any]) -> PilotRecord:
    return PilotRecord(
        id=row["id"],
        job_id=row["job_id"],
        first_job_id=row["first_job_id"],
        site=row["site"],
        state=PilotState(row["state"]),
        site_job_id=row["site_job_id"],
        t_avail=row["t_avail"],
        submitted_at=row["submitted_at"],
        registered_at=row["registered_at"],
        component=row["component"],
        dispatched_at=row["dispatched_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        exit_code=row["exit_code"],
        message=row["message"],
        resources=resources,
    )
