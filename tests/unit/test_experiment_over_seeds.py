"""The paper experiments over seeds (`--seeds N`) and the inputs a reader may question
(`--comm-factor`, `--growth-table`, `--monitor-interval`), through the command line."""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gridcore.cli import main
from gridcore.errors import ConfigError
from gridcore.experiments import registry
from gridcore.experiments.coallocation_placement import koala_placement_experiment
from gridcore.experiments.registry import BENCHMARKS, EXPERIMENTS, RunOptions, text_table
from gridcore.experiments.seeds import MeanInterval, estimate
from gridcore.sim.coallocation import FIG5_EXECUTION_S
from gridcore.stats import student_t_975


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["experiment", *args, "--json", "--plot", ""]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


@pytest.fixture(scope="module")
def placement_over_three() -> dict[str, Any]:
    return cli_json("koala-placement", "--seeds", "3")


def estimates(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every per-figure estimate under ``node`` of ``over_seeds.figures``."""
    if "values" in node:
        return [node]
    return [leaf for child in node.values() for leaf in estimates(child)]


def seed_view(figures: Any, index: int) -> Any:
    """The figures of the ``index``-th seed, rebuilt from the per-seed values."""
    if "values" in figures:
        return figures["values"][index]
    return {key: seed_view(child, index) for key, child in figures.items()}


def cli_json(*args: str) -> dict[str, Any]:
    """The JSON of one run, for module-scoped fixtures (which cannot take capsys)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["experiment", *args, "--json", "--plot", ""]) == 0
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def test_three_seeds_report_means_intervals_and_the_ordering_of_three_single_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    over = run_json(capsys, "stateful-selection", "--runs", "1", "--seeds", "3", "--seed", "4")
    singles = [
        run_json(capsys, "stateful-selection", "--runs", "1", "--seed", str(seed))
        for seed in (4, 5, 6)
    ]
    aggregate = over.pop("over_seeds")
    assert over == singles[0]  # the other keys are the first seed's run, unchanged
    assert aggregate["seeds"] == [4, 5, 6]
    for name, metrics in aggregate["figures"]["protocols"].items():
        for metric, figure in metrics.items():
            values = [single["protocols"][name][metric] for single in singles]
            assert figure["values"] == values
            assert min(values) <= figure["mean"] <= max(values)
            assert (figure["min"], figure["max"]) == (min(values), max(values))
            low, high = figure["ci95"]
            assert math.isfinite(low) and math.isfinite(high) and low <= figure["mean"] <= high
    kept = [
        s["seed"]
        for s in singles
        if s["protocols"]["stateful_best"]["completion_s"] < s["protocols"]["naive"]["completion_s"]
        and s["protocols"]["stateful_random"]["completion_s"]
        < s["protocols"]["naive"]["completion_s"]
    ]
    ordering = aggregate["paper_ordering"]
    assert 0 <= ordering["kept"] <= 3 and ordering["seeds"] == 3
    assert (ordering["kept"], ordering["kept_seeds"]) == (len(kept), kept)
    assert set(ordering["claims"]) == {
        "protocols: stateful_best < naive in completion_s",
        "protocols: stateful_random < naive in completion_s",
    }


