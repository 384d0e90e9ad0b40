"""The Grid page's snapshot on PostgreSQL: one REPEATABLE READ transaction, so a site's
counters and the holds listed beside them agree even while other sessions claim and
release (under READ COMMITTED each statement would see its own moment)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from gridcore.api.dashboard import read_grid
from gridcore.config import default_grid
from gridcore.engine.runtime import GridRuntime
from gridcore.model import JobRequest
from gridcore.state.store import open_store

SNAPSHOTS = 20
DECISIONS = 5  # the recent decisions read at the end
HANG_S = 300.0  # only a hang fails on time


def test_every_snapshot_agrees_with_itself_while_others_claim(pg_url: str, tmp_path: Path) -> None:
    store = open_store(pg_url, upgrade=True)
    grid = default_grid(tmp_path)
    GridRuntime(grid, store)  # registers the sites
    stop = threading.Event()
    errors: list[BaseException] = []

    churned = {"local-a": 0, "local-b": 0}

    def churn(site: str) -> None:
        rt = GridRuntime(grid, store)
        try:
            while not stop.is_set():
                n = churned[site]
                record = rt.select(JobRequest(f"{site}-{n}", 1, 1.0), stream="churn", site=site)
                rt.cancel(record.selection_id)
                churned[site] = n + 1
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    workers = [threading.Thread(target=churn, args=(s,)) for s in ("local-a", "local-b")]
    for w in workers:
        w.start()
    # A count of snapshots, not a time (a loaded machine takes longer, never fewer), taken
    # while both churners claim and release: they are under way before the first, and
    # have moved on again by the last.
    snapshots = 0
    hang = time.monotonic() + HANG_S
    try:
        while not all(churned.values()) and not errors:
            assert time.monotonic() < hang, churned
            time.sleep(0.01)
        before = sum(churned.values())
        while not errors and (
            snapshots < SNAPSHOTS or sum(churned.values()) <= max(before, DECISIONS)
        ):
            assert time.monotonic() < hang, (snapshots, churned)
            snap = read_grid(store, time.time(), recent=DECISIONS)
            for site in snap["sites"]:
                assert sum(site["claimed_by_kind"].values()) == site["claimed"], site
                assert sum(site["queued_by_kind"].values()) == site["queued"], site
                held = sum(h["processors"] for h in site["holds"].values())
                assert held == site["claimed"] + site["queued"], site
            snapshots += 1
    finally:
        stop.set()
        for w in workers:
            w.join(30)
        store.dispose()
    assert not errors, errors
    again = open_store(pg_url)
    try:
        decided = read_grid(again, time.time(), recent=DECISIONS)["decisions"]
    finally:
        again.dispose()
    assert len(decided) == DECISIONS and all(d["kind"] == "selection" for d in decided)
