"""The live wait models on PostgreSQL: migrations 0014 and 0015 up, down and up again; the
history's new columns through the upsert (``ON CONFLICT``); a single decision (one
autocommit statement) and a burst (one transaction) taking the model's forecasts; the
forecasts of pending jobs stored after a decision (an executemany UPDATE) and a new
process's model learning its residual from them."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import select

from gridcore.engine import selection as selection_engine
from gridcore.engine import wait_models
from gridcore.model import JobRequest, JobState
from gridcore.policies.selection import InsufficientMode, SelectionProtocol
from gridcore.state import capacity
from gridcore.state.schema import queue_waits
from gridcore.state.store import open_store
from tests.capacity_checks import assert_capacity_invariant
from tests.unit.test_wait_models_engine import (
    GRID,
    NOW,
    alice_history,
    check_0014_round_trip,
    check_0015_round_trip,
    decide,
    job,
    observe,
    site_wait,
    stored_forecasts,
)

pytestmark = pytest.mark.postgres


def test_0014_round_trip_on_postgresql(pg_url: str) -> None:
    check_0014_round_trip(open_store(pg_url))


def test_0015_round_trip_on_postgresql(pg_url: str) -> None:
    check_0015_round_trip(open_store(pg_url))


def test_decisions_take_the_models_forecasts_on_postgresql(pg_url: str) -> None:
    store = open_store(pg_url, upgrade=True)
    with store.begin() as conn:
        capacity.register_sites(conn, GRID)
    alice_history(store)
    observe(store, "b", NOW - 1, job("20", 8, JobState.RUNNING, started=NOW - 100, limit=2100.0))
    with store.begin() as conn:
        ended = conn.execute(
            select(queue_waits.c.ended_at).where(queue_waits.c.site_job_id == "1")
        ).scalar_one()
    assert ended == NOW - 300
    reader = selection_engine.SnapshotReader(GRID)
    single = decide(store, reader, 8)
    assert single.decision.site == "a"
    assert single.decision.reasons[-1].startswith(
        "queue delay at site a: 50 s by wait model predicted_backfill"
    )
    requests = [JobRequest(f"m{i}", 8, 600.0) for i in range(2)]
    burst = selection_engine.select_and_record_batch(
        store, reader, requests, SelectionProtocol.EARLIEST_COMPLETION,
        InsufficientMode.BEST, "t", NOW, random.Random(1),
    )  # fmt: skip
    # a has the single decision's 8 processors in flight ahead (+50 s, then 600 s), then
    # the burst's first member; b frees its 8 at +2000 s: a still wins the second
    delays = []
    for recorded in burst:
        chosen = recorded.decision.estimate_for(recorded.decision.site or "")
        assert chosen is not None
        delays.append((recorded.decision.site, chosen.queue_delay_s))
    assert delays == [("a", pytest.approx(650.0)), ("a", pytest.approx(1250.0))]
    assert reader.waits is not None and reader.waits.builds == 2
    assert_capacity_invariant(store)
    store.dispose()


def test_stored_forecasts_give_a_new_process_its_residual_on_postgresql(pg_url: str) -> None:
    """tests/unit/test_wait_models_engine.py's scenario, on PostgreSQL."""
    store = open_store(pg_url, upgrade=True)
    with store.begin() as conn:
        capacity.register_sites(conn, GRID)
    reader = selection_engine.SnapshotReader(GRID)
    assert reader.waits is not None
    r, p = JobState.RUNNING, JobState.PENDING
    c1 = job("c1", 8, r, submitted=NOW - 450, started=NOW - 400, limit=300.0, user="carol")
    observe(store, "a", NOW - 400, c1, job("c2", 8, p, submitted=NOW - 450, limit=300.0))
    site_wait(store, reader, "a")
    wait_models.store_forecasts(store, reader.waits)
    assert stored_forecasts(store) == {"c2": (300.0, NOW - 400, "predicted_backfill")}
    c2 = job("c2", 8, r, submitted=NOW - 450, started=NOW - 50, limit=300.0)
    observe(store, "a", NOW - 1, c2)
    found = site_wait(store, selection_engine.SnapshotReader(GRID), "a")
    assert found.forecast is not None and found.forecast.bound_s == pytest.approx(300.0)
    store.dispose()
