"""Example DAGs are tests: every file in dags/ imports cleanly into a DagBag."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.airflow


def test_every_dag_file_imports_without_errors(dagbag: Any) -> None:
    assert dagbag.import_errors == {}
    assert "ensemble_surge" in dagbag.dags


def test_ensemble_dag_is_scheduled_by_the_forcing_asset_watcher(dagbag: Any) -> None:
    from gridcore_airflow.sensors.triggers import ForcingFileTrigger

    dag = dagbag.dags["ensemble_surge"]
    (asset,) = dag.timetable.asset_condition.objects
    assert asset.name == "gridcore_forcing"
    (watcher,) = asset.watchers
    assert watcher.name == "forcing_watcher"
    assert isinstance(watcher.trigger, ForcingFileTrigger)
    assert watcher.trigger.pattern == "*.json"
    assert set(dag.task_ids) == {
        "plan_members",
        "select_sites",
        "member_kwargs",
        "member",
        "summary",
    }


def test_the_minimal_dag_is_two_site_jobs_in_a_row_without_retries(dagbag: Any) -> None:
    """dags/minimal.py, the README's complete DAG (the README test keeps them equal)."""
    from gridcore_airflow.operators.site_job import SiteJobOperator

    dag = dagbag.dags["minimal"]
    assert sorted(dag.task_ids) == ["hello", "world"]
    assert all(type(task) is SiteJobOperator for task in dag.tasks)
    assert dag.get_task("hello").downstream_task_ids == {"world"}
    assert {t.task_id: (t.retries, t.gridcore_conn_id) for t in dag.tasks} == {
        "hello": (0, "gridcore_default"),
        "world": (0, "gridcore_default"),
    }
