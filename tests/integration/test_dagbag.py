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
