"""KOALA engines on PostgreSQL SIGKILLed mid-submission three times (issue 7 item 3):
two engine processes scan the same queue on local sites; the first three component
submissions kill their engine (after the site accepted the job, before it reached the
site, after again) and a new engine process replaces each one. Every job completes, no
key has two site jobs, no site job is left pending or running, and every site ends idle
and unclaimed (the capacity invariant holds, no hold is live)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

from gridcore.config import default_grid
from gridcore.engine.coallocation import CoAllocationEngine
from gridcore.engine.runtime import GridRuntime
from gridcore.model import CoAllocationRequest, Component, JobSubmission, RequestKind
from gridcore.policies.claiming import CoAllocationParams
from gridcore.policies.placement import PlacementPolicy
from gridcore.sites.local import LocalSite
from gridcore.state import capacity
from gridcore.state.schema import local_jobs
from gridcore.state.store import Store, open_store
from tests.barrier_checks import running_center

pytestmark = pytest.mark.postgres

# Each job needs two sites (4 + 4 processors); the grid (8 + 4 + 4) runs two at a time.
JOBS = [
    CoAllocationRequest(f"pair{i}", RequestKind.NON_FIXED, (Component(4), Component(4)))
    for i in range(4)
]
KILLS = ("1-after-accepted", "2-before-the-site", "3-after-accepted")
PARAMS = CoAllocationParams(scan_interval_s=0.5)


def _claim_kill(kills: Path) -> str | None:
    """The next kill not yet taken by any engine (atomic across processes)."""
    for name in KILLS:
        try:
            os.close(os.open(kills / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        return name
    return None


def _engine(url: str, center: str, home: str, holder: str, kills: str) -> None:
    store = open_store(url)
    koala = CoAllocationEngine(
        GridRuntime(default_grid(Path(home)), store),
        params=PARAMS,
        holder=holder,
        center_url=center,
        lease_s=1.0,
    )
    submit = LocalSite.submit

    def aimed(self: LocalSite, job: JobSubmission) -> str:
        kill = _claim_kill(Path(kills))
        if kill is not None and "before" in kill:
            os.kill(os.getpid(), signal.SIGKILL)
        job_id = submit(self, job)
        if kill is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return job_id

    LocalSite.submit = aimed  # type: ignore[method-assign]
    stop = Path(kills) / "stop"
    while not stop.exists():
        koala.scan()
        time.sleep(0.1)
    store.dispose()


def test_engines_killed_mid_submission_three_times_lose_and_double_nothing(
    pg_url: str,
) -> None:
    home = tempfile.mkdtemp(prefix="gc-kill-")
    kills = Path(tempfile.mkdtemp(prefix="gc-kills-"))
    store = open_store(pg_url, upgrade=True)
    with running_center(store) as center:
        _run_killed_engines(pg_url, center, home, kills, store)


def _run_killed_engines(pg_url: str, center: str, home: str, kills: Path, store: Store) -> None:
    client = CoAllocationEngine(
        GridRuntime(default_grid(Path(home)), store), params=PARAMS, center_url=center
    )
    job_ids = [client.submit(job, PlacementPolicy.WF, "sleep 0.3") for job in JOBS]

    ctx = multiprocessing.get_context("spawn")
    started = 0

    def spawn() -> multiprocessing.process.BaseProcess:
        nonlocal started
        started += 1
        proc = ctx.Process(target=_engine, args=(pg_url, center, home, f"e{started}", str(kills)))
        proc.start()
        return proc

    engines = [spawn(), spawn()]
    died: list[int | None] = []
    deadline = time.time() + 240
    while time.time() < deadline:
        for i, proc in enumerate(engines):
            if proc.exitcode is not None:
                died.append(proc.exitcode)
                engines[i] = spawn()
        if all(client.status(j).finished for j in job_ids):
            break
        time.sleep(0.2)
    (kills / "stop").touch()
    for proc in engines:
        proc.join(60)
        assert proc.exitcode == 0, proc

    records = [client.status(j) for j in job_ids]
    assert [r.state for r in records] == ["completed"] * len(JOBS), [r.as_json() for r in records]
    assert died == [-signal.SIGKILL] * len(KILLS), died
    client.runtime.refresh()
    with store.begin() as conn:
        jobs = conn.execute(select(local_jobs.c.key, local_jobs.c.state)).all()
        violations = capacity.check_invariant(conn)
        live = capacity.live_holds(conn)
        totals = capacity.totals(conn)
    store.dispose()
    per_key = Counter(key for key, _ in jobs)
    assert None not in per_key and set(per_key.values()) == {1}, per_key
    assert not [j for j in jobs if j.state in ("pending", "running")], jobs
    assert violations == [] and live == [], (violations, live)
    assert all(v == (0, 0, 0, 0) for v in totals.values()), totals
