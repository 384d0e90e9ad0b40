"""The virtual-job pool (VJM Sec. 3.1): what the VJ center does when a pilot talks to it.

A pilot is a site job that, once its site starts it, registers here ("the resource for
the sub job has been reserved"), heartbeats, and asks for work. When every pilot of a
job holds its processors, the real command is dispatched to all of them in the SAME
transaction as the registration that completed the set (:func:`dispatch_if_ready`); the
pilots then start it together, report that it started, and report its exit code. The
HTTP layer (:mod:`gridcore.api.app`) is a thin shell around these functions.

Each operation is one transaction and may be repeated (a pilot retries a call whose
answer it lost): repeating it changes nothing more. Tokens: a pilot holds a random
bearer token; the pool stores only its sha256 (:func:`new_token`), so the state database
never holds a credential a reader of it could replay.

Locks (PostgreSQL; SQLite transactions are exclusive anyway): a transaction that
changes a pilot's state locks its reservation row FIRST, then the pilot rows. The
engine's scan (:mod:`gridcore.engine.coreservation`) takes them in the same order, so
no two transactions wait on each other in a cycle. The heartbeat touches only its own
pilot row and waits for nothing else.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from typing import Any, NotRequired, TypedDict

from sqlalchemy import Connection, and_, select, update

from gridcore.engine.phases import (
    FINISHED_PILOT,
    LIVE_PILOT,
    WAITING_PILOT,
    PilotState,
    ReservationPhase,
)
from gridcore.errors import GridError, StateError
from gridcore.model import HolderKind
from gridcore.state import capacity
from gridcore.state.schema import coalloc_components, pilots, reservations
from gridcore.state.store import Store

HEARTBEAT_S = 5.0
"""How often a pilot heartbeats (the register answer tells it). The engine's scan calls
a pilot lost after a few missed intervals."""
TOKEN_BYTES = 32
MESSAGE_CHARS = 4096  # a pilot's result message is cut to this length
# A pilot whose job moved under it while we took the locks (a shift) is looked up again,
# at most this many times (a shift per retry would be a storm, not a race).
_LOCK_TRIES = 5


class Action(enum.StrEnum):
    """What the center tells a pilot to do next."""

    HOLD = "hold"  # keep the processors; keep heartbeating and asking for work
    WAIT = "wait"  # (work) nothing to run yet
    RUN = "run"  # the job's command is dispatched to this pilot
    EXIT = "exit"  # released, lost or finished: exit now, the processors go back


class Answer(TypedDict):
    """The answer to register / heartbeat / started / result."""

    action: str  # Action
    state: str  # the pilot's PilotState after the call
    heartbeat_s: NotRequired[float]  # register only


class Peer(TypedDict):
    index: int
    host: str
    port: int


class Work(TypedDict):
    """The answer to a pilot asking for work: ``action`` alone for wait / exit."""

    action: str  # Action.WAIT | Action.RUN | Action.EXIT
    job: NotRequired[int]
    component: NotRequired[int]
    components: NotRequired[int]
    command: NotRequired[str]
    workdir: NotRequired[str | None]
    peers: NotRequired[list[Peer]]


# -- tokens ------------------------------------------------------------------------------


class TokenRefused(GridError):
    """A request's bearer token does not open the resource it names. ``status`` is the
    HTTP status the API answers with."""

    status = 401


class Unauthenticated(TokenRefused):
    """No token, or a token that belongs to nothing (HTTP 401)."""

    status = 401


class Forbidden(TokenRefused):
    """A real token, of another pilot or component (HTTP 403)."""

    status = 403


def new_token() -> tuple[str, str]:
    """A fresh bearer token and the hash to store: ``(token, token_hash(token))``."""
    token = secrets.token_urlsafe(TOKEN_BYTES)
    return token, token_hash(token)


def token_hash(token: str) -> str:
    """sha256 hex of the token: what the state database keeps."""
    return hashlib.sha256(token.encode()).hexdigest()


def tokens_match(token: str, stored_hash: str | None) -> bool:
    """Whether ``token`` is the one whose hash is stored, compared in constant time."""
    if stored_hash is None:
        return False
    return hmac.compare_digest(token_hash(token).encode(), stored_hash.encode())


def authenticate(conn: Connection, pilot_id: int, token: str | None) -> None:
    """Pass if ``token`` is pilot ``pilot_id``'s; raise :class:`Unauthenticated` if it is
    missing or nobody's, :class:`Forbidden` if it is another pilot's or a component's."""
    if not token:
        raise Unauthenticated("a bearer token is required")
    stored = conn.execute(
        select(pilots.c.token_hash).where(pilots.c.id == pilot_id)
    ).scalar_one_or_none()
    if tokens_match(token, stored):
        return
    refuse(conn, token, f"pilot {pilot_id}")


