"""Co-allocation on the real three-cluster Slurm grid, checked against Slurm's records.

The components' start barriers talk to the VJ center, which runs in this process on all
addresses; each cluster's components get the URL of the host-side address of that
cluster's link (``site_center_urls``: 127.0.0.1 on the loopback layout), and a token of
their own, never the state database's URL. A barrier on a cluster binds its data port on
all addresses and advertises the address of its route to the center.

Components are pinned to alpha, beta and gamma (a fixed request), so each cluster runs
exactly one component and the placement is known in advance. (Components sharing a
cluster's working directory are safe too: each barrier publishes its own peers file by
rename.)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from gridcore.config import load_grid
from gridcore.engine.runtime import GridRuntime
from gridcore.sites.slurm_api import number
from gridcore.state.store import open_store
from gridcore_airflow.operators.coallocation import CoAllocationOperator
from tests.barrier_checks import assert_released_after_every_registration, running_center
from tests.capacity_checks import assert_capacity_invariant
from tests.integration.airflow_services import migrate_metadata_db, task_states, xcom_values
from tests.slurm.test_ensemble_slurm import ended_slurm_job, job_state
from tests.slurmgrid import SlurmGrid

pytestmark = pytest.mark.slurm
DAGS = Path(__file__).resolve().parents[2] / "dags"
SITES = ["alpha", "beta", "gamma"]
WAIT_S = 180.0


@pytest.fixture(scope="module")
def coalloc_env(
    slurm_grid: SlurmGrid, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    base = tmp_path_factory.mktemp("coalloc-slurm")
    db_url = f"sqlite:///{base / 'gridcore-state.db'}"
    with running_center(db_url, host="0.0.0.0") as center:
        port = center.rsplit(":", 1)[1]
        sites = {c.name: f"http://{c.host_address}:{port}" for c in slurm_grid.clusters}
        env = {
            "GRIDCORE_GRID": str(slurm_grid.grid_toml),
            "GRIDCORE_HOME": str(base / "gridcore"),
            "GRIDCORE_DB_URL": db_url,
            "GRIDCORE_CENTER_URL": f"http://127.0.0.1:{port}",
            "GRIDCORE_SITE_CENTER_URLS": json.dumps(sites),
            **slurm_grid.env,  # the clusters' tokens, referenced by the grid file
        }
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            yield env


def wait_idle(env: dict[str, str], timeout: float = 90.0) -> None:
    """Earlier tests share the session grid: start from idle clusters, or the fixed
    request would wait in its placement queue."""
    runtime = GridRuntime(load_grid(env["GRIDCORE_GRID"]), open_store(env["GRIDCORE_DB_URL"]))
    try:
        deadline = time.time() + timeout
        while time.time() < deadline:
            runtime.refresh()
            rows = runtime.site_rows()
            if all(r.idle == r.total and r.external_pending == 0 for r in rows):
                return
            time.sleep(0.5)
        raise AssertionError(f"clusters not idle: {rows}")
    finally:
        runtime.store.dispose()


def run_deferred(op: CoAllocationOperator) -> dict[str, Any]:
    """execute -> the trigger's one event -> execute_complete, as the triggerer would."""
    with pytest.raises(TaskDeferred) as exc:
        op.execute(context={})
    trigger = exc.value.trigger

    async def one_event() -> list[Any]:
        try:
            return [e async for e in trigger.run()]
        finally:
            await trigger.cleanup()

    events = asyncio.run(asyncio.wait_for(one_event(), WAIT_S))
    assert len(events) == 1
    assert events[0].payload["status"] == "success", events[0].payload
    return op.execute_complete({}, events[0].payload)


def test_three_components_on_three_clusters_start_together(
    slurm_grid: SlurmGrid, coalloc_env: dict[str, str], tmp_path: Path
) -> None:
    wait_idle(coalloc_env)
    shown = tmp_path / "shown"
    shown.mkdir()
    shown.chmod(0o777)
    # Each component keeps its environment and its barrier's argv and environment.
    show = (
        f'S={shown}/$GRIDCORE_COMPONENT; env > "$S.env";'
        " tr '\\0' ' ' < /proc/$PPID/cmdline > \"$S.argv\";"
        " tr '\\0' '\\n' < /proc/$PPID/environ >> \"$S.env\";"
    )
    op = CoAllocationOperator(
        task_id="spread",
        command=show + ' echo "component $GRIDCORE_COMPONENT of $GRIDCORE_COMPONENTS"; sleep 1',
        components=[12, 8, 4],
        kind="fixed",
        sites=SITES,
        poll_interval=0.5,
    )
    result = run_deferred(op)

    print(f"slurm spread: skew {result['barrier_skew_s']} sites {result['sites']}")
    assert result["sites"] == SITES and result["sizes"] == [12, 8, 4]
    assert_released_after_every_registration(coalloc_env["GRIDCORE_DB_URL"], result["job_id"])
    assert result["retries"] == 0
    for site, size, job_id in zip(SITES, [12, 8, 4], result["site_job_ids"], strict=True):
        cluster = slurm_grid.cluster(site)
        job = ended_slurm_job(cluster, job_id)  # that cluster's own slurmrestd
        assert job_state(job) == "COMPLETED", job
        assert int(job["job_id"]) >= cluster.first_job_id  # id ranges differ per cluster
        assert str(job.get("cluster", site)) == site, job
        assert str(job["nodes"]).startswith(f"{site}-n"), job
        assert (number(job["cpus"]) or 0) >= size, job
    # What each barrier was given: the center's URL for its cluster and its own token;
    # nothing of the state database.
    urls = json.loads(coalloc_env["GRIDCORE_SITE_CENTER_URLS"])
    database = coalloc_env["GRIDCORE_DB_URL"].removeprefix("sqlite:///")
    for index, site in enumerate(SITES):
        argv = (shown / f"{index}.argv").read_text()
        env = (shown / f"{index}.env").read_text()
        assert f"--center {urls[site]}" in argv and "--bind 0.0.0.0" in argv, argv
        for text in (argv, env):
            assert database not in text and "GRIDCORE_DB_URL" not in text and "--db" not in text
        assert env.count("GRIDCORE_COMPONENT_TOKEN=") == 1, env  # the barrier's, not the command's
    assert_capacity_invariant(coalloc_env["GRIDCORE_DB_URL"], no_live_holds=True)


