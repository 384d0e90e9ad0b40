"""VJM's experiments on the simulator: Fig. 3 (co-allocation time against cluster B's
schedule interval) and competing multi-cluster jobs (deadlock and reorganization).

Design, equations and the choices where a paper is ambiguous: ``docs/experiments.md``
(section ``gridcore/experiments/coreservation.py``).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from gridcore.experiments.registry import (
    BACKGROUND,
    Experiment,
    RunOptions,
    background_figures,
    log_replay,
    text_table,
)
from gridcore.experiments.seeds import Claim, OverSeeds
from gridcore.policies.coreservation import BOTH, DIRECT, INDIRECT, PAPER_RULE, ReorganizeRule
from gridcore.progress import progress
from gridcore.sim.coreservation import (
    Mode,
    ParallelJob,
    Selection,
    VjmCluster,
    VjmParams,
    VjmRun,
    simulate_vjm,
)
from gridcore.sim.log_load import LogReplay
from gridcore.sim.workload import LocalJob, SimSite
from gridcore.stats import half_width_95

CLUSTER_PROCESSORS = 16
A_INTERVAL_S = 60.0
B_INTERVALS_S = tuple(float(b) for b in range(10, 121, 10))
JOB_PROCESSORS = 10
JOB_RUNTIME_S = 60.0
PROBE_JOBS = 3
PROBE_PILOTS_PER_CLUSTER = 5
PROBE_WINDOW_S = 150.0
PROBE_RUNTIME_S = 10.0
SAMPLES = 200
MAX_CLUSTERS = 2

DEADLOCK_CLUSTERS = 3
DEADLOCK_INTERVALS_S = (10.0, 60.0)
DEADLOCK_JOBS = 10
DEADLOCK_SIZES = (20, 28)
DEADLOCK_RUNTIME_S = (120.0, 600.0)
DEADLOCK_GAP_S = 20.0
DEADLOCK_SUBMIT_DELAY_S = (0.0, 30.0)
BACKGROUND_SIZES = (1, 4)
BACKGROUND_RUNTIME_S = 300.0
BACKGROUND_UTILIZATION = 0.25
LIFETIME_FLOOR_S = 300.0
LOAD_WINDOW_S = 4 * 3600.0
HORIZON_S = 7 * 86_400.0
DEADLOCK_CASES = 5
REORGANIZATION_STEPS = (INDIRECT, DIRECT, BOTH, "step 3", "wait", "none")

_DELAYED: dict[str, Any] = {
    "lifetime_floor_s": LIFETIME_FLOOR_S,
    "submit_delay_s": DEADLOCK_SUBMIT_DELAY_S,
}

VARIANTS: Mapping[str, VjmParams] = MappingProxyType(
    {
        "reorganize": VjmParams(**_DELAYED),  # DEFAULT_RULE: what gridcore runs
        "reorganize_paper": VjmParams(**_DELAYED, rule=PAPER_RULE),
        "reorganize_paper_literal": VjmParams(
            **_DELAYED, rule=PAPER_RULE, restart_lifetime_on_shift=False
        ),
        "reorganize_earlier_only": VjmParams(**_DELAYED, rule=ReorganizeRule(earlier_only=True)),
        "reorganize_held_only": VjmParams(**_DELAYED, rule=ReorganizeRule(held_only=True)),
        "no_reorganize": VjmParams(**_DELAYED, reorganize=False),
        "koala": VjmParams(**_DELAYED, reorganize=False, mode=Mode.COMPONENTS),
    }
)


# -- vjm-coallocation (Fig. 3) ------------------------------------------------------------------


def coallocation_experiment(
    seed: int = 0, samples: int = SAMPLES, log: LogReplay | None = None
) -> dict[str, Any]:
    """Fig. 3 for ``seed``: per interval of B, VJM's and round-robin's co-allocation;
    ``log``: real other users' jobs besides the probes (``--background``)."""
    points = [
        _point(b, seed, samples, log) for b in progress(B_INTERVALS_S, "B intervals", unit="point")
    ]
    return {
        "points": points,
        "summary": fig3_summary(points),
        "setup": {
            "source": "VJM Sec. 4.2, Fig. 3",
            "seed": seed,
            "samples_per_point": samples,
            "cluster_processors": CLUSTER_PROCESSORS,
            "a_interval_s": A_INTERVAL_S,
            "job_processors": JOB_PROCESSORS,
            "vj_processors": 1,
            "max_clusters": MAX_CLUSTERS,
            "probe_jobs": PROBE_JOBS,
            "probe_pilots_per_cluster": PROBE_PILOTS_PER_CLUSTER,
            "probe_window_s": PROBE_WINDOW_S,
            "interval": "95 % Student t over the samples: mean +- t(0.975, n-1) * s / sqrt(n)",
        },
    } | background_figures(log)


