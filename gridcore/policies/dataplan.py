"""Bent et al.'s data-driven batch scheduling: which storage plan (All, AllBatch, Slice,
Minimal, or Remote as the last resort) a canonical batch-pipeline workload should run
with on one compute cluster, and how long each plan is predicted to take.

Design, equations and the choices where a paper is ambiguous: ``docs/dataplan.md``
(section ``gridcore/policies/dataplan.py``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from gridcore.errors import ConfigError
from gridcore.model import MB, Outcome

GB = 1000 * MB
FAILURE_ROUNDS_MAX = 1000


class Strategy(enum.StrEnum):
    """The allocation plans of Sec. 2, in tie order (least constrained first)."""

    ALL = "all"
    ALL_BATCH = "all_batch"
    SLICE = "slice"
    MINIMAL = "minimal"
    REMOTE = "remote"

    @property
    def label(self) -> str:
        """The paper's name: ``AllBatch``."""
        return "".join(part.capitalize() for part in self.value.split("_"))


STORAGE_STRATEGIES = (Strategy.ALL, Strategy.ALL_BATCH, Strategy.SLICE, Strategy.MINIMAL)
TIE_ORDER = tuple(Strategy)


class BandwidthReading(enum.StrEnum):
    """How Table 2's ``BW_L = 1 MB/s`` is read (docs/dataplan.md)."""

    GIGABIT = "gigabit"  # 1 Gb/s per node = 125 MB/s: the default
    LITERAL = "literal"  # 1 MB/s as printed

    @property
    def bytes_per_s(self) -> float:
        return 125.0 * MB if self is BandwidthReading.GIGABIT else 1.0 * MB


@dataclass(frozen=True)
class Workload:
    """A canonical batch-pipeline workload (Sec. 1): ``W`` pipelines of ``D`` jobs, batch
    volumes of ``S_B`` bytes, private volumes of ``S_P`` bytes, job runtimes of mean
    ``R_bar`` and standard deviation ``SD_R`` seconds."""

    W: int
    D: int
    S_B: float
    S_P: float
    R_bar: float
    SD_R: float

    def __post_init__(self) -> None:
        _require_count("Workload", "W", self.W)
        _require_count("Workload", "D", self.D)
        for name in ("S_B", "S_P", "R_bar", "SD_R"):
            _require_amount("Workload", name, getattr(self, name))

    @classmethod
    def from_totals(
        cls, W: int, D: int, S_TotB: float, S_TotP: float, R_bar: float, SD_R: float
    ) -> Workload:
        """From Table 1's totals: ``S_B = S_TotB / D``, ``S_P = S_TotP / ((D + 1) W)``."""
        _require_count("Workload", "W", W)
        _require_count("Workload", "D", D)
        _require_amount("Workload", "S_TotB", S_TotB)
        _require_amount("Workload", "S_TotP", S_TotP)
        return cls(W, D, S_TotB / D, S_TotP / ((D + 1) * W), R_bar, SD_R)

    @property
    def J(self) -> int:
        """``J = D * W``: jobs in the workload (Sec. 1)."""
        return self.D * self.W

    @property
    def S_TotB(self) -> float:
        """``S_TotB = D * S_B``: all batch data (Sec. 1)."""
        return self.D * self.S_B

    @property
    def S_TotP(self) -> float:
        """``S_TotP = (D + 1) * W * S_P``: all private data, as printed (Sec. 1)."""
        return (self.D + 1) * self.W * self.S_P


@dataclass(frozen=True)
class Environment:
    """The compute cluster (Sec. 1): ``N_CPU`` nodes, ``S`` bytes of storage in all, ``F``
    failure events per second in the whole cluster (docs/dataplan.md), ``BW_R`` the
    bandwidth from the home storage server and ``BW_L`` the local one (bytes/s)."""

    N_CPU: int
    S: float
    F: float
    BW_R: float
    BW_L: float

    def __post_init__(self) -> None:
        _require_count("Environment", "N_CPU", self.N_CPU)
        _require_amount("Environment", "F", self.F)
        for name in ("S", "BW_R", "BW_L"):
            value = getattr(self, name)
            _require_amount("Environment", name, value)
            if value == 0:
                raise ConfigError(f"Environment.{name} must be > 0, got {value}")


