"""The Slurm adapter across REST versions v0.0.38 (22.05) to v0.0.45 (26.05): version
discovery, the request builder per version family, the tolerant reader, renewed
credentials, requeues and holds, requests refused before they reach Slurm, and the one
shared job listing. Canned answers in each version's shape through a fake transport on a
real ``requests.Session`` (no network); the live counterpart is tests/slurm/.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import requests

from gridcore.errors import CredentialRejected, RequestError, SiteRejected, UnknownJob
from gridcore.model import (
    CredentialRef,
    JobResources,
    JobState,
    JobSubmission,
    MemoryScope,
    SiteKind,
    SiteSpec,
)
from gridcore.sites import slurm_api as api
from gridcore.sites.slurm import SlurmSite, forget_shared
from tests.fakes import FakeSlurmrestd, SlurmReply
from tests.slurm_openapi import load_spec, request_body_errors

ROOT = "http://slurm.test:6820"
TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJleHAiOjF9.old-signature-0123456789"
NEW_TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJleHAiOjJ9.new-signature-0123456789"

Reply = SlurmReply


def meta(release: str = "26.05.5") -> dict[str, Any]:
    return {"slurm": {"release": release, "version": {"major": "26", "minor": "05"}}}


def ok(**fields: Any) -> dict[str, Any]:
    return {"meta": meta(), "errors": [], "warnings": [], **fields}


def openapi(*versions: str, accounting: bool = False) -> dict[str, Any]:
    paths = {f"/slurm/{v}/{p}": {} for v in versions for p in ("ping", "jobs", "job/submit")}
    if accounting:  # slurmrestd with -s openapi/slurmdbd beside slurmctld's
        paths |= {f"/slurmdb/{v}/{p}": {} for v in versions for p in ("jobs", "job/{job_id}")}
    return {"openapi": "3.0.2", "paths": paths}


def fake_slurm(replies: Mapping[tuple[str, str], Reply | list[Reply]]) -> FakeSlurmrestd:
    return FakeSlurmrestd(replies, ROOT)


@dataclass(eq=False)  # one object, one credential (adapters share state per credential)
class Tokens:
    """A token reference that renews to NEW_TOKEN (a file rewritten, a command re-run)."""

    current: str = TOKEN
    renewals: list[str | None] = field(default_factory=list)

    def token(self) -> str:
        return self.current

    def renew(self, rejected: str | None = None) -> str:
        self.renewals.append(rejected)
        self.current = NEW_TOKEN
        return self.current

    def describe(self) -> str:
        return "command:scontrol token lifespan=3600"


def spec(**changes: Any) -> SiteSpec:
    fields: dict[str, Any] = {
        "name": "alpha",
        "kind": SiteKind.SLURM,
        "processors": 16,
        "url": ROOT,
        "partition": "debug",
        "token": CredentialRef(command="scontrol token lifespan=3600"),
        "storage_dir": "/data/alpha",
        **changes,
    }
    return SiteSpec(**fields)


def cluster(
    version: str, *, gpus: int = 0, max_minutes: Any = None
) -> dict[tuple[str, str], Reply]:
    """A 16-CPU, 4000 MiB node in partition debug, answered in ``version``'s shapes."""
    base = f"/slurm/{version}"
    if api.minor(version) >= 40:
        limit = max_minutes if max_minutes is not None else {"set": True, "infinite": True}
        partition = {"name": "debug", "maximums": {"time": limit}, "partition": {"state": ["UP"]}}
        node = {"name": "n1", "cpus": 16, "alloc_cpus": 0, "alloc_idle_cpus": 16,
                "state": ["IDLE"], "partitions": ["debug"], "real_memory": 4000,
                "gres": f"gpu:a100:{gpus}(S:0)" if gpus else ""}  # fmt: skip
    else:
        partition = {"name": "debug", "max_time_limit": max_minutes or api_infinite()}
        node = {"name": "n1", "cpus": 16, "alloc_cpus": 0, "idle_cpus": 16, "state": "idle",
                "partitions": ["debug"], "real_memory": 4000,
                "gres": f"gpu:{gpus}" if gpus else ""}  # fmt: skip
    return {
        ("GET", "/openapi/v3"): (200, openapi(version)),
        ("GET", f"{base}/partitions"): (200, ok(partitions=[partition])),
        ("GET", f"{base}/nodes"): (200, ok(nodes=[node])),
        ("GET", f"{base}/jobs"): (200, ok(jobs=[])),
    }


def api_infinite() -> int:
    return 0xFFFFFFFF


@pytest.fixture(autouse=True)
def _fresh_adapter_caches() -> Iterator[None]:
    forget_shared()
    yield
    forget_shared()


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as sess:
        yield sess


def make_site(
    session: requests.Session,
    replies: Mapping[tuple[str, str], Reply | list[Reply]],
    tokens: Tokens | None = None,
    **changes: Any,
) -> tuple[SlurmSite, FakeSlurmrestd]:
    fake = fake_slurm(replies)
    session.mount("http://", fake)
    return SlurmSite(spec(**changes), tokens or Tokens(), session=session), fake


