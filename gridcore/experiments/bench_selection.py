"""``gridcore bench selection``: the live selection engine's decisions per second.

Each decision is the live engine's hot path: read a snapshot of every site in one
transaction, run the stateful policy, and commit the claim and the selection row
(:func:`gridcore.engine.selection.select_and_record`). Site I/O is left out on purpose: it
is the sites' latency, not ours.

* ``decisions_per_s``: one process, 100 sites, 1,000 in-flight rows, SQLite.
* ``concurrent_decisions_per_s``: 8 processes against one PostgreSQL database, started
  together; total decisions over the wall time of the slowest process.
* ``overcommit_events``: after the concurrent run, sites whose claimed processors exceed
  what they granted (reported idle minus others' queue) plus sites whose ledger counters
  disagree with the selection rows; ``lost_rows``: decisions made but not in the DB.

Batch decisions (:func:`gridcore.engine.selection.select_and_record_batch`): a burst of
:data:`BURST` members of one shape (a mapped task expansion) decided on one snapshot and
committed in one transaction, with the operators' default protocol.

* ``batch_members_per_s``: one process, SQLite, same grid and in-flight rows.
* ``concurrent_batch_members_per_s``: 8 processes of bursts against one PostgreSQL
  database; ``batch_overcommit_events`` (as above, plus the capacity invariant) and
  ``batch_lost_rows`` for the SQLite and PostgreSQL batch runs together.
* ``wait_models``: the single-decision and burst rates with the default wait model
  (``gridcore.engine.wait_models``) against Eq. W alone, on the same grid with every
  site observed (20 running, 10 pending and 60 finished jobs of other users each), both
  in each of 5 rounds on a fresh database, and their ratio per round and its median;
  under ``unobserved`` the same on sites never observed, as the figures above run
  (the default wait model checks each site and Eq. W decides).
* ``pgbench_tps``: the database's own limit for a decision's commit: the very statement a
  counted decision commits on PostgreSQL (conditional claim, selection row, hold), driven
  by ``pgbench`` with 8 clients (``-c 8 -j 2``, prepared) against the same server in the
  same run, on a throw-away schema where every claim fits. ``null`` with
  ``pgbench_reason`` when pgbench is missing or fails. Beside it the ratios of the
  8-process single-decision rate and of the 8-process batch rate to it.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sqlalchemy import create_engine, func, insert, select, text, update
from sqlalchemy.engine import make_url

from gridcore.engine import queue_stats
from gridcore.engine import selection as selection_engine
from gridcore.experiments.registry import Experiment
from gridcore.model import (
    ORIGIN,
    GridSpec,
    JobRequest,
    JobState,
    ObservedJob,
    Outcome,
    SiteKind,
    SiteObservation,
    SiteSpec,
)
from gridcore.policies.selection import DEFAULT_PROTOCOL, InsufficientMode, SelectionProtocol
from gridcore.policies.wait_prediction import DEFAULT_WAIT_MODEL
from gridcore.progress import run_stages
from gridcore.state import capacity
from gridcore.state.capacity import HolderKind, Ledger
from gridcore.state.schema import selections, sites
from gridcore.state.store import Store, open_store

PG_ENV = "GRIDCORE_BENCH_PG_URL"
PROTOCOL = SelectionProtocol.STATEFUL
MODE = InsufficientMode.BEST
SITES = 100
IN_FLIGHT = 1000
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
BURST = 100  # members per batch decision
BATCH_PROTOCOL = DEFAULT_PROTOCOL  # what a burst from the operators is decided with
PGBENCH = "/usr/bin/pgbench"
PGBENCH_SECONDS = 5


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
        capacity.register_sites(conn, bench.grid)
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


def run_decisions(
    store: Store,
    bench: BenchGrid,
    count: int,
    seed: int,
    stream: str,
    snapshots: selection_engine.SnapshotReader | None = None,
) -> float:
    """Make ``count`` decisions; returns elapsed seconds. ``snapshots``: the engine's
    reader (its wait models; default: a fresh one with the default model)."""
    rng = random.Random(seed)
    requests = [
        JobRequest(f"{stream}-{i}", rng.randint(1, 8), 600.0, rng.randint(0, 500) * 1_000_000)
        for i in range(count)
    ]
    snapshots = snapshots or selection_engine.SnapshotReader(bench.grid)
    start = time.perf_counter()
    for req in requests:
        selection_engine.select_and_record(
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


def burst_members(rng: random.Random, stream: str, index: int) -> list[JobRequest]:
    """One burst: :data:`BURST` members of one shape, as a mapped task expands them."""
    processors, inputs = rng.randint(1, 8), rng.randint(0, 500) * 1_000_000
    return [JobRequest(f"{stream}-{index}-{i}", processors, 600.0, inputs) for i in range(BURST)]


def run_bursts(
    store: Store,
    bench: BenchGrid,
    count: int,
    seed: int,
    stream: str,
    snapshots: selection_engine.SnapshotReader | None = None,
) -> float:
    """Decide and commit ``count`` bursts, one transaction each; returns elapsed seconds."""
    rng = random.Random(seed)
    bursts = [burst_members(rng, stream, b) for b in range(count)]
    snapshots = snapshots or selection_engine.SnapshotReader(bench.grid)
    start = time.perf_counter()
    for members in bursts:
        selection_engine.select_and_record_batch(
            store, snapshots, members, BATCH_PROTOCOL, MODE, stream, time.time(), rng
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


def bench_sqlite_batches(
    n_sites: int = SITES, in_flight: int = IN_FLIGHT, bursts: int = 20, seed: int = 0
) -> dict[str, Any]:
    bench = make_grid(n_sites, seed)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{tmp}/bench.db", upgrade=True)
        seed_state(store, bench, in_flight, seed)
        run_bursts(store, bench, 1, seed + 1, "warmup")
        elapsed = run_bursts(store, bench, bursts, seed + 2, "bench")
        problems = _ledger_and_invariant(store, bench)
        lost = (bursts + 1) * BURST - _selection_rows(store)
        store.dispose()
    return {
        "sites": n_sites,
        "in_flight_rows": in_flight,
        "burst": BURST,
        "bursts": bursts,
        "seconds": round(elapsed, 4),
        "batch_members_per_s": round(bursts * BURST / elapsed, 1),
        "overcommit_events": len(problems),
        "lost_rows": lost,
        "ledger_problems": problems,
    }


OBSERVED_RUNNING = 20  # per site, in the wait models' stage
OBSERVED_PENDING = 10
OBSERVED_FINISHED = 60


def observe_sites(store: Store, bench: BenchGrid, seed: int, now: float) -> None:
    """Store one observation per site as a Slurm site reports it: other users' running,
    pending (with Slurm's estimates) and finished jobs with limits and users, so each
    site's wait model has a queue to plan and a history to learn from."""
    rng = random.Random(seed)
    limits = (600.0, 1800.0, 3600.0)
    for spec in bench.grid.sites:
        jobs = [
            ObservedJob(
                f"r{i}",
                rng.randint(1, 4),
                JobState.RUNNING,
                None,
                now - 900,
                now - rng.randint(0, 800),
                f"u{i % 5}",
                rng.choice(limits),
            )
            for i in range(OBSERVED_RUNNING)
        ]
        jobs += [
            ObservedJob(
                f"p{i}",
                rng.randint(1, 8),
                JobState.PENDING,
                None,
                now - 100 + i,
                None,
                f"u{i % 5}",
                rng.choice(limits),
                None,
                now + 100 * i,
            )
            for i in range(OBSERVED_PENDING)
        ]
        jobs += [
            ObservedJob(
                f"f{i}",
                1,
                JobState.COMPLETED,
                None,
                now - 9000 + i,
                now - 8000 + i,
                f"u{i % 5}",
                3600.0,
                now - 7000 + rng.randint(0, 900),
            )
            for i in range(OBSERVED_FINISHED)
        ]
        busy = sum(j.processors for j in jobs if j.state is JobState.RUNNING)
        idle = max(0, bench.idle[spec.name] - busy)
        obs = SiteObservation(spec.name, spec.processors, idle, tuple(jobs), now)
        with store.begin() as conn:
            selection_engine.store_observation(conn, obs, own_job_ids=())
            queue_stats.record_observation(conn, obs)


def bench_wait_models(seed: int = 0) -> dict[str, Any]:
    """:func:`bench_wait_model_rates` on observed sites, and on sites never observed
    (as the figures above: the model only checks each site, Eq. W decides)."""
    return {
        **bench_wait_model_rates(seed=seed),
        "unobserved": bench_wait_model_rates(seed=seed, observed=False),
    }


def bench_wait_model_rates(
    rounds: int = 5, decisions: int = 300, bursts: int = 5, seed: int = 0, observed: bool = True
) -> dict[str, Any]:
    """The hot path with the default wait model against Eq. W alone, on sites that have
    been observed (each with a queue to plan and a history): per round a fresh database
    (the same seeded in-flight rows and observations), both engines in turn (order
    alternating), and the ratio of their rates measured side by side."""
    bench = make_grid(SITES, seed)
    ratios: dict[str, list[float]] = {"decisions": [], "batch_members": []}
    rates: dict[str, dict[str, list[float]]] = {
        name: {"decisions": [], "batch_members": []} for name in ("eq_w", "model")
    }
    engines: list[tuple[str, str | None]] = [("eq_w", None), ("model", DEFAULT_WAIT_MODEL)]
    for index in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            store = open_store(f"sqlite:///{tmp}/bench.db", upgrade=True)
            seed_state(store, bench, IN_FLIGHT, seed)
            if observed:
                observe_sites(store, bench, seed, time.time())
            got: dict[str, tuple[float, float]] = {}
            for name, model in engines if index % 2 == 0 else engines[::-1]:
                # one reader per engine, as a runtime keeps it: its models are trained by
                # the warm-up's first decision, not inside the measured ones
                reader = selection_engine.SnapshotReader(bench.grid, model)
                run_decisions(store, bench, 20, seed + 1, f"warm-{name}", reader)
                single = decisions / run_decisions(store, bench, decisions, seed + 2, name, reader)
                members = bursts * BURST / run_bursts(store, bench, bursts, seed + 3, name, reader)
                got[name] = (single, members)
                rates[name]["decisions"].append(single)
                rates[name]["batch_members"].append(members)
            store.dispose()
        ratios["decisions"].append(got["model"][0] / got["eq_w"][0])
        ratios["batch_members"].append(got["model"][1] / got["eq_w"][1])
    return {
        "wait_model": DEFAULT_WAIT_MODEL,
        "rounds": rounds,
        "observed_jobs_per_site": {
            "running": OBSERVED_RUNNING if observed else 0,
            "pending": OBSERVED_PENDING if observed else 0,
            "finished": OBSERVED_FINISHED if observed else 0,
        },
        "decisions_per_s": {name: _median(r["decisions"]) for name, r in rates.items()},
        "batch_members_per_s": {name: _median(r["batch_members"]) for name, r in rates.items()},
        "model_over_eq_w": {key: _median(values) for key, values in ratios.items()},
        "model_over_eq_w_per_round": {
            key: [round(v, 3) for v in values] for key, values in ratios.items()
        },
    }


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


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
    url: str,
    n_sites: int,
    seed: int,
    index: int,
    count: int,
    batches: bool,
    barrier: Any,
    out: Any,
) -> None:
    """``count`` decisions, or ``count`` bursts when ``batches``, after a warm-up."""
    bench = make_grid(n_sites, seed)
    store = open_store(url, pool=True)
    run = run_bursts if batches else run_decisions
    run(store, bench, 1 if batches else 5, seed + 100 + index, f"warm{index}")
    barrier.wait()
    start = time.time()
    elapsed = run(store, bench, count, seed + 200 + index, f"p{index}")
    out.put((index, start, start + elapsed, count))
    store.dispose()


