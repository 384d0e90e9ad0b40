"""Wait models (gridcore.policies.wait_prediction) and the wait-prediction experiment that
replays a real log against them (docs/wait-prediction.md)."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gridcore.cli import main
from gridcore.experiments.wait_prediction import (
    POLLED,
    PolledModel,
    hindsight_bin_bound,
    load_workload,
    metrics,
    replay,
    spearman,
)
from gridcore.policies.wait_prediction import (
    DEFAULT_WAIT_MODEL,
    ORDER_STATISTIC_CACHE,
    PLAN_DEPTH,
    WAIT_MODELS,
    BackfillModel,
    Eq1Model,
    PredictedBackfillModel,
    QbetsModel,
    QuantileHistory,
    QueuedJob,
    QueuePlan,
    QueueView,
    RunningJob,
    UserRuntimes,
    change_point_run,
    forecast_bin,
    order_statistic,
    plan_starts,
    planned_start,
    size_bin,
    tsafrir_runtime,
)

FIXTURES = Path(__file__).parent.parent / "data" / "swf"
HEADS = sorted(FIXTURES.glob("*-head.swf.gz"))


# -- conservative backfill planning --------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "running", "jobs", "starts"),
    [
        pytest.param(0.0, [(100.0, 4)], [(6, 50.0)], [0.0], id="a job that fits now waits 0"),
        pytest.param(
            0.0,
            [(100.0, 8)],
            [(10, 50.0), (2, 200.0)],
            [100.0, 150.0],
            id="FCFS reservation: 2 free now, but 200 s would delay the 10-job at 100",
        ),
        pytest.param(
            0.0,
            [(100.0, 8)],
            [(10, 50.0), (2, 100.0)],
            [100.0, 0.0],
            id="backfill into the hole before the reservation",
        ),
        pytest.param(
            0.0,
            [(100.0, 8)],
            [(10, 50.0), (2, 101.0)],
            [100.0, 150.0],
            id="one second too long for the hole",
        ),
        pytest.param(
            100.0,
            [(50.0, 8)],
            [(10, 10.0)],
            [100.0],
            id="a running job past its requested time ends now",
        ),
        pytest.param(
            0.0,
            [(200.0, 4), (300.0, 4)],
            [(6, 100.0), (4, 100.0), (2, 50.0)],
            [200.0, 300.0, 0.0],
            id="FCFS order kept, a small job backfills",
        ),
        pytest.param(
            0.0,
            [(200.0, 4), (300.0, 4)],
            [(6, 100.0), (4, 50.0)],
            [200.0, 300.0],
            id="the second waits behind the first's reservation",
        ),
        pytest.param(
            0.0, [(100.0, 10)], [(3, 0.0)], [100.0], id="zero duration: first free instant"
        ),
        pytest.param(
            100.0, [], [(10, 5.0), (10, 5.0)], [100.0, 105.0], id="an idle machine, in turn"
        ),
    ],
)
def test_conservative_backfill_plan(
    now: float,
    running: list[tuple[float, int]],
    jobs: list[tuple[int, float]],
    starts: list[float],
) -> None:
    assert plan_starts(now, 10, running, jobs) == starts


def test_plan_matches_a_brute_force_planner_on_random_queues() -> None:
    rng = random.Random(7)
    for _ in range(200):
        total = rng.randint(4, 32)
        running = [(rng.uniform(-50, 500), rng.randint(1, total // 2)) for _ in range(3)]
        jobs = [(rng.randint(1, total), float(rng.choice([0, 10, 60, 200]))) for _ in range(6)]
        assert plan_starts(0.0, total, running, jobs) == pytest.approx(
            _brute_force(0.0, total, running, jobs)
        )


def test_plan_with_repeated_sizes_matches_the_brute_force_planner() -> None:
    """The placement starts a size's scan where that size last found room: a shorter job
    of the same size must still find an earlier hole a longer one could not use."""
    rng = random.Random(11)
    for _ in range(150):
        total = rng.randint(4, 16)
        sizes = [rng.randint(1, total) for _ in range(2)]
        running = [(rng.uniform(-50, 400), rng.randint(1, total // 2)) for _ in range(4)]
        jobs = [(rng.choice(sizes), float(rng.choice([0, 5, 10, 60, 200, 900]))) for _ in range(25)]
        assert plan_starts(0.0, total, running, jobs) == pytest.approx(
            _brute_force(0.0, total, running, jobs)
        )


def test_a_short_job_of_a_size_fills_a_hole_the_last_of_that_size_skipped() -> None:
    # 4 processors: 2 busy until 100, all 4 from 100; a 4-wide job takes 100-200 and
    # leaves 2 free in 0-100: a 2-wide 1000 s job cannot use it (starts 200), a 2-wide
    # 50 s job can (starts 0)
    assert plan_starts(0.0, 4, [(100.0, 2)], [(4, 100.0), (2, 1000.0), (2, 50.0)]) == [
        100.0,
        200.0,
        0.0,
    ]


def test_a_queue_deeper_than_the_plan_depth_counts_the_rest_as_work() -> None:
    # 10 processors, 1-processor 100 s jobs: the first PLAN_DEPTH are planned (10 a
    # round), the 30 beyond them add 30 * 100 / 10 = 300 s to the job's start
    ahead = [(1, 100.0)] * (PLAN_DEPTH + 30)
    start, note = planned_start(0.0, 10, [], ahead, (1, 100.0))
    assert start == PLAN_DEPTH // 10 * 100.0 + 300.0
    assert "30 queued beyond the first 500" in note
    exact, _ = planned_start(0.0, 10, [], ahead[:PLAN_DEPTH], (1, 100.0))
    assert exact == plan_starts(0.0, 10, [], [*ahead[:PLAN_DEPTH], (1, 100.0)])[-1]
    assert planned_start(0.0, 10, [], ahead[:PLAN_DEPTH], (1, 100.0))[1] == ""


def test_a_kept_plan_gives_every_forecast_a_fresh_plan_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """QueuePlan reuses the last plan between submissions with nothing started or ended
    in between; every answer must equal a fresh plan's, exactly, also when the clock
    moves past running ends, planned starts or zero-length jobs, and when the queue,
    the running jobs or the durations change (which plan afresh)."""
    fresh_plans = 0  # of the kept plans
    reset = QueuePlan.reset

    def counted(planner: QueuePlan, *args: Any) -> None:
        nonlocal fresh_plans
        fresh_plans += planner is plan
        reset(planner, *args)

    monkeypatch.setattr(QueuePlan, "reset", counted)
    rng = random.Random(2024)
    asked = 0
    for _ in range(150):
        total = rng.randint(4, 24)
        now = 0.0
        running = [(rng.uniform(0, 400), rng.randint(1, total // 3 + 1)) for _ in range(4)]
        queue: list[tuple[int, float]] = []
        plan = QueuePlan()
        for _ in range(40):
            job = (rng.randint(1, total), float(rng.choice([0, 5, 30, 60, 200, 900])))
            kept = planned_start(now, total, running, queue, job, plan)
            assert kept == planned_start(now, total, running, queue, job)
            asked += 1
            queue.append(job)
            change = rng.random()
            if change < 0.1 and queue:  # a queued job starts
                processors, duration = queue.pop(rng.randrange(len(queue)))
                running.append((now + duration, processors))
            elif change < 0.15 and running:  # a running job ends
                running.pop(rng.randrange(len(running)))
            elif change < 0.2 and queue:  # a prediction changes
                index = rng.randrange(len(queue))
                queue[index] = (queue[index][0], queue[index][1] + 1.0)
            now += rng.choice([0.0, 0.0, 1.0, 7.0, 50.0])
    assert fresh_plans < asked * 0.6, (fresh_plans, asked)  # the kept plan was used


def _brute_force(
    now: float, total: int, running: list[tuple[float, int]], jobs: list[tuple[int, float]]
) -> list[float]:
    """Conservative backfill by checking every candidate start against every interval."""
    busy = [(now, max(now, end), p) for end, p in running]
    starts = []
    for p, d in jobs:
        candidates = sorted({now, *(e for _, e, _ in busy if e >= now)})
        for s in candidates:
            points = sorted({s, *(b for b, _, _ in busy if s < b < s + d)})
            if all(
                total - sum(q for b, e, q in busy if b <= t < e) >= p
                for t in points
                if d > 0 or t == s
            ):
                break
        starts.append(s)
        if d > 0:
            busy.append((s, s + d, p))
    return starts


# -- QBETS: binomial order statistic, change points ----------------------------------------


def _order_statistic_by_sum(n: int, q: float, c: float) -> int | None:
    below = 0.0
    for i in range(n):
        below += math.comb(n, i) * q**i * (1 - q) ** (n - i)
        if below >= c:
            return i + 1
    return None


@pytest.mark.parametrize(
    ("n", "k"),
    [(1, None), (58, None), (59, 59), (100, 99), (200, 196), (1000, 962)],
)
def test_binomial_order_statistic_known_values(n: int, k: int | None) -> None:
    # k by exact rational arithmetic (fractions.Fraction) of sum_{i<k} C(n,i) .95^i .05^(n-i)
    assert order_statistic(n) == k


def test_binomial_order_statistic_equals_the_direct_sum() -> None:
    for n in range(1, 300):
        assert order_statistic(n) == _order_statistic_by_sum(n, 0.95, 0.95), n
    assert order_statistic(40, 0.5, 0.9) == _order_statistic_by_sum(40, 0.5, 0.9)


def test_a_long_history_does_not_underflow() -> None:
    k = order_statistic(50_000)
    assert k is not None and 0.95 * 50_000 < k < 0.955 * 50_000


def test_the_order_statistic_cache_is_bounded() -> None:
    for i in range(ORDER_STATISTIC_CACHE + 100):  # more distinct questions than it keeps
        assert order_statistic(20, 0.5 + i * 1e-7, 0.9) == 14
    assert order_statistic.cache_info().currsize <= ORDER_STATISTIC_CACHE


def test_change_point_run_is_the_least_run_below_one_percent() -> None:
    assert change_point_run(0.95, 0.01) == 2  # 0.05 ** 2 = 0.0025 < 0.01 <= 0.05
    assert change_point_run(0.8, 0.01) == 3  # 0.2 ** 3 = 0.008


def test_two_misses_in_a_row_trim_the_history_to_them() -> None:
    history = QuantileHistory()
    for v in range(99, -1, -1):  # never above the largest so far: no miss
        history.add(float(v))
    assert history.bound() == 98.0 and history.exact()  # k(100) = 99: the 99th smallest
    history.add(500.0)
    history.add(3.0)  # a hit ends the run
    assert len(history) == 102 and history.trims == 0
    history.add(1000.0)
    history.add(2000.0)
    assert len(history) == 2 and history.trims == 1
    assert history.bound() == 2000.0 and not history.exact()
    assert history.median() == 1500.0


def test_the_window_keeps_the_last_values() -> None:
    history = QuantileHistory(window=3)
    for v in (1.0, 2.0, 3.0, 4.0):
        history.add(v)
    assert len(history) == 3 and history.bound() == 4.0 and history.median() == 3.0


def test_qbets_bins_by_size_and_says_when_it_has_no_history() -> None:
    model = QbetsModel()
    view = QueueView(0.0, 128)
    first = model.forecast(QueuedJob(1, 8, 0.0, 60.0), view)
    assert first.wait_s == 0.0 and first.bound_s is None and "no wait observed" in first.reason
    for i in range(69, -1, -1):  # no miss: each wait below the largest so far
        model.observe_start(QueuedJob(i, 8, 0.0, 60.0), 0.0, float(i))
    forecast = model.forecast(QueuedJob(99, 16, 0.0, 60.0), view)
    assert forecast.wait_s == 34.5 and forecast.bound_s == 69.0  # k(70) = 70: the largest
    assert "binomial bound" in forecast.reason
    assert model.forecast(QueuedJob(98, 2, 0.0, 60.0), view).bound_s is None
    assert [size_bin(p) for p in (1, 4, 5, 16, 17, 64, 65, 512)] == [0, 0, 1, 1, 2, 2, 3, 3]


# -- Tsafrir's run-time prediction ---------------------------------------------------------


@pytest.mark.parametrize(
    ("recent", "requested", "predicted"),
    [
        pytest.param([], 100.0, 100.0, id="no history: the requested time"),
        pytest.param([50.0], 100.0, 100.0, id="one finished job: the requested time"),
        pytest.param([10.0, 30.0, 50.0], 100.0, 40.0, id="mean of the last two"),
        pytest.param([300.0, 500.0], 100.0, 100.0, id="at most the requested time"),
    ],
)
def test_tsafrir_prediction(recent: list[float], requested: float, predicted: float) -> None:
    assert tsafrir_runtime(recent, requested) == predicted


def test_a_running_job_outliving_its_prediction_ends_at_its_requested_end() -> None:
    runtimes = UserRuntimes()
    for r in (100.0, 200.0):
        runtimes.add("ann", r)
    runtimes.add(None, 5.0)  # an unknown user teaches nothing
    job = RunningJob(1, 4, 0.0, 1000.0, "ann")
    assert runtimes.predicted_end(job, 100.0) == 150.0
    assert runtimes.predicted_end(job, 200.0) == 1000.0
    assert runtimes.predicted_end(job, 1200.0) == 1200.0
    assert runtimes.predict("bob", 300.0) == 300.0
    assert runtimes.predict(None, 300.0) == 300.0


# -- the conformal bound -------------------------------------------------------------------


def test_conformal_bound_covers_a_stationary_sequence() -> None:
    """Over 20 fixed seeds, waits drawn i.i.d. (lognormal, heavy-tailed) behind a forecast
    of 0 (an idle machine): the default's bound covers at least 0.95 of the next waits."""
    shares = []
    for seed in range(20):
        rng = random.Random(seed)
        model = PredictedBackfillModel()
        covered = asked = 0
        for i in range(1500):
            job = QueuedJob(i, 1, float(i), 60.0)
            forecast = model.forecast(job, QueueView(float(i), 8))
            wait = rng.lognormvariate(5.0, 1.5)
            if forecast.bound_s is not None:
                asked += 1
                covered += wait <= forecast.bound_s
            model.observe_start(job, float(i), float(i) + wait)
        shares.append(covered / asked)
    assert min(shares) > 0.93
    assert sum(shares) / len(shares) >= 0.95


