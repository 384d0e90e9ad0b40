"""The Grid page inside Airflow's real api-server app (``airflow.api_fastapi.app.create_app``
with the gridcore plugin found by its entry point, a migrated metadata DB and the simple
auth manager): no credentials -> 401 for the page, its script and its JSON; a token from
``POST /auth/token`` (as a bearer or as the login's ``_token`` cookie) -> 200 and the
JSON equal to the state database's snapshot; the plugin's views as Airflow lists them;
a task instance's records found through Airflow's task state store."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from starlette.routing import Mount

from gridcore.api import dashboard
from gridcore.config import default_grid
from gridcore.engine.runtime import GridRuntime
from gridcore.model import JobRequest
from gridcore.state.store import Store, open_store

pytestmark = pytest.mark.airflow

PASSWORD = "grid-page-test-password"
RUN_ID = "manual__2026-01-01T00:00:00+00:00"
PAGES = (
    "/gridcore/grid/",
    "/gridcore/grid/ti/ensemble/manual__2026-01-01T00%3A00%3A00%2B00%3A00/member/%7BMAP_INDEX%7D",
    "/gridcore/grid/static/grid.js",
    "/gridcore/api/v1/grid",
    f"/gridcore/api/v1/grid/task?dag_id=ensemble&run_id={quote(RUN_ID)}&task_id=member&map_index=0",
)


def migrate_metadata_db() -> None:
    """``airflow db migrate`` as an operator runs it: the auth dependency reads the
    ``revoked_token`` table."""
    airflow = str(Path(sys.executable).with_name("airflow"))
    done = subprocess.run(
        [airflow, "db", "migrate"], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]


@dataclasses.dataclass(frozen=True)
class Api:
    client: TestClient
    store: Store
    token: str

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.client.get(path, headers={"Authorization": f"Bearer {self.token}"}, **kwargs)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    home = Path(os.environ["AIRFLOW_HOME"])
    passwords = home / "simple_auth_manager_passwords.json.generated"
    passwords.write_text(json.dumps({"admin": PASSWORD}))
    base = tmp_path_factory.mktemp("grid-page")
    store = open_store(f"sqlite:///{base}/state.db", upgrade=True)
    runtime = GridRuntime(default_grid(base), store)
    for index, processors in enumerate((2, 3)):
        name = dashboard.task_job_name("ensemble", "member", index)
        runtime.select(JobRequest(name, processors, 5.0), stream="ensemble", site="local-a")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", secrets.token_hex(32))
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin")
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
        migrate_metadata_db()
        from airflow.api_fastapi.app import create_app

        app = create_app()
        [mount] = [r for r in app.routes if isinstance(r, Mount) and r.path == "/gridcore"]
        # the plugin opened $GRIDCORE_DB_URL when Airflow imported it: point it at ours
        center = mount.app.app.state.center  # type: ignore[attr-defined]
        mount.app.app.state.center = dataclasses.replace(center, store=store)  # type: ignore[attr-defined]
        with TestClient(app) as client:
            login = client.post("/auth/token", json={"username": "admin", "password": PASSWORD})
            assert login.status_code == 201, login.text
            yield Api(client, store, login.json()["access_token"])
    store.dispose()


@pytest.mark.parametrize("path", PAGES)
def test_without_an_airflow_login_the_page_and_its_json_are_401(api: Api, path: str) -> None:
    answer = api.client.get(path)
    assert answer.status_code == 401, answer.text
    assert answer.json() == {"detail": "Not authenticated"}
    # a token Airflow did not sign is refused too (Airflow answers 403 for it)
    forged = api.client.get(path, headers={"Authorization": "Bearer forged"})
    assert forged.status_code in (401, 403)


@pytest.mark.parametrize("path", PAGES)
def test_a_logged_in_user_gets_the_page_and_its_json(api: Api, path: str) -> None:
    assert api.get(path).status_code == 200
    # as the browser sends it: the cookie the login sets, no header
    cookie = TestClient(api.client.app, cookies={"_token": api.token})
    assert cookie.get(path).status_code == 200


def test_the_json_is_the_state_databases_snapshot(api: Api) -> None:
    grid = api.get("/gridcore/api/v1/grid").json()
    expected = dashboard.read_grid(api.store, grid["taken_at"])
    assert grid == json.loads(json.dumps(expected))
    claimed = {s["name"]: s["claimed_by_kind"] for s in grid["sites"]}
    assert claimed["local-a"] == {"selection": 5}


def test_the_pages_fetch_their_json_under_the_plugins_prefix(api: Api) -> None:
    page = api.get("/gridcore/grid/").text
    assert 'data-api="/gridcore/api/v1"' in page
    assert 'src="/gridcore/grid/static/grid.js"' in page
    ti = api.get(PAGES[1]).text
    assert f'data-run-id="{RUN_ID}"' in ti and 'data-map-index="-1"' in ti


def test_airflow_lists_the_nav_page_and_the_task_instance_tab(api: Api) -> None:
    plugins = api.get("/api/v2/plugins").json()["plugins"]
    [ours] = [p for p in plugins if p["name"] == "gridcore"]
    views = {v["url_route"]: v for v in ours["external_views"]}
    assert views["grid"]["destination"] == "nav" and views["grid"]["category"] == "browse"
    assert views["grid"]["href"] == "/gridcore/grid/"
    assert views["grid-ti"]["destination"] == "task_instance"
    assert views["grid-ti"]["href"] == ("/gridcore/grid/ti/{DAG_ID}/{RUN_ID}/{TASK_ID}/{MAP_INDEX}")


def test_the_pilot_routes_keep_their_own_tokens(api: Api) -> None:
    assert api.client.post("/gridcore/api/v1/pilots/1/heartbeat").status_code == 401


def test_a_task_instance_is_found_by_what_its_operator_put_in_the_task_state_store(
    api: Api,
) -> None:
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session
    from sqlalchemy import text

    from gridcore_airflow.operators.site_job import SELECTION_KEY

    first = dashboard.read_task(
        api.store, dashboard.TaskRef("ensemble", None, "member", 0), dashboard.TaskIds(), 0.0
    )["selections"][0]["selection_id"]
    # the reader, not the scheduler, is under test: a row without its dag run
    with create_session() as session:
        session.execute(text("PRAGMA foreign_keys=OFF"))
        session.add(
            TaskStateStoreModel(
                dag_run_id=987654,
                dag_id="ensemble",
                run_id=RUN_ID,
                task_id="member",
                map_index=1,  # member 1's task state names member 0's selection
                key=SELECTION_KEY,
                value=json.dumps(first),
            )
        )
    with create_session() as session:  # the pooled connection checks its keys again
        session.execute(text("PRAGMA foreign_keys=ON"))
    query = f"dag_id=ensemble&run_id={quote(RUN_ID)}&task_id=member&map_index="
    found = api.get(f"/gridcore/api/v1/grid/task?{query}1").json()
    assert found["matched_by"] == "task state store" and found["task_ids_error"] is None
    assert [s["selection_id"] for s in found["selections"]] == [first]
    by_name = api.get(f"/gridcore/api/v1/grid/task?{query}0").json()
    assert by_name["matched_by"] == "name"
    assert [s["name"] for s in by_name["selections"]] == ["ensemble.member.0"]


@pytest.mark.parametrize(
    ("dag_id", "task_id", "map_index"),
    [("ensemble", "member", -1), ("my dag", "t/1", 7), ("d" * 150, "t" * 100, 12)],
)
def test_the_dashboard_names_a_task_as_the_operators_do(
    dag_id: str, task_id: str, map_index: int
) -> None:
    from gridcore_airflow.operators.base import job_name

    assert dashboard.task_job_name(dag_id, task_id, map_index) == job_name(
        dag_id, task_id, map_index
    )
