"""The Grid page and its JSON on the VJ center's app (docs/grid-page.md).

Routes (relative, as every route of the app)::

    GET  /api/v1/grid?recent=N&window_s=S          the grid (gridcore.api.dashboard.read_grid)
    GET  /api/v1/grid/task?dag_id=D&run_id=R&task_id=T&map_index=M
                                                   one task instance (read_task)
    GET  /grid/                                    the page (HTML; its JS fetches the JSON)
    GET  /grid/ti/{dag_id}/{run_id}/{task_id}/{map_index}
                                                   the task-instance page (Airflow's tab)
    GET  /grid/static/{grid.js,grid.css}           the page's script and style
    POST /grid/login                               token form -> session cookie (serve only)
    POST /grid/logout                              ends the session (gridcore serve only)

Every one of them needs an authenticated user, and who that is belongs to whoever
mounts the app (:class:`Dashboard`): in Airflow's api-server, Airflow's own login
(``requires_authenticated()``, given by the plugin); under ``gridcore serve``, the
operator's token (:func:`operator_token`, from ``$GRIDCORE_DASHBOARD_TOKEN`` or the file
``$GRIDCORE_DASHBOARD_TOKEN_FILE``) as ``Authorization: Bearer <token>``, or the cookie
:data:`COOKIE` the login form sets: a session id (:mod:`gridcore.api.sessions`), never
the token itself; Secure when the login came over https (the scheme uvicorn gives the
app: ``X-Forwarded-Proto`` counts only from a proxy in its ``forwarded_allow_ips``,
``$FORWARDED_ALLOW_IPS``, loopback by default). A request without either gets 401; with no token
configured every dashboard request gets 401 (the pilot and component routes keep
their own tokens and are not affected). ``{MAP_INDEX}`` and ``{RUN_ID}`` left in the
path by Airflow's UI (an unmapped task, a task view) mean -1 and no run.
"""

from __future__ import annotations

import asyncio
import html
import logging
import os
import re
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.security import APIKeyCookie

from gridcore.api import dashboard, sessions
from gridcore.api.auth import Responses, Token, refusal
from gridcore.api.dashboard import TaskIds, TaskRef
from gridcore.engine.pilot_pool import token_hash, tokens_match
from gridcore.errors import ConfigError

log = logging.getLogger(__name__)

TOKEN_ENV = "GRIDCORE_DASHBOARD_TOKEN"
TOKEN_FILE_ENV = "GRIDCORE_DASHBOARD_TOKEN_FILE"
TOKEN_MIN_CHARS = 16
COOKIE = "gridcore_dashboard"
LOGIN_BODY_MAX = 4096
STATIC = {"grid.js": "text/javascript", "grid.css": "text/css"}
MAP_INDEX_PLACEHOLDER = "{MAP_INDEX}"
RUN_ID_PLACEHOLDER = "{RUN_ID}"
MAP_INDEX_LIMIT = 2**31  # the columns' range: a larger index names no task instance
TaskIdsOf = Callable[[TaskRef], TaskIds]
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
SESSION_COOKIE = APIKeyCookie(
    name=COOKIE, auto_error=False, scheme_name="session", description="set by POST /grid/login"
)
Session = Annotated[str | None, Security(SESSION_COOKIE)]


class DashboardRefused(HTTPException):
    """A dashboard request without the operator's token (``gridcore serve``): 401."""

    def __init__(self, detail: str) -> None:
        super().__init__(401, detail, headers={"WWW-Authenticate": "Bearer"})


@dataclass(frozen=True)
class Dashboard:
    """How the mounting app guards the Grid page and finds a task instance's ids.

    ``dependencies``: FastAPI dependencies run before every dashboard route (each raises
    401 for a request without a user); ``task_ids``: the ids Airflow recorded for a task
    instance (None: match by name alone); ``login``: offer the token form (a page
    without the cookie answers 401 with the form) that checks ``token_hash``;
    ``refusals``: the statuses the dependencies refuse with (Airflow's: 401 without a
    user, 403 for a bad JWT), listed in the OpenAPI document."""

    dependencies: tuple[Any, ...]
    task_ids: TaskIdsOf | None = None
    login: bool = False
    token_hash: str | None = None
    refusals: tuple[int, ...] = (401, 403)


