"""VJM's resource reorganization (Sec. 3.3) applied to the pilot rows: a decision of
:func:`gridcore.policies.coreservation.reorganize` becomes shifts of held pilots to
other jobs and releases of clusters, in the scan's fenced transaction, each moved or
released pilot a ``gc_reservation_shifts`` row.

The pending jobs the policy decides on (Definitions 1-2) are read here as well
(:func:`pending_jobs`); the scan (:mod:`gridcore.engine.coreservation`) decides when a
job's lifetime ran out and takes the locks first.
"""

from __future__ import annotations

import json
from collections import defaultdict

from sqlalchemy import Connection, and_, func, insert, select, update

from gridcore.engine.phases import LIVE_PILOT, WAITING_PILOT, PilotState, ReservationPhase
from gridcore.model import HolderKind
from gridcore.policies.coreservation import ClusterReservation, PendingJob, Reorganization
from gridcore.state import capacity
from gridcore.state.schema import pilots, reservation_shifts, reservations


def pending_jobs(conn: Connection, now: float) -> list[PendingJob]:
    """Every pending (reserving) job as Definitions 1-2 see it: per cluster, its live
    pilots (required), the held ones, and how long the others have waited."""
    rows = conn.execute(
        select(
            reservations.c.id,
            reservations.c.submitted_at,
            pilots.c.site,
            pilots.c.state,
            pilots.c.submitted_at.label("pilot_submitted"),
        )
        .join(pilots, pilots.c.job_id == reservations.c.id)
        .where(
            and_(
                reservations.c.state == ReservationPhase.RESERVING.value,
                pilots.c.state.in_((*WAITING_PILOT, PilotState.HELD.value)),
            )
        )
    ).all()
    submitted: dict[int, float] = {}
    per: dict[int, dict[str, list[float | None]]] = defaultdict(lambda: defaultdict(list))
    for job_id, job_submitted, site, state, pilot_submitted in rows:
        submitted[job_id] = job_submitted
        per[job_id][site].append(None if state == PilotState.HELD.value else now - pilot_submitted)
    return [
        PendingJob(
            job_id,
            submitted[job_id],
            {
                site: ClusterReservation(
                    len(waits),
                    sum(w is None for w in waits),
                    tuple(w for w in waits if w is not None),
                )
                for site, waits in clusters.items()
            },
        )
        for job_id, clusters in per.items()
    ]


def apply_reorganization(
    conn: Connection, decision: Reorganization, now: float
) -> list[tuple[str, str]]:
    """Shift, then release, in the caller's (fenced) transaction; each moved or released
    pilot is a ``gc_reservation_shifts`` row. Returns the site jobs to cancel."""
    cancels: list[tuple[str, str]] = []
    a = decision.job_id
    for shift in decision.shifts:
        moved = (
            conn.execute(
                select(pilots.c.id)
                .where(
                    and_(
                        pilots.c.job_id == a,
                        pilots.c.site == shift.cluster,
                        pilots.c.state == PilotState.HELD.value,
                    )
                )
                .order_by(pilots.c.id)
                .limit(shift.pilots)
            )
            .scalars()
            .all()
        )
        for pilot_id in moved:
            conn.execute(update(pilots).where(pilots.c.id == pilot_id).values(job_id=shift.to_job))
            _shift_row(
                conn, now, decision.step, a, shift.to_job, shift.cluster, pilot_id, shift.reason
            )
        # The beneficiary now holds what it waited for there: its surplus waiting pilots
        # on that cluster (the newest first) go.
        surplus = conn.execute(
            select(pilots.c.id, pilots.c.site_job_id)
            .where(
                and_(
                    pilots.c.job_id == shift.to_job,
                    pilots.c.site == shift.cluster,
                    pilots.c.state.in_(WAITING_PILOT),
                )
            )
            .order_by(pilots.c.submitted_at.desc(), pilots.c.id.desc())
            .limit(len(moved))
        ).all()
        for pilot_id, site_job_id in surplus:
            why = f"job {shift.to_job} received {len(moved)} held pilots on {shift.cluster}"
            release_pilot(conn, pilot_id, why, now)
            _shift_row(conn, now, "surplus", shift.to_job, None, shift.cluster, pilot_id, why)
            if site_job_id is not None:
                cancels.append((shift.cluster, site_job_id))
    for cluster in decision.release:
        rows = conn.execute(
            select(pilots.c.id, pilots.c.site_job_id).where(
                and_(
                    pilots.c.job_id == a,
                    pilots.c.site == cluster,
                    pilots.c.state.in_((*WAITING_PILOT, PilotState.HELD.value)),
                )
            )
        ).all()
        why = "; ".join(decision.reasons)
        for pilot_id, site_job_id in rows:
            release_pilot(conn, pilot_id, f"{decision.step}: released {cluster}", now)
            _shift_row(conn, now, decision.step, a, None, cluster, pilot_id, why)
            if site_job_id is not None:
                cancels.append((cluster, site_job_id))
    selection = json.loads(
        conn.execute(select(reservations.c.selection).where(reservations.c.id == a)).scalar_one()
        or "{}"
    )
    selection["avoid"] = list(decision.release)
    # With substitutes to find, the new lifetime starts with their selection (Sec. 3.3);
    # a job that kept everything ("wait", "none") is checked again after the floor.
    floor = reservations.c.lifetime_floor_s
    conn.execute(
        update(reservations)
        .where(reservations.c.id == a)
        .values(
            reorganizations=reservations.c.reorganizations + 1,
            deadline_at=None if decision.substitutes else now + floor,
            selection=json.dumps(selection),
        )
    )
    # A job that received held pilots starts its lifetime afresh (the paper is silent;
    # read literally, its old timer can expire first and shift them straight back:
    # gridcore.sim.coreservation, "A receiver's lifetime").
    receivers = sorted({shift.to_job for shift in decision.shifts})
    if receivers:
        conn.execute(
            update(reservations)
            .where(
                and_(
                    reservations.c.id.in_(receivers),
                    reservations.c.state == ReservationPhase.RESERVING.value,
                )
            )
            .values(deadline_at=now + func.coalesce(reservations.c.lifetime_s, floor))
        )
    return cancels


def release_pilot(conn: Connection, pilot_id: int, message: str, now: float) -> bool:
    """Let a waiting or live pilot go (a released cluster, a surplus, an ended or
    cancelled job) and its hold with it; False if it had ended already."""
    done = conn.execute(
        update(pilots)
        .where(and_(pilots.c.id == pilot_id, pilots.c.state.in_((*WAITING_PILOT, *LIVE_PILOT))))
        .values(state=PilotState.RELEASED.value, message=message, finished_at=now)
    )
    capacity.release(conn, HolderKind.PILOT, str(pilot_id), now)
    return done.rowcount == 1


def _shift_row(
    conn: Connection,
    now: float,
    step: str,
    from_job: int,
    to_job: int | None,
    site: str,
    pilot_id: int,
    reason: str,
) -> None:
    conn.execute(
        insert(reservation_shifts).values(
            at=now,
            step=step,
            from_job=from_job,
            to_job=to_job,
            site=site,
            pilot_id=pilot_id,
            reason=reason,
        )
    )
