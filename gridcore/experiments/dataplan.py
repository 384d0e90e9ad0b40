"""Bent et al.'s Sec. 4 on the simulator: Figs. 4-8, and the paper's chooser against the
simulation chooser (``gridcore experiment dataplan``).

Design, equations and the choices where a paper is ambiguous: ``docs/experiments.md``
(section ``gridcore/experiments/dataplan.py``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gridcore.dataplan.choosers import (
    CHOOSING_SEEDS,
    Candidate,
    candidate_of,
    candidate_plans,
    mean_makespan,
    plan_label,
    simulation_horizon,
)
from gridcore.dataplan.planning import CHOOSERS, DEFAULT_CHOOSER, Chooser
from gridcore.errors import ConfigError
from gridcore.experiments.registry import Experiment, RunOptions, text_table
from gridcore.experiments.seeds import Claim
from gridcore.policies.dataplan import (
    TABLE1_WORKLOADS,
    BandwidthReading,
    DataPlan,
    Environment,
    Workload,
    choose_bent2009,
    table2_environment,
)
from gridcore.progress import note, progress

SWEEPS = ("width", "depth", "batch_size", "variability", "failure")
WIDTH_RATIOS: tuple[int, ...] = tuple(range(1, 11))
DEPTHS: tuple[int, ...] = tuple(range(1, 11))
BATCH_FRACTIONS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
VARIABILITY_R_BAR = 5_000_000.0
VARIABILITY_RATIOS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
FAILURE_RATES = (0.0, 2.5e-6, 5e-6, 1e-5, 2e-5, 4e-5)
MEASUREMENT_SEEDS = 3
FAILURE_SEEDS = 30
MEDIAN_REGRET_MAX = 0.02
MAX_REGRET_MAX = 0.10


def sweep_points(
    sweep: str, workload: Workload, env: Environment
) -> tuple[tuple[float, Workload, Environment], ...]:
    """``(x, workload, environment)`` for every point of ``sweep`` (docs/experiments.md)."""
    if sweep == "width":
        return tuple((r, replace(workload, W=r * env.N_CPU), env) for r in WIDTH_RATIOS)
    if sweep == "depth":
        return tuple((d, replace(workload, D=d), env) for d in DEPTHS)
    if sweep == "batch_size":
        return tuple((f, replace(workload, S_B=f * env.S), env) for f in BATCH_FRACTIONS)
    if sweep == "variability":
        heavy = replace(workload, R_bar=VARIABILITY_R_BAR)
        return tuple(
            (v, replace(heavy, SD_R=v * VARIABILITY_R_BAR), env) for v in VARIABILITY_RATIOS
        )
    if sweep == "failure":
        return tuple((f, workload, replace(env, F=f)) for f in FAILURE_RATES)
    raise ConfigError(f"unknown sweep {sweep!r}; one of {', '.join(SWEEPS)}")


def dataplan_experiment(
    seed: int = 0,
    runs: int = MEASUREMENT_SEEDS,
    *,
    failure_runs: int | None = None,
    sweeps: Sequence[str] = SWEEPS,
    workloads: Sequence[str] = tuple(TABLE1_WORKLOADS),
    choosers: Mapping[str, Chooser] = CHOOSERS,
    points: int | None = None,
    bandwidth_reading: BandwidthReading = BandwidthReading.GIGABIT,
) -> dict[str, Any]:
    """Every sweep for every workload (docs/experiments.md). ``points`` keeps only the
    first that many points of each sweep (reduced runs, tests); ``failure_runs``:
    measurement seeds per failure point (default :data:`FAILURE_SEEDS`)."""
    failure_runs = FAILURE_SEEDS if failure_runs is None else failure_runs
    env = table2_environment(bandwidth_reading)
    result: dict[str, Any] = {}
    for sweep in sweeps:
        seeds = measurement_seeds(seed, failure_runs if sweep == "failure" else runs)
        per_workload: dict[str, Any] = {}
        for name in workloads:
            chosen = sweep_points(sweep, TABLE1_WORKLOADS[name], env)[:points]
            measured = [
                measure_point(x, w, e, seeds, choosers)
                for x, w, e in progress(chosen, f"{sweep} {name}", unit="point")
            ]
            per_workload[name] = {"points": measured, "regret": regret_summary(measured, choosers)}
        result[sweep] = per_workload
    return {
        "default_chooser": DEFAULT_CHOOSER,
        "choosers": list(choosers),
        "sweeps": result,
        "setup": _setup(seed, runs, failure_runs, env, bandwidth_reading),
    }


def measurement_seeds(seed: int, runs: int) -> tuple[int, ...]:
    """``seed .. seed + runs - 1``; refused when they meet the simulation chooser's."""
    if runs < 1:
        raise ConfigError(f"--runs must be >= 1, got {runs}")
    seeds = tuple(range(seed, seed + runs))
    shared = set(seeds) & set(CHOOSING_SEEDS)
    if shared:
        raise ConfigError(
            f"--seed/--runs: measurement seeds {sorted(shared)} are the simulation chooser's"
            f" choosing seeds {list(CHOOSING_SEEDS)}; its regret must be measured on others"
        )
    return seeds


