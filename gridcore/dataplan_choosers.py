"""Choosers of a storage plan beyond the paper's: :func:`choose_by_simulation` runs every
feasible plan on the project's simulator and picks the fastest.

Seed: Bent et al., "Data-Driven Batch Scheduling", DADC 2009
(``shared/seeds/data-driven-batch-scheduling-dadc2009.md``). The paper's chooser,
:func:`gridcore.policies.dataplan.choose_bent2009`, ranks strategies by closed-form models
(Eq. 5-24). Two of their simplifications make it pick badly where it matters:

* Eq. 18 averages Slice's concurrency over the ramp (``n`` jobs) and the steady state
  (``C'``), then caps it at ``N_CPU``; on Table 1's batch workload ``n = 183`` lifts the
  average to the cap of 50 while the steady state runs ``C' = 17`` jobs: Slice is
  predicted 2.4 times faster than Minimal and simulates 25 % slower than Minimal with
  wider groups (below), 40 % and more at larger widths;
* Eq. 23 caps Minimal's group width at ``N_CPU``, so every 50 pipelines refetch every
  batch volume over the WAN, although groups three times wider still run 50 jobs at once.

What :func:`choose_by_simulation` does instead:

* **Candidates** (:func:`candidate_plans`): the strategies the paper's chooser considers
  (Eq. 1-4 feasible ones, All included unless ``consider_all=False``, Remote only when
  none is), each as the simulator runs it, and, when Minimal is possible, Minimal with
  groups as wide as storage allows while every group still runs at full concurrency
  (:func:`wide_minimal_width`; the simulator's ``minimal_width``). A plan with a group
  width is labelled ``minimal@WIDTH``.
* **Seeds**: each candidate runs on :data:`CHOOSING_SEEDS`, three seeds (common random
  numbers: one seed gives every plan the same runtimes and resets). Three because Table
  1's runtimes vary by 10 % of their mean, which moves a makespan by a few percent at
  most, and the plans worth telling apart differ by more; one seed would let one unlucky
  barrier decide, more would triple the cost of a choice for little. When ``SD_R = 0``
  and ``F = 0`` every seed runs the same simulation, so one seed is used. The seeds are
  far from 0 so that an experiment measuring the pick on seeds ``0, 1, ...`` measures it
  on seeds it did not choose with (:mod:`gridcore.sim.dataplan_experiments` checks).
* **Pick**: the smallest mean simulated makespan over the seeds (``trace=False``); ties
  go to the first candidate in the policy's tie order, the wide Minimal after Minimal. A
  run that does not end within :data:`HORIZON_FACTOR` times the largest finite model
  prediction (without failures) is infinite (failures can make a plan never settle);
  the mean over seeds is then infinite too.
* **Cost**: about 0.1 ms per simulated job. Beyond :data:`MAX_SIMULATED_JOBS` jobs in all
  (``J`` x seeds x candidates) the chooser does not simulate and returns the paper's
  pick, saying so in its reasons, so ``gridcore plan`` stays interactive for huge
  workloads.

The result is a :class:`SimulatedPlan`, a :class:`~gridcore.policies.dataplan.DataPlan`
whose ``predictions`` are the simulated means (one per strategy, Minimal's the better of
its widths) and whose ``group_width`` says how wide Minimal's groups are (``None``: the
strategy's own). Not pure (it runs the simulator), but deterministic: the same inputs give
the same plan.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gridcore.errors import ConfigError
from gridcore.model import Outcome
from gridcore.policies.dataplan import (
    TIE_ORDER,
    DataPlan,
    Environment,
    Prediction,
    Strategy,
    Workload,
    choose_bent2009,
    minimal_concurrency,
)
from gridcore.sim.dataplan import WanSharing, simulate_dataplan

CHOOSING_SEEDS: tuple[int, ...] = (1_000_001, 1_000_002, 1_000_003)
"""The seeds :func:`choose_by_simulation` chooses with (module docstring)."""
HORIZON_FACTOR = 20.0
MAX_SIMULATED_JOBS = 600_000


@dataclass(frozen=True)
class Candidate:
    """A plan the simulator can run: a strategy and, for Minimal, its group width
    (``None``: Eq. 23's ``C``)."""

    strategy: Strategy
    group_width: int | None = None

    @property
    def label(self) -> str:
        """``slice``, ``minimal``, or ``minimal@175`` for a wide Minimal."""
        if self.group_width is None:
            return self.strategy.value
        return f"{self.strategy.value}@{self.group_width}"


@dataclass(frozen=True)
class SimulatedPlan(DataPlan):
    """A :class:`DataPlan` chosen by simulation: ``group_width`` is Minimal's group width
    when not Eq. 23's (``None`` otherwise), ``seeds`` those simulated (empty when the
    chooser fell back to the paper's), ``simulated`` the mean makespan per candidate
    label (``inf`` when a run did not end)."""

    group_width: int | None
    seeds: tuple[int, ...]
    simulated: tuple[tuple[str, float], ...]

    @property
    def label(self) -> str:
        return Candidate(self.strategy, self.group_width).label


def plan_label(plan: DataPlan) -> str:
    """The candidate label of any chooser's plan: ``minimal@175`` for a wide Minimal."""
    if isinstance(plan, SimulatedPlan):
        return plan.label
    return plan.strategy.value


def candidate_of(plan: DataPlan) -> Candidate:
    """The candidate a plan runs as."""
    width = plan.group_width if isinstance(plan, SimulatedPlan) else None
    return Candidate(plan.strategy, width)


def wide_minimal_width(workload: Workload, env: Environment) -> int | None:
    """Minimal's group width when groups are as wide as storage allows with every group
    still running ``min(N_CPU, width)`` jobs in its steady state (a batch volume, one
    private per member, a second private per running job: ``S_B + S_P (w + min(N_CPU,
    w)) <= S``), then evened out over the groups that needs (``ceil(W / groups)``, no
    small tail group). ``None`` when that is no wider than Eq. 23's ``C`` or is the
    whole workload (then it is Slice). In whole bytes, as the simulator counts."""
    s_b, s_p, space = math.ceil(workload.S_B), math.ceil(workload.S_P), math.floor(env.S)
    if s_p == 0 or space < s_b:
        return None
    room = (space - s_b) // s_p  # private volumes beside one batch volume
    widest = room - env.N_CPU if room - env.N_CPU >= env.N_CPU else room // 2
    if widest < 1:
        return None
    groups = math.ceil(workload.W / min(widest, workload.W))
    width = math.ceil(workload.W / groups)
    if width >= workload.W or width <= minimal_concurrency(workload, env):
        return None
    return width


def candidate_plans(
    workload: Workload, env: Environment, *, consider_all: bool = True, wide_minimal: bool = True
) -> tuple[Candidate, ...]:
    """The plans :func:`choose_by_simulation` compares, in tie order (module docstring);
    ``wide_minimal=False`` leaves the wide Minimal out (the paper's strategies only)."""
    considered = choose_bent2009(workload, env, consider_all=consider_all).considered
    plans = [Candidate(s) for s in considered]
    if wide_minimal and Strategy.MINIMAL in considered:
        width = wide_minimal_width(workload, env)
        if width is not None:
            plans.append(Candidate(Strategy.MINIMAL, width))
    return tuple(plans)


def simulation_horizon(predictions: Sequence[Prediction]) -> float:
    """:data:`HORIZON_FACTOR` x the largest finite model prediction without failures."""
    finite = [p.base_s for p in predictions if math.isfinite(p.base_s)]
    return HORIZON_FACTOR * max(finite) if finite else math.inf


def distinct_seeds(workload: Workload, env: Environment, seeds: Sequence[int]) -> tuple[int, ...]:
    """``seeds``, or only the first when runtimes and failures draw nothing (every seed
    then runs the same simulation)."""
    if workload.SD_R == 0 and env.F == 0:
        return tuple(seeds[:1])
    return tuple(seeds)


def mean_makespan(
    candidate: Candidate,
    workload: Workload,
    env: Environment,
    seeds: Sequence[int],
    *,
    horizon_s: float = math.inf,
    wan: WanSharing = WanSharing.SERIAL,
) -> float:
    """The mean simulated makespan of ``candidate`` over ``seeds`` (``inf`` if a run
    stopped at ``horizon_s``)."""
    runs = [
        simulate_dataplan(
            candidate.strategy,
            workload,
            env,
            seed=seed,
            wan=wan,
            horizon_s=horizon_s,
            trace=False,
            minimal_width=candidate.group_width,
        ).makespan_s
        for seed in distinct_seeds(workload, env, seeds)
    ]
    return math.inf if any(math.isinf(r) for r in runs) else statistics.fmean(runs)


def choose_by_simulation(
    workload: Workload,
    env: Environment,
    *,
    seeds: Sequence[int] = CHOOSING_SEEDS,
    consider_all: bool = True,
    wide_minimal: bool = True,
    wan: WanSharing = WanSharing.SERIAL,
    max_simulated_jobs: int = MAX_SIMULATED_JOBS,
) -> SimulatedPlan:
    """Simulate every candidate plan on ``seeds`` and pick the smallest mean makespan
    (module docstring). Falls back to the paper's pick, with a reason, when simulating
    would exceed ``max_simulated_jobs`` jobs."""
    if not seeds:
        raise ConfigError("choose_by_simulation: at least one seed is required")
    paper = choose_bent2009(workload, env, consider_all=consider_all)
    candidates = candidate_plans(
        workload, env, consider_all=consider_all, wide_minimal=wide_minimal
    )
    used = distinct_seeds(workload, env, seeds)
    jobs = workload.J * len(used) * len(candidates)
    if jobs > max_simulated_jobs:
        return _fallback(paper, jobs, max_simulated_jobs)
    horizon = simulation_horizon(paper.predictions)
    simulated = {
        c: mean_makespan(c, workload, env, used, horizon_s=horizon, wan=wan) for c in candidates
    }
    best = min(candidates, key=lambda c: (simulated[c], candidates.index(c)))
    predictions = _simulated_predictions(paper, simulated)
    reasons = _reasons(best, simulated, used, paper)
    return SimulatedPlan(
        strategy=best.strategy,
        outcome=Outcome.FIT if math.isfinite(simulated[best]) else Outcome.NO_FIT,
        concurrency=_concurrency(best, paper),
        phases=_phases(best, workload, paper),
        predicted_s=simulated[best],
        feasible=paper.feasible,
        considered=paper.considered,
        predictions=predictions,
        reasons=reasons,
        group_width=best.group_width,
        seeds=used,
        simulated=tuple((c.label, t) for c, t in simulated.items()),
    )


def _concurrency(best: Candidate, paper: DataPlan) -> float:
    if best.group_width is not None:
        return float(best.group_width)
    chosen = paper.prediction(best.strategy)
    return chosen.concurrency if chosen is not None else 1.0


def _phases(best: Candidate, workload: Workload, paper: DataPlan) -> int:
    if best.group_width is not None:
        return math.ceil(workload.W / best.group_width)
    chosen = paper.prediction(best.strategy)
    return chosen.phases if chosen is not None else 1


def _simulated_predictions(
    paper: DataPlan, simulated: dict[Candidate, float]
) -> tuple[Prediction, ...]:
    """One per considered strategy, in tie order: the paper's model fields, the time the
    simulator measured (Minimal's: the better of its widths)."""
    out = []
    for model in paper.predictions:
        runs = {c: t for c, t in simulated.items() if c.strategy is model.strategy}
        fastest = min(runs, key=lambda c: runs[c])
        mean = runs[fastest]
        reason = (
            f"{fastest.label}: simulated mean {_seconds(mean)} (model: {_seconds(model.time_s)})"
        )
        out.append(
            Prediction(
                model.strategy,
                model.concurrency,
                model.phases,
                model.batch_fetches,
                mean,
                mean,
                0,
                0,
                reason,
            )
        )
    return tuple(sorted(out, key=lambda p: TIE_ORDER.index(p.strategy)))


def _reasons(
    best: Candidate, simulated: dict[Candidate, float], seeds: Sequence[int], paper: DataPlan
) -> tuple[str, ...]:
    seeds_text = ", ".join(str(s) for s in seeds)
    chosen = (
        f"chose {best.label}: smallest mean simulated makespan {_seconds(simulated[best])}"
        f" over seeds {seeds_text}"
    )
    rejected = [
        f"{c.label} rejected: simulated {_seconds(t)} > {best.label}'s {_seconds(simulated[best])}"
        if t > simulated[best]
        else f"{c.label} rejected: simulated {_seconds(t)} ties with {best.label} (tie order)"
        for c, t in simulated.items()
        if c != best
    ]
    infeasible = [r for r in paper.reasons if "infeasible" in r or "not considered" in r]
    paper_pick = f"the paper's models (Eq. 5-24) pick {paper.strategy.label}"
    return (chosen, *rejected, *infeasible, paper_pick)


def _fallback(paper: DataPlan, jobs: int, limit: int) -> SimulatedPlan:
    why = (
        f"not simulated: {jobs:,} simulated jobs > {limit:,}; the paper's pick"
        f" {paper.strategy.label} is kept"
    )
    return SimulatedPlan(
        strategy=paper.strategy,
        outcome=paper.outcome,
        concurrency=paper.concurrency,
        phases=paper.phases,
        predicted_s=paper.predicted_s,
        feasible=paper.feasible,
        considered=paper.considered,
        predictions=paper.predictions,
        reasons=(why, *paper.reasons),
        group_width=None,
        seeds=(),
        simulated=(),
    )


def _seconds(value: float) -> str:
    return f"{value:,.1f} s" if math.isfinite(value) else "inf s"
