"""The test grid's own layout: one network namespace per cluster, and scheduler ticks.

Network: every cluster's slurmctld, slurmd and slurmrestd (of whichever Slurm release it
runs, from the host or a chroot) run in a namespace of their own joined to the host by a
veth pair, so a job sees only its cluster's address and reaches
the host at ``SlurmCluster.host_address``, never through the host's loopback. Checked
from both ends: the host reaches each slurmrestd at the namespace address; a job on each
cluster reports its addresses and its cluster, connects to a TCP server bound to that
cluster's host-side address, and the server sees the connection come from that
cluster's namespace address.

Scheduling: a cluster of its own started with 10-second ticks; jobs submitted at
different moments start together on the next tick (measured spread, not a deadline),
and a live ``scontrol reconfigure`` to 1-second ticks makes them start one by one.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gridcore.model import JobState, JobStatus, JobSubmission
from gridcore.sites.slurm import SlurmSite
from tests.slurm.conftest import site_spec
from tests.slurmgrid import (
    NETNS_RUN_DIR,
    ClusterLayout,
    SlurmCluster,
    SlurmGrid,
    netns_unavailable_reason,
    scheduler_interval,
    set_scheduler_interval,
    start_grid,
    stop_grid,
)

pytestmark = pytest.mark.slurm
CI = os.environ.get("CI") == "true"
TICK_S = 10

# Run inside the job: its addresses, then one line of JSON to the host-side server, and
# a connection attempt to a port that listens only on the HOST's loopback.
JOB_PROGRAM = r"""
import json, os, socket, subprocess, sys
host, port, loop_port, other = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
addrs = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
def reach(addr, p):
    try:
        socket.create_connection((addr, p), timeout=3).close()
        return True
    except OSError:
        return False
oh, op = other.rsplit(":", 1)
report = {
    "cluster": os.environ.get("SLURM_CLUSTER_NAME"),
    "job_id": os.environ.get("SLURM_JOB_ID"),
    "addrs": [line.split()[3].split("/")[0] for line in addrs.splitlines()],
    "host_loopback_reached": reach("127.0.0.1", loop_port),
    "other_cluster_reached": reach(oh, int(op)),
}
with socket.create_connection((host, port), timeout=10) as s:
    s.sendall((json.dumps(report) + "\n").encode())
    print(s.makefile().readline().strip())
