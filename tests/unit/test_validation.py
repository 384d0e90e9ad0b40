"""gridcore.validation: the limits are the state database's columns, valid input converts
to the same domain values, and each refusal is one line naming the field."""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import BigInteger, Integer, String

from gridcore import validation
from gridcore.config import parse_grid
from gridcore.errors import ConfigError, RequestError
from gridcore.model import (
    CoAllocationRequest,
    Component,
    FileDelivery,
    FlexibleOptions,
    InputFile,
    JobRequest,
    JobSubmission,
    Priority,
    RequestKind,
)
from gridcore.state import schema

SITE_COLUMNS = {"site", "src", "dst", "file_site"}


def test_name_limits_are_the_columns() -> None:
    for table in schema.metadata.tables.values():
        for column in table.columns:
            if column.name in SITE_COLUMNS or (table is schema.sites and column.name == "name"):
                assert isinstance(column.type, String)
                assert column.type.length == validation.SITE_NAME_MAX, column
    for table in (schema.selections, schema.coalloc_jobs, schema.local_jobs):
        assert table.c.name.type.length == validation.JOB_NAME_MAX
    assert schema.selections.c.stream.type.length == validation.STREAM_MAX
    assert schema.replicas.c.logical_name.type.length == validation.LOGICAL_NAME_MAX


def test_integer_limits_are_the_column_types() -> None:
    assert isinstance(schema.selections.c.processors.type, Integer)
    assert isinstance(schema.coalloc_components.c.size.type, Integer)
    assert isinstance(schema.sites.c.total_processors.type, Integer)
    assert isinstance(schema.replicas.c.size_bytes.type, BigInteger)
    assert (validation.INT32_MAX, validation.INT64_MAX) == (2**31 - 1, 2**63 - 1)


def test_a_valid_grid_converts_with_storage_dirs_normalised() -> None:
    grid = parse_grid(
        {
            "version": 1,
            "sites": {
                "a": {"kind": "local", "processors": 2**31 - 1, "storage_dir": "/srv//a/./b/"},
                "b": {
                    "kind": "slurm",
                    "processors": 4,
                    "slowness": 2,  # an integer is a fine number
                    "url": "https://h:6820/slurm/",
                    "token": {"airflow_conn": "b_slurm"},
                    "storage_dir": "sftp://u@h:22//data/./grid/",
                    "storage_gb": 0.5,
                },
            },
            "bandwidth": {"origin": {"a": 10, "b": 2.5}},
        },
        source="g.toml",
    )
    a, b = grid.sites
    assert (a.storage_dir, a.processors, a.url, a.partition) == ("/srv/a/b", 2**31 - 1, None, None)
    assert (b.storage_dir, b.url, b.slowness) == (
        "sftp://u@h:22/data/grid",
        "https://h:6820/slurm",
        2.0,
    )
    assert (b.partition, b.user, b.storage_bytes) == ("debug", "root", 500_000_000)
    assert (
        isinstance(b.slowness, float) and b.token is not None and b.token.airflow_conn == "b_slurm"
    )
    assert grid.bandwidth("origin", "b") == 2.5 and isinstance(grid.bandwidth("origin", "a"), float)


@pytest.mark.parametrize(
    "request_",
    [
        JobRequest("member.1", 8, 12.5, 10, 20, "origin"),
        JobRequest("m", 2**31 - 1, 0, 2**63 - 1, 0, "local-a"),
    ],
)
def test_valid_job_requests_pass_unchanged(request_: JobRequest) -> None:
    assert validation.check_job_request(request_, ["local-a"]) == request_


def test_mappings_convert_into_the_domain_types() -> None:
    assert validation.check_job_request({"name": "j", "processors": 2}) == JobRequest("j", 2)
    request = validation.check_coallocation_request(
        {
            "name": "j",
            "kind": "flexible",
            "total": 8,
            "input_file": {"logical_name": "in/data.h5", "delivery": "chunked"},
            "priority": "high",
            "flexible": {"min_component_size": 2, "splits": [[4, 4]]},
        }
    )
    assert request == CoAllocationRequest(
        "j",
        RequestKind.FLEXIBLE,
        total=8,
        input_file=InputFile("in/data.h5", FileDelivery.CHUNKED),
        priority=Priority.HIGH,
        flexible=FlexibleOptions(2, None, ((4, 4),)),
    )
    job = validation.check_job_submission({"name": "j", "command": "true", "processors": 1})
    assert job == JobSubmission("j", "true", 1)


def test_a_valid_coallocation_submission_passes_unchanged() -> None:
    request = CoAllocationRequest("j", RequestKind.FIXED, (Component(2, "a"), Component(3, "b")))
    assert validation.check_coallocation_submission(request, "run", 0.5, ["a", "b"]) == (
        request,
        "run",
        0.5,
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("not a table", "g.toml: must be a table of keys, got 'not a table'"),
        ({"version": 1, "sites": {}}, "g.toml: sites: at least one [sites.NAME] table is required"),
        ({"version": 1}, "g.toml: sites: at least one [sites.NAME] table is required"),
        ({"sites": {"a": {"kind": "local", "processors": 1}}}, "g.toml: version: is required"),
        (
            {
                "version": 1,
                "sites": {"a": {"kind": "local", "processors": 1, "storage_dir": "ftp://h/x"}},
            },
            "g.toml: sites.a.storage_dir: must be a path or sftp://user@host:port/path, got 'ftp://h/x'",
        ),
        (
            {
                "version": 1,
                "sites": {"a": {"kind": "local", "processors": 1, "storage_dir": "sftp://h/../x"}},
            },
            "g.toml: sites.a.storage_dir: must not contain '..' (it would escape the directory),"
            " got 'sftp://h/../x'",
        ),
        (
            {"version": 1, "sites": {"a\nb": {"kind": "local", "processors": 1}}},
            "g.toml: sites.\"a\\nb\": site name must be letters, digits, - or _, got 'a\\nb'",
        ),
    ],
)
def test_grid_refusals_are_one_line(raw: Any, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_grid(raw, source="g.toml")
    assert str(refused.value) == message
    assert "\n" not in str(refused.value)


def test_request_refusals_are_one_line_and_never_echo_a_huge_value() -> None:
    with pytest.raises(RequestError) as refused:
        validation.check_job_request(JobRequest("x" * 100_000, 1))
    assert len(str(refused.value)) < 200 and "\n" not in str(refused.value)
    with pytest.raises(RequestError, match=r"^request\.runtime_s: .*, got -inf$"):
        validation.check_job_request(JobRequest("j", 1, -math.inf))
    with pytest.raises(RequestError, match=r"^request\.name: must be a string, got None$"):
        validation.check_job_request({"name": None, "processors": 1})
    with pytest.raises(RequestError, match=r"^request\.cpus: unknown key$"):
        validation.check_job_request({"name": "j", "processors": 1, "cpus": 2})