def _require_count(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{owner}.{name} must be an integer >= 1, got {value!r}")


def _require_amount(owner: str, name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value >= 0)
    ):
        raise ConfigError(f"{owner}.{name} must be a finite number >= 0, got {value!r}")


# -- Table 1 and Table 2 (Sec. 4) ------------------------------------------------------------


TABLE1_WORKLOADS: Mapping[str, Workload] = MappingProxyType(
    {
        "batch": Workload.from_totals(350, 5, 883 * GB, 420 * GB, 5000.0, 500.0),
        "private": Workload.from_totals(350, 5, 150 * GB, 5250 * GB, 5000.0, 500.0),
        "mixed": Workload.from_totals(350, 5, 225 * GB, 1050 * GB, 5000.0, 500.0),
    }
)
"""Table 1's batch-intensive, private-intensive and mixed workloads."""


def table2_environment(
    bandwidth_reading: BandwidthReading = BandwidthReading.GIGABIT,
) -> Environment:
    """Table 2: 50 nodes, 250 GB, ``F = 0``, ``BW_R = 12 MB/s``, ``BW_L`` per the reading."""
    return Environment(
        N_CPU=50, S=250.0 * GB, F=0.0, BW_R=12.0 * MB, BW_L=bandwidth_reading.bytes_per_s
    )


# -- the chooser (Sec. 3-4) ------------------------------------------------------------------


@dataclass(frozen=True)
class DataPlan:
    """The chosen plan: strategy, concurrency ``C``, phases (``N_Cycles`` for Minimal),
    predicted time with failures; ``outcome`` is FIT when that time is finite, NO_FIT
    when every considered model diverges. ``feasible``: the strategies Eq. 1-4 allow
    (``(REMOTE,)`` when none); ``considered``: those the chooser predicted (All left out
    with ``consider_all=False``). ``predictions``: one per considered strategy, in
    :data:`TIE_ORDER`; ``reasons``: the choice first, then every infeasible, not
    considered or rejected strategy, then every prediction."""

    strategy: Strategy
    outcome: Outcome
    concurrency: float
    phases: int
    predicted_s: float
    feasible: tuple[Strategy, ...]
    considered: tuple[Strategy, ...]
    predictions: tuple[Prediction, ...]
    reasons: tuple[str, ...]

    @property
    def predicted(self) -> dict[Strategy, float]:
        """Predicted seconds per considered strategy."""
        return {p.strategy: p.time_s for p in self.predictions}

    def prediction(self, strategy: Strategy) -> Prediction | None:
        return next((p for p in self.predictions if p.strategy is strategy), None)


def choose_bent2009(workload: Workload, env: Environment, *, consider_all: bool = True) -> DataPlan:
    """The paper's chooser (Sec. 3-4): of the possible strategies (Eq. 1-4; Remote only
    when none is), the one with the smallest predicted time; ties in :data:`TIE_ORDER`.
    ``consider_all=False`` leaves All out as the paper's evaluation does."""
    checks = [check_feasibility(s, workload, env) for s in STORAGE_STRATEGIES]
    reasons = [c.reason for c in checks if not c.possible]
    feasible = [c.strategy for c in checks if c.possible] or [Strategy.REMOTE]
    considered = list(feasible)
    if not consider_all and Strategy.ALL in considered:
        considered.remove(Strategy.ALL)
        reasons.append(
            "All possible (Eq. 1) but not considered: consider_all=False, as the paper's"
            " evaluation winnows it (Sec. 2)"
        )
    if considered != [Strategy.REMOTE]:
        reasons.append("Remote not considered: a storage plan is possible (last resort only)")
    else:
        reasons.append("Remote: none of Eq. 1-4 holds, the last resort (model: gridcore's)")
    predictions = tuple(predict(s, workload, env) for s in considered)
    best = min(predictions, key=lambda p: (p.time_s, TIE_ORDER.index(p.strategy)))
    reasons.extend(_rejection(p, best) for p in predictions if p is not best)
    outcome = Outcome.FIT if best.finite else Outcome.NO_FIT
    chosen = (
        f"chose {best.strategy.label}: C = {best.concurrency:.4g}, {best.phases}"
        f" {'cycles' if best.strategy is Strategy.MINIMAL else 'phases'},"
        f" predicted {_seconds(best.time_s)}"
    )
    return DataPlan(
        best.strategy,
        outcome,
        best.concurrency,
        best.phases,
        best.time_s,
        tuple(feasible),
        tuple(considered),
        predictions,
        (chosen, *reasons, *(p.reason for p in predictions)),
    )


