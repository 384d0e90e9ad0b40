"""The coallocated_poisson example DAG through Airflow's real ``dag.test()`` on the
embedded local sites: KOALA places the three components on three sites, they meet at
the start barrier (through the VJ center embedded in this process, the embedded default),
solve together over TCP and agree with the single-process solve."""

from __future__ import annotations

from typing import Any

import pytest

from tests.barrier_checks import assert_released_after_every_registration
from tests.capacity_checks import assert_capacity_invariant
from tests.integration.airflow_services import task_states, xcom_values
from tests.integration.conftest import IntegrationEnv

pytestmark = pytest.mark.airflow
DAG_ID = "coallocated_poisson"


def test_dag_parses_with_its_tasks(dagbag: Any) -> None:
    assert DAG_ID not in dagbag.import_errors
    dag = dagbag.dags[DAG_ID]
    assert set(dag.task_ids) == {"plan", "coallocate", "check"}
    assert dag.params["policy"] == "WF"


def test_dag_test_solves_across_three_sites_in_step(
    dagbag: Any, airflow_env: IntegrationEnv
) -> None:
    run = dagbag.dags[DAG_ID].test()

    assert run.state == "success", task_states(DAG_ID, run.run_id)
    (placed,) = xcom_values(DAG_ID, run.run_id, "coallocate").values()
    (summary,) = xcom_values(DAG_ID, run.run_id, "check").values()
    # WF: 8 to the largest site, then each 4 to the site with the most idle processors.
    assert placed["sizes"] == [4, 8, 4]
    assert sorted(placed["sites"]) == ["local-a", "local-b", "local-c"]
    assert placed["sites"][1] == "local-a"
    assert placed["state"] == "completed" and placed["retries"] == 0
    assert placed["jpt"] is not None and placed["jst"] is not None
    assert all(t is not None for t in placed["start_times"])
    assert summary["max_abs_diff"] <= 1e-8
    assert_released_after_every_registration(airflow_env.db_url, placed["job_id"])
    assert summary["sites"] == placed["sites"]
    print(f"local sites: {summary}")  # shown with -s: the measured skew and difference

    # gridcore's own state DB agrees with the XCom. (No VJ center is configured: the
    # operator waited in this process, whose embedded center the barriers called.)
    # Imported here: at collection, Airflow's provider discovery imports operators/,
    # which imports the hook itself.
    from gridcore_airflow.operators.hooks import EngineKind, GridcoreHook

    with GridcoreHook(db_url=airflow_env.db_url).engine(EngineKind.COALLOCATION, 1.0) as koala:
        record = koala.status(placed["job_id"])
    assert [c.site for c in record.components] == placed["sites"]
    assert all(c.state == "completed" and c.exit_code == 0 for c in record.components)
    assert_capacity_invariant(airflow_env.db_url, no_live_holds=True)
