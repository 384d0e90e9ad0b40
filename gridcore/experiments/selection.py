"""Experiments reproducing the seed papers' comparisons on ``gridcore.sim`` models.

Design, equations and the choices where a paper is ambiguous: ``docs/experiments.md``
(section ``gridcore/experiments/selection.py``).
"""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
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
from gridcore.policies.selection import DEFAULT_PROTOCOL, InsufficientMode, SelectionProtocol
from gridcore.progress import progress
from gridcore.sim.log_load import LogReplay
from gridcore.sim.selection import (
    MDS_INTERVAL_S,
    SelectionRun,
    SimJob,
    StreamConfig,
    simulate_selection,
)
from gridcore.sim.workload import LocalJob, SimSite

TABLE1_SITES: Mapping[str, tuple[str, int, float]] = MappingProxyType(
    {
        # name: (host in Table 1, CPUs, slowness)
        "canbc01": ("canbc01.louisiana.edu", 6, 1.00),
        "ci-team": ("ci-team.acis.ufl.edu", 4, 1.05),
        "mileva": ("mileva.hpc.odu.edu", 16, 1.10),
        "scoops": ("scoops.itsc.uah.edu", 8, 1.15),
    }
)
ENSEMBLE_MEMBERS = 10
MEMBER_SPACING_S = 30.0
BURST_STARTS_S = (240.0, 300.0)  # cron at four and five minutes past the hour
MEMBER_PROCESSORS = (2, 4)
MEMBER_RUNTIME_S = (300.0, 900.0)
HYSTERESIS_S = (90.0, 150.0)

METRICS = ("completion_s", "total_queue_s", "mean_queue_s", "total_compute_s", "mean_compute_s")
TABLE_METRICS = METRICS[:3]

_UNIFIED = "ensemble"
_SHARED = "shared"
PROTOCOLS: Mapping[str, tuple[bool, StreamConfig]] = MappingProxyType(
    {
        # name: (keep the trace's two streams?, configuration of every stream)
        "naive": (False, StreamConfig(SelectionProtocol.NAIVE, InsufficientMode.RANDOM, _UNIFIED)),
        "stateful_random": (
            False,
            StreamConfig(SelectionProtocol.STATEFUL, InsufficientMode.RANDOM, _UNIFIED),
        ),
        "stateful_best": (
            False,
            StreamConfig(SelectionProtocol.STATEFUL, InsufficientMode.BEST, _UNIFIED),
        ),
        "stateful_earliest": (
            False,
            StreamConfig(SelectionProtocol.STATEFUL, InsufficientMode.EARLIEST, _UNIFIED),
        ),
        "stateful_split": (True, StreamConfig(SelectionProtocol.STATEFUL, InsufficientMode.BEST)),
        "stateful_split_shared": (
            True,
            StreamConfig(SelectionProtocol.STATEFUL, InsufficientMode.BEST, _SHARED),
        ),
        # beyond the paper: the operators' default, shown beside Fig. 2's protocols
        DEFAULT_PROTOCOL.value: (False, StreamConfig(DEFAULT_PROTOCOL, state=_UNIFIED)),
    }
)


@dataclass(frozen=True)
class SelectionTrace:
    """A job trace on a set of sites, with the description reported alongside results."""

    sites: tuple[SimSite, ...]
    jobs: tuple[SimJob, ...]
    description: Mapping[str, Any]
    external: tuple[LocalJob, ...] = ()
    monitor_interval_s: float = MDS_INTERVAL_S