def operator_token(token: str | None) -> Dashboard:
    """The Grid page under ``gridcore serve``: the operator's ``token`` (None: nobody)."""
    if token is not None and len(token) < TOKEN_MIN_CHARS:
        raise ConfigError(f"{TOKEN_ENV}: at least {TOKEN_MIN_CHARS} characters, got {len(token)}")
    digest = None if token is None else token_hash(token)

    async def check(request: Request, given: Token, session: Session) -> None:
        if digest is None:
            raise DashboardRefused(f"no dashboard token is configured: set {TOKEN_ENV}")
        if given is not None:  # a bearer token is judged alone, whatever the cookie says
            if tokens_match(given, digest):
                return
        elif session and await _session_open(request, session, digest):
            return
        raise DashboardRefused("the dashboard needs the operator's token")

    return Dashboard((Depends(check),), login=True, token_hash=digest, refusals=(401,))


def operator_token_from_env() -> Dashboard:
    """:func:`operator_token` of ``$GRIDCORE_DASHBOARD_TOKEN``, else of the file
    ``$GRIDCORE_DASHBOARD_TOKEN_FILE`` (its first line), else None (nobody)."""
    token = os.environ.get(TOKEN_ENV) or None
    path = os.environ.get(TOKEN_FILE_ENV)
    if token is None and path:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
            token = lines[0].strip() if lines and lines[0].strip() else None
        except OSError as exc:
            raise ConfigError(f"{TOKEN_FILE_ENV}: cannot read {path}: {exc.strerror}") from None
    return operator_token(token)


def grid_router(board: Dashboard, prefix: str, clock: Callable[[], float]) -> APIRouter:
    """The dashboard's routes (module docstring), each behind ``board.dependencies``."""
    router = APIRouter(dependencies=list(board.dependencies), tags=["grid"])
    data, pages = _refusals(board, page=False), _refusals(board, page=True)
    missing: Responses = {404: refusal("no such file or path")}

    @router.get(f"{prefix}/grid", response_model=None, responses=data)
    async def grid(
        request: Request,
        recent: Annotated[int, Query(ge=1, le=dashboard.RECENT_MAX)] = dashboard.RECENT,
        window_s: Annotated[float, Query(ge=1.0, le=dashboard.WINDOW_MAX_S)] = dashboard.WINDOW_S,
    ) -> dict[str, Any]:
        store = request.app.state.center.store
        read = dashboard.read_grid
        return await asyncio.to_thread(read, store, clock(), recent=recent, window_s=window_s)

    @router.get(f"{prefix}/grid/task", response_model=None, responses=data)
    async def task(
        request: Request,
        dag_id: Annotated[str, Query(min_length=1, max_length=250)],
        task_id: Annotated[str, Query(min_length=1, max_length=250)],
        run_id: Annotated[str | None, Query(max_length=250)] = None,
        map_index: Annotated[str, Query(max_length=20)] = "-1",
    ) -> dict[str, Any]:
        ref = task_ref(dag_id, run_id, task_id, map_index, where="query")
        ids, error = await _task_ids(board.task_ids, ref)
        store = request.app.state.center.store
        found = await asyncio.to_thread(dashboard.read_task, store, ref, ids, clock())
        return found | {"task_ids_error": error}

    @router.get("/grid", response_class=HTMLResponse, responses=pages)
    @router.get("/grid/", response_class=HTMLResponse, responses=pages)
    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(_page("grid.html", _root(request)))

    @router.get(
        "/grid/ti/{dag_id}/{rest:path}", response_class=HTMLResponse, responses=pages | missing
    )
    async def task_page(request: Request, dag_id: str, rest: str) -> HTMLResponse:
        run_id, task_id, map_index = _split_ti_path(rest)
        ref = task_ref(dag_id, run_id, task_id, map_index, where="path")
        fields = {
            "dag_id": ref.dag_id,
            "run_id": ref.run_id or "",
            "task_id": ref.task_id,
            "map_index": str(ref.map_index),
        }
        return HTMLResponse(_page("task.html", _root(request), fields))

    script_or_style: Responses = {
        200: {"content": {kind: {"schema": {"type": "string"}} for kind in STATIC.values()}}
    }

    @router.get(
        "/grid/static/{name}", response_class=Response, responses=script_or_style | pages | missing
    )
    async def static(name: str) -> Response:
        if name not in STATIC:
            raise HTTPException(404, f"no static file {name!r}")
        return Response(_static_text(name), media_type=STATIC[name])

    return router


