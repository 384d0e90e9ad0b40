"""The Slurm adapter's contract on every release the test grid runs (test ids name the
release): alpha runs 26.05 (REST v0.0.45), beta 22.05 (v0.0.38), gamma 24.11 (v0.0.42).

Per release: the version and release are found by asking the server; submit with the
resources clusters require, find by key, status, observe, output, cancel; requeue and
hold by Slurm's own ``scontrol``; a request no node can run refused with no new Slurm
job; a wrong token reported as a credential problem; a ``command`` token that expires
while a job runs renewed without losing the job. Every request body the adapter sends
here is checked against the running server's own OpenAPI spec (``GET /openapi/v3``): a
field the server does not know fails the test.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import requests

from gridcore.credentials import TokenSource
from gridcore.errors import CredentialRejected, RequestError, SiteRejected
from gridcore.model import (
    CredentialRef,
    JobResources,
    JobState,
    JobStatus,
    JobSubmission,
)
from gridcore.sites.slurm import FixedToken, SlurmSite, TokenProvider
from tests.slurm.conftest import site_spec
from tests.slurm_openapi import fetch_live_spec, request_body_errors
from tests.slurmgrid import SlurmCluster, SlurmGrid

pytestmark = pytest.mark.slurm

RELEASES = {"alpha": "26.05", "beta": "22.05", "gamma": "24.11"}
CLUSTERS = [pytest.param(name, id=f"{release}-{name}") for name, release in RELEASES.items()]
_SPECS: dict[str, dict[str, Any]] = {}


@dataclass
class Sent:
    """Every request a session made: (method, url, JSON body or None, token header)."""

    requests: list[tuple[str, str, Any, str]] = field(default_factory=list)

    def hook(self, response: requests.Response, *args: object, **kwargs: object) -> None:
        sent = response.request
        body = sent.body
        text = body.decode() if isinstance(body, bytes) else body
        token = str(sent.headers.get("X-SLURM-USER-TOKEN", ""))
        payload = None if not text else json.loads(text)
        self.requests.append((str(sent.method), str(sent.url), payload, token))


@dataclass
class Adapter:
    cluster: SlurmCluster
    sent: Sent
    make: Callable[..., SlurmSite]


@pytest.fixture(params=CLUSTERS)
def adapter(request: pytest.FixtureRequest, slurm_grid: SlurmGrid) -> Iterator[Adapter]:
    """Adapters on one cluster whose requests are recorded; after the test, every body
    sent is validated against that server's own spec."""
    cluster = slurm_grid.cluster(str(request.param))
    sent = Sent()
    made: list[SlurmSite] = []
    sessions: list[requests.Session] = []

    def make(tokens: TokenProvider | None = None, **spec_changes: Any) -> SlurmSite:
        session = requests.Session()
        session.hooks["response"].append(sent.hook)
        sessions.append(session)
        spec = replace(site_spec(cluster), **spec_changes)
        # listing_max_age_s=0: every status read sees what Slurm says now
        site = SlurmSite(
            spec, tokens or FixedToken(cluster.token), session=session, listing_max_age_s=0
        )
        made.append(site)
        return site

    yield Adapter(cluster, sent, make)
    for site in made:
        site.close()
    for session in sessions:
        session.close()
    assert_bodies_valid(cluster, sent)


def assert_bodies_valid(cluster: SlurmCluster, sent: Sent) -> None:
    bodies = [(m, u, b) for m, u, b, _ in sent.requests if b is not None]
    if not bodies:
        return
    spec = _SPECS.get(cluster.rest_url)
    if spec is None:
        headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": cluster.token}
        spec = _SPECS[cluster.rest_url] = fetch_live_spec(cluster.rest_url, headers)
    for method, url, body in bodies:
        path = url.removeprefix(cluster.rest_url).split("?", 1)[0]
        errors = request_body_errors(spec, method, path, body)
        assert errors == [], f"{method} {path} on Slurm {cluster.release}: {errors}"


def wait_status(
    site: SlurmSite, job_id: str, done: Callable[[JobStatus], bool], timeout_s: float = 60.0
) -> JobStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        status = site.status(job_id)
        if done(status):
            return status
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} at {site}: still {status} after {timeout_s} s")
        time.sleep(0.3)


