"""Experiments and benchmarks come from one registry, read by `gridcore experiment` and
`gridcore bench` alike; the plot is optional (the `plot` extra)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gridcore.cli import main
from gridcore.errors import ConfigError
from gridcore.experiments import registry
from gridcore.experiments.registry import BENCHMARKS, EXPERIMENTS, Experiment, RunOptions


@pytest.mark.parametrize("table", [EXPERIMENTS, BENCHMARKS], ids=["experiments", "benchmarks"])
def test_every_registered_name_loads_an_experiment(table: dict[str, str]) -> None:
    for name in table:
        entry = registry.load(table, name)
        assert isinstance(entry, Experiment) and entry.summary


def test_an_unknown_name_is_refused_with_the_registered_ones() -> None:
    with pytest.raises(
        ConfigError,
        match="unknown name 'nope'; registered: dataplan, dataplan-robustness, koala-claiming",
    ):
        registry.load(EXPERIMENTS, "nope")


def test_runs_default_per_entry_and_are_refused_where_there_are_none() -> None:
    stateful = registry.load(EXPERIMENTS, "stateful-selection")
    claiming = registry.load(EXPERIMENTS, "koala-claiming")
    assert stateful.runs(RunOptions()) == 20
    assert stateful.runs(RunOptions(runs=3)) == 3
    assert claiming.runs(RunOptions()) == 1
    with pytest.raises(ConfigError, match="takes no repetitions"):
        claiming.runs(RunOptions(runs=3))
    with pytest.raises(ConfigError, match="--runs must be >= 1"):
        stateful.runs(RunOptions(runs=0))


def test_the_table_printed_is_rendered_from_the_figures_of_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plot = tmp_path / "claiming.png"
    assert main(["experiment", "koala-claiming", "--seed", "1", "--plot", str(plot)]) == 0
    table = capsys.readouterr().out
    assert main(["experiment", "koala-claiming", "--seed", "1", "--json", "--plot", ""]) == 0
    result = json.loads(capsys.readouterr().out)
    assert table.splitlines()[0] == (
        f"submitted {result['submitted']} completed {result['completed']}"
        f" component_failure_rate {result['component_failure_rate']:.3f}"
    )
    assert plot.stat().st_size > 0


def test_without_matplotlib_the_json_is_printed_and_one_line_says_no_plot(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A core install: `import matplotlib` fails (None in sys.modules makes it raise).
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.chdir(tmp_path)
    assert main(["experiment", "koala-claiming", "--json"]) == 0  # the PNG is on by default
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["completed"] == result["submitted"] and "plot" not in result
    notices = [line for line in err.splitlines() if "matplotlib" in line]
    assert notices == [
        "gridcore: no plot written (out/koala-claiming.png): matplotlib is not installed"
        " (pip install 'gridcore[plot]')"
    ]
    assert not (tmp_path / "out").exists()


def test_bench_placement_runs_from_the_same_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "placement", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["placed"] == 85.0  # the scan's outcome is deterministic, its time is not
    assert set(result) == {"cf_8comp_1000sites_p50_ms", "scan_10000jobs_100sites_s", "placed"}
