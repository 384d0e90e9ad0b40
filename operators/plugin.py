"""The Airflow plugin: the VJ center mounted in Airflow's api-server.

Pilots and co-allocated components on a cluster talk to gridcore over HTTP with a token
scoped to themselves (``gridcore.api``). A deployment may run that API as its own
service (``gridcore serve``) or let Airflow's api-server serve it under
``/gridcore`` through this plugin (entry point ``airflow.plugins``); pilots then reach
``https://<airflow>/gridcore`` (set ``center_url`` in the ``gridcore`` connection).

These routes authenticate with the pilots' and components' own bearer tokens, not with
Airflow's login: a pilot is not an Airflow user. The state database is
``$GRIDCORE_DB_URL`` (else SQLite under ``$GRIDCORE_HOME``), opened lazily: no
connection is made until a request comes.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from gridcore.api.app import create_app
from gridcore.state.store import open_store

URL_PREFIX = "/gridcore"


def center_app() -> Any:
    return create_app(open_store())


class GridcorePlugin(AirflowPlugin):
    name = "gridcore"
    fastapi_apps = [{"app": center_app(), "url_prefix": URL_PREFIX, "name": "gridcore VJ center"}]
