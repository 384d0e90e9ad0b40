"""``gridcore bench placement``: how fast KOALA's placement decides (co-allocation).

* ``cf_8comp_1000sites_p50_ms``: median milliseconds of one Close-to-Files decision (seed
  000 Sec. 4.2's non-fixed request of 8 components, a 4 GB input replicated at 3 sites)
  over 1,000 random clusters.
* ``scan_10000jobs_100sites_s``: seconds for one scan of a 10,000-job placement queue over
  100 clusters (KOALA 2005 Sec. 3.1), ``placed`` how many it placed.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from gridcore.experiments.coallocation_claiming import (
    BACKBONE_MB_S,
    FILE_SIZES_GB,
    GB,
    JOB_SIZES,
    POLICY,
    REPLICAS,
    component_counts,
)
from gridcore.experiments.registry import Experiment, figures_line, run_bench_stages
from gridcore.model import (
    CoAllocationRequest,
    Component,
    GridSpec,
    InputFile,
    Priority,
    Replica,
    RequestKind,
    SiteKind,
    SiteSnapshot,
    SiteSpec,
)
from gridcore.policies.claiming import QueuedJob, scan_placement_queue
from gridcore.policies.placement import close_to_files
from gridcore.policies.transfer import uniform_bandwidth


def bench_placement(scan_jobs: int = 10_000, scan_sites: int = 100) -> dict[str, Any]:
    """``gridcore bench placement``: CF latency (1000 sites, 8 components) and one full
    scan of a 10,000-job placement queue over 100 sites (KOALA 2005 Sec. 3.1)."""
    stages: dict[str, Callable[[], dict[str, float]]] = {
        "CF latency": bench_close_to_files,
        "queue scan": lambda: bench_scan(jobs=scan_jobs, sites=scan_sites),
    }
    return run_bench_stages("bench placement", stages)


def bench_close_to_files(
    clusters: int = 1000, components: int = 8, repeats: int = 2000, seed: int = 0
) -> dict[str, float]:
    """Median milliseconds of one CF decision: a non-fixed request of ``components``
    equal components (as in KOALA 2005 Sec. 4.2) with a 4 GB input file replicated at 3
    sites, over ``clusters`` random clusters and a grid bandwidth matrix."""
    rng = random.Random(seed)
    snapshot = []
    for i in range(clusters):
        total = rng.choice((32, 64, 128, 256))
        snapshot.append(SiteSnapshot(f"C{i:04d}", total, rng.randint(total // 8, total)))
    holders = rng.sample(snapshot, min(3, clusters))
    replicas = tuple(
        Replica("bench.dat", c.site, f"file:///{c.site}/bench.dat", 4 * 10**9, "sha256:" + "0" * 64)
        for c in holders
    )
    # A grid description that lists the links from the file sites to every cluster.
    links = {(r.site, c.site): rng.uniform(10.0, 1000.0) for r in replicas for c in snapshot}
    grid = GridSpec(
        tuple(SiteSpec(c.site, SiteKind.LOCAL, c.total_processors) for c in snapshot),
        MappingProxyType(links),
        100.0,
        "<bench>",
    )
    size = rng.choice((4, 8, 16))
    request = CoAllocationRequest(
        "bench",
        RequestKind.NON_FIXED,
        (Component(size),) * components,
        input_file=InputFile("bench.dat"),
    )
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        close_to_files(request, snapshot, replicas=replicas, bandwidth=grid.bandwidth)
        samples.append(time.perf_counter() - start)
    return {f"cf_{components}comp_{clusters}sites_p50_ms": statistics.median(samples) * 1e3}


def bench_scan(jobs: int = 10_000, sites: int = 100, seed: int = 0) -> dict[str, float]:
    """Seconds for one scan of a ``jobs``-long placement queue over ``sites`` clusters with
    CF: Sec. 4.2's jobs with files replicated at 2 clusters, 100 Mbit/s links, clusters of
    the DAS's sizes partly busy."""
    # the seed string keeps the former module path, so seeded runs reproduce
    rng = random.Random(f"gridcore.sim.koala_experiments.bench_scan:{seed}")
    clusters = []
    for number in range(sites):
        total = rng.choice((64, 144))
        clusters.append(SiteSnapshot(f"c{number:03d}", total, rng.randint(0, total)))
    names = [c.site for c in clusters]
    queue = []
    for number in range(jobs):
        size = rng.choice(JOB_SIZES)
        count = rng.choice(component_counts(size))
        logical = f"job{number}.in"
        request = CoAllocationRequest(
            f"job{number}",
            RequestKind.NON_FIXED,
            (Component(size // count),) * count,
            input_file=InputFile(logical),
            priority=Priority.HIGH,
        )
        file_bytes = rng.choice(FILE_SIZES_GB) * GB
        replicas = tuple(
            Replica(logical, site, f"gsiftp://{site}/{logical}", file_bytes, "")
            for site in rng.sample(names, REPLICAS)
        )
        queue.append(QueuedJob(request, replicas))
    bandwidth = uniform_bandwidth(BACKBONE_MB_S)
    start = time.perf_counter()
    result = scan_placement_queue(queue, clusters, POLICY, bandwidth=bandwidth)
    elapsed = time.perf_counter() - start
    return {
        f"scan_{jobs}jobs_{sites}sites_s": elapsed,
        "placed": float(len(result.placed)),
    }


PLACEMENT = Experiment(
    "CF latency over 1000 sites and one scan of a 10,000-job placement queue",
    lambda options: bench_placement(),
    figures_line,
)