JOB = JobSubmission(name="m1", command="echo hi", processors=4, env={"A": "1"}, key="gc-k1")


# --------------------------------------------------------------------------- versions


@pytest.mark.parametrize(
    ("served", "chosen"),
    [
        (("v0.0.36", "v0.0.37", "v0.0.38"), "v0.0.38"),  # 22.05
        (("v0.0.38", "v0.0.39", "v0.0.40"), "v0.0.40"),  # 23.11
        (("v0.0.40", "v0.0.41", "v0.0.42"), "v0.0.42"),  # 24.11
        (("v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"), "v0.0.45"),  # 26.05
        (("v0.0.44", "v0.0.45", "v0.0.46"), "v0.0.45"),  # a future release
        (("v0.0.36", "v0.0.37"), None),  # too old
    ],
)
def test_the_newest_common_version_is_chosen(served: tuple[str, ...], chosen: str | None) -> None:
    assert api.served_versions(openapi(*served)) == served
    assert api.choose_version(served) == chosen


def test_auto_asks_the_server_once_per_process(session: requests.Session) -> None:
    tokens = Tokens()
    pong = ok(pings=[{"hostname": "c", "responding": True, "latency": 10}])
    replies = {**cluster("v0.0.45"), ("GET", "/slurm/v0.0.45/ping"): (200, pong)}
    site, fake = make_site(session, replies, tokens)
    site.ping()
    again = SlurmSite(spec(), tokens, session=session)
    again.ping()
    assert again.api_version == "v0.0.45"
    assert again.release == "26.05.5"
    assert fake.paths() == [
        "GET /openapi/v3",
        "GET /slurm/v0.0.45/ping",
        "GET /slurm/v0.0.45/ping",
    ]


def test_an_upgraded_site_is_asked_again_after_a_404(session: requests.Session) -> None:
    # Cached v0.0.38 from before the upgrade; the server now serves v0.0.42 only.
    replies: dict[tuple[str, str], Reply | list[Reply]] = {
        ("GET", "/openapi/v3"): [(200, openapi("v0.0.38")), (200, openapi("v0.0.40", "v0.0.42"))],
        ("GET", "/slurm/v0.0.38/ping"): [(200, ok(pings=[{"ping": "UP"}])), (404, "Not Found")],
        ("GET", "/slurm/v0.0.42/ping"): (200, ok(pings=[{"responding": True}])),
    }
    site, fake = make_site(session, replies)
    site.ping()
    site.ping()
    assert site.api_version == "v0.0.42"
    assert fake.paths()[-3:] == [
        "GET /slurm/v0.0.38/ping",
        "GET /openapi/v3",
        "GET /slurm/v0.0.42/ping",
    ]


def test_a_pinned_version_the_server_lacks_says_so(session: requests.Session) -> None:
    replies = {("GET", "/slurm/v0.0.38/ping"): (404, "Not Found")}
    site, _ = make_site(session, replies, api_version="v0.0.38")
    with pytest.raises(SiteRejected, match=r'pinned api_version v0.0.38 .*"auto"'):
        site.ping()


def test_a_server_without_a_version_gridcore_speaks(session: requests.Session) -> None:
    site, _ = make_site(session, {("GET", "/openapi/v3"): (200, openapi("v0.0.36"))})
    expected = r"serves v0\.0\.36; gridcore speaks v0\.0\.38 to v0\.0\.45"
    with pytest.raises(SiteRejected, match=expected):
        site.ping()


# --------------------------------------------------------------------------- ping


@pytest.mark.parametrize(
    ("pings", "up"),
    [
        ([{"ping": "UP"}], True),  # v0.0.38
        ([{"pinged": "UP"}], True),  # v0.0.40, 41
        ([{"pinged": "UP", "responding": True}], True),  # v0.0.42-44
        ([{"responding": True, "status": 0}], True),  # v0.0.45
        ([{"responding": False, "pinged": "DOWN"}], False),
        ([{"ping": "DOWN"}, {"ping": "UP"}], True),  # a backup controller answers
        ([], False),
    ],
)
def test_every_versions_ping(pings: list[dict[str, Any]], up: bool) -> None:
    assert api.responding({"pings": pings}) is up


def test_a_bad_token_looks_like_a_dead_controller_until_a_data_call(
    session: requests.Session,
) -> None:
    # 24.11+: /ping says responding false for a bad token; data calls answer 511/1007.
    auth = {"error_number": 1007, "error": "Protocol authentication error"}
    replies: dict[tuple[str, str], Reply | list[Reply]] = {
        **cluster("v0.0.42"),
        ("GET", "/slurm/v0.0.42/ping"): (200, ok(pings=[{"responding": False}])),
        ("GET", "/slurm/v0.0.42/partitions"): (511, ok(errors=[auth])),
    }
    tokens = Tokens()
    site, fake = make_site(session, replies, tokens)
    with pytest.raises(CredentialRejected) as err:
        site.ping()
    text = str(err.value)
    assert "credential rejected (HTTP 511)" in text
    assert "command:scontrol token lifespan=3600" in text
    assert TOKEN not in text and NEW_TOKEN not in text
    assert tokens.renewals == [TOKEN]  # renewed once, then given up
    assert fake.paths().count("GET /slurm/v0.0.42/partitions") == 2


