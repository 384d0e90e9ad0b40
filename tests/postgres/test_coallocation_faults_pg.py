"""One bad job never stops the KOALA engine, with a real PostgreSQL DataError (issue 7
item 4): a site whose job ids are longer than ``gc_coalloc_components.site_job_id``
(64 characters) makes recording the submission fail in the database. SQLite accepts the
value; PostgreSQL refuses it, which used to abort every scan and re-queue the job with a
new epoch for ever."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

from gridcore.config import default_grid
from gridcore.engine.coallocation import CoAllocationEngine
from gridcore.engine.runtime import GridRuntime
from gridcore.engine.scan import MAX_HANDLING_ERRORS
from gridcore.model import CoAllocationRequest, Component, RequestKind
from gridcore.policies.claiming import CoAllocationParams
from gridcore.policies.placement import PlacementPolicy
from gridcore.state.store import open_store
from tests.barrier_checks import running_center
from tests.capacity_checks import assert_capacity_invariant
from tests.fakes import FaultySite

pytestmark = pytest.mark.postgres

BAD = CoAllocationRequest("bad", RequestKind.FIXED, (Component(2, "local-b"),))
GOOD = CoAllocationRequest(
    "good", RequestKind.FIXED, (Component(4, "local-a"), Component(4, "local-c"))
)


def test_a_database_error_fails_one_job_and_the_others_complete(pg_url: str) -> None:
    store = open_store(pg_url, upgrade=True)
    home = Path(tempfile.mkdtemp(prefix="gc-faults-"))
    base = GridRuntime(default_grid(home), store)
    faulty = FaultySite(base.adapter("local-b"), job_id_suffix="-" + "x" * 80)
    with running_center(store) as center:
        koala = CoAllocationEngine(
            GridRuntime(base.grid, store, adapters={"local-b": faulty}),
            params=CoAllocationParams(scan_interval_s=1.0),
            center_url=center,
        )
        bad = koala.submit(BAD, PlacementPolicy.CM, "true")
        good = koala.submit(GOOD, PlacementPolicy.CM, "true")
        deadline = time.time() + 90
        while not (koala.status(bad).finished and koala.status(good).finished):
            assert time.time() < deadline, (koala.status(bad), koala.status(good))
            report = koala.scan()
            assert not report.skipped and not report.lease_lost
            time.sleep(0.1)
    try:
        assert koala.status(good).state == "completed"
        failed = koala.status(bad)
        assert failed.state == "failed"
        assert failed.message == (
            f"failed after {MAX_HANDLING_ERRORS} errors while handling it:"
            " StringDataRightTruncation: value too long for type character varying(64)"
        )
        # Its one site job was found again by its key (and its id again refused).
        assert len(faulty.submitted) == 1
        assert_capacity_invariant(store, no_live_holds=True)
    finally:
        store.dispose()
