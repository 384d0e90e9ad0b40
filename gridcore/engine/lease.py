"""Named leases in the state database: one holder at a time, any process, any host.

The KOALA queue scanner runs under the lease ``koala-scan`` so that one scan at a time
applies decisions (seed 000 Sec. 3.1: KOALA scans its queues periodically; several
Airflow triggerers running engines on one database must not scan together). A holder
that stops (killed) is replaced once its lease expires; one that keeps scanning renews it.
"""

from __future__ import annotations

from sqlalchemy import and_, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from gridcore.state.schema import leases
from gridcore.state.store import Store


def take(store: Store, name: str, holder: str, now: float, length_s: float) -> int | None:
    """Take or renew lease ``name`` (free, expired, or already ``holder``'s) until
    ``now + length_s``: the number of takes before this one (the scan's index in the
    placement-queue cycle), or None while another holder has it."""
    lc = leases.c
    expires = now + length_s
    try:
        with store.begin() as conn:
            taken = conn.execute(
                update(leases)
                .where(and_(lc.name == name, or_(lc.holder == holder, lc.expires_at < now)))
                .values(holder=holder, expires_at=expires, scans=lc.scans + 1)
            )
            if taken.rowcount != 1:
                if conn.execute(select(lc.name).where(lc.name == name)).first():
                    return None
                conn.execute(
                    insert(leases).values(name=name, holder=holder, expires_at=expires, scans=1)
                )
            scans = conn.execute(select(lc.scans).where(lc.name == name)).scalar_one()
    except IntegrityError:
        return None  # another holder created the lease row at the same moment
    return int(scans) - 1


def release(store: Store, name: str, holder: str) -> None:
    """Give up lease ``name`` now if ``holder`` has it (another may take it at once)."""
    with store.begin() as conn:
        conn.execute(
            update(leases)
            .where(and_(leases.c.name == name, leases.c.holder == holder))
            .values(expires_at=0.0)
        )
