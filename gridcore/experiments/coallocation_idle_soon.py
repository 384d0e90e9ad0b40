"""Does KOALA placement gain from an idle-soon view? The measurement of issue 22, item 5.

The view, its use, the settings and the decision rule were fixed before any run:
``docs/coallocation.md`` (section "Idle soon from a wait model (issue 22)"). Each seed
is koala-placement's ``--seed s --runs 1`` (same clusters, traces, local load, growth
table: :func:`gridcore.experiments.coallocation_placement.placement_run`), run once
without the view and once with it.

Run: ``gridcore experiment koala-idle-soon --seeds 10 [--background LOG.swf@SITE]
[--background-window START:END] --json``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from gridcore.errors import ConfigError
from gridcore.experiments.coallocation_placement import POLICIES, WORKLOADS, placement_run
from gridcore.experiments.registry import (
    BACKGROUND,
    Experiment,
    RunOptions,
    log_replay,
    text_table,
)
from gridcore.experiments.seeds import estimate
from gridcore.policies.idle_soon import IdleSoon
from gridcore.sim.coallocation import FIG5_EXECUTION_S, CoallocRun, Fig5ExecutionTime
from gridcore.sim.log_load import LogReplay

SEEDS = 10
JOBS = 200
IMPROVED_CELLS_TO_ENABLE = 6
"""The rule (docs/coallocation.md): ON by default only if at least this many of the 12
cells improve (lower mean response, 95 % intervals apart) and none is harmed."""


def idle_soon_experiment(
    seeds: Sequence[int] = range(SEEDS),
    jobs: int = JOBS,
    log: LogReplay | None = None,
    soon: IdleSoon | None = None,
) -> dict[str, Any]:
    """Per workload and policy, both arms on every seed of ``seeds``: per-seed figures,
    their mean and 95 % interval, the paired difference, and the cell's verdict."""
    if len(seeds) < 2:
        # a 95 % interval needs two seeds (docs/coallocation.md: the measurement runs 10)
        raise ConfigError(
            f"--seeds must be >= 2 (the arms are compared over seeds), got {len(seeds)}"
        )
    soon = soon or IdleSoon()
    execution = Fig5ExecutionTime(FIG5_EXECUTION_S, 1.0)
    cells: dict[str, dict[str, Any]] = {}
    for workload in WORKLOADS:
        for policy in POLICIES:
            arms: dict[str, list[CoallocRun]] = {"off": [], "on": []}
            for seed in seeds:
                for arm, option in (("off", None), ("on", soon)):
                    arms[arm].append(
                        placement_run(workload, seed, 0, jobs, policy, execution, log, option)
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
            "seeds": list(seeds),
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
            "per_seed": {"off": a, "on": b},
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


def idle_soon_table(result: Mapping[str, Any]) -> str:
    """Per cell the mean response of both arms with their 95 % intervals, the paired
    difference, the deferrals and the verdict; then the rule's decision."""
    columns = [
        ("cell", "<6"),
        ("off_s", "<22"),
        ("on_s", "<22"),
        ("on-off_s", "<24"),
        ("deferrals", ">9.0f"),
        ("verdict", "<13"),
    ]
    rows = [
        [
            name,
            *(_interval(cell["mean_response_s"][arm]) for arm in ("off", "on", "on_minus_off")),
            cell["deferrals_per_run"],
            cell["verdict"],
        ]
        for name, cell in result["cells"].items()
    ]
    decision = "ON" if result["enable_by_default"] else "OFF"
    return (
        f"{text_table(columns, rows)}\nimproved {result['improved']} harmed"
        f" {result['harmed']}: the view by default {decision}"
    )


def _interval(figure: Mapping[str, Any]) -> str:
    low, high = figure["ci95"]
    return f"{figure['mean']:.1f} [{low:.1f}, {high:.1f}]"


def _run(options: RunOptions) -> dict[str, Any]:
    seeds = range(options.seed, options.seed + options.seeds)
    return idle_soon_experiment(seeds, log=log_replay(options))


KOALA_IDLE_SOON = Experiment(
    "issue 22: KOALA placement with and without an idle-soon view, paired over --seeds",
    _run,
    idle_soon_table,
    takes=BACKGROUND,
    own_seeds=True,
    default_seeds=10,  # the fixed rule's (docs/coallocation.md)
)
