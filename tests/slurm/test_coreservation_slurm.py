"""VJM co-reservation on the real three-cluster Slurm grid, checked against Slurm's own
records: pilots are Slurm jobs that register with the VJ center over the network (each
cluster reaches this host by its own address when the grid runs in network
namespaces), the real program starts in all of them together, and its answer is right.

The center runs in this process on all addresses; each cluster's pilots get the URL of
the host-side address of that cluster's link (``site_center_urls``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gridcore.api.server import RunningCenter, start_in_thread
from gridcore.apps.launch import component_command, strips_difference
from gridcore.config import load_grid
from gridcore.engine.coreservation import CoReservationEngine, CoReservationParams
from gridcore.engine.coreservation_records import ReservationRecord
from gridcore.engine.phases import PilotState, ReservationPhase
from gridcore.engine.runtime import GridRuntime
from gridcore.model import CoReservationRequest
from gridcore.state.store import open_store
from tests.capacity_checks import assert_capacity_invariant
from tests.integration.airflow_services import migrate_metadata_db, task_states, xcom_values
from tests.slurm.test_coallocation_slurm import wait_idle
from tests.slurm.test_ensemble_slurm import ended_slurm_job, job_state
from tests.slurmgrid import SlurmGrid

pytestmark = pytest.mark.slurm
DAGS = Path(__file__).resolve().parents[2] / "dags"
SITES = ["alpha", "beta", "gamma"]
WAIT_S = 180.0


@pytest.fixture(scope="module")
def vjm_env(
    slurm_grid: SlurmGrid, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, str], RunningCenter]]:
    base = tmp_path_factory.mktemp("vjm-slurm")
    base.chmod(0o777)
    db_url = f"sqlite:///{base / 'gridcore-state.db'}"
    open_store(db_url, upgrade=True).dispose()
    center = start_in_thread(open_store(db_url), host="0.0.0.0", heartbeat_s=2.0)
    port = center.url.rsplit(":", 1)[1]
    sites = {s: f"http://{slurm_grid.cluster(s).host_address}:{port}" for s in SITES}
    env = {
        "GRIDCORE_GRID": str(slurm_grid.grid_toml),
        "GRIDCORE_HOME": str(base / "gridcore"),
        "GRIDCORE_DB_URL": db_url,
        "GRIDCORE_CENTER_URL": sites["alpha"],
        "GRIDCORE_SITE_CENTER_URLS": json.dumps(sites),
        **slurm_grid.env,
    }
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            yield env, center
    finally:
        center.stop()


def engine_of(env: dict[str, str]) -> CoReservationEngine:
    runtime = GridRuntime(load_grid(env["GRIDCORE_GRID"]), open_store(env["GRIDCORE_DB_URL"]))
    return CoReservationEngine(
        runtime,
        env["GRIDCORE_CENTER_URL"],
        CoReservationParams(heartbeat_timeout_s=20.0),
        site_center_urls=json.loads(env["GRIDCORE_SITE_CENTER_URLS"]),
    )


def scan_until(
    engine: CoReservationEngine, job_id: int, phase: ReservationPhase
) -> ReservationRecord:
    deadline = time.time() + WAIT_S
    while time.time() < deadline:
        engine.scan()
        record = engine.status(job_id)
        if record.state == phase:
            return record
        assert not record.finished, record.as_json()
        time.sleep(0.3)
    raise AssertionError(f"job {job_id}: {engine.status(job_id).as_json()}")


def test_a_three_cluster_job_through_pilots_starts_together_and_solves_right(
    slurm_grid: SlurmGrid, vjm_env: tuple[dict[str, str], RunningCenter], tmp_path: Path
) -> None:
    env, _center = vjm_env
    wait_idle(env)
    out = tmp_path / "strips"
    out.mkdir()
    out.chmod(0o777)
    engine = engine_of(env)
    try:
        # One pilot per cluster, pinned (Eq. 1 follows the session's queue history,
        # which other tests shape): the point here is the start together.
        job_id = engine.submit(
            CoReservationRequest(
                "slurm-vjm",
                component_command(24, 120, [1, 1, 1], out),
                3,
                vj_size=1,
                max_clusters=3,
                machine_file=tuple((site, 1) for site in SITES),
            )
        )
        record = scan_until(engine, job_id, ReservationPhase.COMPLETED)
    finally:
        engine.runtime.store.dispose()
    ranks = sorted(record.pilots, key=lambda p: p.component or 0)
    assert [p.site for p in ranks] == SITES, record.as_json()
    assert all(p.state is PilotState.COMPLETED and p.exit_code == 0 for p in ranks)
    assert strips_difference(out, 3, 24, 120) <= 1e-8
    print(
        f"slurm vjm: coallocation {record.coallocation_s:.2f} s,"
        f" dispatch skew {record.dispatch_skew_s:.3f} s"
    )
    # Slurm's records: every pilot job ran on its own cluster and all three were
    # running together when the program was dispatched.
    dispatched = record.dispatched_at
    assert dispatched is not None
    for pilot in ranks:
        cluster = slurm_grid.cluster(pilot.site)
        job = ended_slurm_job(cluster, str(pilot.site_job_id))
        assert job_state(job) == "COMPLETED", job
        assert str(job["nodes"]).startswith(f"{pilot.site}-n"), job
        start, end = _number(job["start_time"]), _number(job["end_time"])
        assert start <= dispatched + 1.0 and end >= dispatched - 1.0, (job, dispatched)
        assert pilot.started_at is not None and pilot.started_at >= dispatched - 1.0
    assert record.dispatch_skew_s is not None and record.dispatch_skew_s < 2.0
    assert_capacity_invariant(env["GRIDCORE_DB_URL"])


def test_coreserved_poisson_dag_on_the_slurm_grid(
    vjm_env: tuple[dict[str, str], RunningCenter],
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    env, _center = vjm_env
    wait_idle(env)
    migrate_metadata_db()
    dag = DagBag(dag_folder=str(DAGS)).dags["coreserved_poisson"]
    run = dag.test(run_conf={"processors": 6, "vj_size": 2, "max_clusters": 3})

    assert run.state == "success", task_states(dag.dag_id, run.run_id)
    (summary,) = xcom_values(dag.dag_id, run.run_id, "check").values()
    print(f"slurm coreserved poisson: {summary}")
    assert summary["max_abs_diff"] <= 1e-8
    assert sum(summary["clusters"].values()) == 3
    assert set(summary["clusters"]) <= set(SITES)
    assert_capacity_invariant(env["GRIDCORE_DB_URL"])


def _number(value: Any) -> float:
    """slurmrestd v0.0.38 gives a number; later versions {"set", "number"}."""
    return float(value["number"] if isinstance(value, dict) else value)
