"""Credential references resolve, and renew, without ever echoing the secret."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gridcore import credentials
from gridcore.config import parse_grid
from gridcore.errors import ConfigError, CredentialError
from gridcore.model import CredentialRef


def test_env_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GC_TEST_TOKEN", "tok")
    assert credentials.resolve(CredentialRef(env="GC_TEST_TOKEN")) == "tok"
    monkeypatch.delenv("GC_TEST_TOKEN")
    with pytest.raises(CredentialError, match="env:GC_TEST_TOKEN is not set"):
        credentials.resolve(CredentialRef(env="GC_TEST_TOKEN"))


def test_airflow_conn_from_environment_uri_and_json(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another test module may have imported operators/, which registers Airflow's resolver.
    monkeypatch.setattr(credentials, "_conn_resolver", None)
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_A", "http://root:p%40ss@host:6820")
    assert credentials.resolve(CredentialRef(airflow_conn="slurm_a")) == "p@ss"
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_A", '{"conn_type": "http", "password": "jt"}')
    assert credentials.resolve(CredentialRef(airflow_conn="slurm_a")) == "jt"
    monkeypatch.delenv("AIRFLOW_CONN_SLURM_A")
    with pytest.raises(CredentialError, match="AIRFLOW_CONN_SLURM_A is not set"):
        credentials.resolve(CredentialRef(airflow_conn="slurm_a"))


def test_registered_resolver_errors_name_the_reference_and_keep_the_cause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def boom(conn_id: str) -> str:
        raise KeyError(conn_id)

    monkeypatch.setattr(credentials, "_conn_resolver", boom)
    with pytest.raises(CredentialError, match="airflow_conn:missing") as err:
        credentials.resolve(CredentialRef(airflow_conn="missing"))
    assert isinstance(err.value.__cause__, KeyError)


SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param('{"conn_type": "http", "password": "' + SECRET + '"', "bad JSON", id="json"),
        pytest.param('{"conn_type": "http", "extra": "' + SECRET + '"}', "no password", id="nopw"),
        pytest.param(f"http://{SECRET}@host:6820", "no password", id="uri-user-only"),
    ],
)
def test_unusable_connections_name_the_reference_not_the_secret(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    # The variable holds the secret, but in a form that yields no password.
    monkeypatch.setattr(credentials, "_conn_resolver", None)
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_A", value)
    with pytest.raises(CredentialError, match=message) as err:
        credentials.resolve(CredentialRef(airflow_conn="slurm_a"))
    assert "airflow_conn:slurm_a" in str(err.value)
    assert SECRET not in str(err.value) and SECRET not in repr(err.value)


# -- renewing token sources --------------------------------------------------------------

NOW = 1_800_000_000.0


class Clock:
    """An injected clock: epoch seconds the test moves by hand."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeCommand:
    """The runner seam: answers each run with the next output, records every argv."""

    def __init__(self, *outputs: credentials.CommandOutput | BaseException) -> None:
        self.outputs = list(outputs)
        self.calls: list[tuple[list[str], float]] = []
        self.lock = threading.Lock()

    def __call__(self, argv: Sequence[str], timeout_s: float) -> credentials.CommandOutput:
        with self.lock:
            self.calls.append((list(argv), timeout_s))
            out = self.outputs.pop(0) if len(self.outputs) > 1 else self.outputs[0]
        if isinstance(out, BaseException):
            raise out
        return out


def printed(stdout: str) -> credentials.CommandOutput:
    return credentials.CommandOutput(0, stdout, "")


