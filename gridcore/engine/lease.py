"""Named leases in the state database with a fencing token: one holder at a time, and a
holder that lost its lease commits nothing more.

The KOALA queue scanner runs under the lease ``koala-scan`` so that one scan at a time
applies decisions (KOALA 2005 Sec. 3.1: KOALA scans its queues periodically; several
Airflow triggerers running engines on one database must not scan together). A lease
alone cannot promise that: a scan slowed past its lease (a slow slurmrestd, a paused
process) goes on writing after another engine took the lease over. So every take of
the lease by a new holder (free, expired, or someone else's) increments the row's
``token``, and every transition a scan commits runs in :meth:`Lease.transaction`, whose
first statement is the fenced check-and-renew::

    UPDATE gc_leases SET expires_at = ... WHERE name = ? AND holder = ? AND token = ?

which must match one row, or :class:`LeaseLost` is raised and the transaction rolls
back. On PostgreSQL that UPDATE also locks the lease row until the commit, so the
transitions of two scanners never interleave; on SQLite every transaction is already
exclusive (``BEGIN IMMEDIATE``). A live holder renews the lease while it works
(:meth:`Lease.kept`: a thread with its own connection, fenced as well), so the lease's
length only bounds how soon a dead holder is replaced; it is no longer what keeps two
scans apart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import Connection, and_, case, insert, or_, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from gridcore.errors import StateError
from gridcore.state.schema import leases
from gridcore.state.store import Store

log = logging.getLogger(__name__)

# A kept lease is renewed this many times per lease length.
RENEWALS_PER_LENGTH = 3


class LeaseLost(StateError):
    """The lease changed hands (or was released) since it was taken: the transaction
    that found out rolled back, and the holder must stop."""


@dataclass(frozen=True)
class Grant:
    """One take of a lease: ``token`` fences the holder's writes; ``index`` is the
    number of takes before this one (the KOALA scan's place in the high/low cycle)."""

    name: str
    holder: str
    token: int
    index: int


class Lease:
    """Lease ``name`` as ``holder`` sees it, ``length_s`` long from each (re)newal."""

    def __init__(
        self,
        store: Store,
        name: str,
        holder: str,
        length_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.name = name
        self.holder = holder
        self.length_s = length_s
        self.clock = clock

    def take(self, now: float) -> Grant | None:
        """Take the lease until ``now + length_s`` if it is free, expired, or already
        ours; None while another holder has it. The token grows unless we are renewing
        our own unexpired lease (then a scan still under way keeps its token)."""
        lc = leases.c
        expires = now + self.length_s
        ours_and_valid = and_(lc.holder == self.holder, lc.expires_at >= now)
        try:
            with self.store.begin() as conn:
                taken = conn.execute(
                    update(leases)
                    .where(
                        and_(
                            lc.name == self.name, or_(lc.holder == self.holder, lc.expires_at < now)
                        )
                    )
                    .values(
                        holder=self.holder,
                        expires_at=expires,
                        scans=lc.scans + 1,
                        token=case((ours_and_valid, lc.token), else_=lc.token + 1),
                    )
                )
                if taken.rowcount != 1:
                    if conn.execute(select(lc.name).where(lc.name == self.name)).first():
                        return None
                    conn.execute(
                        insert(leases).values(
                            name=self.name, holder=self.holder, expires_at=expires, scans=1, token=1
                        )
                    )
                row = conn.execute(select(lc.scans, lc.token).where(lc.name == self.name)).one()
        except IntegrityError:
            return None  # another holder created the lease row at the same moment
        return Grant(self.name, self.holder, int(row.token), int(row.scans) - 1)

    def fence(self, conn: Connection, grant: Grant) -> None:
        """In ``conn``'s transaction: check that ``grant`` still holds the lease and
        renew it (never shortening it). Raises LeaseLost otherwise."""
        lc = leases.c
        expires = self.clock() + self.length_s
        renewed = conn.execute(
            update(leases)
            .where(and_(lc.name == grant.name, lc.holder == grant.holder, lc.token == grant.token))
            .values(expires_at=case((lc.expires_at > expires, lc.expires_at), else_=expires))
        )
        if renewed.rowcount != 1:
            raise LeaseLost(
                f"lease {grant.name}: {grant.holder} lost it (token {grant.token} is no longer"
                " current); nothing more is committed under it"
            )

    @contextmanager
    def transaction(self, grant: Grant | None) -> Iterator[Connection]:
        """One transaction that commits only while ``grant`` holds the lease; with no
        grant (an engine's step outside its scan: submit, cancel) a plain one."""
        with self.store.begin() as conn:
            if grant is not None:
                self.fence(conn, grant)
            yield conn

    def renew(self, grant: Grant) -> None:
        """Renew ``grant`` in a transaction of its own (LeaseLost if it was lost)."""
        with self.transaction(grant):
            pass

    @contextmanager
    def kept(self, grant: Grant) -> Iterator[None]:
        """Renew ``grant`` from a thread (own connection) while the block runs, so slow
        site I/O inside it does not let the lease expire under a live holder. A lost
        lease stops the renewals; the holder's next fenced transaction finds out."""
        stop = threading.Event()
        every = self.length_s / RENEWALS_PER_LENGTH
        thread = threading.Thread(
            target=self._renew_until, args=(grant, stop, every), name=f"lease-{self.name}"
        )
        thread.daemon = True
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _renew_until(self, grant: Grant, stop: threading.Event, every: float) -> None:
        while not stop.wait(every):
            try:
                self.renew(grant)
            except LeaseLost:
                return
            except SQLAlchemyError as exc:  # a busy or briefly unreachable database
                log.warning("renewing lease %s: %s", self.name, exc)

    def release(self) -> None:
        """Give up the lease now if we hold it (another holder may take it at once)."""
        with self.store.begin() as conn:
            conn.execute(
                update(leases)
                .where(and_(leases.c.name == self.name, leases.c.holder == self.holder))
                .values(expires_at=0.0)
            )
