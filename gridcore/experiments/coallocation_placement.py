"""KOALA's communication-aware placement experiment (e-Science 2006, Sec. 5-6, Fig. 7).

Design, equations and the choices where a paper is ambiguous: ``docs/experiments.md``
(section ``gridcore/experiments/coallocation_placement.py``).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from gridcore.errors import ConfigError
from gridcore.experiments.registry import (
    BACKGROUND,
    Experiment,
    RunOptions,
    background_figures,
    log_replay,
    text_table,
)
from gridcore.experiments.seeds import OverSeeds, increasing
from gridcore.model import RequestKind
from gridcore.policies.idle_soon import IdleSoon
from gridcore.policies.placement import PlacementPolicy
from gridcore.progress import progress
from gridcore.sim.coallocation import (
    FIG5_EXECUTION_S,
    SCAN_INTERVAL_S,
    CoallocRecord,
    CoallocRun,
    Fig5ExecutionTime,
    GridJob,
    coallocation_request,
    simulate_coallocation,
)
from gridcore.sim.log_load import LogReplay
from gridcore.sim.workload import BackgroundLoad, SimSite

DAS_TABLE1: tuple[tuple[str, str, int, int], ...] = (
    # (name, location in Table 1, total nodes, functioning nodes during the experiments)
    ("vu", "Vrije University", 72, 67),
    ("uva", "Uni. of Amsterdam", 32, 20),
    ("delft", "Delft University", 32, 26),
    ("utrecht", "Utrecht University", 32, 28),
    ("leiden", "Leiden University", 32, 19),
)
PROCESSORS_PER_NODE = 2
APPLICATION_SIZES: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {"laplace": (36, 64), "heat2d": (36, 64, 72)}
)
JOB_SIZES = frozenset(size for sizes in APPLICATION_SIZES.values() for size in sizes)
COMPONENT_COUNTS = (2, 3, 4)
MAX_COMPONENT_SIZE = 24
WORKLOADS: Mapping[str, float] = MappingProxyType({"W1": 80.0, "W2": 40.0})
JOBS_PER_WORKLOAD = 200
POLICIES = (PlacementPolicy.WF, PlacementPolicy.CM, PlacementPolicy.FCM)
METRICS = ("mean_response_s", "mean_wait_s", "mean_execution_s", "mean_clusters_combined")


def koala_placement_experiment(
    seed: int = 0,
    jobs: int = JOBS_PER_WORKLOAD,
    comm_factor: float = 1.0,
    runs: int = 1,
    growth_table: Mapping[int, tuple[float, ...]] = FIG5_EXECUTION_S,
    log: LogReplay | None = None,
) -> dict[str, Any]:
    """Fig. 7: WF, CM and FCM on W1 and W2 (docs/experiments.md), means per policy;
    execution times from ``growth_table`` with its co-allocation penalty scaled by
    ``comm_factor`` (:class:`gridcore.sim.coallocation.Fig5ExecutionTime`); ``log``:
    real other users' jobs besides the band-controlled load (``--background``)."""
    if jobs < 1 or runs < 1:
        raise ConfigError(f"jobs and runs must be >= 1, got jobs={jobs}, runs={runs}")
    _check_sizes(growth_table)
    clusters = das_clusters()
    execution = Fig5ExecutionTime(growth_table, comm_factor)
    background = BackgroundLoad()
    workloads: dict[str, dict[str, dict[str, float]]] = {}
    for workload in WORKLOADS:
        outcomes: dict[PlacementPolicy, list[CoallocRun]] = {p: [] for p in POLICIES}
        for run in progress(range(runs), f"workload {workload}", unit="run"):
            for policy in POLICIES:
                outcomes[policy].append(
                    placement_run(workload, seed, run, jobs, policy, execution, log)
                )
        workloads[workload] = {p.value: _summary(outcomes[p]) for p in POLICIES}
    return {
        "workloads": workloads,
        "setup": _setup(seed, jobs, execution, runs, clusters, background),
    } | background_figures(log)


def placement_run(
    workload: str,
    seed: int,
    run: int,
    jobs: int,
    policy: PlacementPolicy,
    execution: Fig5ExecutionTime,
    log: LogReplay | None = None,
    idle_soon: IdleSoon | None = None,
) -> CoallocRun:
    """Run ``run`` of ``--seed seed`` for one workload and policy: its trace, local load
    and clusters. The one place that says what a koala-placement run is, so that the
    idle-soon measurement's arm without the view is one by construction
    (docs/coallocation.md, "Idle soon from a wait model")."""
    run_seed = seed * 1_000_000 + run
    return simulate_coallocation(
        das_clusters(),
        workload_trace(run_seed, jobs, WORKLOADS[workload]),
        policy,
        execution,
        background=BackgroundLoad(),
        scan_interval_s=SCAN_INTERVAL_S,
        log=log,
        seed=run_seed * len(WORKLOADS) + list(WORKLOADS).index(workload),
        idle_soon=idle_soon,
    )


