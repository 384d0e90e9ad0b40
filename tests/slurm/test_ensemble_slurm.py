"""The ensemble_surge DAG on the real three-cluster Slurm grid, checked against Slurm.

Airflow's real scheduler, dag-processor, triggerer and LocalExecutor run the DAG (a burst
of members only happens there: ``dag.test()`` runs members one at a time, so each one
would find every cluster idle and go to the same one). The run is started by a forcing
file, like production. Afterwards every member's job is looked up in the records of the
cluster its XCom names, through that cluster's own slurmrestd.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.capacity_checks import assert_capacity_invariant
from tests.integration.airflow_services import (
    AirflowServices,
    migrate_metadata_db,
    task_states,
    wait_for_run,
    xcom_values,
)
from tests.slurmgrid import SlurmCluster, SlurmGrid

pytestmark = [pytest.mark.slurm, pytest.mark.airflow]
DAG_ID = "ensemble_surge"


@pytest.fixture(scope="module")
def slurm_services(
    slurm_grid: SlurmGrid, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[AirflowServices, Path]]:
    base = tmp_path_factory.mktemp("ensemble-slurm")
    # Keep the inbox of an earlier tier in this session: a new directory would change the
    # asset watcher's trigger, which waits for the dag-processor's next re-parse.
    forcing_dir = Path(os.environ.get("GRIDCORE_FORCING_DIR") or base / "forcing")
    env = {
        "GRIDCORE_GRID": str(slurm_grid.grid_toml),
        "GRIDCORE_HOME": str(base / "gridcore"),
        "GRIDCORE_DB_URL": f"sqlite:///{base / 'gridcore-state.db'}",
        "GRIDCORE_FORCING_DIR": str(forcing_dir),
        **slurm_grid.env,  # the clusters' tokens, referenced by the grid file
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        migrate_metadata_db()
        services = AirflowServices.start(base / "services")
        try:
            yield services, forcing_dir
        finally:
            services.stop()


def test_burst_of_members_runs_on_several_clusters_as_slurm_records_it(
    slurm_grid: SlurmGrid, slurm_services: tuple[AirflowServices, Path]
) -> None:
    services, forcing_dir = slurm_services
    # 6 members x 4 CPUs = 24 > the 16 CPUs of alpha, the fastest-reached cluster.
    forcing = {"storm": "beryl", "members": 6, "processors": 4, "runtime_s": 2}
    since = datetime.now(UTC)
    forcing_dir.mkdir(parents=True, exist_ok=True)
    partial = forcing_dir / ".beryl.json.partial"
    partial.write_text(json.dumps(forcing))
    os.rename(partial, forcing_dir / "beryl.json")

    run = wait_for_run(DAG_ID, since, 240, services)

    assert run.state == "success", (task_states(DAG_ID, run.run_id), services.log_tail("scheduler"))
    results = xcom_values(DAG_ID, run.run_id, "member")
    assert sorted(results) == list(range(forcing["members"]))
    for index, result in results.items():
        cluster = slurm_grid.cluster(result["site"])
        job = slurm_job(cluster, result["job_id"])
        assert job["name"] == f"{DAG_ID}.member.{index}", job
        assert job_state(job) == "COMPLETED", job
        assert int(job["job_id"]) >= cluster.first_job_id  # ids are distinct per cluster
        assert result["state"] == "completed"
    used = {r["site"] for r in results.values()}
    assert len(used) > 1, f"every member went to {used}"
    # The state DB the members' workers wrote to (set by the slurm_services fixture).
    assert_capacity_invariant(os.environ["GRIDCORE_DB_URL"], no_live_holds=True)


def slurm_job(cluster: SlurmCluster, job_id: str) -> dict[str, Any]:
    """The job as the cluster's own slurmrestd reports it."""
    response = requests.get(
        f"{cluster.rest_url}/slurm/{cluster.api_version}/job/{job_id}",
        headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": cluster.token},
        timeout=15,
    )
    response.raise_for_status()
    body = response.json()
    assert not body.get("errors"), body["errors"]
    (job,) = [j for j in body["jobs"] if str(j["job_id"]) == str(job_id)]
    return dict(job)


def ended_slurm_job(cluster: SlurmCluster, job_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """``slurm_job`` once the job has left PENDING/RUNNING/COMPLETING: a job's program
    can report its end to gridcore a moment before its cluster records the end (26.05's
    slurmstepd takes longer to finish a step than 22.05's)."""
    deadline = time.monotonic() + timeout_s
    while True:
        job = slurm_job(cluster, job_id)
        if job_state(job) not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
            return job
        if time.monotonic() > deadline:
            return job
        time.sleep(0.2)


def job_state(job: dict[str, Any]) -> str:
    state = job["job_state"]
    # v0.0.38 reports a string; later API versions a list of flags.
    return str(state[0] if isinstance(state, list) else state)