@dataclass(frozen=True)
class ConcurrentRun:
    seconds: float  # from the first process's start to the slowest one's end
    problems: list[str]
    lost_rows: int


def _run_concurrent(
    url: str, processes: int, count: int, n_sites: int, in_flight: int, seed: int, batches: bool
) -> ConcurrentRun:
    """``processes`` workers started together against a fresh schema of one database."""
    bench = make_grid(n_sites, seed)
    with pg_schema(url) as scoped:
        store = open_store(scoped, upgrade=True)
        seed_state(store, bench, in_flight, seed)
        ctx = multiprocessing.get_context("spawn")
        barrier, out = ctx.Barrier(processes), ctx.Queue()
        procs = [
            ctx.Process(
                target=_worker, args=(scoped, n_sites, seed, i, count, batches, barrier, out)
            )
            for i in range(processes)
        ]
        for p in procs:
            p.start()
        results = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        starts, ends = min(r[1] for r in results), max(r[2] for r in results)
        per_unit = BURST if batches else 1
        made = (sum(r[3] for r in results) + (1 if batches else 5) * processes) * per_unit
        problems = _ledger_and_invariant(store, bench) if batches else check_ledger(store, bench)
        rows = _selection_rows(store)
        store.dispose()
    return ConcurrentRun(ends - starts, problems, made - rows)


