"""stateful-selection `--all-orderings` and `--case SEED`, selection-robustness `--cases`,
through the command line."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from typing import Any

import pytest

from gridcore.cli import main
from gridcore.experiments import selection_robustness as rb
from gridcore.experiments.selection import PROTOCOLS, TABLE1_SITES, all_orderings, canonical_trace
from gridcore.policies.selection import DEFAULT_PROTOCOL
from gridcore.sim.selection import simulate_selection


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["experiment", *args, "--json", "--plot", ""]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_a_robustness_case_replays_with_the_same_completions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = run_json(capsys, "stateful-selection", "--case", "17", "--runs", "1")
    case = rb.random_case(17)
    assert result["trace"]["sites"] == case.describe()["sites"]
    assert result["trace"]["monitor_delay_s"] == case.monitor_interval_s
    expected = rb.completion_by_protocol(case)
    for name in ("naive", "stateful_best", DEFAULT_PROTOCOL.value):
        assert result["protocols"][name]["completion_s"] == pytest.approx(expected[name])


def test_every_ordering_of_the_speeds_is_run_and_summarised() -> None:
    orderings = all_orderings([0, 1], runs=1)
    rows = orderings["per_ordering"]
    assert len(rows) == 24
    assert len({tuple(row["fastest_first"]) for row in rows}) == 24
    default = orderings["default"]
    ratios = [row[DEFAULT_PROTOCOL.value] for row in rows]
    assert default["median"] == pytest.approx(statistics.median(ratios))
    assert default["worst"] == pytest.approx(max(ratios))
    worst = next(row for row in rows if row[DEFAULT_PROTOCOL.value] == default["worst"])
    assert default["worst_ordering"] == worst["fastest_first"]


def test_the_table1_ordering_is_the_canonical_trace_s_ratio() -> None:
    rows = all_orderings([0, 1], runs=1)["per_ordering"]
    table1 = next(row for row in rows if row["fastest_first"] == list(TABLE1_SITES))
    completion = {}
    for name in ("naive", DEFAULT_PROTOCOL.value):
        _, config = PROTOCOLS[name]
        runs = []
        for seed in (0, 1):
            trace = canonical_trace(seed)
            jobs = tuple(replace(job, stream=0) for job in trace.jobs)
            runs.append(
                simulate_selection(
                    trace.sites, jobs, {0: config}, seed=seed * 1_000_000
                ).completion_s
            )
        completion[name] = statistics.fmean(runs)
    expected = completion[DEFAULT_PROTOCOL.value] / completion["naive"]
    assert table1[DEFAULT_PROTOCOL.value] == pytest.approx(expected)


def test_all_orderings_through_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_json(
        capsys, "stateful-selection", "--seeds", "2", "--runs", "1", "--all-orderings"
    )
    assert set(result["orderings"]["default"]) >= {"median", "worst", "worst_ordering"}
    assert result["orderings"]["seeds"] == [0, 1]
    assert "over_seeds" in result


def test_robustness_takes_cases(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_json(capsys, "selection-robustness", "--cases", "3", "--seed", "40")
    assert result["cases"] == 3 and result["first_seed"] == 40
    assert result["default"] == DEFAULT_PROTOCOL.value


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["selection-robustness", "--cases", "0"], "--cases"),
        (["koala-placement", "--case", "3"], "--case"),
        (["koala-claiming", "--all-orderings"], "--all-orderings"),
        (["stateful-selection", "--cases", "3"], "--cases"),
        (["stateful-selection", "--case", "3", "--all-orderings"], "--all-orderings"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else value,
)
def test_an_option_that_does_not_apply_is_one_line_naming_it_and_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], option: str
) -> None:
    assert main(["experiment", *args, "--plot", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert option in err[0]