def test_the_table_over_seeds_shows_mean_plus_minus_half_width(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["experiment", "stateful-selection", "--runs", "1", "--seeds", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("over 3 seeds 0-2: mean ± half-width of the 95 % Student t")
    assert lines[1].split() == ["protocol", "completion_s", "total_queue_s", "mean_queue_s"]
    assert lines[2].split()[:4] == ["naive", lines[2].split()[1], "±", lines[2].split()[3]]
    assert lines[-3].startswith("paper's ordering kept on ")
    assert len({len(line) for line in lines[1:-3]}) == 1  # the columns stay aligned


@pytest.mark.parametrize("name", ["koala-placement", "koala-claiming"])
def test_the_koala_experiments_count_the_claims_on_each_seed_s_figures(
    name: str, placement_over_three: dict[str, Any]
) -> None:
    result = placement_over_three if name == "koala-placement" else cli_json(name, "--seeds", "2")
    aggregate = result["over_seeds"]
    seeds = len(aggregate["seeds"])
    for figure in estimates(aggregate["figures"]):
        assert len(figure["values"]) == seeds
        assert figure["min"] <= figure["mean"] <= figure["max"]
        assert all(math.isfinite(bound) for bound in figure["ci95"])
    entry = registry.load(EXPERIMENTS, name)
    assert entry.over_seeds is not None
    per_seed = [seed_view(aggregate["figures"], i) for i in range(seeds)]
    for claim in entry.over_seeds.claims:
        kept = [
            s
            for s, figures in zip(aggregate["seeds"], per_seed, strict=True)
            if claim.holds(figures)
        ]
        assert aggregate["paper_ordering"]["claims"][claim.text]["kept_seeds"] == kept
    assert 0 <= aggregate["paper_ordering"]["kept"] <= seeds


def test_the_placement_ordering_is_the_paper_s_on_both_workloads(
    placement_over_three: dict[str, Any],
) -> None:
    claims = placement_over_three["over_seeds"]["paper_ordering"]["claims"]
    assert set(claims) == {
        f"workloads.{w}: FCM < CM < WF in {m}"
        for w in ("W1", "W2")
        for m in ("mean_response_s", "mean_wait_s")
    }


def test_comm_factor_2_changes_the_figures_and_is_reported(
    placement_over_three: dict[str, Any],
) -> None:
    doubled = cli_json("koala-placement", "--comm-factor", "2.0")
    assert doubled["setup"]["comm_factor"] == 2.0
    assert placement_over_three["setup"]["comm_factor"] == 1.0
    for workload in ("W1", "W2"):
        for policy in ("WF", "CM", "FCM"):
            before = placement_over_three["workloads"][workload][policy]["mean_execution_s"]
            assert doubled["workloads"][workload][policy]["mean_execution_s"] > before


def test_a_growth_table_with_doubled_increments_is_comm_factor_2() -> None:
    doubled = {
        size: tuple(row[0] + 2 * (t - row[0]) for t in row)
        for size, row in FIG5_EXECUTION_S.items()
    }
    by_table = koala_placement_experiment(seed=1, jobs=20, growth_table=doubled)
    by_factor = koala_placement_experiment(seed=1, jobs=20, comm_factor=2.0)
    assert by_table["workloads"] == by_factor["workloads"]
    assert by_table["workloads"] != koala_placement_experiment(seed=1, jobs=20)["workloads"]
    reported = by_table["setup"]["execution_time_s"]["by_size_and_clusters"]
    assert reported == {str(size): list(row) for size, row in doubled.items()}


def test_the_growth_table_given_on_the_command_line_is_the_one_used_and_reported() -> None:
    flat = {str(size): [row[0], row[0]] for size, row in FIG5_EXECUTION_S.items()}
    result = cli_json("koala-placement", "--growth-table", json.dumps(flat))
    assert result["setup"]["execution_time_s"]["by_size_and_clusters"] == flat
    # No co-allocation penalty: a job runs as long on any number of clusters.
    for policies in result["workloads"].values():
        for metrics in policies.values():
            assert metrics["mean_execution_s"] <= max(row[0] for row in FIG5_EXECUTION_S.values())


def test_the_monitor_interval_changes_the_figures_and_is_reported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    default = run_json(capsys, "stateful-selection", "--runs", "1")
    slow = run_json(capsys, "stateful-selection", "--runs", "1", "--monitor-interval", "300")
    assert (default["trace"]["monitor_delay_s"], slow["trace"]["monitor_delay_s"]) == (60.0, 300.0)
    assert slow["protocols"] != default["protocols"]
    explicit = run_json(capsys, "stateful-selection", "--runs", "1", "--monitor-interval", "60")
    assert explicit == default


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["stateful-selection", "--seeds", "0"], "--seeds must be >= 1, got 0"),
        (["koala-claiming", "--seeds", "-2"], "--seeds must be >= 1"),
        (["koala-placement", "--comm-factor", "nan"], "--comm-factor must be finite and >= 0"),
        (["koala-placement", "--comm-factor", "inf"], "--comm-factor must be finite"),
        (["koala-placement", "--comm-factor", "-1"], "--comm-factor must be finite and >= 0"),
        (["stateful-selection", "--monitor-interval", "0"], "--monitor-interval must be"),
        (["stateful-selection", "--monitor-interval", "-60"], "--monitor-interval must be"),
        (["stateful-selection", "--monitor-interval", "inf"], "--monitor-interval must be"),
        (["stateful-selection", "--monitor-interval", "nan"], "--monitor-interval must be"),
        (["koala-placement", "--growth-table", "[100, 140"], "--growth-table: not JSON"),
        (["koala-placement", "--growth-table", "[100, 140]"], "--growth-table: expected an"),
        (["koala-placement", "--growth-table", '{"36": [100, 140]}'], "--growth-table: the"),
        (
            ["koala-placement", "--growth-table", '{"36": [140, 100], "64": [1, 2], "72": [1, 2]}'],
            "--growth-table: execution table row for size 36",
        ),
        (["koala-placement", "--growth-table", '{"x": [1, 2]}'], "--growth-table: job size 'x'"),
        (["stateful-selection", "--comm-factor", "2"], "--comm-factor: this one does not take"),
        (["koala-claiming", "--monitor-interval", "30"], "--monitor-interval: this one does not"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_option_and_exit_2(
    args: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["experiment", *args, "--plot", ""]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"gridcore: error: {option}")


def test_an_entry_without_figures_over_seeds_refuses_seeds() -> None:
    with pytest.raises(ConfigError, match="--seeds: this one reports no figures over seeds"):
        registry.load(BENCHMARKS, "placement").execute(RunOptions(seeds=2))


def test_one_seed_is_today_s_run() -> None:
    entry = registry.load(EXPERIMENTS, "stateful-selection")
    assert entry.execute(RunOptions(runs=1, seeds=1)) == entry.execute(RunOptions(runs=1))


def test_the_interval_is_student_t_over_the_per_seed_values() -> None:
    figure = estimate([1.0, 2.0, 3.0])  # mean 2, sample standard deviation 1
    half = 4.303 / math.sqrt(3)
    assert figure["mean"] == 2.0 and figure["half_width"] == pytest.approx(half)
    assert figure["ci95"] == pytest.approx([2.0 - half, 2.0 + half])
    assert estimate([5, 5])["ci95"] == [5.0, 5.0]
    assert (student_t_975(1), student_t_975(4), student_t_975(30)) == (12.706, 2.776, 2.042)
    # Beyond the table, the expansion continues it: 2.0395 at 31, 1.980 at 120.
    assert student_t_975(31) == pytest.approx(2.0395, abs=1e-4)
    assert student_t_975(120) == pytest.approx(1.9799, abs=1e-4)
    with pytest.raises(ValueError, match="degrees of freedom"):
        student_t_975(0)


def test_a_mean_over_seeds_widens_its_column_and_plain_tables_are_unchanged() -> None:
    columns: Sequence[tuple[str, str]] = [("name", "<6"), ("value", ">8.1f")]
    assert text_table(columns, [["a", 1.25], ["bb", 10.0]]) == (
        "name      value\na           1.2\nbb         10.0"
    )
    assert format(MeanInterval(2.0, 0.25), ">12.2f") == " 2.00 ± 0.25"
    wide = text_table(columns, [["a", MeanInterval(1.0, 0.5)], ["bb", MeanInterval(10.0, 2.0)]])
    assert wide.splitlines() == ["name        value", "a       1.0 ± 0.5", "bb     10.0 ± 2.0"]