def bench_postgres(
    url: str,
    processes: int = 8,
    per_process: int = 250,
    n_sites: int = SITES,
    in_flight: int = IN_FLIGHT,
    seed: int = 0,
) -> dict[str, Any]:
    run = _run_concurrent(url, processes, per_process, n_sites, in_flight, seed, batches=False)
    total = processes * per_process
    return {
        "sites": n_sites,
        "in_flight_rows": in_flight,
        "processes": processes,
        "decisions": total,
        "seconds": round(run.seconds, 4),
        "concurrent_decisions_per_s": round(total / run.seconds, 1),
        "overcommit_events": len(run.problems),
        "lost_rows": run.lost_rows,
        "ledger_problems": run.problems,
    }


def bench_postgres_batches(
    url: str,
    processes: int = 8,
    bursts_per_process: int = 10,
    n_sites: int = SITES,
    in_flight: int = IN_FLIGHT,
    seed: int = 0,
) -> dict[str, Any]:
    run = _run_concurrent(
        url, processes, bursts_per_process, n_sites, in_flight, seed, batches=True
    )
    members = processes * bursts_per_process * BURST
    return {
        "sites": n_sites,
        "in_flight_rows": in_flight,
        "processes": processes,
        "burst": BURST,
        "bursts": processes * bursts_per_process,
        "seconds": round(run.seconds, 4),
        "concurrent_batch_members_per_s": round(members / run.seconds, 1),
        "overcommit_events": len(run.problems),
        "lost_rows": run.lost_rows,
        "ledger_problems": run.problems,
    }