def test_the_bound_is_never_below_the_forecast_and_bins_by_forecast() -> None:
    model = PredictedBackfillModel()
    view = QueueView(0.0, 4, (RunningJob(0, 4, 0.0, 1000.0),))
    for i in range(100):  # every job started well before its forecast
        job = QueuedJob(i, 4, 0.0, 10.0)
        assert model.forecast(job, view).wait_s == 1000.0
        model.observe_start(job, 0.0, 1.0)
    forecast = model.forecast(QueuedJob(200, 4, 0.0, 10.0), view)
    assert forecast.bound_s == forecast.wait_s == 1000.0
    assert [forecast_bin(w) for w in (0.0, 1.0, 600.0, 601.0, 3600.0, 14400.0, 14401.0)] == [
        0, 1, 1, 2, 2, 3, 4,
    ]  # fmt: skip


def test_a_queue_shown_is_forecast_once_and_its_starts_give_residuals() -> None:
    """Live, jobs are seen queued at observations, not asked about: ``observe_queue``
    forecasts each queued job not forecast yet by one plan (its start behind the jobs
    ahead only), and its start then gives the residual measured from the observation."""
    model = PredictedBackfillModel()
    running = (RunningJob("r", 4, 0.0, 100.0),)
    queued = (QueuedJob("q1", 4, 0.0, 50.0), QueuedJob("q2", 2, 5.0, 30.0))
    model.observe_queue(QueueView(10.0, 4, running, queued))
    # q1 at +90 s (the running job's limit), q2 behind it at +140 s: two residuals later
    model.observe_start(queued[0], 0.0, 130.0)  # 120 s after the observation, 30 s late
    model.observe_start(queued[1], 5.0, 150.0)  # 140 s after it: on time
    asked = model.forecast(QueuedJob("x", 4, 200.0, 10.0), QueueView(200.0, 4, running))
    assert asked.wait_s == 0.0 and asked.bound_s is None  # its bin (0 s) has none
    bound = model.forecast(QueuedJob("y", 4, 20.0, 10.0), QueueView(20.0, 4, running))
    assert bound.wait_s == 80.0  # bin (0, 600]: both residuals, too few: the largest
    assert bound.bound_s == 80.0 + 30.0 and "2 residuals in its bin" in bound.reason
    # a job forecast once (at its submission or an earlier observation) keeps that forecast
    again = PredictedBackfillModel()
    again.forecast(queued[0], QueueView(0.0, 4, running))  # +100 s
    again.observe_queue(QueueView(50.0, 4, (), queued[:1]))  # asked again: +0 s, its bin 0
    again.observe_start(queued[0], 0.0, 130.0)  # 30 s later than the +100 s forecast
    assert again.forecast(QueuedJob("z", 4, 60.0, 1.0), QueueView(60.0, 4, running)).bound_s == 70.0