def measure_point(
    x: float,
    workload: Workload,
    env: Environment,
    seeds: Sequence[int],
    choosers: Mapping[str, Chooser] = CHOOSERS,
) -> dict[str, Any]:
    """One point: every candidate plan simulated on ``seeds``, every chooser's pick."""
    paper = choose_bent2009(workload, env)
    horizon = simulation_horizon(paper.predictions)
    simulated: dict[str, float] = {}
    for candidate in candidate_plans(workload, env):
        simulated[candidate.label] = mean_makespan(
            candidate, workload, env, seeds, horizon_s=horizon
        )
    picks: dict[str, str] = {}
    for name, choose in choosers.items():
        plan = paper if choose is choose_bent2009 else choose(workload, env)
        label = plan_label(plan)
        if label not in simulated:  # a chooser's own plan outside the candidates
            simulated[label] = _measure(candidate_of(plan), workload, env, seeds, horizon)
        picks[name] = label
    return point_summary(x, workload, env, paper, simulated, picks)


def _measure(
    candidate: Candidate, workload: Workload, env: Environment, seeds: Sequence[int], horizon: float
) -> float:
    return mean_makespan(candidate, workload, env, seeds, horizon_s=horizon)


def point_summary(
    x: float,
    workload: Workload,
    env: Environment,
    paper: DataPlan,
    simulated: Mapping[str, float],
    picks: Mapping[str, str],
) -> dict[str, Any]:
    """The JSON of one point from its simulated means and picks (regret: module
    docstring)."""
    best = min(simulated, key=lambda label: simulated[label])
    worst = max(simulated, key=lambda label: simulated[label])
    return {
        "x": x,
        "workload": {"W": workload.W, "D": workload.D, "S_B": workload.S_B, "S_P": workload.S_P}
        | {"R_bar": workload.R_bar, "SD_R": workload.SD_R, "F": env.F},
        "feasible": [s.value for s in paper.feasible],
        "predicted": {p.strategy.value: _finite(p.time_s) for p in paper.predictions},
        "simulated": {label: _finite(t) for label, t in simulated.items()},
        "best": best,
        "worst": worst,
        "worst_excess": _finite(excess(simulated[worst], simulated[best])),
        "picks": dict(picks),
        "regret": {
            name: _finite(excess(simulated[label], simulated[best]))
            for name, label in picks.items()
        },
    }


def excess(time_s: float, best_s: float) -> float:
    """``(time - best) / best``: 0 for the best, ``inf`` when only it ended."""
    if time_s == best_s:
        return 0.0
    return (time_s - best_s) / best_s


def regret_summary(
    points: Sequence[Mapping[str, Any]], choosers: Mapping[str, Chooser] | Sequence[str]
) -> dict[str, dict[str, float | None]]:
    """Median and max regret per chooser over ``points`` (``None``, infinite, when a pick
    never ended)."""
    out: dict[str, dict[str, float | None]] = {}
    for name in choosers:
        values = [math.inf if p["regret"][name] is None else p["regret"][name] for p in points]
        out[name] = {
            "median": _finite(statistics.median(values)) if values else 0.0,
            "max": _finite(max(values)) if values else 0.0,
        }
    return out


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _setup(
    seed: int, runs: int, failure_runs: int, env: Environment, reading: BandwidthReading
) -> dict[str, Any]:
    return {
        "seed": seed,
        "measurement_seeds_per_point": runs,
        "failure_seeds_per_point": failure_runs,
        "choosing_seeds": list(CHOOSING_SEEDS),
        "bandwidth_reading": reading.value,
        "environment": {
            "N_CPU": env.N_CPU,
            "S": env.S,
            "BW_R": env.BW_R,
            "BW_L": env.BW_L,
        },
        "workloads": {
            name: {"W": w.W, "D": w.D, "S_B": w.S_B, "S_P": w.S_P, "R_bar": w.R_bar, "SD_R": w.SD_R}
            for name, w in TABLE1_WORKLOADS.items()
        },
        "x": {
            "width": "W / N_CPU",
            "depth": "D",
            "batch_size": "S_B / S",
            "variability": f"SD_R / R_bar, R_bar = {VARIABILITY_R_BAR:g} s",
            "failure": "F (resets per second in the cluster)",
        },
        "regret": "(simulated(pick) - simulated(best)) / simulated(best), best of every plan",
        "claim": (
            f"{DEFAULT_CHOOSER}: median regret <= {MEDIAN_REGRET_MAX:.0%} and max <="
            f" {MAX_REGRET_MAX:.0%} on every sweep and workload"
        ),
    }


# -- claims, table, plot -----------------------------------------------------------------------