def login_route(board: Dashboard) -> APIRouter:
    """``POST /grid/login``: the token form; the right token opens a session whose id
    becomes the cookie (HttpOnly, SameSite=Strict, the app's path, Secure over https,
    for :data:`gridcore.api.sessions.SESSION_S`), anything else 401. Open: it is the
    way in. ``POST /grid/logout`` ends the cookie's session and clears the cookie."""
    router = APIRouter(tags=["grid"])
    form_body = {
        "requestBody": {
            "required": True,
            "content": {
                "application/x-www-form-urlencoded": {
                    "schema": {
                        "type": "object",
                        "properties": {"token": {"type": "string"}},
                        "required": ["token"],
                    }
                }
            },
        }
    }
    signed_in: Responses = {
        303: {"description": "the session cookie, and the way to the Grid page"}
    }
    too_long: Responses = {413: refusal(f"over {LOGIN_BODY_MAX} bytes")}

    @router.post(
        "/grid/login",
        response_class=RedirectResponse,
        status_code=303,
        responses=signed_in | _refusals(board, page=True) | too_long,
        openapi_extra=form_body,
    )
    async def login(request: Request) -> Response:
        # the form's one field, read here: no multipart parser needed for it
        body = await request.body()
        if len(body) > LOGIN_BODY_MAX:
            raise HTTPException(413, f"a login form is at most {LOGIN_BODY_MAX} bytes")
        form = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0]
        if board.token_hash is None or not tokens_match(token, board.token_hash):
            return await unauthenticated(request, DashboardRefused("wrong token"))
        center = request.app.state.center
        opened = sessions.open_session
        session_id = await asyncio.to_thread(opened, center.store, board.token_hash, center.clock())
        done = RedirectResponse(f"{_root(request)}/grid/", status_code=303)
        done.set_cookie(COOKIE, session_id, max_age=int(sessions.SESSION_S), **_cookie(request))
        return done

    @router.post(
        "/grid/logout",
        response_class=RedirectResponse,
        status_code=303,
        responses={303: {"description": "the cookie cleared, and the way to the token form"}},
    )
    async def logout(request: Request) -> Response:
        session_id = request.cookies.get(COOKIE)
        if session_id:
            await asyncio.to_thread(
                sessions.close_session, request.app.state.center.store, session_id
            )
        done = RedirectResponse(f"{_root(request)}/grid/", status_code=303)
        done.delete_cookie(COOKIE, **_cookie(request))
        return done

    return router


def _cookie(request: Request) -> dict[str, Any]:
    """The session cookie's attributes: for this app's path only, out of scripts' reach,
    never sent from another site's page, and over https only when it came over https
    (uvicorn sets the scheme, from ``X-Forwarded-Proto`` for a trusted proxy only)."""
    root = _root(request)
    return {
        "path": f"{root}/" if root else "/",
        "httponly": True,
        "samesite": "strict",
        "secure": request.url.scheme == "https",
    }


def _refusals(board: Dashboard, *, page: bool) -> Responses:
    """The OpenAPI responses of a refused dashboard request: JSON, or for a page under
    ``gridcore serve`` the token form (:func:`unauthenticated`)."""
    json_body = refusal("no authenticated user")
    form = {
        "description": "the token form",
        "content": {"text/html": {"schema": {"type": "string"}}},
    }
    return {status: form if page and board.login else json_body for status in board.refusals}


