"""The ensemble_surge example DAG end to end on the embedded local sites.

Two runs, because Airflow offers two ways and each hides something the other shows:

* ``dag.test()`` (in-process, triggers inline): the burst decided in one transaction by
  select_sites, each member submitting its own selection, the operator -> trigger ->
  execute_complete contract, XComs, and agreement with gridcore's state DB.
* the real scheduler, dag-processor, triggerer and LocalExecutor: a forcing file dropped
  into the watched directory triggers the run through the asset watcher, and the members
  run concurrently. ``dag.test()`` cannot show that: it runs mapped task instances one
  at a time and each trigger to completion before the next member starts.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gridcore.engine.runtime import GridRuntime
from gridcore.state import capacity
from gridcore.state.schema import selections
from gridcore.state.store import open_store
from tests.capacity_checks import assert_capacity_invariant
from tests.integration.airflow_services import (
    AirflowServices,
    rendered_map_indexes,
    task_states,
    wait_for_run,
    xcom_values,
)
from tests.integration.conftest import IntegrationEnv

pytestmark = pytest.mark.airflow
DAG_ID = "ensemble_surge"
RESULT_KEYS = {
    "site",
    "job_id",
    "state",
    "selected_at",
    "started_at",
    "finished_at",
    "queued_s",
    "selection_id",
    "output_files",
    "resources",
}


def test_dag_test_decides_the_burst_at_once_and_runs_every_member(
    dagbag: Any, airflow_env: IntegrationEnv
) -> None:
    from gridcore_airflow.demo.harness import RUN_CONF

    dag = dagbag.dags[DAG_ID]
    conf = dict(RUN_CONF[DAG_ID])  # what make demo runs
    members = conf["members"]
    assert members * conf["processors"] > 8  # more than the best site (local-a) holds
    since = time.time()
    run = dag.test(run_conf=conf)

    states = task_states(DAG_ID, run.run_id)
    assert run.state == "success", states
    (burst,) = xcom_values(DAG_ID, run.run_id, "select_sites").values()
    results = xcom_values(DAG_ID, run.run_id, "member")
    assert sorted(results) == list(range(members))
    assert_members_completed(results)
    assert_state_db_agrees(results, f"{DAG_ID}.member")
    # One selection per member, made by select_sites and submitted by that member ...
    assert [b["name"] for b in burst] == [f"{DAG_ID}.member.{i}" for i in range(members)]
    assert [results[i]["selection_id"] for i in range(members)] == [
        b["selection_id"] for b in burst
    ]
    assert [results[i]["site"] for i in range(members)] == [b["site"] for b in burst]
    # ... all in one decision: the run wrote exactly these rows, at one clock reading.
    rows = selection_rows_since(since)
    assert [row["id"] for row in rows] == [b["selection_id"] for b in burst]
    assert len({row["selected_at"] for row in rows}) == 1
    assert {row["selected_at"] for row in rows} == {b["selected_at"] for b in burst}
    assert len({b["site"] for b in burst}) > 1, f"the burst all went to {burst[0]['site']}"
    summary = xcom_values(DAG_ID, run.run_id, "summary")[-1]
    assert [row["site"] for row in summary["members"]] == [
        results[i]["site"] for i in range(members)
    ]
    assert sum(summary["per_site"].values()) == members
    # every mapped member is labelled by its parameters and the site it ran at
    labels = rendered_map_indexes(DAG_ID, run.run_id, "member")
    assert [labels[i] for i in range(members)] == [
        f"{conf['storm']} #{i} wind {35.0 * (0.8 + 0.4 * i / (members - 1)):.2f} m/s"
        f" @ {results[i]['site']}"
        for i in range(members)
    ]
    assert_capacity_invariant(airflow_env.db_url, no_live_holds=True)


@pytest.fixture(scope="module")
def services(airflow_env: IntegrationEnv) -> Iterator[AirflowServices]:
    running = AirflowServices.start(airflow_env.base / "services-local")
    try:
        yield running
    finally:
        running.stop()


def test_forcing_file_burst_spreads_over_sites(
    services: AirflowServices, airflow_env: IntegrationEnv
) -> None:
    # 6 members x 2 processors = 12 > the 8 processors of the best site (local-a).
    forcing = {"storm": "alberto", "members": 6, "processors": 2, "runtime_s": 2}
    since = datetime.now(UTC)
    drop_forcing_file(airflow_env.forcing_dir, "alberto.json", forcing)

    run = wait_for_run(DAG_ID, since, 180, services)
    assert run.run_type == "asset_triggered"

    states = task_states(DAG_ID, run.run_id)
    assert run.state == "success", (states, services.log_tail("scheduler"))
    results = xcom_values(DAG_ID, run.run_id, "member")
    assert sorted(results) == list(range(forcing["members"]))
    assert_members_completed(results)
    sites = {r["site"] for r in results.values()}
    assert len(sites) > 1, f"the burst all went to {sites}"
    assert_state_db_agrees(results, f"{DAG_ID}.member")
    # Exactly one job per member, even if Airflow failed and retried a member meanwhile,
    # and every one from the burst's single decision.
    assert sorted(selection_names_since(since.timestamp())) == [
        f"{DAG_ID}.member.{i}" for i in range(forcing["members"])
    ]
    assert len({row["selected_at"] for row in selection_rows_since(since.timestamp())}) == 1
    # The watcher consumed the file: it fired once and cannot fire again.
    assert not (airflow_env.forcing_dir / "alberto.json").exists()
    consumed = list((airflow_env.forcing_dir / "consumed").glob("*alberto.json"))
    assert len(consumed) == 1
    assert_capacity_invariant(airflow_env.db_url, no_live_holds=True)


def drop_forcing_file(directory: Path, name: str, forcing: Mapping[str, Any]) -> None:
    """Write under a name the watcher ignores, then rename into place (atomic)."""
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{name}.partial"
    partial.write_text(json.dumps(forcing))
    os.rename(partial, directory / name)


def assert_members_completed(results: Mapping[int, Mapping[str, Any]]) -> None:
    for index, result in results.items():
        assert set(result) == RESULT_KEYS, index
        assert result["state"] == "completed", (index, result)
        assert result["job_id"], (index, result)
        assert result["queued_s"] is not None and result["queued_s"] >= 0, (index, result)


def selection_rows_since(timestamp: float) -> list[dict[str, Any]]:
    store = open_store()
    try:
        with store.begin() as conn:
            query = (
                select(selections)
                .where(selections.c.selected_at >= timestamp)
                .order_by(selections.c.id)
            )
            return [dict(row) for row in conn.execute(query).mappings()]
    finally:
        store.dispose()


def selection_names_since(timestamp: float) -> list[str]:
    store = open_store()
    try:
        with store.begin() as conn:
            query = select(selections.c.name).where(selections.c.selected_at >= timestamp)
            return list(conn.execute(query).scalars())
    finally:
        store.dispose()


def assert_state_db_agrees(results: Mapping[int, Mapping[str, Any]], name_prefix: str) -> None:
    runtime = GridRuntime.open()
    try:
        for index, result in results.items():
            record = runtime.record(result["selection_id"])
            assert record.name == f"{name_prefix}.{index}"
            assert (record.site, record.job_id, record.state) == (
                result["site"],
                result["job_id"],
                "completed",
            )
        with runtime.store.begin() as conn:
            totals = capacity.totals(conn)
    finally:
        runtime.store.dispose()
    # Nothing is left in flight: every claimed/queued processor was released.
    assert {site: t for site, t in totals.items() if any(t)} == {}
    assert set(totals) == {"local-a", "local-b", "local-c"}
