"""SlurmSite's error translation and field mapping, from canned slurmrestd answers.

The bodies below are trimmed copies of what slurmrestd 22.05 (OpenAPI v0.0.38) really
answered on the test grid (see tests/slurm/). No network: a fake transport adapter is
mounted on a real ``requests.Session``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import requests

from gridcore.errors import (
    CredentialError,
    CredentialRejected,
    GridError,
    RequestError,
    SiteRejected,
    SiteUnavailable,
    UnknownJob,
)
from gridcore.model import CredentialRef, JobState, JobSubmission, SiteKind, SiteSpec
from gridcore.sites.slurm import SlurmSite, decode_exit_code, forget_shared, map_job_state
from tests.fakes import FakeSlurmrestd, SlurmReply

TOKEN = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXBheWxvYWQ.s3cr3t-signature"
BASE = "http://slurm.test:6820/slurm/v0.0.38"
META = {"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"release": "22.05.8"}}

Reply = SlurmReply


def no_accounting(method: str, path: str) -> Reply | None:
    """22.05's slurmrestd here runs without slurmdbd: its accounting API is not served."""
    return (404, "Not Found") if "/slurmdb/" in path else None


def body(**fields: Any) -> dict[str, Any]:
    return {"meta": META, "errors": [], **fields}


def spec(**changes: Any) -> SiteSpec:
    fields: dict[str, Any] = {
        "name": "alpha",
        "kind": SiteKind.SLURM,
        "processors": 16,
        "url": "http://slurm.test:6820/",
        "partition": "debug",
        "token": CredentialRef(env="GRIDCORE_SLURM_TOKEN_ALPHA"),
        "storage_dir": "/data/alpha",
        "api_version": "v0.0.38",
        **changes,
    }
    return SiteSpec(**fields)


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as sess:
        yield sess


# What a submission is checked against first: one 16-CPU node in partition debug.
LIMITS: dict[tuple[str, str], Reply] = {
    ("GET", "/partitions"): (200, {"meta": META, "errors": [], "partitions": [{"name": "debug"}]}),
    ("GET", "/nodes"): (
        200,
        {
            "meta": META,
            "errors": [],
            "nodes": [
                {"name": "n1", "cpus": 16, "idle_cpus": 16, "state": "idle",
                 "partitions": ["debug"], "real_memory": 4000}
            ],
        },
    ),
    ("GET", "/jobs"): (200, {"meta": META, "errors": [], "jobs": []}),
}  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh_adapter_caches() -> Iterator[None]:
    forget_shared()
    yield
    forget_shared()


def make_site(
    session: requests.Session, replies: Mapping[tuple[str, str], Reply], **changes: Any
) -> tuple[SlurmSite, FakeSlurmrestd]:
    transport = FakeSlurmrestd({**LIMITS, **replies}, BASE, no_accounting)
    session.mount("http://", transport)
    return SlurmSite(spec(**changes), TOKEN, session=session), transport


def assert_no_token(exc: BaseException) -> None:
    assert TOKEN not in str(exc)
    assert TOKEN not in repr(exc)
    assert isinstance(exc, GridError)


# --------------------------------------------------------------------------- errors


def test_errors_on_http_200_are_rejections(session: requests.Session) -> None:
    errors = [{"error_code": 2015, "error": "Requested partition configuration not available now"}]
    replies: dict[tuple[str, str], Reply] = {
        ("POST", "/job/submit"): (200, body(errors=errors, job_id=1004, step_id="BATCH")),
        ("DELETE", "/job/1004"): (200, body()),
        # the nodes gridcore read allow it; the controller (changed since) does not
        ("GET", "/nodes"): (200, body(nodes=[node("n1", 64, 0)])),
    }
    site, transport = make_site(session, replies)
    with pytest.raises(SiteRejected, match="Requested partition configuration") as err:
        site.submit(JobSubmission(name="huge", command="true", processors=32))
    assert err.value.site == "alpha"
    assert "HTTP 200" in err.value.site_message
    # The job Slurm queued despite the error is cancelled, not left pending forever.
    assert [(r.method, r.path_url) for r in transport.sent][-1] == (
        "DELETE",
        "/slurm/v0.0.38/job/1004",
    )


def test_bad_partition_carries_the_sites_text(session: requests.Session) -> None:
    errors = [{"error_code": 2000, "error": "Invalid partition name specified"}]
    site, transport = make_site(session, {("POST", "/job/submit"): (500, body(errors=errors))})
    with pytest.raises(SiteRejected, match="Invalid partition name specified"):
        site.submit(JobSubmission(name="j", command="true", processors=1))
    assert [r.method for r in transport.sent].count("POST") == 1


