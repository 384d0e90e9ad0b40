"""The test grid runs three Slurm releases at once, each cluster its own.

``alpha`` runs Slurm 26.05 (Debian forky) and ``gamma`` Slurm 24.11 (Debian trixie), each
from a Debian chroot the suite builds itself (``tests/slurm_releases.py``); ``beta`` runs
the host's Debian 12 Slurm 22.05. Checked here with each cluster's own Slurm tools and raw
REST calls (never the adapter, which is another matter):

- each cluster's ``scontrol --version``, its REST ``meta`` and the REST versions its
  slurmrestd serves are those of its release, and every daemon runs in its chroot;
- a job of each cluster runs in that cluster's network namespace and root directory,
  with the chroot's own ``python3`` (what pilots run) and the suite's own interpreter,
  venv and checkout (what co-allocated components and apps run);
- stopping a grid, or cleaning up after a run that was killed, leaves no mount, network
  namespace, daemon or job behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm_releases import RELEASES
from tests.slurmgrid import (
    MOUNTS_FILE,
    ClusterLayout,
    SlurmCluster,
    SlurmGrid,
    cleanup_stale_netns,
    netns_unavailable_reason,
    start_grid,
    stop_grid,
)

pytestmark = pytest.mark.slurm
CI = os.environ.get("CI") == "true"
REPO = Path(__file__).resolve().parents[2]
# Two small clusters, one per chroot release, for the start/stop tests.
CHROOT_LAYOUT = (
    ClusterLayout("old", (2,), 5000, 10.0, release="24.11"),
    ClusterLayout("new", (2,), 6000, 10.0, release="26.05"),
)

# What a pilot does: `python3 -` (the python3 of the cluster's release) reads its program
# from stdin. Then the suite's own interpreter, as co-allocated components and apps run it.
JOB_SCRIPT = """#!/bin/bash
set -e
python3 - > {out}/pilot.json <<'EOF'
import json, os, sys
print(json.dumps({{
    "python": "%d.%d" % sys.version_info[:2],
    "executable": os.path.realpath(sys.executable),
    "root": [os.stat("/").st_dev, os.stat("/").st_ino],
    "netns": os.readlink("/proc/self/ns/net"),
    "cluster": os.environ.get("SLURM_CLUSTER_NAME"),
}}))
EOF
{python} -c '{suite_program}' > {out}/suite.json
"""
SUITE_PROGRAM = """
import ctypes, json, sqlite3, ssl, sys
import numpy
import gridcore
print(json.dumps({
    "prefix": sys.prefix,
    "base_prefix": sys.base_prefix,
    "gridcore": gridcore.__file__,
    "numpy": numpy.__version__,
    "sum": int(numpy.arange(10).sum()),
    "ssl": ssl.OPENSSL_VERSION,
}))
"""


def daemon_pids(cluster: SlurmCluster) -> dict[str, int]:
    cdir = cluster.conf.parent
    files = {"slurmctld": cdir / "slurmctld.pid", "slurmrestd": cdir / "slurmrestd.pid"}
    files |= {f"slurmd {n}": cdir / f"slurmd-{n}.pid" for n in cluster.nodes}
    return {what: int(path.read_text().split()[0]) for what, path in files.items()}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def mount_points() -> Counter[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return Counter(line.split()[4] for line in lines)


def test_each_cluster_runs_its_own_release(slurm_grid: SlurmGrid) -> None:
    releases = {c.name: c.release for c in slurm_grid.clusters}
    assert releases == {"alpha": "26.05", "beta": "22.05", "gamma": "24.11"}
    # The adapter finds the REST version itself ("auto"): the grid file pins none.
    assert "api_version" not in slurm_grid.grid_toml.read_text()
    for cluster in slurm_grid.clusters:
        release = RELEASES[cluster.release]
        assert (cluster.chroot is not None) == release.in_chroot
        version = cluster.cli(["scontrol", "--version"], check=True).stdout
        assert re.search(rf"\b{re.escape(cluster.release)}\.\d+", version), version
        assert cluster.api_version == release.rest_api
        response = cluster.rest("GET", "ping")
        assert response.status_code == 200, response.text
        meta = response.json()["meta"]
        # v0.0.38 names it "Slurm", later versions "slurm".
        reported = (meta.get("slurm") or meta.get("Slurm"))["release"]
        assert reported.startswith(f"{cluster.release}."), meta
        expected_root = os.stat(cluster.chroot or "/")
        for what, pid in daemon_pids(cluster).items():
            root = os.stat(f"/proc/{pid}/root")
            assert (root.st_dev, root.st_ino) == (expected_root.st_dev, expected_root.st_ino), (
                f"{what} of {cluster.name} does not run in {cluster.chroot or '/'}"
            )
    assert slurm_grid.by_release("24.11") is slurm_grid.cluster("gamma")


def test_a_job_runs_in_its_clusters_namespace_and_release(
    slurm_grid: SlurmGrid, tmp_path: Path
) -> None:
    tmp_path.chmod(0o755)
    jobs = {}
    for cluster in slurm_grid.clusters:
        out = tmp_path / cluster.name
        out.mkdir(mode=0o755)
        script = out / "job.sh"
        script.write_text(
            JOB_SCRIPT.format(out=out, python=sys.executable, suite_program=SUITE_PROGRAM)
        )
        jobs[cluster.name] = cluster.sbatch(
            f"bash {script}", cwd=out, name="release-check", output=out / "slurm-%j.out"
        )
    for cluster in slurm_grid.clusters:
        out = tmp_path / cluster.name
        job = cluster.wait_job(jobs[cluster.name])
        log = next(out.glob("slurm-*.out"), None)
        assert job["JobState"] == "COMPLETED", (job, log and log.read_text())
        check_pilot_side(cluster, json.loads((out / "pilot.json").read_text()))
        check_suite_side(json.loads((out / "suite.json").read_text()))


def check_pilot_side(cluster: SlurmCluster, pilot: dict[str, object]) -> None:
    """The job ran in the cluster's root directory and namespace, with its python3."""
    root = cluster.chroot or Path("/")
    expected = os.stat(root)
    assert pilot["root"] == [expected.st_dev, expected.st_ino], (cluster.name, pilot)
    assert pilot["cluster"] == cluster.name
    if cluster.netns is not None:
        ns_inode = os.stat(f"/run/netns/{cluster.netns}").st_ino
        assert pilot["netns"] == f"net:[{ns_inode}]", (cluster.name, pilot)
    # The release's own python3 (3.11 on the host, 3.13 in trixie, 3.14 in forky).
    python3 = os.path.realpath(root / "usr/bin/python3")
    assert str(pilot["executable"]) == "/" + os.path.relpath(python3, root)
    assert Path(python3).name == f"python{pilot['python']}"