async def unauthenticated(request: Request, exc: Exception) -> Response:
    """A refused dashboard request: 401; a page gets the token form with it."""
    if not isinstance(exc, DashboardRefused):  # registered for DashboardRefused only
        raise exc
    headers = dict(exc.headers or {})
    root = _root(request)
    if request.url.path.startswith(f"{root}/grid"):
        text = _page("login.html", root, {"detail": str(exc.detail)})
        return HTMLResponse(text, status_code=401, headers=headers)
    return JSONResponse({"detail": exc.detail}, status_code=401, headers=headers)


def task_ref(
    dag_id: str, run_id: str | None, task_id: str, map_index: str, *, where: str
) -> TaskRef:
    """A task instance from path or query text (``where``: "path" or "query");
    Airflow's placeholders left unreplaced mean no run and map index -1. A map index
    that is not an integer from -1 to :data:`MAP_INDEX_LIMIT` is a validation error
    (422, the same body as every other one)."""
    index = map_index.strip()
    digits = index.removeprefix("-")
    if index == MAP_INDEX_PLACEHOLDER or index == "":
        number = -1
    elif digits.isascii() and digits.isdigit() and len(digits) <= len(str(MAP_INDEX_LIMIT)):
        number = int(index)
    else:
        number = MAP_INDEX_LIMIT  # refused below
    if not -1 <= number < MAP_INDEX_LIMIT:
        message = f"an integer from -1 to {MAP_INDEX_LIMIT - 1}, or {MAP_INDEX_PLACEHOLDER}"
        error = {"loc": (where, "map_index"), "msg": message, "type": "value_error"}
        raise RequestValidationError([error])
    run = None if run_id in (None, "", RUN_ID_PLACEHOLDER) else run_id
    return TaskRef(dag_id, run, task_id, number)


def _split_ti_path(rest: str) -> tuple[str, str, str]:
    """``{run_id}/{task_id}/{map_index}``; a run id may hold ``/`` (its ``%2F`` arrives
    decoded), a task id and a map index never do."""
    run_id, _, tail = rest.rpartition("/")
    run_id, _, task_id = run_id.rpartition("/")
    if not run_id or not task_id or not tail:
        raise HTTPException(404, "expected /grid/ti/{dag_id}/{run_id}/{task_id}/{map_index}")
    return run_id, task_id, tail


async def _task_ids(find: TaskIdsOf | None, ref: TaskRef) -> tuple[TaskIds, str | None]:
    """The ids Airflow recorded for ``ref``; on a failure to read them, none (the
    records are matched by name) and the error, shown in the answer."""
    if find is None or ref.run_id is None:
        return TaskIds(), None
    try:
        return await asyncio.to_thread(find, ref), None
    except Exception as exc:  # the page still shows what the name matches
        log.warning("task ids of %s: %s", ref, exc)
        return TaskIds(), f"{type(exc).__name__}: {exc}"


async def _session_open(request: Request, session_id: str, digest: str) -> bool:
    center = request.app.state.center
    valid = sessions.session_valid
    return await asyncio.to_thread(valid, center.store, session_id, digest, center.clock())


def _root(request: Request) -> str:
    """Where the app is mounted (``/gridcore`` in Airflow's api-server, "" alone)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _static_text(name: str) -> str:
    return resources.files("gridcore.api").joinpath("static", name).read_text(encoding="utf-8")


def _page(name: str, root: str, fields: dict[str, str] | None = None) -> str:
    """A page of ``static/`` with ``{{root}}`` and ``fields`` filled in (one pass,
    HTML-escaped: a value never becomes markup nor another placeholder)."""
    values = {"root": root, **(fields or {})}

    def fill(match: re.Match[str]) -> str:
        return html.escape(values[match[1]], quote=True) if match[1] in values else match[0]

    return _PLACEHOLDER.sub(fill, _static_text(name))


__all__: Sequence[str] = (
    "COOKIE",
    "TOKEN_ENV",
    "TOKEN_FILE_ENV",
    "Dashboard",
    "DashboardRefused",
    "grid_router",
    "login_route",
    "operator_token",
    "operator_token_from_env",
    "task_ref",
    "unauthenticated",
)
