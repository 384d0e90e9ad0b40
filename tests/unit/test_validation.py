"""gridcore.validation: the limits are the state database's columns, valid input converts
to the same domain values, and each refusal is one line naming the field."""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import BigInteger, Integer, String

from gridcore import validation
from gridcore.config import parse_grid
from gridcore.engine.submission import resources_at
from gridcore.errors import ConfigError, RequestError
from gridcore.model import (
    NO_RESOURCES,
    CoAllocationRequest,
    Component,
    FileDelivery,
    FlexibleOptions,
    InputFile,
    JobRequest,
    JobResources,
    JobSubmission,
    MemoryScope,
    Priority,
    RequestKind,
    SiteKind,
    SiteSpec,
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


# -- job resources: one parser, every format, every refusal named --------------------------

DURATION_HINT = "(use 90s, 10m, 2h, 1d or D-HH:MM:SS)"


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        ("90s", 90),
        ("10m", 600),
        ("2h", 7200),
        ("1d", 86400),
        ("2H", 7200),  # units in either case
        (" 10m ", 600),  # surrounding blanks
        ("90", 5400),  # Slurm's MM: minutes, as sbatch --time=90
        ("90:30", 5430),  # MM:SS; the leading field may pass its clock range
        ("1:02:03", 3723),  # HH:MM:SS
        ("36:00:00", 129600),
        ("2-12", 2 * 86400 + 12 * 3600),  # D-HH
        ("2-12:30", 2 * 86400 + 12 * 3600 + 30 * 60),  # D-HH:MM
        ("0-00:00:05", 5),  # D-HH:MM:SS
        (3600, 3600),  # an integer is seconds
        (1, 1),
        (2**31 - 1, 2**31 - 1),
    ],
)
def test_every_time_limit_format_parses_to_whole_seconds(given: Any, seconds: int) -> None:
    assert validation.check_resources({"time_limit": given}).time_limit_s == seconds


@pytest.mark.parametrize(
    ("given", "mib"),
    [
        ("512M", 512),
        ("4G", 4096),
        ("1T", 1024 * 1024),
        ("2048K", 2),
        ("1500K", 2),  # rounded up to a whole MiB: never less than asked
        ("1.5G", 1536),
        ("4g", 4096),
        ("4096", 4096),  # a bare number is MiB, as Slurm's
        (4096, 4096),  # an integer is MiB
    ],
)
def test_every_memory_format_parses_to_mib(given: Any, mib: int) -> None:
    per_node = validation.check_resources({"memory": given})
    per_cpu = validation.check_resources({"memory_per_cpu": given})
    assert (per_node.memory_mib, per_node.memory_per) == (mib, MemoryScope.NODE)
    assert (per_cpu.memory_mib, per_cpu.memory_per) == (mib, MemoryScope.CPU)


