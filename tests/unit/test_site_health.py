"""One health table, one threshold, one way back: errors of every kind count on one
counter; an unusable site returns by a completed probe (run by every refresh, so an
ensemble-only user's site comes back too) or by an explicit command. Every test ends
with the capacity invariant (a probe is a holder)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import update

from gridcore import cli
from gridcore.config import default_grid
from gridcore.engine import health
from gridcore.engine.coallocation import CoAllocationEngine
from gridcore.engine.runtime import GridRuntime
from gridcore.errors import NoUsableSite
from gridcore.model import JobRequest, JobState, JobSubmission
from gridcore.policies.claiming import CoAllocationParams
from gridcore.state import capacity
from gridcore.state.capacity import HolderKind
from gridcore.state.schema import sites
from gridcore.state.store import open_store
from tests.barrier_checks import running_center


def runtime(tmp_path: Path) -> GridRuntime:
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    return GridRuntime(default_grid(tmp_path), store)


def set_aside(rt: GridRuntime, site: str) -> None:
    with rt.store.begin() as conn:
        for _ in range(health.UNUSABLE_AFTER_ERRORS):
            health.record_failure(conn, site, "component failed")


def state(rt: GridRuntime, site: str) -> health.HealthRecord:
    with rt.store.begin() as conn:
        return health.read_health(conn)[site]


def assert_sound(rt: GridRuntime) -> None:
    with rt.store.begin() as conn:
        assert capacity.check_invariant(conn) == []


def probe_until(rt: GridRuntime, site: str, usable: bool, command: str = "true") -> list[str]:
    reasons: list[str] = []
    deadline = time.time() + 20
    while time.time() < deadline:
        reasons += rt.probe_unusable_sites(time.time(), retry_after_s=3600, command=command)
        now = state(rt, site)
        if now.usable == usable and now.probe_job_id is None:
            return reasons
        time.sleep(0.1)
    raise AssertionError(f"{site} not usable={usable}: {reasons}")


def test_the_threshold_counts_contacts_and_failed_jobs_alike_and_a_report_does_not_reset(
    tmp_path: Path,
) -> None:
    rt = runtime(tmp_path)
    with rt.store.begin() as conn:
        assert health.record_failure(conn, "local-a", "observe: refused") is False
    rt.refresh()  # a successful observation in between: the errors stay consecutive
    assert state(rt, "local-a").consecutive_errors == 1
    with rt.store.begin() as conn:
        assert health.record_failure(conn, "local-a", "component 0 failed") is False
        health.record_success(conn, "local-a")  # a completed job resets the count
        assert health.site_health(conn, "local-a").consecutive_errors == 0
        outcomes = [
            health.record_failure(conn, "local-a", f"job {i} failed")
            for i in range(health.UNUSABLE_AFTER_ERRORS)
        ]
        health.record_success(conn, "local-a")
    assert outcomes == [False] * (health.UNUSABLE_AFTER_ERRORS - 1) + [True]
    assert state(rt, "local-a").usable is False, "a completed job does not restore a site"
    assert health.live_params(
        CoAllocationParams(unusable_after_errors=7)
    ).unusable_after_errors == (health.UNUSABLE_AFTER_ERRORS)


def test_failed_selection_jobs_count_and_a_completed_one_resets(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    for i in range(2):
        rec = rt.select(JobRequest(f"bad{i}", 1), site="local-b")
        rt.submit(rec.selection_id, JobSubmission(f"bad{i}", "exit 3", 1))
        _wait_finished(rt, rec.selection_id)
    assert state(rt, "local-b").consecutive_errors == 2
    rec = rt.select(JobRequest("good", 1), site="local-b")
    rt.submit(rec.selection_id, JobSubmission("good", "true", 1))
    assert _wait_finished(rt, rec.selection_id) == JobState.COMPLETED.value
    assert state(rt, "local-b").consecutive_errors == 0
    assert_sound(rt)


def _wait_finished(rt: GridRuntime, selection_id: int) -> str:
    deadline = time.time() + 20
    while time.time() < deadline:
        record = rt.poll(selection_id)
        if record.finished:
            return record.state
        time.sleep(0.05)
    raise AssertionError(f"selection {selection_id} did not finish")


def test_a_completed_probe_restores_the_site_and_its_hold_is_released(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    set_aside(rt, "local-b")
    assert {r.name: r.usable for r in rt.site_rows()}["local-b"] is False
    first = rt.probe_unusable_sites(time.time(), retry_after_s=3600)
    assert any("probe job" in r and "submitted" in r for r in first)
    with rt.store.begin() as conn:
        probes = capacity.live_holds(conn, HolderKind.PROBE)
        assert capacity.check_invariant(conn) == []
    assert [(h.site, h.processors, h.site_job_id) for h in probes] == [
        ("local-b", 1, state(rt, "local-b").probe_job_id)
    ]
    reasons = probe_until(rt, "local-b", usable=True)
    assert reasons[-1].endswith("completed, usable again")
    assert state(rt, "local-b").consecutive_errors == 0
    with rt.store.begin() as conn:
        assert capacity.live_holds(conn, HolderKind.PROBE) == []
    assert_sound(rt)


def test_a_failed_probe_keeps_the_site_unusable_and_is_not_repeated_at_once(
    tmp_path: Path,
) -> None:
    rt = runtime(tmp_path)
    set_aside(rt, "local-c")
    first = probe_until(rt, "local-c", usable=False, command="exit 1")
    assert any("failed, still unusable" in r for r in first)
    # Within retry_after_s no new probe is sent.
    assert rt.probe_unusable_sites(time.time(), retry_after_s=3600) == []
    assert state(rt, "local-c").usable is False
    with rt.store.begin() as conn:
        assert capacity.live_holds(conn, HolderKind.PROBE) == []
    assert_sound(rt)


def test_refresh_probes_so_an_ensemble_only_user_gets_the_site_back(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    set_aside(rt, "local-a")
    deadline = time.time() + 20
    while state(rt, "local-a").usable is False and time.time() < deadline:
        rt.refresh()
        time.sleep(0.1)
    assert state(rt, "local-a").usable is True
    assert_sound(rt)


def test_the_engine_probes_during_its_scans(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    with running_center(rt.store) as center:
        koala = CoAllocationEngine(
            rt, params=CoAllocationParams(scan_interval_s=1.0), center_url=center
        )
        set_aside(rt, "local-a")
        deadline = time.time() + 20
        while state(rt, "local-a").usable is False and time.time() < deadline:
            koala.scan()
            time.sleep(0.1)
    assert state(rt, "local-a").usable is True
    assert_sound(rt)


def test_explicit_restore_from_the_command_line(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    set_aside(rt, "local-b")
    env = {"GRIDCORE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    db = f"sqlite:///{tmp_path}/state.db"
    base = [sys.executable, "-m", "gridcore.cli", "sites", "--db", db, "--no-refresh"]
    shown = subprocess.run([*base], capture_output=True, text=True, env=env, check=True)
    assert f"set aside after {health.UNUSABLE_AFTER_ERRORS} consecutive errors" in shown.stdout
    out = subprocess.run(
        [*base, "--json", "--restore", "local-b"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    rows = {s["name"]: s for s in json.loads(out.stdout)["sites"]}
    assert rows["local-b"]["usable"] is True and rows["local-b"]["consecutive_errors"] == 0
    bad = subprocess.run([*base, "--restore", "nowhere"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "unknown site 'nowhere'" in bad.stderr
    assert_sound(rt)


def test_sites_shows_claimed_processors_and_bytes_by_kind_of_holder(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    rt.select(JobRequest("member", 2), site="local-a")
    with rt.store.begin() as conn:
        capacity.claim(conn, HolderKind.VOLUME, "in.dat@local-a", "local-a", 0, 5 * 10**6)
    env = {"GRIDCORE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    db = f"sqlite:///{tmp_path}/state.db"
    base = [sys.executable, "-m", "gridcore.cli", "sites", "--db", db, "--no-refresh"]
    out = subprocess.run([*base, "--json"], capture_output=True, text=True, env=env, check=True)
    row = {s["name"]: s for s in json.loads(out.stdout)["sites"]}["local-a"]
    assert row["holds"] == {
        "selection": {"holds": 1, "processors": 2, "bytes": 0},
        "volume": {"holds": 1, "processors": 0, "bytes": 5 * 10**6},
    }
    assert (row["claimed"], row["storage_claimed"], row["storage_total"]) == (2, 5 * 10**6, None)
    text = subprocess.run(base, capture_output=True, text=True, env=env, check=True).stdout
    assert "held by 1 selection(s): 2 processors, 0 B" in text
    assert "held by 1 volume(s): 0 processors, 5.0 MB" in text
    assert "5.0 MB/unlimited" in text
    assert_sound(rt)


def test_gridcore_sites_only_looks_an_unreachable_site_keeps_its_health(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gridcore sites`` looks read-only, so it is: run more often than the threshold
    against a site nobody answers for, it shows why the site was not observed and counts
    nothing (the running DAGs' site stays usable); an engine's refresh still counts."""
    monkeypatch.setenv("REMOTE_TOKEN", "t")
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'version = 1\n[sites.local-a]\nkind = "local"\nprocessors = 2\n'
        '[sites.remote]\nkind = "slurm"\nprocessors = 16\nurl = "http://127.0.0.1:9"\n'
        'token = { env = "REMOTE_TOKEN" }\ntimeout_s = 2\n'
    )
    db = f"sqlite:///{tmp_path}/state.db"
    base = ["sites", "--grid", str(grid), "--db", db]
    for _ in range(health.UNUSABLE_AFTER_ERRORS + 1):
        assert cli.main([*base, "--json"]) == 0
        row = {s["name"]: s for s in json.loads(capsys.readouterr().out)["sites"]}["remote"]
        assert row["refresh_error"] and "127.0.0.1:9" in row["refresh_error"]
        assert (row["consecutive_errors"], row["usable"], row["last_error"]) == (0, True, None)
    assert cli.main(base) == 0
    text = capsys.readouterr().out
    assert "not observed now (not counted as its error): " in text
    assert "consecutive errors" not in text

    rt = GridRuntime.open(str(grid), db)
    try:
        assert rt.refresh()["remote"] is not None
        assert state(rt, "remote").consecutive_errors == 1  # an engine's look counts
    finally:
        rt.store.dispose()


