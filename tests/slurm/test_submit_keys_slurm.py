"""Exactly-once submission on the real Slurm grid (issue 7 item 3): the key travels in the
job's comment, a retry after a worker died once Slurm had accepted the job adopts that
job, and refresh cancels a job with our key whose holder is gone. Checked against
slurmrestd's own ``GET /jobs``."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from gridcore.config import load_grid
from gridcore.engine.runtime import GridRuntime
from gridcore.model import JobRequest, JobState, JobSubmission
from gridcore.sites.keys import selection_key
from gridcore.sites.slurm import SlurmSite
from gridcore.state import capacity
from gridcore.state.store import open_store
from tests.capacity_checks import assert_capacity_invariant
from tests.slurmgrid import SlurmCluster, SlurmGrid

pytestmark = pytest.mark.slurm


@pytest.fixture
def runtime(slurm_grid: SlurmGrid, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GridRuntime:
    for name, value in slurm_grid.env.items():
        monkeypatch.setenv(name, value)
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    return GridRuntime(load_grid(slurm_grid.grid_toml), store)


def slurm_jobs_with(cluster: SlurmCluster, key: str) -> list[dict[str, Any]]:
    """slurmrestd's own listing, filtered by the job comment (no gridcore code)."""
    headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": cluster.token}
    url = f"{cluster.rest_url}/slurm/{cluster.api_version}/jobs"
    body = requests.get(url, headers=headers, timeout=15).json()
    return [j for j in body["jobs"] if j.get("comment") == key]


def _submit_and_die_once_accepted(env: dict[str, str], grid_toml: str, db: str, sid: int) -> None:
    os.environ.update(env)
    rt = GridRuntime(load_grid(grid_toml), open_store(db))
    accept = SlurmSite.submit

    def accepted_then_killed(self: SlurmSite, job: JobSubmission) -> str:
        job_id = accept(self, job)
        os.kill(os.getpid(), signal.SIGKILL)  # Slurm has the job; nothing recorded it
        return job_id

    SlurmSite.submit = accepted_then_killed  # type: ignore[method-assign]
    rt.submit(sid, JobSubmission("adopt-me", "sleep 3", 2))


@pytest.mark.parametrize("site", ["alpha", "beta", "gamma"], ids=["26.05", "22.05", "24.11"])
def test_a_retry_after_the_worker_died_adopts_the_job_slurm_accepted(
    runtime: GridRuntime, slurm_grid: SlurmGrid, site: str
) -> None:
    """On every release: one Slurm job per key, whatever moment the worker died at."""
    sid = runtime.select(JobRequest("adopt-me", 2, 3.0), site=site).selection_id
    key = selection_key(runtime.install_id, sid)
    ctx = multiprocessing.get_context("spawn")
    worker = ctx.Process(
        target=_submit_and_die_once_accepted,
        args=(slurm_grid.env, str(slurm_grid.grid_toml), str(runtime.store.engine.url), sid),
    )
    worker.start()
    worker.join(60)
    assert worker.exitcode == -signal.SIGKILL
    cluster = slurm_grid.cluster(site)
    accepted = slurm_jobs_with(cluster, key)
    assert len(accepted) == 1 and runtime.record(sid).job_id is None

    record = runtime.submit(sid, JobSubmission("adopt-me", "sleep 3", 2))  # the retry

    assert record.job_id == str(accepted[0]["job_id"])
    assert [j["job_id"] for j in slurm_jobs_with(cluster, key)] == [accepted[0]["job_id"]]
    deadline = time.time() + 60
    while not runtime.poll(sid).finished and time.time() < deadline:
        time.sleep(0.5)
    assert runtime.record(sid).state == "completed"
    runtime.refresh()
    with runtime.store.begin() as conn:
        assert capacity.totals(conn)[site] == (0, 0, 0, 0)
    assert_capacity_invariant(runtime.store, no_live_holds=True)


def test_refresh_cancels_a_job_with_our_key_whose_selection_is_gone(
    runtime: GridRuntime, slurm_grid: SlurmGrid
) -> None:
    gone = runtime.select(JobRequest("orphan", 1, 60.0), site="gamma").selection_id
    waiting = runtime.select(JobRequest("waiting", 1, 60.0), site="gamma").selection_id
    gamma = runtime.adapter("gamma")
    orphan = gamma.submit(
        JobSubmission("orphan", "sleep 60", 1, key=selection_key(runtime.install_id, gone))
    )
    live = gamma.submit(
        JobSubmission("waiting", "sleep 60", 1, key=selection_key(runtime.install_id, waiting))
    )
    # Another state database's key for the same selection id: not ours to judge.
    foreign = gamma.submit(JobSubmission("foreign", "sleep 60", 1, key=f"gc-0123456789ab-s{gone}"))
    try:
        runtime.cancel(gone)  # the selection ends; its worker never recorded the job
        runtime.refresh()
        # slurmctld ends a cancelled job asynchronously: wait for it to end, then check how.
        deadline = time.time() + 30
        while not gamma.status(orphan).state.finished and time.time() < deadline:
            time.sleep(0.2)
        assert gamma.status(orphan).state is JobState.CANCELLED
        assert gamma.status(foreign).state is not JobState.CANCELLED
        assert gamma.status(live).state is not JobState.CANCELLED
        assert runtime.record(waiting).job_id == live, "a waiting selection adopts its job"
    finally:
        runtime.cancel(waiting)
        gamma.cancel(foreign)
    assert_capacity_invariant(runtime.store, no_live_holds=True)


def test_a_second_slurm_job_with_a_recorded_selection_key_is_cancelled(
    runtime: GridRuntime, slurm_grid: SlurmGrid
) -> None:
    """Slurm does not refuse a second job with the same comment (two workers racing past
    the look-up): the selection keeps the job it recorded, refresh cancels the other."""
    sid = runtime.select(JobRequest("twice", 1, 60.0), site="alpha").selection_id
    kept = runtime.submit(sid, JobSubmission("twice", "sleep 60", 1)).job_id
    assert kept is not None
    alpha = runtime.adapter("alpha")
    key = selection_key(runtime.install_id, sid)
    twin = alpha.submit(JobSubmission("twice", "sleep 60", 1, key=key))
    try:
        assert sorted(j["job_id"] for j in slurm_jobs_with(slurm_grid.cluster("alpha"), key)) == [
            int(kept),
            int(twin),
        ]
        runtime.refresh()
        deadline = time.time() + 30
        while not alpha.status(twin).state.finished and time.time() < deadline:
            time.sleep(0.2)
        assert alpha.status(twin).state is JobState.CANCELLED
        assert alpha.status(kept).state is not JobState.CANCELLED
        assert runtime.record(sid).job_id == kept
    finally:
        runtime.cancel(sid)
    assert_capacity_invariant(runtime.store, no_live_holds=True)
