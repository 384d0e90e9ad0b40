"""The VJ center as a FastAPI app: pilots (VJM Sec. 3.1) and KOALA's start barrier.

Routes (relative, so the app also mounts under a prefix in Airflow's api-server)::

    GET  /api/v1/health
    POST /api/v1/pilots/{id}/register        {"host", "port", "processors"}
    POST /api/v1/pilots/{id}/heartbeat
    GET  /api/v1/pilots/{id}/work?wait=S     long poll, S <= 30 (default 10)
    POST /api/v1/pilots/{id}/started
    POST /api/v1/pilots/{id}/result          {"exit_code", "message"}
    POST /api/v1/components/{job}/{epoch}/{idx}/register   {"host", "port"}
    GET  /api/v1/components/{job}/{epoch}/{idx}/peers?wait=S
    POST /api/v1/components/{job}/{epoch}/{idx}/released

The Grid page and its JSON (``/api/v1/grid``, ``/api/v1/grid/task``, ``/grid/...``) are
in :mod:`gridcore.api.grid_routes`; they need an authenticated user, chosen by whoever
builds the app (``dashboard``: Airflow's login in the plugin, the operator's token under
``gridcore serve``).

Every pilot and component route takes ``Authorization: Bearer <token>``: a missing or
unknown token gets 401, another pilot's or component's token 403, and the refusal comes
before the request does anything. The decisions are in :mod:`gridcore.engine.pilot_pool`
and :mod:`gridcore.engine.barrier_pool`; database calls run in worker threads, so a long
poll never blocks the event loop. Answers are the pools' TypedDicts, sent as they are
(``response_model=None``: no second validation of what the pool just built).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, TypeVar

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from sqlalchemy import text

from gridcore.api import grid_routes
from gridcore.api.auth import TOKEN_REFUSALS, Responses, Token, refusal, refused
from gridcore.api.grid_routes import Dashboard, DashboardRefused
from gridcore.engine import barrier_pool, pilot_pool
from gridcore.engine.barrier_pool import BarrierAnswer, BarrierState
from gridcore.engine.pilot_pool import HEARTBEAT_S, MESSAGE_CHARS, Action, Answer, TokenRefused
from gridcore.state.store import Store

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
POLL_S = 0.02  # how often a long poll looks at the database again
DEFAULT_WAIT_S = 10.0
MAX_WAIT_S = 30.0
T = TypeVar("T")
# a body FastAPI cannot read as text (not UTF-8, nested past the parser's depth): 400,
# before its JSON is looked at
UNREADABLE_BODY: Responses = {400: refusal("a body that cannot be read as JSON text")}


class _Body(BaseModel):
    # strict: a number is a JSON number of its type (no true, "40001" or 40001.0 for an
    # int), and nothing the model does not name. JSON Schema counts 40001.0 as an
    # integer, so the document says it in words.
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"description": "an integer is written without a fraction: 1, not 1.0"},
    )


# A host name, an IPv4 address or an IPv6 one (brackets, a zone after %): no space, no
# control character, so nothing a client sends can forge a log line or reach the
# database with a NUL in it (PostgreSQL refuses those).
HOST_PATTERN = r"^[A-Za-z0-9._:%\[\]-]+$"
# Free text (a pilot's message) may hold anything printable and line breaks, not NUL.
TEXT_PATTERN = r"^[^\x00]*$"


class PilotRegistration(_Body):
    host: str = Field(min_length=1, max_length=255, pattern=HOST_PATTERN)
    port: int = Field(ge=1, le=65535)
    processors: int = Field(ge=1, lt=2**31)


class PilotResult(_Body):
    exit_code: int = Field(ge=-(2**31), lt=2**31)
    message: str = Field(default="", max_length=MESSAGE_CHARS, pattern=TEXT_PATTERN)


class ComponentRegistration(_Body):
    host: str = Field(min_length=1, max_length=255, pattern=HOST_PATTERN)
    port: int = Field(ge=1, le=65535)


def _plain_digits(value: object) -> object:
    # A path id is plain decimal digits: "1.0", " 1", "1 ", "+1" or "01" are refused,
    # not read as 1 (the int check after this bounds it to the columns' range).
    if isinstance(value, str) and not re.fullmatch(r"0|[1-9][0-9]*", value):
        raise ValueError("must be plain decimal digits")
    return value


# Path(...) before the validator: only there do its bounds reach the OpenAPI document
Id = Annotated[int, Path(ge=0, lt=2**31), BeforeValidator(_plain_digits)]
Wait = Annotated[float, Query(ge=0.0, description=f"seconds, at most {MAX_WAIT_S:g}")]


@dataclass(frozen=True)
class Center:
    """What the routes of one app share (kept on ``app.state``, never in a global)."""

    store: Store
    heartbeat_s: float
    clock: Callable[[], float]
    # set when the server stops: long polls answer at once instead of holding shutdown
    closing: threading.Event = field(default_factory=threading.Event)
    # rung when a request of this server may have changed what a long poll waits for
    news: News = field(default_factory=lambda: News())


class News:
    """Wakes this server's long polls at once when one of its requests changed the state
    they wait on (the registration that dispatches a job: every pilot of the job learns
    within a round trip, not a :data:`POLL_S` apart, which is the dispatch skew). Polls
    still look every :data:`POLL_S`: another process (a scan) may change it too."""

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None

    def ring(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    async def nap(self, timeout_s: float) -> None:
        if self._event is None:
            self._event = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout_s)


def create_app(
    store: Store,
    *,
    heartbeat_s: float = HEARTBEAT_S,
    clock: Callable[[], float] = time.time,
    dashboard: Dashboard | None = None,
) -> FastAPI:
    """The center's app on ``store``; ``heartbeat_s`` is the interval pilots are told;
    ``dashboard``: who may see the Grid page (None: the operator's token from the
    environment, :func:`gridcore.api.grid_routes.operator_token_from_env`)."""
    board = grid_routes.operator_token_from_env() if dashboard is None else dashboard
    app = FastAPI(title="gridcore VJ center", version="1")
    app.state.center = Center(store, heartbeat_s, clock)
    app.add_exception_handler(TokenRefused, refused)
    app.add_exception_handler(RequestValidationError, invalid)
    app.include_router(_pilot_routes(), prefix=PREFIX)
    app.include_router(_component_routes(), prefix=PREFIX)
    app.add_api_route(
        f"{PREFIX}/health",
        _health,
        methods=["GET"],
        responses={503: refusal("the state database does not answer")},
    )
    app.include_router(grid_routes.grid_router(board, PREFIX, clock))
    if board.login:
        app.add_exception_handler(DashboardRefused, grid_routes.unauthenticated)
        app.include_router(grid_routes.login_route(board))
    return app


async def invalid(_request: Request, exc: Exception) -> JSONResponse:
    """422 for a request that fails validation, naming each field and what is wrong, but
    never echoing the value: a NaN, an infinity or a number past a float's range cannot
    be written as JSON (the default handler answered 500), and a value is the client's
    to know, not ours to repeat into responses and logs."""
    if not isinstance(exc, RequestValidationError):  # registered for it only
        raise exc
    detail = [
        {
            "loc": list(error.get("loc", ())),
            "msg": str(error.get("msg", "")),
            "type": str(error.get("type", "")),
        }
        for error in exc.errors()
    ]
    return JSONResponse({"detail": detail}, status_code=422)


def _center(request: Request) -> Center:
    center = request.app.state.center
    if not isinstance(center, Center):
        raise TypeError("app.state.center is not a Center: build the app with create_app")
    return center


CenterDep = Annotated[Center, Depends(_center)]


async def _pilot(center: CenterDep, pilot_id: Id, token: Token) -> int:
    """The pilot of the path, once the request's token is shown to be its own."""
    await asyncio.to_thread(pilot_pool.check_token, center.store, pilot_id, token)
    return pilot_id


