"""Site selection on grids and bursts nobody tuned: every protocol against naive.

The paper's Fig. 2 comparison (:mod:`gridcore.experiments.selection`) runs one canonical trace
whose favoured site is small. A user's grid is not that trace. This experiment draws
``cases`` random grids and workloads from the documented ranges below (each case from its
own seed: case ``seed .. seed + cases - 1``, so any case replays alone with
``gridcore experiment stateful-selection --case SEED``), runs every protocol of
:data:`PROTOCOLS` on each, and reports per protocol the distribution of the ensemble's
completion time over naive's on the same case (ratio < 1: faster than sending blindly).

Ranges (uniform; integers where the quantity is one), drawn per case:

* sites: 3-6, each 4-32 processors and slowness 1.0-2.0 (a runtime of ``r`` takes
  ``r * slowness`` there);
* monitor delay (the report interval) 30-120 s;
* bursts: 1-3, starting 0-600 s apart from the first at t = 0; each 5-30 members, one
  every 0-30 s;
* members: 1-8 processors (never more than the largest site has), reference runtime
  300-900 s, hysteresis (selection to reaching the queue) 60-180 s per member;
* external load: per site, other users' jobs arriving as a Poisson process for the
  first 3600 s, each 1-4 processors (at most the site's size) and 400 s (Sec. 4.3's
  external jobs), at a rate that offers a utilisation drawn per site from 0-0.5.

Randomised protocols (``random`` and the random insufficient mode) run once per case: the
case-to-case spread already averages their draws.

Tuned and reported cases are apart: the default's queue-delay estimate (Eq. W in
:mod:`gridcore.policies.selection`) was chosen on cases 100000-100299; the figures
reported are those of the default seeds 0-299 (and anyone's others).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
from gridcore.policies.selection import DEFAULT_PROTOCOL, InsufficientMode, SelectionProtocol
from gridcore.progress import progress
from gridcore.sim.log_load import LogReplay
from gridcore.sim.selection import SimJob, StreamConfig, simulate_selection
from gridcore.sim.workload import LocalJob, SimSite

SITES = (3, 6)
SITE_PROCESSORS = (4, 32)
SLOWNESS = (1.0, 2.0)
MONITOR_INTERVAL_S = (30.0, 120.0)
BURSTS = (1, 3)
BURST_GAP_S = (0.0, 600.0)
BURST_MEMBERS = (5, 30)
MEMBER_SPACING_S = (0.0, 30.0)
MEMBER_PROCESSORS = (1, 8)
MEMBER_RUNTIME_S = (300.0, 900.0)
HYSTERESIS_S = (60.0, 180.0)
EXTERNAL_UTILISATION = (0.0, 0.5)
EXTERNAL_PROCESSORS = (1, 4)
EXTERNAL_RUNTIME_S = 400.0
EXTERNAL_HORIZON_S = 3600.0

DEFAULT_CASES = 300
NAIVE = "naive"
DEFAULT = DEFAULT_PROTOCOL.value
PROTOCOLS: Mapping[str, StreamConfig] = MappingProxyType(
    {
        NAIVE: StreamConfig(SelectionProtocol.NAIVE, InsufficientMode.RANDOM),
        "stateful_random": StreamConfig(SelectionProtocol.STATEFUL, InsufficientMode.RANDOM),
        "stateful_best": StreamConfig(SelectionProtocol.STATEFUL, InsufficientMode.BEST),
        "stateful_earliest": StreamConfig(SelectionProtocol.STATEFUL, InsufficientMode.EARLIEST),
        DEFAULT: StreamConfig(DEFAULT_PROTOCOL),
    }
)
"""Every protocol compared; the operator's default is named by its protocol's value."""

WORSE = 1.0
WORSE_5PCT = 1.05
WORST_LISTED = 5


@dataclass(frozen=True)
class RandomCase:
    """One generated grid and workload (see the module docstring for the ranges)."""

    seed: int
    sites: tuple[SimSite, ...]
    jobs: tuple[SimJob, ...]
    external: tuple[LocalJob, ...]
    monitor_interval_s: float

    def describe(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "sites": [
                {"name": s.name, "processors": s.processors, "slowness": s.slowness}
                for s in self.sites
            ],
            "members": len(self.jobs),
            "member_processors": sum(j.processors for j in self.jobs),
            "external_jobs": len(self.external),
            "monitor_interval_s": self.monitor_interval_s,
        }


def random_case(seed: int) -> RandomCase:
    """The case drawn from ``seed`` (deterministic: the same seed, the same case)."""
    # the seed string keeps the former module path, so seeded runs reproduce
    rng = random.Random(f"gridcore.sim.robustness:{seed}")
    sites = tuple(
        SimSite(
            f"site-{index}",
            rng.randint(*SITE_PROCESSORS),
            round(rng.uniform(*SLOWNESS), 2),
        )
        for index in range(rng.randint(*SITES))
    )
    largest = max(site.processors for site in sites)
    jobs: list[SimJob] = []
    start = 0.0
    for burst in range(rng.randint(*BURSTS)):
        if burst:
            start += rng.uniform(*BURST_GAP_S)
        at = start
        for member in range(rng.randint(*BURST_MEMBERS)):
            if member:
                at += rng.uniform(*MEMBER_SPACING_S)
            jobs.append(
                SimJob(
                    f"b{burst}-m{member}",
                    round(at, 1),
                    round(rng.uniform(*MEMBER_RUNTIME_S), 1),
                    min(rng.randint(*MEMBER_PROCESSORS), largest),
                    round(rng.uniform(*HYSTERESIS_S), 1),
                )
            )
    external = tuple(_external_load(rng, sites))
    interval = round(rng.uniform(*MONITOR_INTERVAL_S), 1)
    return RandomCase(seed, sites, tuple(jobs), external, interval)


def _external_load(rng: random.Random, sites: Sequence[SimSite]) -> list[LocalJob]:
    jobs: list[LocalJob] = []
    for site in sites:
        utilisation = rng.uniform(*EXTERNAL_UTILISATION)
        sizes = range(EXTERNAL_PROCESSORS[0], min(EXTERNAL_PROCESSORS[1], site.processors) + 1)
        mean_size = statistics.fmean(sizes)
        # arrivals per second that offer ``utilisation`` of the site's processors
        rate = utilisation * site.processors / (mean_size * EXTERNAL_RUNTIME_S)
        at = 0.0
        while rate > 0:
            at += rng.expovariate(rate)
            if at >= EXTERNAL_HORIZON_S:
                break
            jobs.append(
                LocalJob(
                    f"ext-{site.name}-{len(jobs)}",
                    site.name,
                    round(at, 1),
                    EXTERNAL_RUNTIME_S,
                    rng.choice(sizes),
                )
            )
    return jobs


def completion_by_protocol(
    case: RandomCase, run_seed: int = 0, log: LogReplay | None = None
) -> dict[str, float]:
    """The ensemble's completion time (first arrival to last end) under every protocol;
    ``log``: real other users' jobs besides the case's (``--background``)."""
    return {
        name: simulate_selection(
            case.sites,
            case.jobs,
            {0: config},
            external=case.external,
            log=log,
            monitor_interval_s=case.monitor_interval_s,
            seed=run_seed,
        ).completion_s
        for name, config in PROTOCOLS.items()
    }


def selection_robustness(
    cases: int = DEFAULT_CASES, seed: int = 0, log: LogReplay | None = None
) -> dict[str, Any]:
    """Cases ``seed`` .. ``seed + cases - 1``, every protocol, ratios to naive."""
    if cases < 1:
        raise ConfigError(f"--cases must be >= 1, got {cases}")
    ratios: dict[str, list[tuple[float, int]]] = {name: [] for name in PROTOCOLS if name != NAIVE}
    for case_seed in progress(range(seed, seed + cases), "cases", unit="case"):
        completion = completion_by_protocol(random_case(case_seed), log=log)
        for name, values in ratios.items():
            values.append((completion[name] / completion[NAIVE], case_seed))
    return {
        "cases": cases,
        "first_seed": seed,
        "default": DEFAULT,
        "protocols": {name: _distribution(values) for name, values in ratios.items()},
        "ranges": _ranges(),
    } | background_figures(log)


def _distribution(values: Sequence[tuple[float, int]]) -> dict[str, Any]:
    ratios = sorted(ratio for ratio, _ in values)
    worst = sorted(values, reverse=True)[:WORST_LISTED]
    return {
        "ratio_to_naive": {
            "min": ratios[0],
            "p10": _quantile(ratios, 0.10),
            "median": statistics.median(ratios),
            "p90": _quantile(ratios, 0.90),
            "max": ratios[-1],
        },
        "frac_worse": sum(r > WORSE for r in ratios) / len(ratios),
        "frac_worse_5pct": sum(r > WORSE_5PCT for r in ratios) / len(ratios),
        "worst_cases": [{"seed": case, "ratio": ratio} for ratio, case in worst],
    }


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default, "linear")."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _ranges() -> dict[str, Any]:
    return {
        "sites": SITES,
        "site_processors": SITE_PROCESSORS,
        "slowness": SLOWNESS,
        "monitor_interval_s": MONITOR_INTERVAL_S,
        "bursts": BURSTS,
        "burst_gap_s": BURST_GAP_S,
        "burst_members": BURST_MEMBERS,
        "member_spacing_s": MEMBER_SPACING_S,
        "member_processors": MEMBER_PROCESSORS,
        "member_runtime_s": MEMBER_RUNTIME_S,
        "hysteresis_s": HYSTERESIS_S,
        "external_utilisation": EXTERNAL_UTILISATION,
        "external_processors": EXTERNAL_PROCESSORS,
        "external_runtime_s": EXTERNAL_RUNTIME_S,
    }


def robustness_table(result: Mapping[str, Any]) -> str:
    columns = [
        ("protocol", "<20"),
        ("min", ">6.2f"),
        ("p10", ">6.2f"),
        ("median", ">6.2f"),
        ("p90", ">6.2f"),
        ("max", ">6.2f"),
        ("worse", ">6.1%"),
        (">5%", ">6.1%"),
    ]
    rows = []
    for name, figures in result["protocols"].items():
        r = figures["ratio_to_naive"]
        label = f"{name} (default)" if name == result["default"] else name
        rows.append(
            [label, r["min"], r["p10"], r["median"], r["p90"], r["max"],
             figures["frac_worse"], figures["frac_worse_5pct"]]
        )  # fmt: skip
    header = (
        f"completion / naive over {result['cases']} random cases"
        f" (seeds from {result['first_seed']})"
    )
    return header + "\n" + text_table(columns, rows)


def plot_robustness(result: Mapping[str, Any], path: str) -> None:
    """Box plot of every protocol's completion / naive over the cases."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(result["protocols"])
    stats = []
    for name in names:
        r = result["protocols"][name]["ratio_to_naive"]
        stats.append(
            {"label": name, "whislo": r["min"], "q1": r["p10"], "med": r["median"],
             "q3": r["p90"], "whishi": r["max"], "fliers": []}
        )  # fmt: skip
    figure = Figure(figsize=(9, 4.5))
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    ax.bxp(stats, showfliers=False)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_ylabel("completion / naive (box: p10-p90, whiskers: min-max)")
    ax.tick_params(axis="x", labelsize=8)
    figure.suptitle(f"Site selection on {result['cases']} random grids and bursts")
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)


def _run(options: RunOptions) -> dict[str, Any]:
    cases = DEFAULT_CASES if options.cases is None else options.cases
    return selection_robustness(cases=cases, seed=options.seed, log=log_replay(options))


SELECTION_ROBUSTNESS = Experiment(
    "Site selection on random grids and bursts: every protocol's completion over naive's",
    _run,
    robustness_table,
    plot_robustness,
    takes=frozenset({"cases"}) | BACKGROUND,
)