def _rejection(p: Prediction, best: Prediction) -> str:
    if p.time_s == best.time_s:
        order = ", ".join(s.label for s in TIE_ORDER)
        return (
            f"{p.strategy.label} rejected: predicted {_seconds(p.time_s)} ties with"
            f" {best.strategy.label} (tie order {order})"
        )
    return (
        f"{p.strategy.label} rejected: predicted {_seconds(p.time_s)} >"
        f" {best.strategy.label}'s {_seconds(best.time_s)}"
    )


# -- feasibility (Sec. 2, Eq. 1-4) -----------------------------------------------------------


def all_possible(workload: Workload, env: Environment) -> bool:
    """Eq. 1: ``S_TotB + S_TotP <= S``: every volume fits at once."""
    return _all_needs(workload) <= env.S


def all_batch_possible(workload: Workload, env: Environment) -> bool:
    """Eq. 2: ``S_TotB + 2 S_P <= S``: every batch volume and one pipeline's pair."""
    return _all_batch_needs(workload) <= env.S


def slice_possible(workload: Workload, env: Environment) -> bool:
    """Eq. 3: ``S_B + S_P * W + S_P <= S``: a horizontal slice and one more output."""
    return _slice_needs(workload) <= env.S


def minimal_possible(workload: Workload, env: Environment) -> bool:
    """Eq. 4: ``S_B + 2 S_P <= S``: one job with its batch volume and both privates."""
    return _minimal_needs(workload) <= env.S


def _all_needs(w: Workload) -> float:
    return w.S_TotB + w.S_TotP


def _all_batch_needs(w: Workload) -> float:
    return w.S_TotB + 2 * w.S_P


def _slice_needs(w: Workload) -> float:
    return w.S_B + w.S_P * w.W + w.S_P


def _minimal_needs(w: Workload) -> float:
    return w.S_B + 2 * w.S_P


_NEEDS: Mapping[Strategy, tuple[int, str, Callable[[Workload], float]]] = MappingProxyType(
    {
        Strategy.ALL: (1, "S_TotB + S_TotP", _all_needs),
        Strategy.ALL_BATCH: (2, "S_TotB + 2*S_P", _all_batch_needs),
        Strategy.SLICE: (3, "S_B + S_P*W + S_P", _slice_needs),
        Strategy.MINIMAL: (4, "S_B + 2*S_P", _minimal_needs),
    }
)


@dataclass(frozen=True)
class Feasibility:
    """Whether ``strategy`` is possible: the storage it needs at least (Eq. 1-4's left
    side; 0 for Remote), the equation (``None`` for Remote) and a reason."""

    strategy: Strategy
    possible: bool
    needs_bytes: float
    equation: int | None
    reason: str


def check_feasibility(strategy: Strategy, workload: Workload, env: Environment) -> Feasibility:
    """Eq. 1-4 for ``strategy``, with a reason a person can read."""
    if strategy is Strategy.REMOTE:
        why = "Remote possible: it stores nothing at the cluster (remote I/O, Sec. 2)"
        return Feasibility(strategy, True, 0.0, None, why)
    equation, expression, needs_of = _NEEDS[strategy]
    needs = needs_of(workload)
    possible = needs <= env.S
    verdict, sign = ("possible", "<=") if possible else ("infeasible", ">")
    reason = (
        f"{strategy.label} {verdict}: {expression} = {_bytes(needs)} {sign}"
        f" S = {_bytes(env.S)} (Eq. {equation})"
    )
    return Feasibility(strategy, possible, needs, equation, reason)