def koala_placement_table(result: Mapping[str, Any]) -> str:
    """Fig. 7's metrics per workload and policy, one line each."""
    columns = [
        ("load", "<4"),
        ("policy", "<4"),
        ("response_s", ">10.1f"),
        ("wait_s", ">8.1f"),
        ("exec_s", ">8.1f"),
        ("clusters", ">8.2f"),
    ]
    rows = [
        [load, policy, *(m[metric] for metric in METRICS)]
        for load, policies in result["workloads"].items()
        for policy, m in policies.items()
    ]
    return text_table(columns, rows)


def _run(options: RunOptions) -> dict[str, Any]:
    given = options.growth_table
    return koala_placement_experiment(
        seed=options.seed,
        comm_factor=1.0 if options.comm_factor is None else options.comm_factor,
        runs=options.runs or 1,
        growth_table=FIG5_EXECUTION_S if given is None else parse_growth_table(given),
        log=log_replay(options),
    )


def parse_growth_table(text: str) -> Mapping[int, tuple[float, ...]]:
    """``--growth-table``: a JSON object of execution times (s) by job size, one per number
    of clusters combined from 1 up, e.g. ``{"36": [100, 140, 170, 195], ...}``; checked
    as :class:`gridcore.sim.coallocation.Fig5ExecutionTime` checks its table (rows of >= 2
    positive, non-decreasing times) and for a row per job size of the workloads."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--growth-table: not JSON ({exc.msg}, column {exc.colno})") from exc
    if not isinstance(raw, dict):
        raise ConfigError('--growth-table: expected an object like {"36": [100, 140], ...}')
    table = MappingProxyType({_table_size(key): _table_row(key, row) for key, row in raw.items()})
    try:
        Fig5ExecutionTime(table)
        _check_sizes(table)
    except ConfigError as exc:
        raise ConfigError(f"--growth-table: {exc}") from exc
    return table


def das_clusters() -> tuple[SimSite, ...]:
    """Table 1's clusters with 2 processors per functioning node (docs/experiments.md)."""
    return tuple(
        SimSite(name, functioning * PROCESSORS_PER_NODE) for name, _, _, functioning in DAS_TABLE1
    )


