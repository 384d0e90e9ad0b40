"""The grid description format: valid files load; every mistake names file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridcore.config import load_grid, parse_grid
from gridcore.errors import ConfigError
from gridcore.model import CredentialRef, SiteKind

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