def test_a_renewed_token_is_used_and_the_call_succeeds(session: requests.Session) -> None:
    auth = {"error_number": 1007, "error": "Protocol authentication error"}
    replies: dict[tuple[str, str], Reply | list[Reply]] = {
        **cluster("v0.0.45"),
        ("GET", "/slurm/v0.0.45/jobs"): [(500, ok(errors=[auth])), (200, ok(jobs=[]))],
    }
    site, fake = make_site(session, replies)
    assert site.find("gc-k1") is None
    tokens_sent = [r.headers["X-SLURM-USER-TOKEN"] for r in fake.sent if "jobs" in (r.url or "")]
    assert tokens_sent == [TOKEN, NEW_TOKEN]


# --------------------------------------------------------------------------- requests


def test_v0_0_38_body(session: requests.Session) -> None:
    res = JobResources(time_limit_s=90, account="proj", qos="normal", memory_mib=2048,
                       gpus=0, constraint="avx2")  # fmt: skip
    job = JobSubmission(name="m1", command="echo hi", processors=4, key="gc-k1", resources=res)
    replies = {**cluster("v0.0.38"), ("POST", "/slurm/v0.0.38/job/submit"): (200, ok(job_id=7))}
    site, fake = make_site(session, replies)
    assert site.submit(job) == "7"
    [body] = fake.bodies()
    assert body == {
        "script": "#!/bin/bash\necho hi\n",
        "job": {
            "name": "m1",
            "comment": "gc-k1",
            "partition": "debug",
            "tasks": 1,
            "cpus_per_task": 4,
            "current_working_directory": "/data/alpha",
            "standard_output": "/data/alpha/m1-%j.out",
            "standard_error": "/data/alpha/m1-%j.err",
            "environment": {"PATH": "/usr/local/bin:/usr/bin:/bin"},
            "time_limit": 2,  # 90 s: whole minutes, rounded up
            "memory_per_node": 2048,
            "account": "proj",
            "qos": "normal",
            "constraints": "avx2",
        },
    }


@pytest.mark.parametrize("version", ["v0.0.40", "v0.0.41", "v0.0.42", "v0.0.45"])
def test_newer_bodies(session: requests.Session, version: str) -> None:
    res = JobResources(time_limit_s=600, memory_mib=512, memory_per=MemoryScope.CPU, gpus=2,
                       partition="debug")  # fmt: skip
    job = JobSubmission(name="m1", command="true", processors=2, env={"A": "1"}, resources=res)
    replies = {
        **cluster(version, gpus=4),
        ("POST", f"/slurm/{version}/job/submit"): (200, ok(job_id=8)),
    }
    site, fake = make_site(session, replies)
    site.submit(job)
    [body] = fake.bodies()
    desc = body["job"]
    assert "ntasks" not in desc and desc["tasks"] == 1
    assert desc["environment"] == ["PATH=/usr/local/bin:/usr/bin:/bin", "A=1"]
    assert desc["time_limit"] == {"set": True, "infinite": False, "number": 10}
    assert desc["memory_per_cpu"] == {"set": True, "infinite": False, "number": 512}
    assert desc["tres_per_job"] == "gres/gpu:2"
    if api.minor(version) >= 41:
        assert "script" not in body and desc["script"] == "#!/bin/bash\ntrue\n"
    else:
        assert body["script"] == "#!/bin/bash\ntrue\n" and "script" not in desc


def test_site_defaults_fill_what_the_request_leaves_unset(session: requests.Session) -> None:
    defaults = JobResources(time_limit_s=3600, account="site-acct", qos="low")
    job = JobSubmission(name="m1", command="true", processors=1,
                        resources=JobResources(qos="high"))  # fmt: skip
    replies = {**cluster("v0.0.42"), ("POST", "/slurm/v0.0.42/job/submit"): (200, ok(job_id=9))}
    site, fake = make_site(session, replies, defaults=defaults)
    site.submit(job)
    desc = fake.bodies()[0]["job"]
    assert (desc["account"], desc["qos"], desc["time_limit"]["number"]) == ("site-acct", "high", 60)