def bench_pgbench(
    url: str,
    clients: int = 8,
    threads: int = 2,
    seconds: int = PGBENCH_SECONDS,
    n_sites: int = SITES,
    seed: int = 0,
) -> dict[str, Any]:
    """pgbench driving a decision's commit statement (:func:`pgbench_script`) on a
    throw-away schema of the same server; ``pgbench_tps`` None with a reason when
    pgbench is missing or its run fails."""
    program = shutil.which("pgbench") or (PGBENCH if os.access(PGBENCH, os.X_OK) else None)
    if program is None:
        return {"pgbench_tps": None, "pgbench_reason": f"pgbench not on PATH nor at {PGBENCH}"}
    bench = make_grid(n_sites, seed)
    with pg_schema(url) as scoped, tempfile.TemporaryDirectory() as tmp:
        store = open_store(scoped, upgrade=True)
        with store.begin() as conn:
            capacity.register_sites(conn, bench.grid)
            # Every claim fits: each transaction is a claim, a selection row and a hold.
            conn.execute(update(sites).values(reported_idle=2**30, observed_at=1.0))
        script = os.path.join(tmp, "decision.sql")
        with open(script, "w") as f:
            f.write(pgbench_script(bench))
        target = make_url(scoped)
        command = [
            program, "--no-vacuum", "--protocol=prepared", f"--client={clients}",
            f"--jobs={threads}", f"--time={seconds}", f"--file={script}",
            f"--host={target.host or '127.0.0.1'}", f"--port={target.port or 5432}",
            f"--username={target.username or 'postgres'}", target.database or "postgres",
        ]  # fmt: skip
        env = {**os.environ, "PGOPTIONS": str(target.query.get("options", ""))}
        if target.password:
            env["PGPASSWORD"] = target.password
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=seconds + 120, check=False
        )
        rows = _selection_rows(store)
        store.dispose()
    setup = {"clients": clients, "threads": threads, "seconds": seconds, "rows": rows}
    tps = re.search(r"^tps = ([0-9.]+) \(without initial connection time\)", done.stdout, re.M)
    processed = re.search(r"^number of transactions actually processed: (\d+)", done.stdout, re.M)
    if done.returncode != 0 or tps is None or processed is None:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:]
        why = f"pgbench exited {done.returncode}: {last[0] if last else 'no output'}"
        return {"pgbench_tps": None, "pgbench_reason": why, **setup}
    if int(processed[1]) != rows:
        why = f"{processed[1]} transactions but {rows} selection rows: not every claim committed"
        return {"pgbench_tps": None, "pgbench_reason": why, **setup}
    return {"pgbench_tps": round(float(tps[1]), 1), "pgbench_reason": None, **setup}


