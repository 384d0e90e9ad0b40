"""The live wait models on PostgreSQL: migration 0014 up, down and up again; the history's
new columns through the upsert (``ON CONFLICT``); a single decision (one autocommit
statement) and a burst (one transaction) taking the model's forecasts."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import select

from gridcore.engine import selection as selection_engine
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
    decide,
    job,
    observe,
)

pytestmark = pytest.mark.postgres


def test_0014_round_trip_on_postgresql(pg_url: str) -> None:
    check_0014_round_trip(open_store(pg_url))


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
