"""The test grid's release plumbing that needs no Slurm: which Debian mirror the chroots
come from, which host directories get bound into them, and how readiness reads the REST
fields of each release (tests/slurm_releases.py, tests/slurmgrid.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import slurm_releases
from tests.slurm_releases import RELEASES, Mount, bind_mounts
from tests.slurmgrid import _cli_argv, _ping_up, _release_of, node_states

DEB822 = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
"""


def test_the_mirror_is_the_hosts_debian_archive_not_security() -> None:
    entries = list(slurm_releases._sources_entries(DEB822, deb822=True))
    assert entries[0] == ("http://deb.debian.org/debian", ["bookworm", "bookworm-updates"])
    one_line = "deb [arch=amd64] http://mirror.example/debian bookworm main\n# deb x y\n"
    assert list(slurm_releases._sources_entries(one_line, deb822=False)) == [
        ("http://mirror.example/debian", ["bookworm"])
    ]


def test_debian_mirror_reads_this_hosts_apt_sources() -> None:
    mirror = slurm_releases.debian_mirror()
    assert mirror.startswith(("http://", "https://"))
    assert "security" not in mirror


def test_binds_keep_host_paths_and_skip_what_is_already_bound(tmp_path: Path) -> None:
    root = tmp_path / "chroot"
    mounts = bind_mounts(
        root,
        [Path("/tmp"), Path("/tmp/grid")],
        [Path("/srv/repo"), Path("/srv/repo/.venv"), Path("/opt/python")],
    )
    assert [(m.source, m.target, m.read_only) for m in mounts] == [
        ("/tmp", f"{root}/tmp", False),
        ("/srv/repo", f"{root}/srv/repo", True),
        ("/opt/python", f"{root}/opt/python", True),
    ]
    assert all(m.kind in ("bind", "rbind") for m in mounts)
    assert Mount("/x/dev", "rbind", "/dev").recursive


def test_missing_dirs_lists_what_mkdir_p_creates(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    assert slurm_releases.missing_dirs(target) == [
        str(tmp_path / "a"),
        str(tmp_path / "a" / "b"),
        str(target),
    ]
    assert slurm_releases.missing_dirs(tmp_path) == []


def test_each_release_and_its_rest_version() -> None:
    assert {v: (r.suite, r.rest_api) for v, r in RELEASES.items()} == {
        "22.05": (None, "v0.0.38"),
        "24.11": ("trixie", "v0.0.42"),
        "26.05": ("forky", "v0.0.45"),
    }
    assert _release_of("slurm-wlm 22.05.8\n") == "22.05"
    assert _release_of("slurm 26.05.5\n") == "26.05"
    assert _release_of("") is None


@pytest.mark.parametrize(
    ("ping", "up"),
    [
        ({"hostname": "localhost", "ping": "UP"}, True),  # v0.0.38
        ({"ping": "DOWN"}, False),
        ({"pinged": "UP"}, True),  # v0.0.40/41
        ({"pinged": "UP", "responding": False}, False),  # v0.0.42+: responding decides
        ({"responding": True, "status": "UP"}, True),  # v0.0.45
    ],
)
def test_ping_fields_of_every_rest_version(ping: dict[str, object], up: bool) -> None:
    assert _ping_up(ping) is up


def test_node_state_of_every_rest_version() -> None:
    assert node_states({"state": "idle", "state_flags": []}) == {"IDLE"}
    assert node_states({"state": "idle", "state_flags": ["NOT_RESPONDING"]}) == {
        "IDLE",
        "NOT_RESPONDING",
    }
    assert node_states({"state": ["IDLE"]}) == {"IDLE"}
    assert node_states({"state": ["MIXED", "DRAIN"]}) == {"MIXED", "DRAIN"}


def test_cli_of_a_chroot_release_runs_its_own_tool_with_a_clean_environment() -> None:
    conf = Path("/tmp/grid/gamma/slurm.conf")
    argv = _cli_argv(conf, Path("/var/cache/gridcore-slurm/trixie"), ["squeue", "-h"])
    assert argv[1:] == [
        "/var/cache/gridcore-slurm/trixie",
        "/usr/bin/env",
        "-i",
        f"PATH={slurm_releases.CHROOT_PATH}",
        f"SLURM_CONF={conf}",
        "squeue",
        "-h",
    ]
    assert Path(argv[0]).name == "chroot"
    host = _cli_argv(conf, None, ["scontrol", "ping"], {"SLURM_TIME_FORMAT": "standard"})
    assert host[:2] == ["/usr/bin/env", "-i"]
    assert host[-3:] == ["SLURM_TIME_FORMAT=standard", "scontrol", "ping"]
