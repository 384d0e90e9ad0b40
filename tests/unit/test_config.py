"""The grid description format: valid files load; every mistake names file and field."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from gridcore.config import load_grid, parse_grid
from gridcore.errors import ConfigError
from gridcore.model import NO_RESOURCES, CredentialRef, JobResources, MemoryScope, SiteKind

VALID = """
version = 1
default_bandwidth_mbps = 50

[sites.alpha]
kind = "slurm"
processors = 16
slowness = 1.2
url = "http://127.0.0.1:6820/"
token = { env = "ALPHA_TOKEN" }
storage_gb = 2

[sites.laptop]
kind = "local"
processors = 4

[bandwidth]
origin = { alpha = 200.0 }
alpha = { laptop = 10 }
"""


def test_valid_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "grid.toml"
    path.write_text(VALID)
    grid = load_grid(path)
    alpha = grid.site("alpha")
    assert alpha.kind is SiteKind.SLURM and alpha.processors == 16 and alpha.slowness == 1.2
    assert alpha.url == "http://127.0.0.1:6820" and alpha.partition == "debug"
    assert alpha.token == CredentialRef(env="ALPHA_TOKEN") and alpha.storage_bytes == 2_000_000_000
    assert grid.bandwidth("origin", "alpha") == 200.0
    assert grid.bandwidth("laptop", "alpha") == 10.0  # reverse pair is symmetric
    assert grid.bandwidth("origin", "laptop") == 50.0  # default
    assert grid.bandwidth("alpha", "alpha") == float("inf")


BASE = {"version": 1, "sites": {"a": {"kind": "local", "processors": 4}}}
SITE = '[sites.a]\nkind = "local"\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # issue 21 item 6: this read "sites.a.processors: is required", the typo unnamed
        (
            f"version = 1\n{SITE}procesors = 4\n",
            'sites.a.procesors: unknown key (did you mean "processors"?)',
        ),
        (f"verison = 1\n{SITE}processors = 4\n", 'verison: unknown key (did you mean "version"?)'),
        (
            f"version = 1\ndefault_bandwith_mbps = 10\n{SITE}processors = 4\n",
            'default_bandwith_mbps: unknown key (did you mean "default_bandwidth_mbps"?)',
        ),
        (
            f"version = 1\n{SITE}processors = 4\nslownes = 2\n",
            'sites.a.slownes: unknown key (did you mean "slowness"?)',
        ),
        # nothing close: the key alone, still before the missing one
        (f"version = 1\n{SITE}cpus = 4\n", "sites.a.cpus: unknown key"),
    ],
    ids=["procesors", "verison", "default_bandwith_mbps", "slownes", "cpus"],
)
def test_a_misspelt_key_is_named_with_the_closest_known_one(
    text: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "grid.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_grid(path)
    assert str(err.value) == f"{path}: {message}"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 2}, "version: must be 1, got 2"),
        ({"sites": {}}, "sites: at least one [sites.NAME] table is required"),
        (
            {"sites": {"a": {"kind": "pbs", "processors": 4}}},
            "sites.a.kind: must be local | slurm, got 'pbs'",
        ),
        (
            {"sites": {"a": {"kind": "local", "processors": 0}}},
            "sites.a.processors: must be a positive integer (at most 2147483647), got 0",
        ),
        (
            {"sites": {"a": {"kind": "local", "processors": 4, "slowness": -1}}},
            "sites.a.slowness: must be a finite number > 0, got -1",
        ),
        (
            {"sites": {"a": {"kind": "local", "processors": 4, "cpus": 4}}},
            "sites.a.cpus: unknown key",
        ),
        (
            {"sites": {"a": {"kind": "local", "processors": 4, "url": "http://x"}}},
            "only apply to slurm",
        ),
        (
            {"sites": {"a": {"kind": "slurm", "processors": 4, "token": {"env": "T"}}}},
            "sites.a.url: slurm sites need an http(s) slurmrestd URL",
        ),
        (
            {
                "sites": {
                    "a": {"kind": "slurm", "processors": 4, "url": "http://x", "token": "s3cret"}
                }
            },
            "never the token itself",
        ),
        (
            {
                "sites": {
                    "a": {
                        "kind": "slurm",
                        "processors": 4,
                        "url": "http://x",
                        "token": {"vault": "x"},
                    }
                }
            },
            "unknown credential reference",
        ),
        (
            {
                "sites": {
                    "a": {
                        "kind": "slurm",
                        "processors": 4,
                        "url": "http://x",
                        "token": {"env": "T"},
                        "api_version": "v0.0.37",
                    }
                }
            },
            "sites.a.api_version",
        ),
        ({"sites": {"origin": {"kind": "local", "processors": 4}}}, "sites.origin: site name"),
        ({"bandwidth": {"origin": {"b": 10}}}, "bandwidth.origin.b: unknown site"),
        (
            {"bandwidth": {"origin": {"a": 0}}},
            "bandwidth.origin.a: must be a finite number > 0, got 0",
        ),
        ({"extra": 1}, "g.toml: extra: unknown key"),
    ],
)
def test_each_mistake_is_named(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_grid({**BASE, **change}, source="g.toml")
    assert message in str(err.value)
    assert str(err.value).startswith("g.toml: ")


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_grid(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("version = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_grid(bad)


def test_unknown_site_lookup_lists_known_sites(tmp_path: Path) -> None:
    grid = parse_grid(BASE, source="g.toml")
    with pytest.raises(ConfigError, match=r"unknown site 'zz' .*has: a"):
        grid.site("zz")


DEFAULTS = """
version = 1

