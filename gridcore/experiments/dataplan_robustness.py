"""Storage plans for batch-pipeline workloads nobody tuned: both choosers on random cases
(``gridcore experiment dataplan-robustness``).

Design, equations and the choices where a paper is ambiguous: ``docs/experiments.md``
(section ``gridcore/experiments/dataplan_robustness.py``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gridcore.dataplan.choosers import CHOOSING_SEEDS
from gridcore.dataplan.planning import CHOOSERS, DEFAULT_CHOOSER
from gridcore.errors import ConfigError
from gridcore.experiments.dataplan import (
    MAX_REGRET_MAX,
    MEASUREMENT_SEEDS,
    MEDIAN_REGRET_MAX,
    measure_point,
    measurement_seeds,
)
from gridcore.experiments.registry import Experiment, RunOptions, text_table
from gridcore.experiments.seeds import Claim
from gridcore.model import MB
from gridcore.policies.dataplan import (
    GB,
    STORAGE_STRATEGIES,
    Environment,
    Workload,
    check_feasibility,
)
from gridcore.progress import progress

N_CPU = (8, 64)
WIDTH_RATIO = (0.5, 8.0)
DEPTH = (1, 8)
STORAGE_BYTES = 250.0 * GB
BATCH_FRACTION = (0.02, 0.9)
PRIVATE_FRACTION = (0.001, 0.2)
R_BAR_S = (60.0, 5000.0)
SD_RATIO = (0.0, 0.5)
BW_R_MB_S = (1.0, 100.0)
BW_L_MB_S = 125.0
FAILURE_SHARE = 0.25
FAILURE_PHI = (0.01, 0.3)
MIN_FEASIBLE = 2
MAX_JOBS = 2000

DEFAULT_CASES = 800
MEASUREMENT_FIRST_SEED = 0
WORST_LISTED = 5
OVER_5PCT = 0.05
OVER_10PCT = 0.10

REDRAW_FEW_FEASIBLE = "fewer_than_2_feasible"
REDRAW_OVER_JOBS = "over_job_cap"


@dataclass(frozen=True)
class RandomCase:
    """One generated workload and cluster (see docs/experiments.md for the ranges);
    ``redrawn_few_feasible`` and ``redrawn_over_jobs`` count the draws rejected before it."""

    seed: int
    workload: Workload
    env: Environment
    redrawn_few_feasible: int
    redrawn_over_jobs: int

    @property
    def redrawn(self) -> int:
        return self.redrawn_few_feasible + self.redrawn_over_jobs

    def describe(self) -> dict[str, Any]:
        """The case in the ranges' terms (fractions of ``S``, MB/s)."""
        w, e = self.workload, self.env
        return {
            "W": w.W,
            "D": w.D,
            "N_CPU": e.N_CPU,
            "S_B_frac": w.S_B / e.S,
            "S_P_frac": w.S_P / e.S,
            "R_bar_s": w.R_bar,
            "SD_R_s": w.SD_R,
            "BW_R_MB_s": e.BW_R / MB,
            "F_per_s": e.F,
        }


def random_case(seed: int) -> RandomCase:
    """The case drawn from ``seed`` (deterministic: the same seed, the same case)."""
    # the seed string keeps the former module path, so seeded runs reproduce
    rng = random.Random(f"gridcore.sim.dataplan_robustness:{seed}")
    few_feasible = over_jobs = 0
    while True:
        workload, env = _draw(rng)
        if workload.J > MAX_JOBS:
            over_jobs += 1
        elif len(feasible_storage(workload, env)) < MIN_FEASIBLE:
            few_feasible += 1
        else:
            return RandomCase(seed, workload, env, few_feasible, over_jobs)


def feasible_storage(workload: Workload, env: Environment) -> tuple[str, ...]:
    """The storage strategies Eq. 1-4 allow (Remote never counts)."""
    return tuple(
        s.value for s in STORAGE_STRATEGIES if check_feasibility(s, workload, env).possible
    )


