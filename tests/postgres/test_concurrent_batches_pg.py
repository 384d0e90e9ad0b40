"""Batch decisions (issue 8 item 2) on PostgreSQL: 8 processes deciding bursts against one
database, with a single-decision selector and jobs finishing beside them. No processor is
granted twice, every selection row has its hold, the counters equal the holds; a burst
on an overtaken snapshot is retaken whole; a bad member leaves nothing written."""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections.abc import Iterator
from types import MappingProxyType

import pytest
from sqlalchemy import Connection, func, select, update

from gridcore.engine import selection as selection_engine
from gridcore.errors import RequestError
from gridcore.model import GridSpec, JobRequest, Outcome, SiteKind, SiteSnapshot, SiteSpec
from gridcore.policies.selection import DEFAULT_PROTOCOL, InsufficientMode, select_sites
from gridcore.state import capacity
from gridcore.state.capacity import HolderKind, Ledger
from gridcore.state.schema import holds, selections, sites
from gridcore.state.store import Store, open_store
from tests.capacity_checks import assert_capacity_invariant

pytestmark = pytest.mark.postgres

GRID = GridSpec(
    tuple(SiteSpec(f"s{i}", SiteKind.SLURM, 32, 1.0 + i / 10) for i in range(8)),
    MappingProxyType({}),
)
IDLE = {f"s{i}": 8 + 3 * i for i in range(8)}  # 8..29 processors granted per site
BURSTS = 12


def _bursts(url: str, index: int, count: int) -> None:
    store = open_store(url)
    rng = random.Random(index)
    snapshots = selection_engine.SnapshotReader(GRID)
    for b in range(count):
        size = rng.randint(1, 4)
        members = [JobRequest(f"p{index}-{b}-{i}", size) for i in range(rng.randint(1, 20))]
        selection_engine.select_and_record_batch(
            store,
            snapshots,
            members,
            DEFAULT_PROTOCOL,
            InsufficientMode.BEST,
            f"p{index}",
            time.time(),
            rng,
        )
    store.dispose()


def _singles(url: str, count: int) -> None:
    store = open_store(url)
    rng = random.Random(50)
    snapshots = selection_engine.SnapshotReader(GRID)
    for i in range(count):
        selection_engine.select_and_record(
            store,
            snapshots,
            JobRequest(f"single-{i}", rng.randint(1, 4)),
            DEFAULT_PROTOCOL,
            InsufficientMode.BEST,
            "single",
            time.time(),
            rng,
        )
    store.dispose()


def _finisher(url: str, stop_after: float) -> None:
    """Jobs complete while selectors run: release random claims, several per transaction,
    their sites in name order (as every transaction that changes several sites' rows
    must, or it deadlocks with a burst)."""
    store = open_store(url)
    rng = random.Random(99)
    end = time.time() + stop_after
    while time.time() < end:
        with store.begin() as conn:
            live = capacity.live_holds(conn, HolderKind.SELECTION)[:50]
            for hold in sorted(rng.sample(live, min(5, len(live))), key=lambda h: h.site):
                selection_engine.release(conn, int(hold.holder))
        time.sleep(0.01)
    store.dispose()


def _grant(store: Store) -> None:
    with store.begin() as conn:
        capacity.register_sites(conn, GRID)
        for name, count in IDLE.items():
            conn.execute(
                update(sites)
                .where(sites.c.name == name)
                .values(reported_idle=count, observed_at=1.0)
            )


def _run(processes: list[multiprocessing.process.BaseProcess]) -> None:
    for p in processes:
        p.start()
    for p in processes:
        p.join(300)
        assert p.exitcode == 0, p


def _rows_and_holds(
    conn: Connection,
) -> tuple[dict[str, tuple[str, int, str]], dict[str, tuple[str, int, str | None]]]:
    """selection id -> (site, processors, ledger its outcome puts it in), and holder ->
    (site, processors, ledger or None once released), over every selection hold."""
    rows = {
        str(sid): (site, procs, Ledger.CLAIMED if outcome == Outcome.FIT.label else Ledger.QUEUED)
        for sid, site, procs, outcome in conn.execute(
            select(
                selections.c.id, selections.c.site, selections.c.processors, selections.c.outcome
            )
        ).all()
    }
    held = {
        holder: (site, procs, ledger_)
        for holder, site, procs, ledger_ in conn.execute(
            select(holds.c.holder, holds.c.site, holds.c.processors, holds.c.ledger).where(
                holds.c.kind == HolderKind.SELECTION.value
            )
        ).all()
    }
    return rows, held


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    opened = open_store(pg_url, upgrade=True)
    yield opened
    opened.dispose()


