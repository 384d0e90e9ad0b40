"""The pilot (virtual job, VJM Sec. 3.1): the small program a co-reserved job's site jobs
run. It holds the processors the site gave it until the VJ center dispatches the real
command into it, then runs that command together with the job's other pilots.

STANDARD LIBRARY ONLY: it is sent inside the job script (a heredoc fed to ``python3 -``,
built by :func:`gridcore.engine.pilot_command.pilot_command`), so a cluster needs
nothing but python3. Usage::

    GRIDCORE_PILOT_TOKEN=... python3 - --center URL --pilot ID [--bind ADDR]
        [--advertise HOST] [--processors N]

1. Binds its data port: a TCP socket listening on ``--bind`` (default all addresses)
   port 0, inheritable, so the real command gets it as ``GRIDCORE_LISTEN_FD`` and no
   other process can take the port in between (as :mod:`gridcore.barrier` does).
   The address it advertises is ``--advertise`` or the local address of a UDP socket
   "connected" to the center's host: the interface that reaches the center, which is
   also right inside a network namespace.
2. Registers (host, port, processors from ``--processors`` or
   ``$GRIDCORE_PILOT_PROCESSORS``) with the bearer token from
   ``$GRIDCORE_PILOT_TOKEN`` (never on the command line, where the site's other users
   could read it; removed from the environment the command gets). Told to exit: exits 0.
3. Heartbeats in a thread at the interval the registration answer gives, and long-polls
   for work. "exit" (released, lost): exits 0 at once. "run": writes
   ``peers-<job>-0-<component>.json`` (``{"components": [{"index", "host", "port"},
   ...]}``, temporary name then rename, like the barrier's) into the job's working
   directory, runs the command through ``/bin/sh -c`` with ``GRIDCORE_PEERS``,
   ``GRIDCORE_COMPONENT``, ``GRIDCORE_COMPONENTS``, ``GRIDCORE_JOB``,
   ``GRIDCORE_HOST``, ``GRIDCORE_PORT``, ``GRIDCORE_LISTEN_FD``, reports that it
   started, passes SIGTERM/SIGINT on to it, reports its exit code (a few tries), and
   exits with that code (128 + N for a command killed by signal N). Released while the
   command runs (a cancel): the command gets SIGTERM, then SIGKILL after a grace period.
4. A center it cannot reach for ``--unreachable-s`` seconds (default 120, or
   ``$GRIDCORE_PILOT_UNREACHABLE_S``) while it holds makes it exit 69: its processors go
   back to the site. A token the center refuses makes it exit 77.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

TOKEN_ENV = "GRIDCORE_PILOT_TOKEN"
PROCESSORS_ENV = "GRIDCORE_PILOT_PROCESSORS"
UNREACHABLE_ENV = "GRIDCORE_PILOT_UNREACHABLE_S"
DEFAULT_UNREACHABLE_S = 120.0
EXIT_USAGE = 2
EXIT_UNREACHABLE = 69  # sysexits EX_UNAVAILABLE
EXIT_REFUSED = 77  # sysexits EX_NOPERM
WORK_WAIT_S = 25  # the long poll's wait (the center allows 30)
REQUEST_SLACK_S = 15.0  # an HTTP request's timeout beyond the wait it asked for
RESULT_TRIES = 6  # about 15 s of back-off
KILL_GRACE_S = 10.0  # SIGTERM, then SIGKILL, for a command whose pilot was released
PEERS_FILE = "peers-{job}-{epoch}-{component}.json"  # the barrier's too
API = "/api/v1/pilots/{pilot}"
DESCRIPTION = "A VJM pilot: hold processors until the VJ center dispatches a command."


class Refused(Exception):
    """The center answered 4xx (``status``): the token or the request is wrong; retrying
    won't help."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Unreachable(Exception):
    """The center could not be reached (or failed) for longer than the bound."""


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        _say(args.pilot, f"no token: set ${TOKEN_ENV}")
        return EXIT_USAGE
    center = Center(
        args.center.rstrip("/") + API.format(pilot=args.pilot), token, args.unreachable_s
    )
    listener = listen(args.bind)
    host = args.advertise or advertised_host(args.center, args.bind)
    pilot = Pilot(args, center, listener, host)
    try:
        return pilot.run()
    except Unreachable as exc:
        _say(args.pilot, f"exiting, the center is unreachable: {exc}")
        return EXIT_UNREACHABLE
    except Refused as exc:
        _say(args.pilot, f"exiting, the center refused: {exc}")
        return EXIT_REFUSED
    finally:
        listener.close()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gridcore pilot", description=DESCRIPTION)
    parser.add_argument("--center", required=True, help="the VJ center's URL")
    parser.add_argument("--pilot", type=int, required=True, help="this pilot's id")
    parser.add_argument("--bind", default="0.0.0.0", help="address of the data port")
    parser.add_argument("--advertise", default=None, help="host the other pilots connect to")
    parser.add_argument("--processors", type=int, default=int(os.environ.get(PROCESSORS_ENV) or 1))
    parser.add_argument(
        "--unreachable-s",
        type=float,
        default=float(os.environ.get(UNREACHABLE_ENV) or DEFAULT_UNREACHABLE_S),
        help="exit after the center was unreachable this long while holding",
    )
    args = parser.parse_args(argv)
    if urllib.parse.urlsplit(args.center).scheme not in ("http", "https"):
        parser.error(f"--center must be an http(s) URL, not {args.center!r}")
    return args