def stateful_selection_experiment(
    runs: int = 20,
    seed: int = 0,
    monitor_interval_s: float | None = None,
    case: int | None = None,
    log: LogReplay | None = None,
) -> dict[str, Any]:
    """Fig. 2: every protocol of :data:`PROTOCOLS` on the canonical trace for ``seed``
    (or on selection-robustness's random ``case``), the monitor publishing every
    ``monitor_interval_s`` (default: the trace's, MDS's 60 s for the canonical one);
    ``log``: real other users' jobs besides the trace's (``--background``)."""
    trace = canonical_trace(seed) if case is None else robustness_case_trace(case)
    interval = trace.monitor_interval_s if monitor_interval_s is None else monitor_interval_s
    return {
        "protocols": compare_protocols(trace, runs, seed, interval, log),
        "trace": {**trace.description, "monitor_delay_s": interval},
        "runs": runs,
        "seed": seed,
    } | background_figures(log)


def robustness_case_trace(case: int) -> SelectionTrace:
    """selection-robustness's case ``case`` as a trace: its sites, members (alternating
    between two streams in arrival order, for the split protocols), external load and
    monitor interval."""
    from gridcore.experiments.selection_robustness import random_case

    drawn = random_case(case)
    ordered = sorted(drawn.jobs, key=lambda job: (job.arrival_s, job.name))
    jobs = tuple(replace(job, stream=position % 2) for position, job in enumerate(ordered))
    description = {"source": "selection-robustness random case", **drawn.describe()}
    return SelectionTrace(drawn.sites, jobs, description, drawn.external, drawn.monitor_interval_s)


def stateful_selection_table(result: Mapping[str, Any]) -> str:
    """Fig. 2's metrics per protocol, one line each."""
    columns = [("protocol", "<22")]
    columns += [(metric, f">{len(metric)}.1f") for metric in TABLE_METRICS]
    protocols = result["protocols"].items()
    return text_table(columns, ([name, *(m[k] for k in TABLE_METRICS)] for name, m in protocols))


def _run(options: RunOptions) -> dict[str, Any]:
    return stateful_selection_experiment(
        options.runs or 1,
        options.seed,
        options.monitor_interval_s,
        options.case,
        log_replay(options),
    )


ORDERED_PROTOCOLS = (DEFAULT_PROTOCOL.value, "stateful_best")
"""The protocols whose completion over naive's ``--all-orderings`` reports."""


def all_orderings(
    seeds: Sequence[int], runs: int, monitor_interval_s: float = MDS_INTERVAL_S
) -> dict[str, Any]:
    """The canonical trace with Table 1's slowness values in each of their 24 orderings
    over the four sites: per ordering, the mean completion over ``seeds`` of each of
    :data:`ORDERED_PROTOCOLS` over naive's mean completion; per protocol the median and
    the worst ordering. A protocol that draws at random runs ``runs`` times per seed."""
    speeds = [slowness for _, _, slowness in TABLE1_SITES.values()]
    traces = [canonical_trace(seed) for seed in seeds]
    per_ordering: list[dict[str, Any]] = []
    orderings = list(itertools.permutations(speeds))
    for ordering in progress(orderings, "site orderings", unit="ordering"):
        completion = {
            name: statistics.fmean(
                _ordered_completion(trace, ordering, name, runs, seed, monitor_interval_s)
                for seed, trace in zip(seeds, traces, strict=True)
            )
            for name in ("naive", *ORDERED_PROTOCOLS)
        }
        sites = sorted(TABLE1_SITES, key=lambda s: ordering[list(TABLE1_SITES).index(s)])
        per_ordering.append(
            {"fastest_first": sites}
            | {name: completion[name] / completion["naive"] for name in ORDERED_PROTOCOLS}
        )
    summary: dict[str, Any] = {
        "seeds": list(seeds),
        "runs": runs,
        "protocol": DEFAULT_PROTOCOL.value,
    }
    for name in ORDERED_PROTOCOLS:
        ranked = sorted(per_ordering, key=lambda row: float(row[name]))
        key = "default" if name == DEFAULT_PROTOCOL.value else name
        summary[key] = {
            "median": statistics.median(float(row[name]) for row in per_ordering),
            "worst": float(ranked[-1][name]),
            "worst_ordering": ranked[-1]["fastest_first"],
            "best": float(ranked[0][name]),
            "best_ordering": ranked[0]["fastest_first"],
        }
    summary["per_ordering"] = per_ordering
    return summary