@pytest.mark.parametrize(
    ("processors", "resources", "message"),
    [
        (64, JobResources(), "processors: 64 exceeds the largest node of partition debug (16 CPUs"),
        (1, JobResources(gpus=1), "gpus: 1 exceeds the most GPUs of a node of partition debug (0)"),
        (1, JobResources(memory_mib=8000), "memory: 8000 MiB per node exceeds the largest node"),
        (
            4,
            JobResources(memory_mib=2000, memory_per=MemoryScope.CPU),
            "memory_per_cpu: 8000 MiB per node exceeds",
        ),
        (
            1,
            JobResources(time_limit_s=7200),
            "time_limit: 02:00:00 exceeds partition debug's MaxTime of 01:00:00",
        ),
        (1, JobResources(partition="gpu"), "partition: 'gpu' is not a partition of this cluster"),
    ],
)
def test_a_request_no_node_can_run_never_reaches_slurm(
    session: requests.Session, processors: int, resources: JobResources, message: str
) -> None:
    # 26.05 would accept these with warnings only and let them pend for ever.
    site, fake = make_site(session, cluster("v0.0.45", max_minutes={"set": True, "number": 60}))
    job = JobSubmission(name="big", command="true", processors=processors, resources=resources)
    with pytest.raises(RequestError, match="site alpha: job big cannot run there") as err:
        site.submit(job)
    assert message in str(err.value)
    assert fake.bodies() == []


def test_warnings_are_logged(session: requests.Session, caplog: pytest.LogCaptureFixture) -> None:
    warned = ok(job_id=10, warnings=[{"description": 'Ignoring unknown field "x"'}])
    replies = {**cluster("v0.0.45"), ("POST", "/slurm/v0.0.45/job/submit"): (200, warned)}
    site, _ = make_site(session, replies)
    with caplog.at_level(logging.WARNING, logger="gridcore.sites.slurm"):
        site.submit(JOB)
    assert 'job 10: Ignoring unknown field "x"' in caplog.text


# --------------------------------------------------------------------------- reading


def job_v45(job_id: int, state: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "job_state": state,
        "comment": "gc-k1",
        "cpus": {"set": True, "infinite": False, "number": 4},
        "submit_time": {"set": True, "number": 100},
        "start_time": {"set": True, "number": 110},
        "end_time": {"set": True, "number": 150},
        "exit_code": {"status": ["SUCCESS"], "return_code": {"set": True, "number": 0}},
        "standard_output": "/data/alpha/m1-%j.out",
        "stdout_expanded": f"/data/alpha/m1-{job_id}.out",
        "current_working_directory": "/data/alpha",
        "nodes": "n1",
        "restart_cnt": 0,
        **extra,
    }


def listing(*jobs: dict[str, Any]) -> dict[tuple[str, str], Reply]:
    return {**cluster("v0.0.45"), ("GET", "/slurm/v0.0.45/jobs"): (200, ok(jobs=list(jobs)))}


def test_a_finished_job_in_the_newest_shapes(session: requests.Session) -> None:
    failed = job_v45(
        11,
        ["FAILED"],
        exit_code={"status": ["SIGNALED"], "return_code": {"number": 0}, "signal": {"id": 9}},
    )
    site, _ = make_site(session, listing(job_v45(10, ["COMPLETED"]), failed))
    done = site.status("10")
    assert (done.state, done.exit_code, done.started_at, done.finished_at) == (
        JobState.COMPLETED, 0, 110.0, 150.0)  # fmt: skip
    assert site.status("11").exit_code == 128 + 9
    assert site.output_files("10").stdout == "/data/alpha/m1-10.out"
    assert site.find("gc-k1") == "10"


@pytest.mark.parametrize(
    ("state", "extra", "requeued_by", "held"),
    [
        (
            ["PENDING", "REQUEUED"],
            {"restart_cnt": 1, "state_reason": "BeginTime"},
            "REQUEUED",
            False,
        ),
        (["PENDING", "NODE_FAIL", "REQUEUED"], {"restart_cnt": 1}, "NODE_FAIL", False),
        (["PENDING"], {"restart_cnt": 2, "state_reason": "Priority"}, "REQUEUED", False),
        (
            ["PENDING", "REQUEUE_HOLD"],
            {"restart_cnt": 1, "state_reason": "JobHeldAdmin"},
            "REQUEUED",
            True,
        ),
        (["PENDING"], {"state_reason": "JobHeldUser", "hold": True}, None, True),
        (["PENDING"], {"state_reason": "Resources"}, None, False),
    ],
)
def test_requeued_and_held_jobs_are_pending_not_failed(
    session: requests.Session,
    state: list[str],
    extra: dict[str, Any],
    requeued_by: str | None,
    held: bool,
) -> None:
    site, _ = make_site(session, listing(job_v45(12, state, **extra)))
    status = site.status("12")
    assert status.state is JobState.PENDING
    assert (status.requeued_by, status.held) == (requeued_by, held)
    assert status.exit_code is None and status.finished_at is None


def test_delete_status_list_of_v0_0_42(session: requests.Session) -> None:
    done = {"error_code": 2021, "error": "Job/step already completing or completed", "job_id": 5}
    denied = {"error_code": 2002, "error": "Access/permission denied", "job_id": 6}
    replies = {
        **cluster("v0.0.45"),
        ("DELETE", "/slurm/v0.0.45/job/5"): (200, ok(status=[done])),
        ("DELETE", "/slurm/v0.0.45/job/6"): (200, ok(status=[denied])),
        ("DELETE", "/slurm/v0.0.45/job/7"): (200, ok(status=[{"error_code": 0, "signal": 9}])),
    }
    site, _ = make_site(session, replies)
    site.cancel("5")
    site.cancel("7")
    with pytest.raises(SiteRejected, match="Access/permission denied"):
        site.cancel("6")


