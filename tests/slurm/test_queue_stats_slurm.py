"""VJM Eq. 1's queue-wait history from a real Slurm cluster: every observation through the
runtime folds slurmrestd's ``/jobs`` into ``gc_queue_waits``; the submit and start times
kept are slurmrestd's own, a job cancelled while pending is dropped, and the statistics
follow the rows."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select

from gridcore.config import load_grid
from gridcore.engine import queue_stats
from gridcore.engine.runtime import GridRuntime
from gridcore.model import JobRequest, JobSubmission
from gridcore.policies.coreservation import QueueStats
from gridcore.policies.queue_stats import QueueRecord, estimate_queue_stats
from gridcore.sites.slurm import SlurmSite
from gridcore.state.schema import queue_waits
from gridcore.state.store import open_store
from tests.slurmgrid import SlurmGrid

pytestmark = pytest.mark.slurm

SITE = "gamma"  # one 4-CPU node: a 4-CPU job fills it


@pytest.fixture
def runtime(slurm_grid: SlurmGrid, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GridRuntime:
    for name, value in slurm_grid.env.items():
        monkeypatch.setenv(name, value)
    rt = GridRuntime(
        load_grid(slurm_grid.grid_toml), open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    )
    # Earlier tests share the session grid: start from an idle, empty queue.
    _until(lambda: _gamma_idle(rt))
    return rt


def _gamma_idle(rt: GridRuntime) -> bool:
    rt.refresh()
    row = {r.name: r for r in rt.site_rows()}[SITE]
    return row.idle == row.total and row.external_pending == 0


def _history(rt: GridRuntime) -> dict[str, tuple[bool, float, float | None]]:
    with rt.store.begin() as conn:
        rows = conn.execute(
            select(
                queue_waits.c.site_job_id,
                queue_waits.c.external,
                queue_waits.c.submitted_at,
                queue_waits.c.started_at,
            ).where(queue_waits.c.site == SITE)
        ).all()
    return {r.site_job_id: (r.external, r.submitted_at, r.started_at) for r in rows}


def _slurm_times(site: SlurmSite, job_id: str) -> tuple[float | None, float | None]:
    status = site.status(job_id)
    return status.submitted_at, status.started_at


def test_history_holds_slurmrestds_submit_and_start_times(
    runtime: GridRuntime, slurm_sites: dict[str, SlurmSite], tmp_path: Path
) -> None:
    gamma = slurm_sites[SITE]
    release_a, release_b = tmp_path / "release-a", tmp_path / "release-b"

    def hold(flag: Path) -> str:
        return f"for _ in $(seq 600); do [ -e {flag} ] && exit 0; sleep 0.2; done; exit 1"

    # Other users' jobs: a runs, b and c queue behind it; then one of ours, d, queues too.
    a = gamma.submit(JobSubmission("qs-a", hold(release_a), 4))
    b = gamma.submit(JobSubmission("qs-b", hold(release_b), 4))
    c = gamma.submit(JobSubmission("qs-c", "sleep 1", 4))
    rec = runtime.select(JobRequest("qs-d", 4, 5.0), site=SITE)
    runtime.submit(rec.selection_id, JobSubmission("qs-d", "sleep 1", 4))
    d = str(runtime.record(rec.selection_id).job_id)
    try:
        _until(lambda: gamma.status(a).state.value == "running")
        runtime.refresh()
        hist = _history(runtime)
        assert {j: hist[j] for j in (a, b, c, d)} == {
            a: (True, *_slurm_times(gamma, a)),
            b: (True, _slurm_times(gamma, b)[0], None),
            c: (True, _slurm_times(gamma, c)[0], None),
            d: (False, _slurm_times(gamma, d)[0], None),
        }
        assert _stats(runtime).ql == 3

        gamma.cancel(c)  # cancelled while pending: it must stop counting as waiting
        release_a.touch()  # b starts (d queued after it)
        _until(lambda: gamma.status(b).state.value == "running")
        runtime.refresh()
        hist = _history(runtime)
        assert c not in hist
        assert hist[b] == (True, *_slurm_times(gamma, b))
        assert hist[d][2] is None
        assert _stats(runtime).ql == 1
    finally:
        release_a.touch()
        release_b.touch()
        gamma.cancel(c)
    _until(lambda: all(gamma.status(j).state.finished for j in (a, b, d)), timeout=90)
    runtime.refresh()
    hist = _history(runtime)
    for job_id in (a, b, d):
        assert hist[job_id][1:] == _slurm_times(gamma, job_id), job_id
    # The statistics are the estimator's over the kept rows: none waits any more.
    now = runtime.clock()
    records = [QueueRecord(sub, start) for _, sub, start in hist.values()]
    assert _stats(runtime, now) == estimate_queue_stats(records, now)
    assert _stats(runtime, now).ql == 0


def _stats(rt: GridRuntime, now: float | None = None) -> QueueStats:
    with rt.store.begin() as conn:
        return queue_stats.queue_stats(conn, [SITE], rt.clock() if now is None else now)[SITE]


def _until(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise AssertionError("condition not reached in time")
