"""``gridcore bench coreservation``: what VJM costs besides the sites' own queue wait.

* ``selection_p50_ms``: the cluster selection algorithm (Eq. 1, steps 1-3) for 64
  virtual jobs over 100 clusters with random queue statistics, M = 8.
* ``overhead_p50_s``: per job of 4 pilots on the embedded local sites (idle, SQLite, the
  VJ center on uvicorn in this process, real pilot processes): from ``submit`` (selection,
  rows, holds, pilot submission) to the dispatch of the real command, i.e. selection +
  pilot submission + pilot start and registration + dispatch. The paper measured 1.67 s
  (Sec. 4.1, Fig. 2). The local sites start a job at once, so there is no queue wait in
  it; what remains of the site is starting a process, which ``python_start_p50_s``
  measures in the same run (the pilots' interpreter as they run it, ``-I -S -c pass``)
  for the ratio ``overhead_to_python_start``.
* ``dispatch_skew_p50_s``: per job, between the first and the last pilot starting the
  real command (each pilot's report of its start).
"""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gridcore.experiments.registry import Experiment, figures_line, run_bench_stages
from gridcore.policies.coreservation import ClusterView, QueueStats, select_clusters

SELECTION_REPEATS = 200
OVERHEAD_JOBS = 12


def bench_selection_latency(
    virtual_jobs: int = 64, clusters: int = 100, seed: int = 0
) -> dict[str, float]:
    rng = random.Random(seed)
    views = [
        ClusterView(
            f"c{i:03d}",
            QueueStats(
                t_w=rng.uniform(0, 600),
                t_ffw=rng.uniform(0, 300),
                ql=rng.randint(0, 20),
                dt=rng.uniform(1, 120),
            ),
            capacity=rng.choice((8, 16, 32, 64)),
        )
        for i in range(clusters)
    ]
    samples = []
    for _ in range(SELECTION_REPEATS):
        start = time.perf_counter()
        select_clusters(virtual_jobs, views, 8)
        samples.append(time.perf_counter() - start)
    return {"selection_p50_ms": statistics.median(samples) * 1e3}


def bench_overhead(jobs: int = OVERHEAD_JOBS) -> dict[str, Any]:
    from gridcore.api.server import start_in_thread
    from gridcore.config import default_grid
    from gridcore.engine.coreservation import CoReservationEngine
    from gridcore.engine.phases import ReservationPhase
    from gridcore.engine.runtime import GridRuntime
    from gridcore.model import CoReservationRequest
    from gridcore.state.store import open_store

    overheads: list[float] = []
    skews: list[float] = []
    with tempfile.TemporaryDirectory(prefix="gridcore-bench-vjm-") as tmp:
        url = f"sqlite:///{tmp}/state.db"
        runtime = GridRuntime(default_grid(Path(tmp)), open_store(url, upgrade=True))
        center = start_in_thread(open_store(url))
        try:
            engine = CoReservationEngine(runtime, center.url)
            for i in range(jobs):
                start = runtime.clock()
                job_id = engine.submit(
                    CoReservationRequest(f"bench-{i}", "true", 4, vj_size=1, max_clusters=3)
                )
                record = _wait(engine, job_id, ReservationPhase.COMPLETED)
                if record.dispatched_at is None or record.dispatch_skew_s is None:
                    raise RuntimeError(f"bench job {job_id} ran without a dispatch record")
                overheads.append(record.dispatched_at - start)
                skews.append(record.dispatch_skew_s)
                engine.scan()
        finally:
            center.stop()
            runtime.store.dispose()
    python_start = _python_start_p50_s()
    overhead = statistics.median(overheads)
    return {
        "overhead_p50_s": overhead,
        "overhead_max_s": max(overheads),
        "dispatch_skew_p50_s": statistics.median(skews),
        "dispatch_skew_max_s": max(skews),
        "python_start_p50_s": python_start,
        "overhead_to_python_start": overhead / python_start if python_start > 0 else None,
        "paper_overhead_s": 1.67,
        "jobs": jobs,
        "pilots_per_job": 4,
    }


def _wait(engine: Any, job_id: int, phase: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = engine.status(job_id)
        if record.state == phase:
            return record
        if record.finished:
            raise RuntimeError(f"bench job {job_id} ended {record.state}: {record.message}")
        time.sleep(0.01)
    raise RuntimeError(f"bench job {job_id} not {phase} after {timeout:g} s")


def _python_start_p50_s(repeats: int = 10) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench_coreservation() -> dict[str, Any]:
    stages: dict[str, Callable[[], dict[str, Any]]] = {
        "selection latency": bench_selection_latency,
        "per-job overhead": bench_overhead,
    }
    return run_bench_stages("bench coreservation", stages)


CORESERVATION = Experiment(
    "VJM: selection latency (64 VJs, 100 clusters), per-job overhead and dispatch skew"
    " of 4-pilot jobs on idle local sites",
    lambda options: bench_coreservation(),
    figures_line,
)