def check_suite_side(suite: dict[str, object]) -> None:
    """The suite's interpreter, venv and editable checkout, at the host's own paths."""
    assert suite["prefix"] == sys.prefix
    assert suite["base_prefix"] == sys.base_prefix
    assert Path(str(suite["gridcore"])).is_relative_to(REPO)
    assert suite["sum"] == 45
    assert suite["ssl"]


@pytest.fixture
def grid_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="gridcore-slurm-rel-"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def namespaced() -> str:
    reason = netns_unavailable_reason()
    if reason is not None:
        if CI:
            pytest.fail(f"CI=true: the Slurm grid must run in network namespaces: {reason}")
        pytest.skip(f"no network namespaces here: {reason}")
    return "netns"


def test_stop_leaves_no_mount_namespace_daemon_or_job(grid_dir: Path) -> None:
    before = mount_points()
    grid = start_grid(grid_dir, CHROOT_LAYOUT, network=namespaced())
    try:
        recorded = json.loads((grid_dir / MOUNTS_FILE).read_text())
        pids = [pid for c in grid.clusters for pid in daemon_pids(c).values()]
        # A job still running when the grid stops (its pid written from inside).
        job_pids = {}
        for cluster in grid.clusters:
            pid_file = grid_dir / f"{cluster.name}.job-pid"
            cluster.sbatch(f"echo $$ > {pid_file}; exec sleep 300", cwd=grid_dir)
            job_pids[cluster.name] = pid_file
        deadline = time.monotonic() + 60
        while not all(p.exists() and p.read_text().strip() for p in job_pids.values()):
            assert time.monotonic() < deadline, "the jobs did not start"
            time.sleep(0.2)
        pids += [int(p.read_text()) for p in job_pids.values()]
        netns = [c.netns for c in grid.clusters]
    finally:
        stop_grid(grid)
    assert {c.chroot for c in grid.clusters} == {
        Path(e["target"]).parent for e in recorded if e["target"].endswith("/proc")
    }
    after = mount_points()
    leftovers = [e["target"] for e in recorded if after[e["target"]] > before[e["target"]]]
    assert leftovers == []
    created = [d for e in recorded for d in e["created"]]
    assert [d for d in created if Path(d).exists() and not before[d]] == []
    assert not (grid_dir / MOUNTS_FILE).exists()
    assert [pid for pid in pids if alive(pid)] == []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert [ns for ns in netns if ns and ns in listed] == []


KILLED_RUN = """
import sys, time
from pathlib import Path
from tests.slurm.test_slurm_releases import CHROOT_LAYOUT
from tests.slurmgrid import start_grid
grid = start_grid(Path(sys.argv[1]), CHROOT_LAYOUT, network="netns")
print(" ".join(c.netns for c in grid.clusters), flush=True)
time.sleep(600)
"""


def test_a_killed_runs_mounts_namespaces_and_daemons_are_cleaned_up(grid_dir: Path) -> None:
    namespaced()
    before = mount_points()
    with subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, str(grid_dir)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None
            netns = child.stdout.readline().split()
            assert len(netns) == 2, "the grid of the run to kill did not start"
            recorded = json.loads((grid_dir / MOUNTS_FILE).read_text())
            manifest = json.loads((grid_dir / "daemons.json").read_text())
            pids = [int(Path(e["pid_file"]).read_text().split()[0]) for e in manifest]
            assert all(alive(pid) for pid in pids)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
    # What any later namespaced start does first.
    removed = cleanup_stale_netns()
    assert set(netns) <= set(removed)
    assert [pid for pid in pids if alive(pid)] == []
    after = mount_points()
    assert [e["target"] for e in recorded if after[e["target"]] > before[e["target"]]] == []
    assert not (grid_dir / MOUNTS_FILE).exists()
