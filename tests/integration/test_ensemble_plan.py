"""The ensemble DAG's planning: forcing file or params -> one expand_kwargs row per member."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from tests.integration.conftest import DAGS, IntegrationEnv


@pytest.fixture(scope="module")
def ensemble(airflow_env: IntegrationEnv) -> ModuleType:
    spec = importlib.util.spec_from_file_location("ensemble_surge_dag", DAGS / "ensemble_surge.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_forcing_file_plans_its_members_cycling_processors(ensemble: Any) -> None:
    forcing = {"storm": "alberto", "members": 5, "processors": [4, 2], "runtime_s": 3}

    rows = ensemble.plan_from_forcing(forcing, "alberto.json", "/inbox/consumed/x-alberto.json")

    assert [r["processors"] for r in rows] == [4, 2, 4, 2, 4]
    assert {r["runtime_s"] for r in rows} == {3.0}
    assert [r["env"]["MEMBER"] for r in rows] == ["0", "1", "2", "3", "4"]
    winds = [float(r["env"]["WIND_MS"]) for r in rows]
    assert winds == sorted(winds) and winds[0] == pytest.approx(28.0) and winds[-1] == 42.0
    assert {r["env"]["STORM"] for r in rows} == {"alberto"}


def test_the_storm_defaults_to_the_dropped_file_name(ensemble: Any) -> None:
    rows = ensemble.plan_from_forcing({"members": 1}, "debby.json", "/inbox/consumed/1-debby.json")
    assert rows[0]["env"]["STORM"] == "debby"
    assert rows[0]["processors"] == 2


@pytest.mark.parametrize(
    ("forcing", "message"),
    [
        ({"members": 0}, "members: must be an integer in 1..256"),
        ({"members": "ten"}, "members: must be an integer"),
        ({"processors": [4, 0]}, "processors: must be a positive integer or a list"),
        ({"processors": []}, "processors: must be a positive integer or a list"),
        ({"runtime_s": -1}, "runtime_s: must be a positive number"),
        ({"wind_ms": "strong"}, "could not convert"),
    ],
)
def test_a_bad_forcing_file_fails_naming_the_file_and_field(
    ensemble: Any, forcing: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=rf"forcing file /in/bad.json: .*{message}"):
        ensemble.plan_from_forcing(forcing, "bad.json", "/in/bad.json")


def test_only_forcing_trigger_payloads_are_taken_from_asset_events(ensemble: Any) -> None:
    ours = {"path": "/in/consumed/1-a.json", "name": "a.json", "size": 10}
    events = {
        "gridcore_forcing": [
            SimpleNamespace(extra={"from_trigger": True, "payload": ours}),
            SimpleNamespace(extra={}),  # an event posted by hand, not by the watcher
            SimpleNamespace(extra=None),
        ]
    }
    assert ensemble.forcing_payloads(events) == [ours]


def test_the_summary_table_aligns_columns(ensemble: Any) -> None:
    table = ensemble.render_table(
        [
            {
                "member": 0,
                "site": "local-a",
                "job_id": "12",
                "state": "completed",
                "queued_s": 0.5,
                "run_s": None,
            }
        ]
    )
    header, row = table.splitlines()
    assert header.split() == ["member", "site", "job_id", "state", "queued_s", "run_s"]
    assert row.split() == ["0", "local-a", "12", "completed", "0.50", "-"]
    assert header.index("site") == row.index("local-a")


def test_the_member_command_runs_the_model_and_prints_a_result(
    ensemble: Any, tmp_path: Path
) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "GRIDCORE_PROCESSORS": "2",
        "GRIDCORE_SITE": "here",
        **ensemble.member_rows("test", 1, 2, 0.2)[0]["env"],
    }
    done = subprocess.run(
        ["/bin/sh", "-c", ensemble.MEMBER_COMMAND],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("RESULT storm=test member=0 site=here")
    assert "variants=2" in done.stdout
    peak = float(done.stdout.split("peak_surge_m=")[1].split()[0])
    assert 0.0 < peak < 10.0