def test_several_errors_are_all_reported(session: requests.Session) -> None:
    errors = [
        {"error": "environment must be set", "error_code": 2127},
        {"error_code": 9001, "error": "Failure during parsing"},
    ]
    site, _ = make_site(session, {("GET", "/jobs"): (400, body(errors=errors))})
    with pytest.raises(SiteRejected) as err:
        site.observe()
    assert "environment must be set; Failure during parsing" in str(err.value)


@pytest.mark.parametrize("status", [401, 403, 511])
def test_auth_status_codes(session: requests.Session, status: int) -> None:
    site, transport = make_site(session, {("GET", "/ping"): (status, "Authentication failure")})
    with pytest.raises(CredentialRejected, match=rf"credential rejected \(HTTP {status}\)") as e:
        site.ping()
    assert "env:GRIDCORE_SLURM_TOKEN_ALPHA" in str(e.value)
    assert_no_token(e.value)
    # read anew and tried once more, then given up
    assert [r.path_url for r in transport.sent] == ["/slurm/v0.0.38/ping"] * 2


def test_rejected_token_gets_a_hint(session: requests.Session) -> None:
    # What slurmrestd answers when slurmctld refuses the JWT (not a 401).
    errors = [
        {
            "description": "Failed while looking for jobs",
            "error_number": -1,
            "error": "Unspecified error",
            "source": "slurm_load_jobs",
        }
    ]
    site, _ = make_site(session, {("GET", "/jobs"): (500, body(errors=errors, jobs=[]))})
    with pytest.raises(SiteRejected) as err:
        site.observe()
    text = str(err.value)
    assert "Unspecified error: Failed while looking for jobs" in text
    assert "check the token reference" in text


def test_non_json_body_names_the_status(session: requests.Session) -> None:
    site, _ = make_site(session, {("GET", "/jobs"): (502, "<html>Bad Gateway</html>")})
    with pytest.raises(SiteRejected, match="HTTP 502") as err:
        site.observe()
    assert "Bad Gateway" in str(err.value)


def test_json_that_is_not_an_object(session: requests.Session) -> None:
    site, _ = make_site(session, {("GET", "/ping"): (200, [1, 2])})
    with pytest.raises(SiteRejected, match="not an object"):
        site.ping()


def test_http_error_without_errors_list(session: requests.Session) -> None:
    site, _ = make_site(session, {("GET", "/ping"): (500, body())})
    with pytest.raises(SiteRejected, match="HTTP 500"):
        site.ping()


@pytest.mark.parametrize(
    "failure",
    [
        requests.ConnectionError("Connection refused"),
        requests.ConnectTimeout("connect timed out"),
        requests.ReadTimeout("read timed out"),
    ],
)
def test_transport_failures_are_unavailable(session: requests.Session, failure: Exception) -> None:
    site, _ = make_site(session, {("GET", "/jobs"): failure})
    with pytest.raises(SiteUnavailable) as err:
        site.observe()
    assert err.value.site == "alpha"
    assert_no_token(err.value)


def test_controller_unreachable_errno_is_unavailable(session: requests.Session) -> None:
    errors = [{"error_number": 1001, "error": "Unable to contact slurm controller"}]
    site, _ = make_site(session, {("GET", "/ping"): (500, body(errors=errors))})
    with pytest.raises(SiteUnavailable, match="Unable to contact slurm controller"):
        site.ping()


def test_controller_down_ping_is_confirmed_by_a_data_call(session: requests.Session) -> None:
    down = [{"error_number": 1001, "error": "Unable to contact slurm controller"}]
    replies: dict[tuple[str, str], Reply] = {
        ("GET", "/ping"): (200, body(pings=[{"ping": "DOWN"}])),
        ("GET", "/partitions"): (500, body(errors=down)),
    }
    site, _ = make_site(session, replies)
    with pytest.raises(SiteUnavailable, match="Unable to contact slurm controller"):
        site.ping()


def test_ping_down_but_data_answered_is_up(session: requests.Session) -> None:
    site, transport = make_site(session, {("GET", "/ping"): (200, body(pings=[{"ping": "DOWN"}]))})
    site.ping()
    assert [r.path_url for r in transport.sent][-1] == "/slurm/v0.0.38/partitions"


