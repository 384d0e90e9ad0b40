"""The barrier command line a co-allocated component is submitted with, checked without
a grid (seed 000 Sec. 3.3: every component first waits at the start barrier)."""

from __future__ import annotations

import shlex

import pytest

from gridcore.engine.barrier_command import barrier_command


def build(db_url: str, command: str = "echo hi; exit 3") -> tuple[list[str], dict[str, str]]:
    built = barrier_command(
        job_id=7,
        component=2,
        count=3,
        epoch=4,
        timeout_s=612.4,
        db_url=db_url,
        python="/opt/py/bin/python",
        command=command,
    )
    assert shlex.split(built.shell) == list(built.argv)
    return list(built.argv), dict(built.env)


def test_a_url_without_password_is_passed_on_the_command_line() -> None:
    argv, env = build("sqlite:////tmp/state.db")
    assert argv == [
        "/opt/py/bin/python",
        "-m",
        "gridcore.barrier",
        "--db",
        "sqlite:////tmp/state.db",
        "--job",
        "7",
        "--component",
        "2",
        "--epoch",
        "4",
        "--timeout",
        "612",
        "--",
        "/bin/sh",
        "-c",
        "echo hi; exit 3",
    ]
    assert env == {"GRIDCORE_JOB": "7", "GRIDCORE_COMPONENT": "2", "GRIDCORE_COMPONENTS": "3"}


def test_a_password_never_appears_on_the_command_line() -> None:
    url = "postgresql+psycopg://gc:s3cret@db:5432/grid"
    argv, env = build(url)
    assert not any("s3cret" in a for a in argv) and "--db" not in argv
    assert env["GRIDCORE_DB_URL"] == url
    assert argv[argv.index("--job") :][:2] == ["--job", "7"]


def test_the_parsed_command_line_is_what_the_barrier_reads() -> None:
    from gridcore.barrier import _parse

    argv, _ = build("sqlite:////tmp/state.db", "a 'quoted' && b")
    args = _parse(argv[3:])
    assert (args.db, args.job, args.component, args.epoch, args.timeout) == (
        "sqlite:////tmp/state.db",
        7,
        2,
        4,
        612.0,
    )
    assert args.command == ["/bin/sh", "-c", "a 'quoted' && b"]


def test_the_command_is_frozen() -> None:
    built = barrier_command(
        job_id=1, component=0, count=1, epoch=0, timeout_s=1.0, db_url="sqlite://",
        python="python", command="true",
    )  # fmt: skip
    with pytest.raises(AttributeError):
        built.argv = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        built.env["X"] = "y"  # type: ignore[index]