def test_one_listing_serves_every_status_read(session: requests.Session) -> None:
    jobs = [job_v45(100 + i, ["RUNNING"]) for i in range(200)]
    now = [0.0]
    fake = fake_slurm(listing(*jobs))
    session.mount("http://", fake)
    tokens = Tokens()  # one credential per site and process (credentials.token_source)
    sites = [SlurmSite(spec(), tokens, session=session, clock=lambda: now[0]) for _ in range(3)]
    for cycle in range(5):
        now[0] = cycle * 10.0  # one poll cycle every 10 s, the listing trusted for 5 s
        for i in range(200):
            assert sites[i % 3].status(str(100 + i)).state is JobState.RUNNING
    listings = [p for p in fake.paths() if p == "GET /slurm/v0.0.45/jobs"]
    assert len(listings) == 5


def test_a_job_the_listing_lacks_is_asked_for_by_id(session: requests.Session) -> None:
    unknown = {"error_number": 2017, "error": "Invalid job id specified"}
    replies = {
        **listing(),
        ("GET", "/slurm/v0.0.45/job/13"): (200, ok(jobs=[job_v45(13, ["RUNNING"])])),
        ("GET", "/slurm/v0.0.45/job/14"): (500, ok(errors=[unknown], jobs=[])),
    }
    site, _ = make_site(session, replies)
    assert site.status("13").state is JobState.RUNNING
    with pytest.raises(UnknownJob):
        site.status("14")


# --------------------------------------------------------------------------- specs

EVERY_RESOURCE = JobResources(
    time_limit_s=3600,
    account="proj",
    qos="normal",
    partition="debug",
    memory_mib=1024,
    gpus=1,
    constraint="avx2",
)


@pytest.mark.parametrize("version", api.VERSIONS)
@pytest.mark.parametrize("memory_per", list(MemoryScope))
def test_every_body_is_valid_against_slurms_own_spec(version: str, memory_per: MemoryScope) -> None:
    """Each version's body against SchedMD's spec of that version: a field the server does
    not know (it would drop it with a warning) or a deprecated one fails."""
    resources = replace(EVERY_RESOURCE, memory_per=memory_per)
    job = JobSubmission(name="m1", command="true", processors=2, env={"A": "1"}, key="gc-k",
                        resources=resources)  # fmt: skip
    body = api.submission_body(
        version, job, partition="debug", workdir="/data", resources=resources
    )
    spec = load_spec(version)
    assert (
        request_body_errors(
            spec, "POST", f"/slurm/{version}/job/submit", body, allow_deprecated=False
        )
        == []
    )


# --------------------------------------------------------------------------- accounting


def accounted_v45(job_id: int, key: str, **extra: Any) -> dict[str, Any]:
    """A slurmdbd record in v0.0.45's shape (a finished 2-CPU job, 40 s, 30 s of CPU)."""
    return {
        "job_id": job_id,
        "comment": {"administrator": "", "job": key, "system": ""},
        "state": {"current": ["COMPLETED"], "reason": "None"},
        "exit_code": {"status": ["SUCCESS"], "return_code": {"set": True, "number": 0}},
        "time": {
            "elapsed": 40,
            "submission": 100,
            "start": 110,
            "end": 150,
            "total": {"seconds": 30, "microseconds": 500000},
        },
        "required": {"CPUs": 2},
        "steps": [
            {
                "step": {"name": "batch"},
                "tres": {
                    "requested": {
                        "max": [{"type": "cpu", "count": 2}, {"type": "mem", "count": 52428800}]
                    }
                },
            },
            {
                "step": {"name": "extern"},
                "tres": {"requested": {"max": [{"type": "mem", "count": 1048576}]}},
            },
        ],
        **extra,
    }


def with_accounting(*jobs: dict[str, Any], records: Any = ()) -> dict[tuple[str, str], Reply]:
    return {
        **listing(*jobs),
        ("GET", "/openapi/v3"): (200, openapi("v0.0.45", accounting=True)),
        ("GET", "/slurmdb/v0.0.45/jobs?skip_steps=true&users=root"): (200, ok(jobs=list(records))),
    }


def test_a_finished_job_carries_its_usage_from_accounting(session: requests.Session) -> None:
    replies = {
        **with_accounting(job_v45(20, ["COMPLETED"])),
        ("GET", "/slurmdb/v0.0.45/job/20"): (200, ok(jobs=[accounted_v45(20, "gc-k1")])),
    }
    site, fake = make_site(session, replies)
    usage = site.status("20").usage
    assert usage is not None
    assert usage.as_json() == {
        "elapsed_s": 40.0,
        "cpu_time_s": 30.5,
        "cpus": 2,
        "max_rss_bytes": 52428800,
        "cpu_efficiency": 30.5 / 80,  # as seff: CPU time / (elapsed x CPUs)
    }
    site.status("20")
    assert fake.paths().count("GET /slurmdb/v0.0.45/job/20") == 1  # kept once read