# -- the All model (Sec. 3, Eq. 5-14) --------------------------------------------------------


def serial_bandwidth(env: Environment) -> float:
    """Eq. 8: ``BW = (BW_R^-1 + BW_L^-1)^-1``, remote data through both networks."""
    return 1.0 / (1.0 / env.BW_R + 1.0 / env.BW_L)


def cold_batch_time(workload: Workload, env: Environment) -> float:
    """Eq. 7: ``T_ColdB = S_TotB / BW``, every batch volume from the home server."""
    return workload.S_TotB / serial_bandwidth(env)


def private_time(workload: Workload, env: Environment) -> float:
    """Eq. 9: ``T_P = S_P / BW + S_P (D - 1) / BW_L``: one private volume over the WAN,
    the other ``D - 1`` within the cluster (reading; writing takes the same)."""
    return workload.S_P / serial_bandwidth(env) + workload.S_P * (workload.D - 1) / env.BW_L


def compute_time(workload: Workload) -> float:
    """Eq. 10: ``T_CPU = R_bar * D``, one pipeline's compute time without barriers."""
    return workload.R_bar * workload.D


def cold_phase_time(workload: Workload, env: Environment, t_cpu: float) -> float:
    """Eq. 6: ``T_Cold = T_ColdB + T_P + T_P + T_CPU``."""
    return cold_batch_time(workload, env) + 2 * private_time(workload, env) + t_cpu


def all_concurrency(workload: Workload, env: Environment) -> int:
    """Eq. 11: ``C = min(W, N_CPU)``."""
    return min(workload.W, env.N_CPU)


def warm_phases(W: int, C: float) -> int:
    """Eq. 12: ``N_Warm = ceil(W / C) - 1``: the phases after the cold one."""
    return math.ceil(W / C) - 1


def warm_batch_time(workload: Workload, env: Environment) -> float:
    """Eq. 14: ``T_WarmB = S_TotB / BW_L``, batch data from the cluster's cache."""
    return workload.S_TotB / env.BW_L


def warm_phase_time(workload: Workload, env: Environment, t_cpu: float) -> float:
    """Eq. 13: ``T_Warm = T_WarmB + T_P + T_P + T_CPU``."""
    return warm_batch_time(workload, env) + 2 * private_time(workload, env) + t_cpu


def total_time(t_cold: float, n_warm: int, t_warm: float) -> float:
    """Eq. 5: ``T = T_Cold + N_Warm * T_Warm``."""
    return t_cold + n_warm * t_warm


# -- AllBatch, Slice and Minimal's concurrency (Eq. 15-19, 22-23) ----------------------------


def all_batch_concurrency(workload: Workload, env: Environment) -> int:
    """Eq. 15: ``C = min(W, N_CPU, floor((S - S_TotB) / (2 S_P)))``; at least 1 (module
    docstring; meaningful when Eq. 2 holds)."""
    pairs = _per_volume(env.S - workload.S_TotB, 2 * workload.S_P)
    return max(1, int(min(workload.W, env.N_CPU, pairs)))


def slice_steady_concurrency(workload: Workload, env: Environment) -> float:
    """Eq. 16: ``C' = floor((S - S_B - S_P * W) / S_P)``: second private volumes left
    once a whole slice is allocated (infinite when ``S_P = 0``)."""
    return _per_volume(env.S - workload.S_B - workload.S_P * workload.W, workload.S_P)


def slice_ramp_jobs(workload: Workload, env: Environment) -> float:
    """Eq. 17: ``n = floor((S - S_B) / (2 S_P))``: jobs with both privates after one
    batch volume (infinite when ``S_P = 0``)."""
    return _per_volume(env.S - workload.S_B, 2 * workload.S_P)


