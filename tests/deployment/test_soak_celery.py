"""Issue 21's soak on the deployment, small: the README's minimal DAG (``dags/minimal.py``,
two deferrable SiteJobOperator tasks, no retries) run 3 times at once under the
CeleryExecutor deployment (after ``test_deployment.py``, on the same deployment).
``python -m tests.airflow_soak --runs 50 --executor celery`` is the full soak
(docs/operators.md)."""

from __future__ import annotations

import json

import pytest

from tests.deployment.deployment import Deployment

pytestmark = [pytest.mark.deployment, pytest.mark.airflow]


def test_minimal_dag_never_fails_under_celery(deployment: Deployment) -> None:
    from tests.airflow_soak import CeleryAirflow, soak

    report = soak(CeleryAirflow(deployment), 3, beside_dags_test=False, concurrency=3)

    figures = json.dumps(report.as_json(), indent=2, default=str)
    assert report.succeeded == report.runs == 3, figures
    deferrals = report.executor_report_after_deferral_s
    assert deferrals["deferrals"] == 6, figures  # each task deferred, once
    assert report.cancelled_selections == [], figures
    assert report.ledger == [], figures
    assert report.ok, figures