def _draw(rng: random.Random) -> tuple[Workload, Environment]:
    # Every quantity is drawn on every draw, in one order, so a case depends on its seed only.
    n_cpu = rng.randint(*N_CPU)
    width = max(1, round(rng.uniform(*WIDTH_RATIO) * n_cpu))
    depth = rng.randint(*DEPTH)
    s_b = float(round(rng.uniform(*BATCH_FRACTION) * STORAGE_BYTES))
    s_p = float(round(_log_uniform(rng, PRIVATE_FRACTION) * STORAGE_BYTES))
    r_bar = _log_uniform(rng, R_BAR_S)
    sd_r = rng.uniform(*SD_RATIO) * r_bar
    bw_r = _log_uniform(rng, BW_R_MB_S) * MB
    fails = rng.random() < FAILURE_SHARE
    phi = _log_uniform(rng, FAILURE_PHI)
    rate = phi / (depth * r_bar) if fails else 0.0
    workload = Workload(width, depth, s_b, s_p, r_bar, sd_r)
    env = Environment(n_cpu, STORAGE_BYTES, rate, bw_r, BW_L_MB_S * MB)
    return workload, env


def _log_uniform(rng: random.Random, bounds: tuple[float, float]) -> float:
    low, high = bounds
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def dataplan_robustness(
    cases: int = DEFAULT_CASES,
    seed: int = 0,
    *,
    measurement_first_seed: int = MEASUREMENT_FIRST_SEED,
) -> dict[str, Any]:
    """Cases ``seed`` .. ``seed + cases - 1``, every candidate plan measured, both
    choosers' regret (docs/experiments.md)."""
    if cases < 1:
        raise ConfigError(f"--cases must be >= 1, got {cases}")
    seeds = measurement_seeds(measurement_first_seed, MEASUREMENT_SEEDS)
    drawn = [random_case(case_seed) for case_seed in range(seed, seed + cases)]
    per_case = [case_record(case, seeds) for case in progress(drawn, "cases", unit="case")]
    return {
        "cases": cases,
        "first_seed": seed,
        "default_chooser": DEFAULT_CHOOSER,
        "ranges": ranges(),
        "redrawn": sum(case.redrawn for case in drawn),
        "redrawn_by_reason": {
            REDRAW_FEW_FEASIBLE: sum(case.redrawn_few_feasible for case in drawn),
            REDRAW_OVER_JOBS: sum(case.redrawn_over_jobs for case in drawn),
        },
        "measurement_seeds": list(seeds),
        "choosing_seeds": list(CHOOSING_SEEDS),
        "choosers": {name: regret_distribution(per_case, name) for name in CHOOSERS},
        "claim": CLAIM_TEXT,
        "per_case": per_case,
    }


def case_record(case: RandomCase, seeds: Sequence[int]) -> dict[str, Any]:
    """One case measured: its draw, the feasible set, the simulated mean makespan per
    plan (``None``: never ended), the best plan, each chooser's pick and regret."""
    point = measure_point(case.seed, case.workload, case.env, seeds, CHOOSERS)
    return {
        "seed": case.seed,
        "case": case.describe(),
        "feasible": point["feasible"],
        "simulated": point["simulated"],
        "best": point["best"],
        "picks": point["picks"],
        "regret": point["regret"],
    }


def regret_distribution(per_case: Sequence[Mapping[str, Any]], chooser: str) -> dict[str, Any]:
    """``chooser``'s regret over the cases: quantiles, shares, worst cases (``None`` in
    the JSON for an infinite regret, a pick that never ended)."""
    values = [(_regret(record, chooser), record["seed"]) for record in per_case]
    return summarise([regret for regret, _ in values]) | {
        "worst_cases": [
            {"seed": case_seed, "regret": _finite(regret)}
            for regret, case_seed in sorted(values, key=lambda v: (-v[0], v[1]))[:WORST_LISTED]
        ]
    }


