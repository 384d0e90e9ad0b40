"""The strict request-body check of tests/slurm_openapi.py, against SchedMD's stored specs.

What these pin down is the validator (a field the spec does not define fails, types and
$refs are followed, a live server's multi-version spec works) and, through it, the facts a
job submission depends on: ``environment`` is a dictionary in v0.0.38 and a list of
``"K=V"`` strings after; the task count is ``tasks`` (no version's spec has ``ntasks``).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.slurm_openapi import (
    LIVE_23_11,
    VERSIONS,
    find_operation,
    load_spec,
    load_spec_file,
    request_body_errors,
    spec_path,
    spec_versions,
)

SCRIPT = "#!/bin/bash\ntrue\n"
JOB_V38 = {
    "name": "x",
    "partition": "debug",
    "cpus_per_task": 2,
    "current_working_directory": "/tmp",
    "environment": {"PATH": "/bin"},
}
LIST_ENV = tuple(v for v in VERSIONS if v != "v0.0.38")


def submit(version: str) -> str:
    return f"/slurm/{version}/job/submit"


def good_body(version: str) -> dict[str, Any]:
    """A small submission that each version's spec accepts as it stands."""
    job: dict[str, Any] = {**JOB_V38, "tasks": 1}
    if version != "v0.0.38":
        job["environment"] = ["PATH=/bin"]
    return {"script": SCRIPT, "job": job}


@pytest.mark.parametrize("version", VERSIONS)
def test_each_stored_spec_is_that_version_and_has_job_submit(version: str) -> None:
    assert spec_path(version).is_file()
    spec = load_spec(version)
    assert spec_versions(spec) == [version]
    assert find_operation(spec, "POST", submit(version))[1] == "post"


