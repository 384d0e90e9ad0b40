"""``gridcore bench slurm-polling``: what watching many jobs costs a Slurm controller.

On one live Slurm site of the grid (``--grid`` / ``$GRIDCORE_GRID``, ``--site`` or the
grid's first Slurm site), ``JOBS`` jobs of one processor are submitted (``sleep``: a few
run, the rest pend), then watched for ``CYCLES`` poll cycles by ``JOBS`` watchers, each
with its own adapter as each trigger in a triggerer has (the adapters of one process share
the site's job listing, :mod:`gridcore.sites.slurm`). The same jobs are then watched the
way a per-job poller does (``GET /job/{id}`` for each job in each cycle). Every job is
cancelled at the end, also when the run fails.

Figures: ``rest_calls_per_cycle_per_site`` (goal <= 2) beside ``per_job_calls_per_cycle``
and their ratio; the median seconds per cycle of each way, and their ratio (measured in
the same run: the machine's noise cancels). A cycle's spacing is the trigger's poll
interval, given to the adapters as their clock (no real waiting between cycles).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gridcore import credentials
from gridcore.errors import ConfigError, GridError
from gridcore.experiments.registry import Experiment, RunOptions, text_table
from gridcore.model import JobResources, JobSubmission, SiteKind, SiteSpec

log = logging.getLogger(__name__)

JOBS = 200
CYCLES = 5
POLL_INTERVAL_S = 10.0  # the site job trigger's default poll interval and more
GOAL_CALLS_PER_CYCLE = 2
THREADS = 32  # asyncio.to_thread's default pool on a 28-core triggerer host


def bench_slurm_polling(
    grid_file: str | None, site: str | None, jobs: int = JOBS, cycles: int = CYCLES
) -> dict[str, Any]:
    from gridcore.engine.runtime import GridRuntime
    from gridcore.sites.slurm import SlurmSite

    runtime = GridRuntime.open(grid_file)
    try:
        spec = _slurm_site(runtime.grid.sites, site)
        adapter = runtime.adapter(spec.name)
        if not isinstance(adapter, SlurmSite):
            raise ConfigError(f"--site: {spec.name} is not a Slurm site")
        ids = _submit(adapter, spec, jobs)
        try:
            now = [0.0]

            tokens = credentials.token_source(spec.token, spec.name) if spec.token else None
            if tokens is None:
                raise ConfigError(f"site {spec.name}: a Slurm site needs a token reference")

            def watcher(shared: bool) -> SlurmSite:
                return SlurmSite(spec, tokens, clock=lambda: now[0], share_listing=shared)

            shared = _watch(ids, [watcher(True) for _ in ids], cycles, now, adapter)
            per_job = _watch(ids, [watcher(False) for _ in ids], cycles, now, adapter)
        finally:
            _cancel_all(adapter, ids)
        return {
            "site": spec.name,
            "release": adapter.release,
            "api_version": adapter.api_version,
            "jobs": len(ids),
            "cycles": cycles,
            "rest_calls_per_cycle_per_site": shared["calls_per_cycle"],
            "per_job_calls_per_cycle": per_job["calls_per_cycle"],
            "calls_ratio": per_job["calls_per_cycle"] / max(shared["calls_per_cycle"], 1e-9),
            "shared_cycle_s": shared["cycle_s"],
            "per_job_cycle_s": per_job["cycle_s"],
            "cycle_time_ratio": per_job["cycle_s"] / max(shared["cycle_s"], 1e-9),
            "goal_calls_per_cycle": GOAL_CALLS_PER_CYCLE,
        }
    finally:
        runtime.store.dispose()


def _slurm_site(sites: tuple[SiteSpec, ...], name: str | None) -> SiteSpec:
    slurm = [s for s in sites if s.kind is SiteKind.SLURM]
    if name is not None:
        for spec in slurm:
            if spec.name == name:
                return spec
        raise ConfigError(f"--site: no Slurm site {name!r} in the grid")
    if not slurm:
        raise ConfigError("the grid has no Slurm site (give --grid with one)")
    return slurm[0]


def _submit(adapter: Any, spec: SiteSpec, jobs: int) -> list[str]:
    ids: list[str] = []
    try:
        for i in range(jobs):
            job = JobSubmission(
                name=f"bench-poll-{i}",
                command="sleep 600",
                processors=1,
                resources=JobResources(time_limit_s=900),
            )
            ids.append(adapter.submit(job))
    except BaseException:
        _cancel_all(adapter, ids)
        raise
    return ids


def _cancel_all(adapter: Any, ids: list[str]) -> None:
    """Cancel every job the bench submitted; one that fails does not stop the rest."""
    for job_id in ids:
        try:
            adapter.cancel(job_id)
        except GridError as exc:
            log.warning("could not cancel bench job %s: %s", job_id, exc)


def _watch(
    ids: list[str], watchers: list[Any], cycles: int, now: list[float], counter: Any
) -> dict[str, float]:
    """``cycles`` poll cycles, each watcher reading its own job's status once, from
    ``THREADS`` threads at once (as a triggerer's triggers poll from worker threads)."""
    calls: list[int] = []
    seconds: list[float] = []
    pairs = list(zip(watchers, ids, strict=True))
    with ThreadPoolExecutor(THREADS) as pool:
        for _ in range(cycles):
            now[0] += POLL_INTERVAL_S
            before = counter.rest_calls
            start = time.perf_counter()
            list(pool.map(lambda pair: pair[0].status(pair[1]), pairs))
            seconds.append(time.perf_counter() - start)
            calls.append(counter.rest_calls - before)
    return {"calls_per_cycle": statistics.mean(calls), "cycle_s": statistics.median(seconds)}


def _table(result: Mapping[str, Any]) -> str:
    columns = [("poller", "<10"), ("REST calls / cycle", ">18.1f"), ("s / cycle", ">10.3f")]
    rows = [
        ("shared", result["rest_calls_per_cycle_per_site"], result["shared_cycle_s"]),
        ("per job", result["per_job_calls_per_cycle"], result["per_job_cycle_s"]),
    ]
    head = (
        f"{result['jobs']} jobs on {result['site']} (Slurm {result['release']}, REST "
        f"{result['api_version']}), {result['cycles']} cycles"
    )
    return head + "\n" + text_table(columns, rows)


def _run(options: RunOptions) -> dict[str, Any]:
    return bench_slurm_polling(options.grid, options.site)


def _ok(result: Mapping[str, Any]) -> bool:
    return bool(result["rest_calls_per_cycle_per_site"] <= GOAL_CALLS_PER_CYCLE)


SLURM_POLLING: Experiment = Experiment(
    f"{JOBS} jobs watched on one live Slurm site for {CYCLES} poll cycles: REST calls per"
    " cycle with the shared listing (goal <= 2) and with a per-job poller",
    _run,
    _table,
    ok=_ok,
    takes=frozenset({"grid", "site"}),
)