def component_counts(size: int) -> tuple[int, ...]:
    """Sec. 5.4: 2, 3 or 4 equal components of at most 24 processors."""
    return tuple(k for k in COMPONENT_COUNTS if size % k == 0 and size // k <= MAX_COMPONENT_SIZE)


def workload_trace(seed: int, jobs: int, mean_interarrival_s: float) -> tuple[GridJob, ...]:
    """``jobs`` Poisson arrivals with the Sec. 5.4 job mix, drawn from ``seed``.

    The draws do not depend on ``mean_interarrival_s``, which only scales the gaps: W1 and
    W2 of one seed hold the same jobs.
    """
    # the seed string keeps the former module path, so seeded runs reproduce
    rng = random.Random(f"gridcore.sim.coalloc_experiments.trace:{seed}")
    applications = sorted(APPLICATION_SIZES)
    trace: list[GridJob] = []
    at = 0.0
    for index in range(jobs):
        at += rng.expovariate(1.0) * mean_interarrival_s
        application = rng.choice(applications)
        size = rng.choice(APPLICATION_SIZES[application])
        count = rng.choice(component_counts(size))
        trace.append(GridJob(f"j{index:03d}", at, (size // count,) * count, application))
    return tuple(trace)


def plot_koala_placement(result: Mapping[str, Any], path: str) -> None:
    """Write a PNG like Fig. 7: per metric, bars per policy for each workload."""
    # Imported here so the simulator never needs matplotlib; the Agg canvas is bound to
    # this figure only, leaving any global pyplot backend alone.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    workloads: Mapping[str, Mapping[str, Mapping[str, float]]] = result["workloads"]
    names = list(workloads)
    policies = list(next(iter(workloads.values())))
    panels = (
        ("mean_response_s", "Average response time (s)"),
        ("mean_wait_s", "Average wait time (s)"),
        ("mean_execution_s", "Average execution time (s)"),
        ("mean_clusters_combined", "Average number of clusters combined"),
    )
    width = 0.8 / len(policies)
    figure = Figure(figsize=(14, 4))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(panels))
    for ax, (metric, title) in zip(axes, panels, strict=True):
        for k, policy in enumerate(policies):
            offsets = [i + (k - (len(policies) - 1) / 2) * width for i in range(len(names))]
            values = [workloads[w][policy][metric] for w in names]
            ax.bar(offsets, values, width, label=policy)
        ax.set_xticks(range(len(names)), names)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    setup = result["setup"]
    figure.suptitle(
        f"KOALA placement policies on the DAS model ({setup['jobs']} jobs per workload,"
        f" comm_factor {setup['comm_factor']:g}, seed {setup['seed']}, runs {setup['runs']})"
    )
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)


def _check_sizes(table: Mapping[int, tuple[float, ...]]) -> None:
    missing = JOB_SIZES - table.keys()
    if missing:
        raise ConfigError(
            f"the execution-time growth table has no row for job size(s) {sorted(missing)};"
            f" the workloads need {sorted(JOB_SIZES)}"
        )


def _table_size(key: str) -> int:
    if not key.isdigit():
        raise ConfigError(f"--growth-table: job size {key!r} is not a whole number")
    return int(key)


def _table_row(key: str, row: object) -> tuple[float, ...]:
    if not isinstance(row, list) or not all(_finite_number(t) for t in row):
        raise ConfigError(f"--growth-table: size {key}: expected a list of finite numbers")
    return tuple(float(t) for t in row)


def _finite_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _summary(outcomes: Sequence[CoallocRun]) -> dict[str, float]:
    records: list[CoallocRecord] = [job for run in outcomes for job in run.jobs]
    return {
        "mean_response_s": statistics.fmean(r.response_s for r in records),
        "mean_wait_s": statistics.fmean(r.wait_s for r in records),
        "mean_execution_s": statistics.fmean(r.execution_s for r in records),
        "mean_clusters_combined": statistics.fmean(r.clusters_combined for r in records),
        "jobs": len(records),
    }


def _request_shape(policy: PlacementPolicy) -> str:
    kind = coallocation_request(GridJob("shape", 0.0, (1, 1)), policy).kind
    return f"{kind.value} (total)" if kind is RequestKind.FLEXIBLE else kind.value


def _setup(
    seed: int,
    jobs: int,
    execution: Fig5ExecutionTime,
    runs: int,
    clusters: Sequence[SimSite],
    background: BackgroundLoad,
) -> dict[str, Any]:
    total = sum(c.processors for c in clusters)
    low, high = background.band(total)
    return {
        "source": "Sonmez, Mohamed, Epema, e-Science 2006, Sec. 5-6 (DAS, W1/W2, Fig. 7)",
        "seed": seed,
        "runs": runs,
        "jobs": jobs,
        "comm_factor": execution.comm_factor,
        "clusters": [
            {
                "name": name,
                "location": location,
                "nodes": nodes,
                "functioning_nodes": functioning,
                "processors": functioning * PROCESSORS_PER_NODE,
            }
            for name, location, nodes, functioning in DAS_TABLE1
        ],
        "processors_per_node": PROCESSORS_PER_NODE,
        "total_processors": total,
        "workloads": {
            name: {"mean_interarrival_s": gap, "jobs": jobs, "arrivals": "Poisson"}
            for name, gap in WORKLOADS.items()
        },
        "applications": {app: list(sizes) for app, sizes in APPLICATION_SIZES.items()},
        "component_counts": {
            str(size): list(component_counts(size))
            for size in sorted({s for sizes in APPLICATION_SIZES.values() for s in sizes})
        },
        "max_component_size": MAX_COMPONENT_SIZE,
        "requests": {policy.value: _request_shape(policy) for policy in POLICIES},
        "execution_time_s": {
            "by_size_and_clusters": {str(size): list(row) for size, row in execution.table.items()},
            "rule": "t1 + comm_factor * (t_c - t1); beyond"
            f" {max(map(len, execution.table.values()))} clusters add the last step",
        },
        "scan_interval_s": SCAN_INTERVAL_S,
        "claiming": "immediate at placement; GRAM start-up overhead not modelled",
        "background": {
            "band_fraction": [background.low_fraction, background.high_fraction],
            "band_processors": [low, high],
            "scope": "system-wide",
            "mean_interarrival_s": background.interarrival_s(total),
            "nodes": list(background.nodes),
            "node_processors": background.node_processors,
            "duration_s": list(background.duration_s),
        },
    }


PAPER_ORDERING = tuple(
    # Sec. 6.2 on Fig. 7(a, b): "The average response time and average wait time ... show
    # that FCM performs consistently better than the other policies, and ... WF performs
    # consistently worse than the others, both when the resource contention is low and high."
    increasing(("workloads", workload), ("FCM", "CM", "WF"), metric)
    for workload in WORKLOADS
    for metric in ("mean_response_s", "mean_wait_s")
)

KOALA_PLACEMENT = Experiment(
    "KOALA e-Science 2006 Fig. 7: WF, CM and FCM placement on W1 and W2",
    _run,
    koala_placement_table,
    plot_koala_placement,
    default_runs=1,
    takes=frozenset({"comm_factor", "growth_table"}) | BACKGROUND,
    over_seeds=OverSeeds(("workloads",), PAPER_ORDERING),
)