def test_every_key_converts_into_job_resources() -> None:
    got = validation.check_resources(
        {
            "time_limit": "1-00:00:00",
            "account": "proj42",
            "qos": "normal",
            "partition": "gpu",
            "memory": "4G",
            "gpus": 2,
            "constraint": "intel&(ib|opa)*2",
            "memory_per_cpu": None,  # None is unset (an operator's default)
        }
    )
    assert got == JobResources(86400, "proj42", "normal", "gpu", 4096, MemoryScope.NODE, 2,
                               "intel&(ib|opa)*2")  # fmt: skip
    assert validation.check_resources(None) == NO_RESOURCES
    assert validation.check_resources({}) == NO_RESOURCES
    # a JobResources is re-checked, and the keys users write give it back
    assert validation.check_resources(got) == got
    assert validation.check_resources(validation.resource_keys(got)) == got


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"time_limit": "10x"}, f"time_limit: '10x' is not a duration {DURATION_HINT}"),
        ({"time_limit": ""}, f"time_limit: '' is not a duration {DURATION_HINT}"),
        ({"time_limit": "1h30m"}, f"time_limit: '1h30m' is not a duration {DURATION_HINT}"),
        ({"time_limit": "-5"}, f"time_limit: '-5' is not a duration {DURATION_HINT}"),
        ({"time_limit": "1:2:3:4"}, f"time_limit: '1:2:3:4' is not a duration {DURATION_HINT}"),
        ({"time_limit": "1-2:3:4:5"}, f"time_limit: '1-2:3:4:5' is not a duration {DURATION_HINT}"),
        ({"time_limit": "x-10"}, f"time_limit: 'x-10' is not a duration {DURATION_HINT}"),
        (
            {"time_limit": "1:75:00"},
            "time_limit: '1:75:00' is not a duration (minutes must be 0-59;"
            " use 90s, 10m, 2h, 1d or D-HH:MM:SS)",
        ),
        (
            {"time_limit": "10:60"},
            "time_limit: '10:60' is not a duration (seconds must be 0-59;"
            " use 90s, 10m, 2h, 1d or D-HH:MM:SS)",
        ),
        (
            {"time_limit": "1-24"},
            "time_limit: '1-24' is not a duration (hours must be 0-23;"
            " use 90s, 10m, 2h, 1d or D-HH:MM:SS)",
        ),
        ({"time_limit": 0}, "time_limit: must be from 1 second to 2147483647 seconds, got 0"),
        ({"time_limit": "0s"}, "time_limit: must be from 1 second to 2147483647 seconds, got '0s'"),
        (
            {"time_limit": "99999d"},
            "time_limit: must be from 1 second to 2147483647 seconds, got '99999d'",
        ),
        (
            {"time_limit": 1.5},
            f"time_limit: must be a duration {DURATION_HINT} or an integer of seconds, got 1.5",
        ),
        (
            {"time_limit": True},
            f"time_limit: must be a duration {DURATION_HINT} or an integer of seconds, got True",
        ),
        (
            {"memory": "4X"},
            "memory: '4X' is not a memory size (use 512M, 4G, 1T or an integer of MiB)",
        ),
        (
            {"memory": "4 GB"},
            "memory: '4 GB' is not a memory size (use 512M, 4G, 1T or an integer of MiB)",
        ),
        (
            {"memory_per_cpu": "-1G"},
            "memory_per_cpu: '-1G' is not a memory size (use 512M, 4G, 1T or an integer of MiB)",
        ),
        ({"memory": 0}, "memory: must be from 1 MiB to 2147483647 MiB, got 0"),
        ({"memory": "0G"}, "memory: must be from 1 MiB to 2147483647 MiB, got '0G'"),
        (
            {"memory": 4.0},
            "memory: must be a memory size (use 512M, 4G, 1T or an integer of MiB), got 4.0",
        ),
        (
            {"memory": "4G", "memory_per_cpu": "1G"},
            "memory_per_cpu: give memory (per node) or memory_per_cpu, not both",
        ),
        ({"gpus": -1}, "gpus: must be an integer of GPUs >= 0 (at most 2147483647), got -1"),
        ({"gpus": "2"}, "gpus: must be an integer of GPUs >= 0 (at most 2147483647), got '2'"),
        ({"gpus": 1.0}, "gpus: must be an integer of GPUs >= 0 (at most 2147483647), got 1.0"),
        ({"account": ""}, "account: must not be empty, got ''"),
        ({"qos": 5}, "qos: must be a string, got 5"),
        (
            {"partition": "a\nb"},
            "partition: must not be blank or contain control characters, got 'a\\nb'",
        ),
        (
            {"constraint": "intel; rm -rf /"},
            "constraint: must be a Slurm feature expression: feature names (letters, digits,"
            " _ . : + @ / -) joined by & | , with ( ) [ ] and *N counts, no spaces,"
            " got 'intel; rm -rf /'",
        ),
        (
            {"time": "1h"},
            "time: unknown key (known: time_limit, account, qos, partition, memory,"
            " memory_per_cpu, gpus, constraint)",
        ),
        ("1h", "must be a table of resources, got '1h'"),
    ],
)
def test_each_bad_resource_is_refused_naming_its_field(raw: Any, message: str) -> None:
    with pytest.raises(RequestError) as refused:
        validation.check_resources(raw)
    assert str(refused.value) == message


def test_a_resource_refusal_can_be_named_by_the_caller() -> None:
    def named(field: str, problem: str) -> ConfigError:
        return ConfigError(f"pipe.toml: depths[1].resources.{field}: {problem}")

    with pytest.raises(ConfigError) as refused:
        validation.check_resources({"time_limit": "10x"}, error=named)
    assert str(refused.value) == (
        f"pipe.toml: depths[1].resources.time_limit: '10x' is not a duration {DURATION_HINT}"
    )
    with pytest.raises(RequestError, match=r"^job\.resources\.gpus: must be an integer"):
        validation.check_job_submission(
            JobSubmission("j", "true", 1, resources=JobResources(gpus=-1))
        )


