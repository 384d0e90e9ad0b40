"""The barrier command line a co-allocated component is submitted with, checked without
a grid (KOALA 2005 Sec. 3.3: every component first waits at the start barrier). It names
the VJ center and carries the component's token in the environment; no database URL."""

from __future__ import annotations

import shlex

import pytest

from gridcore.engine.barrier_command import TOKEN_ENV, barrier_command
from gridcore.errors import RequestError

TOKEN = "tok-Abc_123"


def build(
    command: str = "echo hi; exit 3", bind: str | None = None
) -> tuple[list[str], dict[str, str]]:
    built = barrier_command(
        job_id=7,
        component=2,
        count=3,
        epoch=4,
        timeout_s=612.4,
        center_url="http://10.0.0.1:8793/",
        token=TOKEN,
        python="/opt/py/bin/python",
        command=command,
        bind=bind,
    )
    assert shlex.split(built.shell) == list(built.argv)
    return list(built.argv), dict(built.env)


def test_the_center_is_on_the_command_line_and_the_token_in_the_environment() -> None:
    argv, env = build()
    assert argv == [
        "/opt/py/bin/python",
        "-m",
        "gridcore.barrier",
        "--center",
        "http://10.0.0.1:8793",
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
    assert env == {
        "GRIDCORE_JOB": "7",
        "GRIDCORE_COMPONENT": "2",
        "GRIDCORE_COMPONENTS": "3",
        TOKEN_ENV: TOKEN,
    }
    assert not any(TOKEN in a for a in argv)
    assert "--db" not in argv and "GRIDCORE_DB_URL" not in env


def test_a_bind_address_is_passed_on() -> None:
    argv, _ = build(bind="0.0.0.0")
    assert argv[argv.index("--bind") :][:2] == ["--bind", "0.0.0.0"]
    assert argv.index("--bind") < argv.index("--")


def test_the_parsed_command_line_is_what_the_barrier_reads() -> None:
    from gridcore.barrier import _parse

    argv, _ = build("a 'quoted' && b", bind="0.0.0.0")
    args = _parse(argv[3:])
    assert (args.center, args.job, args.component, args.epoch, args.timeout, args.bind) == (
        "http://10.0.0.1:8793",
        7,
        2,
        4,
        612.0,
        "0.0.0.0",
    )
    assert args.command == ["/bin/sh", "-c", "a 'quoted' && b"]


@pytest.mark.parametrize(
    ("center_url", "token", "says"),
    [
        ("postgresql://gc:pw@db/grid", TOKEN, "must be http"),
        ("10.0.0.1:8793", TOKEN, "must be http"),
        ("http://10.0.0.1:8793", "", "no barrier token"),
    ],
    ids=["a database URL", "no scheme", "no token"],
)
def test_a_command_without_a_center_url_or_token_is_refused(
    center_url: str, token: str, says: str
) -> None:
    with pytest.raises(RequestError, match=says):
        barrier_command(
            job_id=1, component=0, count=1, epoch=0, timeout_s=1.0, center_url=center_url,
            token=token, python="python", command="true",
        )  # fmt: skip


def test_the_command_is_frozen() -> None:
    built = barrier_command(
        job_id=1, component=0, count=1, epoch=0, timeout_s=1.0, center_url="http://c",
        token=TOKEN, python="python", command="true",
    )  # fmt: skip
    with pytest.raises(AttributeError):
        built.argv = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        built.env["X"] = "y"  # type: ignore[index]
