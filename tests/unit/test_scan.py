"""The scanning engine base (gridcore.engine.scan), the same for KOALA's and VJM's engines
(issue 23 item 1): a job's handling error is counted inside the scan's fence (a scan
that lost its lease counts nothing), the job fails after MAX_HANDLING_ERRORS with one
message, cut at one length, and another holder's lease skips the scan. On fake sites:
the steps here are the test's, not the engines'."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Table, select

from gridcore.config import default_grid
from gridcore.engine.coallocation import CoAllocationEngine
from gridcore.engine.coreservation import CoReservationEngine, CoReservationParams
from gridcore.engine.lease import Grant, Lease
from gridcore.engine.runtime import GridRuntime
from gridcore.engine.scan import ERROR_TEXT_CHARS, MAX_HANDLING_ERRORS, FencedScan, ScanLog
from gridcore.model import CoAllocationRequest, Component, CoReservationRequest, RequestKind
from gridcore.policies.claiming import CoAllocationParams
from gridcore.policies.placement import PlacementPolicy
from gridcore.state.schema import coalloc_jobs, reservations
from gridcore.state.store import open_store
from tests.fakes import FakeSite

CENTER = "http://127.0.0.1:9"
NOW = 1_000_000.0

Engine = CoAllocationEngine | CoReservationEngine


def _koala(runtime: GridRuntime) -> tuple[Engine, int, Table]:
    engine = CoAllocationEngine(
        runtime,
        params=CoAllocationParams(scan_interval_s=1.0),
        center_url=CENTER,
        lease_s=5.0,
        renew_lease=False,
    )
    request = CoAllocationRequest("one", RequestKind.FIXED, (Component(2, "local-a"),))
    return engine, engine.submit(request, PlacementPolicy.WF, "true"), coalloc_jobs


def _vjm(runtime: GridRuntime) -> tuple[Engine, int, Table]:
    engine = CoReservationEngine(runtime, CENTER, CoReservationParams(lease_s=5.0))
    job_id = engine.submit(CoReservationRequest("one", "true", 1, sites=("local-b",)))
    return engine, job_id, reservations


@pytest.fixture(params=[_koala, _vjm], ids=["koala", "vjm"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Engine, int, Table]]:
    grid = default_grid(tmp_path)
    fakes = {s.name: FakeSite(s, clock=lambda: NOW) for s in grid.sites}
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    make: Callable[[GridRuntime], tuple[Engine, int, Table]] = request.param
    yield make(GridRuntime(grid, store, adapters=fakes, clock=lambda: NOW))
    store.dispose()


def _errors_and_state(engine: Engine, table: Table, job_id: int) -> tuple[int, str, str]:
    with engine.store.begin() as conn:
        row = conn.execute(
            select(table.c.handling_errors, table.c.state, table.c.message).where(
                table.c.id == job_id
            )
        ).one()
    return row.handling_errors, row.state, row.message or ""


def _failing(
    scanner: FencedScan, job_id: int, error: Exception
) -> Callable[[Grant, ScanLog], None]:
    def steps(_grant: Grant, work: ScanLog) -> None:
        with scanner.handling(job_id, work):
            raise error

    return steps


def test_a_job_fails_after_max_handling_errors_with_one_message(
    engine: tuple[Engine, int, Table],
) -> None:
    eng, job_id, table = engine
    long = RuntimeError("x" * (3 * ERROR_TEXT_CHARS))
    for n in range(1, MAX_HANDLING_ERRORS + 1):
        report = eng.scanner.run(NOW + n, _failing(eng.scanner, job_id, long))
        assert not report.skipped and not report.lease_lost
        assert report["failed"] == ((job_id,) if n == MAX_HANDLING_ERRORS else ())
    errors, state, message = _errors_and_state(eng, table, job_id)
    assert (errors, state) == (MAX_HANDLING_ERRORS, "failed")
    cut = f"RuntimeError: {'x' * (3 * ERROR_TEXT_CHARS)}"[:ERROR_TEXT_CHARS]
    assert message == f"failed after {MAX_HANDLING_ERRORS} errors while handling it: {cut}"


def test_a_scan_that_lost_its_lease_counts_no_handling_error(
    engine: tuple[Engine, int, Table],
) -> None:
    eng, job_id, table = engine
    lease = eng.scanner.lease
    other = Lease(eng.store, lease.name, "other", lease.length_s, lambda: NOW)

    def steps(_grant: Grant, work: ScanLog) -> None:
        with eng.scanner.handling(job_id, work):
            assert other.take(NOW + 100) is not None  # ours expired: taken over
            raise RuntimeError("while the lease changed hands")

    report = eng.scanner.run(NOW, steps)
    assert report.lease_lost and report["failed"] == ()
    assert _errors_and_state(eng, table, job_id)[0] == 0


def test_another_holders_lease_skips_the_scan(engine: tuple[Engine, int, Table]) -> None:
    eng, _job_id, _table = engine
    lease = eng.scanner.lease
    assert Lease(eng.store, lease.name, "other", 60.0, lambda: NOW).take(NOW) is not None
    report = eng.scan(NOW + 1)
    assert report.skipped and not report.lease_lost
    assert set(report.events) == set(eng.scanner.events) and not any(report.events.values())
