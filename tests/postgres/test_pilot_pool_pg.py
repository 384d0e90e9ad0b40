"""8 processes register the pilots of 12 co-reserved jobs at once on PostgreSQL, each
process every pilot (in its own random order: retries and races at their worst), while
also calling the engine's backstop :func:`dispatch_if_ready`: every job is dispatched
exactly once, in one transaction, with each component index used once.

Every call gets its own ``now`` (process * 1e6 + call), so the job's ``dispatched_at``
names the one transaction that dispatched it."""

from __future__ import annotations

import multiprocessing
import random
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import insert, select

from gridcore.engine import pilot_pool
from gridcore.engine.phases import PilotState, ReservationPhase
from gridcore.state.schema import pilots, reservations
from gridcore.state.store import Store, open_store

pytestmark = pytest.mark.postgres

WORKERS = 8
JOBS = 12
PILOTS_PER_JOB = 4  # sites s0..s3, some jobs two pilots at one site


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    opened = open_store(pg_url, upgrade=True)
    yield opened
    opened.dispose()


def _make_jobs(store: Store) -> dict[int, list[int]]:
    rng = random.Random(7)
    made: dict[int, list[int]] = {}
    with store.begin() as conn:
        for j in range(JOBS):
            job = conn.execute(
                insert(reservations).values(
                    name=f"pg-{j}",
                    command="true",
                    processors=PILOTS_PER_JOB,
                    vj_size=1,
                    max_clusters=PILOTS_PER_JOB,
                    lifetime_floor_s=60.0,
                    state=ReservationPhase.RESERVING.value,
                    submitted_at=0.0,
                )
            ).inserted_primary_key[0]
            made[int(job)] = []
            for i in range(PILOTS_PER_JOB):
                _, digest = pilot_pool.new_token()
                pid = conn.execute(
                    insert(pilots).values(
                        job_id=job,
                        first_job_id=job,
                        site=f"s{rng.randrange(PILOTS_PER_JOB)}",
                        processors=1,
                        state=PilotState.PENDING.value,
                        key=f"k-{job}-{i}",
                        token_hash=digest,
                        submitted_at=0.0,
                    )
                ).inserted_primary_key[0]
                made[int(job)].append(int(pid))
    return made


def _worker(url: str, index: int, made: dict[int, list[int]], start: Any, out: Any) -> None:
    store = open_store(url)
    rng = random.Random(index)
    calls = [(job, pid) for job, pids in made.items() for pid in pids]
    rng.shuffle(calls)
    backstop: list[tuple[int, float]] = []
    start.wait()
    for seq, (job, pid) in enumerate(calls):
        now = index * 1e6 + 2 * seq
        pilot_pool.register(store, pid, f"w{index}", 1000 + pid, 1, now)
        if rng.random() < 0.3:  # the engine's scan, running beside the registrations
            with store.begin() as conn:
                if pilot_pool.dispatch_if_ready(conn, job, now + 1):
                    backstop.append((job, now + 1))
    out.put(backstop)
    store.dispose()


def test_each_job_is_dispatched_once_with_unique_components(pg_url: str, store: Store) -> None:
    made = _make_jobs(store)
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(WORKERS)
    out = ctx.Queue()
    workers = [
        ctx.Process(target=_worker, args=(pg_url, i, made, start, out)) for i in range(WORKERS)
    ]
    began = time.monotonic()
    for p in workers:
        p.start()
    backstops = [out.get(timeout=300) for _ in workers]
    for p in workers:
        p.join(60)
        assert p.exitcode == 0, p
    assert time.monotonic() - began < 300

    with store.begin() as conn:
        jobs = {r.id: r for r in conn.execute(select(reservations)).all()}
        rows = conn.execute(select(pilots)).all()
    by_backstop = Counter(job for found in backstops for job, _ in found)
    assert all(count == 1 for count in by_backstop.values()), by_backstop
    backstop_at = {job: at for found in backstops for job, at in found}
    for job, pids in made.items():
        row = jobs[job]
        mine = sorted((r for r in rows if r.job_id == job), key=lambda r: (r.site, r.id))
        assert row.state == ReservationPhase.DISPATCHED.value
        assert [r.state for r in mine] == [PilotState.DISPATCHED.value] * PILOTS_PER_JOB
        # one transaction set every pilot and the job: one `now` for all
        assert {r.dispatched_at for r in mine} == {row.dispatched_at}
        # components 0..n-1, each once, in (site, id) order
        assert [r.component for r in mine] == list(range(PILOTS_PER_JOB))
        assert sorted(r.id for r in mine) == sorted(pids)
        # the first registration of each pilot counted; retries changed nothing
        assert row.held_at == max(r.registered_at for r in mine)
        if job in backstop_at:
            assert row.dispatched_at == backstop_at[job]
        else:  # dispatched by the registration that completed the set (its own `now`)
            assert row.dispatched_at in {r.registered_at for r in mine}
