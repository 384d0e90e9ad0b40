"""Sites set unusable come back: by a completed probe job, or by an explicit command."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from gridcore.config import default_grid
from gridcore.engine.health import koala_health, probe_unusable_sites
from gridcore.engine.koala import KoalaEngine, _store_health
from gridcore.engine.runtime import GridRuntime
from gridcore.policies.claiming import KoalaParams, SiteHealth
from gridcore.state.store import open_store


def runtime(tmp_path: Path) -> GridRuntime:
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    return GridRuntime(default_grid(tmp_path), store)


def set_aside(rt: GridRuntime, site: str) -> None:
    with rt.store.begin() as conn:
        _store_health(conn, SiteHealth(site, 3, False))


def probe_until(rt: GridRuntime, site: str, usable: bool, command: str = "true") -> list[str]:
    reasons: list[str] = []
    deadline = time.time() + 20
    while time.time() < deadline:
        reasons += probe_unusable_sites(rt, time.time(), retry_after_s=3600, command=command)
        health = koala_health(rt.store)[site]
        if health.usable == usable and health.probe_job_id is None:
            return reasons
        time.sleep(0.1)
    raise AssertionError(f"{site} not usable={usable}: {reasons}")


def test_a_completed_probe_restores_the_site(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    set_aside(rt, "local-b")
    assert {r.name: r.koala_usable for r in rt.site_rows()}["local-b"] is False
    reasons = probe_until(rt, "local-b", usable=True)
    assert any("probe job" in r and "submitted" in r for r in reasons)
    assert reasons[-1].endswith("completed, usable again")
    assert koala_health(rt.store)["local-b"].consecutive_errors == 0


def test_a_failed_probe_keeps_the_site_unusable_and_is_not_repeated_at_once(
    tmp_path: Path,
) -> None:
    rt = runtime(tmp_path)
    set_aside(rt, "local-c")
    first = probe_until(rt, "local-c", usable=False, command="exit 1")
    assert any("failed, still unusable" in r for r in first)
    # Within retry_after_s no new probe is sent.
    assert probe_unusable_sites(rt, time.time(), retry_after_s=3600, command="true") == []
    assert koala_health(rt.store)["local-c"].usable is False


def test_the_engine_probes_during_its_scans(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    koala = KoalaEngine(rt, params=KoalaParams(scan_interval_s=1.0))
    set_aside(rt, "local-a")
    deadline = time.time() + 20
    while koala_health(rt.store)["local-a"].usable is False and time.time() < deadline:
        koala.scan()
        time.sleep(0.1)
    assert koala_health(rt.store)["local-a"].usable is True


def test_explicit_restore_from_the_command_line(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    set_aside(rt, "local-b")
    env = {"GRIDCORE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    db = f"sqlite:///{tmp_path}/state.db"
    base = [sys.executable, "-m", "gridcore.cli", "sites", "--db", db, "--no-refresh"]
    shown = subprocess.run([*base], capture_output=True, text=True, env=env, check=True)
    assert "set aside by KOALA after 3 consecutive component errors" in shown.stdout
    out = subprocess.run(
        [*base, "--json", "--restore", "local-b"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    rows = {s["name"]: s for s in json.loads(out.stdout)["sites"]}
    assert rows["local-b"]["koala_usable"] is True and rows["local-b"]["usable"] is True
    bad = subprocess.run([*base, "--restore", "nowhere"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "unknown site 'nowhere'" in bad.stderr