def slurm_job_count(cluster: SlurmCluster) -> int:
    """How many jobs the controller knows (its own squeue, every state)."""
    done = cluster.cli(["squeue", "-h", "-a", "-t", "all", "-o", "%i"], check=True)
    return len(done.stdout.split())


def ensure_account(cluster: SlurmCluster, account: str) -> None:
    """The account and root's association with it, in the cluster's slurmdbd."""
    for argv in (
        ["sacctmgr", "-i", "add", "account", account, f"cluster={cluster.name}"],
        ["sacctmgr", "-i", "add", "user", "root", f"account={account}", f"cluster={cluster.name}"],
    ):
        done = cluster.cli(argv, timeout=30)
        assert done.returncode == 0 or "already exists" in done.stdout + done.stderr, done
    # slurmctld learns new associations from slurmdbd asynchronously
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        listed = cluster.cli(["sacctmgr", "-n", "-P", "show", "assoc", f"account={account}"])
        if "root" in listed.stdout:
            return
        time.sleep(0.3)


def scontrol(cluster: SlurmCluster, *args: str) -> None:
    cluster.cli(["scontrol", *args], check=True, timeout=20)


def test_the_version_and_release_are_asked_of_the_server(adapter: Adapter) -> None:
    site = adapter.make()
    assert site.api_version == adapter.cluster.api_version
    release = site.release
    assert release is not None and release.startswith(adapter.cluster.release)
    site.ping()
    obs = site.observe()
    assert (obs.release, obs.api_version) == (release, adapter.cluster.api_version)


def test_submit_find_status_output_observe_with_the_resources_clusters_require(
    adapter: Adapter,
) -> None:
    site = adapter.make()
    if adapter.cluster.accounting:
        # With slurmdbd an account must exist (else Slurm runs the job under the user's
        # default account); without it, any account name is recorded as given.
        ensure_account(adapter.cluster, "proj")
    key = f"gc-contract-{uuid.uuid4().hex[:12]}"
    resources = JobResources(time_limit_s=300, memory_mib=64, account="proj", qos="normal")
    job = JobSubmission(
        name="contract",
        command="echo out; echo err >&2; sleep 1",
        processors=2,
        env={"GRIDCORE_MEMBER": "m1"},
        key=key,
        resources=resources,
    )
    job_id = site.submit(job)
    assert site.find(key) == job_id
    # What Slurm itself holds of the request.
    shown = adapter.cluster.show_job(job_id)
    assert shown["TimeLimit"] == "00:05:00", shown
    assert shown["MinMemoryNode"] == "64M", shown
    assert shown["Account"] == "proj", shown
    assert shown["NumCPUs"] == "2", shown
    assert any(j.job_id == job_id and j.key == key for j in site.observe().jobs)
    status = wait_status(site, job_id, lambda s: s.state.finished)
    assert (status.state, status.exit_code) == (JobState.COMPLETED, 0), status
    assert status.submitted_at and status.started_at and status.finished_at
    files = site.output_files(job_id)  # paths the same on this host and in the chroot
    assert Path(files.stdout).read_text() == "out\n"
    assert Path(files.stderr).read_text() == "err\n"


def test_cancel(adapter: Adapter) -> None:
    site = adapter.make()
    job_id = site.submit(JobSubmission(name="long", command="sleep 60", processors=1))
    wait_status(site, job_id, lambda s: s.state is JobState.RUNNING)
    site.cancel(job_id)
    status = wait_status(site, job_id, lambda s: s.state.finished, timeout_s=20)
    assert status.state is JobState.CANCELLED
    site.cancel(job_id)  # a finished job: nothing to do, no error


