"""Two pollers that see one job's end at once (a task's trigger, and another process's
refresh ending the selections nobody polls, docs/operators.md) end its selection once on
PostgreSQL: the second waits on the first's row lock, then finds the row ended. The
interleaving is aimed: the first poller is held inside its transaction, after its update
and before its commit, until PostgreSQL shows the second one waiting on that lock."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from gridcore.config import default_grid
from gridcore.engine import selection as selection_engine
from gridcore.engine.runtime import GridRuntime
from gridcore.model import JobRequest, JobSubmission
from gridcore.sites.local import LocalSite
from gridcore.state.schema import sites
from gridcore.state.store import open_store
from tests.capacity_checks import assert_capacity_invariant

pytestmark = pytest.mark.postgres

SECOND = "gridcore-second-poller"
HANG_S = 120.0  # only catches a hang


def test_two_pollers_ending_one_selection_at_once_count_its_end_once(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_store = open_store(pg_url, upgrade=True)
    second_store = open_store(f"{pg_url}&application_name={SECOND}")
    grid = default_grid(tmp_path)
    first, second = GridRuntime(grid, first_store), GridRuntime(grid, second_store)
    try:
        record = first.select(JobRequest("once", 1, 1.0), site="local-a")
        record = first.submit(record.selection_id, JobSubmission("once", "true", 1))
        site = first.adapter("local-a")
        assert isinstance(site, LocalSite)
        rc = site.workdir(str(record.job_id)) / "rc"
        _wait_until(rc.exists, "the job to end")

        inside, go = threading.Event(), threading.Event()
        release = selection_engine.release

        def held_release(conn: Any, selection_id: int) -> bool:
            if threading.current_thread().name == "first":
                inside.set()
                assert go.wait(HANG_S)
            return release(conn, selection_id)

        monkeypatch.setattr(selection_engine, "release", held_release)
        errors: list[BaseException] = []

        def poll(runtime: GridRuntime) -> None:
            try:
                runtime.poll(record.selection_id)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=poll, args=(first,), name="first"),
            threading.Thread(target=poll, args=(second,), name="second"),
        ]
        threads[0].start()
        assert inside.wait(HANG_S)
        threads[1].start()
        _wait_until(lambda: _waiting_on_a_lock(first_store), "the second poller to wait")
        go.set()
        for thread in threads:
            thread.join(HANG_S)
        assert errors == []

        ended = first.record(record.selection_id)
        assert (ended.state, ended.exit_code) == ("completed", 0)
        with first_store.begin() as conn:
            finished_jobs = conn.execute(
                select(sites.c.finished_jobs).where(sites.c.name == "local-a")
            ).scalar_one()
        assert finished_jobs == 1, "the end was counted twice"
        assert_capacity_invariant(first_store, no_live_holds=True)
    finally:
        first_store.dispose()
        second_store.dispose()


def _waiting_on_a_lock(store: Any) -> bool:
    with store.begin() as conn:
        waiting = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = :name AND wait_event_type = 'Lock'"
            ),
            {"name": SECOND},
        ).scalar_one()
    return bool(waiting)


def _wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not condition():
        assert time.monotonic() < deadline, f"waited {HANG_S:g} s for {what}"
        time.sleep(0.05)
