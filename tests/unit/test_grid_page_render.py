"""The Grid page and the task page as their script renders them, compared with the state
database: the served HTML (its elements parsed here), the page's own ``grid.js`` run
under Node.js with a minimal DOM (``grid_page_dom.js``; fetch answers with the app's
JSON), and every shown value checked against the rows the real engine wrote. (The
browser tier runs the same page in headless Chromium.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from gridcore.api.app import create_app
from gridcore.api.dashboard import dataplan_stream, task_job_name
from gridcore.api.grid_routes import operator_token
from gridcore.config import default_grid
from gridcore.engine import health
from gridcore.engine.coallocation import CoAllocationEngine
from gridcore.engine.coreservation import CoReservationEngine, CoReservationParams
from gridcore.engine.runtime import GridRuntime
from gridcore.model import (
    CoAllocationRequest,
    Component,
    CoReservationRequest,
    HolderKind,
    JobRequest,
    JobSubmission,
    RequestKind,
)
from gridcore.policies.claiming import CoAllocationParams
from gridcore.policies.placement import PlacementPolicy
from gridcore.state import capacity
from gridcore.state.schema import coalloc_jobs, holds, pilots, reservations, selections
from gridcore.state.store import open_store

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs Node.js to run the page's script")

TOKEN = "render-test-token-0123456789"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
SCRIPT = Path(__file__).resolve().parents[2] / "gridcore" / "api" / "static" / "grid.js"
DOM = Path(__file__).with_name("grid_page_dom.js")
NO_CENTER = "http://127.0.0.1:9"
RUN = "manual__2026-01-01T00:00:00+00:00"


class _Elements(HTMLParser):
    """The body's attributes and every element with an id, as served."""

    def __init__(self) -> None:
        super().__init__()
        self.body: dict[str, str] = {}
        self.elements: dict[str, dict[str, str]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.body = values
        elif "id" in values:
            self.elements[values.pop("id")] = {"tag": tag, **values}


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[tuple[GridRuntime, TestClient, int]]:
    rt = GridRuntime(default_grid(tmp_path), open_store(f"sqlite:///{tmp_path}/s.db", upgrade=True))
    done = rt.select(JobRequest(task_job_name("ensemble", "member", 0), 2, 1.0), stream="ensemble")
    rt.submit(done.selection_id, JobSubmission("m0", "true", 2))
    deadline = time.time() + 20
    while not rt.poll(done.selection_id).finished and time.time() < deadline:
        time.sleep(0.05)
    rt.select(JobRequest("blocker", 4, 60.0), stream="ensemble", site="local-b")
    # a job running at local-a, seen by an observation: its report's idle is not its total
    busy = rt.select(JobRequest("busy", 3, 60.0), stream="ensemble", site="local-a")
    rt.submit(busy.selection_id, JobSubmission("busy", "sleep 60", 3))
    while rt.poll(busy.selection_id).state != "running" and time.time() < deadline:
        time.sleep(0.05)
    rt.refresh()
    koala = CoAllocationEngine(
        rt, params=CoAllocationParams(scan_interval_s=1.0), center_url=NO_CENTER
    )
    spread = (Component(8), Component(4), Component(4))
    koala.submit(
        CoAllocationRequest("spread", RequestKind.NON_FIXED, spread), PlacementPolicy.WF, "true"
    )
    koala.scan()
    koala.release_lease()
    stream = dataplan_stream("pipeline", RUN)
    rt.select(JobRequest("p0/d0", 1, 1.0), stream=stream, site="local-c")
    with rt.store.begin() as conn:
        volume = f"dataplan/{stream.removeprefix('dataplan:')}/p0/v1"
        capacity.claim(
            conn, HolderKind.VOLUME, capacity.volume_holder(volume, "local-c"), "local-c", 0, 7777
        )
        health.record_failure(conn, "local-c", "probe: node reset")
    vjm = CoReservationEngine(rt, NO_CENTER, CoReservationParams(heartbeat_timeout_s=6.0))
    reserved = vjm.submit(CoReservationRequest("reserved", "true", 2, vj_size=1, max_clusters=2))
    try:
        with TestClient(create_app(rt.store, dashboard=operator_token(TOKEN))) as client:
            yield rt, client, reserved
    finally:
        vjm.cancel(reserved)
        rt.cancel(busy.selection_id)
        rt.store.dispose()


def render(client: TestClient, page_path: str, json_path: str, tmp_path: Path) -> dict[str, Any]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    page = client.get(page_path, headers=HEADERS)
    assert page.status_code == 200
    parsed = _Elements()
    parsed.feed(page.text)
    answer = client.get(json_path, headers=HEADERS)
    assert answer.status_code == 200
    (tmp_path / "page.json").write_text(
        json.dumps({"body": parsed.body, "elements": parsed.elements})
    )
    (tmp_path / "answer.json").write_text(answer.text)
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(DOM), str(SCRIPT), str(tmp_path / "page.json"), str(tmp_path / "answer.json")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    shown: dict[str, Any] = json.loads(done.stdout)
    assert shown["grid-status"]["attrs"]["data-state"] == "ok", shown["grid-status"]
    return shown


def test_the_grid_page_shows_what_the_state_database_says(
    grid: tuple[GridRuntime, TestClient, int], tmp_path: Path
) -> None:
    rt, client, reserved = grid
    shown = render(client, "/grid/", "/api/v1/grid", tmp_path)
    hc = holds.c
    with rt.store.begin() as conn:
        sums = conn.execute(
            select(hc.site, hc.kind, hc.ledger, func.sum(hc.processors))
            .where(hc.ledger.is_not(None))
            .group_by(hc.site, hc.kind, hc.ledger)
        ).all()
        chosen = conn.execute(select(selections)).mappings().all()
        queued = conn.execute(select(coalloc_jobs)).mappings().all()
        owned = conn.execute(select(pilots)).mappings().all()
        reservation = conn.execute(select(reservations)).mappings().one()
    for site in rt.site_rows():
        cells = shown[f"site-{site.name}"]["cells"]
        for field, value in (
            ("idle", site.idle),
            ("total", site.total),
            ("free", site.free),
            ("claimed", site.claimed),
            ("queued", site.queued),
            ("storage-used", site.storage_claimed),
            ("consecutive-errors", site.consecutive_errors),
        ):
            assert cells[field]["value"] == str(value), (site.name, field)
        assert cells["usable"]["value"] == json.dumps(site.usable)
        if site.last_error:
            assert site.last_error in cells["health"]["text"]
        for field, ledger in (("claimed-by-kind", "claimed"), ("queued-by-kind", "queued")):
            kinds = {a["data-kind"]: int(a["data-value"]) for a, _t in cells[field]["items"]}
            assert kinds == {k: n for s, k, led, n in sums if s == site.name and led == ledger}
        path = shown[f"utilization-{site.name}"]["attrs"]
        assert path["data-total"] == str(site.total)
    assert shown["site-local-c"]["cells"]["storage-used"]["value"] == "7777"
    assert shown["site-local-a"]["cells"]["idle"]["value"] == "5"  # 8 less the busy job's 3
    assert shown["site-local-c"]["cells"]["storage-used"]["text"] == "7.8 kB"

    [job] = queued
    row = shown[f"koala-job-{job['id']}"]
    assert row["attrs"]["data-state"] == job["state"] == "queued"
    assert row["cells"]["placement-tries"]["value"] == str(job["placement_tries"]) == "1"
    assert row["cells"]["wait-reason"]["text"] == job["message"]

    for s in chosen:
        decision = shown[f"decision-selection-{s['id']}"]
        assert [t for _a, t in decision["cells"]["reasons"]["items"]] == json.loads(s["reasons"])
        assert decision["cells"]["sites"]["text"] == s["site"]
    plan = shown[f"dataplan-{dataplan_stream('pipeline', RUN).removeprefix('dataplan:')}"]
    assert plan["cells"]["volume-bytes"]["value"] == "7777"
    assert plan["cells"]["sites"]["value"] == json.dumps(["local-c"])

    res = shown[f"reservation-{reserved}"]
    assert res["attrs"]["data-state"] == reservation["state"]
    assert res["cells"]["processors"]["value"] == str(reservation["processors"])
    live = [p for p in owned if p["state"] in ("submitting", "pending", "held", "dispatched")]
    assert live
    for p in live:
        assert shown[f"pilot-{p['id']}"]["cells"]["site"]["text"] == p["site"]
        assert shown[f"pilot-{p['id']}"]["cells"]["state"]["text"] == p["state"]


def test_the_task_page_shows_the_task_instances_records(
    grid: tuple[GridRuntime, TestClient, int], tmp_path: Path
) -> None:
    rt, client, _reserved = grid
    shown = render(
        client,
        "/grid/ti/ensemble/manual__1/member/0",
        "/api/v1/grid/task?dag_id=ensemble&run_id=manual__1&task_id=member&map_index=0",
        tmp_path / "member",
    )
    name = task_job_name("ensemble", "member", 0)
    with rt.store.begin() as conn:
        [s] = conn.execute(select(selections).where(selections.c.name == name)).mappings().all()
    cells = shown[f"task-selection-{s['id']}"]["cells"]
    assert cells["site"]["text"] == s["site"]
    assert cells["state"]["text"] == s["state"] == "completed"
    assert [t for _a, t in cells["reasons"]["items"]] == json.loads(s["reasons"])
    assert shown["task-matched-by"]["attrs"]["data-value"] == "name"
    assert shown["task-job-name"]["text"] == name
    assert "hidden" in shown["task-coallocations-section"]["attrs"]
    assert "hidden" in shown["task-empty"]["attrs"]

    plan = render(
        client,
        f"/grid/ti/pipeline/{RUN}/jobs_0/3",
        f"/api/v1/grid/task?dag_id=pipeline&run_id={quote(RUN)}&task_id=jobs_0&map_index=3",
        tmp_path / "plan",
    )
    run_id = dataplan_stream("pipeline", RUN).removeprefix("dataplan:")
    assert plan[f"task-dataplan-{run_id}"]["cells"]["volume-bytes"]["value"] == "7777"
    assert "hidden" not in plan["task-dataplan-section"]["attrs"]
    assert "hidden" in plan["task-selections-section"]["attrs"]
