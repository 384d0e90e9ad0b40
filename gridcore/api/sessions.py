"""The Grid page's login sessions under ``gridcore serve`` (issue 21 item 11).

The login form's right token opens a session: a random id, sent back as the cookie, of
which the state database keeps only the hash (``gc_dashboard_sessions``), with when it
expires and which operator token opened it. A request with the cookie is let in while
that row exists, has not expired, and was opened by the token configured now.

Why a server-side session and not a signed value (an HMAC of an expiry): logging out
must end the session, and a signed value stays valid until it expires unless the server
keeps a list of the revoked ones, which is a table all the same; so the table holds the
live ones instead. Nothing in the cookie is the operator's token or says anything about
it, and a stolen cookie dies at logout, at :data:`SESSION_S`, or when the operator's
token is changed.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

from sqlalchemy import delete, insert, select

from gridcore.engine.pilot_pool import token_hash
from gridcore.state import schema
from gridcore.state.store import Store

SESSION_S = 8 * 3600.0  # a working day: a login lasts that long at most
SESSION_BYTES = 32  # as a pilot's token: 256 random bits
# A short digest of the operator token's hash: enough to tell a changed token (a wrong
# match is one in 2**32), too short to confirm a guess of the token offline.
OPERATOR_CHARS = 8


def open_session(store: Store, token_digest: str, now: float, lifetime_s: float = SESSION_S) -> str:
    """A new session for the operator token whose hash is ``token_digest``, valid for
    ``lifetime_s``; its id, the cookie's value (stored only hashed). Sessions already
    expired are deleted on the way."""
    session_id = secrets.token_urlsafe(SESSION_BYTES)
    table = schema.dashboard_sessions
    with store.begin() as conn:
        conn.execute(delete(table).where(table.c.expires_at <= now))
        conn.execute(
            insert(table).values(
                id_hash=token_hash(session_id),
                operator=_operator(token_digest),
                created_at=now,
                expires_at=now + lifetime_s,
            )
        )
    return session_id


def session_valid(store: Store, session_id: str, token_digest: str, now: float) -> bool:
    """Whether ``session_id`` is a session not yet expired, opened with the operator
    token whose hash is ``token_digest``."""
    table = schema.dashboard_sessions
    with store.begin() as conn:
        row = conn.execute(
            select(table.c.operator, table.c.expires_at).where(
                table.c.id_hash == token_hash(session_id)
            )
        ).first()
    return row is not None and row.operator == _operator(token_digest) and now < row.expires_at


def close_session(store: Store, session_id: str) -> None:
    """End ``session_id`` (logging out); nothing for an unknown one."""
    table = schema.dashboard_sessions
    with store.begin() as conn:
        conn.execute(delete(table).where(table.c.id_hash == token_hash(session_id)))


def _operator(token_digest: str) -> str:
    return hashlib.sha256(f"dashboard-session:{token_digest}".encode()).hexdigest()[:OPERATOR_CHARS]


__all__: Sequence[str] = ("SESSION_S", "close_session", "open_session", "session_valid")
