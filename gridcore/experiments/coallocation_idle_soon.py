"""Does KOALA placement gain from an idle-soon view? The measurement of issue 22, item 5.

The view, its use, the settings and the decision rule were fixed before any run:
``docs/coallocation.md`` (section "Idle soon from a wait model (issue 22)"). Each seed
is koala-placement's ``--seed s --runs 1`` (same clusters, traces, local load, growth
table), run once without the view and once with it.

Run (no CLI entry; see the doc)::

    python -m gridcore.experiments.coallocation_idle_soon [--background LOG.swf@SITE]
        [--background-window START:END]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from gridcore.experiments.coallocation_placement import (
    POLICIES,
    WORKLOADS,
    das_clusters,
    workload_trace,
)
from gridcore.experiments.seeds import estimate
from gridcore.policies.idle_soon import IdleSoon
from gridcore.sim.coallocation import (
    FIG5_EXECUTION_S,
    SCAN_INTERVAL_S,
    CoallocRun,
    Fig5ExecutionTime,
    simulate_coallocation,
)
from gridcore.sim.log_load import LogReplay, parse_log_loads
from gridcore.sim.workload import BackgroundLoad

SEEDS = 10
JOBS = 200
IMPROVED_CELLS_TO_ENABLE = 6
"""The rule (docs/coallocation.md): ON by default only if at least this many of the 12
cells improve (lower mean response, 95 % intervals apart) and none is harmed."""


def idle_soon_experiment(
    seeds: int = SEEDS,
    jobs: int = JOBS,
    log: LogReplay | None = None,
    soon: IdleSoon | None = None,
) -> dict[str, Any]:
    """Per workload and policy, both arms over seeds ``0..seeds-1``: per-seed figures,
    their mean and 95 % interval, the paired difference, and the cell's verdict."""
    soon = soon or IdleSoon()
    clusters = das_clusters()
    execution = Fig5ExecutionTime(FIG5_EXECUTION_S, 1.0)
    background = BackgroundLoad()
    cells: dict[str, dict[str, Any]] = {}
    for index, (workload, gap_s) in enumerate(WORKLOADS.items()):
        for policy in POLICIES:
            arms: dict[str, list[CoallocRun]] = {"off": [], "on": []}
            for seed in range(seeds):
                run_seed = seed * 1_000_000  # koala-placement's --seed seed, run 0
                trace = workload_trace(run_seed, jobs, gap_s)
                for arm, option in (("off", None), ("on", soon)):
                    arms[arm].append(
                        simulate_coallocation(
                            clusters,
                            trace,
                            policy,
                            execution,
                            background=background,
                            scan_interval_s=SCAN_INTERVAL_S,
                            log=log,
                            seed=run_seed * len(WORKLOADS) + index,
                            idle_soon=option,
                        )
                    )
            cells[f"{workload}/{policy.value}"] = _cell(arms["off"], arms["on"])
    verdicts = [cell["verdict"] for cell in cells.values()]
    improved, harmed = verdicts.count("improved"), verdicts.count("harmed")
    return {
        "cells": cells,
        "improved": improved,
        "harmed": harmed,
        "enable_by_default": improved >= IMPROVED_CELLS_TO_ENABLE and harmed == 0,
        "setup": {
            "seeds": list(range(seeds)),
            "jobs": jobs,
            "horizon_s": soon.horizon_s,
            "model": soon.model,
            "background": None if log is None else log.describe(),
        },
    }


def _cell(off: Sequence[CoallocRun], on: Sequence[CoallocRun]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for metric in ("mean_response_s", "mean_wait_s", "mean_execution_s", "mean_clusters_combined"):
        a = [getattr(run, metric) for run in off]
        b = [getattr(run, metric) for run in on]
        figures[metric] = {
            "off": _brief(estimate(a)),
            "on": _brief(estimate(b)),
            "on_minus_off": _brief(estimate([y - x for x, y in zip(a, b, strict=True)])),
        }
    figures["deferrals_per_run"] = statistics.fmean(run.deferrals for run in on)
    responses = [[run.mean_response_s for run in arm] for arm in (off, on)]
    figures["verdict"] = verdict(estimate(responses[0]), estimate(responses[1]))
    return figures


def verdict(off: Mapping[str, Any], on: Mapping[str, Any]) -> str:
    """ "improved" (lower mean, 95 % intervals apart), "harmed" (higher, apart) or
    "no difference" (the intervals overlap), the rule of docs/coallocation.md."""
    (off_low, off_high), (on_low, on_high) = off["ci95"], on["ci95"]
    if on["mean"] < off["mean"] and on_high < off_low:
        return "improved"
    if on["mean"] > off["mean"] and on_low > off_high:
        return "harmed"
    return "no difference"


def _brief(figure: Mapping[str, Any]) -> dict[str, Any]:
    return {"mean": round(figure["mean"], 2), "ci95": [round(v, 2) for v in figure["ci95"]]}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--background", action="append", default=[])
    parser.add_argument("--background-window", default=None)
    parser.add_argument("--seeds", type=int, default=SEEDS)
    args = parser.parse_args(argv)
    loads = parse_log_loads(args.background, args.background_window, None, None)
    result = idle_soon_experiment(args.seeds, log=LogReplay(loads) if loads else None)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