def pgbench_script(bench: BenchGrid) -> str:
    """One pgbench transaction: the statement a counted FIT decision commits on
    PostgreSQL (:func:`gridcore.engine.selection.pg_decision_sql`) with its placeholders
    as pgbench expressions: a random site of the grid and 1-8 processors, as the
    benchmark's decisions draw them."""
    names = bench.grid.site_names
    if names != tuple(f"site{i:03d}" for i in range(len(names))):
        raise ValueError("pgbench_script: the grid's sites must be named as make_grid does")
    values = {
        "b_site": "('site' || lpad(CAST(:site AS text), 3, '0'))",
        "b_processors": ":processors",
        "b_bytes": "0",
        "b_ledger": f"'{Ledger.CLAIMED.value}'",
        "b_stream": "'pgbench'",
        "b_name": "'pgbench'",
        "b_protocol": f"'{PROTOCOL.value}'",
        "b_mode": f"'{MODE.value}'",
        "b_outcome": f"'{Outcome.FIT.label}'",
        "b_reasons": "'[]'",
        "b_state": f"'{JobState.SELECTED.value}'",
        "b_selected_at": "0.0",
    }
    statement = re.sub(r"%\((\w+)\)s", lambda m: values[m[1]], selection_engine.pg_decision_sql())
    return f"\\set site random(0, {len(names) - 1})\n\\set processors random(1, 8)\n{statement};\n"


def _selection_rows(store: Store) -> int:
    """Selections made by the run (not the seeded in-flight ones)."""
    with store.begin() as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(selections).where(selections.c.stream != "seed")
            ).scalar_one()
        )


def _ledger_and_invariant(store: Store, bench: BenchGrid) -> list[str]:
    with store.begin() as conn:
        invariant = capacity.check_invariant(conn)
    return check_ledger(store, bench) + invariant


