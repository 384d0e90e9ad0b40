"""The Airflow plugin: the VJ center and the Grid page mounted in Airflow's api-server.

Pilots and co-allocated components on a cluster talk to gridcore over HTTP with a token
scoped to themselves (``gridcore.api``). A deployment may run that API as its own
service (``gridcore serve``) or let Airflow's api-server serve it under
``/gridcore`` through this plugin (entry point ``airflow.plugins``); pilots then reach
``https://<airflow>/gridcore`` (set ``center_url`` in the ``gridcore`` connection).
Those routes authenticate with the pilots' and components' own bearer tokens, not with
Airflow's login: a pilot is not an Airflow user.

The Grid page (``/gridcore/grid/``, docs/grid-page.md) is a nav item under Browse and a
tab of every task instance (``external_views``, destinations ``nav`` and
``task_instance``, shown in Airflow's UI in an iframe). The page, its script and its JSON
(``/gridcore/api/v1/grid``, ``/gridcore/api/v1/grid/task``) are served only to users
Airflow has authenticated: Airflow's own ``requires_authenticated()`` dependency (the
``_token`` cookie the login sets, or ``Authorization: Bearer <jwt>``), else 401. A task
instance's records are found by the ids its operators put in Airflow's task state store
(:func:`task_ids`).

The state database is ``$GRIDCORE_DB_URL`` (else SQLite under ``$GRIDCORE_HOME``),
opened lazily: the app is built, and the database opened, when the first request comes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI
from sqlalchemy import select

from gridcore.api.app import create_app
from gridcore.api.dashboard import TaskIds, TaskRef
from gridcore.api.grid_routes import Dashboard
from gridcore.state.store import open_store

URL_PREFIX = "/gridcore"
GRID_ROUTE = "grid"
TASK_ROUTE = "grid-ti"


def task_ids(ref: TaskRef) -> TaskIds:
    """The gridcore ids the task instance's operators recorded in Airflow's task state
    store (every try of the instance shares them): a site job's selection, a burst's
    selections, a co-allocated or co-reserved job."""
    from airflow.models.task_state_store import TaskStateStoreModel as Stored
    from airflow.utils.session import create_session

    # here, not at the top: the api-server loads the plugin without the operators
    from gridcore_airflow.operators import coallocation, coreservation, select_sites, site_job

    if ref.run_id is None:
        return TaskIds()
    with create_session() as session:
        rows = session.execute(
            select(Stored.key, Stored.value).where(
                Stored.dag_id == ref.dag_id,
                Stored.run_id == ref.run_id,
                Stored.task_id == ref.task_id,
                Stored.map_index == ref.map_index,
            )
        ).all()
    values = {key: json.loads(value) for key, value in rows}
    return TaskIds(
        selections=_ids(values.get(site_job.SELECTION_KEY))
        + _ids(values.get(select_sites.SELECTIONS_KEY)),
        coallocations=_ids(values.get(coallocation.JOB_KEY)),
        reservations=_ids(values.get(coreservation.JOB_KEY)),
    )


def _ids(value: Any) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    return tuple(v for v in values if isinstance(v, int) and not isinstance(v, bool))


class LazyApp:
    """An ASGI app built on its first event: loading the plugin (every Airflow component
    does, the scheduler and the workers too) then imports neither the api-server's
    security modules nor opens the state database; only the api-server's first request
    to ``/gridcore`` does."""

    def __init__(self, build: Callable[[], FastAPI]) -> None:
        self._build = build
        self._app: FastAPI | None = None

    @property
    def app(self) -> FastAPI:
        if self._app is None:
            self._app = self._build()
        return self._app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def build_center_app() -> FastAPI:
    """The center's app with the Grid page behind Airflow's own login."""
    from airflow.api_fastapi.core_api.security import requires_authenticated

    board = Dashboard((Depends(requires_authenticated()),), task_ids=task_ids)
    return create_app(open_store(), dashboard=board)


def center_app() -> LazyApp:
    return LazyApp(build_center_app)


class GridcorePlugin(AirflowPlugin):
    name = "gridcore"
    fastapi_apps = [{"app": center_app(), "url_prefix": URL_PREFIX, "name": "gridcore VJ center"}]
    external_views = [
        {
            "name": "Grid",
            "href": f"{URL_PREFIX}/grid/",
            "url_route": GRID_ROUTE,
            "destination": "nav",
            "category": "browse",
        },
        {
            "name": "Grid decision",
            "href": f"{URL_PREFIX}/grid/ti/{{DAG_ID}}/{{RUN_ID}}/{{TASK_ID}}/{{MAP_INDEX}}",
            "url_route": TASK_ROUTE,
            "destination": "task_instance",
        },
    ]