def test_a_rebuilt_model_recalls_its_stored_forecasts_and_learns_their_residuals() -> None:
    """Live, a model is rebuilt from the site's history, where the forecasts it made of
    jobs seen queued are stored; recalled before the history, each start there gives
    its residual, and a recalled job is not forecast again."""
    first = PredictedBackfillModel()
    view = QueueView(0.0, 4, (RunningJob("r", 4, 0.0, 100.0),), (QueuedJob("a", 4, 0.0, 10.0),))
    assert first.observe_queue(view) == {"a": (100.0, 0.0)}
    assert first.observe_queue(view) == {}  # forecast once
    later = QueueView(5.0, 4, view.running, (*view.queued, QueuedJob("n", 2, 5.0, 10.0)))
    assert first.observe_queue(later) == {"n": (105.0, 5.0)}  # only the new one, behind a
    rebuilt = PredictedBackfillModel()
    rebuilt.recall("a", 100.0, 0.0)
    rebuilt.recall("b", 500.0, 0.0)  # not started yet: no residual
    assert rebuilt.observe_queue(view) == {}
    rebuilt.observe_start(QueuedJob("a", 4, 0.0, 10.0), 0.0, 160.0)  # 60 s late
    rebuilt.observe_start(QueuedJob("c", 4, 0.0, 10.0), 0.0, 170.0)  # never forecast
    probe_view = QueueView(0.0, 4, (RunningJob("r", 4, 0.0, 50.0),))
    answer = rebuilt.forecast(QueuedJob("p", 4, 0.0, 10.0), probe_view)
    assert answer.bound_s == 50.0 + 60.0 and "1 residuals in its bin" in answer.reason
    for model in (Eq1Model(), BackfillModel()):
        model.recall("a", 100.0, 0.0)
        assert model.observe_queue(view) == {}  # they learn from the history only


