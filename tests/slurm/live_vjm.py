"""VJM Sec. 4.2 / Fig. 3 live, from a checkout: ``python -m tests.slurm.live_vjm [--runs N]
[--plot PATH]`` (``gridcore experiment vjm-coallocation`` is the simulated figure; an
installed gridcore has no test grid to start).

Two real Slurm clusters of 16 processors started by the project's test grid
(:mod:`tests.slurmgrid`), each in its own network namespace: cluster A (``alpha``) with a
60 s scheduler interval, cluster B (``beta``) with 10 .. 120 s (``sched/builtin`` with
``defer,sched_interval=N,batch_sched_delay=N``: jobs start only on ticks, measured in
``docs/slurm-test-grid.md``). Per interval of B:

1. B gets its interval by ``scontrol reconfigure`` (after one more tick of the old one);
2. a fresh state database, so Eq. 1 sees only this point's history: three warm-up
   probes per cluster, each a batch of five one-processor site jobs (5-25 s apart so they
   meet the ticks at different phases) give each cluster's queue-wait history, as a
   running system would have it (the job pairs of the repeats add their own pilots' waits);
3. ``repeats`` times, after a pause uniform in [0, A's interval) (the warm-up ends just
   after a tick, which would bias every wait), back to back and then running together:
   a 10-processor job (g = 1,
   M = 2) co-reserved by VJM (Eq. 1 selection) and the same job with MPICH-G2's static
   machine file (round-robin: 5 on A, 5 on B). Co-allocation time = every pilot held -
   submission, as the engine records it.

Prints ``{"points": [{"b_interval_s", "vjm_s", "round_robin_s", ...}], ...}``. Needs Slurm
installed, root (namespaces) and minutes (each point waits for ticks of up to 120 s).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gridcore.api.server import start_in_thread
from gridcore.config import load_grid
from gridcore.engine.coreservation import CoReservationEngine, CoReservationParams
from gridcore.engine.phases import ReservationPhase
from gridcore.engine.runtime import GridRuntime
from gridcore.experiments.coreservation import expected_max_uniform, fig3_summary, half_width
from gridcore.model import CoReservationRequest, JobSubmission
from gridcore.state.store import open_store
from tests.slurmgrid import (
    ClusterLayout,
    SlurmGrid,
    set_scheduler_interval,
    start_grid,
    stop_grid,
)

A, B = "alpha", "beta"
A_INTERVAL_S = 60
B_INTERVALS_S = (10, 30, 60, 90, 120)
PROCESSORS = 10
PROBES = 3
# Each probe is a batch of 5 one-processor jobs at one instant: what a 10-processor job
# dealt round-robin sends (as the simulated warm-up, gridcore/experiments/coreservation.py).
# Single probes (the first live run, 2026-11-23) left Eq. 1's dt at the gap between
# ticks, so VJM spread a 10-pilot job over both clusters although the fast one's pilots
# all start at its next tick.
PROBE_BATCH = 5


def run_live(
    b_intervals: tuple[int, ...] = B_INTERVALS_S, repeats: int = 2, network: str = "netns"
) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="gridcore-vjm-live-"))
    layouts = (
        ClusterLayout(A, (16,), 1000, 200.0, sched_interval_s=A_INTERVAL_S),
        ClusterLayout(B, (8, 8), 2000, 100.0, sched_interval_s=b_intervals[0]),
    )
    grid = start_grid(base, layouts, network=network)
    points = []
    try:
        previous = b_intervals[0]
        for b in b_intervals:
            if b != previous:
                set_scheduler_interval(grid.cluster(B), b)
                time.sleep(previous + 2)  # one more tick of the old interval
            previous = b
            points.append(_point(grid, base / f"b{b}", b, repeats))
            print(json.dumps(points[-1]), file=sys.stderr)
    finally:
        stop_grid(grid)
    return {
        "points": points,
        "summary": fig3_summary(points),
        "setup": {
            "source": "VJM Sec. 4.2, Fig. 3, live on the Slurm test grid",
            "a_interval_s": A_INTERVAL_S,
            "b_intervals_s": list(b_intervals),
            "job_processors": PROCESSORS,
            "repeats": repeats,
            "warm_up_probes_per_cluster": PROBES,
            "warm_up_batch": PROBE_BATCH,
            "network": grid.network,
        },
        "live": True,
    }


def _point(grid: SlurmGrid, where: Path, b: int, repeats: int) -> dict[str, Any]:
    where.mkdir(parents=True)
    where.chmod(0o777)
    db_url = f"sqlite:///{where / 'state.db'}"
    runtime = GridRuntime(load_grid(str(grid.grid_toml)), open_store(db_url, upgrade=True))
    os.environ.update(grid.env)  # the clusters' tokens, referenced by the grid file
    center = start_in_thread(open_store(db_url), host="0.0.0.0", heartbeat_s=5.0)
    port = center.url.rsplit(":", 1)[1]
    urls = {c.name: f"http://{c.host_address}:{port}" for c in grid.clusters}
    engine = CoReservationEngine(
        runtime, urls[A], CoReservationParams(heartbeat_timeout_s=60.0), site_center_urls=urls
    )
    try:
        rng = random.Random(b)
        _warm_up(runtime, rng)
        vjm, rr, placements = [], [], []
        for i in range(repeats):
            # The warm-up (or the pair before) ends just after a tick: submit at a
            # uniform phase of A's interval instead, as a job arriving at any time would.
            time.sleep(rng.uniform(0.0, A_INTERVAL_S))
            job = CoReservationRequest(
                f"vjm-{b}-{i}", "true", PROCESSORS, max_clusters=2, sites=(A, B)
            )
            pinned = CoReservationRequest(
                f"rr-{b}-{i}",
                "true",
                PROCESSORS,
                machine_file=((A, PROCESSORS // 2), (B, PROCESSORS - PROCESSORS // 2)),
            )
            ids = [engine.submit(job), engine.submit(pinned)]
            records = _until_done(engine, ids, timeout=4 * max(A_INTERVAL_S, b) + 60)
            vjm.append(records[0].coallocation_s)
            rr.append(records[1].coallocation_s)
            placements.append(records[0].clusters)
    finally:
        center.stop()
        runtime.store.dispose()
    on_b = [p.get(B, 0) / PROCESSORS for p in placements]
    return {
        "b_interval_s": b,
        "vjm_s": statistics.mean(vjm),
        "round_robin_s": statistics.mean(rr),
        "vjm_halfwidth_s": half_width(vjm),
        "round_robin_halfwidth_s": half_width(rr),
        "vjm_fraction_on_b": statistics.mean(on_b),
        "min_interval_half_s": min(A_INTERVAL_S, b) / 2,
        "expected_max_of_ticks_s": expected_max_uniform(A_INTERVAL_S, b),
        "vjm_runs_s": vjm,
        "round_robin_runs_s": rr,
        "vjm_clusters": placements,
    }


def _warm_up(runtime: GridRuntime, rng: random.Random) -> None:
    """Probe jobs on both clusters, one per cluster every few seconds (uniform 5-25 s
    apart, so they meet the ticks at different phases), until each has started; the
    observations on the way are the queue-wait history Eq. 1 reads."""
    ids: dict[str, list[str]] = {A: [], B: []}
    for k in range(PROBES):
        for site in (A, B):
            ids[site] += [
                runtime.adapter(site).submit(JobSubmission(f"probe-{site}-{k}-{i}", "true", 1))
                for i in range(PROBE_BATCH)
            ]
        runtime.refresh()
        time.sleep(rng.uniform(5.0, 25.0))
    deadline = time.time() + 4 * max(A_INTERVAL_S, 120) + 60
    while time.time() < deadline:
        runtime.refresh()
        states = [runtime.adapter(s).status(j).state for s, js in ids.items() for j in js]
        if all(state.finished for state in states):
            runtime.refresh()
            return
        time.sleep(1.0)
    raise RuntimeError("warm-up probes did not finish")


def _until_done(engine: CoReservationEngine, ids: list[int], timeout: float) -> list[Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        engine.scan()
        records = [engine.status(i) for i in ids]
        if all(r.state is ReservationPhase.COMPLETED for r in records):
            return records
        bad = [r for r in records if r.finished and r.state is not ReservationPhase.COMPLETED]
        if bad:
            raise RuntimeError(f"live job ended {bad[0].state}: {bad[0].message}")
        time.sleep(0.5)
    raise RuntimeError(f"live jobs {ids} not completed in {timeout:.0f} s")


def main(argv: list[str] | None = None) -> int:
    import argparse

    from gridcore.experiments.coreservation import plot_coallocation

    parser = argparse.ArgumentParser(prog="python -m tests.slurm.live_vjm", description=__doc__)
    parser.add_argument("--runs", type=int, default=2, help="pairs per point (default 2)")
    parser.add_argument("--plot", help="also draw Fig. 3 to this PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    result = run_live(repeats=args.runs)
    if args.plot:
        plot_coallocation(result, args.plot)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
