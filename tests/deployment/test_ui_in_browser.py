"""Browser tier (issue 11 item 7): a real headless Chromium (Debian's, driven by
Playwright) logs in to the running deployment through Airflow's own login form, opens
Browse > Grid and a mapped ensemble member's "Grid decision" tab, checks what they show
against the state database, and saves screenshots.

Runs after ``test_deployment.py`` (files run in name order; the deployment fixture is
shared by the package), so the grid holds the runs of every example DAG and no longer
changes: the page's values are compared with one snapshot of the database taken after
the page loaded.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gridcore.api.dashboard import read_grid
from gridcore.state.schema import selections
from gridcore.state.store import open_store
from tests.deployment.deployment import ADMIN_USER, Deployment

pytestmark = [pytest.mark.deployment, pytest.mark.airflow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# What Chromium needs here: no sandbox (root in a container), and no outbound
# connections of its own (there is no network beyond loopback).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PAGE_TIMEOUT_MS = 60_000


@pytest.fixture
def browser_page(deployment: Deployment, tmp_path: Path) -> Iterator[Any]:
    if not Path(CHROMIUM).is_file():
        message = f"no Chromium at {CHROMIUM} (make test installs Debian's chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.set_default_timeout(PAGE_TIMEOUT_MS)
            yield page
        finally:
            browser.close()


def screenshot_dir(tmp_path: Path) -> Path:
    chosen = Path(os.environ.get("GRIDCORE_SCREENSHOT_DIR") or tmp_path / "screenshots")
    chosen.mkdir(parents=True, exist_ok=True)
    return chosen


def log_in(page: Any, deployment: Deployment) -> None:
    """Through Airflow's own login form (the FAB auth manager's)."""
    page.goto(f"{deployment.url}/auth/login/")
    page.fill("input[name=username]", ADMIN_USER)
    page.fill("input[name=password]", deployment.password)
    page.locator("input[type=submit], button[type=submit]").first.click()
    page.wait_for_url(lambda url: "/auth/login" not in url)
    cookies = {c["name"] for c in page.context.cookies()}
    assert "_token" in cookies, f"no session after the login: {cookies}"


def cell(frame: Any, selector: str) -> str:
    value: str = frame.locator(selector).get_attribute("data-value")
    return value


def test_the_grid_page_and_a_task_tab_show_what_the_state_db_holds(
    deployment: Deployment, browser_page: Any, tmp_path: Path
) -> None:
    page, shots = browser_page, screenshot_dir(tmp_path)
    log_in(page, deployment)

    page.goto(f"{deployment.url}/plugin/grid")
    grid = page.frame_locator("iframe")
    grid.locator('#grid-status[data-state="ok"]').wait_for()
    page.screenshot(path=str(shots / "grid-page.png"), full_page=True)

    store = open_store(deployment.gridcore_db_url)
    try:
        snapshot = read_grid(store, time.time())
        with store.begin() as conn:
            member = (
                conn.execute(
                    select(selections)
                    .where(selections.c.name == "ensemble_surge.member.0")
                    .order_by(selections.c.id.desc())
                )
                .mappings()
                .first()
            )
    finally:
        store.dispose()

    sites = snapshot["sites"]
    assert sites, "the state DB has no sites"
    assert grid.locator("table#sites tr[data-site]").count() == len(sites)
    for site in sites:
        row = f"#site-{site['name']}"
        for field in ("total", "claimed", "queued"):
            assert cell(grid, f"{row}-{field}") == str(site[field]), (site["name"], field)
    assert all(s["claimed"] == 0 for s in sites), "a finished grid holds no processors"
    plotted = grid.locator("svg#utilization-plot path[data-site]")
    assert plotted.count() == len(snapshot["utilization"]["sites"]) > 0
    decisions = grid.locator("table#decisions tr[data-decision-kind]")
    assert decisions.count() == len(snapshot["decisions"]) > 0
    first = snapshot["decisions"][0]
    assert decisions.first.get_attribute("data-decision-ref") == str(first["ref"])

    # The ensemble member's tab: its selection, as the state DB has it.
    assert member is not None, "no selection for ensemble_surge.member.0"
    runs = deployment.api("GET", "/dags/ensemble_surge/dagRuns")["dag_runs"]
    run_id = next(r["dag_run_id"] for r in runs if r["state"] == "success")
    page.goto(
        f"{deployment.url}/dags/ensemble_surge/runs/{run_id}/tasks/member/mapped/0/plugin/grid-ti"
    )
    tab = page.frame_locator("iframe")
    tab.locator('#grid-status[data-state="ok"]').wait_for()
    page.screenshot(path=str(shots / "task-tab.png"), full_page=True)
    row = f"#task-selection-{member['id']}"
    assert cell(tab, f"{row}-site") == member["site"]
    assert cell(tab, f"{row}-job-id") == str(member["job_id"])
    assert cell(tab, f"{row}-state") == member["state"]
    print(f"screenshots: {shots}")