def test_unknown_job(session: requests.Session) -> None:
    errors = [
        {
            "description": "Unable to find JobId=999999",
            "error_number": 2017,
            "error": "Invalid job id specified",
            "source": "slurm_load_job",
        }
    ]
    replies: dict[tuple[str, str], Reply] = {
        ("GET", "/job/999999"): (500, body(errors=errors, jobs=[])),
        ("DELETE", "/job/999999"): (500, body(errors=errors)),
        ("GET", "/job/5"): (200, body(jobs=[])),
    }
    site, _ = make_site(session, replies)
    with pytest.raises(UnknownJob, match="Unable to find JobId=999999"):
        site.status("999999")
    with pytest.raises(UnknownJob):
        site.cancel("999999")
    with pytest.raises(UnknownJob, match="not known"):
        site.status("5")


def test_unfindable_job_with_unspecified_errno_is_not_unknown(session: requests.Session) -> None:
    # slurmctld down: slurmrestd says "Unable to find JobId=..." with errno -1. The job
    # may well exist, so this must not read as UnknownJob.
    errors = [{"description": "Unable to find JobId=7", "error_number": -1, "error": "x"}]
    site, _ = make_site(session, {("GET", "/job/7"): (500, body(errors=errors, jobs=[]))})
    with pytest.raises(SiteRejected) as err:
        site.status("7")
    assert not isinstance(err.value, UnknownJob)


@pytest.mark.parametrize("job_id", ["../nodes", "12/x", "", "1; rm"])
def test_job_ids_never_reach_the_url(session: requests.Session, job_id: str) -> None:
    site, transport = make_site(session, {})
    with pytest.raises(UnknownJob, match="not a Slurm job id"):
        site.status(job_id)
    with pytest.raises(UnknownJob):
        site.cancel(job_id)
    assert transport.sent == []


def test_cancel_deletes_the_job_and_a_job_already_finished_is_no_error(
    session: requests.Session,
) -> None:
    already = [{"error_number": 2021, "error": "Job/step already completing or completed"}]
    denied = [{"error_number": 2002, "error": "Access/permission denied"}]
    replies: dict[tuple[str, str], Reply] = {
        ("DELETE", "/job/10"): (200, body()),
        ("DELETE", "/job/11"): (500, body(errors=already)),
        ("DELETE", "/job/12"): (500, body(errors=denied)),
    }
    site, transport = make_site(session, replies)

    site.cancel("10")
    site.cancel("11")  # finished meanwhile: what a cancel wants
    with pytest.raises(SiteRejected, match="Access/permission denied"):
        site.cancel("12")  # any other error is not swallowed

    assert [(r.method, r.url) for r in transport.sent] == [
        ("DELETE", f"{BASE}/job/10"),
        ("DELETE", f"{BASE}/job/11"),
        ("DELETE", f"{BASE}/job/12"),
    ]
    assert all(r.headers["X-SLURM-USER-TOKEN"] == TOKEN for r in transport.sent)


# --------------------------------------------------------------------------- secrecy


def test_token_scrubbed_from_site_messages(session: requests.Session) -> None:
    errors = [{"error": f"bad token {TOKEN}", "error_number": 5}]
    site, _ = make_site(session, {("GET", "/ping"): (500, body(errors=errors))})
    with pytest.raises(SiteRejected, match="<token>") as err:
        site.ping()
    assert_no_token(err.value)


def test_token_not_in_repr(session: requests.Session) -> None:
    site, _ = make_site(session, {})
    assert TOKEN not in repr(site)
    assert TOKEN not in str(site)
    assert "alpha" in repr(site)


@pytest.mark.parametrize("token", ["", "  ", "abc\ndef"])
def test_invalid_token_refused_without_echo(token: str) -> None:
    with pytest.raises(CredentialError) as err:
        SlurmSite(spec(), token)
    assert "env:GRIDCORE_SLURM_TOKEN_ALPHA" in str(err.value)
    if token.strip():
        assert token.strip() not in str(err.value)


def test_non_slurm_spec_refused() -> None:
    with pytest.raises(GridError, match="needs kind 'slurm' and a url"):
        SlurmSite(spec(url=None), TOKEN)


def test_an_adapter_is_a_context_manager() -> None:
    with SlurmSite(spec(), TOKEN) as site:
        assert "alpha" in repr(site)


# --------------------------------------------------------------------------- mapping