def coallocation_sample(
    b_interval_s: float, seed: int, sample: int, log: LogReplay | None = None
) -> dict[str, VjmRun]:
    """One sample of Fig. 3's setup: the VJM and the round-robin run on the same draws."""
    # the seed string keeps the former module path, so seeded runs reproduce
    rng = random.Random(f"gridcore.sim.vjm_experiments:fig3:{seed}:{sample}:{b_interval_s}")
    clusters = [
        VjmCluster(SimSite("A", CLUSTER_PROCESSORS), A_INTERVAL_S, rng.uniform(0, A_INTERVAL_S)),
        VjmCluster(SimSite("B", CLUSTER_PROCESSORS), b_interval_s, rng.uniform(0, b_interval_s)),
    ]
    probes = []
    for r in range(PROBE_JOBS):
        at = rng.uniform(r * PROBE_WINDOW_S, (r + 1) * PROBE_WINDOW_S)
        probes += [
            LocalJob(f"probe{r}.{c.name}{k}", c.name, at, PROBE_RUNTIME_S, 1)
            for c in clusters
            for k in range(PROBE_PILOTS_PER_CLUSTER)
        ]
    submit = rng.uniform(PROBE_JOBS * PROBE_WINDOW_S, (PROBE_JOBS + 1) * PROBE_WINDOW_S)
    job = [ParallelJob("J", submit, JOB_PROCESSORS, JOB_RUNTIME_S)]
    return {
        selection.value: simulate_vjm(
            clusters,
            job,
            VjmParams(max_clusters=MAX_CLUSTERS, selection=selection, reorganize=False),
            background=probes,
            log=log,
            seed=seed,
        )
        for selection in Selection
    }


def _point(b: float, seed: int, samples: int, log: LogReplay | None) -> dict[str, Any]:
    vjm: list[float] = []
    round_robin: list[float] = []
    on_b: list[float] = []
    for sample in range(samples):
        runs = coallocation_sample(b, seed, sample, log)
        job = runs[Selection.VJM.value].by_name("J")
        vjm.append(job.coallocation_s or 0.0)
        on_b.append(job.clusters.get("B", 0) / job.processors)
        round_robin.append(runs[Selection.ROUND_ROBIN.value].by_name("J").coallocation_s or 0.0)
    return {
        "b_interval_s": b,
        "vjm_s": statistics.fmean(vjm),
        "round_robin_s": statistics.fmean(round_robin),
        "vjm_halfwidth_s": half_width(vjm),
        "round_robin_halfwidth_s": half_width(round_robin),
        "vjm_fraction_on_b": statistics.fmean(on_b),
        "min_interval_half_s": min(A_INTERVAL_S, b) / 2,
        "expected_max_of_ticks_s": expected_max_uniform(A_INTERVAL_S, b),
    }


def expected_max_uniform(a: float, b: float) -> float:
    """``E[max(U(0, a), U(0, b))]``: ``hi / 2 + lo^2 / (6 hi)``."""
    lo, hi = sorted((a, b))
    return hi / 2 + lo * lo / (6 * hi)


def half_width(values: Sequence[float]) -> float:
    """The 95 % Student t half-width of the mean of ``values`` (0 for fewer than 2)."""
    if len(values) < 2:
        return 0.0
    return half_width_95(values)


def coallocation_table(result: Mapping[str, Any]) -> str:
    return text_table(
        [
            ("B interval s", ">12.0f"),
            ("VJM s", ">10.1f"),
            ("round-robin s", ">13.1f"),
            ("VJM on B", ">8.2f"),
            ("min/2 s", ">8.1f"),
            ("E[max] s", ">8.1f"),
        ],
        [
            (
                p["b_interval_s"],
                p["vjm_s"],
                p["round_robin_s"],
                p["vjm_fraction_on_b"],
                p["min_interval_half_s"],
                p["expected_max_of_ticks_s"],
            )
            for p in result["points"]
        ],
    )


def plot_coallocation(result: Mapping[str, Any], path: str) -> None:
    """Write a PNG like Fig. 3: co-allocation time against B's schedule interval."""
    # Imported here so the simulator never needs matplotlib; the Agg canvas is bound to
    # this figure only, leaving any global pyplot backend alone.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    points: Sequence[Mapping[str, float]] = result["points"]
    xs = [p["b_interval_s"] for p in points]
    figure = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    for key, label, marker in (("vjm_s", "VJM", "o"), ("round_robin_s", "MPICH-G2 (RR)", "s")):
        ax.errorbar(
            xs,
            [p[key] for p in points],
            yerr=[p[key.replace("_s", "_halfwidth_s")] for p in points],
            marker=marker,
            label=label,
            capsize=3,
        )
    ax.plot(xs, [p["min_interval_half_s"] for p in points], ":", color="grey", label="min(A,B)/2")
    ax.set_xlabel("schedule interval of cluster B (s); A = 60 s")
    ax.set_ylabel("co-allocation time (s)")
    ax.grid(alpha=0.3)
    ax.legend()
    setup = result["setup"]
    runs = (
        f"live on Slurm, {setup['repeats']} runs per point"
        if result.get("live")
        else f"seed {setup['seed']}, {setup['samples_per_point']} samples per point"
    )
    figure.suptitle(
        f"VJM Fig. 3: {setup['job_processors']}-processor job, two idle 16-processor"
        f" clusters ({runs})",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)