# -- the replay ----------------------------------------------------------------------------


def test_no_model_sees_the_future() -> None:
    """Changing a later job's logged data changes no forecast made before its submission;
    changing its wait and run time does not change the forecast for it either."""
    workload = load_workload(str(HEADS[0]))
    k = 150
    later = workload.jobs[k]
    outcome = dataclasses.replace(later, start_s=later.submit_s, end_s=later.submit_s + 1.0)
    shape = dataclasses.replace(outcome, processors=1, requested_s=1.0, user=-7)
    forecasts = [
        replay(
            dataclasses.replace(workload, jobs=(*workload.jobs[:k], job, *workload.jobs[k + 1 :])),
            {n: f() for n, f in WAIT_MODELS.items()},
        )[0]
        for job in (later, outcome, shape)
    ]
    original, changed_outcome, changed_shape = forecasts
    for name in WAIT_MODELS:
        assert original[name][: k + 1] == changed_outcome[name][: k + 1], name
        assert original[name][:k] == changed_shape[name][:k], name
    assert any(original[n][k + 1 :] != changed_outcome[n][k + 1 :] for n in WAIT_MODELS)


def test_the_polled_default_forecasts_as_the_default_and_learns_only_at_polls() -> None:
    """``--poll``: the default model as the live engine runs it. Its point forecasts are
    the default's; its residuals come only from the jobs a poll saw queued."""
    workload = load_workload(str(HEADS[0]))
    forecasts, _ = replay(
        workload, {DEFAULT_WAIT_MODEL: PredictedBackfillModel(), POLLED: PolledModel(600.0)}
    )
    polled, default = forecasts[POLLED], forecasts[DEFAULT_WAIT_MODEL]
    assert [f.wait_s for f in polled] == [f.wait_s for f in default]
    assert {f.predictor for f in polled} == {POLLED}
    assert [f.bound_s for f in polled] != [f.bound_s for f in default]
    # a queued job no poll saw (the next poll is 600 s away) gives no residual
    model = PolledModel(600.0)
    running = (RunningJob("r", 4, 0.0, 100.0),)
    first, second = QueuedJob("a", 4, 0.0, 50.0), QueuedJob("b", 4, 10.0, 50.0)
    model.forecast(first, QueueView(0.0, 4, running))  # polls: an empty queue
    model.forecast(second, QueueView(10.0, 4, running, (first,)))  # no poll: a unseen
    model.observe_start(first, 0.0, 100.0)
    probe = model.forecast(QueuedJob("c", 4, 20.0, 1.0), QueueView(20.0, 4, running))
    assert probe.bound_s is None
    model.forecast(QueuedJob("d", 4, 600.0, 1.0), QueueView(600.0, 4, running, (second,)))
    model.observe_start(second, 10.0, 700.0)  # b seen at the poll at 600: +0 s, 100 s late
    late = model.forecast(QueuedJob("e", 4, 700.0, 1.0), QueueView(700.0, 4, ()))
    assert late.wait_s == 0.0 and late.bound_s == 100.0


