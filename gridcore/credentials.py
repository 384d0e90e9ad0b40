"""Credentials named in the grid file, resolved and renewed without ever echoing them.

A site's token is given by reference (``gridcore.model.CredentialRef``), exactly one of:

* ``{ env = "VAR" }``: an environment variable;
* ``{ airflow_conn = "conn_id" }``: the PASSWORD field of an Airflow connection;
* ``{ file = "/abs/path" }``: a file, read again whenever it changes (a token rotated by
  cron, a mounted secret);
* ``{ command = "scontrol token lifespan=3600" }``: a command whose standard output is
  the token, run again before the JWT it printed expires.

A file's content or a command's output is either the token alone or a line
``SLURM_JWT=<token>`` (what ``scontrol token`` prints); surrounding white space is
stripped, and so is every kind's value. A token is printable ASCII without spaces (it
goes into an HTTP header).

:class:`TokenSource` (one per site, shared by every thread using the site) caches the
token: :meth:`TokenSource.token` re-reads a file whose ``(inode, size, mtime_ns,
ctime_ns)`` changed and re-runs a command whose JWT ``exp`` claim is close
(:func:`renewal_time`); :meth:`TokenSource.renew` resolves again after the server refused
the token. A token that is not a JWT carries no expiry: it is reused until refused.

A command is split with :func:`shlex.split` and run WITHOUT a shell (no injection through
the grid file, no shell start per renewal, the process group killed on timeout): pipes,
redirections, ``$VAR`` and ``~`` are not expanded; write ``sh -c '...'`` when they are
needed. It runs with this process's environment, no standard input and a timeout.

gridcore never imports Airflow. Airflow connection ids are resolved by a resolver that
the Airflow layer registers (``operators/hooks.py`` registers one backed by
``BaseHook``); without it, the standard ``AIRFLOW_CONN_<ID>`` environment variable is read
(URI or JSON form), which is also how Airflow itself supplies connections from the
environment.

Errors are :class:`~gridcore.errors.CredentialError` naming the site and the reference,
never the token; :func:`scrub` hides a token in any text shown to people.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import math
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from gridcore.errors import CredentialError
from gridcore.model import CredentialRef

log = logging.getLogger(__name__)

ConnResolver = Callable[[str], str]
Clock = Callable[[], float]

COMMAND_TIMEOUT_S = 30.0
# A command's JWT is renewed when max(RENEW_MARGIN_S, RENEW_FRACTION of its lifetime) is
# left (at most half of what was left when it was fetched, so a short-lived token is not
# renewed at every call): 360 s before the end of a 3600 s token, 60 s before a 300 s one.
RENEW_MARGIN_S = 60.0
RENEW_FRACTION = 0.1
# After a failed early renewal, the still-valid token is kept and the command retried
# this much later (not at every request).
RENEW_RETRY_S = 15.0
MAX_TOKEN_FILE_BYTES = 64 * 1024  # a JWT is a few hundred bytes; this is not a token file
SCRUB_ANYWHERE_LENGTH = 16
REDACTED = "<token>"
STDERR_SHOWN = 200  # characters of a failed command's first stderr line

_conn_resolver: ConnResolver | None = None
_shared: dict[tuple[str, CredentialRef], TokenSource] = {}
_shared_lock = threading.Lock()


def register_connection_resolver(resolver: ConnResolver | None) -> None:
    """Install the function that turns an Airflow connection id into a secret."""
    global _conn_resolver
    _conn_resolver = resolver


def resolve(ref: CredentialRef) -> str:
    """The token a reference names, read once (a file read, a command run). Raises
    CredentialError saying which reference failed (never the secret). Callers that keep
    the token for long use a :class:`TokenSource`, which renews it."""
    return _fetch(ref, run_command, COMMAND_TIMEOUT_S, ()).token


def token_source(ref: CredentialRef, site: str) -> TokenSource:
    """The process-wide :class:`TokenSource` of ``site`` for ``ref``: every adapter,
    trigger and thread of this process using the site shares it (one command run per
    renewal, not one per user)."""
    with _shared_lock:
        source = _shared.get((site, ref))
        if source is None:
            source = _shared[(site, ref)] = TokenSource(ref, site)
        return source


def forget_token_sources() -> None:
    """Drop every cached token source: the next use resolves its reference anew (tests;
    a process whose connections or variables were replaced)."""
    with _shared_lock:
        _shared.clear()


class TokenSource:
    """A site's token, cached and renewed; safe to share between threads.

    ``clock`` gives epoch seconds (compared with a JWT's ``exp``); ``runner`` runs a
    command (:func:`run_command`; tests pass a fake); ``timeout_s`` bounds each run.
    """

    def __init__(
        self,
        ref: CredentialRef,
        site: str,
        clock: Clock = time.time,
        *,
        timeout_s: float = COMMAND_TIMEOUT_S,
        runner: Runner | None = None,
    ) -> None:
        self.ref = ref
        self.site = site
        self._clock = clock
        self._timeout_s = timeout_s
        self._runner = runner or run_command
        self._lock = threading.Lock()
        self._current: _Fetched | None = None
        self._renew_at: float | None = None  # commands: when to run again (None: never)

    def __repr__(self) -> str:
        return f"TokenSource(site={self.site!r}, ref={self.describe()!r})"

    __str__ = __repr__

    def describe(self) -> str:
        """The reference (``env:VAR``, ``airflow_conn:id``, ``file:/p``, ``command:...``),
        never the secret."""
        return self.ref.describe()

    def token(self) -> str:
        """The current token: cached; a changed file is read again, a command whose JWT
        is about to expire is run again."""
        with self._lock:
            current = self._current
            if current is None:
                return self._load().token
            if self.ref.file is not None:
                return self._reread_if_changed(current)
            if self._renew_at is not None and self._clock() >= self._renew_at:
                return self._renew_early(current)
            return current.token

    def renew(self, rejected: str | None = None) -> str:
        """Resolve again because the server refused the token: the variable re-read, the
        connection re-resolved, the file re-read, the command re-run. Given the token that
        was ``rejected``, a renewal another thread made meanwhile is returned as is, so
        threads refused together run one renewal."""
        with self._lock:
            current = self._current
            if rejected is not None and current is not None and current.token != rejected:
                return current.token
            return self._load().token

    # -- under the lock --------------------------------------------------------------

    def _load(self) -> _Fetched:
        known = () if self._current is None else (self._current.token,)
        try:
            fetched = _fetch(self.ref, self._runner, self._timeout_s, known)
        except CredentialError as exc:
            raise CredentialError(f"site {self.site}: {exc}") from exc
        self._current = fetched
        self._renew_at = self._renewal_of(fetched)
        return fetched

    def _renewal_of(self, fetched: _Fetched) -> float | None:
        if self.ref.command is None:
            return None
        claims = jwt_expiry(fetched.token)
        if claims is None:
            return None  # not a JWT: reused until the server refuses it
        exp, iat = claims
        now = self._clock()
        when = renewal_time(exp, iat, now)
        if when is None:
            log.warning(
                "site %s: the token from %s expired %.0f s ago by this host's clock (is "
                "the clock right?); it is used until the server refuses it",
                self.site,
                self.describe(),
                now - exp,
            )
        return when

    def _reread_if_changed(self, current: _Fetched) -> str:
        try:
            changed = _file_signature(os.stat(current.path)) != current.signature
        except OSError:
            changed = True
        if not changed:
            return current.token
        try:
            return self._load().token
        except CredentialError as exc:
            # Caught mid-rewrite (truncated, or between unlink and create): keep the token
            # read before and look again at the next call; renew() reports the failure.
            log.debug("%s; keeping the token read before", exc)
            return current.token

    def _renew_early(self, current: _Fetched) -> str:
        try:
            return self._load().token
        except CredentialError as exc:
            now = self._clock()
            expiry = jwt_expiry(current.token)
            if expiry is None or now >= expiry[0]:
                raise
            self._renew_at = min(now + RENEW_RETRY_S, expiry[0])
            log.warning(
                "%s; keeping the current token (%.0f s left), trying again in %.0f s",
                exc,
                expiry[0] - now,
                self._renew_at - now,
            )
            return current.token


def renewal_time(exp: float, iat: float | None, now: float) -> float | None:
    """When to renew a JWT expiring at ``exp``, issued at ``iat``, fetched at ``now``:
    ``exp - max(RENEW_MARGIN_S, RENEW_FRACTION * lifetime)``, the margin at most half of
    what is left. None when it has expired already (by this host's clock)."""
    left = exp - now
    if left <= 0:
        return None
    lifetime = exp - iat if iat is not None and iat < exp else left
    margin = min(max(RENEW_MARGIN_S, RENEW_FRACTION * lifetime), left / 2)
    return exp - margin


def jwt_expiry(token: str) -> tuple[float, float | None] | None:
    """``(exp, iat)`` of a JWT, read WITHOUT verifying it (the server verifies; gridcore
    only wants to know when to fetch a new one); None for a token that is not a JWT or has
    no numeric ``exp``."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except ValueError:  # binascii.Error, UnicodeDecodeError and JSONDecodeError are
        return None
    if not isinstance(claims, dict):
        return None
    exp, iat = _seconds(claims.get("exp")), _seconds(claims.get("iat"))
    return None if exp is None else (exp, iat)


# -- scrubbing --------------------------------------------------------------------------

# Characters that make up tokens (base64, base64url, JWTs, URL-safe tokens). A short
# secret is replaced only where it stands alone: not after one of them (an "=" or ":"
# before it separates a key from it, so "SLURM_JWT=x" is scrubbed), and not before one of
# them nor before a "." that continues a token (a full stop ending a sentence does not).
_BEFORE = r"(?<![A-Za-z0-9._~+/-])"
_AFTER = r"(?![A-Za-z0-9_~+/=-])(?!\.[A-Za-z0-9_~+/=-])"
_JWT_SHAPED = re.compile(r"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
_SLURM_JWT_LINE = re.compile(r"(SLURM_JWT=)\S+")


def scrub(text: str, secret: str) -> str:
    """``text`` with ``secret`` replaced by ``<token>``. A secret of 16 characters or more
    is replaced wherever it occurs; a shorter one only as a whole token (``_BEFORE`` /
    ``_AFTER``), so a secret "x" leaves "Max retries exceeded" alone but hides
    "token x.", "SLURM_JWT=x" and '"x"'."""
    if not secret:
        return text
    if len(secret) >= SCRUB_ANYWHERE_LENGTH:
        return text.replace(secret, REDACTED)
    return re.sub(_BEFORE + re.escape(secret) + _AFTER, REDACTED, text)


def _scrub_all(text: str, secrets: Sequence[str]) -> str:
    """Text from a command or a file: the known secrets, and anything shaped like a
    JWT or a ``SLURM_JWT=`` assignment, hidden."""
    for secret in secrets:
        text = scrub(text, secret)
    text = _SLURM_JWT_LINE.sub(r"\1" + REDACTED, text)
    return _JWT_SHAPED.sub(REDACTED, text)


# -- fetching one token -----------------------------------------------------------------


@dataclass(frozen=True)
class CommandOutput:
    """What a finished command left: its exit status (negative: killed by that signal)
    and its decoded output."""

    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], float], CommandOutput]
"""Runs argv with a timeout in seconds; raises OSError (cannot start), TimeoutError."""


def run_command(argv: Sequence[str], timeout_s: float) -> CommandOutput:
    """Run ``argv`` without a shell, stdin closed, in a session of its own so that a
    timeout kills everything it started (TimeoutError), not only its first process."""
    with subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise TimeoutError(f"did not finish within {timeout_s:g} s (killed)") from None
    return CommandOutput(
        proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        os.killpg(proc.pid, signal.SIGKILL)
    # A process in another session may hold the pipes: Popen's context closes them.
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=5)


@dataclass(frozen=True)
class _Fetched:
    token: str
    path: str = ""  # file references: the file read and its signature when read
    signature: tuple[int, ...] = ()


def _fetch(ref: CredentialRef, runner: Runner, timeout_s: float, known: Sequence[str]) -> _Fetched:
    """The token ``ref`` names now. ``known`` are secrets to hide from error text."""
    if ref.env is not None:
        value = os.environ.get(ref.env)
        if not value or not value.strip():
            raise CredentialError(f"credential env:{ref.env} is not set")
        return _Fetched(_token_in(value, ref))
    if ref.file is not None:
        return _read_file(ref, ref.file)
    if ref.command is not None:
        return _Fetched(_run(ref, ref.command, runner, timeout_s, known))
    return _Fetched(_token_in(_from_connection(ref.airflow_conn or ""), ref))


def _from_connection(conn_id: str) -> str:
    resolver = _conn_resolver
    if resolver is None:
        return _from_env_connection(conn_id)
    try:
        return resolver(conn_id)
    except CredentialError as exc:
        if f"airflow_conn:{conn_id}" in str(exc):
            raise
        raise CredentialError(f"credential airflow_conn:{conn_id}: {exc}") from exc
    except Exception as exc:  # the resolver is foreign code: name it, keep the cause
        raise CredentialError(f"credential airflow_conn:{conn_id}: {exc}") from exc


def _from_env_connection(conn_id: str) -> str:
    raw = os.environ.get(f"AIRFLOW_CONN_{conn_id.upper()}")
    if not raw:
        raise CredentialError(
            f"credential airflow_conn:{conn_id} cannot be resolved: no Airflow resolver is "
            f"registered and AIRFLOW_CONN_{conn_id.upper()} is not set"
        )
    if raw.lstrip().startswith("{"):
        try:
            password = json.loads(raw).get("password")
        except json.JSONDecodeError as exc:
            raise CredentialError(f"credential airflow_conn:{conn_id}: bad JSON") from exc
    else:
        password = urlsplit(raw).password
        password = unquote(password) if password else None
    if not password:
        raise CredentialError(f"credential airflow_conn:{conn_id} has no password field")
    return str(password)


def _read_file(ref: CredentialRef, path: str) -> _Fetched:
    where = f"credential {ref.describe()}"
    try:
        with open(path, "rb") as handle:
            signature = _file_signature(os.fstat(handle.fileno()))
            data = handle.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise CredentialError(f"{where} cannot be read: {exc.strerror}") from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise CredentialError(f"{where} is over {MAX_TOKEN_FILE_BYTES} bytes: not a token")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CredentialError(f"{where} is not UTF-8 text") from None
    return _Fetched(_token_in(text, ref), path, signature)


def _file_signature(stat: os.stat_result) -> tuple[int, ...]:
    """What changes when a file is rewritten in place or replaced by a rename (a
    same-length token rewritten within one timestamp tick may look unchanged: the
    server then refuses the old token and renew() reads the file again)."""
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def _run(
    ref: CredentialRef, command: str, runner: Runner, timeout_s: float, known: Sequence[str]
) -> str:
    where = f"credential {ref.describe()}"
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise CredentialError(f"{where} cannot be split into words: {exc}") from None
    if not argv or not argv[0]:
        raise CredentialError(f"{where} names no program")
    try:
        done = runner(argv, timeout_s)
    except TimeoutError as exc:
        raise CredentialError(f"{where}: {exc}") from None
    except OSError as exc:
        raise CredentialError(f"{where} cannot be run: {exc.strerror or exc}") from None
    if done.returncode != 0:
        printed = [*known, *_candidates(done.stdout)]
        raise CredentialError(
            f"{where} failed ({_status(done.returncode)}): {_first_line(done.stderr, printed)}"
        )
    return _token_in(done.stdout, ref, what="printed")


def _candidates(stdout: str) -> list[str]:
    """What a failed command printed that may be a token (to hide from its stderr)."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    assigned = [line.removeprefix("SLURM_JWT=") for line in lines if line.startswith("SLURM_JWT=")]
    if assigned:
        return assigned
    return lines if len(lines) == 1 else []


def _status(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def _first_line(stderr: str, secrets: Sequence[str]) -> str:
    line = next((ln.strip() for ln in stderr.splitlines() if ln.strip()), "")
    if not line:
        return "no message on stderr"
    line = _scrub_all(line, secrets)
    return line if len(line) <= STDERR_SHOWN else line[: STDERR_SHOWN - 3] + "..."


_TOKEN = re.compile(r"[!-~]+")  # printable ASCII, no space: what an HTTP header can carry


def _token_in(text: str, ref: CredentialRef, what: str = "holds") -> str:
    """The token of a value, a file or a command's output: a line ``SLURM_JWT=<token>``
    if there is one, else the only non-blank line; stripped."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    assigned = [line for line in lines if line.startswith("SLURM_JWT=")]
    where = f"credential {ref.describe()}"
    if assigned:
        token = assigned[-1].removeprefix("SLURM_JWT=").strip()
    elif len(lines) == 1:
        token = lines[0]
    elif not lines:
        raise CredentialError(f"{where} {what} nothing: expected the token or SLURM_JWT=<token>")
    else:
        raise CredentialError(
            f"{where} {what} {len(lines)} non-blank lines: expected the token alone or "
            "SLURM_JWT=<token>"
        )
    if not _TOKEN.fullmatch(token):
        raise CredentialError(
            f"{where} {what} no usable token (empty, or with white space or characters "
            "that are not printable ASCII)"
        )
    return token


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
