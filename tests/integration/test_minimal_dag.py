"""The README's complete DAG (``dags/minimal.py``) runs through Airflow's ``dag.test()``
on the embedded local sites: both jobs succeed, one after the other, without retries."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.airflow_services import task_states, xcom_values

pytestmark = pytest.mark.airflow
DAG_ID = "minimal"


def test_the_minimal_dag_runs_both_jobs_in_order(dagbag: Any) -> None:
    run = dagbag.dags[DAG_ID].test()

    states = task_states(DAG_ID, run.run_id)
    assert run.state == "success", states
    assert states == {("hello", -1): "success", ("world", -1): "success"}
    [hello] = xcom_values(DAG_ID, run.run_id, "hello").values()
    [world] = xcom_values(DAG_ID, run.run_id, "world").values()
    assert hello["state"] == world["state"] == "completed"
    assert {hello["site"], world["site"]} <= {"local-a", "local-b", "local-c"}
    assert hello["finished_at"] <= world["started_at"]