def test_spearman_with_ties_and_constants() -> None:
    assert spearman(np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0, 40.0])) == pytest.approx(1)
    assert spearman(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0])) == pytest.approx(-1)
    assert spearman(np.array([1.0, 1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0, 4.0])) == (
        pytest.approx(0.9486833)
    )
    assert spearman(np.zeros(3), np.array([1.0, 2.0, 3.0])) is None


def test_metrics_by_hand() -> None:
    forecast = np.array([0.0, 100.0, 1000.0, 5000.0])
    actual = np.array([30.0, 700.0, 1000.0, 1000.0])
    bound = np.array([60.0, 600.0, math.inf, 10000.0])
    figures = metrics(forecast, actual, bound)
    assert figures["jobs"] == 4
    assert figures["within_60s"] == 0.5 and figures["within_600s"] == 0.75
    assert figures["median_abs_error_s"] == 315.0  # of 0, 30, 600, 4000
    assert figures["coverage"] == 0.5  # 700 > 600; no bound counts as not covered
    assert figures["bound_over_actual_median"] == 5.5  # of 600/700, 1, 10, inf
    assert figures["bounded"] == 0.75
    assert "coverage" not in metrics(forecast, actual, None)
    # each forecast alone in its bin: the bound in hindsight is the larger of its wait and
    # its forecast (30, 700, 1000, 5000 s): ratios 0.5, 1, 1, 5
    assert figures["hindsight_bin_bound"] == {"coverage": 1.0, "bound_over_actual_median": 1.0}
    # a job that started before its forecast: the bound is never below the forecast
    assert hindsight_bin_bound(np.array([5000.0]), np.array([4000.0])) == {
        "coverage": 1.0,
        "bound_over_actual_median": 1.25,
    }