def default_chooser_holds(result: Mapping[str, Any]) -> bool:
    """The default chooser's median <= 2 % and max <= 10 % everywhere."""
    name = result["default_chooser"]
    for per_workload in result["sweeps"].values():
        for entry in per_workload.values():
            regret = entry["regret"][name]
            if regret["max"] is None or regret["median"] is None:
                return False
            if regret["median"] > MEDIAN_REGRET_MAX or regret["max"] > MAX_REGRET_MAX:
                return False
    return True


CLAIMS = (Claim("the default chooser's regret: median <= 2 %, max <= 10 %", default_chooser_holds),)


def dataplan_table(result: Mapping[str, Any]) -> str:
    """Median and max regret per sweep, workload and chooser."""
    choosers: list[str] = list(result["choosers"])
    columns = [("sweep", "<12"), ("workload", "<8")]
    for name in choosers:
        columns += [(f"{name} med", ">14.2%"), (f"{name} max", ">14.2%")]
    rows = []
    for sweep, per_workload in result["sweeps"].items():
        for workload, entry in per_workload.items():
            row: list[object] = [sweep, workload]
            for name in choosers:
                regret = entry["regret"][name]
                row += [_shown(regret["median"]), _shown(regret["max"])]
            rows.append(row)
    return text_table(columns, rows)


def _shown(value: float | None) -> float:
    return math.inf if value is None else value


def plot_dataplan(result: Mapping[str, Any], path: str) -> None:
    """PNGs like Fig. 4: ``path`` is the width sweep; ``STEM-SWEEP.png`` beside it every
    other sweep. Per workload (columns): simulated and predicted throughput (jobs per
    hour) per plan, then each chooser's regret and the worst plan's excess."""
    target = Path(path)
    for sweep, per_workload in result["sweeps"].items():
        out = target if sweep == "width" else target.with_name(f"{target.stem}-{sweep}.png")
        _plot_sweep(sweep, per_workload, result, str(out))


def _plot_sweep(
    sweep: str, per_workload: Mapping[str, Any], result: Mapping[str, Any], path: str
) -> None:
    # Imported here so the simulator never needs matplotlib; an Agg canvas of our own.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(4 * len(per_workload), 9))
    FigureCanvasAgg(figure)
    axes = figure.subplots(3, len(per_workload), squeeze=False)
    for column, (workload, entry) in enumerate(per_workload.items()):
        points = entry["points"]
        xs = [p["x"] for p in points]
        for row, key in ((0, "simulated"), (1, "predicted")):
            ax = axes[row][column]
            for label in sorted({k for p in points for k in p[key]}):
                ax.plot(xs, [_throughput(p, key, label) for p in points], marker=".", label=label)
            ax.set_title(f"{workload}: {key}", fontsize=9)
            ax.set_ylabel("jobs / hour")
            ax.legend(fontsize=7)
        ax = axes[2][column]
        for name in result["choosers"]:
            ax.plot(xs, [_pct(p["regret"][name]) for p in points], marker="o", label=name)
        ax.plot(xs, [_pct(p["worst_excess"]) for p in points], ":", color="grey", label="worst")
        ax.set_title(f"{workload}: regret (%)", fontsize=9)
        ax.set_xlabel(result["setup"]["x"][sweep])
        ax.legend(fontsize=7)
    figure.suptitle(f"Bent et al. DADC 2009, sensitivity to {sweep} (simulated)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=90)


def _throughput(point: Mapping[str, Any], key: str, label: str) -> float:
    time_s = point[key].get(label)
    if time_s is None or time_s <= 0:
        return math.nan
    jobs: int = point["workload"]["W"] * point["workload"]["D"]
    return float(jobs * 3600.0 / time_s)


def _pct(value: float | None) -> float:
    return math.nan if value is None else 100.0 * value


def _run(options: RunOptions) -> dict[str, Any]:
    if options.live:
        # every feasible plan of the example workload on real local sites (--runs
        # repetitions, --seed the data's): gridcore.dataplan.live
        from gridcore.dataplan.live import run_live

        def told(text: str) -> None:
            note(f"dataplan --live: {text}")

        return {"live": True} | run_live(options.runs or MEASUREMENT_SEEDS, options.seed, told)
    return dataplan_experiment(options.seed, options.runs or MEASUREMENT_SEEDS)


def _table(result: Mapping[str, Any]) -> str:
    if result.get("live"):
        from gridcore.dataplan.live import live_table

        return live_table(result)
    return dataplan_table(result)


def _plot(result: Mapping[str, Any], path: str) -> None:
    if not result.get("live"):  # the live run has no figure of its own
        plot_dataplan(result, path)


def _ok(result: Mapping[str, Any]) -> bool:
    if result.get("live"):
        from gridcore.dataplan.live import live_ok

        return live_ok(result)
    return default_chooser_holds(result)


DATAPLAN = Experiment(
    "Bent et al. DADC 2009 Sec. 4 Figs. 4-8: regret of the paper's and the simulation chooser"
    " (--live: every feasible plan of the example workload on real local sites)",
    _run,
    _table,
    _plot,
    ok=_ok,
    default_runs=MEASUREMENT_SEEDS,
    takes=frozenset({"live"}),
)