def refuse(conn: Connection, token: str, what: str) -> None:
    """Raise the refusal for a token that does not open ``what``: 403 if it is some other
    pilot's or component's token (an authenticated caller in the wrong place), else 401.
    The hash is looked up, never the token."""
    hashed = token_hash(token)
    other = (
        conn.execute(select(pilots.c.id).where(pilots.c.token_hash == hashed).limit(1)).first()
        or conn.execute(
            select(coalloc_components.c.job_id)
            .where(coalloc_components.c.token_hash == hashed)
            .limit(1)
        ).first()
    )
    if other is not None:
        raise Forbidden(f"this token does not open {what}")
    raise Unauthenticated(f"unknown token for {what}")


def check_token(store: Store, pilot_id: int, token: str | None) -> None:
    """:func:`authenticate` in a transaction of its own (tokens never change, so a later
    transaction acting for the pilot acts for the caller checked here)."""
    with store.begin() as conn:
        authenticate(conn, pilot_id, token)


# -- what a pilot does -------------------------------------------------------------------


def register(
    store: Store,
    pilot_id: int,
    host: str,
    port: int,
    processors: int,
    now: float,
    *,
    heartbeat_s: float = HEARTBEAT_S,
) -> Answer:
    """A pilot's site started it: a waiting pilot now HOLDS its processors (host and
    data port recorded), and if it was the last of its job the job is dispatched in this
    same transaction. A held or dispatched pilot registering again (a retry) changes
    nothing; a released, lost or finished one is told to exit.

    ``processors`` is what the site gave the pilot; it is not stored (the row's
    ``processors`` is what the capacity ledger counts) but a pilot given fewer than it
    asked for cannot run its share and is told to exit.
    """
    with store.begin() as conn:
        pilot = _lock_pilot(conn, pilot_id)
        state = PilotState(pilot.state)
        if state in WAITING_PILOT and processors >= pilot.processors:
            conn.execute(
                update(pilots)
                .where(and_(pilots.c.id == pilot_id, pilots.c.state == state.value))
                .values(
                    state=PilotState.HELD.value,
                    registered_at=now,
                    heartbeat_at=now,
                    host=host,
                    port=port,
                )
            )
            state = PilotState.HELD
            dispatch_if_ready(conn, pilot.job_id, now)
            state = _state(conn, pilot_id)
        elif state in LIVE_PILOT:
            conn.execute(update(pilots).where(pilots.c.id == pilot_id).values(heartbeat_at=now))
    action = Action.HOLD if state in LIVE_PILOT else Action.EXIT
    return {"action": action.value, "state": state.value, "heartbeat_s": heartbeat_s}


