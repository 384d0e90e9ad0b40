"""``make airflow``'s preparation (``gridcore_airflow.demo --standalone``): the
fixed login in the simple auth manager's passwords file, and a configuration Airflow
reads as the example DAGs, no examples, SQLite on the demo's home and that login. Run
without starting anything (``--prepare-only``); the demo's report is rendered from a
run's rows."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytestmark = pytest.mark.airflow
REPO = Path(__file__).resolve().parents[2]


def test_make_airflow_runs_the_standalone_preparation() -> None:
    done = subprocess.run(
        ["make", "-n", "airflow", "DEMO_HOME=/somewhere/demo"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    (line,) = [ln for ln in done.stdout.splitlines() if "gridcore_airflow.demo" in ln]
    assert shlex.split(line)[0] == "AIRFLOW_HOME=/somewhere/demo/airflow"
    assert shlex.split(line)[-3:] == ["--home", "/somewhere/demo", "--standalone"]


def test_preparation_writes_the_login_and_a_config_airflow_reads(tmp_path: Path) -> None:
    home = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(home / "airflow")
    command = [sys.executable, "-m", "gridcore_airflow.demo", "--home", str(home)]
    done = subprocess.run(
        [*command, "--standalone", "--prepare-only"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert "URL:   http://127.0.0.1:8080" in done.stdout
    assert "login: admin / admin" in done.stdout
    passwords = home / "airflow" / "simple_auth_manager_passwords.json.generated"
    assert json.loads(passwords.read_text()) == {"admin": "admin"}
    variables = dict(
        shlex.split(line)[0].split("=", 1)
        for line in (home / "airflow.env").read_text().splitlines()
    )
    assert variables["AIRFLOW_HOME"] == str(home / "airflow")
    assert variables["GRIDCORE_DB_URL"] == f"sqlite:///{home / 'gridcore-state.db'}"

    # What Airflow makes of it, in a process with only that environment: the auth
    # manager's init() keeps the written password (it adds one only for a user
    # missing from the file).
    seen = subprocess.run(
        [sys.executable, "-c", READ_BACK],
        env=env | variables,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert seen.returncode == 0, seen.stderr
    config = json.loads(seen.stdout.strip().splitlines()[-1])
    assert config == {
        "dags_folder": str(REPO / "dags"),
        "load_examples": False,
        "sql_alchemy_conn": f"sqlite:///{home / 'airflow' / 'airflow.db'}",
        "users": [["admin", "admin"]],
        "passwords": {"admin": "admin"},
        "plugin": ["gridcore"],
    }


READ_BACK = """
import json
from importlib import metadata
from airflow.configuration import conf
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

SimpleAuthManager().init()
print(json.dumps({
    "dags_folder": conf.get("core", "dags_folder"),
    "load_examples": conf.getboolean("core", "load_examples"),
    "sql_alchemy_conn": conf.get("database", "sql_alchemy_conn"),
    "users": [[u.username, u.role] for u in SimpleAuthManager.get_users()],
    "passwords": SimpleAuthManager.get_passwords(),
    "plugin": [e.name for e in metadata.entry_points(group="airflow.plugins")
               if e.value.startswith("gridcore_airflow.")],
}))
"""


def test_the_report_shows_each_task_with_its_label_state_and_sites() -> None:
    from gridcore_airflow.demo.harness import DagReport, TaskInstanceRow, format_report, sites_of

    at = datetime(2026, 1, 1, tzinfo=UTC)
    tasks = (
        (TaskInstanceRow("plan", -1, None, "success", at), sites_of({"command": "x"})),
        (
            TaskInstanceRow("member", 0, "demo #0 @ local-a", "success", at),
            sites_of({"site": "local-a"}),
        ),
        (TaskInstanceRow("solve", -1, None, "failed", at), sites_of({"sites": ["b", "a", "b"]})),
    )
    report = DagReport("d", "r1", "failed", 2.04, tasks, (), ("left held: x",))

    assert not report.ok
    assert format_report(report).splitlines() == [
        "== d: failed in 2.0 s (run r1)",
        "  task                         state    site",
        "  plan                         success",
        "  member[0] demo #0 @ local-a  success  local-a",
        "  solve                        failed   b, a, b",
        "  ledger: left held: x",
    ]
