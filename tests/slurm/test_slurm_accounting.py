"""Slurm accounting on the real grid, through the adapter (``SlurmSite``).

The session grid gives one cluster accounting (``tests/slurmgrid.py``: alpha, Slurm 26.05,
with a slurmdbd of its own and a fresh MariaDB database): what a finished job used comes
from slurmdbd, a job slurmctld forgot (MinJobAge) is still found by its submission key
and read from slurmdbd, and a cluster without accounting is never asked for it.

Without a reachable MariaDB the grid starts without accounting: these tests then skip,
except on CI (``CI=true``), where they fail.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gridcore.errors import UnknownJob
from gridcore.model import JobState, JobStatus, JobSubmission
from gridcore.sites.slurm import SlurmSite
from tests import slurmgrid
from tests.slurm.conftest import site_spec
from tests.slurmgrid import SlurmCluster, SlurmGrid, set_min_job_age

MIB = 2**20
# About 3 s of busy CPU with 50 MiB held: python3 of the cluster's release (in its chroot).
BUSY = (
    'python3 -c "import time; x = bytearray(50 * 2**20); t = time.time(); '
    'any(time.time() - t > 3 for _ in iter(int, 1))"'
)


@pytest.fixture(scope="module")
def accounted(slurm_grid: SlurmGrid) -> SlurmCluster:
    for cluster in slurm_grid.clusters:
        if cluster.accounting:
            return cluster
    reason = "no cluster of the test grid has accounting (is MariaDB reachable as root?)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def unaccounted(slurm_grid: SlurmGrid) -> SlurmCluster:
    return next(c for c in slurm_grid.clusters if not c.accounting)


class Calls:
    """Every URL a SlurmSite asked (through a session of its own)."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.session = requests.Session()
        self.session.hooks["response"].append(self._seen)

    def _seen(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        self.urls.append(response.url)

    def accounting(self) -> list[str]:
        return [url for url in self.urls if "/slurmdb/" in url]


@pytest.fixture
def calls() -> Iterator[Calls]:
    seen = Calls()
    try:
        yield seen
    finally:
        seen.session.close()


def wait_for(check: Callable[[], Any], what: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.5)


def finished(site: SlurmSite, job_id: str, timeout_s: float = 60) -> JobStatus:
    status: JobStatus = wait_for(
        lambda: (s := site.status(job_id)).state.finished and s, f"job {job_id} to end", timeout_s
    )
    return status


def key() -> str:
    return f"gc-acct-{secrets.token_hex(4)}"


def forgotten(cluster: SlurmCluster, job_id: str) -> bool:
    """slurmctld answers that it does not know the job (not merely: no answer)."""
    done = cluster.cli(["scontrol", "show", "job", job_id])
    return done.returncode != 0 and "invalid job id" in done.stderr.lower()


def test_a_finished_job_reports_what_it_used(
    accounted: SlurmCluster, tmp_path: Path, calls: Calls
) -> None:
    site = SlurmSite(site_spec(accounted), accounted.token, calls.session)
    job = JobSubmission(name="acct-busy", command=BUSY, processors=1, workdir=str(tmp_path))
    job_id = site.submit(job)
    finished(site, job_id)
    # slurmdbd gets the job's end a moment after slurmctld: usage comes once it has it.
    status = wait_for(lambda: (s := site.status(job_id)).usage and s, "its usage", 30)
    usage = status.usage
    print(f"job {job_id} on {accounted.name}: {usage.as_json()}")
    assert status.state is JobState.COMPLETED, (status, (tmp_path / f"slurm-{job_id}.out"))
    assert usage.elapsed_s >= 3
    assert usage.cpus == 1
    assert usage.cpu_time_s > 0.5  # a busy loop of about 3 s, on a shared 2-core machine
    assert usage.max_rss_bytes is not None and usage.max_rss_bytes >= 50 * MIB
    assert usage.cpu_efficiency is not None and 0 < usage.cpu_efficiency <= 1.5
    assert calls.accounting(), "the usage came from slurmdbd's API"
    sacct = accounted.cli(
        ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State"], check=True
    )
    assert sacct.stdout.split() == [f"{job_id}|COMPLETED"]  # the release's own sacct


def test_a_job_slurmctld_forgot_is_found_in_accounting(
    accounted: SlurmCluster, tmp_path: Path, calls: Calls
) -> None:
    site = SlurmSite(site_spec(accounted), accounted.token, calls.session)
    submission_key = key()
    job = JobSubmission(
        name="acct-forgotten", command="sleep 1; exit 3", processors=1, workdir=str(tmp_path),
        key=submission_key,
    )  # fmt: skip
    submitted_at = time.time()
    job_id = site.submit(job)
    assert finished(site, job_id).state is JobState.FAILED
    # slurmctld forgets finished jobs after MinJobAge (300 s on the grid); 10 s for now.
    previous = set_min_job_age(accounted, 10)
    try:
        began = time.monotonic()
        wait_for(lambda: forgotten(accounted, job_id), f"slurmctld to forget {job_id}", 40)
        print(f"job {job_id} forgotten {time.monotonic() - began:.1f} s after reconfigure")
    finally:
        set_min_job_age(accounted, previous)
    # the retry of a holder made before the submission looks back to then in slurmdbd
    assert site.find(submission_key, since=submitted_at - 5) == job_id
    assert site.find(submission_key) is None  # no holder time: only what slurmctld lists
    status = site.status(job_id)
    assert (status.state, status.exit_code) == (JobState.FAILED, 3)
    assert status.finished_at is not None and status.started_at is not None
    assert status.usage is not None and status.usage.elapsed_s >= 1
    assert any(url.endswith(f"/job/{job_id}") for url in calls.accounting())
    # Neither slurmctld nor slurmdbd knows this one.
    with pytest.raises(UnknownJob):
        site.status("999999")
    assert site.find(key(), since=submitted_at) is None


def test_a_cluster_without_accounting_is_never_asked(
    unaccounted: SlurmCluster, tmp_path: Path, calls: Calls
) -> None:
    site = SlurmSite(site_spec(unaccounted), unaccounted.token, calls.session)
    submission_key = key()
    job = JobSubmission(
        name="no-acct", command="true", processors=1, workdir=str(tmp_path), key=submission_key
    )
    job_id = site.submit(job)
    status = finished(site, job_id)
    assert status.state is JobState.COMPLETED and status.usage is None
    assert site.find(submission_key) == job_id
    # not in /jobs: a site with accounting would ask slurmdbd
    assert site.find(key(), since=time.time() - 60) is None
    with pytest.raises(UnknownJob):
        site.status("999999")
    assert calls.urls, "the site's calls went through the counted session"
    assert calls.accounting() == []


def database_exists(name: str) -> bool:
    return bool(slurmgrid._mysql_checked(f"SHOW DATABASES LIKE '{name}'").strip())


# A grid of one small cluster with accounting (loopback: quickest to start), in a process
# of its own that the test kills as a crashed test run would die.
CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tests.slurmgrid import ClusterLayout, start_grid
    layout = ClusterLayout("crash", (2,), 9000, 100.0, release=sys.argv[2], accounting=True)
    start_grid(Path(sys.argv[1]), [layout], network="loopback")
    print("ready", flush=True)
    time.sleep(600)
    """
)


def test_a_killed_runs_slurmdbd_and_database_go_at_the_next_start(
    slurm_grid: SlurmGrid, accounted: SlurmCluster
) -> None:
    names = slurmgrid._read_accounting(slurm_grid.dir)
    assert names and all(database_exists(name) for name in names)  # the session grid's
    base = Path(tempfile.mkdtemp(prefix="gridcore-crash-"))
    base.chmod(0o755)
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(base), accounted.release],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        [name] = slurmgrid._read_accounting(base)
        dbd = slurmgrid._pid_of(base / "crash" / "slurmdbd.pid", "slurmdbd")
        assert dbd is not None and database_exists(name)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        assert name in slurmgrid.cleanup_stale_databases()  # what start_grid runs first
        assert not database_exists(name)
        assert not slurmgrid._mysql_checked(f"SELECT User FROM mysql.user WHERE User='{name}'")
        assert slurmgrid._wait_gone([dbd], 10) == []
        assert all(database_exists(n) for n in names)  # a live grid's are kept
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
        slurmgrid.stop_grid_dir(base)
        shutil.rmtree(base, ignore_errors=True)
