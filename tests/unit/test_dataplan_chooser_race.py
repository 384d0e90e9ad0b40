"""The simulation chooser's race (issue 10): more choosing seeds only where the first
ones do not tell the plans apart, never a measurement seed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

import gridcore.dataplan.choosers as choosers
from gridcore.dataplan.choosers import (
    CHOOSING_SEEDS,
    FIRST_SEEDS,
    FIRST_SEEDS_WITH_FAILURES,
    MAX_CHOOSING_SEEDS,
    Candidate,
    choose_by_simulation,
    paired_interval,
    race,
)
from gridcore.errors import ConfigError
from gridcore.experiments import dataplan as dx
from gridcore.policies.dataplan import TABLE1_WORKLOADS, Strategy, table2_environment

SLICE = Candidate(Strategy.SLICE)
MINIMAL = Candidate(Strategy.MINIMAL)
WIDE = Candidate(Strategy.MINIMAL, 175)
SEEDS = tuple(range(1, MAX_CHOOSING_SEEDS + 1))


class Table:
    """A fake simulator: each plan's makespan per seed from a table (seed ``s`` is row
    ``s - 1``), recording every (plan, seed) asked."""

    def __init__(self, times: dict[Candidate, Sequence[float]]) -> None:
        self.times = times
        self.asked: list[tuple[Candidate, int]] = []

    def __call__(self, candidate: Candidate, seed: int) -> float:
        self.asked.append((candidate, seed))
        return self.times[candidate][seed - 1]

    def seeds_of(self, candidate: Candidate) -> list[int]:
        return [seed for c, seed in self.asked if c == candidate]


def _common(base: float, *, spread: float = 0.1) -> list[float]:
    # One seed's draw moves every plan alike (common random numbers): +-spread.
    return [base * (1 + spread * math.sin(seed)) for seed in SEEDS]


def _alternating(base: float, swing: float) -> list[float]:
    return [base + (swing if seed % 2 else -swing) for seed in SEEDS]


@pytest.mark.parametrize(
    ("scenario", "times", "rounds", "finalists"),
    [
        (
            "Minimal 10 % slower than Slice on every seed: told apart by the first 3 seeds",
            {SLICE: _common(100.0), MINIMAL: _common(110.0)},
            (3,),
            (SLICE,),
        ),
        (
            "Slice and Minimal run identically: nothing to tell apart, 3 seeds",
            {SLICE: _common(100.0), MINIMAL: _common(100.0)},
            (3,),
            (SLICE,),
        ),
        (
            "Minimal 3 % slower but -2/+8/+3 % on the first 3 seeds, +3 % on the next:"
            " undecided after 3, decided after 6",
            {SLICE: [100.0] * 30, MINIMAL: [98.0, 108.0, *[103.0] * 28]},
            (3, 6),
            (SLICE,),
        ),
        (
            "Slice and Minimal +-5 % apart in turn: never told apart, the cap of 30 seeds",
            {SLICE: [100.0] * 30, MINIMAL: _alternating(100.0, 5.0)},
            (3, 6, 12, 24, 30),
            (SLICE, MINIMAL),
        ),
    ],
)
def test_extra_seeds_only_when_the_first_ones_do_not_separate_the_plans(
    scenario: str,
    times: dict[Candidate, Sequence[float]],
    rounds: tuple[int, ...],
    finalists: tuple[Candidate, ...],
) -> None:
    runner = Table(times)
    result = race((SLICE, MINIMAL), SEEDS, runner)
    assert result.rounds == rounds
    assert result.finalists == finalists
    for candidate in times:
        assert runner.seeds_of(candidate) == list(SEEDS[: len(result.runs[candidate])])
    assert len(runner.seeds_of(SLICE)) == rounds[-1]
    assert (result.undecided[-1] == ()) is (len(finalists) == 1)


def test_a_plan_told_apart_leaves_while_the_close_ones_race_on() -> None:
    # Wide Minimal is 40 % slower on every seed: it leaves after the first round; Slice
    # and Minimal, +-5 % apart in turn, race to the cap without it.
    times = {
        SLICE: [100.0] * 30,
        MINIMAL: _alternating(100.0, 5.0),
        WIDE: [140.0] * 30,
    }
    runner = Table(times)
    result = race((SLICE, MINIMAL, WIDE), SEEDS, runner)
    assert runner.seeds_of(WIDE) == list(SEEDS[:FIRST_SEEDS])
    assert len(runner.seeds_of(MINIMAL)) == MAX_CHOOSING_SEEDS
    left = result.departures[WIDE]
    assert (left.leader, left.seeds) == (SLICE, FIRST_SEEDS)
    assert left.low == pytest.approx(0.4) and left.high == pytest.approx(0.4)
    assert result.finalists == (SLICE, MINIMAL)


def test_a_plan_whose_run_does_not_end_leaves_at_once() -> None:
    times = {SLICE: [math.inf] * 30, MINIMAL: _alternating(100.0, 5.0)}
    result = race((SLICE, MINIMAL), SEEDS, Table(times))
    assert result.rounds == (3,) and result.finalists == (MINIMAL,)
    assert math.isinf(result.departures[SLICE].low)


def test_when_no_plan_ends_the_first_in_tie_order_stays_and_the_race_ends() -> None:
    times = {SLICE: [math.inf] * 30, MINIMAL: [math.inf] * 30}
    result = race((SLICE, MINIMAL), SEEDS, Table(times))
    assert result.rounds == (3,) and result.finalists == (SLICE,)


def test_the_job_budget_cuts_a_round_to_the_seeds_that_fit() -> None:
    # 2 plans x 3 seeds = 6 runs, then 4 left of a budget of 10: 2 more seeds each.
    times = {SLICE: [100.0] * 30, MINIMAL: _alternating(100.0, 5.0)}
    result = race((SLICE, MINIMAL), SEEDS, Table(times), budget=10)
    assert result.rounds == (3, 5) and result.budget_cut


def test_the_paired_interval_is_student_t_over_the_per_seed_differences() -> None:
    # Differences -2, +8, +3 % of the leader's mean 100: mean 3 %, s = 5 %, t(0.975, 2).
    low, high = paired_interval([98.0, 108.0, 103.0], [100.0, 100.0, 100.0])
    half = 4.303 * 0.05 / math.sqrt(3)
    assert (low, high) == (pytest.approx(0.03 - half), pytest.approx(0.03 + half))
    assert paired_interval([101.0], [100.0]) == (-math.inf, math.inf)
    assert paired_interval([math.inf, 1.0], [100.0, 100.0]) == (math.inf, math.inf)


# -- the chooser on the race ----------------------------------------------------------------


ENV = table2_environment()
MIXED = replace(TABLE1_WORKLOADS["mixed"], W=20)


def _fake_simulator(
    monkeypatch: pytest.MonkeyPatch, makespan: Any
) -> list[tuple[Strategy, int | None, int]]:
    asked: list[tuple[Strategy, int | None, int]] = []

    def fake(strategy: Strategy, *args: Any, **kwargs: Any) -> SimpleNamespace:
        seed = kwargs["seed"]
        asked.append((strategy, kwargs["minimal_width"], seed))
        return SimpleNamespace(makespan_s=makespan(strategy, kwargs["minimal_width"], seed))

    monkeypatch.setattr(choosers, "simulate_dataplan", fake)
    return asked


def test_the_chooser_adds_seeds_only_when_its_first_three_leave_plans_undecided(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Slice 100 s on every seed; every other plan 100 +- 5 s in turn (undecided), then
    # 150 s (told apart at once).
    def close(strategy: Strategy, width: int | None, seed: int) -> float:
        if strategy is Strategy.SLICE:
            return 100.0
        return 100.0 + (5.0 if seed % 2 else -5.0)

    asked = _fake_simulator(monkeypatch, close)
    plan = choose_by_simulation(MIXED, ENV)
    assert {seed for *_, seed in asked} == set(CHOOSING_SEEDS) == set(plan.seeds)
    assert any(r.startswith("raced over 3 -> 6 -> 12 -> 24 -> 30 seeds") for r in plan.reasons)
    assert any(r.startswith("not told apart at 30 seeds") for r in plan.reasons)

    asked = _fake_simulator(monkeypatch, lambda s, w, seed: 100.0 if s is Strategy.SLICE else 150)
    plan = choose_by_simulation(MIXED, ENV)
    assert {seed for *_, seed in asked} == set(CHOOSING_SEEDS[:FIRST_SEEDS]) == set(plan.seeds)
    assert plan.strategy is Strategy.SLICE
    assert plan.reasons[0] == (
        "chose slice: smallest mean simulated makespan 100.0 s over seeds 1000001, 1000002, 1000003"
    )
    assert not any(r.startswith("raced over") for r in plan.reasons)


def test_without_variability_or_failures_one_seed_is_simulated_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = _fake_simulator(monkeypatch, lambda s, w, seed: 100.0 + seed % 2)
    plan = choose_by_simulation(replace(MIXED, SD_R=0.0), ENV)
    assert {seed for *_, seed in asked} == {CHOOSING_SEEDS[0]} == set(plan.seeds)


def test_a_plan_left_after_the_first_round_says_so_against_the_pick_over_its_seeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def makespan(strategy: Strategy, width: int | None, seed: int) -> float:
        if strategy is Strategy.SLICE:
            return 100.0
        if strategy is Strategy.MINIMAL and width is None:
            return 100.0 + (5.0 if seed % 2 else -5.0)
        return 200.0

    _fake_simulator(monkeypatch, makespan)
    plan = choose_by_simulation(MIXED, ENV)
    lost = [r for r in plan.reasons if r.startswith("all_batch rejected")]
    assert lost == [
        "all_batch rejected: simulated 200.0 s > slice's 100.0 s over the first 3 seeds;"
        " left the race at 3 seeds, its paired difference to slice +100.0% .. +100.0% (95 %)"
    ]


def test_measurement_seeds_may_meet_none_of_the_choosing_seeds() -> None:
    assert len(CHOOSING_SEEDS) == MAX_CHOOSING_SEEDS and min(CHOOSING_SEEDS) == 1_000_001
    with pytest.raises(ConfigError, match="choosing seeds"):
        dx.measurement_seeds(CHOOSING_SEEDS[-1], 1)


def test_with_failing_nodes_every_plan_first_runs_on_ten_seeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A reset that costs one plan a barrier may hit few seeds: three can miss it.
    asked = _fake_simulator(monkeypatch, lambda s, w, seed: 100.0 if s is Strategy.SLICE else 150)
    plan = choose_by_simulation(MIXED, replace(ENV, F=1e-6))
    first = set(CHOOSING_SEEDS[:FIRST_SEEDS_WITH_FAILURES])
    assert {seed for *_, seed in asked} == first == set(plan.seeds)
    assert plan.reasons[0].endswith("over 10 seeds 1000001, ..., 1000010")