def test_a_decision_that_cannot_use_a_set_aside_site_says_why_it_is_set_aside(
    tmp_path: Path,
) -> None:
    """Not "site local-a: marked unusable" alone: its errors, the last one and when."""
    rt = runtime(tmp_path)
    at = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
    with rt.store.begin() as conn:
        for n in range(health.UNUSABLE_AFTER_ERRORS):
            health.record_failure(conn, "local-a", f"connection refused ({n})", now=at + n)
        # no probe for now: one completing in between would make the site usable again
        conn.execute(update(sites).where(sites.c.name == "local-a").values(probe_started_at=1e18))
    with pytest.raises(NoUsableSite) as refused:
        rt.select(JobRequest("big", 8))  # only local-a has 8 processors
    assert (
        "site local-a: marked unusable after 3 consecutive errors, the last at"
        " 2023-11-14 22:13:22 UTC: connection refused (2)"
    ) in str(refused.value)
    with rt.store.begin() as conn:  # a failed probe since: the count says so too
        health.record_failure(conn, "local-a", "probe job 7 failed", now=at + 60)
    with pytest.raises(NoUsableSite, match=r"after 3 consecutive errors \(4 so far\), the last"):
        rt.select(JobRequest("big", 8))
    site = next(r for r in rt.site_rows() if r.name == "local-a")
    assert site.last_error_at == at + 60