def test_the_hindsight_bound_is_the_forecast_plus_each_bins_quantile_of_residuals() -> None:
    # bin 0 (forecast 0 s): 20 waits 0, 60, ..., 1140 s; the 0.95 quantile is the 19th
    # (1080 s: 19 of 20 at or below it), so 1140 s is not covered. Bin (600, 3600]:
    # residuals 1800 and -100 s, margin 1800 (both covered). Bin (3600, 14400]: one job
    # that started early, margin -1000 s, floored at 0: the bound is its forecast.
    forecast = np.array([0.0] * 20 + [1200.0, 1200.0, 5000.0])
    actual = np.array([60.0 * k for k in range(20)] + [3000.0, 1100.0, 4000.0])
    figures = hindsight_bin_bound(forecast, actual)
    assert figures["coverage"] == 22 / 23
    ratios = [1080.0 / max(60.0 * k, 60.0) for k in range(20)]
    ratios += [3000.0 / 3000.0, 3000.0 / 1100.0, 5000.0 / 4000.0]
    assert figures["bound_over_actual_median"] == sorted(ratios)[11]


@pytest.mark.parametrize("log", HEADS, ids=[p.name for p in HEADS])
def test_experiment_end_to_end_on_the_shipped_log_heads(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["experiment", "wait-prediction", "--trace", str(log), "--json", "--plot", ""]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["default"] == DEFAULT_WAIT_MODEL
    assert set(result["predictors"]) == set(WAIT_MODELS)
    lines = sum(1 for _ in load_workload(str(log)).jobs)
    assert result["jobs"] == lines
    assert result["jobs"] + sum(result["skipped"].values()) == 300
    for name, figures in result["predictors"].items():
        assert figures["all"]["jobs"] == result["jobs"]
        assert figures["waited"]["jobs"] == result["trace"]["waited"]
        for share in ("within_60s", "within_600s"):
            assert 0 <= figures["waited"][share] <= 1 and 0 <= figures["all"][share] <= 1
        assert figures["s_per_1000"] > 0
        assert ("coverage" in figures["all"]) == (name in ("qbets", "predicted_backfill"))
    assert result["predictors"]["eq1"]["s_per_1000_over_eq1"] == 1.0


def test_the_text_table_names_every_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "wait-prediction", "--trace", str(HEADS[0]), "--plot", ""]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["predictor", "waited", "w<=60s"]
    assert [line.split()[0] for line in table[1:]] == list(WAIT_MODELS)
    assert f"{DEFAULT_WAIT_MODEL} *" in "\n".join(table)