def test_poisson_dag_on_the_slurm_grid(coalloc_env: dict[str, str]) -> None:
    from airflow.dag_processing.dagbag import DagBag

    wait_idle(coalloc_env)
    migrate_metadata_db()
    dag = DagBag(dag_folder=str(DAGS)).dags["coallocated_poisson"]
    run = dag.test(run_conf={"sites": SITES})

    assert run.state == "success", task_states(dag.dag_id, run.run_id)
    (summary,) = xcom_values(dag.dag_id, run.run_id, "check").values()
    print(f"slurm poisson: {summary}")
    assert summary["sites"] == SITES
    assert summary["max_abs_diff"] <= 1e-8
    (placed,) = xcom_values(dag.dag_id, run.run_id, "coallocate").values()
    assert_released_after_every_registration(coalloc_env["GRIDCORE_DB_URL"], placed["job_id"])
    assert_capacity_invariant(coalloc_env["GRIDCORE_DB_URL"], no_live_holds=True)


def test_a_component_killed_on_one_cluster_makes_the_job_re_placed_and_finish(
    slurm_grid: SlurmGrid, coalloc_env: dict[str, str], tmp_path: Path
) -> None:
    from gridcore.engine.coallocation import CoAllocationEngine
    from gridcore.model import CoAllocationRequest, Component, RequestKind
    from gridcore.policies.claiming import CoAllocationParams
    from gridcore.policies.placement import PlacementPolicy

    wait_idle(coalloc_env)
    marks = tmp_path / "marks"
    marks.mkdir()
    marks.chmod(0o777)
    # The first run of each component lingers (so one can be killed); a rerun after the
    # re-placement finds its mark and ends at once.
    command = (
        f'M={marks}/ran-$GRIDCORE_COMPONENT; if [ -e "$M" ]; then echo rerun;'
        ' else touch "$M"; sleep 60; fi'
    )
    runtime = GridRuntime(
        load_grid(coalloc_env["GRIDCORE_GRID"]), open_store(coalloc_env["GRIDCORE_DB_URL"])
    )
    koala = CoAllocationEngine(
        runtime,
        params=CoAllocationParams(scan_interval_s=1.0),
        center_url=coalloc_env["GRIDCORE_CENTER_URL"],
        site_center_urls=json.loads(coalloc_env["GRIDCORE_SITE_CENTER_URLS"]),
    )
    request = CoAllocationRequest(
        "killed", RequestKind.NON_FIXED, (Component(12), Component(8), Component(4))
    )
    job_id = koala.submit(request, PlacementPolicy.WF, command)
    try:
        first = _scan_until(koala, job_id, lambda r: r.started_at is not None)
        assert first.epoch == 0 and {c.site for c in first.components} <= set(SITES)
        victim = first.components[1]
        koala.runtime.adapter(victim.site).cancel(str(victim.site_job_id))  # killed there

        done = _scan_until(koala, job_id, lambda r: r.state == "completed")
        assert done.retries >= 1 and done.epoch >= 1, done.as_json()
        assert all(c.state == "completed" for c in done.components)
        # Slurm's own records: the killed run is CANCELLED, the rerun COMPLETED.
        killed = ended_slurm_job(slurm_grid.cluster(victim.site), str(victim.site_job_id))
        assert job_state(killed) == "CANCELLED", killed
        for c in done.components:
            assert job_state(ended_slurm_job(slurm_grid.cluster(c.site), str(c.site_job_id))) == (
                "COMPLETED"
            )
        others = [c for c in first.components if c.index != victim.index]
        for c in others:  # the job's other first-run components were aborted by KOALA
            state = job_state(ended_slurm_job(slurm_grid.cluster(c.site), str(c.site_job_id)))
            assert state == "CANCELLED", (c, state)
    finally:
        koala.cancel(job_id)
        runtime.store.dispose()
    assert_capacity_invariant(coalloc_env["GRIDCORE_DB_URL"], no_live_holds=True)


def _scan_until(koala: Any, job_id: int, done: Any, timeout: float = WAIT_S) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        koala.scan()
        record = koala.status(job_id)
        if done(record):
            return record
        assert record.state not in ("failed", "cancelled"), record.as_json()
        time.sleep(0.3)
    raise AssertionError(f"job {job_id}: {koala.status(job_id).as_json()}")