def _run_coallocation(options: RunOptions) -> dict[str, Any]:
    # Fig. 3 on real Slurm clusters needs the project's test grid, which an installed
    # gridcore does not have: from a checkout, python -m tests.slurm.live_vjm
    return coallocation_experiment(options.seed, options.runs or SAMPLES, log_replay(options))


def _coallocation_ok(result: Mapping[str, Any]) -> bool:
    return bool(result["summary"]["ratio_b10"] <= 0.35)


VJM_COALLOCATION = Experiment(
    "VJM Sec. 4.2 Fig. 3: co-allocation time, VJM vs round-robin, against B's interval",
    _run_coallocation,
    coallocation_table,
    plot_coallocation,
    ok=_coallocation_ok,
    default_runs=SAMPLES,
    takes=BACKGROUND,
    over_seeds=OverSeeds(
        ("summary",),
        (
            Claim(
                "with B at 10 s VJM <= 0.35 x round-robin",
                lambda result: bool(result["summary"]["ratio_b10"] <= 0.35),
            ),
        ),
    ),
)


# -- vjm-deadlock ---------------------------------------------------------------------------------


def deadlock_case(
    seed: int, case: int
) -> tuple[list[VjmCluster], list[ParallelJob], list[LocalJob]]:
    """One trace: clusters, competing parallel jobs and other users' jobs (module
    docstring for the ranges)."""
    # the seed string keeps the former module path, so seeded runs reproduce
    rng = random.Random(f"gridcore.sim.vjm_experiments:deadlock:{seed}:{case}")
    clusters = []
    for number in range(DEADLOCK_CLUSTERS):
        interval = rng.uniform(*DEADLOCK_INTERVALS_S)
        site = SimSite(f"c{number}", CLUSTER_PROCESSORS)
        clusters.append(VjmCluster(site, interval, rng.uniform(0, interval)))
    jobs = []
    at = 0.0
    for number in range(DEADLOCK_JOBS):
        at += rng.expovariate(1.0 / DEADLOCK_GAP_S)
        jobs.append(
            ParallelJob(
                f"j{number:02d}",
                at,
                rng.randint(*DEADLOCK_SIZES),
                rng.uniform(*DEADLOCK_RUNTIME_S),
            )
        )
    return clusters, jobs, _background(rng, clusters)


def _background(rng: random.Random, clusters: Sequence[VjmCluster]) -> list[LocalJob]:
    mean_size = sum(BACKGROUND_SIZES) / 2
    gap = mean_size * BACKGROUND_RUNTIME_S / (BACKGROUND_UTILIZATION * CLUSTER_PROCESSORS)
    jobs = []
    for cluster in clusters:
        at = rng.expovariate(1.0 / gap)
        number = 0
        while at < LOAD_WINDOW_S:
            size = rng.randint(*BACKGROUND_SIZES)
            runtime = rng.expovariate(1.0 / BACKGROUND_RUNTIME_S)
            jobs.append(LocalJob(f"{cluster.name}-user{number}", cluster.name, at, runtime, size))
            number += 1
            at += rng.expovariate(1.0 / gap)
    return jobs


def deadlock_experiment(
    seed: int = 0, cases: int = DEADLOCK_CASES, log: LogReplay | None = None
) -> dict[str, Any]:
    """Every variant on ``cases`` traces of ``seed``: pooled figures and per case;
    ``log``: real other users' jobs besides the drawn ones (``--background``)."""
    per_case: list[dict[str, Any]] = []
    runs: dict[str, list[VjmRun]] = {name: [] for name in VARIANTS}
    for case in progress(range(cases), "cases", unit="case"):
        clusters, jobs, background = deadlock_case(seed, case)
        row: dict[str, Any] = {"case": case, "intervals_s": [c.interval_s for c in clusters]}
        for name, params in VARIANTS.items():
            run = simulate_vjm(
                clusters,
                jobs,
                params,
                background=background,
                log=log,
                seed=seed,
                horizon_s=HORIZON_S,
            )
            runs[name].append(run)
            row[name] = {"submitted": run.submitted, "started": run.started}
        per_case.append(row)
    return {
        "variants": {name: _pooled(rs) for name, rs in runs.items()},
        "cases": per_case,
        "setup": _deadlock_setup(seed, cases),
    } | background_figures(log)


