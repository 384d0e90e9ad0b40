"""What the wait models read from a site's job list (issue 22 item 5): each job's user,
time limit, end, and Slurm's start estimate of a pending job, in the shapes of the three
REST versions the supported releases are spoken to in (22.05: v0.0.38, 24.11: v0.0.42,
26.05: v0.0.45), checked against SchedMD's stored specs; and the local site's."""

from __future__ import annotations

import getpass
import time
from pathlib import Path
from typing import Any

import pytest

from gridcore.model import JobResources, JobState, JobSubmission, SiteKind, SiteSpec
from gridcore.sites import slurm_api as api
from gridcore.sites.local import LocalSite
from gridcore.sites.slurm import SlurmSite
from gridcore.state.store import open_store
from tests.slurm_openapi import load_spec

RELEASE_VERSIONS = ("v0.0.38", "v0.0.42", "v0.0.45")


def _job_schema(spec: dict[str, Any], version: str) -> dict[str, Any]:
    schemas = spec["components"]["schemas"]
    name = f"{version}_job_info" if f"{version}_job_info" in schemas else None
    if name is None:  # v0.0.38
        name = f"{version}_job_response_properties"
    return dict(schemas[name]["properties"])


@pytest.mark.parametrize("version", RELEASE_VERSIONS)
def test_every_field_read_is_in_that_versions_job_schema(version: str) -> None:
    fields = _job_schema(load_spec(version), version)
    for name in ("time_limit", "user_name", "start_time", "end_time", "submit_time"):
        assert name in fields, f"{version}: {name}"
    limit = fields["time_limit"]
    # v0.0.38 a bare integer of minutes; later an {set, infinite, number} struct
    assert ("$ref" in limit) == (version != "v0.0.38")


def _number(version: str, value: int | None, *, infinite: bool = False) -> Any:
    if version == "v0.0.38":
        return 0xFFFFFFFF if infinite else (value or 0)
    return {"set": value is not None, "infinite": infinite, "number": value or 0}


def _raw(version: str, state: str, **times: int | None) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "job_id": 7,
        "job_state": state if version == "v0.0.38" else [state],
        "cpus": _number(version, 4),
        "user_name": "bob",
        "nodes": "" if state == "PENDING" else "n1",
    }
    for key in ("submit_time", "start_time", "end_time"):
        raw[key] = _number(version, times.get(key))
    raw["time_limit"] = _number(version, times.get("time_limit"))
    return raw


@pytest.mark.parametrize("version", RELEASE_VERSIONS)
def test_a_pending_job_gives_slurms_start_estimate_its_limit_and_user(version: str) -> None:
    raw = _raw(version, "PENDING", submit_time=100, start_time=900, time_limit=30)
    job = SlurmSite._observed_job(api.read_job(raw))
    assert (job.state, job.user, job.time_limit_s) == (JobState.PENDING, "bob", 1800.0)
    assert (job.submitted_at, job.started_at, job.start_estimate) == (100.0, None, 900.0)
    assert job.ended_at is None


@pytest.mark.parametrize("version", RELEASE_VERSIONS)
def test_a_pending_job_the_backfill_scheduler_has_not_planned_has_no_estimate(
    version: str,
) -> None:
    raw = _raw(version, "PENDING", submit_time=100, start_time=None, time_limit=30)
    assert SlurmSite._observed_job(api.read_job(raw)).start_estimate is None


@pytest.mark.parametrize("version", RELEASE_VERSIONS)
def test_a_finished_job_gives_its_end_and_no_estimate(version: str) -> None:
    raw = _raw(version, "COMPLETED", submit_time=100, start_time=110, end_time=170, time_limit=5)
    job = SlurmSite._observed_job(api.read_job(raw))
    assert (job.started_at, job.ended_at, job.start_estimate) == (110.0, 170.0, None)
    assert job.time_limit_s == 300.0


@pytest.mark.parametrize("version", RELEASE_VERSIONS)
def test_an_unlimited_job_has_no_time_limit(version: str) -> None:
    raw = _raw(version, "RUNNING", submit_time=100, start_time=110)
    raw["time_limit"] = _number(version, None, infinite=True)
    job = SlurmSite._observed_job(api.read_job(raw))
    assert (job.state, job.time_limit_s, job.ended_at) == (JobState.RUNNING, None, None)


def test_a_job_of_a_user_slurm_does_not_name_has_no_user() -> None:
    raw = _raw("v0.0.45", "RUNNING", submit_time=100, start_time=110, time_limit=1)
    raw["user_name"] = ""
    assert SlurmSite._observed_job(api.read_job(raw)).user is None


def test_the_local_site_reports_its_jobs_limit_and_user(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    spec = SiteSpec("loc", SiteKind.LOCAL, 1, storage_dir=str(tmp_path / "loc"))
    site = LocalSite(spec, store)
    limited = JobResources(time_limit_s=120)
    first = site.submit(JobSubmission("a", "sleep 5", 1, resources=limited))
    second = site.submit(JobSubmission("b", "true", 1))  # waits: 1 processor
    try:
        jobs = {j.job_id: j for j in site.observe().jobs}
        assert jobs[first].time_limit_s == 120.0
        assert jobs[second].time_limit_s is None
        assert {j.user for j in jobs.values()} == {getpass.getuser()}
        assert jobs[second].state is JobState.PENDING
        assert all(j.start_estimate is None and j.ended_at is None for j in jobs.values())
    finally:
        site.cancel(first)
        site.cancel(second)
        deadline = time.time() + 10
        while site.observe().jobs and time.time() < deadline:
            time.sleep(0.05)
