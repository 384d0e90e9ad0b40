"""The Grid page and its JSON on ``gridcore serve``'s app: the operator's token or 401,
the JSON equal to the snapshot of the state database, the pages' placeholders filled in
and escaped, and the pilot routes' own tokens untouched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from gridcore.api import dashboard
from gridcore.api.app import create_app
from gridcore.api.grid_routes import (
    COOKIE,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    operator_token,
    operator_token_from_env,
)
from gridcore.api.sessions import SESSION_S
from gridcore.config import default_grid
from gridcore.engine.pilot_pool import token_hash
from gridcore.engine.runtime import GridRuntime
from gridcore.errors import ConfigError
from gridcore.model import JobRequest
from gridcore.state import schema
from gridcore.state.store import Store, open_store

TOKEN = "operator-token-0123456789"
NOW = 1_900_000_000.0
PROTECTED = (
    "/api/v1/grid",
    "/api/v1/grid/task?dag_id=ensemble&task_id=member&run_id=r1&map_index=0",
    "/grid/",
    "/grid",
    "/grid/ti/ensemble/r1/member/0",
    "/grid/static/grid.js",
    "/grid/static/grid.css",
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/s.db", upgrade=True)
    rt = GridRuntime(default_grid(tmp_path), s)
    rt.select(JobRequest("ensemble.member.0", 2, 5.0), stream="ensemble", site="local-a")
    rt.select(JobRequest("ensemble.member.1", 1, 5.0), stream="ensemble", site="local-b")
    yield s
    s.dispose()


@pytest.fixture
def client(store: Store) -> Iterator[TestClient]:
    app = create_app(store, clock=lambda: NOW, dashboard=operator_token(TOKEN))
    with TestClient(app) as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("path", PROTECTED)
def test_without_the_operators_token_every_dashboard_route_is_401(
    client: TestClient, path: str
) -> None:
    for headers in ({}, bearer("not-the-token-at-all"), {"Authorization": TOKEN}):
        answer = client.get(path, headers=headers)
        assert answer.status_code == 401, (path, headers, answer.text)
        assert answer.headers["www-authenticate"] == "Bearer"
    assert client.get(path, headers=bearer(TOKEN)).status_code == 200


def test_the_json_is_the_snapshot_of_the_state_database(client: TestClient, store: Store) -> None:
    answer = client.get("/api/v1/grid", headers=bearer(TOKEN))
    assert answer.status_code == 200
    expected = json.loads(json.dumps(dashboard.read_grid(store, NOW)))
    assert answer.json() == expected
    assert [s["name"] for s in expected["sites"]] == ["local-a", "local-b", "local-c"]
    assert [s["claimed"] for s in expected["sites"]] == [2, 1, 0]
    assert answer.json()["taken_at"] == NOW

    small = client.get("/api/v1/grid?recent=1&window_s=60", headers=bearer(TOKEN)).json()
    assert small == json.loads(json.dumps(dashboard.read_grid(store, NOW, recent=1, window_s=60)))
    assert len(small["decisions"]) == 1
    assert client.get("/api/v1/grid?recent=0", headers=bearer(TOKEN)).status_code == 422


def test_the_task_json_is_the_task_instances_records(client: TestClient, store: Store) -> None:
    query = "dag_id=ensemble&task_id=member&run_id=manual__1&map_index=1"
    answer = client.get(f"/api/v1/grid/task?{query}", headers=bearer(TOKEN)).json()
    ref = dashboard.TaskRef("ensemble", "manual__1", "member", 1)
    expected = dashboard.read_task(store, ref, dashboard.TaskIds(), NOW)
    assert answer == json.loads(json.dumps(expected)) | {"task_ids_error": None}
    assert [s["name"] for s in answer["selections"]] == ["ensemble.member.1"]
    # Airflow's placeholders on an unmapped task / a task view: map index -1, no run
    unmapped = client.get(
        "/api/v1/grid/task?dag_id=ensemble&task_id=member&run_id={RUN_ID}&map_index={MAP_INDEX}",
        headers=bearer(TOKEN),
    ).json()
    assert unmapped["task"]["map_index"] == -1 and unmapped["task"]["run_id"] is None
    bad = "/api/v1/grid/task?dag_id=e&task_id=t&map_index=-2"
    assert client.get(bad, headers=bearer(TOKEN)).status_code == 422
    assert client.get("/api/v1/grid/task?dag_id=e", headers=bearer(TOKEN)).status_code == 422


def test_the_pages_point_at_their_json_and_escape_what_the_path_says(client: TestClient) -> None:
    page = client.get("/grid/", headers=bearer(TOKEN))
    assert page.headers["content-type"].startswith("text/html")
    assert 'data-api="/api/v1"' in page.text and 'src="/grid/static/grid.js"' in page.text
    assert "{{" not in page.text
    for element in ('id="sites"', 'id="koala-claiming"', 'id="utilization"', 'id="decisions"'):
        assert element in page.text
    # a run id with "/" and ":" (sent as %2F, %3A), an unmapped task's literal {MAP_INDEX}
    run = "scheduled__2026-01-01T00:00:00+00:00/x"
    ti = client.get(
        "/grid/ti/ens%3Cb%3E/scheduled__2026-01-01T00%3A00%3A00%2B00%3A00%2Fx/member/%7BMAP_INDEX%7D",
        headers=bearer(TOKEN),
    )
    assert ti.status_code == 200, ti.text
    assert f'data-run-id="{run}"' in ti.text
    assert 'data-dag-id="ens&lt;b&gt;"' in ti.text and "<b>" not in ti.text
    assert 'data-task-id="member"' in ti.text and 'data-map-index="-1"' in ti.text
    assert client.get("/grid/ti/ens/r/t/x1", headers=bearer(TOKEN)).status_code == 422
    assert client.get("/grid/static/app.py", headers=bearer(TOKEN)).status_code == 404
    script = client.get("/grid/static/grid.js", headers=bearer(TOKEN))
    assert script.headers["content-type"].startswith("text/javascript")
    # nothing from elsewhere: the SVG namespace is a name, not a fetch
    outside = script.text.replace("http://www.w3.org/2000/svg", "")
    assert "http://" not in outside and "https://" not in outside and "//cdn" not in outside


def test_the_token_form_sets_a_cookie_that_opens_the_page(client: TestClient) -> None:
    refused = client.get("/grid/")
    assert refused.status_code == 401 and 'id="login-form"' in refused.text
    wrong = client.post("/grid/login", data={"token": "x" * 30}, follow_redirects=False)
    assert wrong.status_code == 401 and COOKIE not in wrong.cookies
    signed = client.post("/grid/login", data={"token": TOKEN}, follow_redirects=False)
    assert signed.status_code == 303 and signed.headers["location"] == "/grid/"
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert f"Max-Age={int(SESSION_S)}" in cookie
    assert "Secure" not in cookie  # plain http: a Secure cookie would never come back
    assert client.get("/grid/").status_code == 200  # the client sends the cookie now
    assert client.get("/api/v1/grid").status_code == 200


def _session_of(answer: Any) -> str:
    return str(answer.cookies[COOKIE])


def _cookie(value: str) -> dict[str, str]:
    """The session cookie sent as a browser would, past the client's own jar."""
    return {"Cookie": f"{COOKIE}={value}"}


