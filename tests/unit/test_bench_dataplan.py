"""`gridcore bench dataplan`: the figures are there and positive (no timed assertions:
the machine decides the numbers)."""

from __future__ import annotations

import json
import stat
from functools import partial
from pathlib import Path

import pytest

from gridcore.cli import main
from gridcore.experiments import bench_dataplan as bd
from gridcore.policies.dataplan import STORAGE_STRATEGIES, check_feasibility, table2_environment

FIGURES = {
    "choose_100000x50_ms",
    "choose_target_ms",
    "choose_within_target",
    "baseline_loop_ms",
    "choose_to_baseline",
    "choose_repeats",
    "choose_pick",
    "choose_considered",
    "simulation_choose_small_ms",
    "simulation_small_workload",
    "simulation_small_pick",
    "simulation_small_seeds",
    "dag_parse_s",
    "dag_parse_process_s",
    "airflow_import_s",
    "dag_parse_reason",
}


def _fake_python(tmp_path: Path, exit_code: int, stderr: str = "", stdout: str = "") -> str:
    # Stands in for the interpreter that would import Airflow and time the DagBag.
    stdout = stdout or '{"import_s": 1.5, "parse_s": 0.25}'
    script = tmp_path / "python"
    script.write_text(
        f"#!/bin/sh\ncat >&2 <<'END'\n{stderr}\nEND\necho '{stdout}'\nexit {exit_code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_the_canonical_workload_is_100000_pipelines_of_50_with_three_plans_possible() -> None:
    workload, env = bd.CANONICAL_WORKLOAD, table2_environment()
    assert (workload.W, workload.D) == (100_000, 50)
    possible = [s.value for s in STORAGE_STRATEGIES if check_feasibility(s, workload, env).possible]
    assert possible == ["all_batch", "slice", "minimal"]


def test_choosing_times_are_positive_with_their_baseline_and_target() -> None:
    result = bd.bench_choose(repeats=3)
    assert result["choose_100000x50_ms"] > 0 and result["baseline_loop_ms"] > 0
    assert result["choose_to_baseline"] > 0
    assert result["choose_target_ms"] == 5.0 and result["choose_repeats"] == 3
    assert result["choose_considered"] == ["all_batch", "slice", "minimal"]
    assert result["choose_pick"] in result["choose_considered"]


def test_the_simulation_chooser_is_timed_on_the_small_workload() -> None:
    result = bd.bench_simulation_choose(repeats=1)
    assert result["simulation_choose_small_ms"] > 0
    assert result["simulation_small_workload"] == {"W": 20, "D": 5}
    assert result["simulation_small_seeds"] >= 1


def test_dag_parse_is_null_with_a_reason_without_the_dag_file(tmp_path: Path) -> None:
    missing = tmp_path / "batch_pipeline.py"
    assert bd.bench_dag_parse(missing) == {
        "dag_parse_s": None,
        "dag_parse_process_s": None,
        "airflow_import_s": None,
        "dag_parse_reason": f"{missing} does not exist",
    }
    assert bd.bench_dag_parse(None)["dag_parse_reason"] == "no DAG file given"


def test_dag_parse_is_the_dagbag_time_the_subprocess_reports(tmp_path: Path) -> None:
    dag = tmp_path / "dags" / "batch_pipeline.py"
    dag.parent.mkdir()
    dag.write_text("")
    result = bd.bench_dag_parse(dag, repeats=3, python=_fake_python(tmp_path, 0))
    assert result["dag_parse_s"] == 0.25 and result["airflow_import_s"] == 1.5
    assert result["dag_parse_process_s"] > 0 and result["dag_parse_reason"] is None
    silent = _fake_python(tmp_path, 0, stdout="no json here")
    assert "printed no timings" in bd.bench_dag_parse(dag, python=silent)["dag_parse_reason"]


def test_the_example_dag_is_parsed_by_a_real_dagbag() -> None:
    # the real interpreter and Airflow, once: the figure is measured, not faked
    result = bd.bench_dag_parse(bd.DAG_FILE, repeats=1)
    assert result["dag_parse_reason"] is None, result
    assert result["dag_parse_s"] > 0 and result["airflow_import_s"] > 0
    assert result["dag_parse_process_s"] > result["dag_parse_s"]


def test_a_failed_parse_is_null_with_the_last_error_line(tmp_path: Path) -> None:
    dag = tmp_path / "dags" / "batch_pipeline.py"
    dag.parent.mkdir()
    dag.write_text("")
    failing = _fake_python(tmp_path, 3, "ModuleNotFoundError: No module named 'airflow'")
    result = bd.bench_dag_parse(dag, python=failing)
    assert result == {
        "dag_parse_s": None,
        "dag_parse_process_s": None,
        "airflow_import_s": None,
        "dag_parse_reason": "the DagBag run exited 3: ModuleNotFoundError: No module named"
        " 'airflow'",
    }


def test_cli_prints_every_figure_as_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(bd, "bench_choose", partial(bd.bench_choose, repeats=3))
    monkeypatch.setattr(bd, "bench_simulation_choose", partial(bd.bench_simulation_choose, 1))
    fake = _fake_python(tmp_path, 0)
    monkeypatch.setattr(bd, "bench_dag_parse", partial(bd.bench_dag_parse, python=fake))
    assert main(["bench", "dataplan", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == FIGURES
    numbers = ("choose_100000x50_ms", "baseline_loop_ms", "simulation_choose_small_ms")
    assert all(result[key] > 0 for key in numbers)
    if bd.DAG_FILE.is_file():
        assert result["dag_parse_s"] > 0
    else:
        assert result["dag_parse_s"] is None and result["dag_parse_reason"]