def test_a_job_slurmctld_forgot_is_found_and_read_in_accounting(
    session: requests.Session,
) -> None:
    unknown = {"error_number": 2017, "error": "Invalid job id specified"}
    record = accounted_v45(
        21,
        "gc-k9",
        state={"current": ["FAILED"], "reason": "NonZeroExitCode"},
        exit_code={"status": ["ERROR"], "return_code": {"number": 3}},
    )
    replies = {
        **with_accounting(records=[accounted_v45(5, "gc-other"), record]),
        ("GET", "/slurm/v0.0.45/job/21"): (500, ok(errors=[unknown], jobs=[])),
        ("GET", "/slurmdb/v0.0.45/job/21"): (200, ok(jobs=[record])),
    }
    site, fake = make_site(session, replies)
    holder_made = time.time() - 86400  # a retry after a day-long outage
    assert site.find("gc-k9") is None  # no holder time: only what slurmctld lists
    # past MinJobAge: gone from /jobs, kept in slurmdbd, looked for back to the holder
    assert site.find("gc-k9", since=holder_made) == "21"
    [asked] = [r.url or "" for r in fake.sent if "/slurmdb/v0.0.45/jobs" in (r.url or "")]
    assert int(re.findall(r"start_time=(\d+)", asked)[0]) == int(holder_made - 60)
    assert "skip_steps=true" in asked
    status = site.status("21")
    assert (status.state, status.exit_code, status.finished_at) == (JobState.FAILED, 3, 150.0)
    assert status.reason == "NonZeroExitCode"


def test_a_site_without_accounting_is_not_asked(session: requests.Session) -> None:
    site, fake = make_site(session, listing(job_v45(22, ["COMPLETED"])))
    assert site.status("22").usage is None
    assert site.find("gc-nothing", since=time.time() - 60) is None
    assert not [p for p in fake.paths() if "/slurmdb/" in p]


@pytest.mark.parametrize(
    ("raw", "max_time_s"),
    [
        ({"name": "debug", "max_time_limit": -1, "state": "UP"}, None),  # 22.05 UNLIMITED
        ({"name": "debug", "max_time_limit": 4294967295}, None),
        ({"name": "debug", "max_time_limit": 90}, 5400),
        ({"name": "debug", "maximums": {"time": {"set": True, "infinite": True}}}, None),
        ({"name": "debug", "maximums": {"time": {"set": True, "number": 60}}}, 3600),
        ({"name": "debug", "maximums": {"time": {"set": False, "number": 0}}}, None),
    ],
)
def test_partition_time_limits_in_every_shape(raw: dict[str, Any], max_time_s: int | None) -> None:
    assert api.read_partition(raw).max_time_s == max_time_s


def test_a_requeued_job_still_completing_its_old_run_is_requeued_not_completing(
    session: requests.Session,
) -> None:
    # 24.11 and 26.05 right after `scontrol requeue`: ["PENDING", "COMPLETING"], restart 1
    site, _ = make_site(session, listing(job_v45(15, ["PENDING", "COMPLETING"], restart_cnt=1)))
    assert site.status("15").requeued_by == "REQUEUED"


def accounted_v45_live(job_id: int, **extra: Any) -> dict[str, Any]:
    """What Slurm 26.05.5's slurmdbd answered (trimmed) for a finished 1-CPU job of the
    test grid (3 s of busy loop holding 50 MiB): the job's own ``time.total`` stays 0
    (sacct adds up the steps'), each step has its CPU time and its peak memory."""
    zero = {"seconds": 0, "microseconds": 0}
    return {
        "job_id": job_id,
        "account": "root",
        "comment": {"administrator": "", "job": "gc-live", "system": ""},
        "state": {"current": ["COMPLETED"], "reason": "None"},
        "exit_code": {
            "status": ["SUCCESS"],
            "return_code": {"set": True, "infinite": False, "number": 0},
            "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""},
        },
        "time": {
            "elapsed": 4,
            "eligible": 1795754719,
            "end": 1795754723,
            "start": 1795754719,
            "submission": 1795754719,
            "suspended": 0,
            "system": zero,
            "total": zero,
            "user": zero,
        },
        "required": {"CPUs": 1, "memory_per_node": {"set": True, "infinite": False, "number": 0}},
        "tres": {
            "allocated": [
                {"type": "cpu", "name": "", "id": 1, "count": 1},
                {"type": "node", "name": "", "id": 4, "count": 1},
            ],
            "requested": [
                {"type": "cpu", "name": "", "id": 1, "count": 1},
                {"type": "mem", "name": "", "id": 2, "count": 4000},
            ],
        },
        "steps": [
            {
                "step": {"id": f"{job_id}.batch", "name": "batch"},
                "state": ["COMPLETED"],
                "time": {
                    "elapsed": 4,
                    "system": {"seconds": 0, "microseconds": 46566},
                    "total": {"seconds": 2, "microseconds": 976272},
                    "user": {"seconds": 2, "microseconds": 929706},
                },
                "tres": {
                    "requested": {
                        "max": [
                            {"type": "cpu", "id": 1, "count": 2910, "task": 0, "node": "n1"},
                            {"type": "mem", "id": 2, "count": 66744320, "task": 0, "node": "n1"},
                            {"type": "vmem", "id": 7, "count": 73719808, "task": 0, "node": "n1"},
                        ],
                    },
                    "allocated": [{"type": "cpu", "id": 1, "count": 1}],
                },
            }
        ],
        **extra,
    }