class Center:
    """The VJ center's API for one pilot (or one co-allocation component:
    :mod:`gridcore.barrier` uses this client too), its resource at ``base``, with its
    token in the Authorization header."""

    def __init__(self, base: str, token: str, unreachable_s: float) -> None:
        self.base = base
        self.unreachable_s = unreachable_s
        self.accepted = False  # the center has answered one request with 2xx
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        # Straight to the center: a site's HTTP proxy is for the outside world.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._lock = threading.Lock()
        self._last_ok = time.monotonic()

    def silent_for(self) -> float:
        """Seconds since the center last answered."""
        with self._lock:
            return time.monotonic() - self._last_ok

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        timeout: float = REQUEST_SLACK_S,
        tries: int | None = None,
    ) -> dict[str, Any]:
        """One request, retried with jittered back-off while the center cannot be
        reached: ``tries`` times if given, else until it has been silent for the bound
        (then :class:`Unreachable`). A 4xx answer raises :class:`Refused` at once."""
        delay = 0.25
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._once(method, path, body, timeout)
            except OSError as exc:  # URLError, HTTPError 5xx, timeouts, resets
                failure = _describe(exc)
            except ValueError as exc:  # an answer that is not JSON
                failure = f"bad answer: {exc}"
            if tries is not None and attempt >= tries:
                raise Unreachable(failure)
            if tries is None and self.silent_for() > self.unreachable_s:
                raise Unreachable(f"silent for {self.silent_for():.0f} s; last: {failure}")
            time.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 5.0)

    def _once(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float
    ) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = dict(self._headers)
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.base + path, data, headers, method=method)
        try:
            with self._opener.open(request, timeout=timeout) as response:
                answer = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500:
                what = f"{method} {path.split('?')[0]}: HTTP {exc.code} {_detail(exc)}".rstrip()
                raise Refused(what, exc.code) from None
            raise
        with self._lock:
            self._last_ok = time.monotonic()
            self.accepted = True
        if not isinstance(answer, dict):
            raise ValueError(f"{method} {path} answered {type(answer).__name__}, not an object")
        return answer


class Heartbeat(threading.Thread):
    """Heartbeats every ``interval`` s (single tries: the main thread enforces the
    bound). An "exit" answer sets :attr:`released` and calls :attr:`on_release`."""

    def __init__(self, center: Center, interval: float) -> None:
        super().__init__(name="gridcore-pilot-heartbeat", daemon=True)
        self.center = center
        self.interval = min(max(interval, 0.05), 300.0)
        self.released = threading.Event()
        self.refused: Refused | None = None
        self.on_release: Any = None
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            try:
                answer = self.center.call("POST", "/heartbeat", timeout=self.interval + 10, tries=1)
            except Unreachable:
                continue
            except Refused as exc:
                self.refused = exc
                continue
            if answer.get("action") == "exit" and not self.released.is_set():
                self.released.set()
                if self.on_release is not None:
                    self.on_release()

    def stop(self) -> None:
        self._halt.set()


