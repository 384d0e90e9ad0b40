"""SlurmSite against the real three-cluster grid (alpha 16, beta 8+8, gamma 4 CPUs).

Tests run in file order on one session-wide grid: the idle check comes before any job.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gridcore.errors import SiteUnavailable, UnknownJob
from gridcore.model import JobState, JobStatus, JobSubmission, SiteObservation
from gridcore.sites.slurm import SlurmSite
from tests.slurm.conftest import site_spec
from tests.slurmgrid import ClusterLayout, SlurmGrid, start_grid, stop_grid

pytestmark = pytest.mark.slurm

EXPECTED_CPUS = {"alpha": 16, "beta": 16, "gamma": 4}
FIRST_JOB_ID = {"alpha": 1000, "beta": 2000, "gamma": 3000}


def wait_until(
    site: SlurmSite, job_id: str, done: Callable[[JobStatus], bool], timeout_s: float = 30.0
) -> tuple[list[JobState], JobStatus]:
    """Poll the job until ``done``; returns every state seen, in order, and the last status."""
    seen: list[JobState] = []
    deadline = time.monotonic() + timeout_s
    while True:
        status = site.status(job_id)
        if not seen or seen[-1] is not status.state:
            seen.append(status.state)
        if done(status):
            return seen, status
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} at {site}: still {status.state} after {timeout_s} s")
        time.sleep(0.2)


def finished(status: JobStatus) -> bool:
    return status.state.finished


def running(status: JobStatus) -> bool:
    return status.state is JobState.RUNNING


def wait_observation(
    site: SlurmSite, ok: Callable[[SiteObservation], bool], timeout_s: float = 15.0
) -> SiteObservation:
    deadline = time.monotonic() + timeout_s
    while True:
        obs = site.observe()
        if ok(obs) or time.monotonic() > deadline:
            return obs
        time.sleep(0.2)


@pytest.fixture
def other_site(slurm_grid: SlurmGrid) -> Iterator[Callable[..., SlurmSite]]:
    """Builds extra adapters (wrong token, dead port) and closes them afterwards."""
    made: list[SlurmSite] = []

    def make(cluster: str, token: str, **spec_changes: object) -> SlurmSite:
        spec = replace(site_spec(slurm_grid.cluster(cluster)), **spec_changes)
        made.append(SlurmSite(spec, token))
        return made[-1]

    yield make
    for site in made:
        site.close()


def test_grid_files_describe_the_clusters(slurm_grid: SlurmGrid) -> None:
    doc = tomllib.loads(slurm_grid.grid_toml.read_text())
    assert doc["version"] == 1
    assert {name: s["processors"] for name, s in doc["sites"].items()} == EXPECTED_CPUS
    for cluster in slurm_grid.clusters:
        site = doc["sites"][cluster.name]
        assert site["url"] == cluster.rest_url
        assert site["token"] == {"env": cluster.token_env}
        assert Path(site["storage_dir"]).is_dir()
        assert slurm_grid.env[cluster.token_env] == cluster.token
    assert doc["bandwidth"]["origin"] == {"alpha": 200.0, "beta": 100.0, "gamma": 50.0}
    assert cluster.token not in repr(slurm_grid)


def test_ping_each_cluster(slurm_sites: dict[str, SlurmSite]) -> None:
    assert sorted(slurm_sites) == ["alpha", "beta", "gamma"]
    for site in slurm_sites.values():
        site.ping()


def test_observe_all_idle_when_nothing_runs(slurm_sites: dict[str, SlurmSite]) -> None:
    # The session grid is shared: earlier tests' jobs stay listed as finished for
    # MinJobAge (300 s), so "nothing runs" means no unfinished job.
    for name, site in slurm_sites.items():
        deadline = time.time() + 60
        obs = site.observe()
        while any(not j.state.finished for j in obs.jobs) and time.time() < deadline:
            time.sleep(0.5)
            obs = site.observe()
        assert obs.site == name
        assert obs.total_processors == EXPECTED_CPUS[name]
        assert obs.idle_processors == EXPECTED_CPUS[name]
        assert [j for j in obs.jobs if not j.state.finished] == []
        assert obs.observed_at > 0


def test_jobs_complete_on_every_cluster(slurm_sites: dict[str, SlurmSite]) -> None:
    # Submit everywhere first: each controller's start-up scheduling delay then overlaps.
    submitted = {
        name: site.submit(
            JobSubmission(name=f"hello-{name}", command="sleep 2; echo hi", processors=2)
        )
        for name, site in slurm_sites.items()
    }
    # Poll all three together, so no job can finish unobserved while we wait on another.
    seen: dict[str, list[JobState]] = {name: [] for name in submitted}
    final: dict[str, JobStatus] = {}
    deadline = time.monotonic() + 30
    while len(final) < len(submitted) and time.monotonic() < deadline:
        for name, job_id in submitted.items():
            status = slurm_sites[name].status(job_id)
            if not seen[name] or seen[name][-1] is not status.state:
                seen[name].append(status.state)
            if status.state.finished:
                final[name] = status
        time.sleep(0.2)
    for name, job_id in submitted.items():
        assert int(job_id) >= FIRST_JOB_ID[name]
        site = slurm_sites[name]
        assert seen[name][0] in (JobState.PENDING, JobState.RUNNING), seen
        status = final[name]
        assert status.state is JobState.COMPLETED, status
        assert status.exit_code == 0
        assert status.submitted_at and status.started_at and status.finished_at
        assert status.submitted_at <= status.started_at <= status.finished_at
        workdir = Path(site.spec.storage_dir or "")
        assert (workdir / f"hello-{name}-{job_id}.out").read_text() == "hi\n"
        assert (workdir / f"hello-{name}-{job_id}.err").read_text() == ""
        assert any(j.job_id == job_id and j.processors == 2 for j in site.observe().jobs)


def test_environment_and_workdir_reach_the_job(
    slurm_sites: dict[str, SlurmSite], tmp_path: Path
) -> None:
    site = slurm_sites["alpha"]
    job = JobSubmission(
        name="envcheck",
        command='echo "$GRIDCORE_MEMBER $(pwd)"',
        processors=1,
        workdir=str(tmp_path),
        env={"GRIDCORE_MEMBER": "m7"},
    )
    job_id = site.submit(job)
    _, status = wait_until(site, job_id, finished)
    assert status.state is JobState.COMPLETED
    assert (tmp_path / f"envcheck-{job_id}.out").read_text() == f"m7 {tmp_path}\n"


def test_nonzero_exit_is_failed_with_its_code(slurm_sites: dict[str, SlurmSite]) -> None:
    site = slurm_sites["beta"]
    job_id = site.submit(JobSubmission(name="exit3", command="exit 3", processors=1))
    _, status = wait_until(site, job_id, finished)
    assert status.state is JobState.FAILED
    # slurmrestd reports the raw wait status (768); the adapter decodes it.
    assert status.exit_code == 3
    assert "NonZeroExitCode" in status.reason


def test_cancel_running_job(slurm_sites: dict[str, SlurmSite]) -> None:
    site = slurm_sites["alpha"]
    job_id = site.submit(JobSubmission(name="long", command="sleep 60", processors=4))
    wait_until(site, job_id, running)
    site.cancel(job_id)
    _, status = wait_until(site, job_id, finished, timeout_s=15)
    assert status.state is JobState.CANCELLED
    assert status.finished_at is not None
    # Cancelling a finished job is a no-op.
    site.cancel(job_id)
    assert site.status(job_id).state is JobState.CANCELLED


def test_busy_gamma_shows_no_idle_cpus(slurm_sites: dict[str, SlurmSite]) -> None:
    site = slurm_sites["gamma"]
    job_id = site.submit(JobSubmission(name="fill", command="sleep 60", processors=4))
    try:
        wait_until(site, job_id, running)
        obs = site.observe()
        assert (obs.total_processors, obs.idle_processors) == (4, 0)
        mine = [j for j in obs.jobs if j.job_id == job_id]
        assert [(j.processors, j.state) for j in mine] == [(4, JobState.RUNNING)]
        # A second job must queue behind it and show up as pending.
        queued = site.submit(JobSubmission(name="queued", command="true", processors=1))
        assert site.status(queued).state is JobState.PENDING
        pending = {j.job_id for j in site.observe().pending()}
        assert queued in pending
        site.cancel(queued)
    finally:
        site.cancel(job_id)
    obs = wait_observation(site, lambda o: o.idle_processors == 4)
    assert obs.idle_processors == 4


def test_drained_node_leaves_the_total(
    slurm_grid: SlurmGrid, slurm_sites: dict[str, SlurmSite]
) -> None:
    cluster = slurm_grid.cluster("beta")
    site = slurm_sites["beta"]

    def scontrol(*args: str) -> None:
        cluster.cli(["scontrol", *args], check=True, timeout=20)

    scontrol("update", "nodename=beta-n2", "state=drain", "reason=gridcore-test")
    try:
        obs = wait_observation(site, lambda o: o.total_processors == 8)
        assert (obs.total_processors, obs.idle_processors) == (8, 8)
    finally:
        scontrol("update", "nodename=beta-n2", "state=resume")
    obs = wait_observation(site, lambda o: o.total_processors == 16)
    assert (obs.total_processors, obs.idle_processors) == (16, 16)


def test_unknown_job(slurm_sites: dict[str, SlurmSite]) -> None:
    site = slurm_sites["beta"]
    with pytest.raises(UnknownJob, match="Invalid job id specified"):
        site.status("999999")
    with pytest.raises(UnknownJob):
        site.cancel("999999")
    with pytest.raises(UnknownJob, match="not a Slurm job id"):
        site.status("../nodes")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_dead_port_is_unavailable(
    slurm_grid: SlurmGrid, other_site: Callable[..., SlurmSite]
) -> None:
    token = slurm_grid.cluster("alpha").token
    site = other_site("alpha", token, url=f"http://127.0.0.1:{free_port()}", timeout_s=2.0)
    for call in (site.ping, site.observe):
        with pytest.raises(SiteUnavailable) as err:
            call()
        assert token not in str(err.value)
    with pytest.raises(SiteUnavailable):
        site.submit(JobSubmission(name="nowhere", command="true", processors=1))


def test_token_never_shown(slurm_grid: SlurmGrid, slurm_sites: dict[str, SlurmSite]) -> None:
    for cluster in slurm_grid.clusters:
        site = slurm_sites[cluster.name]
        assert cluster.token not in repr(site)
        assert cluster.token not in str(site)
        assert cluster.token not in repr(cluster)
        assert cluster.token not in str(vars(site.spec))
    assert all(t not in os.environ.values() for t in slurm_grid.env.values())


def test_stop_grid_leaves_nothing_running(slurm_grid: SlurmGrid) -> None:
    # A second, one-node grid of its own, so stopping it cannot disturb the session grid.
    base = Path(tempfile.mkdtemp(prefix="gridcore-slurm-stop-"))
    try:
        grid = start_grid(base, (ClusterLayout("solo", (2,), 5000, 10.0),))
        try:
            cluster = grid.cluster("solo")
            assert cluster.rest_url not in {c.rest_url for c in slurm_grid.clusters}
            with SlurmSite(site_spec(cluster), cluster.token) as site:
                job_id = site.submit(
                    JobSubmission(
                        name="orphan", command="echo $$ > pid; exec sleep 300", processors=1
                    )
                )
                wait_until(site, job_id, running)
            pid_file = cluster.storage_dir / "pid"
            wait_for_file = time.monotonic() + 10
            while not pid_file.exists() and time.monotonic() < wait_for_file:
                time.sleep(0.1)
            job_pid = int(pid_file.read_text())
            daemon_pids = [int(p.read_text()) for p in base.glob("**/*.pid")]
            assert len(daemon_pids) == 4  # munged, slurmctld, slurmd, slurmrestd
        finally:
            stop_grid(grid)
        stop_grid(grid)  # idempotent
        assert list(base.glob("**/*.pid")) == []
        for pid in [*daemon_pids, job_pid]:
            assert not alive(pid), pid
    finally:
        shutil.rmtree(base, ignore_errors=True)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
