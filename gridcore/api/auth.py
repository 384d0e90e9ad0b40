"""Bearer tokens on the API: read from the ``Authorization`` header only (never from a
URL, which access logs and proxies record), checked against the hash in the state
database by :mod:`gridcore.engine.pilot_pool` and :mod:`gridcore.engine.barrier_pool`.
A refusal is answered before anything else of the request is done, so it changes
nothing; its message never repeats the token.

The header is read through FastAPI's :class:`~fastapi.security.HTTPBearer` (without its
own refusals: the routes decide between 401 and 403), so the OpenAPI document names the
scheme on every route that needs it; :data:`TOKEN_REFUSALS` lists the answers a refused
token gets, with their body (:class:`Refusal`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from gridcore.engine.pilot_pool import TokenRefused, Unauthenticated

BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description=(
        "a pilot's or a component's own token; on the Grid page under gridcore serve, the"
        " operator's"
    ),
)


class Refusal(BaseModel):
    """The body of every refusal that is not a validation error (401, 403, 404, 413,
    503): what was refused, in one line, never echoing a token."""

    detail: str


# a route's OpenAPI responses beyond its 200 and 422, as FastAPI takes them
Responses = dict[int | str, dict[str, Any]]


def refusal(description: str) -> dict[str, Any]:
    """The OpenAPI response of a refusal: a JSON :class:`Refusal`, whatever media type
    the route's own answer has (FastAPI would file a ``model`` under an HTML page's)."""
    schema = Refusal.model_json_schema()
    return {"description": description, "content": {"application/json": {"schema": schema}}}


# those of a route behind a pilot's or a component's token
TOKEN_REFUSALS: Responses = {
    401: refusal("no token, or one that is nobody's"),
    403: refusal("another pilot's or component's token"),
}


async def request_token(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)],
) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None for anything else."""
    return None if credentials is None else credentials.credentials


Token = Annotated[str | None, Depends(request_token)]


async def refused(_request: Request, exc: Exception) -> JSONResponse:
    """The answer to a refused token: 401 (with the challenge RFC 6750 asks for) or 403."""
    if not isinstance(exc, TokenRefused):  # registered for TokenRefused only
        raise exc
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthenticated) else None
    return JSONResponse({"detail": str(exc)}, status_code=exc.status, headers=headers)