def _ordered_completion(
    trace: SelectionTrace,
    ordering: Sequence[float],
    name: str,
    runs: int,
    seed: int,
    monitor_interval_s: float,
) -> float:
    _, config = PROTOCOLS[name]
    sites = tuple(replace(site, slowness=s) for site, s in zip(trace.sites, ordering, strict=True))
    jobs = tuple(replace(job, stream=0) for job in trace.jobs)
    draws = config.protocol is SelectionProtocol.RANDOM or config.mode is InsufficientMode.RANDOM
    return statistics.fmean(
        simulate_selection(
            sites, jobs, {0: config}, monitor_interval_s=monitor_interval_s, seed=_run_seed(seed, r)
        ).completion_s
        for r in range(runs if draws else 1)
    )


def _across_seeds(options: RunOptions) -> dict[str, Any]:
    if not options.all_orderings:
        return {}
    if options.case is not None:
        raise ConfigError("--all-orderings: orders the canonical trace's sites, not --case's")
    if options.background:
        raise ConfigError("--all-orderings: runs the canonical trace alone, not with --background")
    interval = MDS_INTERVAL_S if options.monitor_interval_s is None else options.monitor_interval_s
    seeds = range(options.seed, options.seed + options.seeds)
    return {"orderings": all_orderings(list(seeds), options.runs or 1, interval)}


def canonical_trace(seed: int = 0) -> SelectionTrace:
    """The test-bench trace of docs/experiments.md, drawn deterministically from ``seed``."""
    # the seed string keeps the former module path, so seeded runs reproduce
    rng = random.Random(f"gridcore.sim.experiments.canonical_trace:{seed}")
    members = [
        (rng.randint(*MEMBER_PROCESSORS), round(rng.uniform(*MEMBER_RUNTIME_S), 1))
        for _ in range(ENSEMBLE_MEMBERS)
    ]
    arrivals = sorted(
        (start + index * MEMBER_SPACING_S, burst, index)
        for burst, start in enumerate(BURST_STARTS_S)
        for index in range(ENSEMBLE_MEMBERS)
    )
    jobs = tuple(
        SimJob(
            name=f"b{burst}-m{index}",
            arrival_s=at,
            runtime_s=members[index][1],
            processors=members[index][0],
            hysteresis_s=round(rng.uniform(*HYSTERESIS_S), 1),
            # Alternating in arrival order, for the split-stream protocols.
            stream=position % 2,
        )
        for position, (at, burst, index) in enumerate(arrivals)
    )
    sites = tuple(
        SimSite(name, cpus, slowness) for name, (_, cpus, slowness) in TABLE1_SITES.items()
    )
    return SelectionTrace(sites, jobs, _describe(seed, members, jobs))


def compare_protocols(
    trace: SelectionTrace,
    runs: int = 20,
    seed: int = 0,
    monitor_interval_s: float = MDS_INTERVAL_S,
    log: LogReplay | None = None,
) -> dict[str, dict[str, float]]:
    """Mean Fig. 2 metrics of every protocol over ``runs`` seeded runs of ``trace``
    (with ``log``'s other users besides its own)."""
    if runs < 1:
        raise ConfigError(f"runs must be >= 1, got {runs}")
    results: dict[str, dict[str, float]] = {}
    for name, (split, config) in progress(PROTOCOLS.items(), "protocols", unit="protocol"):
        jobs = trace.jobs if split else tuple(replace(job, stream=0) for job in trace.jobs)
        streams = {job.stream: config for job in jobs}
        outcomes = [
            simulate_selection(
                trace.sites,
                jobs,
                streams,
                external=trace.external,
                log=log,
                monitor_interval_s=monitor_interval_s,
                seed=_run_seed(seed, r),
            )
            for r in range(runs)
        ]
        results[name] = _mean_metrics(outcomes)
    return results


