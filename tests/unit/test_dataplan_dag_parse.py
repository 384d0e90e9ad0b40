"""Parsing the batch-pipeline DAG runs no simulation (issue 23 item 3): the plan is made
once per content of the pipeline file and grid (gridcore.dataplan.planning.cached_plan),
and a DAG processor parsing the file again renders it from the cache."""

from __future__ import annotations

import json
import runpy
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import pytest

from gridcore.config import load_grid
from gridcore.dataplan import choosers
from gridcore.dataplan.format import load_pipeline
from gridcore.dataplan.planning import ChosenPlan, cached_plan, choose_plan
from gridcore.sim import dataplan as sim_dataplan
from gridcore.state.store import state_dir

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "batch_pipeline.py"
EXAMPLES = REPO / "examples" / "pipelines"


class SimulatorCalled(AssertionError):
    pass


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the plan cache lives in the state directory: a fresh one per test
    monkeypatch.setenv("GRIDCORE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GRIDCORE_GRID", raising=False)


def _refuse_simulation(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The simulator's entry, wherever the chooser finds it, raises (and is counted)."""
    calls: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        calls.append("simulate_dataplan")
        raise SimulatorCalled("the DAG's parse ran a simulation")

    monkeypatch.setattr(sim_dataplan, "simulate_dataplan", refuse)
    monkeypatch.setattr(choosers, "simulate_dataplan", refuse)
    return calls


def _parse() -> Any:
    return runpy.run_path(str(DAG_FILE))["dag"]


def test_a_parse_after_the_first_runs_no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    first = _parse()  # plans (the simulation chooser simulates) and caches
    assert list((state_dir() / "plans").glob("*.json")), "the first parse cached no plan"
    calls = _refuse_simulation(monkeypatch)
    again = _parse()
    assert calls == []
    assert again.task_ids == first.task_ids
    assert again.doc_md == first.doc_md


def test_the_cold_parse_is_the_one_that_simulates(monkeypatch: pytest.MonkeyPatch) -> None:
    # guards the test above: with an empty cache the refusing simulator is reached
    calls = _refuse_simulation(monkeypatch)
    with pytest.raises(SimulatorCalled):
        _parse()
    assert calls


def test_the_cached_plan_is_the_one_planning_makes(tmp_path: Path) -> None:
    spec = load_pipeline(EXAMPLES / "kmer_count.toml")
    grid = load_grid(EXAMPLES / "grid.toml")
    fresh = choose_plan(spec, grid)
    assert cached_plan(spec, grid, tmp_path) == fresh  # planned and written
    assert cached_plan(spec, grid, tmp_path) == fresh  # read back
    (cached,) = tmp_path.glob("*.json")
    assert ChosenPlan.from_json(json.loads(cached.read_text())) == fresh


def test_a_changed_file_is_planned_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_pipeline(EXAMPLES / "kmer_count.toml")
    grid = load_grid(EXAMPLES / "grid.toml")
    cached_plan(spec, grid, tmp_path)
    calls = _refuse_simulation(monkeypatch)
    cached_plan(spec, grid, tmp_path)
    assert calls == []
    slower = replace(spec.depths[0], runtime_mean_s=spec.depths[0].runtime_mean_s * 2)
    with pytest.raises(SimulatorCalled):
        cached_plan(replace(spec, depths=(slower, *spec.depths[1:])), grid, tmp_path)


def test_an_unreadable_cache_entry_is_planned_again(tmp_path: Path) -> None:
    spec = load_pipeline(EXAMPLES / "kmer_count.toml")
    grid = load_grid(EXAMPLES / "grid.toml")
    fresh = cached_plan(spec, grid, tmp_path)
    (entry,) = tmp_path.glob("*.json")
    entry.write_text("{not json")
    assert cached_plan(spec, grid, tmp_path) == fresh


def test_a_changed_planner_plans_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same files under a gridcore whose planning code changed are planned afresh."""
    from gridcore.dataplan import planning

    spec = load_pipeline(EXAMPLES / "kmer_count.toml")
    grid = load_grid(EXAMPLES / "grid.toml")
    cached_plan(spec, grid, tmp_path)
    _refuse_simulation(monkeypatch)
    monkeypatch.setattr(planning, "_planner_digest", lambda: "another planner")
    with pytest.raises(SimulatorCalled):
        cached_plan(spec, grid, tmp_path)