async def _component(
    center: CenterDep, job_id: Id, epoch: Id, idx: Id, token: Token
) -> tuple[int, int, int]:
    """The component of the path, once the request's token is shown to be its own."""
    key = job_id, epoch, idx
    await asyncio.to_thread(barrier_pool.check_component_token, center.store, *key, token)
    return key


Pilot = Annotated[int, Depends(_pilot)]
Component = Annotated[tuple[int, int, int], Depends(_component)]


async def _health(center: CenterDep) -> dict[str, str]:
    try:
        await asyncio.to_thread(_ping, center.store)
    except Exception as exc:  # any database failure: unhealthy, said in one line
        raise HTTPException(503, f"state database: {type(exc).__name__}") from exc
    return {"status": "ok"}


def _pilot_routes() -> APIRouter:
    router = APIRouter(prefix="/pilots/{pilot_id}", tags=["pilots"], responses=TOKEN_REFUSALS)

    @router.post("/register", response_model=None, responses=UNREADABLE_BODY)
    async def register(center: CenterDep, pilot_id: Pilot, body: PilotRegistration) -> Answer:
        answer = await asyncio.to_thread(
            pilot_pool.register,
            center.store,
            pilot_id,
            body.host,
            body.port,
            body.processors,
            center.clock(),
            heartbeat_s=center.heartbeat_s,
        )
        log.info("pilot %d registered from %s:%d: %s", pilot_id, body.host, body.port, answer)
        center.news.ring()
        return answer

    @router.post("/heartbeat", response_model=None)
    async def heartbeat(center: CenterDep, pilot_id: Pilot) -> Answer:
        return await asyncio.to_thread(pilot_pool.heartbeat, center.store, pilot_id, center.clock())

    @router.get("/work", response_model=None)
    async def work(
        center: CenterDep, pilot_id: Pilot, request: Request, wait: Wait = DEFAULT_WAIT_S
    ) -> pilot_pool.Work:
        return await _long_poll(
            request,
            wait,
            center,
            lambda: asyncio.to_thread(pilot_pool.work, center.store, pilot_id),
            lambda answer: answer["action"] == Action.WAIT.value,
        )

    @router.post("/started", response_model=None)
    async def started(center: CenterDep, pilot_id: Pilot) -> Answer:
        return await asyncio.to_thread(pilot_pool.started, center.store, pilot_id, center.clock())

    @router.post("/result", response_model=None, responses=UNREADABLE_BODY)
    async def result(center: CenterDep, pilot_id: Pilot, body: PilotResult) -> Answer:
        answer = await asyncio.to_thread(
            pilot_pool.result, center.store, pilot_id, body.exit_code, body.message, center.clock()
        )
        log.info("pilot %d result: exit %d (%s)", pilot_id, body.exit_code, answer["state"])
        return answer

    return router