def test_usage_from_a_live_slurmdbd_record_adds_up_its_steps(session: requests.Session) -> None:
    replies = {
        **with_accounting(job_v45(30, ["COMPLETED"])),
        ("GET", "/slurmdb/v0.0.45/job/30"): (200, ok(jobs=[accounted_v45_live(30)])),
    }
    site, _ = make_site(session, replies)
    usage = site.status("30").usage
    assert usage is not None
    assert (usage.elapsed_s, usage.cpus, usage.max_rss_bytes) == (4.0, 1, 66744320)
    assert usage.cpu_time_s == pytest.approx(2.976272)  # the batch step's, as sacct shows


def test_usage_waits_until_slurmdbd_has_the_job_end(session: requests.Session) -> None:
    """slurmctld says COMPLETED a moment before slurmdbd has it: the record still reads
    RUNNING, elapsed counting up to now and no step finished; it is not kept, and the
    status waits (at most USAGE_WAIT_S) for the final record."""
    running = accounted_v45_live(
        31,
        state={"current": ["RUNNING"], "reason": "None"},
        time={"elapsed": 2, "start": 1795754719, "end": 0, "submission": 1795754719},
        steps=[],
    )
    replies = {
        **with_accounting(job_v45(31, ["COMPLETED"])),
        ("GET", "/slurmdb/v0.0.45/job/31"): [
            (200, ok(jobs=[running])),
            (200, ok(jobs=[accounted_v45_live(31)])),
        ],
    }
    site, fake = make_site(session, replies)
    naps: list[float] = []
    site._sleep = naps.append  # the wait, without waiting
    usage = site.status("31").usage
    assert usage is not None and usage.elapsed_s == 4.0 and usage.max_rss_bytes == 66744320
    assert fake.paths().count("GET /slurmdb/v0.0.45/job/31") == 2 and naps == [0.5]
    assert site.status("31").usage == usage  # kept once final: not asked again
    assert fake.paths().count("GET /slurmdb/v0.0.45/job/31") == 2


def test_slurmdbd_failing_never_fails_a_finished_jobs_status(session: requests.Session) -> None:
    down = {"error_number": 7000, "error": "Unable to connect to database"}
    replies = {
        **with_accounting(job_v45(32, ["COMPLETED"])),
        ("GET", "/slurmdb/v0.0.45/job/32"): (500, ok(errors=[down])),
    }
    site, _ = make_site(session, replies)
    status = site.status("32")
    assert (status.state, status.exit_code, status.usage) == (JobState.COMPLETED, 0, None)


def test_an_id_neither_slurmctld_nor_slurmdbd_knows(session: requests.Session) -> None:
    """26.05 (live): slurmctld answers an unknown id with HTTP 404 and error 2017 in a
    JSON body, slurmdbd with HTTP 200, no job and a warning."""
    unknown = {"description": "Unable to query JobId=999999", "error_number": 2017,
               "error": "Invalid job id specified", "source": "_handle_job_get"}  # fmt: skip
    nothing = ok(jobs=[], warnings=[{"description": "slurmdb_jobs_get() found nothing",
                                     "source": "_dump_jobs"}])  # fmt: skip
    replies = {
        **with_accounting(),
        ("GET", "/slurm/v0.0.45/job/999999"): (404, ok(errors=[unknown], jobs=[])),
        ("GET", "/slurmdb/v0.0.45/job/999999"): (200, nothing),
    }
    site, fake = make_site(session, replies)
    with pytest.raises(UnknownJob):
        site.status("999999")
    assert "GET /slurmdb/v0.0.45/job/999999" in fake.paths()


def test_threads_polling_together_share_one_listing_fetch(session: requests.Session) -> None:
    """32 triggers' threads read statuses at once when the listing expires: one of them
    fetches, the others wait for its listing."""
    jobs = [job_v45(100 + i, ["RUNNING"]) for i in range(32)]
    start = threading.Barrier(32)

    def slow_listing(method: str, path: str) -> Reply | None:
        if (method, path) != ("GET", "/slurm/v0.0.45/jobs"):
            return None
        time.sleep(0.2)  # slurmrestd answering a large listing
        return (200, ok(jobs=jobs))

    fake = FakeSlurmrestd(cluster("v0.0.45"), ROOT, slow_listing)
    del fake.replies[("GET", "/slurm/v0.0.45/jobs")]
    session.mount("http://", fake)
    site = SlurmSite(spec(), Tokens(), session=session)

    def read(i: int) -> JobState:
        start.wait()
        return site.status(str(100 + i)).state

    with ThreadPoolExecutor(32) as pool:
        states = list(pool.map(read, range(32)))
    assert states == [JobState.RUNNING] * 32
    assert fake.paths().count("GET /slurm/v0.0.45/jobs") == 1