def test_a_requeued_then_held_job_is_pending_never_failed(adapter: Adapter) -> None:
    site, cluster = adapter.make(), adapter.cluster
    job_id = site.submit(JobSubmission(name="requeue", command="sleep 60", processors=1))
    try:
        wait_status(site, job_id, lambda s: s.state is JobState.RUNNING)
        scontrol(cluster, "requeue", job_id)
        requeued = wait_status(site, job_id, lambda s: s.state is not JobState.RUNNING)
        assert requeued.state is JobState.PENDING, requeued
        assert (requeued.requeued_by, requeued.restarts) == ("REQUEUED", 1), requeued
        assert requeued.exit_code is None and requeued.finished_at is None
        scontrol(cluster, "hold", job_id)
        held = wait_status(site, job_id, lambda s: s.held)
        assert held.state is JobState.PENDING and "JobHeld" in held.reason, held
        scontrol(cluster, "release", job_id)
        released = wait_status(site, job_id, lambda s: not s.held)
        assert released.state in (JobState.PENDING, JobState.RUNNING), released
    finally:
        site.cancel(job_id)
    assert wait_status(site, job_id, lambda s: s.state.finished).state is JobState.CANCELLED


@pytest.mark.parametrize(
    ("processors", "resources", "field_named"),
    [
        (64, JobResources(), "processors: 64 exceeds the largest node"),
        (1, JobResources(gpus=1), "gpus: 1 exceeds the most GPUs of a node"),
        (1, JobResources(memory_mib=8000), "memory: 8000 MiB per node exceeds"),
        (1, JobResources(partition="nope"), "partition: 'nope' is not a partition"),
    ],
    ids=["cpus", "gpus", "memory", "partition"],
)
def test_a_request_no_node_can_run_is_refused_before_slurm_sees_it(
    adapter: Adapter, processors: int, resources: JobResources, field_named: str
) -> None:
    # 26.05 would accept such a job (warnings only) and let it pend for ever.
    site = adapter.make()
    before = slurm_job_count(adapter.cluster)
    job = JobSubmission(name="huge", command="true", processors=processors, resources=resources)
    with pytest.raises(RequestError) as err:
        site.submit(job)
    assert field_named in str(err.value)
    assert [m for m, *_ in adapter.sent.requests].count("POST") == 0
    assert slurm_job_count(adapter.cluster) == before


def test_a_wrong_token_is_a_credential_error_not_a_dead_site(
    adapter: Adapter, slurm_grid: SlurmGrid
) -> None:
    other = next(c for c in slurm_grid.clusters if c.name != adapter.cluster.name)
    site = adapter.make(FixedToken(other.token, "env:SOMEONE_ELSES_TOKEN"))
    for call in (site.ping, site.observe, lambda: site.status(str(adapter.cluster.first_job_id))):
        with pytest.raises((CredentialRejected, SiteRejected)) as err:
            call()
        text = str(err.value)
        assert other.token not in text and other.token not in repr(err.value)
        if adapter.cluster.release == "22.05":
            # 22.05 answers a refused token as it answers a dead controller (error -1)
            assert "check the token reference" in text
        else:
            assert isinstance(err.value, CredentialRejected), text
            assert "env:SOMEONE_ELSES_TOKEN" in text
    # every call went out with the wrong token (and came back refused, above)
    assert [t for *_, t in adapter.sent.requests if t == other.token]


def test_a_command_token_that_expires_while_the_job_runs_is_renewed(adapter: Adapter) -> None:
    """``scontrol token lifespan=8``, run again before each JWT's exp: a job that
    outlives two tokens is followed to its end."""
    cluster = adapter.cluster
    command = shlex.join(cluster.cli_argv(["scontrol", "token", "username=root", "lifespan=8"]))
    ref = CredentialRef(command=command)
    tokens = TokenSource(ref, cluster.name)
    site = adapter.make(tokens, token=ref)
    job_id = site.submit(JobSubmission(name="outlive", command="sleep 12", processors=1))
    status = wait_status(site, job_id, lambda s: s.state.finished, timeout_s=90)
    assert status.state is JobState.COMPLETED, status
    used = {t for *_, t in adapter.sent.requests}
    assert len(used) >= 2, "the command's token was never renewed"


def test_the_contract_ran_on_three_releases(slurm_grid: SlurmGrid) -> None:
    assert sorted(c.release for c in slurm_grid.clusters) == ["22.05", "24.11", "26.05"]
    assert {c.name: c.release for c in slurm_grid.clusters} == RELEASES