def slice_concurrency_printed(workload: Workload, env: Environment) -> float:
    """Eq. 18 as printed: ``min(W, N_CPU, (2 n^2 + (J - 2n) C') / J)`` (may be negative
    when ``2n > J``; ``min(W, N_CPU)`` when ``S_P = 0``)."""
    if workload.S_P == 0:
        return float(min(workload.W, env.N_CPU))
    n, c_prime, J = (
        slice_ramp_jobs(workload, env),
        slice_steady_concurrency(workload, env),
        workload.J,
    )
    return min(workload.W, env.N_CPU, (2 * n * n + (J - 2 * n) * c_prime) / J)


def slice_concurrency(workload: Workload, env: Environment) -> float:
    """Eq. 18 with the ramp's share at most ``J`` jobs: when ``2n >= J`` every job runs
    at ``n`` (docs/dataplan.md); otherwise as printed. At least 1."""
    n, J = slice_ramp_jobs(workload, env), workload.J
    if 2 * n >= J:
        mean = n
    else:
        mean = (2 * n * n + (J - 2 * n) * slice_steady_concurrency(workload, env)) / J
    # A possible Slice has C' >= 1 and n >= 1; the bound only guards float rounding.
    return max(1.0, min(workload.W, env.N_CPU, mean))


def slice_batch_volumes_printed(workload: Workload, env: Environment) -> float:
    """Eq. 19 as printed: ``N_B = floor((S - S_P * W - C' * S_P) / S_B)``."""
    return _batch_volumes(workload, env, slice_steady_concurrency(workload, env))


def slice_batch_volumes(workload: Workload, env: Environment) -> float:
    """Eq. 19 with ``min(C', N_CPU, W)`` second volumes, the jobs that can execute (module
    docstring); infinite when ``S_B = 0``."""
    c_prime = slice_steady_concurrency(workload, env)
    return _batch_volumes(workload, env, min(c_prime, env.N_CPU, workload.W))


def _batch_volumes(workload: Workload, env: Environment, second_volumes: float) -> float:
    privates = 0.0 if workload.S_P == 0 else (workload.W + second_volumes) * workload.S_P
    return _per_volume(env.S - privates, workload.S_B)


def barrier_compute_time(workload: Workload, n_b: float) -> float:
    """Eq. 20: ``T_CPU = (R_bar + SD(R) / N_B) * D``: waits at barriers, more likely the
    fewer batch volumes fit at once."""
    return (workload.R_bar + workload.SD_R / n_b) * workload.D


def minimal_concurrency(workload: Workload, env: Environment) -> int:
    """Eq. 23: ``C = min(W, N_CPU, floor((S - S_B) / (2 S_P)))``; at least 1 (module
    docstring; meaningful when Eq. 4 holds)."""
    return max(1, int(min(workload.W, env.N_CPU, slice_ramp_jobs(workload, env))))


def minimal_cycles(workload: Workload, env: Environment) -> int:
    """Eq. 22: ``N_Cycles = ceil(W / C)``."""
    return math.ceil(workload.W / minimal_concurrency(workload, env))


def minimal_subworkloads(workload: Workload, env: Environment) -> tuple[tuple[int, Workload], ...]:
    """Eq. 21 / 24's sub-workloads as ``(how many, sub-workload)``: ``N_Cycles`` of width
    ``C``, the last one the remainder (docs/dataplan.md)."""
    C, cycles = minimal_concurrency(workload, env), minimal_cycles(workload, env)
    last = workload.W - (cycles - 1) * C
    full = replace(workload, W=C)
    if last == C:
        return ((cycles, full),)
    return ((cycles - 1, full), (1, replace(workload, W=last)))


def _per_volume(space: float, size: float) -> float:
    # A volume of size 0 never limits how many fit.
    return math.inf if size == 0 else float(math.floor(space / size))


# -- predictions without failures ------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """A model's prediction without failures: concurrency ``C``, phases (``ceil(W / C)``;
    ``N_Cycles`` for Minimal), how often each batch volume crosses the WAN, and ``T``."""

    strategy: Strategy
    concurrency: float
    phases: int
    batch_fetches: int
    time_s: float


def predict_all(workload: Workload, env: Environment) -> Estimate:
    """All, Eq. 5-14 (requires Eq. 1)."""
    _require_possible(Strategy.ALL, workload, env)
    return _phased(Strategy.ALL, workload, env, all_concurrency(workload, env))


def predict_all_batch(workload: Workload, env: Environment) -> Estimate:
    """AllBatch: the All model with Eq. 15's concurrency (requires Eq. 2)."""
    _require_possible(Strategy.ALL_BATCH, workload, env)
    return _phased(Strategy.ALL_BATCH, workload, env, all_batch_concurrency(workload, env))


