"""The KOALA scan lease on PostgreSQL: many engines in many processes, exactly one
holds it at any instant (issue 3 item 5: "exactly one scans at a time")."""

from __future__ import annotations

import itertools
import multiprocessing
import tempfile
import time
from pathlib import Path

import pytest

from gridcore.config import default_grid
from gridcore.engine.koala import KoalaEngine
from gridcore.engine.runtime import GridRuntime
from gridcore.policies.claiming import KoalaParams
from gridcore.state.store import open_store

pytestmark = pytest.mark.postgres


def _contend(url: str, index: int, rounds: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    home = Path(tempfile.mkdtemp(prefix="gc-lease-"))
    runtime = GridRuntime(default_grid(home), open_store(url))
    engine = KoalaEngine(
        runtime, params=KoalaParams(scan_interval_s=1.0), holder=f"p{index}", lease_s=30.0
    )
    held: list[tuple[float, float]] = []
    for _ in range(rounds):
        if engine._take_lease(time.time()) is not None:
            start = time.time()
            time.sleep(0.005)  # "scanning"
            end = time.time()
            engine.release_lease()
            held.append((start, end))
        time.sleep(0.001)
    out.put((index, held))
    runtime.store.dispose()


def test_exactly_one_engine_holds_the_scan_lease_at_a_time(pg_url: str) -> None:
    open_store(pg_url, upgrade=True).dispose()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_contend, args=(pg_url, i, 60, out)) for i in range(4)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    intervals = sorted(
        (start, end, index) for index, held in results.items() for start, end in held
    )
    assert len({index for _, _, index in intervals}) >= 2, "the lease changed hands"
    assert len(intervals) >= 20
    for (_, e1, i1), (s2, _, i2) in itertools.pairwise(intervals):
        assert s2 >= e1, f"p{i1} held the lease until {e1} but p{i2} took it at {s2}"
