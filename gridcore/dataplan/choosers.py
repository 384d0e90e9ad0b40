"""Choosers of a storage plan beyond the paper's: :func:`choose_by_simulation` runs every
feasible plan on the project's simulator and picks the fastest.

Design, equations and the choices where a paper is ambiguous: ``docs/dataplan.md``
(section ``gridcore/dataplan/choosers.py``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
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
from gridcore.stats import half_width_95

FIRST_SEEDS = 3
"""The seeds every candidate runs on before the race, nodes not failing (module
docstring)."""
FIRST_SEEDS_WITH_FAILURES = 10
"""The seeds every candidate runs on before the race when nodes fail (``F > 0``; module
docstring)."""
MAX_CHOOSING_SEEDS = 30
"""The most seeds a plan in the race runs on (docs/dataplan.md)."""
CHOOSING_SEEDS: tuple[int, ...] = tuple(range(1_000_001, 1_000_001 + MAX_CHOOSING_SEEDS))
"""The seeds :func:`choose_by_simulation` chooses with, in the order it uses them: the
first :func:`first_seeds` always, the others while plans are in the race."""
INDIFFERENCE = 0.01
"""A plan stays in the race while it might be faster than the leader by more than this
share of the leader's mean (docs/dataplan.md)."""
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


Runner = Callable[[Candidate, int], float]
"""One simulated makespan: ``run(candidate, seed)``."""


@dataclass(frozen=True)
class SimulatedPlan(DataPlan):
    """A :class:`DataPlan` chosen by simulation: ``group_width`` is Minimal's group width
    when not Eq. 23's (``None`` otherwise), ``seeds`` those the pick was simulated on
    (empty when the chooser fell back to the paper's), ``simulated`` the mean makespan
    per candidate label over the seeds it ran on (``inf`` when a run did not end)."""

    group_width: int | None
    seeds: tuple[int, ...]
    simulated: tuple[tuple[str, float], ...]

    @property
    def label(self) -> str:
        return Candidate(self.strategy, self.group_width).label


@dataclass(frozen=True)
class Departure:
    """Why a plan left the race: after ``seeds`` seeds, the 95 % interval of its paired
    difference to ``leader`` was ``low`` .. ``high`` (shares of the leader's mean; an
    infinite ``low`` for a plan whose run did not end)."""

    leader: Candidate
    seeds: int
    low: float
    high: float