def test_a_listing_begun_before_a_cancel_is_not_served_after_it(
    session: requests.Session,
) -> None:
    cancelled = threading.Event()
    fetching, go_on = threading.Event(), threading.Event()

    def listing_now(method: str, path: str) -> Reply | None:
        if (method, path) == ("DELETE", "/slurm/v0.0.45/job/7"):
            cancelled.set()
            return (200, ok())
        if (method, path) != ("GET", "/slurm/v0.0.45/jobs"):
            return None
        state = ["CANCELLED"] if cancelled.is_set() else ["RUNNING"]
        if not cancelled.is_set():
            fetching.set()
            go_on.wait(5)  # the slow listing is still the one from before the cancel
        return (200, ok(jobs=[job_v45(7, state)]))

    fake = FakeSlurmrestd(cluster("v0.0.45"), ROOT, listing_now)
    del fake.replies[("GET", "/slurm/v0.0.45/jobs")]
    session.mount("http://", fake)
    tokens = Tokens()
    poller = SlurmSite(spec(), tokens, session=session)
    canceller = SlurmSite(spec(), tokens, session=session)
    canceller.api_version  # noqa: B018 (discovered before the race)
    with ThreadPoolExecutor(1) as pool:
        early = pool.submit(poller.status, "7")
        assert fetching.wait(5)
        canceller.cancel("7")
        go_on.set()
        assert early.result().state is JobState.RUNNING  # what it read before the cancel
    assert poller.status("7").state is JobState.CANCELLED


def test_a_requeue_held_job_of_22_05_is_pending_and_held(session: requests.Session) -> None:
    # 22.05 reports a job held after a requeue (RequeueExitHold) by its flag's name
    held = {"job_id": 40, "job_state": "SPECIAL_EXIT", "restart_cnt": 1, "cpus": 1}
    replies = {**cluster("v0.0.38"), ("GET", "/slurm/v0.0.38/jobs"): (200, ok(jobs=[held]))}
    site, _ = make_site(session, replies)
    status = site.status("40")
    assert (status.state, status.held, status.requeued_by) == (JobState.PENDING, True, "REQUEUED")


def test_capacity_is_observed_where_jobs_are_sent(session: requests.Session) -> None:
    """A site whose defaults send jobs to partition batch reports batch's nodes."""
    nodes = [
        {"name": "d1", "cpus": 4, "idle_cpus": 4, "state": "idle", "partitions": ["debug"]},
        {"name": "b1", "cpus": 32, "idle_cpus": 30, "state": "idle", "partitions": ["batch"]},
    ]
    replies = {
        **cluster("v0.0.38"),
        ("GET", "/slurm/v0.0.38/nodes"): (200, ok(nodes=nodes)),
        ("GET", "/slurm/v0.0.38/partitions"): (
            200, ok(partitions=[{"name": "debug"}, {"name": "batch"}])),
        ("POST", "/slurm/v0.0.38/job/submit"): (200, ok(job_id=41)),
    }  # fmt: skip
    site, fake = make_site(session, replies, defaults=JobResources(partition="batch"))
    obs = site.observe()
    assert (obs.total_processors, obs.idle_processors) == (32, 30)
    site.submit(JobSubmission(name="big", command="true", processors=16))  # fits batch's node
    assert fake.bodies()[0]["job"]["partition"] == "batch"


GPU_NODE = api.SlurmNode("g1", 8, 8, True, frozenset({"mixed"}), 64000, 4)
CPU_NODE = api.SlurmNode("c1", 64, 64, True, frozenset({"mixed"}), 256000, 0)
MIXED = (api.SlurmPartition("mixed", None, True),)


@pytest.mark.parametrize(
    ("processors", "resources", "partition", "refused"),
    [
        (
            16,
            JobResources(gpus=1),
            "mixed",
            "no single node of partition mixed has 16 CPUs, 1 GPUs",
        ),
        (8, JobResources(gpus=4), "mixed", None),  # the GPU node
        (64, JobResources(memory_mib=200000), "mixed", None),  # the CPU node
        (8, JobResources(gpus=1, memory_mib=100000), "mixed", "8 CPUs, 1 GPUs, 100000 MiB"),
        (8, JobResources(), "nope,mixed", None),  # sbatch's list: one that fits will do
        (8, JobResources(), "nope,none", "partition: 'none' is not a partition"),
    ],
)
def test_one_node_must_hold_the_whole_request(
    processors: int, resources: JobResources, partition: str, refused: str | None
) -> None:
    reasons = api.refusals(processors, resources, partition, MIXED, (GPU_NODE, CPU_NODE))
    if refused is None:
        assert reasons == []
    else:
        assert any(refused in r for r in reasons), reasons
