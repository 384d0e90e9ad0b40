"""The whole deployment under faults (issue 11 item 6): every example DAG unpaused and
started the way production starts it (the ensemble by a forcing file dropped into its
inbox, the others through the REST API), one Celery worker SIGKILLed while a task runs
on it (the kill is aimed: it waits until a running task instance's process descends
from that worker), the triggerer restarted while tasks are deferred. Then: every run
succeeded, the task that was killed ran again and succeeded, no site job was started
twice, and the capacity ledger is consistent and holds nothing."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gridcore.config import default_grid
from gridcore.engine.runtime import GridRuntime
from gridcore.sites.local import LocalSite
from gridcore.state.schema import local_jobs
from gridcore.state.store import open_store
from tests.capacity_checks import assert_capacity_invariant
from tests.deployment.deployment import REPO, Deployment

pytestmark = [pytest.mark.deployment, pytest.mark.airflow]

# Every example DAG (one per file in dags/) runs; the ensemble is started by a forcing
# file, the others through the REST API.
EXAMPLE_FILES = sorted((REPO / "dags").glob("*.py"))
FORCED = "ensemble_surge"
FORCING = {"storm": "debby", "members": 6, "processors": [2, 1], "runtime_s": 4}
RUN_TIMEOUT_S = 900.0
# how long the worker stays frozen before its task instances are read (the API server
# commits a report the worker sent just before)
FREEZE_SETTLE_S = 1.0


def wait_until_parsed(deployment: Deployment, timeout_s: float = 300.0) -> tuple[str, ...]:
    """Every example DAG's id, once the dag-processor has parsed every file without an
    import error."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        deployment.check_alive()
        errors = deployment.api("GET", "/importErrors")["import_errors"]
        assert errors == [], errors
        found = [d["dag_id"] for d in deployment.api("GET", "/dags", params={"limit": 100})["dags"]]
        if len(found) >= len(EXAMPLE_FILES):
            assert FORCED in found, found
            return tuple(sorted(found))
        time.sleep(2.0)
    tail = deployment.log_tail("dag-processor")
    raise TimeoutError(f"DAGs not parsed in {timeout_s:.0f} s\n{tail}")


def task_instances(deployment: Deployment, dag_id: str = "~") -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = deployment.api(
        "GET", f"/dags/{dag_id}/dagRuns/~/taskInstances", params={"limit": 1000}
    )["task_instances"]
    return found


