"""The Grid page and the task page as their script renders them, compared with the state
database: the served HTML (its elements parsed here), the page's own ``grid.js`` run
under Node.js with a minimal DOM (``grid_page_dom.js``; fetch answers with the app's
JSON), and every shown value checked against the rows the real engine wrote. (The
browser tier runs the same page in headless Chromium.)"""

from __future__ import annotations

import json
import re
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
from sqlalchemy import func, select, update

from gridcore.api.app import create_app
from gridcore.api.dashboard import PAGE_REFRESH_S, dataplan_stream, task_job_name
from gridcore.api.grid_routes import operator_token
from gridcore.config import default_grid, load_grid
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
from gridcore.state.schema import coalloc_jobs, holds, pilots, reservations, selections, sites
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
    # named as CoReservationOperator names an unmapped task's job: its tab finds it by name
    reserved = vjm.submit(
        CoReservationRequest(
            task_job_name("vjm", "reserve", -1), "true", 2, vj_size=1, max_clusters=2
        )
    )
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


def test_the_task_page_shows_a_reservations_pilots_with_readable_durations(
    grid: tuple[GridRuntime, TestClient, int], tmp_path: Path
) -> None:
    rt, client, reserved = grid
    shown = render(
        client,
        "/grid/ti/vjm/manual__1/reserve/-1",
        "/api/v1/grid/task?dag_id=vjm&run_id=manual__1&task_id=reserve&map_index=-1",
        tmp_path,
    )
    assert shown["task-job-name"]["text"] == "vjm.reserve"  # no ".-1" for an unmapped task
    with rt.store.begin() as conn:
        owned = conn.execute(select(pilots).where(pilots.c.job_id == reserved)).mappings().all()
    assert owned
    for p in owned:
        cell = shown[f"task-reservation-{reserved}-pilot-{p['id']}"]["cells"]["t-avail-s"]
        # the figure, as stored (as a number: the page's JavaScript writes 0.0 as "0", and
        # a wait model's T_avail on an idle cluster is 0)
        assert json.loads(cell["value"]) == p["t_avail"]
        assert cell["text"] == duration_text(p["t_avail"]), cell  # shown readably
        assert re.fullmatch(r"\d+ ms|\d+\.\d s|\d+ (s|min|h|d)( \d+ (s|min|h))?", cell["text"])


def duration_text(seconds: float) -> str:
    """What the page's duration() shows, for the figures of these tests."""
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    for unit, size, nxt, nxt_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60)):
        if whole >= size:
            rest = whole % size // nxt_size
            return f"{whole // size} {unit}" + (f" {rest} {nxt}" if rest else "")
    if whole >= 60:
        return f"{whole // 60} min" + (f" {whole % 60} s" if whole % 60 else "")
    return f"{whole} s"


@pytest.fixture
def reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[GridRuntime, TestClient]]:
    """A grid whose Slurm site nobody answers for (never observed), a local site
    observed now and one whose last report is two minutes old."""
    monkeypatch.setenv("REMOTE_TOKEN", "t")
    path = tmp_path / "grid.toml"
    path.write_text(
        'version = 1\n[sites.local-a]\nkind = "local"\nprocessors = 8\n'
        '[sites.local-b]\nkind = "local"\nprocessors = 8\n'
        '[sites.remote]\nkind = "slurm"\nprocessors = 16\nurl = "http://127.0.0.1:9"\n'
        'token = { env = "REMOTE_TOKEN" }\ntimeout_s = 2\n'
    )
    rt = GridRuntime(load_grid(path), open_store(f"sqlite:///{tmp_path}/s.db", upgrade=True))
    errors = rt.refresh()
    assert errors["remote"] is not None and errors["local-a"] is None
    with rt.store.begin() as conn:
        conn.execute(
            update(sites).where(sites.c.name == "local-b").values(observed_at=time.time() - 125)
        )
    try:
        with TestClient(create_app(rt.store, dashboard=operator_token(TOKEN))) as client:
            yield rt, client
    finally:
        rt.store.dispose()


def test_a_site_never_observed_or_observed_long_ago_is_not_shown_as_now(
    reports: tuple[GridRuntime, TestClient], tmp_path: Path
) -> None:
    _rt, client = reports
    for page in ("/grid/", "/grid/ti/d/r/t/-1"):  # stale is counted in these refreshes
        served = client.get(page, headers=HEADERS).text
        assert f'data-refresh-s="{PAGE_REFRESH_S:g}"' in served
    shown = render(client, "/grid/", "/api/v1/grid", tmp_path)
    remote = shown["site-remote"]
    assert remote["attrs"]["data-report"] == "never"
    assert remote["cells"]["observed-at"]["text"] == "never observed"  # not 1970-01-01
    assert (remote["cells"]["idle"]["text"], remote["cells"]["free"]["text"]) == (
        "unknown",
        "unknown",
    )
    assert "127.0.0.1:9" in remote["cells"]["health"]["text"]

    stale = shown["site-local-b"]
    assert stale["attrs"]["data-report"] == "stale"
    assert stale["cells"]["observed-at"]["text"] == "2 min ago (stale)"
    assert stale["cells"]["idle"]["text"] == "8"  # the figure, greyed with its age
    assert shown["site-local-b-observed-at"]["attrs"]["title"].endswith(" UTC")

    now = shown["site-local-a"]
    assert now["attrs"]["data-report"] == "current"
    assert re.fullmatch(r"just now|\d+ s ago", now["cells"]["observed-at"]["text"])
    source = str((tmp_path / "grid.toml").resolve())
    for name in ("local-a", "local-b", "remote"):
        [(attrs, text)] = shown[f"site-{name}"]["cells"]["definitions"]["items"]
        assert attrs["data-source"] == source and text.startswith(source), text
        assert shown[f"site-{name}"]["attrs"]["data-retired"] == "false"


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def test_the_task_tabs_reasons_keep_a_reading_width_in_a_real_browser(
    grid: tuple[GridRuntime, TestClient, int],
) -> None:
    """Layout needs a browser: headless Chromium lays the task page out at the width of
    Airflow's tab, every request answered by the app itself (no server, no network).
    The reasons column shrank to its longest word (78 px, a word or two a line)."""
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (make test installs Debian's chromium)")
    from playwright.sync_api import Route, sync_playwright

    _rt, client, _reserved = grid
    origin = "http://gridcore.test"

    def answer(route: Route) -> None:
        got = client.get(route.request.url.removeprefix(origin), headers=HEADERS)
        kind = got.headers["content-type"]
        route.fulfill(status=got.status_code, headers={"content-type": kind}, body=got.content)

    with sync_playwright() as driver:
        browser = driver.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_context(viewport={"width": 900, "height": 800}).new_page()
            page.route(f"{origin}/**", answer)
            page.goto(f"{origin}/grid/ti/ensemble/manual__1/member/0")
            page.locator('#grid-status[data-state="ok"]').wait_for()
            reasons = page.locator('#task-selections td[data-field="reasons"] li')
            assert reasons.count() >= 2
            widths = [reasons.nth(i).bounding_box()["width"] for i in range(reasons.count())]
        finally:
            browser.close()
    font_px = 14  # grid.css: body font
    assert min(widths) >= 22 * font_px, widths
