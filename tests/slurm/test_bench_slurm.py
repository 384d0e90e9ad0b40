"""``gridcore bench slurm-polling`` on the live grid: watching 200 jobs costs one REST
call per poll cycle with the shared listing, where a per-job poller makes 200; every
job it submitted is cancelled afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gridcore.cli import main
from tests.slurmgrid import SlurmGrid

pytestmark = pytest.mark.slurm


def test_slurm_polling_bench_watches_200_jobs_with_one_call_per_cycle(
    slurm_grid: SlurmGrid,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in slurm_grid.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GRIDCORE_HOME", str(tmp_path))
    monkeypatch.setenv("GRIDCORE_DB_URL", f"sqlite:///{tmp_path}/state.db")
    gamma = slurm_grid.cluster("gamma")
    argv = ["bench", "slurm-polling", "--grid", str(slurm_grid.grid_toml), "--site", "gamma"]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["jobs"] == 200 and result["cycles"] == 5
    assert result["rest_calls_per_cycle_per_site"] <= 2
    assert result["per_job_calls_per_cycle"] == 200
    assert (result["release"][:5], result["api_version"]) == (gamma.release, gamma.api_version)
    # Nothing of the bench is left running or queued.
    done = gamma.cli(["squeue", "-h", "-t", "PD,R,CG", "-n", "bench-poll-0", "-o", "%i"])
    assert done.stdout.split() == [] or all(
        gamma.show_job(j).get("JobState") == "CANCELLED" for j in done.stdout.split()
    )
