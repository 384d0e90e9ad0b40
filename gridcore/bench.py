"""Benchmarks: ``gridcore bench selection``.

Each decision is the live engine's hot path: read a snapshot of every site in one
transaction, run the stateful policy, and commit the claim and the selection row
(:func:`gridcore.engine.ledger.select_and_record`). Site I/O is left out on purpose: it
is the sites' latency, not ours.

* ``decisions_per_s``: one process, 100 sites, 1,000 in-flight rows, SQLite.
* ``concurrent_decisions_per_s``: 8 processes against one PostgreSQL database, started
  together; total decisions over the wall time of the slowest process.
* ``overcommit_events``: after the concurrent run, sites whose claimed processors exceed
  what they granted (reported idle minus others' queue) plus sites whose ledger counters
  disagree with the selection rows; ``lost_rows``: decisions made but not in the DB.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sqlalchemy import create_engine, func, insert, select, text, update

from gridcore.engine import capacity, ledger
from gridcore.engine.capacity import HolderKind, Ledger
from gridcore.model import (
    ORIGIN,
    CoAllocationRequest,
    Component,
    GridSpec,
    InputFile,
    JobRequest,
    JobState,
    Outcome,
    Replica,
    RequestKind,
    SiteKind,
    SiteSnapshot,
    SiteSpec,
)
from gridcore.policies.placement import close_to_files
from gridcore.policies.selection import InsufficientMode, SelectionProtocol
from gridcore.sim.registry import Experiment
from gridcore.state.schema import selections, sites
from gridcore.state.store import Store, open_store

PG_ENV = "GRIDCORE_BENCH_PG_URL"
PROTOCOL = SelectionProtocol.STATEFUL
MODE = InsufficientMode.BEST
SITES = 100
IN_FLIGHT = 1000
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@dataclass(frozen=True)
class BenchGrid:
    grid: GridSpec
    idle: dict[str, int]


def make_grid(n_sites: int, seed: int) -> BenchGrid:
    rng = random.Random(seed)
    specs = tuple(
        SiteSpec(
            f"site{i:03d}", SiteKind.SLURM, rng.choice((64, 128, 256, 512)), rng.uniform(1.0, 2.0)
        )
        for i in range(n_sites)
    )
    bandwidth = {(ORIGIN, s.name): rng.uniform(10.0, 1000.0) for s in specs}
    grid = GridSpec(specs, MappingProxyType(bandwidth), 100.0, "<bench>")
    idle = {s.name: rng.randint(s.processors // 4, s.processors) for s in specs}
    return BenchGrid(grid, idle)


def seed_state(store: Store, bench: BenchGrid, in_flight: int, seed: int) -> None:
    """Register the sites, store an observation, and add ``in_flight`` of our jobs not
    yet visible: claims where the site still has room, queued otherwise."""
    rng = random.Random(seed)
    names = bench.grid.site_names
    free = dict(bench.idle)
    rows: list[dict[str, object]] = []
    kinds: list[Ledger] = []
    for i in range(in_flight):
        site, procs = rng.choice(names), rng.randint(1, 4)
        fits = free[site] >= procs
        kind = Ledger.CLAIMED if fits else Ledger.QUEUED
        free[site] -= procs if fits else 0
        kinds.append(kind)
        rows.append(
            {
                "stream": "seed",
                "name": f"seed{i}",
                "site": site,
                "processors": procs,
                "protocol": PROTOCOL.value,
                "mode": MODE.value,
                "outcome": (Outcome.FIT if fits else Outcome.QUEUE).label,
                "reasons": "[]",
                "state": JobState.PENDING.value,
                "selected_at": 0.0,
            }
        )
    with store.begin() as conn:
        ledger.register_sites(conn, bench.grid)
        for name in names:
            conn.execute(
                update(sites)
                .where(sites.c.name == name)
                .values(reported_idle=bench.idle[name], observed_at=1.0)
            )
        for row, kind in zip(rows, kinds, strict=True):
            capacity.add(
                conn,
                HolderKind.SELECTION,
                str(conn.execute(insert(selections), row).inserted_primary_key[0]),  # type: ignore[index]
                str(row["site"]),
                int(str(row["processors"])),
                kind,
                now=0.0,
            )


def run_decisions(store: Store, bench: BenchGrid, count: int, seed: int, stream: str) -> float:
    """Make ``count`` decisions; returns elapsed seconds."""
    rng = random.Random(seed)
    requests = [
        JobRequest(f"{stream}-{i}", rng.randint(1, 8), 600.0, rng.randint(0, 500) * 1_000_000)
        for i in range(count)
    ]
    snapshots = ledger.SnapshotReader(bench.grid)
    start = time.perf_counter()
    for req in requests:
        ledger.select_and_record(
            store,
            snapshots,
            req,
            PROTOCOL,
            MODE,
            stream,
            time.time(),
            rng,
        )
    return time.perf_counter() - start


def bench_sqlite(
    n_sites: int = SITES, in_flight: int = IN_FLIGHT, decisions: int = 2000, seed: int = 0
) -> dict[str, Any]:
    bench = make_grid(n_sites, seed)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{tmp}/bench.db", upgrade=True)
        seed_state(store, bench, in_flight, seed)
        run_decisions(store, bench, 50, seed + 1, "warmup")
        elapsed = run_decisions(store, bench, decisions, seed + 2, "bench")
        problems = check_ledger(store, bench)
        store.dispose()
    return {
        "sites": n_sites,
        "in_flight_rows": in_flight,
        "decisions": decisions,
        "seconds": round(elapsed, 4),
        "decisions_per_s": round(decisions / elapsed, 1),
        "ledger_problems": problems,
    }


@contextmanager
def pg_schema(base_url: str) -> Iterator[str]:
    """A throw-away schema in the benchmark database, so nothing real is touched."""
    schema = f"gc_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base_url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in base_url else "?"
    try:
        yield f"{base_url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _worker(
    url: str, n_sites: int, seed: int, index: int, count: int, barrier: Any, out: Any
) -> None:
    bench = make_grid(n_sites, seed)
    store = open_store(url, pool=True)
    run_decisions(store, bench, 5, seed + 100 + index, f"warm{index}")
    barrier.wait()
    start = time.time()
    elapsed = run_decisions(store, bench, count, seed + 200 + index, f"p{index}")
    out.put((index, start, start + elapsed, count))
    store.dispose()


def bench_postgres(
    url: str,
    processes: int = 8,
    per_process: int = 250,
    n_sites: int = SITES,
    in_flight: int = IN_FLIGHT,
    seed: int = 0,
) -> dict[str, Any]:
    bench = make_grid(n_sites, seed)
    with pg_schema(url) as scoped:
        store = open_store(scoped, upgrade=True)
        seed_state(store, bench, in_flight, seed)
        ctx = multiprocessing.get_context("spawn")
        barrier, out = ctx.Barrier(processes), ctx.Queue()
        procs = [
            ctx.Process(target=_worker, args=(scoped, n_sites, seed, i, per_process, barrier, out))
            for i in range(processes)
        ]
        for p in procs:
            p.start()
        results = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        starts, ends = min(r[1] for r in results), max(r[2] for r in results)
        made = sum(r[3] for r in results) + 5 * processes
        problems = check_ledger(store, bench)
        with store.begin() as conn:
            rows = conn.execute(
                select(func.count()).select_from(selections).where(selections.c.stream != "seed")
            ).scalar_one()
        store.dispose()
    total = processes * per_process
    return {
        "sites": n_sites,
        "in_flight_rows": in_flight,
        "processes": processes,
        "decisions": total,
        "seconds": round(ends - starts, 4),
        "concurrent_decisions_per_s": round(total / (ends - starts), 1),
        "overcommit_events": len(problems),
        "lost_rows": made - int(rows),
        "ledger_problems": problems,
    }


def check_ledger(store: Store, bench: BenchGrid) -> list[str]:
    """Every way the ledger could be wrong, as readable lines (empty when sound)."""
    problems = []
    with store.begin() as conn:
        totals = ledger.ledger_totals(conn)
        granted = {
            r.name: r.reported_idle - r.external_pending for r in conn.execute(select(sites))
        }
    for site, (claimed, claimed_rows, queued, queued_rows) in totals.items():
        if claimed != claimed_rows or queued != queued_rows:
            problems.append(
                f"{site}: counters {claimed}/{queued} != rows {claimed_rows}/{queued_rows}"
            )
        if claimed > granted[site]:
            problems.append(f"{site}: claimed {claimed} > granted {granted[site]}")
    return problems


def bench_selection(
    pg_url: str | None = None, decisions: int = 2000, per_process: int = 250
) -> dict[str, Any]:
    single = bench_sqlite(decisions=decisions)
    concurrent = bench_postgres(
        pg_url or os.environ.get(PG_ENV) or DEFAULT_PG_URL, per_process=per_process
    )
    return {
        "decisions_per_s": single["decisions_per_s"],
        "concurrent_decisions_per_s": concurrent["concurrent_decisions_per_s"],
        "overcommit_events": concurrent["overcommit_events"] + len(single["ledger_problems"]),
        "lost_rows": concurrent["lost_rows"],
        "sqlite": single,
        "postgres": concurrent,
        "setup": {
            "sites": single["sites"],
            "in_flight_rows": single["in_flight_rows"],
            "processes": concurrent["processes"],
            "protocol": PROTOCOL.value,
            "mode": MODE.value,
        },
    }


def bench_close_to_files(
    clusters: int = 1000, components: int = 8, repeats: int = 2000, seed: int = 0
) -> dict[str, float]:
    """Median milliseconds of one CF decision: a non-fixed request of ``components``
    equal components (as in seed 000 Sec. 4.2) with a 4 GB input file replicated at 3
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