"""


def wait_started(site: SlurmSite, job_id: str, timeout_s: float = 60.0) -> JobStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        status = site.status(job_id)
        if status.state is not JobState.PENDING:
            assert status.started_at is not None, status
            return status
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} at {site}: still pending after {timeout_s} s")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def netns_grid(slurm_grid: SlurmGrid) -> Iterator[SlurmGrid]:
    """The session grid if it runs in namespaces, else a namespaced grid of its own."""
    if slurm_grid.network == "netns":
        yield slurm_grid
        return
    reason = netns_unavailable_reason()
    if reason is not None:
        if CI:
            pytest.fail(f"CI=true: the Slurm grid must run in network namespaces: {reason}")
        pytest.skip(f"no network namespaces here: {reason}")
    base = Path(tempfile.mkdtemp(prefix="gridcore-slurm-netns-"))
    try:
        grid = start_grid(base, network="netns")
        try:
            yield grid
        finally:
            stop_grid(grid)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def netns_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def daemon_pids(cluster: SlurmCluster) -> dict[str, int]:
    cdir = cluster.conf.parent
    files = {"slurmctld": cdir / "slurmctld.pid", "slurmrestd": cdir / "slurmrestd.pid"}
    files |= {f"slurmd {n}": cdir / f"slurmd-{n}.pid" for n in cluster.nodes}
    return {what: int(path.read_text().split()[0]) for what, path in files.items()}


def test_each_cluster_runs_in_a_namespace_of_its_own(netns_grid: SlurmGrid) -> None:
    assert netns_grid.network == "netns"
    clusters = netns_grid.clusters
    assert netns_grid.cluster(0) is clusters[0]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    inodes = set()
    for cluster in clusters:
        assert cluster.netns and cluster.netns in listed
        assert (NETNS_RUN_DIR / f"{cluster.netns}.json").exists()
        # One /24 per cluster: host side .1, namespace side .2.
        assert cluster.host_address.rsplit(".", 1) == [cluster.address.rsplit(".", 1)[0], "1"]
        assert cluster.rest_url.startswith(f"http://{cluster.address}:")
        ns = os.stat(f"/run/netns/{cluster.netns}").st_ino
        inodes.add(ns)
        for what, pid in daemon_pids(cluster).items():
            assert netns_inode(pid) == ns, f"{what} of {cluster.name} is not in its namespace"
    assert len(inodes) == len(clusters)
    assert netns_inode(os.getpid()) not in inodes
    assert len({c.address for c in clusters}) == len({c.host_address for c in clusters}) == 3


def test_host_reaches_each_slurmrestd_over_its_veth(netns_grid: SlurmGrid) -> None:
    for cluster in netns_grid.clusters:
        route = subprocess.run(
            ["ip", "-o", "route", "get", cluster.address], capture_output=True, text=True
        ).stdout
        assert f"src {cluster.host_address}" in route, route
        # Raw REST (every release): the adapter is not what this checks.
        response = cluster.rest("GET", "ping")
        assert response.status_code == 200, response.text
        assert response.json()["pings"], response.text
        # The daemons are not on the host's loopback any more.
        port = int(cluster.rest_url.rsplit(":", 1)[1])
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/slurm/{cluster.api_version}/ping", timeout=3)
        # The Slurm CLI (the cluster's own release) reaches slurmctld in the namespace too.
        done = cluster.cli(["scontrol", "ping"])
        assert "is UP" in done.stdout, done


class Collector:
    """A TCP server on one address: records each line a client sends and its peer."""

    def __init__(self, address: str) -> None:
        self.server = socket.create_server((address, 0))
        self.port: int = self.server.getsockname()[1]
        self.reports: list[tuple[str, dict[str, object]]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, peer = self.server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                line = conn.makefile().readline()
                self.reports.append((peer[0], json.loads(line)))
                conn.sendall(b"ack\n")

    def close(self) -> None:
        self.server.close()
        self.thread.join(timeout=5)


def test_a_job_on_each_cluster_reaches_the_host_only_over_its_veth(
    netns_grid: SlurmGrid, tmp_path: Path
) -> None:
    program = tmp_path / "report.py"
    program.write_text(JOB_PROGRAM)
    program.chmod(0o644)
    tmp_path.chmod(0o755)
    clusters = netns_grid.clusters
    collectors = {c.name: Collector(c.host_address) for c in clusters}
    # Listens only on the host's own loopback: no job may reach it.
    host_loopback = socket.create_server(("127.0.0.1", 0))
    loop_port = host_loopback.getsockname()[1]
    try:
        jobs = {}
        # Submitted with each cluster's own sbatch (every release; in a chroot the job
        # runs the suite's interpreter through the grid's bind mounts).
        for i, cluster in enumerate(clusters):
            other = clusters[(i + 1) % len(clusters)]
            command = (
                f"{sys.executable} {program} {cluster.host_address} "
                f"{collectors[cluster.name].port} {loop_port} {other.rest_url[7:]}"
            )
            out = tmp_path / f"{cluster.name}-%j.out"
            jobs[cluster.name] = cluster.sbatch(command, cwd=tmp_path, name="netcheck", output=out)
        for cluster in clusters:
            job_id = jobs[cluster.name]
            job = cluster.wait_job(job_id)
            output = tmp_path / f"{cluster.name}-{job_id}.out"
            assert job["JobState"] == "COMPLETED", (cluster.name, job, output.read_text())
    finally:
        for collector in collectors.values():
            collector.close()
        host_loopback.close()

    all_addresses = {c.address for c in clusters} | {c.host_address for c in clusters}
    for cluster in clusters:
        reports = collectors[cluster.name].reports
        assert len(reports) == 1, (cluster.name, reports)
        peer, report = reports[0]
        # The server on cluster k's host side saw cluster k's namespace address...
        assert peer == cluster.address
        # ...from a job of cluster k (its name and its id range), nobody else's.
        assert report["cluster"] == cluster.name
        assert report["job_id"] == jobs[cluster.name]
        assert int(str(report["job_id"])) >= cluster.first_job_id
        # Inside, the job sees loopback and its own veth end only.
        addrs = report["addrs"]
        assert isinstance(addrs, list)
        assert sorted(addrs) == sorted(["127.0.0.1", cluster.address])
        assert not (set(addrs) & (all_addresses - {cluster.address}))
        assert report["host_loopback_reached"] is False
        # Clusters reach each other through the host (a multi-cluster program needs it).
        assert report["other_cluster_reached"] is True


# --------------------------------------------------------------------------- ticks


@pytest.fixture(scope="module")
def tick_cluster(netns_grid: SlurmGrid) -> Iterator[SlurmCluster]:
    """A one-node cluster of its own, started with TICK_S-second scheduler ticks (the
    session grid's clusters stay fast), in a network namespace too."""
    base = Path(tempfile.mkdtemp(prefix="gridcore-slurm-tick-"))
    # The host's release: the test reads start times through the adapter (SlurmSite).
    layout = ClusterLayout("tick", (4,), 9000, 10.0, sched_interval_s=TICK_S, release="22.05")
    try:
        grid = start_grid(base, (layout,), network=netns_grid.network)
        try:
            yield grid.cluster("tick")
        finally:
            stop_grid(grid)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_session_grid_is_fast_by_default(slurm_grid: SlurmGrid) -> None:
    assert [scheduler_interval(c) for c in slurm_grid.clusters] == [None, None, None]


def test_jobs_start_only_on_ticks_until_reconfigured_fast(tick_cluster: SlurmCluster) -> None:
    assert scheduler_interval(tick_cluster) == TICK_S
    with SlurmSite(site_spec(tick_cluster), tick_cluster.token) as site:

        def job() -> JobSubmission:
            return JobSubmission(name="tick", command="true", processors=1)

        # Three jobs submitted 0.5, 2.5 and 4.5 s after a probe started must each wait
        # for a tick: they start together, or (a loaded machine's submissions straddling
        # a tick: the full suite saw it) on ticks TICK_S apart, never at their own
        # moments. Slurm's times are whole seconds: 1.5 s of slack. (The probe's own
        # start does not mark the ticks' phase: it was seen 7 s off them.)
        wait_started(site, site.submit(job()), timeout_s=3 * TICK_S)
        batch = []
        for delay in (0.5, 2.0, 2.0):
            time.sleep(delay)
            batch.append(site.submit(job()))
        on_tick = [wait_started(site, j, timeout_s=3 * TICK_S) for j in batch]
        submits = [float(s.submitted_at or 0) for s in on_tick]
        starts = [float(s.started_at or 0) for s in on_tick]
        print(f"tick {TICK_S} s: submitted {submits} started {starts}")
        assert max(submits) - min(submits) >= 3  # submitted at different moments...
        for submitted, started in zip(submits, starts, strict=True):
            phase = (started - min(starts)) % TICK_S
            assert min(phase, TICK_S - phase) <= 1.5, starts  # ...started on ticks...
            assert 0 <= started - submitted <= TICK_S + 1.5, (submitted, started)  # the next
        # ...and those submitted between the same two ticks together
        assert len({round((t - min(starts)) / TICK_S) for t in starts}) < len(starts), starts

        # Live, no restart: 1-second ticks. The old grid still gives one more tick.
        assert set_scheduler_interval(tick_cluster, 1) is False
        assert scheduler_interval(tick_cluster) == 1
        wait_started(site, site.submit(job()), timeout_s=3 * TICK_S)
        one_by_one = []
        for _ in range(3):
            one_by_one.append(wait_started(site, site.submit(job()), timeout_s=3 * TICK_S))
            time.sleep(3)
        starts = sorted(float(s.started_at or 0) for s in one_by_one)
        waits = [float((s.started_at or 0) - (s.submitted_at or 0)) for s in one_by_one]
        print(f"after reconfigure to 1 s: waits {waits} starts {starts}")
        # Submitted 3 s apart, they no longer wait for a common tick.
        assert min(b - a for a, b in itertools.pairwise(starts)) >= 2
        assert max(waits) < TICK_S / 2