def test_eight_processes_deciding_bursts_never_overcommit_and_every_row_has_its_hold(
    pg_url: str, store: Store
) -> None:
    _grant(store)
    ctx = multiprocessing.get_context("spawn")
    _run(
        [
            *(ctx.Process(target=_bursts, args=(pg_url, i, BURSTS)) for i in range(8)),
            ctx.Process(target=_singles, args=(pg_url, 60)),
            ctx.Process(target=_finisher, args=(pg_url, 6.0)),
        ]
    )
    assert_capacity_invariant(store)
    with store.begin() as conn:
        totals = capacity.totals(conn)
        rows, held = _rows_and_holds(conn)
        per_stream = dict(
            conn.execute(
                select(selections.c.stream, func.count()).group_by(selections.c.stream)
            ).all()
        )
    for site, (claimed, claimed_holds, queued, queued_holds) in totals.items():
        assert (claimed, queued) == (claimed_holds, queued_holds), site
        assert claimed <= IDLE[site], f"{site}: {claimed} claimed > {IDLE[site]} granted"
    assert held.keys() == rows.keys(), "a selection without its hold, or a hold without one"
    for sid, (site, procs, where) in rows.items():
        assert held[sid][:2] == (site, procs), sid
        assert held[sid][2] in (where, None), f"{sid}: held {held[sid][2]}, decided {where}"
    expected = {}
    for index in range(8):
        rng = random.Random(index)
        expected[f"p{index}"] = 0
        for _ in range(BURSTS):
            rng.randint(1, 4)
            expected[f"p{index}"] += rng.randint(1, 20)
    assert {s: n for s, n in per_stream.items() if s != "single"} == expected
    assert per_stream["single"] == 60


def test_bursts_racing_without_releases_grant_each_processor_once(
    pg_url: str, store: Store
) -> None:
    """Without releases, the FIT rows per site (all of them) never exceed the grant: a
    double grant would show as fitting rows beyond it."""
    _grant(store)
    ctx = multiprocessing.get_context("spawn")
    _run([ctx.Process(target=_bursts, args=(pg_url, i, 6)) for i in range(8)])
    with store.begin() as conn:
        fit = dict(
            conn.execute(
                select(selections.c.site, func.sum(selections.c.processors))
                .where(selections.c.outcome == Outcome.FIT.label)
                .group_by(selections.c.site)
            ).all()
        )
    assert_capacity_invariant(store)
    for site, granted in IDLE.items():
        assert int(fit.get(site, 0)) <= granted, f"{site}: {fit.get(site)} > {granted} granted"
    assert sum(int(v) for v in fit.values()) >= sum(IDLE.values()) - 8 * 4, "the grid filled"


class StaleOnce(selection_engine.SnapshotReader):
    """The snapshot read at construction, for the first read only (see test_selection_engine)."""

    def __init__(self, store: Store) -> None:
        super().__init__(GRID)
        with store.begin() as conn:
            self.view = self.read(conn)
        self._stale: list[SiteSnapshot] | None = self.view

    def read(self, conn: Connection) -> list[SiteSnapshot]:
        stale, self._stale = getattr(self, "_stale", None), None
        return stale if stale is not None else super().read(conn)


def test_a_burst_records_the_decisions_select_sites_takes_each_hold_naming_its_row(
    store: Store,
) -> None:
    _grant(store)
    # Eq. W only: the decisions are select_sites' without a wait model (the wait models'
    # own decisions on PostgreSQL: test_wait_models_pg.py)
    reader = selection_engine.SnapshotReader(GRID, wait_model=None)
    with store.begin() as conn:
        snapshot = reader.read(conn)
    members = [JobRequest(f"m{i}", 1 + i % 4) for i in range(40)]
    expected = select_sites(
        members, snapshot, GRID.bandwidth, DEFAULT_PROTOCOL, rng=random.Random(5)
    )
    recorded = selection_engine.select_and_record_batch(
        store, reader, members, DEFAULT_PROTOCOL, InsufficientMode.BEST, "t", 1.0,
        random.Random(5),
    )  # fmt: skip
    assert [r.decision for r in recorded] == expected
    assert {d.outcome for d in expected} == {Outcome.FIT, Outcome.QUEUE}
    with store.begin() as conn:
        rows, held = _rows_and_holds(conn)
        names = dict(conn.execute(select(selections.c.id, selections.c.name)).all())
    assert [names[r.id] for r in recorded] == [m.name for m in members]
    assert held == rows
    assert_capacity_invariant(store)