def test_the_cookie_holds_a_session_id_not_the_token(client: TestClient, store: Store) -> None:
    # issue 21 item 11: the cookie held the operator's token itself
    signed = client.post("/grid/login", data={"token": TOKEN}, follow_redirects=False)
    session = _session_of(signed)
    assert TOKEN not in signed.headers["set-cookie"] and TOKEN not in session
    assert token_hash(TOKEN) not in session
    with store.begin() as conn:  # the database keeps its hash only
        rows = conn.execute(select(schema.dashboard_sessions)).all()
    assert [r.id_hash for r in rows] == [token_hash(session)]
    assert session not in repr(rows) and TOKEN not in repr(rows)
    client.cookies.clear()
    # the token itself as the cookie opens nothing any more
    assert client.get("/api/v1/grid", headers=_cookie(TOKEN)).status_code == 401
    assert client.get("/api/v1/grid", headers=_cookie(session)).status_code == 200


def test_a_tampered_or_unknown_cookie_is_refused(client: TestClient) -> None:
    session = _session_of(client.post("/grid/login", data={"token": TOKEN}, follow_redirects=False))
    client.cookies.clear()
    flipped = ("A" if session[0] != "A" else "B") + session[1:]
    for value in (flipped, session[:-1], session + "x", "", "x" * 43, token_hash(session)):
        answer = client.get("/api/v1/grid", headers=_cookie(value))
        assert answer.status_code == 401, value
    assert client.get("/api/v1/grid", headers=_cookie(session)).status_code == 200


