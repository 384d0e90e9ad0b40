"""Bent et al.'s data-driven batch scheduling policy (seed
``data-driven-batch-scheduling-dadc2009.md``): feasibility (Eq. 1-4) on the paper's Table 1
workloads and Table 2 cluster, the runtime models (Eq. 5-24) on small workloads computed
by hand, the failure model, bad inputs and the chooser's reasons; one scenario per row."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest

from gridcore.errors import ConfigError
from gridcore.model import MB, Outcome
from gridcore.policies.dataplan import (
    FAILURE_ROUNDS_MAX,
    GB,
    TABLE1_WORKLOADS,
    BandwidthReading,
    Environment,
    Estimate,
    Strategy,
    Workload,
    all_batch_possible,
    all_possible,
    check_feasibility,
    choose_bent2009,
    failure_model,
    minimal_possible,
    minimal_subworkloads,
    predict,
    predict_all,
    predict_all_batch,
    predict_minimal,
    predict_remote,
    predict_slice,
    rerun_time,
    serial_bandwidth,
    slice_batch_volumes,
    slice_batch_volumes_printed,
    slice_concurrency,
    slice_concurrency_printed,
    slice_possible,
    slice_ramp_jobs,
    slice_steady_concurrency,
    table2_environment,
)

ALL, ALL_BATCH, SLICE, MINIMAL, REMOTE = (
    Strategy.ALL,
    Strategy.ALL_BATCH,
    Strategy.SLICE,
    Strategy.MINIMAL,
    Strategy.REMOTE,
)


def small(W: int = 3, D: int = 3, S_B: int = 1000 * MB, S_P: int = 100 * MB) -> Workload:
    """Round numbers: batch volumes 1 GB, privates 100 MB, runtimes 100 s (sd 10 s)."""
    return Workload(W=W, D=D, S_B=S_B, S_P=S_P, R_bar=100.0, SD_R=10.0)


def cluster(S: int, N_CPU: int = 4, F: float = 0.0) -> Environment:
    """``BW_R = BW_L = 200 MB/s``, so the serial bandwidth (Eq. 8) is 100 MB/s."""
    return Environment(N_CPU=N_CPU, S=S, F=F, BW_R=200 * MB, BW_L=200 * MB)


# -- Table 1 on Table 2 (Sec. 4) ---------------------------------------------------------------


@pytest.mark.parametrize("reading", list(BandwidthReading))
@pytest.mark.parametrize(
    ("scenario", "name", "feasible"),
    [
        ("batch-intensive: only Slice and Minimal", "batch", {SLICE, MINIMAL}),
        ("private-intensive: only AllBatch and Minimal", "private", {ALL_BATCH, MINIMAL}),
        ("mixed: AllBatch, Slice and Minimal, not All", "mixed", {ALL_BATCH, SLICE, MINIMAL}),
    ],
)
def test_table1_feasibility_on_table2(
    scenario: str, name: str, feasible: set[Strategy], reading: BandwidthReading
) -> None:
    workload, env = TABLE1_WORKLOADS[name], table2_environment(reading)
    possible = {s for s in Strategy if check_feasibility(s, workload, env).possible} - {REMOTE}
    assert possible == feasible, scenario
    plan = choose_bent2009(workload, env)
    assert set(plan.feasible) == feasible, scenario
    assert set(plan.predicted) == feasible, scenario
    assert plan.strategy in feasible and plan.outcome is Outcome.FIT, scenario


@pytest.mark.parametrize(
    ("name", "S_B_gb", "S_P_gb"),
    [("batch", 176.6, 0.2), ("private", 30.0, 2.5), ("mixed", 45.0, 0.5)],
)
def test_table1_derives_volume_sizes_from_its_totals(
    name: str, S_B_gb: float, S_P_gb: float
) -> None:
    # S_B = S_TotB / 5; S_P = S_TotP / ((5 + 1) * 350) = S_TotP / 2100.
    workload = TABLE1_WORKLOADS[name]
    assert (workload.W, workload.D, workload.J) == (350, 5, 1750)
    batch, private = S_B_gb * GB, S_P_gb * GB
    sizes = (workload.S_B, workload.S_P)
    assert sizes == pytest.approx((batch, private))
    assert (workload.S_TotB, workload.S_TotP) == pytest.approx((5 * batch, 6 * 350 * private))
    assert (workload.R_bar, workload.SD_R) == (5000.0, 500.0)


@pytest.mark.parametrize(
    ("reading", "BW_L", "serial"),
    [
        (BandwidthReading.GIGABIT, 125 * MB, 12 * 125 / 137 * MB),  # 1 Gb/s per node
        (BandwidthReading.LITERAL, 1 * MB, 12 / 13 * MB),  # 1 MB/s as printed
    ],
)
def test_table2_bandwidth_readings(reading: BandwidthReading, BW_L: float, serial: float) -> None:
    env = table2_environment(reading)
    assert (env.N_CPU, env.S, env.F, env.BW_R, env.BW_L) == (50, 250 * GB, 0.0, 12 * MB, BW_L)
    assert serial_bandwidth(env) == pytest.approx(serial)
    assert table2_environment().BW_L == 125 * MB


def test_mixed_allbatch_by_hand_on_table2() -> None:
    # C = min(350, 50, floor((250 - 225) / (2 * 0.5))) = 25: ceil(350 / 25) = 14 phases.
    # BW = (1/12 + 1/125)^-1 MB/s = 1500/137 MB/s. T_ColdB = 225e9 * 137 / 1.5e9 = 20550 s.
    # T_P = 0.5e9 * 137 / 1.5e9 + 0.5e9 * 4 / 125e6 = 45.667 + 16 = 61.667 s.
    # T_Cold = 20550 + 2 * 61.667 + 25000 = 45673.33; T_WarmB = 225e9 / 125e6 = 1800 s,
    # T_Warm = 1800 + 123.33 + 25000 = 26923.33; T = 45673.33 + 13 * 26923.33 = 395676.67 s.
    estimate = predict_all_batch(TABLE1_WORKLOADS["mixed"], table2_environment())
    assert (estimate.concurrency, estimate.phases) == (25, 14)
    assert estimate.time_s == pytest.approx(395676.6667)


def test_batch_slice_keeps_full_concurrency_by_eq18() -> None:
    # C' = floor((250 - 176.6 - 70) / 0.2) = 17, n = floor(73.4 / 0.4) = 183, J = 1750:
    # (2 * 183^2 + (1750 - 366) * 17) / 1750 = 90506 / 1750 = 51.7177 > N_CPU = 50.
    workload, env = TABLE1_WORKLOADS["batch"], table2_environment()
    assert (slice_steady_concurrency(workload, env), slice_ramp_jobs(workload, env)) == (17, 183)
    assert slice_concurrency(workload, env) == 50
    wide = replace(env, N_CPU=1000)
    assert slice_concurrency_printed(workload, wide) == pytest.approx(90506 / 1750)
    assert slice_concurrency(workload, wide) == pytest.approx(90506 / 1750)


# -- Eq. 1-4 at their boundaries ---------------------------------------------------------------

# small(): W = D = 3, S_B = 1000 MB, S_P = 100 MB.
# Eq. 1: 3000 + 4*3*100 = 4200 MB; Eq. 2: 3000 + 200 = 3200 MB;
# Eq. 3: 1000 + 300 + 100 = 1400 MB; Eq. 4: 1000 + 200 = 1200 MB.
EQUATIONS: list[tuple[str, Callable[[Workload, Environment], bool], int]] = [
    ("Eq. 1, All", all_possible, 4200 * MB),
    ("Eq. 2, AllBatch", all_batch_possible, 3200 * MB),
    ("Eq. 3, Slice", slice_possible, 1400 * MB),
    ("Eq. 4, Minimal", minimal_possible, 1200 * MB),
]


@pytest.mark.parametrize(("scenario", "possible", "needs"), EQUATIONS)
def test_feasibility_holds_at_equality_and_fails_one_byte_below(
    scenario: str, possible: Callable[[Workload, Environment], bool], needs: int
) -> None:
    assert possible(small(), cluster(needs)), scenario
    assert not possible(small(), cluster(needs - 1)), scenario


@pytest.mark.parametrize(
    ("scenario", "S", "feasible"),
    [
        ("everything fits: all four", 4200 * MB, {ALL, ALL_BATCH, SLICE, MINIMAL}),
        ("a byte short of Eq. 1", 4200 * MB - 1, {ALL_BATCH, SLICE, MINIMAL}),
        ("a byte short of Eq. 2", 3200 * MB - 1, {SLICE, MINIMAL}),
        ("a byte short of Eq. 3", 1400 * MB - 1, {MINIMAL}),
        ("a byte short of Eq. 4: Remote only", 1200 * MB - 1, {REMOTE}),
    ],
)
def test_feasible_sets_as_storage_shrinks(scenario: str, S: int, feasible: set[Strategy]) -> None:
    assert set(choose_bent2009(small(), cluster(S)).feasible) == feasible, scenario


# -- the models, computed by hand --------------------------------------------------------------
# cluster(): BW = 100 MB/s, BW_L = 200 MB/s. With D = 3: T_ColdB = 3 GB / 100 MB/s = 30 s,
# T_WarmB = 3 GB / 200 MB/s = 15 s, T_P = 100 MB / 100 MB/s + 2 * 100 MB / 200 MB/s = 2 s,
# T_CPU (Eq. 10) = 300 s. With D = 1: T_ColdB = 10 s, T_WarmB = 5 s, T_P = 1 s, T_CPU = 100 s.


@pytest.mark.parametrize(
    ("scenario", "model", "workload", "env", "C", "phases", "expected_s"),
    [
        (
            "All, W = D = 1: one cold phase, 10 + 1 + 1 + 100",
            predict_all,
            small(W=1, D=1),
            cluster(10 * GB),
            1,
            1,
            112.0,
        ),
        (
            "All, W = D = 3 on 2 nodes: cold 30 + 4 + 300, one warm 15 + 4 + 300",
            predict_all,
            small(),
            cluster(10 * GB, N_CPU=2),
            2,
            2,
            334.0 + 319.0,
        ),
        (
            "AllBatch at Eq. 2's equality: C = floor(200 / 200) = 1, two warm phases",
            predict_all_batch,
            small(),
            cluster(3200 * MB),
            1,
            3,
            334.0 + 2 * 319.0,
        ),
        (
            "Slice, S = 1.5 GB: C' = 2, n = 2, C = (8 + 5 * 2) / 9 = 2, N_B = 1, T_CPU 330",
            predict_slice,
            small(),
            cluster(1500 * MB),
            2,
            2,
            (30 + 4 + 330) + (15 + 4 + 330),
        ),
        (
            "Slice at Eq. 3's equality: C' = 1, n = 2, C = 13 / 9, ceil(3 / 1.44) = 3 phases",
            predict_slice,
            small(),
            cluster(1400 * MB),
            13 / 9,
            3,
            364.0 + 2 * 349.0,
        ),
        (
            "Minimal, S = 1.2 GB: C = 1, 3 cycles of one-pipeline Slices (30 + 4 + 330 each)",
            predict_minimal,
            small(),
            cluster(1200 * MB),
            1,
            3,
            3 * 364.0,
        ),
        (
            "Minimal, W = 5, D = 1: C = 2, widths 2, 2, 1; N_B 1, 1, 2: 114 + 114 + 109",
            predict_minimal,
            small(W=5, D=1, S_B=200 * MB),
            cluster(600 * MB),
            2,
            3,
            (2 + 2 + 110) * 2 + (2 + 2 + 105),
        ),
        (
            "Remote, W = D = 3 on 2 nodes: 2 phases of 3 * ((1 GB + 200 MB) / BW + 100)",
            predict_remote,
            small(),
            cluster(1 * MB, N_CPU=2),
            2,
            2,
            2 * 3 * (12 + 100.0),
        ),
    ],
)
def test_models_by_hand(
    scenario: str,
    model: Callable[[Workload, Environment], Estimate],
    workload: Workload,
    env: Environment,
    C: float,
    phases: int,
    expected_s: float,
) -> None:
    estimate = model(workload, env)
    assert estimate.concurrency == pytest.approx(C), scenario
    assert estimate.phases == phases, scenario
    assert estimate.time_s == pytest.approx(expected_s), scenario


def test_minimal_subworkloads_are_full_cycles_and_a_remainder() -> None:
    subs = minimal_subworkloads(small(W=5, D=1, S_B=200 * MB), cluster(600 * MB))
    assert [(count, sub.W) for count, sub in subs] == [(2, 2), (1, 1)]
    even = minimal_subworkloads(small(W=4, D=1, S_B=200 * MB), cluster(600 * MB))
    assert [(count, sub.W) for count, sub in even] == [(2, 2)]


def test_minimal_is_slice_when_one_cycle_holds_every_pipeline() -> None:
    # n = floor((1600 - 1000) / 200) = 3 = W: N_Cycles = 1, "the two strategies are identical".
    workload, env = small(), cluster(1600 * MB)
    minimal, slice_ = predict_minimal(workload, env), predict_slice(workload, env)
    assert minimal.phases == 1
    assert minimal.time_s == pytest.approx(slice_.time_s)


@pytest.mark.parametrize(
    ("scenario", "workload", "S", "printed", "used"),
    [
        (
            "2n > J: W = 2, D = 1, 20 privates after the batch volume: (200 - 18 * 18) / 2",
            small(W=2, D=1),
            3000 * MB,
            -62.0,
            2.0,
        ),
        ("2n <= J: the printed weighted mean, 13 / 9", small(), 1400 * MB, 13 / 9, 13 / 9),
        ("S_P = 0: nothing private limits it", small(S_P=0), 1000 * MB, 3.0, 3.0),
    ],
)
def test_eq18_printed_and_clamped(
    scenario: str, workload: Workload, S: int, printed: float, used: float
) -> None:
    env = cluster(S)
    assert slice_concurrency_printed(workload, env) == pytest.approx(printed), scenario
    assert slice_concurrency(workload, env) == pytest.approx(used), scenario


def test_eq19_counts_only_second_volumes_that_can_execute() -> None:
    # S = 10 GB: C' = floor((10000 - 1000 - 300) / 100) = 87. Printed: (10000 - 300 - 8700)
    # / 1000 = 1. With min(87, N_CPU 4, W 3) = 3: floor((10000 - 600) / 1000) = 9.
    workload, env = small(), cluster(10 * GB)
    assert slice_batch_volumes_printed(workload, env) == 1
    assert slice_batch_volumes(workload, env) == 9
    assert math.isinf(slice_batch_volumes(small(S_B=0), env))


# -- the failure model (Sec. 3) ----------------------------------------------------------------


def test_no_failures_gives_the_plain_prediction() -> None:
    workload, env = small(), cluster(1500 * MB)
    prediction = predict(SLICE, workload, env)
    assert prediction.time_s == prediction.base_s == predict_slice(workload, env).time_s
    assert (prediction.failure_rounds, prediction.rerun_pipelines) == (0, 0)


def test_all_reruns_skip_the_cold_phase_and_slice_refetches() -> None:
    # One pipeline of small(): All re-runs warm, 15 + 4 + 300 = 319; Slice cold, 30 + 4 + 330.
    one = small(W=1)
    assert rerun_time(ALL, one, cluster(10 * GB)) == pytest.approx(319.0)
    assert rerun_time(SLICE, one, cluster(1500 * MB)) == pytest.approx(364.0)


@pytest.mark.parametrize(
    ("scenario", "strategy", "workload", "env", "expected_s", "rounds", "reruns"),
    [
        (
            "All, W = 10, D = 1 on 2 nodes, F = 0.005: 112 + 4 * 107 = 540 s,"
            " floor(2.7) = 2 fail, re-run warm 107 s, floor(0.535) = 0",
            ALL,
            small(W=10, D=1),
            cluster(10 * GB, N_CPU=2, F=0.005),
            540.0 + 107.0,
            1,
            2,
        ),
        (
            "Slice, W = D = 3, F = 0.002: 713 s, floor(1.426) = 1 fails, refetch 364 s",
            SLICE,
            small(),
            cluster(1500 * MB, F=0.002),
            713.0 + 364.0,
            1,
            1,
        ),
        (
            "All, W = D = 1, R = 121 s, F = 0.0078: 133 s, 1 fails, re-run 128 s,"
            " 0.0078 * 128 = 0.998 < 1",
            ALL,
            replace(small(W=1, D=1), R_bar=121.0),
            cluster(10 * GB, F=0.0078),
            133.0 + 128.0,
            1,
            1,
        ),
    ],
)
def test_failure_model_converges(
    scenario: str,
    strategy: Strategy,
    workload: Workload,
    env: Environment,
    expected_s: float,
    rounds: int,
    reruns: int,
) -> None:
    prediction = predict(strategy, workload, env)
    assert prediction.time_s == pytest.approx(expected_s), scenario
    assert (prediction.failure_rounds, prediction.rerun_pipelines) == (rounds, reruns), scenario


@pytest.mark.parametrize(
    ("scenario", "F"),
    [
        ("F x re-run of one pipeline = 128 / 128 = 1 exactly", 1 / 128),
        ("F x re-run of one pipeline = 1.28", 0.01),
    ],
)
def test_failure_model_diverges_once_one_pipeline_expects_a_failure(
    scenario: str, F: float
) -> None:
    workload = replace(small(W=1, D=1), R_bar=121.0)  # All re-runs one pipeline in 128 s
    plan = choose_bent2009(workload, cluster(10 * GB, F=F))
    assert math.isinf(plan.predicted_s), scenario
    assert plan.outcome is Outcome.NO_FIT, scenario
    assert all(math.isinf(t) for t in plan.predicted.values()), scenario
    all_ = plan.prediction(ALL)
    assert all_ is not None, scenario
    assert "failure model diverges: F x T(re-run of one pipeline)" in all_.reason, scenario
    assert any(all_.reason in r for r in plan.reasons), scenario


def test_failure_model_diverges_at_a_round_that_repeats_itself() -> None:
    # Slice, W = 2, D = 1, S_B = S_P = 100 B, S = 400 B, R = 0, SD = 1000 s, I/O ~ 0.
    # W = 1: C'(1) = 2, N_B = floor((400 - 2 * 100) / 100) = 2: T(1) = 1000 / 2 = 500 s,
    # F x T(1) = 0.75 < 1. W = 2: C'(2) = 1, N_B = 1, n = 1, C = 1 (2n >= J), 2 phases:
    # T(2) = 2000 s, floor(F x T(2)) = 3 -> both pipelines re-run, again and again.
    workload = Workload(W=2, D=1, S_B=100, S_P=100, R_bar=0.0, SD_R=1000.0)
    env = Environment(N_CPU=4, S=400, F=0.0015, BW_R=1e12, BW_L=1e12)
    assert rerun_time(SLICE, replace(workload, W=1), env) == pytest.approx(500.0)
    prediction = predict(SLICE, workload, env)
    assert prediction.base_s == pytest.approx(2000.0)
    assert math.isinf(prediction.time_s)
    assert "every one of 2 re-run pipelines fails again" in prediction.reason


def test_failure_model_gives_up_after_its_round_cap() -> None:
    # AllBatch at Eq. 2's equality runs one pipeline at a time (107 s each, D = 1), so
    # floor(F * T) = floor(0.999 * width): about one pipeline fewer per round from 5000.
    workload, env = small(W=5000, D=1), cluster(1200 * MB, F=0.999 / 107)
    base = predict_all_batch(workload, env).time_s
    result = failure_model(ALL_BATCH, workload, env, base)
    assert math.isinf(result.time_s)
    assert result.rounds == FAILURE_ROUNDS_MAX
    assert "did not settle" in result.reason


# -- the chooser -------------------------------------------------------------------------------


def test_chooser_names_each_infeasible_strategy_and_its_equation() -> None:
    env = table2_environment()
    batch = choose_bent2009(TABLE1_WORKLOADS["batch"], env).reasons
    assert any(r.startswith("All infeasible") and r.endswith("(Eq. 1)") for r in batch)
    assert any(r.startswith("AllBatch infeasible") and r.endswith("(Eq. 2)") for r in batch)
    private = choose_bent2009(TABLE1_WORKLOADS["private"], env).reasons
    assert "Slice infeasible: S_B + S_P*W + S_P = 907.5 GB > S = 250 GB (Eq. 3)" in private


def test_chooser_falls_back_to_remote_when_no_storage_plan_fits() -> None:
    plan = choose_bent2009(small(), cluster(1200 * MB - 1, N_CPU=2))
    assert plan.strategy is REMOTE and plan.feasible == plan.considered == (REMOTE,)
    assert plan.predicted_s == pytest.approx(672.0)
    for strategy, equation in ((ALL, 1), (ALL_BATCH, 2), (SLICE, 3), (MINIMAL, 4)):
        assert any(
            r.startswith(f"{strategy.label} infeasible") and r.endswith(f"(Eq. {equation})")
            for r in plan.reasons
        )


def test_chooser_picks_the_smallest_prediction_and_says_why_the_others_lost() -> None:
    plan = choose_bent2009(TABLE1_WORKLOADS["mixed"], table2_environment())
    times = plan.predicted
    assert plan.strategy is min(times, key=lambda s: times[s])
    assert plan.predicted_s == times[plan.strategy]
    for loser in set(times) - {plan.strategy}:
        assert any(r.startswith(f"{loser.label} rejected") for r in plan.reasons)


@pytest.mark.parametrize(
    ("scenario", "consider_all", "chosen", "reason"),
    [
        (
            "All and AllBatch tie at 112 s: All first in tie order",
            True,
            ALL,
            "AllBatch rejected: predicted 112.0 s ties with All",
        ),
        (
            "consider_all=False: All winnowed as in the paper's evaluation",
            False,
            ALL_BATCH,
            "All possible (Eq. 1) but not considered",
        ),
    ],
)
def test_chooser_ties_and_consider_all(
    scenario: str, consider_all: bool, chosen: Strategy, reason: str
) -> None:
    plan = choose_bent2009(small(W=1, D=1), cluster(10 * GB), consider_all=consider_all)
    assert plan.strategy is chosen, scenario
    assert set(plan.feasible) == {ALL, ALL_BATCH, SLICE, MINIMAL}, scenario
    assert (ALL in plan.considered) is consider_all, scenario
    assert set(plan.predicted) == set(plan.considered), scenario
    assert plan.predicted_s == pytest.approx(112.0), scenario
    assert any(r.startswith(reason) for r in plan.reasons), scenario


def test_predicting_an_infeasible_strategy_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"cannot predict Slice: .*\(Eq\. 3\)"):
        predict(SLICE, TABLE1_WORKLOADS["private"], table2_environment())


def test_large_workload_is_chosen_in_closed_form() -> None:
    # Not a timing assertion: W = 100,000, D = 50 must give a finite plan whose phase
    # counts are the closed forms, with failures on (bounded iteration).
    workload = Workload(100_000, 50, 1 * GB, 100 * MB, 5000.0, 500.0)
    plan = choose_bent2009(workload, Environment(50, 250 * GB, 1e-6, 12 * MB, 125 * MB))
    assert plan.outcome is Outcome.FIT and math.isfinite(plan.predicted_s)
    assert set(plan.feasible) == {ALL_BATCH, MINIMAL}
    minimal = plan.prediction(MINIMAL)
    assert minimal is not None and minimal.phases == 100_000 // 50
    assert all(p.failure_rounds >= 1 for p in plan.predictions)


# -- bad inputs --------------------------------------------------------------------------------

GOOD_WORKLOAD = {"W": 3, "D": 3, "S_B": 1.0, "S_P": 1.0, "R_bar": 1.0, "SD_R": 0.0}
GOOD_ENV = {"N_CPU": 1, "S": 1.0, "F": 0.0, "BW_R": 1.0, "BW_L": 1.0}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("W", 0),
        ("W", 1.5),
        ("W", True),
        ("D", 0),
        ("S_B", -1.0),
        ("S_P", math.nan),
        ("R_bar", -0.5),
        ("SD_R", math.inf),
    ],
)
def test_bad_workload_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"Workload\.{field} must be"):
        Workload(**(GOOD_WORKLOAD | {field: value}))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [("D", 0), ("S_TotB", -1.0), ("S_TotP", math.inf)],
)
def test_bad_workload_totals_name_the_field(field: str, value: object) -> None:
    totals = {"W": 3, "D": 3, "S_TotB": 1.0, "S_TotP": 1.0, "R_bar": 1.0, "SD_R": 0.0}
    with pytest.raises(ConfigError, match=rf"Workload\.{field} must be"):
        Workload.from_totals(**(totals | {field: value}))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("N_CPU", 0),
        ("S", 0.0),
        ("S", -1.0),
        ("F", -0.1),
        ("F", math.nan),
        ("BW_R", 0.0),
        ("BW_L", -1.0),
        ("BW_L", math.inf),
    ],
)
def test_bad_environment_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"Environment\.{field} must be"):
        Environment(**(GOOD_ENV | {field: value}))  # type: ignore[arg-type]
