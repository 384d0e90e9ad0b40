"""Lease checks shared by the SQLite (unit) and PostgreSQL tiers."""

from __future__ import annotations

import pytest
from sqlalchemy import insert, select

from gridcore.engine.lease import Lease, LeaseLost
from gridcore.state.schema import leases
from gridcore.state.store import Store


def assert_a_retaken_lease_fences_the_old_grant(store: Store) -> None:
    """The SAME holder re-takes its own expired lease (token 1 -> 2) while a transaction
    under the old grant tries to commit: only the token tells the two grants apart, so
    the old one's transaction raises LeaseLost and rolls back."""
    now = [100.0]
    lease = Lease(store, "scan", "same", 10.0, lambda: now[0])
    old = lease.take(100.0)
    assert old is not None and old.token == 1
    now[0] = 200.0  # its scan stalled past the lease: expired, still the holder's row
    new = lease.take(200.0)
    assert new is not None and (new.holder, new.token) == (old.holder, 2)
    with (
        pytest.raises(LeaseLost, match="token 1 is no longer current"),
        lease.transaction(old) as conn,
    ):
        conn.execute(insert(leases).values(name="by-the-old-grant", holder="same", expires_at=0))
    with lease.transaction(new) as conn:
        conn.execute(insert(leases).values(name="by-the-new-grant", holder="same", expires_at=0))
    with store.begin() as conn:
        names = set(conn.execute(select(leases.c.name)).scalars())
        token = conn.execute(select(leases.c.token).where(leases.c.name == "scan")).scalar_one()
    assert names == {"scan", "by-the-new-grant"} and token == 2