def jwt(**claims: object) -> str:
    """An unsigned JWT as slurmctld shapes them (gridcore reads, never verifies, it)."""

    def part(value: object) -> str:
        raw = json.dumps(value, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


def command_source(
    runner: FakeCommand, clock: Clock, command: str = "scontrol token lifespan=3600"
) -> credentials.TokenSource:
    return credentials.TokenSource(
        CredentialRef(command=command), "alpha", clock, runner=runner, timeout_s=7.0
    )


def test_env_source_is_cached_and_renew_reads_the_variable_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GC_TEST_TOKEN", "  SLURM_JWT=one\n")
    source = credentials.TokenSource(CredentialRef(env="GC_TEST_TOKEN"), "alpha")
    assert source.token() == "one"
    monkeypatch.setenv("GC_TEST_TOKEN", "two")
    assert source.token() == "one"
    assert source.renew() == "two" and source.token() == "two"
    monkeypatch.delenv("GC_TEST_TOKEN")
    with pytest.raises(CredentialError, match=r"^site alpha: credential env:GC_TEST_TOKEN is not"):
        source.renew()


def test_airflow_conn_source_uses_the_password_and_renew_resolves_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passwords = iter(["first", "second"])
    asked: list[str] = []

    def resolver(conn_id: str) -> str:
        asked.append(conn_id)
        return next(passwords)

    monkeypatch.setattr(credentials, "_conn_resolver", resolver)
    source = credentials.TokenSource(CredentialRef(airflow_conn="slurm_a"), "alpha")
    assert [source.token(), source.token()] == ["first", "first"]
    assert source.renew() == "second" and asked == ["slurm_a", "slurm_a"]
    assert source.describe() == "airflow_conn:slurm_a"


def test_a_resolver_error_is_given_the_site_and_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def undefined(conn_id: str) -> str:
        raise CredentialError(f"Airflow connection {conn_id!r} is not defined")

    monkeypatch.setattr(credentials, "_conn_resolver", undefined)
    source = credentials.TokenSource(CredentialRef(airflow_conn="gone"), "beta")
    with pytest.raises(CredentialError) as err:
        source.token()
    assert str(err.value) == (
        "site beta: credential airflow_conn:gone: Airflow connection 'gone' is not defined"
    )


@pytest.mark.parametrize(
    ("content", "token"),
    [
        pytest.param("abc.def.ghi\n", "abc.def.ghi", id="bare"),
        pytest.param("  \n abc \n\n", "abc", id="whitespace"),
        pytest.param("SLURM_JWT=abc.def.ghi\n", "abc.def.ghi", id="scontrol-token"),
        pytest.param("# written by cron\nSLURM_JWT=abc\n", "abc", id="assignment-wins"),
    ],
)
def test_a_token_file_holds_the_token_or_what_scontrol_token_prints(
    tmp_path: Path, content: str, token: str
) -> None:
    path = tmp_path / "token"
    path.write_text(content)
    assert credentials.TokenSource(CredentialRef(file=str(path)), "alpha").token() == token
    assert credentials.resolve(CredentialRef(file=str(path))) == token


def test_a_rewritten_token_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("SLURM_JWT=first\n")
    source = credentials.TokenSource(CredentialRef(file=str(path)), "alpha")
    assert source.token() == "first"
    path.write_text("SLURM_JWT=second-and-longer\n")  # rewritten in place
    assert source.token() == "second-and-longer"
    replacement = tmp_path / "token.new"
    replacement.write_text("third")
    os.replace(replacement, path)  # a rename, as atomic writers and secret mounts do
    assert source.token() == "third"


def test_a_token_file_caught_mid_rewrite_keeps_the_token_read_before(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first")
    source = credentials.TokenSource(CredentialRef(file=str(path)), "alpha")
    assert source.token() == "first"
    path.write_text("")  # truncated by `scontrol token > file`, not written yet
    assert source.token() == "first"
    path.unlink()
    assert source.token() == "first"
    with pytest.raises(CredentialError) as err:  # but a forced renewal says why
        source.renew()
    assert str(err.value) == (
        f"site alpha: credential file:{path} cannot be read: No such file or directory"
    )
    path.write_text("second")
    assert source.token() == "second"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param("", "holds nothing", id="empty"),
        pytest.param(" \n\n", "holds nothing", id="blank"),
        pytest.param("zq1\nzq2\n", "holds 2 non-blank lines", id="two-lines"),
        pytest.param("zq zq", "holds no usable token", id="space"),
        pytest.param("zq\u00e9", "holds no usable token", id="not-ascii"),
        pytest.param("SLURM_JWT=\n", "holds no usable token", id="empty-assignment"),
    ],
)
def test_a_token_file_without_one_token_is_refused_without_echoing_it(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "token"
    path.write_text(content)
    with pytest.raises(CredentialError, match=message) as err:
        credentials.TokenSource(CredentialRef(file=str(path)), "alpha").token()
    assert str(err.value).startswith(f"site alpha: credential file:{path} ")
    assert "zq" not in str(err.value)


def test_a_command_is_run_again_shortly_before_its_jwt_expires() -> None:
    clock = Clock()
    first = jwt(exp=NOW + 3600, iat=NOW, sun="root")
    second = jwt(exp=NOW + 3000 + 3600, iat=NOW + 3000, sun="root")
    runner = FakeCommand(printed(f"SLURM_JWT={first}\n"), printed(f"SLURM_JWT={second}\n"))
    source = command_source(runner, clock)

    assert source.token() == first
    assert runner.calls == [(["scontrol", "token", "lifespan=3600"], 7.0)]
    clock.now = NOW + 3600 - 361  # more than 10 % of its lifetime left: kept
    assert source.token() == first and len(runner.calls) == 1
    clock.now = NOW + 3600 - 359  # less: a new one, before the server refuses the old
    assert source.token() == second and len(runner.calls) == 2
    assert source.token() == second and len(runner.calls) == 2


def test_a_command_that_prints_no_jwt_is_run_again_only_on_renew() -> None:
    clock = Clock()
    runner = FakeCommand(printed("opaque-1\n"), printed("opaque-2\n"))
    source = command_source(runner, clock, "get-token --site alpha")
    assert source.token() == "opaque-1"
    clock.now += 10 * 365 * 86400
    assert source.token() == "opaque-1" and len(runner.calls) == 1
    assert source.renew() == "opaque-2" and len(runner.calls) == 2


def test_a_failing_command_shows_its_status_and_first_stderr_line_not_the_token() -> None:
    clock = Clock()
    old = jwt(exp=NOW + 600, iat=NOW - 3000)
    leaked = jwt(exp=NOW + 3600, iat=NOW)
    stderr = f"\n  scontrol: error: cannot renew {old} (other {leaked})\nsecond line\n"
    runner = FakeCommand(printed(old), credentials.CommandOutput(1, "", stderr))
    source = command_source(runner, clock)
    assert source.token() == old
    with pytest.raises(CredentialError) as err:
        source.renew()
    assert str(err.value) == (
        "site alpha: credential command:scontrol token lifespan=3600 failed (exit status 1): "
        "scontrol: error: cannot renew <token> (other <token>)"
    )


@pytest.mark.parametrize(
    ("outcome", "message"),
    [
        pytest.param(
            credentials.CommandOutput(-9, "", ""),
            "failed (killed by SIGKILL): no message",
            id="kill",
        ),
        pytest.param(
            TimeoutError("did not finish within 7 s (killed)"),
            ": did not finish within 7 s (killed)",
            id="timeout",
        ),
        pytest.param(
            FileNotFoundError(2, "No such file or directory"),
            "cannot be run: No such file or directory",
            id="missing",
        ),
        pytest.param(printed(""), "printed nothing", id="silent"),
        pytest.param(printed("a\nb\nc\n"), "printed 3 non-blank lines", id="chatty"),
    ],
)
def test_each_way_a_command_fails_is_named(
    outcome: credentials.CommandOutput | BaseException, message: str
) -> None:
    source = command_source(FakeCommand(outcome), Clock())
    with pytest.raises(CredentialError, match=re.escape(message)) as err:
        source.token()
    assert str(err.value).startswith("site alpha: credential command:scontrol token lifespan=3600")


def test_a_failed_early_renewal_keeps_the_valid_token_then_fails_once_it_expired() -> None:
    clock = Clock()
    token = jwt(exp=NOW + 300, iat=NOW)
    broken = credentials.CommandOutput(1, "", "slurmctld: connection refused")
    runner = FakeCommand(printed(token), broken)
    source = command_source(runner, clock)
    assert source.token() == token

    clock.now = NOW + 250  # 50 s left: due, the command fails, the token still works
    assert source.token() == token and len(runner.calls) == 2
    clock.now = NOW + 250 + credentials.RENEW_RETRY_S - 1
    assert source.token() == token and len(runner.calls) == 2  # not retried at every call
    clock.now = NOW + 250 + credentials.RENEW_RETRY_S
    assert source.token() == token and len(runner.calls) == 3
    clock.now = NOW + 300
    with pytest.raises(CredentialError, match="connection refused"):
        source.token()


def test_renew_after_another_thread_renewed_returns_its_token_without_running_again() -> None:
    runner = FakeCommand(printed("opaque-1"), printed("opaque-2"), printed("opaque-3"))
    source = command_source(runner, Clock())
    rejected = source.token()
    assert source.renew(rejected) == "opaque-2"
    assert source.renew(rejected) == "opaque-2" and len(runner.calls) == 2
    assert source.renew() == "opaque-3"


def test_threads_share_one_source_and_run_the_command_once_per_renewal() -> None:
    runner = FakeCommand(printed("opaque-1"), printed("opaque-2"))
    source = command_source(runner, Clock())
    threads = 16
    start = threading.Barrier(threads)

    def use() -> str:
        start.wait()
        token = source.token()
        start.wait()
        return source.renew(token)

    with ThreadPoolExecutor(threads) as pool:
        renewed = list(pool.map(lambda _: use(), range(threads)))
    assert renewed == ["opaque-2"] * threads
    assert len(runner.calls) == 2


def test_describe_and_repr_name_the_reference_never_the_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GC_TEST_TOKEN", SECRET)
    source = credentials.TokenSource(CredentialRef(env="GC_TEST_TOKEN"), "alpha")
    assert source.token() == SECRET
    assert source.describe() == "env:GC_TEST_TOKEN"
    assert SECRET not in repr(source) and SECRET not in str(source)
    assert "alpha" in repr(source)


def test_one_shared_source_per_site_and_reference() -> None:
    ref = CredentialRef(env="GC_TEST_TOKEN")
    assert credentials.token_source(ref, "alpha") is credentials.token_source(ref, "alpha")
    assert credentials.token_source(ref, "alpha") is not credentials.token_source(ref, "beta")


def test_the_real_runner_runs_without_a_shell(tmp_path: Path) -> None:
    script = "import sys; print('SLURM_JWT=' + sys.argv[1])"
    ref = CredentialRef(command=f"{shlex.quote(sys.executable)} -c {shlex.quote(script)} '$HOME'")
    assert credentials.resolve(ref) == "$HOME"  # not expanded: no shell ran it
    fails = f"{shlex.quote(sys.executable)} -c \"import sys; sys.exit('no munge socket')\""
    with pytest.raises(CredentialError, match=r"failed \(exit status 1\): no munge socket"):
        credentials.resolve(CredentialRef(command=fails))


def test_the_real_runner_kills_a_command_that_outlives_its_timeout() -> None:
    # blocks until killed (no sleep in the test: the timeout is the wait)
    argv = [sys.executable, "-c", "import signal; signal.pause()"]
    with pytest.raises(TimeoutError, match=r"did not finish within 0.2 s"):
        credentials.run_command(argv, 0.2)


# -- what a JWT says and when to renew it -----------------------------------------------


@pytest.mark.parametrize(
    ("token", "expiry"),
    [
        pytest.param(jwt(exp=NOW, iat=NOW - 60), (NOW, NOW - 60), id="slurm"),
        pytest.param(jwt(exp=NOW + 0.5), (NOW + 0.5, None), id="no-iat"),
        pytest.param(jwt(iat=NOW), None, id="no-exp"),
        pytest.param(jwt(exp="soon"), None, id="text-exp"),
        pytest.param(jwt(exp=True), None, id="bool-exp"),
        pytest.param("opaque-token", None, id="not-a-jwt"),
        pytest.param("a.b.c", None, id="not-base64-json"),
        pytest.param("a.WzFd.c", None, id="payload-not-an-object"),
        pytest.param("a.b.c.d", None, id="four-parts"),
    ],
)
def test_jwt_expiry_is_read_without_verifying(
    token: str, expiry: tuple[float, float | None] | None
) -> None:
    assert credentials.jwt_expiry(token) == expiry


@pytest.mark.parametrize(
    ("exp", "iat", "now", "renew_at"),
    [
        pytest.param(NOW + 3600, NOW, NOW, NOW + 3600 - 360, id="hour: 10 % before"),
        pytest.param(NOW + 300, NOW, NOW, NOW + 300 - 60, id="5 min: 60 s before"),
        pytest.param(NOW + 60, NOW, NOW, NOW + 30, id="1 min: half of what is left"),
        pytest.param(NOW + 3600, None, NOW, NOW + 3600 - 360, id="no iat: from now"),
        pytest.param(NOW + 100, NOW - 3500, NOW, NOW + 50, id="fetched late: half left"),
        pytest.param(NOW - 1, NOW - 3600, NOW, None, id="expired: until refused"),
    ],
)
def test_renewal_time(exp: float, iat: float | None, now: float, renew_at: float | None) -> None:
    assert credentials.renewal_time(exp, iat, now) == renew_at


# -- scrubbing ------------------------------------------------------------------------------

LONG = "eyJhbGciOiJIUzI1NiJ9.eyJleHAiOjF9.sig"


@pytest.mark.parametrize(
    ("text", "secret", "scrubbed"),
    [
        pytest.param("Max retries exceeded", "x", "Max retries exceeded", id="inside-words"),
        pytest.param("x", "x", "<token>", id="alone"),
        pytest.param("token x rejected", "x", "token <token> rejected", id="spaces"),
        pytest.param("token x.", "x", "token <token>.", id="full-stop"),
        pytest.param("host x.example.org", "x", "host x.example.org", id="dotted-name"),
        pytest.param("SLURM_JWT=x", "x", "SLURM_JWT=<token>", id="assignment"),
        pytest.param('{"token": "x"}', "x", '{"token": "<token>"}', id="json"),
        pytest.param("Bearer x, y", "x", "Bearer <token>, y", id="comma"),
        pytest.param("x-ray /x ~x", "x", "x-ray /x ~x", id="token-characters"),
        pytest.param("ab=", "ab=", "<token>", id="padding"),
        pytest.param("cab= ab=", "ab=", "cab= <token>", id="padding-in-word"),
        pytest.param("a+b a+b", "a+b", "<token> <token>", id="repeated"),
        pytest.param(f"HTTP 511 for {LONG}", LONG, "HTTP 511 for <token>", id="long"),
        pytest.param(f"x{LONG}y", LONG, "x<token>y", id="long-inside-a-word"),
        pytest.param("0123456789abcdef", "0123456789abcdef", "<token>", id="16-chars"),
        pytest.param("k0123456789abcdef", "0123456789abcdef", "k<token>", id="16-in-word"),
        pytest.param("k012345678abcdef", "012345678abcdef", "k012345678abcdef", id="15-in-word"),
        pytest.param("a.*b a.*b", "a.*b", "<token> <token>", id="regex-characters"),
        pytest.param("anything", "", "anything", id="no-secret"),
    ],
)
def test_scrub(text: str, secret: str, scrubbed: str) -> None:
    assert credentials.scrub(text, secret) == scrubbed


# -- the grid file's references ---------------------------------------------------------


def _grid(token: object) -> dict[str, object]:
    site = {"kind": "slurm", "processors": 4, "url": "http://x", "token": token}
    return {"version": 1, "sites": {"a": site}}


@pytest.mark.parametrize(
    ("token", "ref"),
    [
        ({"env": "A_TOKEN"}, CredentialRef(env="A_TOKEN")),
        ({"airflow_conn": "a_slurm"}, CredentialRef(airflow_conn="a_slurm")),
        ({"file": "/run/gridcore/a.jwt"}, CredentialRef(file="/run/gridcore/a.jwt")),
        (
            {"command": "scontrol token lifespan=3600"},
            CredentialRef(command="scontrol token lifespan=3600"),
        ),
        (
            {"command": "sh -c 'scontrol token | tail -1'"},
            CredentialRef(command="sh -c 'scontrol token | tail -1'"),
        ),
    ],
)
def test_the_grid_file_names_each_kind_of_reference(
    token: dict[str, str], ref: CredentialRef
) -> None:
    site = parse_grid(_grid(token), source="g.toml").site("a")
    assert site.token == ref


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ({}, "sites.a.token: must be a reference {"),
        ("s3cret", "sites.a.token: must be a reference {"),
        (
            {"env": "A", "file": "/t"},
            "sites.a.token: must be exactly one reference, got env and file",
        ),
        (
            {"env": "A", "file": "/t", "command": "c"},
            "sites.a.token: must be exactly one reference, got env, file and command",
        ),
        ({"vault": "x"}, "sites.a.token: unknown credential reference: use env, airflow_conn,"),
        ({"file": "token.jwt"}, "sites.a.token.file: must be an absolute path"),
        ({"file": "~/token.jwt"}, "sites.a.token.file: must be an absolute path"),
        ({"file": ""}, "sites.a.token.file: must be an absolute path"),
        ({"file": 3}, "sites.a.token.file: must be an absolute path"),
        ({"command": ""}, "sites.a.token.command: must not be empty"),
        ({"command": "  "}, "sites.a.token.command: must not be blank"),
        ({"command": '""'}, "sites.a.token.command: names no program"),
        ({"command": "scontrol 'token"}, "sites.a.token.command: cannot be split into words"),
        (
            {"command": "scontrol token | cut -d= -f2"},
            "sites.a.token.command: is run without a shell, so | would reach the program",
        ),
    ],
)
def test_a_bad_reference_is_named_by_file_and_field(token: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_grid(_grid(token), source="g.toml")
    assert str(err.value).startswith(f"g.toml: {message}")
    assert "s3cret" not in str(err.value) and "token.jwt'" not in str(err.value)
