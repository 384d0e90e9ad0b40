"""Issue 21's soak in the Airflow tier, small: the README's minimal DAG (``dags/minimal.py``,
two deferrable SiteJobOperator tasks, no retries) run 5 times at once under Airflow's
real scheduler, dag-processor, triggerer and LocalExecutor workers, while a second
Airflow process runs ``airflow dags test`` of it over and over in the README's CLI
environment (the same metadata DB, state DB and local sites): every run succeeds, a
``dags test`` run fails only where Airflow's scheduler ran its task too, and no job is
cancelled. ``python -m tests.airflow_soak --runs 50`` is the full soak
(docs/operators.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import IntegrationEnv

pytestmark = pytest.mark.airflow


def test_minimal_dag_never_fails_with_dags_test_beside_it(
    airflow_env: IntegrationEnv, tmp_path: Path
) -> None:
    from tests.airflow_soak import DOUBLE_SCHEDULED, local_airflow, soak

    with local_airflow(tmp_path) as airflow:
        report = soak(airflow, 5, beside_dags_test=True, concurrency=5)

    figures = json.dumps(report.as_json(), indent=2, default=str)
    assert report.succeeded == report.runs == 5, figures
    deferrals = report.executor_report_after_deferral_s
    assert deferrals["deferrals"] == 10, figures  # each task deferred, once
    beside = report.beside_dags_test
    assert beside is not None and beside["runs"] > 0, figures
    # A dags-test run fails only where Airflow's scheduler queued its task too (its run
    # is a running DagRun of an unpaused DAG in the same metadata DB: docs/operators.md,
    # "airflow dags test beside a running scheduler"); never for another reason.
    assert [f for f in beside["failed"] if f["cause"] != DOUBLE_SCHEDULED] == [], figures
    assert report.cancelled_selections == [], figures
    assert report.ledger == [], figures