def test_the_known_good_v38_body_passes_on_v38() -> None:
    body = {"script": SCRIPT, "job": JOB_V38}
    assert request_body_errors(load_spec("v0.0.38"), "POST", submit("v0.0.38"), body) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_a_small_submission_passes_on_every_version(version: str) -> None:
    assert (
        request_body_errors(load_spec(version), "post", submit(version), good_body(version)) == []
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_ntasks_is_not_a_field_of_any_version(version: str) -> None:
    # 22.05's v0.0.38 parser took "ntasks" as an undocumented alias of "tasks"; its spec,
    # and every later one, has only "tasks" (newer servers drop "ntasks" with a warning).
    body = good_body(version)
    body["job"]["ntasks"] = body["job"].pop("tasks")
    errors = request_body_errors(load_spec(version), "POST", submit(version), body)
    assert errors == ["job.ntasks: unknown field 'ntasks': the spec does not define it"]


@pytest.mark.parametrize("version", LIST_ENV)
def test_environment_as_a_dict_fails_where_the_spec_says_list_of_strings(version: str) -> None:
    body = good_body(version)
    body["job"]["environment"] = {"PATH": "/bin"}
    errors = request_body_errors(load_spec(version), "POST", submit(version), body)
    assert errors == ["job.environment: {'PATH': '/bin'} is not of type 'array'"]


def test_environment_as_a_list_fails_on_v38() -> None:
    body = {"script": SCRIPT, "job": {**JOB_V38, "environment": ["PATH=/bin"]}}
    errors = request_body_errors(load_spec("v0.0.38"), "POST", submit("v0.0.38"), body)
    assert errors == ["job.environment: ['PATH=/bin'] is not of type 'object'"]


@pytest.mark.parametrize("version", VERSIONS)
def test_an_unknown_top_level_field_fails(version: str) -> None:
    body = {**good_body(version), "priority_boost": 3}
    errors = request_body_errors(load_spec(version), "POST", submit(version), body)
    assert errors == ["priority_boost: unknown field 'priority_boost': the spec does not define it"]


def test_unknown_fields_are_found_at_every_depth_and_in_lists() -> None:
    body = good_body("v0.0.42")
    body["job"]["time_limit"] = {"set": True, "number": 5, "minutes": 5}
    body["jobs"] = [{"name": "het", "bogus": 1}]
    errors = request_body_errors(load_spec("v0.0.42"), "POST", submit("v0.0.42"), body)
    assert errors == [
        "job.time_limit.minutes: unknown field 'minutes': the spec does not define it",
        "jobs[0].bogus: unknown field 'bogus': the spec does not define it",
    ]


def test_types_behind_refs_are_checked() -> None:
    body = good_body("v0.0.42")
    body["job"]["time_limit"] = 5  # v0.0.42's spec: a {set, infinite, number} object
    body["job"]["cpus_per_task"] = "2"
    errors = request_body_errors(load_spec("v0.0.42"), "POST", submit("v0.0.42"), body)
    assert errors == [
        "job.cpus_per_task: '2' is not of type 'integer'",
        "job.time_limit: 5 is not of type 'object'",
    ]
    v38 = {"script": SCRIPT, "job": {**JOB_V38, "time_limit": 5}}
    assert request_body_errors(load_spec("v0.0.38"), "POST", submit("v0.0.38"), v38) == []


def test_deprecated_fields_fail_only_when_asked() -> None:
    # top-level "script" is deprecated in the v0.0.41 and v0.0.42 specs (job.script instead)
    spec = load_spec("v0.0.42")
    body = good_body("v0.0.42")
    assert request_body_errors(spec, "POST", submit("v0.0.42"), body) == []
    strict = request_body_errors(spec, "POST", submit("v0.0.42"), body, allow_deprecated=False)
    assert strict == ["script: deprecated by the spec"]
    moved = {"job": {**body["job"], "script": SCRIPT}}
    assert request_body_errors(spec, "POST", submit("v0.0.42"), moved, allow_deprecated=False) == []


def test_the_body_must_be_an_object() -> None:
    errors = request_body_errors(load_spec("v0.0.43"), "POST", submit("v0.0.43"), ["x"])
    assert errors == ["(body): ['x'] is not of type 'object'"]


def live_spec(*versions: str) -> dict[str, Any]:
    """What ``GET /openapi/v3`` answers: every version's paths and schemas in one spec."""
    merged: dict[str, Any] = copy.deepcopy(load_spec(versions[0]))
    for version in versions[1:]:
        other = load_spec(version)
        merged["paths"].update(other["paths"])
        merged["components"]["schemas"].update(other["components"]["schemas"])
    return merged


def test_a_live_servers_spec_is_picked_by_the_version_in_the_path() -> None:
    spec = live_spec("v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45")
    assert spec_versions(spec) == ["v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"]
    for version in spec_versions(spec):
        assert request_body_errors(spec, "POST", submit(version), good_body(version)) == []
        bad = {"script": SCRIPT, "job": {**good_body(version)["job"], "ntasks": 1}}
        assert request_body_errors(spec, "POST", submit(version), bad) == [
            "job.ntasks: unknown field 'ntasks': the spec does not define it"
        ]
    with pytest.raises(KeyError, match=r"v0\.0\.42, v0\.0\.43, v0\.0\.44, v0\.0\.45"):
        request_body_errors(spec, "POST", submit("v0.0.41"), good_body("v0.0.41"))


def test_a_real_servers_dump_of_two_versions() -> None:
    spec = load_spec_file(LIVE_23_11)  # slurmrestd 23.11.11: GET /openapi/v3
    assert spec_versions(spec) == ["v0.0.39", "v0.0.40"]
    for version in ("v0.0.39", "v0.0.40"):
        assert request_body_errors(spec, "POST", submit(version), good_body(version)) == []
        bad = good_body(version)
        bad["job"]["environment"] = {"PATH": "/bin"}
        bad["job"]["ntasks"] = 1
        assert request_body_errors(spec, "POST", submit(version), bad) == [
            "job.environment: {'PATH': '/bin'} is not of type 'array'",
            "job.ntasks: unknown field 'ntasks': the spec does not define it",
        ]


def test_operations_are_found_from_templates_and_concrete_paths() -> None:
    spec = load_spec("v0.0.42")
    assert find_operation(spec, "GET", "/slurm/v0.0.42/jobs") == ("/slurm/v0.0.42/jobs/", "get")
    assert find_operation(spec, "DELETE", "/slurm/v0.0.42/job/17") == (
        "/slurm/v0.0.42/job/{job_id}",
        "delete",
    )
    assert find_operation(spec, "POST", "/slurm/v0.0.42/job/submit/")[0].endswith("/submit")
    # v0.0.38's paths are relative to its server URL, /slurm/v0.0.38/
    assert find_operation(load_spec(38), "GET", "/slurm/v0.0.38/job/5") == ("/job/{job_id}", "get")
    with pytest.raises(KeyError, match="takes no request body"):
        request_body_errors(spec, "GET", "/slurm/v0.0.42/jobs", {})
    with pytest.raises(KeyError):
        find_operation(spec, "PATCH", "/slurm/v0.0.42/job/17")
    with pytest.raises(ValueError, match="no stored slurmrestd spec"):
        load_spec("v0.0.37")