def runs_of(deployment: Deployment, dags: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
    return {d: deployment.api("GET", f"/dags/{d}/dagRuns")["dag_runs"] for d in dags}


def drop_forcing(deployment: Deployment) -> None:
    partial = deployment.forcing_dir / f".{FORCING['storm']}.json.partial"
    partial.write_text(json.dumps(FORCING))
    os.rename(partial, deployment.forcing_dir / f"{FORCING['storm']}.json")


def kill_a_worker_running_a_task(
    deployment: Deployment, timeout_s: float = 600.0
) -> dict[str, Any]:
    """Wait until worker1 runs task instances (their processes descend from it) that may
    all be retried, then SIGKILL the worker with every process under it; one task
    instance it ran. A task without retries (the minimal DAG's) fails when its worker
    dies, by Airflow's rule: the worker is not killed while it runs one, nor while one is
    queued (worker1 may have taken it).

    The choice is made with the worker frozen (SIGSTOP on its whole tree): read while it
    runs, a task could finish, or one without retries start, between the read and the
    kill (both seen in CI: a task "killed" that had succeeded on its first try, and the
    minimal DAG's task killed at "Pre Execute")."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        deployment.check_alive()
        if not _running_on(deployment, task_instances(deployment), "worker1"):
            time.sleep(0.5)
            continue
        stopped = deployment.freeze("worker1")
        try:
            # a state report sent just before the freeze lands before the read
            time.sleep(FREEZE_SETTLE_S)
            tis = task_instances(deployment)
            on_worker = _running_on(deployment, tis, "worker1")
            at_risk = [
                ti
                for ti in [*on_worker, *(t for t in tis if t["state"] == "queued")]
                if int(ti.get("max_tries") or 0) == 0
            ]
            if on_worker and not at_risk:
                deployment.kill("worker1")
                return on_worker[0]
        finally:
            if "worker1" in deployment.processes:  # not killed: let it run on
                deployment.thaw(stopped)
        time.sleep(0.5)
    raise TimeoutError(f"no task ran in worker1 within {timeout_s:.0f} s")


def _running_on(
    deployment: Deployment, tis: list[dict[str, Any]], worker: str
) -> list[dict[str, Any]]:
    return [
        ti
        for ti in tis
        if ti["state"] == "running"
        and ti.get("pid")
        and deployment.descends_from(int(ti["pid"]), worker)
    ]


def wait_for_runs(deployment: Deployment, dags: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
    """Each DAG's runs, once every DAG has one and all have finished."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        deployment.check_alive()
        runs = runs_of(deployment, dags)
        if all(rs and all(r["state"] in ("success", "failed") for r in rs) for rs in runs.values()):
            return runs
        time.sleep(3.0)
    states = {d: [r["state"] for r in rs] for d, rs in runs_of(deployment, dags).items()}
    raise TimeoutError(
        f"runs not finished in {RUN_TIMEOUT_S:.0f} s: {states}\n"
        f"--- scheduler ---\n{deployment.log_tail('scheduler')}\n"
        f"--- triggerer ---\n{deployment.log_tail('triggerer')}"
    )


def started_wrappers(workdir: Path) -> int:
    """How many times the local site started this job's command: only a wrapper that
    created its attempt's fence directory writes a pid file there."""
    return sum(1 for pid in workdir.glob("start.*/pid"))


def test_every_dag_succeeds_with_a_worker_killed_and_the_triggerer_restarted(
    deployment: Deployment,
) -> None:
    begun = time.monotonic()
    dags = wait_until_parsed(deployment)
    for dag_id in dags:
        deployment.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
    drop_forcing(deployment)
    for dag_id in dags:
        if dag_id != FORCED:
            deployment.api("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None})

    killed = kill_a_worker_running_a_task(deployment)
    killed_at = time.monotonic() - begun
    deployment.restart("triggerer", "triggerer")

    runs = wait_for_runs(deployment, dags)
    elapsed = time.monotonic() - begun
    states = {d: [r["state"] for r in rs] for d, rs in runs.items()}
    failed = {
        d: [(t["task_id"], t["map_index"], t["state"]) for t in task_instances(deployment, d)]
        for d, s in states.items()
        if s.count("success") != len(s)
    }
    assert not failed, f"runs {states}; task instances {failed}"
    # the forcing file was used by exactly one run (a repeated event's run is skipped)
    members = [t for t in task_instances(deployment, FORCED) if t["task_id"] == "member"]
    assert sorted(t["map_index"] for t in members if t["state"] == "success") == list(
        range(FORCING["members"])
    ), members

    again = [
        t
        for t in task_instances(deployment, killed["dag_id"])
        if (t["task_id"], t["map_index"], t["dag_run_id"])
        == (killed["task_id"], killed["map_index"], killed["dag_run_id"])
    ]
    assert len(again) == 1 and again[0]["state"] == "success", again
    assert again[0]["try_number"] > killed["try_number"], (killed, again)

    # The local sites' rows are brought up to date by whoever looks next (their jobs
    # run detached): look, as a worker would, then read them.
    runtime = GridRuntime(
        default_grid(Path(deployment.env["GRIDCORE_HOME"])),
        open_store(deployment.gridcore_db_url),
    )
    try:
        for site in runtime.grid.sites:
            adapter = runtime.adapter(site.name)
            assert isinstance(adapter, LocalSite)
            adapter.reconcile()
        with runtime.store.begin() as conn:
            jobs = conn.execute(select(local_jobs)).mappings().all()
    finally:
        runtime.store.dispose()
    assert len(jobs) >= FORCING["members"], f"only {len(jobs)} site jobs"
    twice = {
        job["name"]: started_wrappers(Path(job["workdir"]))
        for job in jobs
        if started_wrappers(Path(job["workdir"])) > 1
    }
    assert twice == {}, f"site jobs started more than once: {twice}"
    never = [
        j["name"]
        for j in jobs
        if j["state"] == "completed" and not started_wrappers(Path(j["workdir"]))
    ]
    assert never == [], f"completed jobs without a started wrapper: {never}"
    assert all(job["state"] in ("completed", "cancelled") for job in jobs), [
        (j["name"], j["state"], j["message"]) for j in jobs if j["state"] != "completed"
    ]
    assert_capacity_invariant(deployment.gridcore_db_url, no_live_holds=True)
    print(
        f"deployment: {len(jobs)} site jobs; worker1 killed at {killed_at:.0f} s while it ran"
        f" {killed['dag_id']}.{killed['task_id']}[{killed['map_index']}]; every run done"
        f" at {elapsed:.0f} s"
    )


def test_init_runs_again_and_leaves_the_admin_as_it_was(deployment: Deployment) -> None:
    """docker/airflow-init.sh is safe to re-run (`docker compose up` again): it finds the
    admin it created, although Airflow prints warnings before `users list`'s JSON, and
    leaves the password alone; the deployment's password starts with "-" (see
    Deployment.password), so the first run also passed it as a value, not an option."""
    deployment._run_init()
    log = deployment.log_tail("init", 400)
    assert "gridcore init: admin user 'admin' exists" in log, log
    assert "creating admin user" not in log, log
    assert deployment.login()