def test_submit_payload_and_headers(session: requests.Session) -> None:
    site, transport = make_site(
        session,
        {("POST", "/job/submit"): (200, body(job_id=1000, step_id="BATCH"))},
        user=None,
        partition=None,
    )
    job = JobSubmission(name="m1", command="echo hi", processors=4, env={"A": "1"})
    assert site.submit(job) == "1000"
    [request] = [r for r in transport.sent if r.method == "POST"]
    assert request.headers["X-SLURM-USER-NAME"] == "root"
    assert request.headers["X-SLURM-USER-TOKEN"] == TOKEN
    sent = json.loads(request.body or b"")
    assert sent == {
        "script": "#!/bin/bash\necho hi\n",
        "job": {
            "name": "m1",
            "partition": "debug",
            "tasks": 1,
            "cpus_per_task": 4,
            "current_working_directory": "/data/alpha",
            "standard_output": "/data/alpha/m1-%j.out",
            "standard_error": "/data/alpha/m1-%j.err",
            "environment": {"PATH": "/usr/local/bin:/usr/bin:/bin", "A": "1"},
        },
    }


def test_submit_needs_a_workdir(session: requests.Session) -> None:
    site, transport = make_site(session, {}, storage_dir=None)
    with pytest.raises(RequestError, match="no workdir"):
        site.submit(JobSubmission(name="m1", command="true", processors=1))
    with pytest.raises(RequestError, match="processors"):
        site.submit(JobSubmission(name="m1", command="true", processors=0, workdir="/w"))
    assert transport.sent == []


def test_submit_without_job_id(session: requests.Session) -> None:
    site, _ = make_site(session, {("POST", "/job/submit"): (200, body())})
    with pytest.raises(SiteRejected, match="without job_id"):
        site.submit(JobSubmission(name="m1", command="true", processors=1))


def node(name: str, cpus: int, alloc: int, state: str = "idle", **extra: Any) -> dict[str, Any]:
    fields = {"name": name, "cpus": cpus, "alloc_cpus": alloc, "idle_cpus": cpus - alloc}
    return {**fields, "state": state, "state_flags": [], "partitions": ["debug"], **extra}


def test_observe_reads_jobs_then_nodes(session: requests.Session) -> None:
    nodes = [
        node("n1", 8, 6, "mixed"),
        node("n2", 8, 0, state_flags=["DRAIN"]),
        node("n3", 8, 0, "down"),
        node("n4", 8, 0, partitions=["other"]),
        {"name": "n5", "cpus": 4, "alloc_cpus": 1, "state": "mixed", "partitions": ["debug"]},
    ]
    jobs = [
        {"job_id": 1000, "cpus": 6, "job_state": "RUNNING"},
        {"job_id": 1001, "cpus": 2, "job_state": "PENDING"},
        {"job_id": 1002, "cpus": 1, "job_state": "COMPLETED"},
        {"job_id": 1003, "cpus": 1, "job_state": ["CANCELLED"]},
    ]
    replies: dict[tuple[str, str], Reply] = {
        ("GET", "/jobs"): (200, body(jobs=jobs)),
        ("GET", "/nodes"): (200, body(nodes=nodes)),
    }
    site, transport = make_site(session, replies)
    obs = site.observe()
    assert [r.path_url for r in transport.sent] == ["/slurm/v0.0.38/jobs", "/slurm/v0.0.38/nodes"]
    assert (obs.site, obs.total_processors, obs.idle_processors) == ("alpha", 12, 5)
    assert [(j.job_id, j.processors, j.state) for j in obs.jobs] == [
        ("1000", 6, JobState.RUNNING),
        ("1001", 2, JobState.PENDING),
        ("1002", 1, JobState.COMPLETED),
        ("1003", 1, JobState.CANCELLED),
    ]
    assert [j.job_id for j in obs.pending()] == ["1001"]