@dataclass(frozen=True)
class Race:
    """The per-seed makespans of every candidate (in candidate order; a plan that left
    the race has fewer), the plans still in the race at the end (the pick among them),
    how each other plan left, the seed counts of the rounds, and the plans that were
    still in the race beside the leader after each round (``()`` for the last round when
    the race was decided)."""

    runs: Mapping[Candidate, tuple[float, ...]]
    finalists: tuple[Candidate, ...]
    departures: Mapping[Candidate, Departure]
    rounds: tuple[int, ...]
    undecided: tuple[tuple[Candidate, ...], ...]
    budget_cut: bool

    def mean(self, candidate: Candidate) -> float:
        """``candidate``'s mean makespan over the seeds it ran on."""
        return _mean(self.runs[candidate])


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
    """The plans :func:`choose_by_simulation` compares, in tie order (docs/dataplan.md);
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


def first_seeds(env: Environment) -> int:
    """How many seeds every candidate runs on before the race: more when nodes fail,
    whose effect on a makespan a few seeds may not show (docs/dataplan.md)."""
    return FIRST_SEEDS_WITH_FAILURES if env.F > 0 else FIRST_SEEDS


def makespan(
    candidate: Candidate,
    workload: Workload,
    env: Environment,
    seed: int,
    *,
    horizon_s: float = math.inf,
    wan: WanSharing = WanSharing.SERIAL,
) -> float:
    """``candidate``'s simulated makespan on ``seed`` (``inf`` if it stopped at
    ``horizon_s``)."""
    return simulate_dataplan(
        candidate.strategy,
        workload,
        env,
        seed=seed,
        wan=wan,
        horizon_s=horizon_s,
        trace=False,
        minimal_width=candidate.group_width,
    ).makespan_s


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
    return _mean(
        [
            makespan(candidate, workload, env, seed, horizon_s=horizon_s, wan=wan)
            for seed in distinct_seeds(workload, env, seeds)
        ]
    )


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
    """Race every candidate plan over ``seeds`` (the first :func:`first_seeds`, more
    while plans are not told apart) and pick the smallest mean makespan (module
    docstring). Falls back to the paper's pick, with a reason, when the first round
    would exceed ``max_simulated_jobs`` jobs."""
    if not seeds:
        raise ConfigError("choose_by_simulation: at least one seed is required")
    paper = choose_bent2009(workload, env, consider_all=consider_all)
    candidates = candidate_plans(
        workload, env, consider_all=consider_all, wide_minimal=wide_minimal
    )
    pool = distinct_seeds(workload, env, seeds)
    first = min(first_seeds(env), len(pool))
    jobs = workload.J * first * len(candidates)
    if jobs > max_simulated_jobs:
        return _fallback(paper, jobs, max_simulated_jobs)
    horizon = simulation_horizon(paper.predictions)

    def run(candidate: Candidate, seed: int) -> float:
        return makespan(candidate, workload, env, seed, horizon_s=horizon, wan=wan)

    budget = max_simulated_jobs // max(workload.J, 1)
    result = race(candidates, pool, run, budget=budget, first=first)
    best = min(result.finalists, key=lambda c: (result.mean(c), candidates.index(c)))
    simulated = {c: result.mean(c) for c in candidates}
    return SimulatedPlan(
        strategy=best.strategy,
        outcome=Outcome.FIT if math.isfinite(simulated[best]) else Outcome.NO_FIT,
        concurrency=_concurrency(best, paper),
        phases=_phases(best, workload, paper),
        predicted_s=simulated[best],
        feasible=paper.feasible,
        considered=paper.considered,
        predictions=_simulated_predictions(paper, simulated),
        reasons=_reasons(best, result, pool, paper),
        group_width=best.group_width,
        seeds=tuple(pool[: len(result.runs[best])]),
        simulated=tuple((c.label, t) for c, t in simulated.items()),
    )


# -- the race ----------------------------------------------------------------------------------


def race(
    candidates: Sequence[Candidate],
    seeds: Sequence[int],
    run: Runner,
    *,
    budget: int | None = None,
    first: int = FIRST_SEEDS,
) -> Race:
    """Run every candidate on the first ``first`` seeds, then, while a plan is still in
    the race beside the leader (:func:`still_racing`), the leader and those plans on
    twice as many seeds, up to all of ``seeds`` (docs/dataplan.md). ``run(candidate,
    seed)`` is one makespan; ``budget`` caps the runs in all (one run: one candidate on
    one seed; ``None``: no cap), a round being cut to the seeds that fit."""
    runs: dict[Candidate, list[float]] = {c: [] for c in candidates}
    racing = tuple(candidates)
    departures: dict[Candidate, Departure] = {}
    rounds: list[int] = []
    undecided: list[tuple[Candidate, ...]] = []
    spent, done, size = 0, 0, min(first, len(seeds))
    budget_cut = False
    while True:
        for candidate in racing:
            runs[candidate].extend(run(candidate, seed) for seed in seeds[done:size])
        spent += (size - done) * len(racing)
        done = size
        rounds.append(done)
        leader, left = still_racing(racing, runs, departures)
        racing = tuple(c for c in racing if c == leader or c in left)
        undecided.append(left)
        if not left or done == len(seeds):
            break
        size = min(2 * done, len(seeds))
        if budget is not None and spent + (size - done) * len(racing) > budget:
            size = done + max(budget - spent, 0) // len(racing)
            budget_cut = True
            if size == done:
                break
    return Race(
        runs={c: tuple(r) for c, r in runs.items()},
        finalists=racing,
        departures=departures,
        rounds=tuple(rounds),
        undecided=tuple(undecided),
        budget_cut=budget_cut,
    )


def still_racing(
    racing: Sequence[Candidate],
    runs: dict[Candidate, list[float]],
    departures: dict[Candidate, Departure],
) -> tuple[Candidate, tuple[Candidate, ...]]:
    """The leader among ``racing`` (smallest mean, then candidate order) and the plans
    that stay in the race beside it: those whose 95 % paired interval to the leader
    reaches below ``-INDIFFERENCE`` of its mean (a plan whose run did not end leaves).
    Records in ``departures`` why the others left. When no run of the leader ended,
    nothing is told apart and the race ends."""
    leader = min(racing, key=lambda c: (_mean(runs[c]), racing.index(c)))
    if math.isinf(_mean(runs[leader])):
        return leader, ()
    stay = []
    for candidate in racing:
        if candidate == leader:
            continue
        low, high = paired_interval(runs[candidate], runs[leader])
        if low >= -INDIFFERENCE:
            departures[candidate] = Departure(leader, len(runs[leader]), low, high)
        else:
            stay.append(candidate)
    return leader, tuple(stay)


def paired_interval(times: Sequence[float], leader: Sequence[float]) -> tuple[float, float]:
    """The 95 % Student t interval of the mean per-seed difference ``times - leader``
    as shares of the leader's mean, whose runs all ended: ``inf .. inf`` when a run of
    ``times`` did not, ``-inf .. inf`` from one seed (nothing bounds it then)."""
    if math.isinf(_mean(times)):
        return math.inf, math.inf
    if len(times) < 2:
        return -math.inf, math.inf
    scale = _mean(leader)
    differences = [(t - lead) / scale for t, lead in zip(times, leader, strict=True)]
    half = half_width_95(differences)
    centre = statistics.fmean(differences)
    return centre - half, centre + half


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
    best: Candidate, result: Race, seeds: Sequence[int], paper: DataPlan
) -> tuple[str, ...]:
    used = seeds[: len(result.runs[best])]
    chosen = (
        f"chose {best.label}: smallest mean simulated makespan {_seconds(result.mean(best))}"
        f" over {_seeds_text(used)}"
    )
    rejected = [_rejected(c, best, result) for c in result.runs if c != best]
    infeasible = [r for r in paper.reasons if "infeasible" in r or "not considered" in r]
    paper_pick = f"the paper's models (Eq. 5-24) pick {paper.strategy.label}"
    return (chosen, *_race_lines(result, len(seeds)), *rejected, *infeasible, paper_pick)


def _race_lines(result: Race, given: int) -> list[str]:
    """Why more seeds than the first round's, and whether they told the plans apart."""
    rounds, lines = result.rounds, []
    if len(rounds) > 1:
        lines.append(
            f"raced over {' -> '.join(str(n) for n in rounds)} seeds: after {rounds[0]},"
            f" {_labels(result.undecided[0])} might still be more than {INDIFFERENCE:.0%}"
            " faster than the leader (95 % paired interval)"
        )
    last = result.undecided[-1]
    if last and rounds[-1] > 1:
        limit = "the job budget" if result.budget_cut else f"the last of {given} seeds"
        lines.append(
            f"not told apart at {rounds[-1]} seeds ({limit}): {_labels(last)} might still"
            f" be more than {INDIFFERENCE:.0%} faster"
        )
    return lines