def dispatch_if_ready(conn: Connection, job_id: int, now: float) -> bool:
    """Dispatch job ``job_id`` if it is RESERVING and exactly its n = processors //
    vj_size pilots hold their processors (none still waiting at its site): components
    0..n-1 in (site, id) order, every pilot and the job DISPATCHED at ``now``, the job's
    ``held_at`` the last registration. True if this call dispatched it.

    Locks the reservation row, then its pilots' rows: two registrations completing
    the same job take turns, and only the one that sees all n held dispatches.
    """
    r, p = reservations.c, pilots.c
    job = conn.execute(
        select(r.state, r.processors, r.vj_size).where(r.id == job_id).with_for_update()
    ).one_or_none()
    if job is None or job.state != ReservationPhase.RESERVING.value:
        return False
    wanted = job.processors // job.vj_size
    live = (*WAITING_PILOT, *LIVE_PILOT)
    rows = conn.execute(
        select(p.id, p.state, p.registered_at)
        .where(and_(p.job_id == job_id, p.state.in_([s.value for s in live])))
        .order_by(p.site, p.id)
        .with_for_update()
    ).all()
    if len(rows) != wanted or any(row.state != PilotState.HELD.value for row in rows):
        return False
    for index, row in enumerate(rows):
        done = conn.execute(
            update(pilots)
            .where(and_(p.id == row.id, p.state == PilotState.HELD.value))
            .values(state=PilotState.DISPATCHED.value, component=index, dispatched_at=now)
        )
        if done.rowcount != 1:  # cannot happen under the row locks: refuse to half-dispatch
            raise StateError(f"reservation {job_id}: pilot {row.id} changed while dispatching")
    conn.execute(
        update(reservations)
        .where(and_(r.id == job_id, r.state == ReservationPhase.RESERVING.value))
        .values(
            state=ReservationPhase.DISPATCHED.value,
            dispatched_at=now,
            held_at=max(row.registered_at for row in rows),
        )
    )
    return True


def heartbeat(store: Store, pilot_id: int, now: float) -> Answer:
    """A live pilot is alive: HOLD while it holds, RUN once dispatched, EXIT otherwise
    (released, lost, finished; or never registered)."""
    with store.begin() as conn:
        conn.execute(
            update(pilots)
            .where(and_(pilots.c.id == pilot_id, pilots.c.state.in_([s.value for s in LIVE_PILOT])))
            .values(heartbeat_at=now)
        )
        state = _state(conn, pilot_id)
    action = {PilotState.HELD: Action.HOLD, PilotState.DISPATCHED: Action.RUN}.get(
        state, Action.EXIT
    )
    return {"action": action.value, "state": state.value}


def work(store: Store, pilot_id: int) -> Work:
    """What the pilot should do now: wait (holding, or not yet registered), run (its
    job's command, component, and every component's address), or exit."""
    with store.begin() as conn:
        state = _state(conn, pilot_id)
        if state in (PilotState.HELD, *WAITING_PILOT):
            return {"action": Action.WAIT.value}
        if state is not PilotState.DISPATCHED:
            return {"action": Action.EXIT.value}
        return _run_order(conn, pilot_id)


def started(store: Store, pilot_id: int, now: float) -> Answer:
    """The dispatched command started in the pilot (the first report counts)."""
    with store.begin() as conn:
        conn.execute(
            update(pilots)
            .where(
                and_(
                    pilots.c.id == pilot_id,
                    pilots.c.state == PilotState.DISPATCHED.value,
                    pilots.c.started_at.is_(None),
                )
            )
            .values(started_at=now)
        )
        state = _state(conn, pilot_id)
    action = Action.RUN if state is PilotState.DISPATCHED else Action.EXIT
    return {"action": action.value, "state": state.value}


def result(store: Store, pilot_id: int, exit_code: int, message: str, now: float) -> Answer:
    """The dispatched command exited: the pilot is COMPLETED (exit 0) or FAILED, its
    processors leave the capacity ledger, and when every pilot of the job has finished
    the job is COMPLETED or FAILED. A repeated report changes nothing; a report from a
    pilot that was not running a command (released, lost) is ignored."""
    with store.begin() as conn:
        pilot = _lock_pilot(conn, pilot_id)
        if pilot.state == PilotState.DISPATCHED.value:
            state = PilotState.COMPLETED if exit_code == 0 else PilotState.FAILED
            conn.execute(
                update(pilots)
                .where(and_(pilots.c.id == pilot_id, pilots.c.state == PilotState.DISPATCHED.value))
                .values(
                    state=state.value,
                    exit_code=exit_code,
                    message=message[:MESSAGE_CHARS],
                    finished_at=now,
                )
            )
            capacity.release(conn, HolderKind.PILOT, str(pilot_id), now)
            complete_if_done(conn, pilot.job_id, now)
        final = _state(conn, pilot_id)
    return {"action": Action.EXIT.value, "state": final.value}