def test_observe_reads_submit_and_start_times(session: requests.Session) -> None:
    # Shapes slurmrestd 22.05 answered on the test grid: a pending job's start_time is 0
    # (or the backfill forecast); a job cancelled while pending gets start_time = end_time
    # = the cancel time and no nodes; one cancelled while running keeps both.
    jobs = [
        {"job_id": 3000, "job_state": "COMPLETED", "submit_time": 1795444053,
         "start_time": 1795444054, "end_time": 1795444084, "nodes": "gamma-n1"},
        {"job_id": 3001, "job_state": "RUNNING", "submit_time": 1795444054,
         "start_time": 1795444084, "end_time": 1826980084, "nodes": "gamma-n1"},
        {"job_id": 3002, "job_state": "CANCELLED", "submit_time": 1795444054,
         "start_time": 1795444062, "end_time": 1795444062, "nodes": "", "batch_host": ""},
        {"job_id": 3003, "job_state": "PENDING", "submit_time": 1795444055,
         "start_time": 0, "end_time": 0, "nodes": ""},
        {"job_id": 3004, "job_state": "PENDING", "submit_time": 1795444056,
         "start_time": 1795449999, "end_time": 1795459999, "nodes": ""},
        {"job_id": 3005, "job_state": "CANCELLED", "submit_time": 1795444082,
         "start_time": 1795444083, "end_time": 1795444089, "nodes": "gamma-n1",
         "batch_host": "gamma-n1"},
        {"job_id": 3006, "job_state": ["RUNNING"],
         "submit_time": {"set": True, "infinite": False, "number": 1795444090},
         "start_time": {"set": True, "infinite": False, "number": 1795444091}},
        {"job_id": 3007, "job_state": "PENDING"},
    ]  # fmt: skip
    replies: dict[tuple[str, str], Reply] = {
        ("GET", "/jobs"): (200, body(jobs=jobs)),
        ("GET", "/nodes"): (200, body(nodes=[node("gamma-n1", 4, 4, "allocated")])),
    }
    site, _ = make_site(session, replies)
    assert [(j.job_id, j.submitted_at, j.started_at) for j in site.observe().jobs] == [
        ("3000", 1795444053.0, 1795444054.0),
        ("3001", 1795444054.0, 1795444084.0),
        ("3002", 1795444054.0, None),
        ("3003", 1795444055.0, None),
        ("3004", 1795444056.0, None),
        ("3005", 1795444082.0, 1795444083.0),
        ("3006", 1795444090.0, 1795444091.0),
        ("3007", None, None),
    ]


def test_status_while_running_hides_projected_end(session: requests.Session) -> None:
    job = {
        "job_id": 3000,
        "job_state": "RUNNING",
        "exit_code": 0,
        "submit_time": 1795352759,
        "start_time": 1795352760,
        "end_time": 1826888760,
        "state_reason": "None",
    }
    site, _ = make_site(session, {("GET", "/job/3000"): (200, body(jobs=[job]))})
    status = site.status("3000")
    assert status.state is JobState.RUNNING
    assert (status.exit_code, status.finished_at, status.reason) == (None, None, "")
    assert (status.submitted_at, status.started_at) == (1795352759.0, 1795352760.0)


def test_status_failed_decodes_wait_status(session: requests.Session) -> None:
    job = {
        "job_id": 3000,
        "job_state": "FAILED",
        "exit_code": 768,
        "submit_time": 1795352759,
        "start_time": 1795352760,
        "end_time": 1795352762,
        "state_reason": "NonZeroExitCode",
    }
    other = {**job, "job_id": 30001}
    site, _ = make_site(session, {("GET", "/job/3000"): (200, body(jobs=[other, job]))})
    status = site.status("3000")
    assert (status.state, status.exit_code, status.finished_at) == (
        JobState.FAILED,
        3,
        1795352762.0,
    )
    assert status.reason == "NonZeroExitCode"


def test_status_pending_has_no_start(session: requests.Session) -> None:
    job = {"job_id": 9, "job_state": "PENDING", "submit_time": 5, "start_time": 99, "end_time": 0}
    site, _ = make_site(session, {("GET", "/job/9"): (200, body(jobs=[job]))})
    status = site.status("9")
    assert (status.submitted_at, status.started_at, status.finished_at) == (5.0, None, None)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (0, 0),
        (768, 3),
        (9, 137),
        (15, 143),
        (None, None),
        ({"status": ["EXITED"], "return_code": 3}, 3),
        ({"status": "EXITED", "return_code": {"set": True, "infinite": False, "number": 2}}, 2),
        ({"status": ["SIGNALED"], "return_code": 0, "signal": {"id": 9, "name": "KILL"}}, 137),
        ({"return_code": {"set": False, "number": 0}}, None),
    ],
)
def test_decode_exit_code(raw: Any, expected: int | None) -> None:
    assert decode_exit_code(raw) == expected


@pytest.mark.parametrize(
    ("slurm", "expected"),
    [
        ("PENDING", JobState.PENDING),
        ("CONFIGURING", JobState.PENDING),
        ("RUNNING", JobState.RUNNING),
        ("COMPLETING", JobState.RUNNING),
        ("COMPLETED", JobState.COMPLETED),
        ("CANCELLED", JobState.CANCELLED),
        ("FAILED", JobState.FAILED),
        ("TIMEOUT", JobState.FAILED),
        ("NODE_FAIL", JobState.FAILED),
        ("OUT_OF_MEMORY", JobState.FAILED),
        ("BOOT_FAIL", JobState.FAILED),
        ("PREEMPTED", JobState.FAILED),
        ("DEADLINE", JobState.FAILED),
    ],
)
def test_map_job_state(slurm: str, expected: JobState) -> None:
    assert map_job_state(slurm) is expected
