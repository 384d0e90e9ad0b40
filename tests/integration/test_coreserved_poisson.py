"""The coreserved_poisson example DAG through Airflow's real ``dag.test()`` on the
embedded local sites: VJM selects clusters by the wait model, pilots hold processors and register
with the VJ center (embedded in this process: no center is configured), the solver is
dispatched into all of them at once, and the strips agree with the single-process
solve."""

from __future__ import annotations

from typing import Any

import pytest

from gridcore.engine.coreservation import CoReservationEngine
from gridcore.engine.phases import PilotState
from gridcore.engine.runtime import GridRuntime
from tests.capacity_checks import assert_capacity_invariant
from tests.integration.airflow_services import task_states, xcom_values
from tests.integration.conftest import IntegrationEnv

pytestmark = pytest.mark.airflow
DAG_ID = "coreserved_poisson"


def test_dag_parses_with_its_tasks(dagbag: Any) -> None:
    assert DAG_ID not in dagbag.import_errors
    dag = dagbag.dags[DAG_ID]
    assert set(dag.task_ids) == {"plan", "coreserve", "check"}


def test_dag_test_solves_through_pilots_on_several_sites(
    dagbag: Any, airflow_env: IntegrationEnv
) -> None:
    # 10 processors in pilots of 2: more than the largest embedded cluster (local-a, 8)
    # holds, so the job must span clusters. (The DAG's default 6 fit idle local-a whole,
    # and the live wait model forecasts all three pilots starting at once there.)
    run = dagbag.dags[DAG_ID].test(run_conf={"processors": 10})

    assert run.state == "success", task_states(DAG_ID, run.run_id)
    (result,) = xcom_values(DAG_ID, run.run_id, "coreserve").values()
    (summary,) = xcom_values(DAG_ID, run.run_id, "check").values()
    assert result["state"] == "completed"
    assert sum(result["clusters"].values()) == 5  # 10 processors in pilots of 2
    assert len(result["clusters"]) >= 2, result["clusters"]
    assert len(result["t_avail_s"]) == 5 and result["lifetime_s"] >= 120.0
    assert result["coallocation_s"] is not None and result["dispatch_skew_s"] is not None
    assert summary["max_abs_diff"] <= 1e-8
    print(f"local sites: {summary}")

    runtime = GridRuntime.open(db_url=airflow_env.db_url, upgrade=False)
    try:
        record = CoReservationEngine(runtime, "http://unused").status(result["job_id"])
    finally:
        runtime.store.dispose()
    assert sorted(p.component for p in record.pilots) == [0, 1, 2, 3, 4]
    assert all(p.state is PilotState.COMPLETED and p.exit_code == 0 for p in record.pilots)
    assert result["sites"] == [p.site for p in sorted(record.pilots, key=lambda p: p.component)]
    assert_capacity_invariant(airflow_env.db_url)
