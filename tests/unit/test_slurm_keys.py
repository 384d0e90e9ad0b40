"""The Slurm adapter's submission keys, through the one fake transport of
test_slurm_errors: the key travels as the job comment, ``find`` picks it out of
``GET /jobs`` (the oldest of several), and observations carry it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import requests

from gridcore.model import JobState, JobSubmission
from tests.unit.test_slurm_errors import Reply, body, make_site

KEY = "gc-0123456789ab-s5"
JOBS = body(
    jobs=[
        {"job_id": 1001, "comment": "", "job_state": "RUNNING", "cpus": 2},
        {"job_id": 1003, "comment": KEY, "job_state": "PENDING", "cpus": 1},
        {"job_id": 1002, "comment": KEY, "job_state": "RUNNING", "cpus": 1},
        {"job_id": 1004, "job_state": "RUNNING", "cpus": 4},
    ]
)


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as sess:
        yield sess


def test_the_key_is_the_job_comment_and_a_keyless_job_has_none(
    session: requests.Session,
) -> None:
    replies: dict[tuple[str, str], Reply] = {("POST", "/job/submit"): (200, body(job_id=7))}
    site, transport = make_site(session, replies)
    site.submit(JobSubmission("m", "true", 1, key=KEY))
    site.submit(JobSubmission("m", "true", 1))
    sent = [json.loads(r.body or b"{}")["job"] for r in transport.sent if r.method == "POST"]
    assert [(job["name"], job.get("comment")) for job in sent] == [("m", KEY), ("m", None)]


def test_find_returns_the_oldest_job_with_the_key_or_none(
    session: requests.Session,
) -> None:
    site, transport = make_site(session, {("GET", "/jobs"): (200, JOBS)})
    assert site.find(KEY) == "1002"
    assert site.find("gc-0123456789ab-s6") is None
    # a fresh listing each time (a stale one could miss a job just submitted elsewhere)
    assert [r.path_url for r in transport.sent] == ["/slurm/v0.0.38/jobs"] * 2


def test_observed_jobs_carry_their_keys(session: requests.Session) -> None:
    nodes = body(nodes=[{"name": "n1", "cpus": 16, "idle_cpus": 8, "partitions": ["debug"]}])
    site, _ = make_site(session, {("GET", "/jobs"): (200, JOBS), ("GET", "/nodes"): (200, nodes)})
    jobs = site.observe().jobs
    assert [(j.job_id, j.key, j.state) for j in jobs] == [
        ("1001", None, JobState.RUNNING),
        ("1003", KEY, JobState.PENDING),
        ("1002", KEY, JobState.RUNNING),
        ("1004", None, JobState.RUNNING),
    ]


def test_observed_jobs_carry_their_names_what_finds_a_keyless_job(
    session: requests.Session,
) -> None:
    # a replayed job has no key: its name is what finds it (gridcore.engine.replay)
    jobs = body(
        jobs=[
            {"job_id": 1001, "name": "gcreplay-3f9a1c-7", "job_state": "PENDING", "cpus": 2},
            {"job_id": 1002, "name": "", "job_state": "RUNNING", "cpus": 1},
            {"job_id": 1003, "job_state": "RUNNING", "cpus": 1},
        ]
    )
    nodes = body(nodes=[{"name": "n1", "cpus": 16, "idle_cpus": 8, "partitions": ["debug"]}])
    site, _ = make_site(session, {("GET", "/jobs"): (200, jobs), ("GET", "/nodes"): (200, nodes)})
    assert [(j.job_id, j.name) for j in site.observe().jobs] == [
        ("1001", "gcreplay-3f9a1c-7"),
        ("1002", None),
        ("1003", None),
    ]
