"""Bearer tokens on the API: read from the ``Authorization`` header only (never from a
URL, which access logs and proxies record), checked against the hash in the state
database by :mod:`gridcore.engine.pilot_pool` and :mod:`gridcore.engine.barrier_pool`.
A refusal is answered before anything else of the request is done, so it changes
nothing; its message never repeats the token."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from gridcore.engine.pilot_pool import TokenRefused, Unauthenticated

SCHEME = "bearer"


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None for anything else."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != SCHEME:
        return None
    return token.strip() or None


async def refused(_request: Request, exc: Exception) -> JSONResponse:
    """The answer to a refused token: 401 (with the challenge RFC 6750 asks for) or 403."""
    if not isinstance(exc, TokenRefused):  # registered for TokenRefused only
        raise exc
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthenticated) else None
    return JSONResponse({"detail": str(exc)}, status_code=exc.status, headers=headers)