def predict_slice(workload: Workload, env: Environment) -> Estimate:
    """Slice: the All model with Eq. 18's concurrency and Eq. 20's compute time
    (requires Eq. 3)."""
    _require_possible(Strategy.SLICE, workload, env)
    return _slice_estimate(workload, env)


def predict_minimal(workload: Workload, env: Environment) -> Estimate:
    """Minimal, Eq. 21 / 24: ``T = sum_i T(Slice, SubWorkload_i)`` (requires Eq. 4)."""
    _require_possible(Strategy.MINIMAL, workload, env)
    return _minimal_estimate(workload, env)


def predict_remote(workload: Workload, env: Environment) -> Estimate:
    """Remote (not in the paper; docs/dataplan.md): ``ceil(W / C)`` phases of one
    pipeline doing all its I/O at ``BW``, ``C = min(W, N_CPU)``."""
    C = all_concurrency(workload, env)
    phases = math.ceil(workload.W / C)
    return Estimate(
        Strategy.REMOTE, C, phases, workload.W, phases * remote_pipeline_time(workload, env)
    )


def remote_pipeline_time(workload: Workload, env: Environment) -> float:
    """One Remote pipeline: ``D * ((S_B + 2 S_P) / BW + R_bar)``."""
    io = (workload.S_B + 2 * workload.S_P) / serial_bandwidth(env)
    return workload.D * (io + workload.R_bar)


def _phased(
    strategy: Strategy,
    workload: Workload,
    env: Environment,
    C: float,
    t_cpu: float | None = None,
) -> Estimate:
    cpu = compute_time(workload) if t_cpu is None else t_cpu
    n_warm = warm_phases(workload.W, C)
    time_s = total_time(
        cold_phase_time(workload, env, cpu), n_warm, warm_phase_time(workload, env, cpu)
    )
    return Estimate(strategy, C, n_warm + 1, 1, time_s)


def _slice_estimate(workload: Workload, env: Environment) -> Estimate:
    t_cpu = barrier_compute_time(workload, slice_batch_volumes(workload, env))
    return _phased(Strategy.SLICE, workload, env, slice_concurrency(workload, env), t_cpu)


def _minimal_estimate(workload: Workload, env: Environment) -> Estimate:
    # Each sub-workload is at most n wide, a possible Slice; not re-checked with floats.
    time_s = sum(
        count * _slice_estimate(sub, env).time_s
        for count, sub in minimal_subworkloads(workload, env)
    )
    cycles = minimal_cycles(workload, env)
    return Estimate(Strategy.MINIMAL, minimal_concurrency(workload, env), cycles, cycles, time_s)


_MODELS: Mapping[Strategy, Callable[[Workload, Environment], Estimate]] = MappingProxyType(
    {
        Strategy.ALL: lambda w, e: _phased(Strategy.ALL, w, e, all_concurrency(w, e)),
        Strategy.ALL_BATCH: lambda w, e: _phased(
            Strategy.ALL_BATCH, w, e, all_batch_concurrency(w, e)
        ),
        Strategy.SLICE: _slice_estimate,
        Strategy.MINIMAL: _minimal_estimate,
        Strategy.REMOTE: predict_remote,
    }
)


def _require_possible(strategy: Strategy, workload: Workload, env: Environment) -> None:
    check = check_feasibility(strategy, workload, env)
    if not check.possible:
        raise ConfigError(f"cannot predict {strategy.label}: {check.reason}")


# -- the failure model (Sec. 3) --------------------------------------------------------------


