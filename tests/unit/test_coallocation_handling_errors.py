"""One bad job never stops the KOALA engine (issue 7 item 4), on SQLite: an unexpected
error while handling one job (here an adapter's unhandled exception, injected at the
site's I/O edge) rolls that job's transaction back and counts against it; after
MAX_HANDLING_ERRORS the job fails with the error's message and its started site jobs are
cancelled, while the other jobs of the same scans go on and complete."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from gridcore.config import default_grid
from gridcore.engine.coallocation import CoAllocationEngine, CoAllocationRecord
from gridcore.engine.runtime import GridRuntime
from gridcore.engine.scan import MAX_HANDLING_ERRORS
from gridcore.model import CoAllocationRequest, Component, RequestKind
from gridcore.policies.claiming import CoAllocationParams
from gridcore.policies.placement import PlacementPolicy
from gridcore.state.schema import coalloc_jobs, local_jobs
from gridcore.state.store import Store, open_store
from tests.barrier_checks import running_center
from tests.capacity_checks import assert_capacity_invariant
from tests.fakes import FaultySite

PARAMS = CoAllocationParams(scan_interval_s=1.0)
# The bad job runs on local-b alone, whose adapter is faulty; the good one never uses it.
BAD = CoAllocationRequest("bad", RequestKind.FIXED, (Component(2, "local-b"),))
GOOD = CoAllocationRequest(
    "good", RequestKind.FIXED, (Component(4, "local-a"), Component(4, "local-c"))
)


def faulty_engine(
    store: Store, home: Path, center: str, **faults: Any
) -> tuple[CoAllocationEngine, FaultySite]:
    base = GridRuntime(default_grid(home), store)
    faulty = FaultySite(base.adapter("local-b"), **faults)
    runtime = GridRuntime(base.grid, store, adapters={"local-b": faulty})
    return CoAllocationEngine(runtime, params=PARAMS, holder="engine", center_url=center), faulty


def scan_until_both_finished(
    koala: CoAllocationEngine, bad: int, good: int, timeout: float = 60.0
) -> tuple[CoAllocationRecord, CoAllocationRecord]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        report = koala.scan()
        assert not report.skipped and not report.lease_lost
        if koala.status(bad).finished and koala.status(good).finished:
            return koala.status(bad), koala.status(good)
        time.sleep(0.1)
    raise AssertionError(f"not both finished: {koala.status(bad)} {koala.status(good)}")


def handling_errors(store: Store, job_id: int) -> int:
    with store.begin() as conn:
        query = select(coalloc_jobs.c.handling_errors).where(coalloc_jobs.c.id == job_id)
        return int(conn.execute(query).scalar_one())


def run_bad_and_good(
    tmp_path: Path, bad_command: str, **faults: Any
) -> tuple[Store, FaultySite, CoAllocationRecord]:
    """The bad job and the good one scanned together until both finished: the good one
    completed, the bad one failed after MAX_HANDLING_ERRORS; returns its record."""
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    with running_center(store) as center:
        koala, faulty = faulty_engine(store, tmp_path, center, **faults)
        bad = koala.submit(BAD, PlacementPolicy.CM, bad_command)
        good = koala.submit(GOOD, PlacementPolicy.CM, "sleep 0.5")
        failed, completed = scan_until_both_finished(koala, bad, good)
    assert completed.state == "completed"
    assert failed.state == "failed"
    assert handling_errors(store, bad) == MAX_HANDLING_ERRORS
    assert handling_errors(store, good) == 0
    assert_capacity_invariant(store, no_live_holds=True)
    return store, faulty, failed


def test_a_job_whose_status_raises_fails_after_n_tries_and_its_site_job_is_cancelled(
    tmp_path: Path,
) -> None:
    store, faulty, failed = run_bad_and_good(
        tmp_path, "sleep 60", status_error=RuntimeError("injected status fault")
    )
    assert failed.message == (
        f"failed after {MAX_HANDLING_ERRORS} errors while handling it:"
        " RuntimeError: injected status fault"
    )
    assert [c.state for c in failed.components] == ["aborted"]
    # The bad job's one site job was started, and cancelled when the job failed.
    (site_job,) = faulty.submitted
    with store.begin() as conn:
        state = conn.execute(
            select(local_jobs.c.state).where(local_jobs.c.id == int(site_job))
        ).scalar_one()
    assert state == "cancelled"
    assert_capacity_invariant(store, no_live_holds=True)


def test_a_job_whose_submission_raises_fails_after_n_tries(tmp_path: Path) -> None:
    _, faulty, failed = run_bad_and_good(
        tmp_path, "true", submit_error=RuntimeError("injected submit fault")
    )
    assert failed.message.endswith("RuntimeError: injected submit fault")
    assert faulty.submitted == []
