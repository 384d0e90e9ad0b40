"""The queue-wait history of VJM Eq. 1 (gridcore.engine.queue_stats) on local sites.

Real local sites through GridRuntime with a hand-moved clock: the site stamps submits and
starts with it, so every wait and interval below is exact. Jobs are real subprocesses
that sleep until the test cancels them (a local site starts the next queued job when one
ends)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from gridcore.config import default_grid
from gridcore.engine import queue_stats
from gridcore.engine.queue_stats import HISTORY_STARTED, record_observation
from gridcore.engine.runtime import GridRuntime
from gridcore.model import JobRequest, JobState, JobSubmission, ObservedJob, SiteObservation
from gridcore.policies.coreservation import QueueStats
from gridcore.policies.queue_stats import COLD_INTERVAL_S, COLD_WAIT_S
from gridcore.sites.local import LocalSite
from gridcore.state.schema import queue_waits
from gridcore.state.store import Store, open_store

SITE = "local-b"  # 4 processors in the embedded default
T0 = 1_000_000.0


class Clock:
    """The runtime's and the local sites' clock, moved by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def rt(tmp_path: Path, clock: Clock) -> Iterator[GridRuntime]:
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    runtime = GridRuntime(default_grid(tmp_path), store, clock=clock)
    yield runtime
    for name in ("local-a", "local-b", "local-c"):
        site = local(runtime, name)
        for job in site.observe().jobs:
            site.cancel(job.job_id)


def local(rt: GridRuntime, name: str = SITE) -> LocalSite:
    site = rt.adapter(name)
    assert isinstance(site, LocalSite)
    return site


def others_job(rt: GridRuntime, name: str, processors: int = 4) -> str:
    """A job of another user (no submission key), sleeping until cancelled."""
    return local(rt).submit(JobSubmission(name, "sleep 120", processors))


def history(rt: GridRuntime, site: str = SITE) -> dict[str, tuple[bool, float, float | None]]:
    """site job id -> (external, submitted_at, started_at)."""
    with rt.store.begin() as conn:
        rows = conn.execute(
            select(
                queue_waits.c.site_job_id,
                queue_waits.c.external,
                queue_waits.c.submitted_at,
                queue_waits.c.started_at,
            ).where(queue_waits.c.site == site)
        ).all()
    return {r.site_job_id: (r.external, r.submitted_at, r.started_at) for r in rows}


def stats(rt: GridRuntime, site: str = SITE) -> QueueStats:
    with rt.store.begin() as conn:
        return queue_stats.queue_stats(conn, [site], rt.clock())[site]


def observe_at(rt: GridRuntime, clock: Clock, t: float) -> None:
    clock.now = t
    assert rt.refresh() == {"local-a": None, "local-b": None, "local-c": None}


def test_a_backlogged_queue_gives_eq1s_statistics_step_by_step(
    rt: GridRuntime, clock: Clock
) -> None:
    # Three 4-processor jobs at once on a 4-processor site: x runs, y and z wait.
    x, y, z = (others_job(rt, n) for n in ("x", "y", "z"))
    observe_at(rt, clock, T0 + 10)
    assert history(rt) == {x: (True, T0, T0), y: (True, T0, None), z: (True, T0, None)}
    # One start: T_w its wait (0), dt = T_w; the earliest waiting job waited 10 s.
    assert stats(rt) == QueueStats(t_w=0.0, t_ffw=10.0, ql=2, dt=0.0)

    clock.now = T0 + 30
    local(rt).cancel(x)  # y starts now
    observe_at(rt, clock, T0 + 35)
    assert history(rt)[y] == (True, T0, T0 + 30)
    assert history(rt)[x] == (True, T0, T0), "a started row outlives its job"
    assert stats(rt) == QueueStats(t_w=15.0, t_ffw=35.0, ql=1, dt=30.0)

    clock.now = T0 + 60
    local(rt).cancel(y)  # z starts now
    observe_at(rt, clock, T0 + 61)
    # waits 0, 30, 60; starts T0, T0+30, T0+60
    assert stats(rt) == QueueStats(t_w=30.0, t_ffw=0.0, ql=0, dt=30.0)
    assert history(rt)[z] == (True, T0, T0 + 60)


def test_started_at_is_set_once_and_seen_at_moves_only_forward(
    rt: GridRuntime, clock: Clock
) -> None:
    x = others_job(rt, "x")
    observe_at(rt, clock, T0 + 5)
    observe_at(rt, clock, T0 + 9)
    with rt.store.begin() as conn:
        # A late report, taken before the stored one, with a different start time.
        late = SiteObservation(
            SITE, 4, 0, (ObservedJob(x, 4, JobState.RUNNING, None, T0, T0 + 3),), T0 + 7
        )
        record_observation(conn, late)
        row = conn.execute(
            select(queue_waits.c.started_at, queue_waits.c.seen_at).where(
                queue_waits.c.site_job_id == x
            )
        ).one()
    assert (row.started_at, row.seen_at) == (T0, T0 + 9)