def test_a_burst_on_an_overtaken_snapshot_is_retaken_whole(store: Store) -> None:
    """The burst decides on a view in which its first site has room; another selector
    takes all of it before the burst claims: the conditional claim matches no row, the
    attempt is rolled back (its claims at other sites too) and the retake fits."""
    _grant(store)
    late = StaleOnce(store)
    members = [JobRequest(f"n{i}", 3) for i in range(6)]
    planned = select_sites(
        members, late.view, GRID.bandwidth, DEFAULT_PROTOCOL, rng=random.Random(6)
    )
    site = planned[0].site
    assert site is not None and planned[0].outcome is Outcome.FIT
    with store.begin() as conn:
        room = capacity.free_processors(conn)[site]
        assert capacity.claim(conn, HolderKind.PROBE, "x", site, room) is Ledger.CLAIMED
    recorded = selection_engine.select_and_record_batch(
        store, late, members, DEFAULT_PROTOCOL, InsufficientMode.BEST, "t", 2.0,
        random.Random(6),
    )  # fmt: skip
    assert {r.attempts for r in recorded} == {2}
    assert site not in {r.decision.site for r in recorded if r.decision.outcome is Outcome.FIT}
    with store.begin() as conn:
        rows, held = _rows_and_holds(conn)
        claimed = dict(conn.execute(select(sites.c.name, sites.c.claimed)).all())
    assert len(rows) == len(members) and held == rows
    assert all(claimed[s] <= IDLE[s] for s in IDLE), claimed
    assert_capacity_invariant(store)


def test_a_member_no_site_can_run_leaves_nothing_written(store: Store) -> None:
    _grant(store)
    members = [JobRequest("ok", 2), JobRequest("too-big", 33), JobRequest("ok2", 1)]
    with pytest.raises(RequestError, match="request 'too-big': no site can run 33"):
        selection_engine.select_and_record_batch(
            store, selection_engine.SnapshotReader(GRID), members, DEFAULT_PROTOCOL,
            InsufficientMode.BEST, "t", 1.0, random.Random(0),
        )  # fmt: skip
    with store.begin() as conn:
        assert conn.execute(select(func.count()).select_from(selections)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(holds)).scalar_one() == 0
        assert conn.execute(select(func.sum(sites.c.claimed + sites.c.queued))).scalar_one() == 0
    assert_capacity_invariant(store)


def test_a_burst_gives_way_to_a_transaction_holding_its_site_and_is_retaken(
    store: Store,
) -> None:
    """Another transaction holds s0's row (as a release of several sites in another
    order would, waiting on a row the burst locked): the burst waits at most
    BURST_LOCK_WAIT_S, rolls back and is retaken, and commits once the row is free. It
    never waits long enough for PostgreSQL's deadlock check to pick the other side."""
    _grant(store)
    held, release = threading.Event(), threading.Event()

    def hold_s0() -> None:
        with store.begin() as conn:
            conn.execute(select(sites.c.name).where(sites.c.name == "s0").with_for_update())
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_s0)
    holder.start()
    assert held.wait(30)
    timer = threading.Timer(2.5 * selection_engine.BURST_LOCK_WAIT_S, release.set)
    timer.start()
    try:
        start = time.monotonic()
        recorded = selection_engine.select_and_record_batch(
            store,
            selection_engine.SnapshotReader(GRID),
            [JobRequest(f"m{i}", 2) for i in range(3)],
            DEFAULT_PROTOCOL, InsufficientMode.BEST, "t", 1.0, random.Random(0),
        )  # fmt: skip
        waited = time.monotonic() - start
    finally:
        release.set()
        timer.cancel()
        holder.join(30)
    assert [r.decision.site for r in recorded] == ["s0"] * 3
    (attempts,) = {r.attempts for r in recorded}
    assert attempts >= 2, "it gave way (at least once) until the row was free"
    assert waited >= 2.5 * selection_engine.BURST_LOCK_WAIT_S - 0.1
    assert_capacity_invariant(store)
