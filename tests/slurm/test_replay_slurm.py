"""``gridcore replay`` on the Slurm test grid: ten jobs of a real log's head (SDSC SP2,
tests/data/swf) replayed at speedup 100 to beta (22.05, two 8-CPU nodes) and gamma
(24.11, 4 CPUs) in turn, checked in each cluster's own job listing (``squeue``): the
name, the CPUs (capped to the largest node), the time limit (the requested time / 100,
rounded up to whole minutes by Slurm), no comment (no gridcore key: others' load), and
that once the command has exited none of them is pending or running."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.slurmgrid import SlurmCluster, SlurmGrid

pytestmark = pytest.mark.slurm

SDSC = Path(__file__).resolve().parents[1] / "data" / "swf" / "sdsc-sp2-head.swf.gz"
# SDSC jobs 24..33, submitted 584165..585786 s: 1 to 24 processors, runs of 40 s to
# 51164 s (job 33: 512 s at speedup 100, past the 60 s replay: cancelled at its end),
# requested 1200 s to 64800 s (job 33: 648 s -> 11 minutes at Slurm)
WINDOW = "584100:585800"
ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT"}


def _listing(cluster: SlurmCluster, prefix: str) -> dict[str, dict[str, str]]:
    """The cluster's own listing of every job it knows (any state) named ``prefix...``."""
    done = cluster.cli(["squeue", "-h", "-a", "-t", "all", "-o", "%i|%j|%C|%l|%T|%k"], check=True)
    jobs = {}
    for line in done.stdout.splitlines():
        job_id, name, cpus, limit, state, comment = line.split("|")
        if name.startswith(prefix):
            jobs[job_id] = {
                "name": name, "cpus": cpus, "limit": limit, "state": state, "comment": comment
            }  # fmt: skip
    return jobs


def _squeue_limit(seconds: int) -> str:
    """A limit of whole minutes as squeue's %l shows it: 1:00, 11:00, 1:05:00."""
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours}:{minutes:02d}:00" if hours else f"{minutes}:00"


def test_a_real_log_head_replayed_to_two_slurm_clusters(
    slurm_grid: SlurmGrid, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        **slurm_grid.env,
        "GRIDCORE_HOME": str(tmp_path),
        "GRIDCORE_DB_URL": f"sqlite:///{tmp_path}/state.db",
    }
    argv = [
        sys.executable, "-m", "gridcore.cli", "replay", str(SDSC),
        "--grid", str(slurm_grid.grid_toml), "--site-map", "*=beta+gamma",
        "--speedup", "100", "--window", WINDOW, "--max-jobs", "10",
        "--max-duration", "60", "--json",
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)

    assert (data["planned"], data["submitted"], data["left_running"]) == (10, 10, [])
    assert data["stopped_by"] == "max_jobs" and data["skipped"] == {}
    assert (data["cancelled_by_replay"], data["completed"]) == (1, 9)
    # 24, 16, 16, 16, 16 processors on beta's 8-CPU nodes; 8, 8, 8 on gamma's 4 CPUs
    assert data["sites"]["beta"]["capped"] == 4 and data["sites"]["gamma"]["capped"] == 3
    jobs = {j["number"]: j for j in data["jobs"]}
    # job 24 ran 3634 s of the 3600 it asked: 36.34 s against a 36 s limit, which Slurm
    # makes a minute; so it completed there (a local site would have killed it)
    assert (jobs[24]["time_limit_s"], jobs[24]["site_limit_s"]) == (36, 60)
    assert jobs[24]["sleep_s"] == 36.34 and jobs[24]["state"] == "completed"
    assert (jobs[33]["site"], jobs[33]["site_limit_s"], jobs[33]["state"]) == (
        "gamma",
        660,
        "cancelled",
    )

    prefix = f"gcreplay-{data['run']}-"
    for site in ("beta", "gamma"):
        cluster = slurm_grid.cluster(site)
        listed = _listing(cluster, prefix)
        mine = [j for j in data["jobs"] if j["site"] == site]
        assert sorted(listed) == sorted(j["job_id"] for j in mine)
        for job in mine:
            seen = listed[job["job_id"]]
            assert seen["name"] == job["name"] == f"{prefix}{job['number']}"
            assert int(seen["cpus"]) == job["processors"], (job, seen)
            assert seen["limit"] == _squeue_limit(job["site_limit_s"]), (job, seen)
            assert seen["comment"] in ("", "(null)"), seen  # no key: not gridcore's
            assert seen["state"] in ENDED, seen  # the command has exited: nothing runs
            assert seen["state"] == job["state"].upper(), (job, seen)


def test_a_replay_killed_outright_is_cleaned_up_on_slurm(
    slurm_grid: SlurmGrid, tmp_path: Path
) -> None:
    """SIGKILL leaves the replay's jobs pending or running at beta and gamma; the
    clean-up command it printed finds them in slurmrestd's listing (by name, keyless,
    run as the token's user) and cancels them: none is left pending or running."""
    env = {
        **os.environ,
        **slurm_grid.env,
        "GRIDCORE_HOME": str(tmp_path),
        "GRIDCORE_DB_URL": f"sqlite:///{tmp_path}/state.db",
    }
    argv = [
        sys.executable, "-m", "gridcore.cli", "replay", str(SDSC),
        "--grid", str(slurm_grid.grid_toml), "--site-map", "*=beta+gamma",
        "--speedup", "100", "--window", WINDOW, "--max-jobs", "4", "--max-duration", "600",
    ]  # fmt: skip
    stderr = tmp_path / "replay.stderr"
    with stderr.open("w") as err:
        replay = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
    clusters = [slurm_grid.cluster(site) for site in ("beta", "gamma")]
    try:
        deadline = time.monotonic() + 120.0
        run = None
        while time.monotonic() < deadline and replay.poll() is None:
            found = re.search(r"^replay ([0-9a-f]{6}): submitting 4 jobs", stderr.read_text(), re.M)
            if found:
                run = found.group(1)
                live = [j for c in clusters for j in _listing(c, f"gcreplay-{run}-").values()
                        if j["state"] in ("PENDING", "RUNNING")]  # fmt: skip
                if len(live) == 4:
                    break
            time.sleep(0.5)
        assert run is not None and replay.poll() is None, stderr.read_text()[-3000:]
        replay.send_signal(signal.SIGKILL)
        replay.wait(timeout=10)
    finally:
        if replay.poll() is None:
            replay.kill()
            replay.wait(timeout=10)
    printed = re.search(r"if this process is killed: (gridcore replay-cancel .*)$",
                        stderr.read_text(), re.M)  # fmt: skip
    assert printed is not None, stderr.read_text()[-3000:]
    prefix = f"gcreplay-{run}-"
    assert sum(len(_listing(c, prefix)) for c in clusters) == 4
    cancel = [sys.executable, "-m", "gridcore.cli", *shlex.split(printed.group(1))[1:], "--json"]
    done = subprocess.run(cancel, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)
    # job 24 (36 s) may have ended by itself since the kill
    assert data["found"] >= 3 and data["cancelled"] >= 3, data
    assert (data["left_running"], data["unread_sites"]) == ([], {}), data
    for cluster in clusters:
        for job in _listing(cluster, prefix).values():
            assert job["state"] in ENDED, job