def test_requests_carry_their_resources_through_validation() -> None:
    asked = JobResources(time_limit_s=600, account="p")
    job = validation.check_job_submission(
        {"name": "j", "command": "true", "processors": 1, "resources": {"time_limit": "10m",
                                                                          "account": "p"}}
    )  # fmt: skip
    assert job.resources == asked
    request = validation.check_coallocation_request(
        CoAllocationRequest("j", RequestKind.NON_FIXED, (Component(2),), resources=asked)
    )
    assert request.resources == asked
    reservation = validation.check_coreservation_request(
        {"name": "j", "command": "true", "processors": 2, "resources": {"qos": "high"}}
    )
    assert reservation.resources == JobResources(qos="high")
    with pytest.raises(RequestError, match=r"^resources\.time_limit: '1x' is not a duration"):
        validation.check_coreservation_request(
            {"name": "j", "command": "true", "processors": 2, "resources": {"time_limit": "1x"}}
        )


# -- merging over a site's defaults -------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "defaults", "sent"),
    [
        (NO_RESOURCES, NO_RESOURCES, NO_RESOURCES),
        (  # nothing asked: the site's defaults
            NO_RESOURCES,
            JobResources(3600, "proj", "normal", memory_mib=1024),
            JobResources(3600, "proj", "normal", memory_mib=1024),
        ),
        (  # each key asked wins over its default, key by key
            JobResources(time_limit_s=60, qos="high"),
            JobResources(3600, "proj", "normal", "batch", constraint="intel"),
            JobResources(60, "proj", "high", "batch", constraint="intel"),
        ),
        (  # memory and its scope go together: per-cpu asked over a per-node default
            JobResources(memory_mib=512, memory_per=MemoryScope.CPU),
            JobResources(memory_mib=8192),
            JobResources(memory_mib=512, memory_per=MemoryScope.CPU),
        ),
        (  # a per-cpu default when the job asks no memory
            JobResources(gpus=1),
            JobResources(memory_mib=2048, memory_per=MemoryScope.CPU, gpus=4),
            JobResources(memory_mib=2048, memory_per=MemoryScope.CPU, gpus=1),
        ),
        (NO_RESOURCES, JobResources(gpus=2), JobResources(gpus=2)),
    ],
)
def test_resources_go_over_the_sites_defaults_key_by_key(
    asked: JobResources, defaults: JobResources, sent: JobResources
) -> None:
    site = SiteSpec("a", SiteKind.SLURM, 4, defaults=defaults)
    assert resources_at(asked, site) == asked.over(defaults) == sent


def test_resources_round_trip_through_their_json() -> None:
    full = JobResources(60, "a", "q", "p", 512, MemoryScope.CPU, 2, "x&y")
    for resources in (NO_RESOURCES, full, JobResources(time_limit_s=5)):
        assert JobResources.from_json(resources.as_json()) == resources
    assert full.as_json() == {
        "time_limit_s": 60,
        "account": "a",
        "qos": "q",
        "partition": "p",
        "constraint": "x&y",
        "memory_mib": 512,
        "memory_per": "cpu",
        "gpus": 2,
    }
    assert NO_RESOURCES.as_json() == {} and JobResources.from_json(None) == NO_RESOURCES


def test_a_flexible_name_leaves_room_for_as_many_components_as_it_may_have() -> None:
    """Issue 21 item 18: a flexible request has at most min(total / min_component_size,
    max_components) components, so NAME#1 is the longest a 2-component cap allows."""
    from gridcore.model import CoAllocationRequest, FlexibleOptions, RequestKind
    from gridcore.validation import check_coallocation_request

    capped = FlexibleOptions(max_components=2)
    fits = CoAllocationRequest("n" * 254, RequestKind.FLEXIBLE, total=100, flexible=capped)
    assert check_coallocation_request(fits).name == "n" * 254
    uncapped = CoAllocationRequest("n" * 254, RequestKind.FLEXIBLE, total=100)
    with pytest.raises(RequestError, match=r"at most 253 characters.*up to #99\), got 254"):
        check_coallocation_request(uncapped)