def bench_placement(scan_jobs: int = 10_000, scan_sites: int = 100) -> dict[str, Any]:
    """``gridcore bench placement``: CF latency (1000 sites, 8 components) and one full
    scan of a 10,000-job placement queue over 100 sites (seed 000 Sec. 3.1)."""
    from gridcore.sim.koala_experiments import bench_scan

    return {**bench_close_to_files(), **bench_scan(jobs=scan_jobs, sites=scan_sites)}


def _selection_table(result: Mapping[str, Any]) -> str:
    keys = ("decisions_per_s", "concurrent_decisions_per_s", "overcommit_events")
    return " ".join(f"{key}={result[key]}" for key in keys)


def _placement_table(result: Mapping[str, Any]) -> str:
    return " ".join(f"{key}={value:.4g}" for key, value in result.items())


SELECTION = Experiment(
    "selection decisions per second: one process on SQLite, 8 on PostgreSQL",
    lambda options: bench_selection(options.pg_url, options.decisions, options.per_process),
    _selection_table,
    ok=lambda result: result["overcommit_events"] == 0 and result["lost_rows"] == 0,
)

PLACEMENT = Experiment(
    "CF latency over 1000 sites and one scan of a 10,000-job placement queue",
    lambda options: bench_placement(),
    _placement_table,
)
