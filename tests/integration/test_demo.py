"""``make demo`` (``python -m gridcore_airflow.demo``) end to end, as a user
runs it: a fresh home, Airflow's metadata migrated, a DAG run through ``dag.test()``, the
report on stdout, the run's own output in the home's log; a failing DAG makes it exit 1.
(Every example DAG's own checks are the other tests of this tier, which prepare with the
same functions.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.airflow

FAILING_DAG = """
from airflow.sdk import dag, task


@dag(dag_id="fails", schedule=None)
def fails():
    @task
    def fine():
        return {"site": "nowhere"}

    @task
    def boom(value):
        raise RuntimeError("boom on purpose")

    boom(fine())


fails()
"""


def demo(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A process of its own, as `make demo` starts it: nothing of this session's Airflow.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GRIDCORE_"))}
    env["AIRFLOW_HOME"] = str(home / "airflow")
    return subprocess.run(
        [sys.executable, "-m", "gridcore_airflow.demo", "--home", str(home), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_demo_runs_a_dag_and_reports_what_ran_where(tmp_path: Path) -> None:
    home = tmp_path / "demo"
    done = demo(home, "--only", "coallocated_poisson")

    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    out = done.stdout
    assert "== coallocated_poisson: success in " in out, out
    lines = out.splitlines()
    (solve,) = [ln for ln in lines if ln.lstrip().startswith("coallocate ")]
    # the three components' sites, as the XCom lists them (WF over the local sites)
    sites = solve.split("success", 1)[1].strip().split(", ")
    assert sorted(sites) == ["local-a", "local-b", "local-c"], solve
    assert "  result: components (processors on site): " in out
    assert "max |split - single-process| " in out
    assert "  ledger: consistent, nothing held" in out
    assert out.rstrip().endswith("every DAG succeeded"), out
    # the run's own output is in the home, not on the terminal
    log = home / "logs" / "coallocated_poisson.log"
    assert log.stat().st_size > 0
    assert "max_abs_diff" in log.read_text(errors="replace")
    assert "max_abs_diff" not in out
    assert (home / "airflow" / "airflow.db").is_file()
    assert (home / "gridcore-state.db").is_file()


def test_a_failing_dag_fails_the_demo(tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "fails.py").write_text(FAILING_DAG)

    done = demo(tmp_path / "demo", "--dags", str(dags))

    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "== fails: failed in " in done.stdout
    # a worker task is not said to run at a site, whatever its XCom holds
    assert "  fine" in done.stdout and "nowhere" not in done.stdout
    assert "boom on purpose" in done.stdout  # the tail of its output
    assert done.stdout.rstrip().endswith("FAILED: fails")


def test_an_unknown_dag_is_refused(tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "fails.py").write_text(FAILING_DAG)

    done = demo(tmp_path / "demo", "--dags", str(dags), "--only", "nope")

    assert done.returncode == 2
    assert "no such DAG: nope; known: fails" in done.stdout
