"""KOALA's start barrier (KOALA 2005 Sec. 3.3) on the center's side: what a component
waiting at the barrier asks the HTTP API, answered from the state database.

The same three steps as :mod:`gridcore.barrier` runs against the database itself
(``_register``, ``_peers``, ``_release``), with the same rules, so a component on a
cluster needs only its own bearer token, never the database's URL:

- register: host, data port and time into the component's row, if the component is
  still live (its job claiming or running, this epoch, the component submitted);
- peers: every component's address once all of the epoch's have registered; "wait"
  while some have not; "abort" once the job or this component is no longer live;
- released: the time the component passed the barrier.

A component is named by (job, epoch, index); its token is scoped to the row (job,
index) of the job's current placement.
"""

from __future__ import annotations

import enum
from typing import TypedDict

from sqlalchemy import ColumnElement, Connection, and_, select, update

from gridcore.engine.phases import BARRIER_JOB, STARTED_COMPONENT
from gridcore.engine.pilot_pool import Peer, Unauthenticated, refuse, tokens_match
from gridcore.state.schema import coalloc_components, coalloc_jobs
from gridcore.state.store import Store

# Job and component states in which a component may still wait at (or pass) the barrier.
_LIVE_JOB = tuple(p.value for p in BARRIER_JOB)
_LIVE_COMPONENT = tuple(s.value for s in STARTED_COMPONENT)


class BarrierState(enum.StrEnum):
    WAIT = "wait"  # registered (or asked for peers) before every component registered
    GO = "go"  # every component registered: start the command
    ABORT = "abort"  # the job was re-placed, aborted or cancelled: give up (exit 75)


class BarrierAnswer(TypedDict):
    state: str  # BarrierState
    peers: list[Peer]


def authenticate_component(
    conn: Connection, job_id: int, epoch: int, idx: int, token: str | None
) -> None:
    """Pass if ``token`` is component (``job_id``, ``idx``)'s; else raise
    :class:`~gridcore.engine.pilot_pool.Unauthenticated` (none or nobody's) or
    :class:`~gridcore.engine.pilot_pool.Forbidden` (another component's or a pilot's).
    ``epoch`` is checked by the operations: a component of an older placement is told
    to abort, as :mod:`gridcore.barrier` does."""
    what = f"component {idx} of job {job_id} (epoch {epoch})"
    if not token:
        raise Unauthenticated("a bearer token is required")
    cc = coalloc_components.c
    stored = conn.execute(
        select(cc.token_hash).where(and_(cc.job_id == job_id, cc.idx == idx))
    ).scalar_one_or_none()
    if tokens_match(token, stored):
        return
    refuse(conn, token, what)


def check_component_token(
    store: Store, job_id: int, epoch: int, idx: int, token: str | None
) -> None:
    """:func:`authenticate_component` in a transaction of its own."""
    with store.begin() as conn:
        authenticate_component(conn, job_id, epoch, idx, token)


def register_component(
    store: Store, job_id: int, epoch: int, idx: int, host: str, port: int, now: float
) -> BarrierState:
    """Record the component's address: WAIT if it is live, else ABORT (nothing written).
    Registering again (a retry) records the same address again."""
    with store.begin() as conn:
        done = conn.execute(
            update(coalloc_components)
            .where(_mine(job_id, epoch, idx))
            .values(host=host, port=port, registered_at=now)
        )
    return BarrierState.WAIT if done.rowcount == 1 else BarrierState.ABORT


def component_peers(store: Store, job_id: int, epoch: int, idx: int) -> BarrierAnswer:
    """GO with every component's address once all of the epoch's registered; WAIT (no
    peers) while some have not; ABORT once this component's job or epoch is not live."""
    c = coalloc_components.c
    with store.begin() as conn:
        job = conn.execute(
            select(coalloc_jobs.c.state, coalloc_jobs.c.epoch).where(coalloc_jobs.c.id == job_id)
        ).one_or_none()
        rows = conn.execute(
            select(c.idx, c.host, c.port, c.state)
            .where(and_(c.job_id == job_id, c.epoch == epoch))
            .order_by(c.idx)
        ).all()
    if job is None or job.state not in _LIVE_JOB or job.epoch != epoch:
        return {"state": BarrierState.ABORT.value, "peers": []}
    mine = [r for r in rows if r.idx == idx]
    if not mine or mine[0].state not in _LIVE_COMPONENT:
        return {"state": BarrierState.ABORT.value, "peers": []}
    if any(r.port is None for r in rows):
        return {"state": BarrierState.WAIT.value, "peers": []}
    peers: list[Peer] = [{"index": r.idx, "host": r.host, "port": r.port} for r in rows]
    return {"state": BarrierState.GO.value, "peers": peers}


def release_component(store: Store, job_id: int, epoch: int, idx: int, now: float) -> BarrierState:
    """Record that the component passed the barrier: GO if it is live, else ABORT."""
    with store.begin() as conn:
        done = conn.execute(
            update(coalloc_components).where(_mine(job_id, epoch, idx)).values(released_at=now)
        )
    return BarrierState.GO if done.rowcount == 1 else BarrierState.ABORT


def _mine(job_id: int, epoch: int, idx: int) -> ColumnElement[bool]:
    c = coalloc_components.c
    return and_(
        c.job_id == job_id,
        c.idx == idx,
        c.epoch == epoch,
        c.state.in_(_LIVE_COMPONENT),
    )