[sites.alpha]
kind = "slurm"
processors = 16
url = "http://127.0.0.1:6820"
token = { env = "ALPHA_TOKEN" }

[sites.alpha.defaults]
time_limit = "1-00:00"
account = "proj42"
qos = "normal"
partition = "batch"
memory_per_cpu = "2G"
gpus = 1
constraint = "intel&ib"

[sites.beta]
kind = "slurm"
processors = 8
url = "http://127.0.0.1:6821"
defaults = { time_limit = "1h", account = "proj42" }

[sites.laptop]
kind = "local"
processors = 4
defaults = { time_limit = 1800, memory = "4G", account = "ignored-here" }

[sites.plain]
kind = "local"
processors = 2
"""


def test_site_defaults_load_from_tables_and_inline_tables(tmp_path: Path) -> None:
    path = tmp_path / "grid.toml"
    path.write_text(DEFAULTS)
    grid = load_grid(path)
    assert grid.site("alpha").defaults == JobResources(
        86400, "proj42", "normal", "batch", 2048, MemoryScope.CPU, 1, "intel&ib"
    )
    assert grid.site("beta").defaults == JobResources(time_limit_s=3600, account="proj42")
    assert grid.site("laptop").defaults == JobResources(
        time_limit_s=1800, account="ignored-here", memory_mib=4096
    )
    assert grid.site("plain").defaults == NO_RESOURCES
    assert grid.site("alpha").partition == "debug"  # the site's own; defaults go over it


@pytest.mark.parametrize(
    ("defaults", "message"),
    [
        (
            {"time": "1h"},
            "g.toml: sites.a.defaults.time: unknown key (known: time_limit, account, qos,"
            " partition, memory, memory_per_cpu, gpus, constraint)",
        ),
        (
            {"time_limit": "10x"},
            "g.toml: sites.a.defaults.time_limit: '10x' is not a duration"
            " (use 90s, 10m, 2h, 1d or D-HH:MM:SS)",
        ),
        (
            {"memory": "lots"},
            "g.toml: sites.a.defaults.memory: 'lots' is not a memory size"
            " (use 512M, 4G, 1T or an integer of MiB)",
        ),
        (
            {"memory": "1G", "memory_per_cpu": "1G"},
            "g.toml: sites.a.defaults.memory_per_cpu: give memory (per node) or"
            " memory_per_cpu, not both",
        ),
        ({"gpus": 1}, "g.toml: sites.a.defaults.gpus: a local site has no GPUs"),
        ("1h", "g.toml: sites.a.defaults: must be a table, got '1h'"),
    ],
)
def test_each_mistake_in_a_sites_defaults_is_named(defaults: object, message: str) -> None:
    raw = {"version": 1, "sites": {"a": {"kind": "local", "processors": 4, "defaults": defaults}}}
    with pytest.raises(ConfigError) as err:
        parse_grid(raw, source="g.toml")
    assert str(err.value) == message


def test_the_documented_format_parses(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "grid-file.md").read_text()
    example = doc.split("Format (version 1):\n\n```toml\n")[1].split("```")[0]
    grid = parse_grid(tomllib.loads(example), source="docs/grid-file.md")
    assert grid.site("alpha").defaults.time_limit_s == 3600
    assert grid.site("laptop").defaults == JobResources(time_limit_s=1800)


@pytest.mark.parametrize(
    ("what", "text"),
    [
        ("100,000 nested arrays", "version = 1\nx = " + "[" * 100_000 + "]" * 100_000 + "\n"),
        ("3,000 nested inline tables", "version = 1\nx = " + "{a = " * 3000 + "1" + "}" * 3000),
        ("500 nested arrays", "version = 1\nx = " + "[" * 500 + "]" * 500 + "\n"),
    ],
)
def test_a_deeply_nested_grid_file_is_one_error_naming_the_file(
    tmp_path: Path, what: str, text: str
) -> None:
    """Issue 21 item 12: no RecursionError traceback, whatever the depth."""
    path = tmp_path / "deep.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: ") as err:
        load_grid(path)
    assert "\n" not in str(err.value), what


def test_a_deeply_nested_pipeline_file_is_one_error_naming_the_file(tmp_path: Path) -> None:
    from gridcore.dataplan.format import load_pipeline

    path = tmp_path / "deep.toml"
    path.write_text("version = 1\nx = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: "):
        load_pipeline(path)