def rerun_time(strategy: Strategy, workload: Workload, env: Environment) -> float:
    """The time to re-run ``workload`` (the failed pipelines) under ``strategy``: All and
    AllBatch keep batch cached, so no cold phase (``ceil(W / C) * T_Warm``); Slice,
    Minimal and Remote refetch it (their full models)."""
    if strategy in (Strategy.ALL, Strategy.ALL_BATCH):
        C = (all_concurrency if strategy is Strategy.ALL else all_batch_concurrency)(workload, env)
        return math.ceil(workload.W / C) * warm_phase_time(workload, env, compute_time(workload))
    return _MODELS[strategy](workload, env).time_s


@dataclass(frozen=True)
class FailureEstimate:
    """The failure model's result: the total time (``inf`` when it diverges), the re-run
    rounds, the pipelines re-run in all, and why."""

    time_s: float
    rounds: int
    rerun_pipelines: int
    reason: str


def failure_model(
    strategy: Strategy, workload: Workload, env: Environment, base_s: float
) -> FailureEstimate:
    """Sec. 3: ``floor(F * T)`` jobs of a round of ``T`` seconds fail; their pipelines
    re-run as the next round; repeat until fewer than one fails (docs/dataplan.md)."""
    if env.F == 0:
        return FailureEstimate(base_s, 0, 0, "F = 0: no failures")
    one = rerun_time(strategy, replace(workload, W=1), env)
    if env.F * one >= 1:
        return FailureEstimate(
            math.inf,
            0,
            0,
            f"failure model diverges: F x T(re-run of one pipeline) = {env.F:g}/s x"
            f" {_seconds(one)} = {env.F * one:.3g} >= 1: every re-run expects another failure",
        )
    total, last, width, rerun, rounds = base_s, base_s, workload.W, 0, 0
    while True:
        failed = min(width, math.floor(env.F * last))
        if failed < 1:
            why = f"F = {env.F:g}/s: {rounds} re-run rounds of {rerun} pipelines in all"
            return FailureEstimate(total, rounds, rerun, why)
        if rounds > 0 and failed == width:
            why = f"failure model diverges: every one of {width} re-run pipelines fails again"
            return FailureEstimate(math.inf, rounds, rerun, why)
        if rounds == FAILURE_ROUNDS_MAX:
            why = f"failure model did not settle within {rounds} rounds: treated as diverging"
            return FailureEstimate(math.inf, rounds, rerun, why)
        last = rerun_time(strategy, replace(workload, W=failed), env)
        total, width, rerun, rounds = total + last, failed, rerun + failed, rounds + 1


# -- predictions with failures ---------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """One strategy's predicted time with failures (``time_s``, ``inf`` when the failure
    model diverges) and without (``base_s``); ``phases`` is ``N_Cycles`` for Minimal."""

    strategy: Strategy
    concurrency: float
    phases: int
    batch_fetches: int
    base_s: float
    time_s: float
    failure_rounds: int
    rerun_pipelines: int
    reason: str

    @property
    def finite(self) -> bool:
        return math.isfinite(self.time_s)


def predict(strategy: Strategy, workload: Workload, env: Environment) -> Prediction:
    """``strategy``'s model (requires its feasibility) with the failure model."""
    _require_possible(strategy, workload, env)
    estimate = _MODELS[strategy](workload, env)
    failures = failure_model(strategy, workload, env, estimate.time_s)
    phases = "cycles (Eq. 22)" if strategy is Strategy.MINIMAL else "phases"
    reason = (
        f"{strategy.label}: C = {estimate.concurrency:.4g}, {estimate.phases} {phases},"
        f" T = {_seconds(estimate.time_s)} without failures; {failures.reason}"
        f" -> {_seconds(failures.time_s)}"
    )
    return Prediction(
        strategy,
        estimate.concurrency,
        estimate.phases,
        estimate.batch_fetches,
        estimate.time_s,
        failures.time_s,
        failures.rounds,
        failures.rerun_pipelines,
        reason,
    )


def _bytes(value: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.6g} {unit}"
    return f"{value:.6g} B"


def _seconds(value: float) -> str:
    return f"{value:,.1f} s" if math.isfinite(value) else "inf s"
