"""The selection ledger on SQLite: claims, releases, observations, and races between
processes (the PostgreSQL tier runs the same invariants at 8 x 200)."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path
from types import MappingProxyType

import pytest
from sqlalchemy import func, select, update

from gridcore.engine import ledger
from gridcore.errors import RequestError
from gridcore.model import (
    GridSpec,
    JobRequest,
    JobState,
    ObservedJob,
    SiteKind,
    SiteObservation,
    SiteSpec,
)
from gridcore.policies.selection import InsufficientMode, SelectionProtocol
from gridcore.state.schema import selections, sites
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
        ledger.register_sites(conn, GRID)
    return store


def decide(
    store: Store, name: str, procs: int, protocol: SelectionProtocol = SelectionProtocol.STATEFUL
) -> ledger.Recorded:
    return ledger.select_and_record(
        store,
        GRID,
        JobRequest(name, procs),
        protocol,
        InsufficientMode.BEST,
        "t",
        time.time(),
        random.Random(1),
    )


def assert_sound(store: Store) -> None:
    with store.begin() as conn:
        totals = ledger.ledger_totals(conn)
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
        ledger.register_sites(conn, GRID)
        assert conn.execute(select(func.count()).select_from(sites)).scalar_one() == 3
    store.dispose()


def test_observation_releases_visible_jobs_and_ignores_older_reports(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    first = decide(store, "m1", 16)
    with store.begin() as conn:
        conn.execute(update(selections).where(selections.c.id == first.id).values(job_id="101"))
        stale = SiteObservation("a", 16, 16, (), observed_at=5.0)
        assert ledger.store_observation(conn, stale, ["101"]) == 0  # job not visible yet
        running = SiteObservation(
            "a", 16, 0, (ObservedJob("101", 16, JobState.RUNNING),), observed_at=10.0
        )
        assert ledger.store_observation(conn, running, ["101"]) == 1
        older = SiteObservation("a", 16, 16, (), observed_at=7.0)
        assert ledger.store_observation(conn, older, ["101"]) == 0
        row = conn.execute(select(sites).where(sites.c.name == "a")).mappings().one()
    assert (row["reported_idle"], row["claimed"], row["observed_at"]) == (0, 0, 10.0)
    assert_sound(store)
    store.dispose()


def test_external_pending_excludes_our_own_pending_jobs(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    jobs = (ObservedJob("ours", 4, JobState.PENDING), ObservedJob("theirs", 6, JobState.PENDING))
    with store.begin() as conn:
        ledger.store_observation(conn, SiteObservation("b", 8, 8, jobs, observed_at=3.0), ["ours"])
        row = conn.execute(select(sites).where(sites.c.name == "b")).mappings().one()
    assert (row["external_pending"], row["pending_jobs"]) == (6, 2)
    store.dispose()


def test_release_happens_exactly_once(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    rec = decide(store, "m", 4)
    with store.begin() as conn:
        assert ledger.release(conn, rec.id) is True
        assert ledger.release(conn, rec.id) is False
    assert_sound(store)
    store.dispose()


def test_site_errors_make_a_site_unusable_and_an_observation_restores_it(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    with store.begin() as conn:
        assert [ledger.record_site_error(conn, "a", "refused") for _ in range(3)] == [
            False,
            False,
            True,
        ]
    with pytest.raises(RequestError, match="a: marked unusable"):
        ledger.select_and_record(
            store,
            GRID,
            JobRequest("big", 12),
            SelectionProtocol.STATEFUL,
            InsufficientMode.BEST,
            "t",
            0.0,
            random.Random(0),
        )
    with store.begin() as conn:
        ledger.store_observation(conn, SiteObservation("a", 16, 16, (), observed_at=9.0), [])
    assert decide(store, "big", 12).decision.site == "a"
    store.dispose()


def _hammer(url: str, index: int, count: int) -> None:
    store = open_store(url)
    for i in range(count):
        decide(store, f"p{index}-{i}", 1 + (i + index) % 4)
    store.dispose()


def test_concurrent_processes_never_grant_the_same_processors_twice(tmp_path: Path) -> None:
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
    store.dispose()


def test_a_selector_killed_mid_run_leaves_a_sound_ledger(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    victim = ctx.Process(target=_hammer, args=(f"sqlite:///{tmp_path}/state.db", 9, 100_000))
    survivor = ctx.Process(target=_hammer, args=(f"sqlite:///{tmp_path}/state.db", 1, 60))
    victim.start()
    survivor.start()
    deadline = time.time() + 60
    while time.time() < deadline:
        with store.begin() as conn:
            if conn.execute(select(func.count()).select_from(selections)).scalar_one() > 30:
                break
        time.sleep(0.05)
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(30)
    survivor.join(120)
    assert survivor.exitcode == 0
    assert_sound(store)
    store.dispose()
