"""The selection ledger on SQLite: claims, releases, observations, interleaved claims on
stale snapshots, and processes killed mid-run (the PostgreSQL tier runs the same
invariants at 8 x 200). Every test ends with the capacity invariant."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path
from types import MappingProxyType

import pytest
from sqlalchemy import Connection, func, select, update

from gridcore.engine import health
from gridcore.engine import selection as selection_engine
from gridcore.errors import NoUsableSite
from gridcore.model import (
    GridSpec,
    JobRequest,
    JobState,
    ObservedJob,
    Outcome,
    SiteKind,
    SiteObservation,
    SiteSnapshot,
    SiteSpec,
)
from gridcore.policies.selection import InsufficientMode, SelectionProtocol
from gridcore.state import capacity
from gridcore.state.capacity import HolderKind, Ledger
from gridcore.state.schema import holds, selections, sites
from gridcore.state.store import Store, open_store

GRID = GridSpec(
    (
        SiteSpec("a", SiteKind.SLURM, 16),
        SiteSpec("b", SiteKind.SLURM, 8),
        SiteSpec("c", SiteKind.SLURM, 4),
    ),
    MappingProxyType({}),
)


def make_store(tmp_path: Path) -> Store:
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    with store.begin() as conn:
        capacity.register_sites(conn, GRID)
    return store


def decide(
    store: Store,
    name: str,
    procs: int,
    protocol: SelectionProtocol = SelectionProtocol.STATEFUL,
    snapshots: selection_engine.SnapshotReader | None = None,
) -> selection_engine.Recorded:
    return selection_engine.select_and_record(
        store,
        snapshots or selection_engine.SnapshotReader(GRID),
        JobRequest(name, procs),
        protocol,
        InsufficientMode.BEST,
        "t",
        time.time(),
        random.Random(1),
    )


def assert_sound(store: Store) -> None:
    with store.begin() as conn:
        assert capacity.check_invariant(conn) == []
        totals = capacity.totals(conn)
        granted = dict(
            conn.execute(
                select(sites.c.name, sites.c.reported_idle - sites.c.external_pending)
            ).all()
        )
    for site, (claimed, claimed_rows, queued, queued_rows) in totals.items():
        assert (claimed, queued) == (claimed_rows, queued_rows), site
        assert claimed <= granted[site], f"{site}: claimed {claimed} > granted {granted[site]}"


def test_claims_until_full_then_queues(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    outcomes = [decide(store, f"m{i}", 4).decision for i in range(9)]
    assert [d.outcome.name for d in outcomes] == ["FIT"] * 7 + ["QUEUE"] * 2
    assert_sound(store)
    with store.begin() as conn:
        assert dict(conn.execute(select(sites.c.name, sites.c.claimed)).all()) == {
            "a": 16,
            "b": 8,
            "c": 4,
        }
    store.dispose()


def test_register_sites_is_idempotent(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    with store.begin() as conn:
        capacity.register_sites(conn, GRID)
        assert conn.execute(select(func.count()).select_from(sites)).scalar_one() == 3
    store.dispose()


def test_observation_releases_visible_jobs_and_ignores_older_reports(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    first = decide(store, "m1", 16)
    with store.begin() as conn:
        selection_engine.set_job_id(conn, first.id, "101", 1.0)
        pending = (ObservedJob("101", 16, JobState.PENDING),)
        stale = SiteObservation("a", 16, 16, pending, observed_at=5.0)
        assert selection_engine.store_observation(conn, stale) == 0  # job not visible yet
        external = conn.execute(select(sites.c.external_pending).where(sites.c.name == "a"))
        assert external.scalar_one() == 0, "our pending job is not someone else's queue"
        running = SiteObservation(
            "a", 16, 0, (ObservedJob("101", 16, JobState.RUNNING),), observed_at=10.0
        )
        assert selection_engine.store_observation(conn, running) == 1
        older = SiteObservation("a", 16, 16, (), observed_at=7.0)
        assert selection_engine.store_observation(conn, older) == 0
        row = conn.execute(select(sites).where(sites.c.name == "a")).mappings().one()
    assert (row["reported_idle"], row["claimed"], row["observed_at"]) == (0, 0, 10.0)
    assert_sound(store)
    store.dispose()


def test_external_pending_excludes_our_own_pending_jobs(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    jobs = (ObservedJob("ours", 4, JobState.PENDING), ObservedJob("theirs", 6, JobState.PENDING))
    with store.begin() as conn:
        selection_engine.store_observation(
            conn, SiteObservation("b", 8, 8, jobs, observed_at=3.0), ["ours"]
        )
        row = conn.execute(select(sites).where(sites.c.name == "b")).mappings().one()
    assert (row["external_pending"], row["pending_jobs"]) == (6, 2)
    store.dispose()


def test_release_happens_exactly_once(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    rec = decide(store, "m", 4)
    with store.begin() as conn:
        assert selection_engine.release(conn, rec.id) is True
        assert selection_engine.release(conn, rec.id) is False
    assert_sound(store)
    store.dispose()


def test_site_errors_make_a_site_unusable_and_only_a_restore_brings_it_back(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path)
    with store.begin() as conn:
        assert [health.record_failure(conn, "a", "refused") for _ in range(3)] == [
            False,
            False,
            True,
        ]
    with pytest.raises(NoUsableSite, match="a: marked unusable"):
        selection_engine.select_and_record(
            store,
            selection_engine.SnapshotReader(GRID),
            JobRequest("big", 12),
            SelectionProtocol.STATEFUL,
            InsufficientMode.BEST,
            "t",
            0.0,
            random.Random(0),
        )
    with store.begin() as conn:
        # a report does not hide consecutive errors (gridcore.engine.health)
        selection_engine.store_observation(conn, SiteObservation("a", 16, 16, (), observed_at=9.0))
        assert health.site_health(conn, "a").usable is False
    health.restore_site(store, "a")
    assert decide(store, "big", 12).decision.site == "a"
    assert_sound(store)
    store.dispose()


class StaleOnce(selection_engine.SnapshotReader):
    """Returns the snapshot read at construction for its first read: the decision is
    taken on a view another claim has overtaken since (as two interleaved selectors)."""

    def __init__(self, store: Store) -> None:
        super().__init__(GRID)
        with store.begin() as conn:
            self._stale: list[SiteSnapshot] | None = self.read(conn)

    def read(self, conn: Connection) -> list[SiteSnapshot]:
        stale, self._stale = getattr(self, "_stale", None), None
        return stale if stale is not None else super().read(conn)


def test_a_claim_on_an_overtaken_snapshot_is_refused_by_the_conditional_update(
    tmp_path: Path,
) -> None:
    """Two selectors read the same snapshot (16 idle at a), the first claims 16; the
    second decided FIT on its older view. Only the conditional UPDATE stands between it
    and a double grant: it must match no row and the decision be retaken."""
    store = make_store(tmp_path)
    late = StaleOnce(store)  # reads 16 idle at a, 8 at b, 4 at c
    first = decide(store, "first", 16)
    second = decide(store, "second", 16, snapshots=late)
    assert (first.decision.site, first.decision.outcome, first.attempts) == ("a", Outcome.FIT, 1)
    assert second.attempts == 2, "the claim on the overtaken snapshot must be refused"
    assert second.decision.outcome is Outcome.QUEUE
    with store.begin() as conn:
        row = conn.execute(select(sites).where(sites.c.name == "a")).mappings().one()
    assert (row["claimed"], row["queued"]) == (16, 16)
    assert_sound(store)
    store.dispose()


def test_two_interleaved_claims_on_one_site_the_second_is_refused(tmp_path: Path) -> None:
    """The capacity primitive itself: 16 free at a, claim 10 then 10 in one transaction."""
    store = make_store(tmp_path)
    with store.begin() as conn:
        assert capacity.free_processors(conn)["a"] == 16
        got = capacity.claim(conn, HolderKind.PROBE, "x", "a", 10)
        refused = capacity.claim(conn, HolderKind.PROBE, "y", "a", 10)
        queued = capacity.claim(conn, HolderKind.PROBE, "z", "a", 10, queue_if_full=True)
        assert (got, refused, queued) == (Ledger.CLAIMED, None, Ledger.QUEUED)
        assert capacity.hold(conn, HolderKind.PROBE, "y") is None
        assert capacity.free_processors(conn)["a"] == 16 - 10 - 10
    assert_sound(store)
    store.dispose()


def test_storage_claims_fit_the_limit_and_release_exactly_once(tmp_path: Path) -> None:
    grid = GridSpec((SiteSpec("s", SiteKind.SLURM, 4, storage_bytes=1000),), MappingProxyType({}))
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    with store.begin() as conn:
        capacity.register_sites(conn, grid)
        assert capacity.claim(conn, HolderKind.VOLUME, "f@s", "s", 0, 600) is Ledger.CLAIMED
        assert capacity.claim(conn, HolderKind.VOLUME, "g@s", "s", 0, 600) is None
        assert capacity.claim(conn, HolderKind.VOLUME, "h@s", "s", 0, 400) is Ledger.CLAIMED
        assert capacity.check_invariant(conn) == []
        assert capacity.release(conn, HolderKind.VOLUME, "f@s") is True
        assert capacity.release(conn, HolderKind.VOLUME, "f@s") is False
        assert capacity.usage(conn)["s"].storage_claimed == 400
        assert capacity.check_invariant(conn) == []
    store.dispose()


def test_the_invariant_names_a_counter_that_drifted_from_the_holds(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    decide(store, "m", 4)
    with store.begin() as conn:
        conn.execute(update(sites).where(sites.c.name == "a").values(claimed=sites.c.claimed + 1))
        problems = capacity.check_invariant(conn)
    assert problems == ["site a: claimed counter 5 != holds 4"]
    store.dispose()


def _hammer(url: str, index: int, count: int) -> None:
    store = open_store(url)
    snapshots = selection_engine.SnapshotReader(GRID)
    for i in range(count):
        decide(store, f"p{index}-{i}", 1 + (i + index) % 4, snapshots=snapshots)
    store.dispose()


def test_concurrent_processes_lose_no_selection_and_keep_counters_equal_to_holds(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_hammer, args=(f"sqlite:///{tmp_path}/state.db", i, 40))
        for i in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert_sound(store)
    with store.begin() as conn:
        assert conn.execute(select(func.count()).select_from(selections)).scalar_one() == 160
        assert conn.execute(select(func.count()).select_from(holds)).scalar_one() == 160
    store.dispose()


def test_a_selector_killed_mid_run_leaves_whole_decisions_only(tmp_path: Path) -> None:
    """SIGKILL lands inside or between decisions: every selection it committed has its
    hold and its processors in the counters, nothing half-written survives, the database
    is not left locked (the survivor finishes), and releasing everything returns every
    processor."""
    store = make_store(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    victim = ctx.Process(target=_hammer, args=(f"sqlite:///{tmp_path}/state.db", 9, 100_000))
    survivor = ctx.Process(target=_hammer, args=(f"sqlite:///{tmp_path}/state.db", 1, 60))
    victim.start()
    survivor.start()
    deadline = time.time() + 60
    while time.time() < deadline:
        with store.begin() as conn:
            victims = select(func.count()).where(selections.c.name.startswith("p9-"))
            if conn.execute(victims).scalar_one() > 30:
                break
        time.sleep(0.02)
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(30)
    assert victim.exitcode == -signal.SIGKILL, "the victim must die by the kill, mid-run"
    survivor.join(120)
    assert survivor.exitcode == 0
    assert_sound(store)
    with store.begin() as conn:
        per_stream = dict(
            conn.execute(
                select(func.substr(selections.c.name, 1, 3), func.count()).group_by(
                    func.substr(selections.c.name, 1, 3)
                )
            ).all()
        )
        ids = {str(i) for i in conn.execute(select(selections.c.id)).scalars()}
        held = {h.holder for h in capacity.live_holds(conn, HolderKind.SELECTION)}
        assert per_stream["p1-"] == 60 and per_stream["p9-"] > 0
        assert held == ids, "a selection without its hold, or a hold without its selection"
        for sid in ids:
            assert selection_engine.release(conn, int(sid))
        assert capacity.check_invariant(conn) == []
        left = conn.execute(select(func.sum(sites.c.claimed + sites.c.queued))).scalar_one()
        assert left == 0, "processors left claimed after every selection was released"
    store.dispose()