def test_our_jobs_are_recorded_as_not_external_and_count_as_any_job(
    rt: GridRuntime, clock: Clock
) -> None:
    rec = rt.select(JobRequest("mine", 4, 1.0), site=SITE)
    mine = rt.submit(rec.selection_id, JobSubmission("mine", "sleep 120", 4)).job_id
    clock.now = T0 + 4
    other = others_job(rt, "other")
    observe_at(rt, clock, T0 + 10)
    assert history(rt) == {str(mine): (False, T0, T0), other: (True, T0 + 4, None)}
    # Our job is a job the cluster started: its wait counts in T_w, the other's in QL.
    assert stats(rt) == QueueStats(t_w=0.0, t_ffw=6.0, ql=1, dt=0.0)


def test_a_job_cancelled_while_pending_stops_counting_as_waiting(
    rt: GridRuntime, clock: Clock
) -> None:
    x, y = others_job(rt, "x"), others_job(rt, "y")
    observe_at(rt, clock, T0 + 10)
    assert history(rt)[y] == (True, T0, None)
    clock.now = T0 + 20
    local(rt).cancel(y)
    observe_at(rt, clock, T0 + 30)
    assert history(rt) == {x: (True, T0, T0)}
    assert stats(rt) == QueueStats(t_w=0.0, t_ffw=0.0, ql=0, dt=0.0)


def test_a_site_never_observed_gets_the_cold_start_values(rt: GridRuntime) -> None:
    with rt.store.begin() as conn:
        got = queue_stats.queue_stats(conn, ["local-c", "local-c", "nowhere"], T0)
    cold = QueueStats(t_w=COLD_WAIT_S, t_ffw=0.0, ql=0, dt=COLD_INTERVAL_S)
    assert got == {"local-c": cold, "nowhere": cold}


# --------------------------------------------------------- record_observation on its own


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(f"sqlite:///{tmp_path}/alone.db", upgrade=True)


def job(jid: int, state: JobState, sub: float | None, start: float | None = None) -> ObservedJob:
    return ObservedJob(str(jid), 1, state, None, sub, start)


def rows(store: Store, site: str = "s") -> dict[str, float | None]:
    with store.begin() as conn:
        found = conn.execute(
            select(queue_waits.c.site_job_id, queue_waits.c.started_at).where(
                queue_waits.c.site == site
            )
        ).all()
    return {r.site_job_id: r.started_at for r in found}


def test_history_keeps_the_newest_started_rows_and_every_waiting_one(store: Store) -> None:
    assert HISTORY_STARTED == 500
    with store.begin() as conn:
        started = tuple(job(i, JobState.COMPLETED, 0.0, float(i)) for i in range(1, 11))
        waiting = tuple(job(100 + i, JobState.PENDING, 5.0) for i in range(3))
        obs = SiteObservation("s", 4, 0, started + waiting, 20.0)
        record_observation(conn, obs, keep_started=4)
        # another site's history is not trimmed by this site's observations
        record_observation(conn, SiteObservation("t", 4, 0, started, 20.0), keep_started=4)
        record_observation(conn, SiteObservation("s", 4, 0, waiting, 21.0), keep_started=4)
    assert rows(store) == {
        **{str(i): float(i) for i in (7, 8, 9, 10)},
        **{str(100 + i): None for i in range(3)},
    }
    assert len(rows(store, "t")) == 4


def test_what_a_report_shows_becomes_a_row(store: Store) -> None:
    jobs = (
        job(1, JobState.RUNNING, 10.0),  # running, no start reported: started by now
        job(2, JobState.PENDING, None),  # no submit time: nothing to learn from it
        job(3, JobState.CANCELLED, 10.0),  # finished without ever starting
        job(4, JobState.FAILED, 10.0, 12.0),  # ran and failed: a wait that ended
        job(5, JobState.PENDING, 11.0, 99.0),  # a forecast start is not a start
        ObservedJob("6", 1, JobState.PENDING, "gc-x-s1", 11.0),
    )
    with store.begin() as conn:
        record_observation(conn, SiteObservation("s", 4, 0, jobs, 20.0), own_job_ids={"5"})
        external = dict(
            conn.execute(select(queue_waits.c.site_job_id, queue_waits.c.external)).all()
        )
    assert rows(store) == {"1": 20.0, "4": 12.0, "5": None, "6": None}
    assert external == {"1": True, "4": True, "5": False, "6": False}