SWF_LINE = "{n} {submit} {wait} {run} {procs} -1 -1 {procs} {req} -1 1 {user} 1 -1 1 {part} -1 -1"


def _write_log(path: Path, rows: list[dict[str, object]], max_procs: int | None = None) -> str:
    header = ["; Version: 2.2", "; Computer: test"]
    if max_procs is not None:
        header.append(f"; MaxProcs: {max_procs}")
    path.write_text("\n".join([*header, *(SWF_LINE.format(**r) for r in rows)]) + "\n")
    return str(path)


def test_cluster_keeps_one_partition_and_skipped_jobs_are_counted(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {"n": 1, "submit": 0, "wait": 0, "run": 100, "procs": 4, "req": 200, "user": 1, "part": 1},
        {"n": 2, "submit": 5, "wait": 95, "run": 10, "procs": 8, "req": 60, "user": 1, "part": 1},
        {"n": 3, "submit": 6, "wait": -1, "run": 10, "procs": 2, "req": 60, "user": 2, "part": 1},
        {"n": 4, "submit": 7, "wait": 0, "run": -1, "procs": 2, "req": 60, "user": 2, "part": 1},
        {"n": 5, "submit": 8, "wait": 0, "run": 3, "procs": -1, "req": 60, "user": 2, "part": 1},
        {"n": 6, "submit": 9, "wait": 0, "run": 3, "procs": 64, "req": 60, "user": 2, "part": 2},
        {"n": 7, "submit": 9, "wait": 0, "run": 3, "procs": 2, "req": -1, "user": 2, "part": 1},
    ]
    log = _write_log(tmp_path / "two.swf", rows, max_procs=16)
    whole = load_workload(log)
    assert whole.processors == 16 and whole.processors_from == "MaxProcs"
    assert dict(whole.skipped) == {
        "part_line": 0, "unknown_wait": 1, "unknown_run_time": 1, "unknown_size": 1,
        "larger_than_machine": 1,
    }  # fmt: skip
    one = load_workload(log, cluster=1)
    assert one.processors == 8 and one.processors_from == "largest job of partition 1"
    assert [j.number for j in one.jobs] == [1, 2, 7]
    assert one.requested_time_filled == 1 and one.jobs[-1].requested_s == 200.0
    forecasts, _ = replay(one, {"backfill": WAIT_MODELS["backfill"]()})
    # job 2 (8 processors) waits for job 1's requested end at 200: 195 s from its submit;
    # job 7 (2 of 4 free, 200 s filled in) would overlap job 2's reservation: after it
    assert [f.wait_s for f in forecasts["backfill"]] == [0.0, 195.0, 251.0]


def test_without_a_trace_or_with_a_bad_log_the_cli_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["experiment", "wait-prediction", "--json"]) == 2
    assert "--trace" in capsys.readouterr().err
    bad = tmp_path / "bad.swf"
    bad.write_text("; Version: 2.2\n1 0 0 10 4 -1\n")
    assert main(["experiment", "wait-prediction", "--trace", str(bad), "--json"]) == 2
    err = capsys.readouterr().err
    assert "bad.swf:2" in err
    assert main(["experiment", "stateful-selection", "--trace", str(bad), "--json"]) == 2
    head = str(HEADS[0])
    for poll in ("0", "-5", "nan", "inf"):
        assert main(["experiment", "wait-prediction", "--trace", head, "--poll", poll]) == 2
        assert "--poll must be finite and > 0 seconds" in capsys.readouterr().err