def _component_routes() -> APIRouter:
    router = APIRouter(
        prefix="/components/{job_id}/{epoch}/{idx}", tags=["barrier"], responses=TOKEN_REFUSALS
    )

    @router.post("/register", response_model=None, responses=UNREADABLE_BODY)
    async def register(
        center: CenterDep, key: Component, body: ComponentRegistration
    ) -> dict[str, str]:
        state = await asyncio.to_thread(
            barrier_pool.register_component,
            center.store,
            *key,
            body.host,
            body.port,
            center.clock(),
        )
        center.news.ring()  # the last component's registration releases them all
        return {"state": state.value}

    @router.get("/peers", response_model=None)
    async def peers(
        center: CenterDep, key: Component, request: Request, wait: Wait = DEFAULT_WAIT_S
    ) -> BarrierAnswer:
        return await _long_poll(
            request,
            wait,
            center,
            lambda: asyncio.to_thread(barrier_pool.component_peers, center.store, *key),
            lambda answer: answer["state"] == BarrierState.WAIT.value,
        )

    @router.post("/released", response_model=None)
    async def released(center: CenterDep, key: Component) -> dict[str, str]:
        release = barrier_pool.release_component
        state = await asyncio.to_thread(release, center.store, *key, center.clock())
        return {"state": state.value}

    return router


async def _long_poll(
    request: Request,
    wait: float,
    center: Center,
    ask: Callable[[], Awaitable[T]],
    waiting: Callable[[T], bool],
) -> T:
    """Ask every :data:`POLL_S` until the answer is no longer "wait", ``wait`` seconds
    pass (at most :data:`MAX_WAIT_S`), the client hangs up or the server is closing;
    the last answer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(wait, MAX_WAIT_S)
    while True:
        answer = await ask()
        if not waiting(answer) or loop.time() >= deadline or center.closing.is_set():
            return answer
        if await request.is_disconnected():
            return answer
        await center.news.nap(POLL_S)


def _ping(store: Store) -> None:
    with store.engine.connect() as conn:
        conn.execute(text("SELECT 1"))