def _rejected(candidate: Candidate, best: Candidate, result: Race) -> str:
    """The candidate's mean against the pick's over the seeds both ran on, and, if it
    left the race, the interval it left with."""
    count = len(result.runs[candidate])
    own, pick = result.mean(candidate), _mean(result.runs[best][:count])
    if own == pick:
        text = f"ties with {best.label}'s {_seconds(pick)} (tie order)"
    else:
        text = f"{'>' if own > pick else '<'} {best.label}'s {_seconds(pick)}"
    line = f"{candidate.label} rejected: simulated {_seconds(own)} {text}"
    if count < len(result.runs[best]):
        line += f" over the first {count} seeds"
    left = result.departures.get(candidate)
    if left is not None and math.isfinite(left.low):
        line += (
            f"; left the race at {left.seeds} seeds, its paired difference to"
            f" {left.leader.label} {left.low:+.1%} .. {left.high:+.1%} (95 %)"
        )
    return line


def _seeds_text(seeds: Sequence[int]) -> str:
    if len(seeds) <= FIRST_SEEDS:
        return "seeds " + ", ".join(str(s) for s in seeds)
    return f"{len(seeds)} seeds {seeds[0]}, ..., {seeds[-1]}"


def _labels(candidates: Sequence[Candidate]) -> str:
    return ", ".join(c.label for c in candidates)


def _mean(times: Sequence[float]) -> float:
    return math.inf if any(math.isinf(t) for t in times) else statistics.fmean(times)


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
