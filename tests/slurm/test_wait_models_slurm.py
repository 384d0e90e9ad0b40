"""The live wait model on a real Slurm cluster (issue 22 item 5): another user's job holds
gamma's node and another of theirs waits behind it with a time limit; once Slurm's
backfill scheduler has planned the waiting one, a decision's reason cites the model's
forecast (from slurmrestd's ``/jobs``: limits, users, start times) and, beside it,
Slurm's own estimate (the pending job's ``start_time``). Once the waiting job has started,
the next decision's forecast has a conformal bound, in this engine and in a new one: the
model forecast that job when an observation showed it pending and stored the forecast
with the site's history, and its start gave the residual."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gridcore.config import load_grid
from gridcore.engine.runtime import GridRuntime
from gridcore.model import JobRequest, JobState
from gridcore.sites.slurm import SlurmSite
from gridcore.state.schema import selections
from gridcore.state.store import open_store
from tests.slurmgrid import SlurmCluster, SlurmGrid

pytestmark = pytest.mark.slurm

SITE = "gamma"  # one 4-CPU node: a 4-CPU job fills it
OTHER_USER = "nobody"


def _until(condition: Callable[[], bool], timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(1.0)


def _as_other_user(cluster: SlurmCluster, tmp: Path, name: str, minutes: int) -> str:
    """A 4-CPU job of ``OTHER_USER`` with a time limit, by the cluster's own sbatch."""
    argv = [
        "runuser", "-u", OTHER_USER, "--", "sbatch", "--parsable", f"--job-name={name}",
        f"--chdir={tmp}", "--output=/dev/null", "-n", "4", f"--time={minutes}",
        "--wrap", "sleep 600",
    ]  # fmt: skip
    done = subprocess.run(
        cluster.cli_argv(argv), capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";", 1)[0]


def test_a_decisions_reason_cites_the_models_forecast_and_slurms_estimate(
    slurm_grid: SlurmGrid,
    slurm_sites: dict[str, SlurmSite],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in slurm_grid.env.items():
        monkeypatch.setenv(name, value)
    rt = GridRuntime(
        load_grid(slurm_grid.grid_toml), open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    )
    cluster = next(c for c in slurm_grid.clusters if c.name == SITE)
    gamma = slurm_sites[SITE]
    # no live job (earlier tests' finished jobs stay listed for Slurm's MinJobAge)
    _until(
        lambda: not [j for j in gamma.observe().jobs if not j.state.finished],
        what=f"{SITE}'s queue empty",
    )
    # the other user's jobs run here: not under tmp_path, whose parents only we may enter
    workdir = Path(tempfile.mkdtemp(prefix="gridcore-wm-"))
    workdir.chmod(0o777)
    running = _as_other_user(cluster, workdir, "wm-running", 10)
    waiting = _as_other_user(cluster, workdir, "wm-waiting", 5)
    try:

        def planned() -> bool:
            jobs = {j.job_id: j for j in gamma.observe().jobs}
            return (
                jobs[running].state is JobState.RUNNING and jobs[waiting].start_estimate is not None
            )

        _until(planned, what="Slurm's backfill plan for the waiting job")
        jobs = {j.job_id: j for j in gamma.observe().jobs}
        assert (jobs[waiting].user, jobs[waiting].time_limit_s) == (OTHER_USER, 300.0)
        started = jobs[running].started_at
        estimate = jobs[waiting].start_estimate
        assert started is not None and estimate is not None
        rec = rt.select(JobRequest("wm-ours", 4, 60.0), among=[SITE], max_age_s=0)
        now = rec.selected_at
        note = rec.reasons[-1]
        match = re.match(
            rf"queue delay at site {SITE}: (\d+) s by wait model predicted_backfill \(.*\);"
            rf" Slurm's backfill plan starts the 1 pending jobs ahead that it has planned"
            rf" by \+(\d+) s$",
            note,
        )
        assert match, rec.reasons
        # no history of the other user's run times: their limits plan the queue, so ours
        # starts when the waiting job's 5 minutes end after the running job's 10
        assert float(match.group(1)) == pytest.approx(started + 600 + 300 - now, abs=5)
        assert float(match.group(2)) == pytest.approx(estimate - now, abs=2)
        assert "no residual yet in its bin" in note
        rt.cancel(rec.selection_id)
        # the live bound: that observation showed the waiting job pending, so the model
        # forecast it; once it is seen started, the next model has its residual
        gamma.cancel(running)
        _until(
            lambda: {j.job_id: j.state for j in gamma.observe().jobs}[waiting] is JobState.RUNNING,
            what="the waiting job started",
        )
        again = rt.select(JobRequest("wm-ours-2", 4, 60.0), among=[SITE], max_age_s=0)
        bound = re.search(
            r"by wait model predicted_backfill, bound (\d+) s at 0.95 \(.*;"
            r" 1 residuals in its bin, too few residuals: the largest \+(\d+) s\)",
            again.reasons[-1],
        )
        assert bound, again.reasons
        rt.cancel(again.selection_id)
        # another engine process (an Airflow task's) rebuilds the model from the stored
        # history, forecasts included: the same residual, the same bound's basis
        other = GridRuntime(
            load_grid(slurm_grid.grid_toml), open_store(f"sqlite:///{tmp_path}/state.db")
        )
        third = other.select(JobRequest("wm-ours-3", 4, 60.0), among=[SITE], max_age_s=0)
        assert "1 residuals in its bin, too few residuals: the largest" in third.reasons[-1]
        other.cancel(third.selection_id)
        # gridcore submit --test-only's question: the same forecast, nothing recorded
        _, forecasts = other.estimate(JobRequest("wm-test-only", 4, 60.0), among=[SITE])
        assert forecasts[SITE].bound_s is not None
        with other.store.begin() as conn:
            count = conn.execute(select(func.count()).select_from(selections)).scalar_one()
        assert count == 3  # wm-ours, wm-ours-2, wm-ours-3
    finally:
        for job_id in (waiting, running):
            gamma.cancel(job_id)
        shutil.rmtree(workdir, ignore_errors=True)