def plot_stateful_selection(result: Mapping[str, Any], path: str) -> None:
    """Write a PNG bar chart like Fig. 2: completion, total and mean queue per protocol."""
    # Imported here so the simulator never needs matplotlib; the Agg canvas is bound to
    # this figure only, leaving any global pyplot backend alone.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    protocols: Mapping[str, Mapping[str, float]] = result["protocols"]
    names = list(protocols)
    panels = (
        ("completion_s", "Last job completes (min)"),
        ("total_queue_s", "Total time queued (min)"),
        ("mean_queue_s", "Mean time queued (min)"),
    )
    figure = Figure(figsize=(12, 4.5))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(panels))
    for ax, (metric, title) in zip(axes, panels, strict=True):
        ax.bar(range(len(names)), [protocols[n][metric] / 60.0 for n in names])
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    figure.suptitle(
        f"Stateful site selection, canonical trace (mean of {result['runs']} runs,"
        f" seed {result['seed']})"
    )
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)


def _run_seed(seed: int, run: int) -> int:
    # Distinct per run and per trace seed as long as runs < 1_000_000.
    return seed * 1_000_000 + run


def _mean_metrics(outcomes: Sequence[SelectionRun]) -> dict[str, float]:
    return {
        metric: statistics.fmean(float(getattr(outcome, metric)) for outcome in outcomes)
        for metric in METRICS
    }


def _describe(
    seed: int, members: Sequence[tuple[int, float]], jobs: Sequence[SimJob]
) -> dict[str, Any]:
    return {
        "source": "RENCI TR-08-02 Sec. 4 test bench (Table 1), one hour of cron bursts",
        "seed": seed,
        "sites": [
            {"name": name, "host": host, "processors": cpus, "slowness": slowness}
            for name, (host, cpus, slowness) in TABLE1_SITES.items()
        ],
        "members": [
            {"member": index, "processors": cpus, "runtime_s": runtime}
            for index, (cpus, runtime) in enumerate(members)
        ],
        "member_distribution": {
            "processors": f"uniform integer {MEMBER_PROCESSORS[0]}-{MEMBER_PROCESSORS[1]}",
            "runtime_s": f"uniform {MEMBER_RUNTIME_S[0]:.0f}-{MEMBER_RUNTIME_S[1]:.0f}"
            " at slowness 1",
        },
        "bursts": [
            {"start_s": start, "members": ENSEMBLE_MEMBERS, "spacing_s": MEMBER_SPACING_S}
            for start in BURST_STARTS_S
        ],
        "jobs": len(jobs),
        "hysteresis": {
            "distribution": "uniform",
            "low_s": HYSTERESIS_S[0],
            "high_s": HYSTERESIS_S[1],
        },
        "monitor_delay_s": MDS_INTERVAL_S,
        "split": "jobs alternate between streams 0 and 1 in arrival order",
        "job_list": [
            {
                "name": job.name,
                "arrival_s": job.arrival_s,
                "processors": job.processors,
                "runtime_s": job.runtime_s,
                "hysteresis_s": job.hysteresis_s,
                "stream": job.stream,
            }
            for job in jobs
        ],
    }


PAPER_ORDERING = (
    # Sec. 4.2: "The performance of the naive selection protocol, measured by ensemble time
    # to completion, is indeed worse than either of the stateful protocols."
    increasing(("protocols",), ("stateful_best", "naive"), "completion_s"),
    increasing(("protocols",), ("stateful_random", "naive"), "completion_s"),
)

STATEFUL_SELECTION = Experiment(
    "RENCI TR-08-02 Fig. 2: naive and stateful site selection on the canonical trace",
    _run,
    stateful_selection_table,
    plot_stateful_selection,
    default_runs=20,
    takes=frozenset({"monitor_interval_s", "case", "all_orderings"}) | BACKGROUND,
    over_seeds=OverSeeds(("protocols",), PAPER_ORDERING),
    across_seeds=_across_seeds,
)
