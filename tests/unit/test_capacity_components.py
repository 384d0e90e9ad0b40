"""KOALA components are holders of the one capacity ledger (issue 7 item 1): a placement
claims its components' processors by the conditional UPDATE (or is not committed), the
holds end when the sites report the components running or the job ends, and selections
see them. Every test ends with the capacity invariant."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Connection

from gridcore.config import default_grid
from gridcore.engine.coallocation import CoAllocationEngine, CoAllocationRecord
from gridcore.engine.runtime import GridRuntime
from gridcore.model import CoAllocationRequest, Component, RequestKind, SiteSnapshot
from gridcore.policies.claiming import CoAllocationParams
from gridcore.policies.placement import PlacementPolicy
from gridcore.state import capacity
from gridcore.state.capacity import HolderKind, Ledger
from gridcore.state.store import open_store
from tests.barrier_checks import running_center

# 8 + 4 + 4 on local-a (8), local-b (4), local-c (4): every processor of the grid.
SPREAD = CoAllocationRequest(
    "spread", RequestKind.NON_FIXED, (Component(8), Component(4), Component(4))
)


@pytest.fixture
def center(tmp_path: Path) -> Iterator[str]:
    """The VJ center the components' barriers call, on the test's state DB."""
    with running_center(f"sqlite:///{tmp_path}/state.db") as url:
        yield url


def engine(tmp_path: Path, center: str) -> CoAllocationEngine:
    rt = GridRuntime(
        default_grid(tmp_path), open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    )
    return CoAllocationEngine(rt, params=CoAllocationParams(scan_interval_s=1.0), center_url=center)


def component_holds(koala: CoAllocationEngine) -> dict[str, int]:
    with koala.store.begin() as conn:
        return {h.site: h.processors for h in capacity.live_holds(conn, HolderKind.COMPONENT)}


def assert_sound(koala: CoAllocationEngine) -> None:
    with koala.store.begin() as conn:
        assert capacity.check_invariant(conn) == []


def scan_until(koala: CoAllocationEngine, job_id: int, state: str) -> CoAllocationRecord:
    deadline = time.time() + 30
    while time.time() < deadline:
        koala.scan()
        record = koala.status(job_id)
        if record.state == state and (state != "running" or record.started_at is not None):
            return record
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not {state}: {koala.status(job_id).as_json()}")


def test_placed_components_hold_processors_until_the_sites_report_them_running(
    tmp_path: Path,
    center: str,
) -> None:
    koala = engine(tmp_path, center)
    job = koala.submit(SPREAD, PlacementPolicy.WF, "sleep 3")
    koala._claim = lambda now, work, silent: None  # type: ignore[method-assign]  # place only
    koala.scan()
    del koala._claim
    assert koala.status(job).state == "claiming"
    assert component_holds(koala) == {"local-a": 8, "local-b": 4, "local-c": 4}
    with koala.store.begin() as conn:
        # a selection sees them: nothing is free for anyone else
        assert capacity.free_processors(conn) == {"local-a": 0, "local-b": 0, "local-c": 0}
    assert_sound(koala)
    scan_until(koala, job, "running")
    koala.scan()  # its refresh observes the components running: their holds end
    assert koala.status(job).state == "running"
    assert component_holds(koala) == {}
    assert_sound(koala)
    scan_until(koala, job, "completed")
    assert component_holds(koala) == {}
    assert_sound(koala)


def test_a_placement_whose_processors_were_taken_meanwhile_is_not_committed(
    tmp_path: Path,
    center: str,
) -> None:
    """The placement policy decides on a snapshot; a concurrent claimer takes local-b's
    processors before the placement commits: the conditional UPDATE refuses the
    component, nothing of the placement is written, the job stays queued."""
    koala = engine(tmp_path, center)
    job = koala.submit(SPREAD, PlacementPolicy.WF, "true")
    original = koala._clusters
    intruded: list[bool] = []

    def snapshot_then_intruder(conn: Connection, own_job: int | None = None) -> list[SiteSnapshot]:
        snaps = original(conn, own_job)
        if not intruded:
            intruded.append(True)
            assert capacity.claim(conn, HolderKind.PILOT, "intruder", "local-b", 4)
        return snaps

    koala._clusters = snapshot_then_intruder  # type: ignore[method-assign]
    report = koala.scan()
    del koala._clusters
    record = koala.status(job)
    assert intruded and report["placed"] == ()
    assert (record.state, record.epoch, record.components) == ("queued", 0, ())
    assert component_holds(koala) == {}
    assert_sound(koala)
    with koala.store.begin() as conn:
        assert capacity.release(conn, HolderKind.PILOT, "intruder")
    scan_until(koala, job, "completed")
    assert component_holds(koala) == {}
    assert_sound(koala)


def test_cancel_releases_every_component_hold(tmp_path: Path, center: str) -> None:
    koala = engine(tmp_path, center)
    blocker = CoAllocationRequest("late", RequestKind.NON_FIXED, (Component(4), Component(4)))
    job = koala.submit(SPREAD, PlacementPolicy.WF, "sleep 30")
    koala._claim = lambda now, work, silent: None  # type: ignore[method-assign]  # place only
    koala.scan()
    held = component_holds(koala)
    assert held == {"local-a": 8, "local-b": 4, "local-c": 4}
    queued = koala.submit(blocker, PlacementPolicy.WF, "true")
    koala.scan()
    assert koala.status(queued).state == "queued", "the held processors are not free"
    koala.cancel(job)
    koala.cancel(queued)
    assert component_holds(koala) == {}
    with koala.store.begin() as conn:
        released = [
            h
            for h in capacity.live_holds(conn)
            if h.kind is HolderKind.COMPONENT and h.ledger is Ledger.CLAIMED
        ]
    assert released == []
    assert_sound(koala)