class Pilot:
    def __init__(
        self, args: argparse.Namespace, center: Center, listener: socket.socket, host: str
    ) -> None:
        self.args = args
        self.center = center
        self.listener = listener
        self.host = host
        self.port = int(listener.getsockname()[1])

    def run(self) -> int:
        """Register, hold, and run what the center dispatches: the exit status."""
        _exit_on(signal.SIGTERM, signal.SIGINT)
        body = {"host": self.host, "port": self.port, "processors": self.args.processors}
        answer = self.center.call("POST", "/register", body)
        if answer.get("action") == "exit":
            self.say(f"told to exit on registering (pilot {answer.get('state')})")
            return 0
        self.say(f"holding {self.args.processors} processor(s), data port {self.host}:{self.port}")
        heartbeat = Heartbeat(self.center, float(answer.get("heartbeat_s") or 5.0))
        heartbeat.start()
        try:
            return self._hold(heartbeat)
        finally:
            heartbeat.stop()

    def _hold(self, heartbeat: Heartbeat) -> int:
        while True:
            if heartbeat.released.is_set():
                self.say("released while holding")
                return 0
            if heartbeat.refused is not None:
                raise heartbeat.refused
            work = self.center.call(
                "GET", f"/work?wait={WORK_WAIT_S}", timeout=WORK_WAIT_S + REQUEST_SLACK_S
            )
            action = work.get("action")
            if action == "exit":
                self.say("released while holding")
                return 0
            if action == "run":
                return self._run(work, heartbeat)

    def _run(self, work: dict[str, Any], heartbeat: Heartbeat) -> int:
        job, component = int(work["job"]), int(work["component"])
        workdir = Path(work.get("workdir") or os.getcwd())
        workdir.mkdir(parents=True, exist_ok=True)
        peers = write_peers(workdir, job, component, work["peers"])
        fd = self.listener.fileno()
        env = {
            **os.environ,
            "GRIDCORE_PEERS": str(peers),
            "GRIDCORE_JOB": str(job),
            "GRIDCORE_COMPONENT": str(component),
            "GRIDCORE_COMPONENTS": str(int(work["components"])),
            "GRIDCORE_HOST": self.host,
            "GRIDCORE_PORT": str(self.port),
            "GRIDCORE_LISTEN_FD": str(fd),
        }
        # said before the command starts: the command writes to the same stderr, and a
        # line of ours after it could land after the command's last lines (the tail of
        # a failed rank's stderr must end with the rank's own words)
        self.say(f"running component {component} of job {job}")
        proc = subprocess.Popen(
            ["/bin/sh", "-c", str(work["command"])],
            cwd=workdir,
            env=env,
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
        )
        self.listener.close()
        _forward(proc, signal.SIGTERM, signal.SIGINT)
        heartbeat.on_release = lambda: _stop(proc)
        if heartbeat.released.is_set():  # released before on_release was in place
            _stop(proc)
        with contextlib.suppress(Unreachable, Refused):
            if self.center.call("POST", "/started", tries=RESULT_TRIES).get("action") == "exit":
                _stop(proc)  # released between the dispatch and the start
        status = proc.wait()
        code = 128 - status if status < 0 else status
        self._report(code)
        return code

    def _report(self, code: int) -> None:
        body = {"exit_code": code, "message": f"exit {code}"}
        try:
            self.center.call("POST", "/result", body, tries=RESULT_TRIES)
        except (Unreachable, Refused) as exc:
            self.say(f"could not report exit {code}: {exc}")

    def say(self, message: str) -> None:
        _say(self.args.pilot, message)


def advertised_host(center_url: str, bind: str) -> str:
    """The address other pilots reach this one at: the bound address if specific, else
    the local address of the route to the center (a UDP "connect" sends nothing)."""
    if bind not in ("", "0.0.0.0", "::"):
        return bind
    parts = urllib.parse.urlsplit(center_url)
    family = socket.AF_INET6 if bind == "::" else socket.AF_INET
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        info = socket.getaddrinfo(parts.hostname, port, family, socket.SOCK_DGRAM)[0]
        with socket.socket(info[0], socket.SOCK_DGRAM) as probe:
            probe.connect(info[4])
            return str(probe.getsockname()[0])
    except (OSError, ValueError):
        return socket.getfqdn()


def write_peers(
    workdir: Path, job: int, component: int, peers: list[dict[str, Any]], epoch: int = 0
) -> Path:
    """One file per component, published by rename (components sharing a directory never
    read each other's half-written file); pilots' epoch is 0, the barrier's its
    placement's."""
    name = PEERS_FILE.format(job=job, epoch=epoch, component=component)
    path = workdir / name
    temporary = path.with_name(f".{name}.{os.getpid()}.tmp")
    rows = [
        {"index": int(p["index"]), "host": str(p["host"]), "port": int(p["port"])} for p in peers
    ]
    temporary.write_text(json.dumps({"components": rows}))
    os.replace(temporary, path)
    return path


def listen(bind: str) -> socket.socket:
    """The data port: listening on ``bind`` port 0, inheritable by the command."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    listener = socket.create_server((bind, 0), family=family)
    listener.set_inheritable(True)
    return listener


def _exit_on(*signals: signal.Signals) -> None:
    """While holding, a signal from the site (cancel, time limit) ends the pilot."""

    def leave(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    for sig in signals:
        signal.signal(sig, leave)


def _forward(proc: subprocess.Popen[bytes], *signals: signal.Signals) -> None:
    def forward(signum: int, _frame: FrameType | None) -> None:
        proc.send_signal(signum)

    for sig in signals:
        signal.signal(sig, forward)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM now, SIGKILL after the grace period if it is still running."""
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()

    def kill() -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

    timer = threading.Timer(KILL_GRACE_S, kill)
    timer.daemon = True
    timer.start()


def _describe(exc: OSError) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return f"{type(exc).__name__}: {exc}"


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read()).get("detail", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def _say(pilot: int, message: str) -> None:
    print(f"gridcore pilot {pilot}: {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
