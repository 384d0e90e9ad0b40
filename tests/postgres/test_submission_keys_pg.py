"""Submission keys on PostgreSQL: workers racing to submit the same key to one local
site get one job between them (the unique key column decides; the loser of the insert
returns the winner's job), and a worker SIGKILLed after the site accepted a selection's
job leaves a retry that adopts it."""

from __future__ import annotations

import multiprocessing
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from gridcore.config import default_grid
from gridcore.engine.runtime import GridRuntime
from gridcore.experiments.bench_selection import pg_schema
from gridcore.model import JobRequest, JobSubmission
from gridcore.sites.keys import selection_key
from gridcore.sites.local import LocalSite
from gridcore.state import capacity
from gridcore.state.schema import local_jobs
from gridcore.state.store import open_store

pytestmark = pytest.mark.postgres

KEY = "gc-0123456789ab-s1"


def _race(url: str, home: str, start: Any, out: Any) -> None:
    rt = GridRuntime(default_grid(Path(home)), open_store(url))
    site = rt.adapter("local-a")
    start.wait(30)
    out.put(site.submit(JobSubmission("same", "sleep 0.2", 1, key=KEY)))
    rt.store.dispose()


def test_workers_racing_on_one_key_get_one_job(pg_url: str) -> None:
    home = tempfile.mkdtemp(prefix="gc-race-")
    store = open_store(pg_url, upgrade=True)
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    workers = [ctx.Process(target=_race, args=(pg_url, home, start, out)) for _ in range(6)]
    for p in workers:
        p.start()
    time.sleep(1.5)  # every worker imported, connected and waiting on the event
    start.set()
    ids = {out.get(timeout=60) for _ in workers}
    for p in workers:
        p.join(30)
        assert p.exitcode == 0
    with store.begin() as conn:
        rows = conn.execute(select(func.count()).select_from(local_jobs)).scalar_one()
    store.dispose()
    assert len(ids) == 1 and rows == 1, (ids, rows)


def _accept_then_die(url: str, home: str, sid: int) -> None:
    rt = GridRuntime(default_grid(Path(home)), open_store(url))
    accept = LocalSite.submit

    def accepted_then_killed(self: LocalSite, job: JobSubmission) -> str:
        accept(self, job)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

    LocalSite.submit = accepted_then_killed  # type: ignore[method-assign]
    rt.submit(sid, JobSubmission("victim", "sleep 0.2", 2))


def test_a_retry_after_a_worker_died_adopts_the_accepted_job(pg_url: str) -> None:
    home = tempfile.mkdtemp(prefix="gc-adopt-")
    rt = GridRuntime(default_grid(Path(home)), open_store(pg_url, upgrade=True))
    sid = rt.select(JobRequest("victim", 2, 1.0), site="local-b").selection_id
    ctx = multiprocessing.get_context("spawn")
    worker = ctx.Process(target=_accept_then_die, args=(pg_url, home, sid))
    worker.start()
    worker.join(60)
    assert worker.exitcode == -signal.SIGKILL
    record = rt.submit(sid, JobSubmission("victim", "sleep 0.2", 2))  # the retry
    with rt.store.begin() as conn:
        keys = list(conn.execute(select(local_jobs.c.key)).scalars())
    assert keys == [selection_key(rt.install_id, sid)]
    deadline = time.time() + 60
    while not rt.poll(sid).finished and time.time() < deadline:
        time.sleep(0.1)
    assert rt.record(sid).state == "completed" and record.job_id is not None
    rt.refresh()
    with rt.store.begin() as conn:
        assert capacity.check_invariant(conn) == [] and capacity.live_holds(conn) == []
    rt.store.dispose()


def test_a_worker_killed_after_any_commit_submits_one_job_on_postgresql(
    pg_url: str, tmp_path: Path
) -> None:
    """The SQLite kill test's every-commit walk, each point on a fresh schema."""
    from tests.postgres.conftest import PG_URL
    from tests.unit.test_submit_kills import kill_after_each_commit

    points = kill_after_each_commit(tmp_path, lambda: pg_schema(PG_URL))
    assert points >= 5
