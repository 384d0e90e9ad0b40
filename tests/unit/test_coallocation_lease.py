"""The fenced scan lease (issue 7 item 2) on SQLite: a token that grows whenever the lease
changes hands, transitions that commit only while their scan's token is current, and
renewal that keeps a slow but live scan's lease."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select

from gridcore.config import default_grid
from gridcore.engine.coallocation import CoAllocationEngine
from gridcore.engine.lease import Lease, LeaseLost
from gridcore.engine.runtime import GridRuntime
from gridcore.engine.scan import ScanReport
from gridcore.model import CoAllocationRequest, Component, RequestKind
from gridcore.policies.claiming import CoAllocationParams
from gridcore.policies.placement import PlacementPolicy
from gridcore.state.schema import coalloc_components, coalloc_jobs, leases, local_jobs
from gridcore.state.store import Store, open_store
from tests.barrier_checks import running_center
from tests.capacity_checks import assert_capacity_invariant
from tests.fakes import FaultySite
from tests.lease_checks import assert_a_retaken_lease_fences_the_old_grant

PARAMS = CoAllocationParams(scan_interval_s=1.0)
# Two components; component 0 goes to local-a, whose submissions the test holds.
PAIR = CoAllocationRequest(
    "pair", RequestKind.FIXED, (Component(2, "local-a"), Component(2, "local-b"))
)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_token_grows_when_the_lease_changes_hands_and_only_then(store: Store) -> None:
    clock = Clock(100.0)
    a = Lease(store, "scan", "a", 10.0, clock)
    b = Lease(store, "scan", "b", 10.0, clock)
    first = a.take(100.0)
    assert first is not None and (first.token, first.index) == (1, 0)
    renewed = a.take(105.0)  # our own valid lease: same token, next scan index
    assert renewed is not None and (renewed.token, renewed.index) == (1, 1)
    assert b.take(110.0) is None  # held until 115
    taken = b.take(116.0)  # expired: taken over
    assert taken is not None and (taken.token, taken.index) == (2, 2)
    b.release()
    again = b.take(117.0)  # released leases are expired leases: a new token
    assert again is not None and again.token == 3
    assert_capacity_invariant(store, no_live_holds=True)


def test_a_fenced_transaction_of_a_lost_lease_commits_nothing(store: Store) -> None:
    clock = Clock(100.0)
    a = Lease(store, "scan", "a", 10.0, clock)
    b = Lease(store, "scan", "b", 10.0, clock)
    grant = a.take(100.0)
    assert grant is not None
    with a.transaction(grant) as conn:  # held: commits
        conn.execute(insert(leases).values(name="marker-1", holder="a", expires_at=0.0))
    assert b.take(200.0) is not None
    with (
        pytest.raises(LeaseLost, match="token 1 is no longer current"),
        a.transaction(grant) as conn,
    ):
        conn.execute(insert(leases).values(name="marker-2", holder="a", expires_at=0.0))
    with pytest.raises(LeaseLost):
        a.renew(grant)
    with store.begin() as conn:
        names = set(conn.execute(select(leases.c.name)).scalars())
        holder, token = conn.execute(
            select(leases.c.holder, leases.c.token).where(leases.c.name == "scan")
        ).one()
    assert names == {"scan", "marker-1"}
    assert (holder, token) == ("b", 2)
    assert_capacity_invariant(store, no_live_holds=True)


def test_the_same_holder_retaking_its_expired_lease_fences_its_old_grant(store: Store) -> None:
    assert_a_retaken_lease_fences_the_old_grant(store)


def test_fenced_renewal_extends_and_never_shortens(store: Store) -> None:
    clock = Clock(100.0)
    a = Lease(store, "scan", "a", 10.0, clock)
    grant = a.take(150.0)  # a scan run with an explicit later "now": held until 160
    assert grant is not None
    a.renew(grant)  # clock 100: 110 < 160, kept at 160
    clock.now = 158.0
    a.renew(grant)  # 168
    with store.begin() as conn:
        expires = conn.execute(select(leases.c.expires_at)).scalar_one()
    assert expires == 168.0
    assert_capacity_invariant(store, no_live_holds=True)


# -- the KOALA scan under the fenced lease --------------------------------------------


@pytest.fixture
def center(tmp_path: Path) -> Iterator[str]:
    """The VJ center the components' barriers call, on the test's state DB."""
    with running_center(f"sqlite:///{tmp_path}/state.db") as url:
        yield url


def gated_engine(
    tmp_path: Path, center: str, holder: str, gate: threading.Event, **kwargs: Any
) -> tuple[CoAllocationEngine, FaultySite]:
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    base = GridRuntime(default_grid(tmp_path), store)
    slow = FaultySite(base.adapter("local-a"), gate=gate)
    runtime = GridRuntime(base.grid, store, adapters={"local-a": slow})
    koala = CoAllocationEngine(runtime, params=PARAMS, holder=holder, center_url=center, **kwargs)
    return koala, slow


def other_engine(tmp_path: Path, center: str, holder: str, **kwargs: Any) -> CoAllocationEngine:
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    return CoAllocationEngine(
        GridRuntime(default_grid(tmp_path), store),
        params=PARAMS,
        holder=holder,
        center_url=center,
        **kwargs,
    )


def scan_in_thread(koala: CoAllocationEngine) -> tuple[threading.Thread, list[ScanReport]]:
    reports: list[ScanReport] = []
    thread = threading.Thread(target=lambda: reports.append(koala.scan()))
    thread.start()
    return thread, reports


def rows(koala: CoAllocationEngine) -> tuple[list[Any], list[Any]]:
    with koala.store.begin() as conn:
        jobs = [tuple(r) for r in conn.execute(select(coalloc_jobs).order_by(coalloc_jobs.c.id))]
        parts = [
            tuple(r)
            for r in conn.execute(
                select(coalloc_components).order_by(
                    coalloc_components.c.job_id, coalloc_components.c.idx
                )
            )
        ]
    return jobs, parts


def cancel_local_jobs(koala: CoAllocationEngine) -> None:
    with koala.store.begin() as conn:
        found = conn.execute(select(local_jobs.c.site, local_jobs.c.id)).all()
    for site, job_id in found:
        koala.runtime.adapter(site).cancel(str(job_id))


def test_a_scan_whose_lease_was_taken_over_commits_no_transition_after(
    tmp_path: Path, center: str
) -> None:
    gate = threading.Event()
    # A stalled scanner: its renewals stopped with it (a paused process).
    slow, site = gated_engine(tmp_path, center, "slow", gate, lease_s=0.5, renew_lease=False)
    job_id = slow.submit(PAIR, PlacementPolicy.CM, "true")
    thread, reports = scan_in_thread(slow)
    try:
        assert site.entered.wait(60), "the scan never reached local-a's submission"
        before = rows(slow)
        held = slow.status(job_id)
        assert held.state == "running"
        assert [c.state for c in held.components] == ["submitting", "submitting"]
        other = other_engine(tmp_path, center, "other", lease_s=0.5)
        taken = other.scanner.lease.take(time.time() + 1.0)  # after the slow scan's lease expired
        assert taken is not None and taken.token == 2
    finally:
        gate.set()
        thread.join(60)
    try:
        (report,) = reports
        assert report.lease_lost and any("lost" in r for r in report.reasons)
        # local-a has the job (adopted later by its key), but the slow scan recorded
        # nothing after the take-over: no site job id, no "submitted", no other start.
        assert rows(slow) == before
        assert slow.status(job_id).state == "running"
        assert [c.site_job_id for c in slow.status(job_id).components] == [None, None]
        assert len(site.submitted) == 1
    finally:
        cancel_local_jobs(slow)
    assert_capacity_invariant(slow.store)


def test_renewal_keeps_the_lease_of_a_slow_scan_that_is_alive(tmp_path: Path, center: str) -> None:
    gate = threading.Event()
    slow, site = gated_engine(tmp_path, center, "slow", gate, lease_s=1.0)
    job_id = slow.submit(PAIR, PlacementPolicy.CM, "true")
    thread, reports = scan_in_thread(slow)
    other = other_engine(tmp_path, center, "other", lease_s=1.0)
    try:
        assert site.entered.wait(60), "the scan never reached local-a's submission"
        taken_at = time.time()
        time.sleep(2.5)  # the lease as first taken ran out long ago
        assert other.scan().skipped
        with slow.store.begin() as conn:
            expires = conn.execute(select(leases.c.expires_at)).scalar_one()
        assert expires > taken_at + 1.0  # renewed while the scan waited on the site
    finally:
        gate.set()
        thread.join(60)
    try:
        (report,) = reports
        assert not report.lease_lost and report["claimed"] == (job_id,)
        components = slow.status(job_id).components
        assert [c.state for c in components] == ["submitted", "submitted"]
        assert all(c.site_job_id for c in components)
    finally:
        cancel_local_jobs(slow)
    assert_capacity_invariant(slow.store)