def check_ledger(store: Store, bench: BenchGrid) -> list[str]:
    """Every way the ledger could be wrong, as readable lines (empty when sound)."""
    problems = []
    with store.begin() as conn:
        totals = capacity.totals(conn)
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
    url = pg_url or os.environ.get(PG_ENV) or DEFAULT_PG_URL
    # SQLite first: a PostgreSQL run's aftermath (its processes exiting, its schema
    # dropped) would still be loading the machine
    stages: dict[str, Callable[[], dict[str, Any]]] = {
        "SQLite decisions": lambda: bench_sqlite(decisions=decisions),
        "SQLite bursts": bench_sqlite_batches,
        "PostgreSQL decisions": lambda: bench_postgres(url, per_process=per_process),
        "PostgreSQL bursts": lambda: bench_postgres_batches(url),
        "pgbench": lambda: bench_pgbench(url),
        "SQLite wait models": bench_wait_models,
    }
    results = run_stages("bench selection", stages)
    single, batches = results["SQLite decisions"], results["SQLite bursts"]
    concurrent, concurrent_batches = results["PostgreSQL decisions"], results["PostgreSQL bursts"]
    pgbench = results["pgbench"]
    tps = pgbench["pgbench_tps"]
    return {
        "decisions_per_s": single["decisions_per_s"],
        "concurrent_decisions_per_s": concurrent["concurrent_decisions_per_s"],
        "overcommit_events": concurrent["overcommit_events"] + len(single["ledger_problems"]),
        "lost_rows": concurrent["lost_rows"],
        "batch_members_per_s": batches["batch_members_per_s"],
        "concurrent_batch_members_per_s": concurrent_batches["concurrent_batch_members_per_s"],
        "batch_overcommit_events": (
            batches["overcommit_events"] + concurrent_batches["overcommit_events"]
        ),
        "batch_lost_rows": batches["lost_rows"] + concurrent_batches["lost_rows"],
        "pgbench_tps": tps,
        "pgbench_reason": pgbench["pgbench_reason"],
        "concurrent_decisions_to_pgbench": _ratio(concurrent["concurrent_decisions_per_s"], tps),
        "concurrent_batch_members_to_pgbench": _ratio(
            concurrent_batches["concurrent_batch_members_per_s"], tps
        ),
        "sqlite": single,
        "postgres": concurrent,
        "sqlite_batches": batches,
        "postgres_batches": concurrent_batches,
        "pgbench": pgbench,
        "wait_models": results["SQLite wait models"],
        "setup": {
            "sites": single["sites"],
            "in_flight_rows": single["in_flight_rows"],
            "processes": concurrent["processes"],
            "protocol": PROTOCOL.value,
            "mode": MODE.value,
            "burst": BURST,
            "batch_protocol": BATCH_PROTOCOL.value,
        },
    }


def _ratio(rate: float, tps: float | None) -> float | None:
    return None if tps is None else round(rate / tps, 3)


def _selection_table(result: Mapping[str, Any]) -> str:
    keys = (
        "decisions_per_s",
        "concurrent_decisions_per_s",
        "batch_members_per_s",
        "concurrent_batch_members_per_s",
        "pgbench_tps",
        "concurrent_decisions_to_pgbench",
        "concurrent_batch_members_to_pgbench",
        "overcommit_events",
        "batch_overcommit_events",
    )
    table = " ".join(f"{key}={result[key]}" for key in keys)
    if result["pgbench_reason"]:
        table += f" (pgbench: {result['pgbench_reason']})"
    return table


SELECTION = Experiment(
    "selection decisions per second: one process on SQLite, 8 on PostgreSQL",
    lambda options: bench_selection(options.pg_url, options.decisions, options.per_process),
    _selection_table,
    ok=lambda result: (
        not any(
            result[key]
            for key in (
                "overcommit_events",
                "lost_rows",
                "batch_overcommit_events",
                "batch_lost_rows",
            )
        )
    ),
)
