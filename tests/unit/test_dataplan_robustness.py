"""dataplan-robustness: random workloads and clusters drawn from the documented ranges,
both choosers' regret measured on seeds the simulation chooser did not choose with."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import numpy as np
import pytest

from gridcore.cli import main
from gridcore.dataplan.choosers import CHOOSING_SEEDS
from gridcore.dataplan.planning import CHOOSERS
from gridcore.errors import ConfigError
from gridcore.experiments import dataplan_robustness as dr
from gridcore.experiments.dataplan import MEASUREMENT_SEEDS
from gridcore.model import MB


@pytest.mark.parametrize("seed", range(0, 600, 2))
def test_every_case_lies_in_the_documented_ranges(seed: int) -> None:
    case = dr.random_case(seed)
    w, e = case.workload, case.env
    assert dr.N_CPU[0] <= e.N_CPU <= dr.N_CPU[1]
    # W = round(ratio * N_CPU): within half a pipeline of the ratio's range
    assert dr.WIDTH_RATIO[0] * e.N_CPU - 0.5 <= w.W <= dr.WIDTH_RATIO[1] * e.N_CPU + 0.5
    assert dr.DEPTH[0] <= w.D <= dr.DEPTH[1]
    assert w.J <= dr.MAX_JOBS
    assert e.S == dr.STORAGE_BYTES
    assert dr.BATCH_FRACTION[0] * e.S - 1 <= w.S_B <= dr.BATCH_FRACTION[1] * e.S + 1
    assert dr.PRIVATE_FRACTION[0] * e.S - 1 <= w.S_P <= dr.PRIVATE_FRACTION[1] * e.S + 1
    assert w.S_B.is_integer() and w.S_P.is_integer()  # whole bytes
    assert dr.R_BAR_S[0] <= w.R_bar <= dr.R_BAR_S[1]
    assert dr.SD_RATIO[0] * w.R_bar <= w.SD_R <= dr.SD_RATIO[1] * w.R_bar
    assert dr.BW_R_MB_S[0] * MB <= e.BW_R <= dr.BW_R_MB_S[1] * MB
    assert e.BW_L == dr.BW_L_MB_S * MB
    if e.F:
        phi = e.F * w.D * w.R_bar
        assert dr.FAILURE_PHI[0] * (1 - 1e-9) <= phi <= dr.FAILURE_PHI[1] * (1 + 1e-9)
    assert len(dr.feasible_storage(w, e)) >= dr.MIN_FEASIBLE


def test_failures_are_drawn_in_about_the_documented_share_of_cases() -> None:
    failing = sum(dr.random_case(seed).env.F > 0 for seed in range(1000))
    assert 0.20 <= failing / 1000 <= 0.30


def test_a_case_is_a_function_of_its_seed_alone() -> None:
    assert dr.random_case(11) == dr.random_case(11)
    assert dr.random_case(11) != dr.random_case(12)


def test_redrawn_counts_the_rejected_draws_of_the_case_stream() -> None:
    case = next(c for c in map(dr.random_case, range(200)) if c.redrawn_few_feasible)
    rng = random.Random(f"gridcore.sim.dataplan_robustness:{case.seed}")
    rejected = [dr._draw(rng) for _ in range(case.redrawn)]
    few = [(w, e) for w, e in rejected if w.J <= dr.MAX_JOBS]
    assert len(few) == case.redrawn_few_feasible
    assert all(len(dr.feasible_storage(w, e)) < dr.MIN_FEASIBLE for w, e in few)
    assert sum(w.J > dr.MAX_JOBS for w, _ in rejected) == case.redrawn_over_jobs
    assert dr._draw(rng) == (case.workload, case.env)


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    return dr.dataplan_robustness(cases=3, seed=7)


def test_the_json_has_the_documented_keys_and_no_infinities(result: dict[str, Any]) -> None:
    json.dumps(result, allow_nan=False)
    assert {"cases", "ranges", "redrawn", "choosers", "per_case"} <= set(result)
    assert result["cases"] == 3 == len(result["per_case"])
    assert [r["seed"] for r in result["per_case"]] == [7, 8, 9]
    assert result["redrawn"] == sum(dr.random_case(s).redrawn for s in (7, 8, 9))
    assert result["ranges"]["W_over_N_CPU"] == dr.WIDTH_RATIO
    assert set(result["choosers"]) == set(CHOOSERS)
    for figures in result["choosers"].values():
        assert set(figures["regret"]) == {"min", "p10", "median", "p90", "max"}
        assert {"worse_than_best_share", "over_5pct_share", "over_10pct_share"} <= set(figures)
    for record in result["per_case"]:
        assert set(record) == {"seed", "case", "feasible", "simulated", "best", "picks", "regret"}
        assert len(record["feasible"]) >= dr.MIN_FEASIBLE
        assert set(record["picks"]) == set(CHOOSERS)
        assert set(record["picks"].values()) <= set(record["simulated"])


def test_a_case_measured_again_gives_the_same_record(result: dict[str, Any]) -> None:
    seeds = tuple(result["measurement_seeds"])
    assert dr.case_record(dr.random_case(7), seeds) == result["per_case"][0]


def test_regret_is_measured_on_seeds_the_simulation_chooser_did_not_choose_with(
    result: dict[str, Any],
) -> None:
    assert len(result["measurement_seeds"]) == MEASUREMENT_SEEDS
    assert not set(result["measurement_seeds"]) & set(CHOOSING_SEEDS)
    assert result["choosing_seeds"] == list(CHOOSING_SEEDS)
    with pytest.raises(ConfigError, match="choosing seeds"):
        dr.dataplan_robustness(cases=1, measurement_first_seed=CHOOSING_SEEDS[0] - 1)


def test_each_regret_is_the_picks_excess_over_the_best_plan(result: dict[str, Any]) -> None:
    for record in result["per_case"]:
        times = {k: math.inf if v is None else v for k, v in record["simulated"].items()}
        best = min(times.values())
        assert times[record["best"]] == best
        for name, pick in record["picks"].items():
            expected = (times[pick] - best) / best
            got = record["regret"][name]
            assert (got is None and math.isinf(expected)) or got == pytest.approx(expected)
    for name, figures in result["choosers"].items():
        regrets = [r["regret"][name] for r in result["per_case"]]
        assert None not in regrets  # these three cases end under every pick
        dist = figures["regret"]
        assert dist["min"] == pytest.approx(min(regrets))
        assert dist["p10"] == pytest.approx(float(np.quantile(regrets, 0.1)))
        assert dist["median"] == pytest.approx(float(np.median(regrets)))
        assert dist["p90"] == pytest.approx(float(np.quantile(regrets, 0.9)))
        assert dist["max"] == pytest.approx(max(regrets))
        assert figures["worse_than_best_share"] == pytest.approx(sum(r > 0 for r in regrets) / 3)


def test_the_summary_of_five_hand_made_regrets() -> None:
    summary = dr.summarise([0.12, 0.0, 0.06, 0.0, 0.04])
    assert summary["regret"] == pytest.approx(
        {"min": 0.0, "p10": 0.0, "median": 0.04, "p90": 0.096, "max": 0.12}
    )
    assert summary["worse_than_best_share"] == pytest.approx(0.6)
    assert summary["over_5pct_share"] == pytest.approx(0.4)
    assert summary["over_10pct_share"] == pytest.approx(0.2)


def test_a_pick_that_never_ended_is_an_infinite_regret_shown_as_none() -> None:
    summary = dr.summarise([0.0, 0.01, math.inf])
    assert summary["regret"]["median"] == 0.01
    assert summary["regret"]["p90"] is None and summary["regret"]["max"] is None
    assert summary["over_10pct_share"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("median", "maximum", "holds"),
    [(0.02, 0.10, True), (0.021, 0.05, False), (0.0, 0.101, False), (0.0, None, False)],
)
def test_the_claim_is_the_issues_median_2pct_and_max_10pct(
    median: float, maximum: float | None, holds: bool
) -> None:
    result = {
        "default_chooser": "simulation",
        "choosers": {"simulation": {"regret": {"median": median, "max": maximum}}},
    }
    assert dr.default_chooser_holds(result) is holds


def test_the_command_line_runs_it_with_cases(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["experiment", "dataplan-robustness", "--json", "--cases", "1", "--seed", "8"])
    out = json.loads(capsys.readouterr().out)
    assert out["cases"] == 1 and out["per_case"][0]["seed"] == 8
    assert status == (0 if dr.default_chooser_holds(out) else 1)
    assert main(["experiment", "dataplan-robustness", "--json", "--cases", "0"]) == 2
    assert "--cases must be >= 1" in capsys.readouterr().err