def _pooled(runs: Sequence[VjmRun]) -> dict[str, Any]:
    started = [j for run in runs for j in run.jobs if j.coallocation_s is not None]
    in_window = sum(1 for j in started if j.start_s is not None and j.start_s < LOAD_WINDOW_S)
    # Every step named on every seed, so the per-seed figures line up (--seeds).
    steps: dict[str, int] = dict.fromkeys(REORGANIZATION_STEPS, 0)
    for run in runs:
        for step, n in run.steps.items():
            steps[step] = steps.get(step, 0) + n
    submitted = sum(run.submitted for run in runs)
    return {
        "submitted": submitted,
        "started": len(started),
        "started_fraction": len(started) / submitted if submitted else 0.0,
        "never_started": submitted - len(started),
        "started_in_load_window": in_window,
        "cases_with_never_started": sum(1 for run in runs if run.started < run.submitted),
        "mean_coallocation_s": (
            statistics.fmean(j.coallocation_s or 0.0 for j in started) if started else 0.0
        ),
        "idle_held_cpu_s": sum(run.idle_held_cpu_s for run in runs),
        "shifted_pilots": sum(j.shifts_given for run in runs for j in run.jobs),
        "substitute_pilots": sum(j.substitutes for run in runs for j in run.jobs),
        "reorganization_steps": steps,
    }


def _deadlock_setup(seed: int, cases: int) -> dict[str, Any]:
    return {
        "source": "VJM Sec. 3.3 (no experiment in the paper): competing jobs, loaded grid",
        "seed": seed,
        "cases": cases,
        "clusters": DEADLOCK_CLUSTERS,
        "cluster_processors": CLUSTER_PROCESSORS,
        "intervals_s": list(DEADLOCK_INTERVALS_S),
        "jobs_per_case": DEADLOCK_JOBS,
        "job_processors": list(DEADLOCK_SIZES),
        "job_runtime_s": list(DEADLOCK_RUNTIME_S),
        "mean_gap_s": DEADLOCK_GAP_S,
        "submit_delay_s": list(DEADLOCK_SUBMIT_DELAY_S),
        "background": {
            "processors": list(BACKGROUND_SIZES),
            "mean_runtime_s": BACKGROUND_RUNTIME_S,
            "utilization": BACKGROUND_UTILIZATION,
        },
        "vj_processors": 1,
        "max_clusters": MAX_CLUSTERS,
        "lifetime_floor_s": LIFETIME_FLOOR_S,
        "load_window_s": LOAD_WINDOW_S,
        "horizon_s": HORIZON_S,
        "rule": {name: p.rule.name for name, p in VARIANTS.items() if p.reorganize},
        "koala": (
            "components submitted directly, barrier, no reorganization (gridcore.sim.coreservation)"
        ),
    }


def deadlock_table(result: Mapping[str, Any]) -> str:
    return text_table(
        [
            ("variant", "<24"),
            ("submitted", ">9"),
            ("started", ">8"),
            ("in window", ">9"),
            ("mean co-alloc s", ">15.1f"),
            ("idle held cpu-s", ">15.0f"),
        ],
        [
            (
                name,
                v["submitted"],
                v["started"],
                v["started_in_load_window"],
                v["mean_coallocation_s"],
                v["idle_held_cpu_s"],
            )
            for name, v in result["variants"].items()
        ],
    )


def _run_deadlock(options: RunOptions) -> dict[str, Any]:
    return deadlock_experiment(options.seed, options.runs or DEADLOCK_CASES, log_replay(options))


def _every_job_with_reorganization(result: Mapping[str, Any]) -> bool:
    v = result["variants"]["reorganize"]
    return bool(v["started"] == v["submitted"])


def _some_never_without(result: Mapping[str, Any]) -> bool:
    v = result["variants"]["no_reorganize"]
    return bool(v["started"] < v["submitted"])


VJM_DEADLOCK = Experiment(
    "VJM Sec. 3.3: competing co-allocated jobs with and without reorganization, and KOALA",
    _run_deadlock,
    deadlock_table,
    ok=lambda result: _every_job_with_reorganization(result) and _some_never_without(result),
    default_runs=DEADLOCK_CASES,
    takes=BACKGROUND,
    over_seeds=OverSeeds(
        ("variants",),
        (
            Claim("with reorganization every job starts", _every_job_with_reorganization),
            Claim("without reorganization some jobs never start", _some_never_without),
        ),
    ),
)


def fig3_summary(points: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Fig. 3's headline: both co-allocation times at the first (10 s) B interval and
    their ratio; the simulated and the live runs report it alike."""
    first = points[0]
    return {
        "vjm_b10_s": first["vjm_s"],
        "round_robin_b10_s": first["round_robin_s"],
        "ratio_b10": first["vjm_s"] / first["round_robin_s"],
    }