def complete_if_done(conn: Connection, job_id: int, now: float) -> bool:
    """Finish a DISPATCHED job whose dispatched pilots have all finished: COMPLETED if
    every one completed, else FAILED with a message naming each failed component. True
    if this call finished it. The engine calls it too after marking a dispatched pilot
    FAILED (one that died while running its command)."""
    r, p = reservations.c, pilots.c
    job = conn.execute(select(r.state).where(r.id == job_id).with_for_update()).one_or_none()
    if job is None or job.state != ReservationPhase.DISPATCHED.value:
        return False
    rows = conn.execute(
        select(p.id, p.site, p.state, p.component, p.exit_code, p.message)
        .where(and_(p.job_id == job_id, p.component.is_not(None)))
        .order_by(p.component)
    ).all()
    finished = {s.value for s in FINISHED_PILOT}
    if not rows or any(row.state not in finished for row in rows):
        return False
    failed = [row for row in rows if row.state != PilotState.COMPLETED.value]
    phase = ReservationPhase.FAILED if failed else ReservationPhase.COMPLETED
    conn.execute(
        update(reservations)
        .where(and_(r.id == job_id, r.state == ReservationPhase.DISPATCHED.value))
        .values(state=phase.value, finished_at=now, message=_failure_message(failed))
    )
    return True


# -- helpers -----------------------------------------------------------------------------


def _lock_pilot(conn: Connection, pilot_id: int) -> Any:
    """The pilot's row, locked after its reservation's row (the module's lock order).
    A pilot shifted to another job between the two reads is read again."""
    p = pilots.c
    columns = (p.id, p.job_id, p.state, p.processors)
    for _ in range(_LOCK_TRIES):
        seen = conn.execute(select(p.job_id).where(p.id == pilot_id)).scalar_one_or_none()
        if seen is None:
            raise StateError(f"pilot {pilot_id} does not exist")
        conn.execute(
            select(reservations.c.id).where(reservations.c.id == seen).with_for_update()
        ).first()
        row = conn.execute(select(*columns).where(p.id == pilot_id).with_for_update()).one()
        if row.job_id == seen:
            return row
    raise StateError(f"pilot {pilot_id} kept moving between jobs while being locked")


def _state(conn: Connection, pilot_id: int) -> PilotState:
    state = conn.execute(select(pilots.c.state).where(pilots.c.id == pilot_id)).scalar_one_or_none()
    if state is None:
        raise StateError(f"pilot {pilot_id} does not exist")
    return PilotState(state)


def _run_order(conn: Connection, pilot_id: int) -> Work:
    p, r = pilots.c, reservations.c
    me = conn.execute(select(p.job_id, p.component).where(p.id == pilot_id)).one()
    job = conn.execute(select(r.command, r.workdir).where(r.id == me.job_id)).one()
    peers = conn.execute(
        select(p.component, p.host, p.port)
        .where(and_(p.job_id == me.job_id, p.component.is_not(None)))
        .order_by(p.component)
    ).all()
    return {
        "action": Action.RUN.value,
        "job": int(me.job_id),
        "component": int(me.component),
        "components": len(peers),
        "command": str(job.command),
        "workdir": job.workdir,
        "peers": [{"index": c, "host": h, "port": port} for c, h, port in peers],
    }


def _failure_message(failed: list[Any]) -> str | None:
    if not failed:
        return None
    parts = []
    for row in failed:
        what = f"component {row.component} (pilot {row.id} at {row.site})"
        if row.exit_code is None:
            parts.append(f"{what} {row.state}" + (f": {row.message}" if row.message else ""))
        else:
            parts.append(
                f"{what} exited {row.exit_code}" + (f": {row.message}" if row.message else "")
            )
    return "; ".join(parts)