def test_a_session_expires_and_ends_with_a_new_operator_token(store: Store) -> None:
    now = [NOW]
    app = create_app(store, clock=lambda: now[0], dashboard=operator_token(TOKEN))
    with TestClient(app) as c:
        session = _session_of(c.post("/grid/login", data={"token": TOKEN}, follow_redirects=False))
        c.cookies.clear()
        now[0] = NOW + SESSION_S - 1
        assert c.get("/api/v1/grid", headers=_cookie(session)).status_code == 200
        now[0] = NOW + SESSION_S
        assert c.get("/api/v1/grid", headers=_cookie(session)).status_code == 401
        now[0] = NOW
    # the same database, the operator's token changed: the sessions it opened are over
    rotated = create_app(store, clock=lambda: NOW, dashboard=operator_token(TOKEN + "-new"))
    with TestClient(rotated) as c:
        assert c.get("/api/v1/grid", headers=_cookie(session)).status_code == 401


def test_logging_out_ends_the_session(client: TestClient, store: Store) -> None:
    session = _session_of(client.post("/grid/login", data={"token": TOKEN}, follow_redirects=False))
    out = client.post("/grid/logout", follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/grid/"
    cleared = out.headers["set-cookie"]
    assert cleared.startswith(f'{COOKIE}=""') and "Max-Age=0" in cleared and "Path=/" in cleared
    # the old value, kept by a thief, opens nothing
    client.cookies.clear()
    assert client.get("/api/v1/grid", headers=_cookie(session)).status_code == 401
    with store.begin() as conn:
        assert conn.execute(select(schema.dashboard_sessions)).all() == []
    # logging out with no session or a stale one is no error
    assert client.post("/grid/logout", follow_redirects=False).status_code == 303


def test_the_cookie_is_secure_when_the_login_came_over_https(store: Store) -> None:
    app = create_app(store, clock=lambda: NOW, dashboard=operator_token(TOKEN))
    with TestClient(app, base_url="https://testserver") as c:
        signed = c.post("/grid/login", data={"token": TOKEN}, follow_redirects=False)
        assert signed.status_code == 303 and "Secure" in signed.headers["set-cookie"]
        assert c.get("/grid/").status_code == 200  # sent back over https
        assert "Secure" in c.post("/grid/logout", follow_redirects=False).headers["set-cookie"]
    # over http the app does not take a client's X-Forwarded-Proto for https: only
    # uvicorn's proxy_headers does, for a proxy in its forwarded_allow_ips
    with TestClient(app) as c:
        forged = c.post(
            "/grid/login",
            data={"token": TOKEN},
            headers={"X-Forwarded-Proto": "https"},
            follow_redirects=False,
        )
        assert forged.status_code == 303 and "Secure" not in forged.headers["set-cookie"]


def test_with_no_token_configured_the_dashboard_is_closed(store: Store) -> None:
    app = create_app(store, dashboard=operator_token(None))
    with TestClient(app) as c:
        answer = c.get("/api/v1/grid", headers=bearer(TOKEN))
        assert answer.status_code == 401 and TOKEN_ENV in answer.json()["detail"]
        assert c.post("/grid/login", data={"token": TOKEN}).status_code == 401
        assert c.get("/api/v1/health").status_code == 200  # the rest of the center serves


def test_the_token_comes_from_the_environment_or_its_file(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    assert operator_token_from_env().token_hash is None
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv(TOKEN_FILE_ENV, str(token_file))
    with TestClient(create_app(store)) as c:  # as gridcore serve builds it
        assert c.get("/api/v1/grid", headers=bearer(TOKEN)).status_code == 200
    monkeypatch.setenv(TOKEN_ENV, "short")
    with pytest.raises(ConfigError, match=TOKEN_ENV):
        create_app(store)
    monkeypatch.delenv(TOKEN_ENV)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=TOKEN_FILE_ENV):
        operator_token_from_env()


def test_pilot_routes_keep_their_own_tokens(client: TestClient) -> None:
    # the operator's token is no pilot's: refused as an unknown token, as before
    assert client.post("/api/v1/pilots/1/heartbeat").status_code == 401
    assert client.post("/api/v1/pilots/1/heartbeat", headers=bearer(TOKEN)).status_code == 401
    assert client.get("/api/v1/health").status_code == 200
