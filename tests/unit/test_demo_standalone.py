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
from typing import Any

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


OWN_GRID = 'version = 1\n[sites.mine]\nkind = "local"\nprocessors = 2\n'


def test_the_demo_s_environment_keeps_the_user_s_grid_and_center(tmp_path: Path) -> None:
    """Issue 21 item 3: make demo / make airflow dropped $GRIDCORE_GRID and
    $GRIDCORE_CENTER_URL, so nobody could run them on their own grid."""
    from gridcore_airflow.demo.harness import demo_environment, grid_in_use

    home, dags = tmp_path / "demo", tmp_path / "dags"
    (tmp_path / "grid.toml").write_text(OWN_GRID)
    given = {
        "GRIDCORE_GRID": str(tmp_path / "sub" / ".." / "grid.toml"),
        "GRIDCORE_CENTER_URL": "http://10.0.0.5:8790",
        "GRIDCORE_DB_URL": "postgresql://production/state",  # the demo keeps its own
        "AIRFLOW_HOME": "/elsewhere",
    }

    variables = demo_environment(home, dags, given)

    assert variables["GRIDCORE_GRID"] == str(tmp_path / "grid.toml")  # absolute, resolved
    assert variables["GRIDCORE_CENTER_URL"] == "http://10.0.0.5:8790"
    assert "GRIDCORE_SITE_CENTER_URLS" not in variables  # not given: not set
    assert variables["GRIDCORE_DB_URL"] == f"sqlite:///{home / 'gridcore-state.db'}"
    assert variables["GRIDCORE_GRID"] == str(tmp_path / "grid.toml")
    assert variables["AIRFLOW_HOME"] == str(home / "airflow")
    assert grid_in_use(variables, given) == (
        f"{tmp_path / 'grid.toml'} ($GRIDCORE_GRID): 1 site, mine"
    )
    default = demo_environment(home, dags, {"GRIDCORE_GRID": " "})
    assert "GRIDCORE_GRID" not in default and "GRIDCORE_CENTER_URL" not in default
    assert grid_in_use(default, {}).startswith("the embedded default: 3 local sites")
    named = {"AIRFLOW_CONN_GRIDCORE_DEFAULT": '{"conn_type": "gridcore"}'}
    assert "gridcore_default" in grid_in_use(default, named)


def _demo(home: Path, cwd: Path, *options: str, **variables: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GRIDCORE"))}
    command = [sys.executable, "-m", "gridcore_airflow.demo", "--home", str(home), *options]
    return subprocess.run(
        command,
        env=env | variables,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_demo_s_environment_is_written_for_the_airflow_cli(tmp_path: Path) -> None:
    """<home>/airflow.env existed only after make airflow; the demo writes it too (and
    --prepare-only alone), with the user's grid, for `set -a; . airflow.env`."""
    (tmp_path / "grid.toml").write_text(OWN_GRID)
    home = tmp_path / "demo"

    done = _demo(home, tmp_path, "--prepare-only", GRIDCORE_GRID="grid.toml")

    assert done.returncode == 0, done.stderr
    assert f"grid: {tmp_path / 'grid.toml'} ($GRIDCORE_GRID): 1 site, mine" in done.stdout
    sourced = subprocess.run(
        ["sh", "-c", f"set -a; . {shlex.quote(str(home / 'airflow.env'))}; set +a; env"],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert f"GRIDCORE_GRID={tmp_path / 'grid.toml'}" in sourced
    assert f"AIRFLOW_HOME={home / 'airflow'}" in sourced
    assert f"GRIDCORE_FORCING_DIR={home / 'forcing'}" in sourced


def test_a_bad_grid_file_stops_the_demo_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "grid.toml").write_text(OWN_GRID.replace("processors", "procesors"))
    home = tmp_path / "demo"

    # --prepare-only: were the grid not checked first, nothing would start either
    done = _demo(home, tmp_path, "--standalone", "--prepare-only", GRIDCORE_GRID="grid.toml")

    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"python -m gridcore_airflow.demo: error: $GRIDCORE_GRID: {tmp_path / 'grid.toml'}:"
        ' sites.mine.procesors: unknown key (did you mean "processors"?)'
    )
    assert not home.exists()


def test_preparation_writes_the_login_and_a_config_airflow_reads(tmp_path: Path) -> None:
    home = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(home / "airflow")
    (tmp_path / "grid.toml").write_text(OWN_GRID)
    env["GRIDCORE_GRID"] = str(tmp_path / "grid.toml")
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
    assert f"grid:  {tmp_path / 'grid.toml'} ($GRIDCORE_GRID): 1 site, mine" in done.stdout
    assert f"forcing: {home / 'forcing'}" in done.stdout
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