def summarise(regrets: Sequence[float]) -> dict[str, Any]:
    """Quantiles of ``regrets`` and the shares of cases above 0, 5 % and 10 %."""
    ordered = sorted(regrets)
    n = len(ordered)
    return {
        "regret": {
            "min": _finite(ordered[0]),
            "p10": _finite(quantile(ordered, 0.10)),
            "median": _finite(quantile(ordered, 0.50)),
            "p90": _finite(quantile(ordered, 0.90)),
            "max": _finite(ordered[-1]),
        },
        "worse_than_best_share": sum(r > 0 for r in ordered) / n,
        "over_5pct_share": sum(r > OVER_5PCT for r in ordered) / n,
        "over_10pct_share": sum(r > OVER_10PCT for r in ordered) / n,
    }


def quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default, "linear"); an
    infinite neighbour that takes part makes it infinite."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    if fraction == 0:
        return ordered[low]
    if math.isinf(ordered[high]):
        return math.inf
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def _regret(record: Mapping[str, Any], chooser: str) -> float:
    value = record["regret"][chooser]
    return math.inf if value is None else float(value)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def ranges() -> dict[str, Any]:
    """The documented ranges, as the JSON reports them."""
    return {
        "N_CPU": N_CPU,
        "W_over_N_CPU": WIDTH_RATIO,
        "D": DEPTH,
        "S_bytes": STORAGE_BYTES,
        "S_B_over_S": BATCH_FRACTION,
        "S_P_over_S_log_uniform": PRIVATE_FRACTION,
        "R_bar_s_log_uniform": R_BAR_S,
        "SD_R_over_R_bar": SD_RATIO,
        "BW_R_MB_s_log_uniform": BW_R_MB_S,
        "BW_L_MB_s": BW_L_MB_S,
        "F_share_of_cases": FAILURE_SHARE,
        "F_phi_log_uniform": FAILURE_PHI,
        "F": "phi / (D * R_bar) resets per second in the cluster, else 0",
        "min_feasible_storage_strategies": MIN_FEASIBLE,
        "max_jobs_W_times_D": MAX_JOBS,
    }


# -- claim, table ------------------------------------------------------------------------------

CLAIM_TEXT = (
    f"{DEFAULT_CHOOSER}: median regret <= {MEDIAN_REGRET_MAX:.0%} and max <="
    f" {MAX_REGRET_MAX:.0%} over the random cases"
)


def default_chooser_holds(result: Mapping[str, Any]) -> bool:
    """The default chooser's median <= 2 % and max <= 10 % over the cases."""
    regret = result["choosers"][result["default_chooser"]]["regret"]
    if regret["median"] is None or regret["max"] is None:
        return False
    return bool(regret["median"] <= MEDIAN_REGRET_MAX and regret["max"] <= MAX_REGRET_MAX)


CLAIMS = (Claim(CLAIM_TEXT, default_chooser_holds),)


def robustness_table(result: Mapping[str, Any]) -> str:
    """Per chooser: regret quantiles and the shares of cases worse than the best."""
    columns = [
        ("chooser", "<22"),
        ("min", ">7.2%"),
        ("p10", ">7.2%"),
        ("median", ">7.2%"),
        ("p90", ">7.2%"),
        ("max", ">8.2%"),
        ("worse", ">6.1%"),
        (">5%", ">6.1%"),
        (">10%", ">6.1%"),
    ]
    rows = []
    for name, figures in result["choosers"].items():
        r = {k: math.inf if v is None else v for k, v in figures["regret"].items()}
        label = f"{name} (default)" if name == result["default_chooser"] else name
        rows.append(
            [label, r["min"], r["p10"], r["median"], r["p90"], r["max"],
             figures["worse_than_best_share"], figures["over_5pct_share"],
             figures["over_10pct_share"]]
        )  # fmt: skip
    header = (
        f"regret over {result['cases']} random workloads and clusters (seeds from"
        f" {result['first_seed']}; {result['redrawn']} draws redrawn)"
    )
    return header + "\n" + text_table(columns, rows)


def _run(options: RunOptions) -> dict[str, Any]:
    cases = DEFAULT_CASES if options.cases is None else options.cases
    return dataplan_robustness(cases=cases, seed=options.seed)


DATAPLAN_ROBUSTNESS = Experiment(
    "Bent et al. DADC 2009 on random workloads and clusters: both choosers' regret",
    _run,
    robustness_table,
    ok=default_chooser_holds,
    takes=frozenset({"cases"}),
)
