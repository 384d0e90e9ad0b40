"""The start barrier every co-allocated component passes before its real command.

Design, equations and the choices where a paper is ambiguous: ``docs/coallocation.md``
(section ``gridcore/barrier.py``).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from gridcore.pilot import (
    PEERS_FILE as PEERS_FILE,  # the peers file a component gets (re-exported)
)
from gridcore.pilot import (
    Center,
    Refused,
    Unreachable,
    advertised_host,
    listen,
    write_peers,
)

TOKEN_ENV = "GRIDCORE_COMPONENT_TOKEN"
TIMEOUT_ENV = "GRIDCORE_BARRIER_TIMEOUT_S"
UNREACHABLE_ENV = "GRIDCORE_BARRIER_UNREACHABLE_S"
EXIT_USAGE = 2
EXIT_UNREACHABLE = 69  # sysexits EX_UNAVAILABLE
EXIT_ABORTED = 75
EXIT_REJECTED = 76  # sysexits EX_PROTOCOL
EXIT_REFUSED = 77  # sysexits EX_NOPERM
EXIT_TIMEOUT = 124
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_UNREACHABLE_S = 60.0
PEERS_WAIT_S = 25.0  # one long poll's wait (the center allows 30)
REQUEST_SLACK_S = 15.0  # an HTTP request's timeout beyond the wait it asked for
MIN_POLL_S = 0.05  # a "wait" that came back sooner is not asked again before this
API = "/api/v1/components/{job}/{epoch}/{component}"


@dataclass(frozen=True)
class Peer:
    index: int
    host: str
    port: int


class Stop(Exception):
    """The barrier ends without starting COMMAND: ``code`` and a line saying why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        _say(args, f"no token: set ${TOKEN_ENV}")
        return EXIT_USAGE
    listener = listen(args.bind)
    host = args.advertise or advertised_host(args.center, args.bind)
    port = int(listener.getsockname()[1])
    center = _center(args, token)
    try:
        peers = _meet(center, args, host, port)
    except Stop as stop:
        _say(args, str(stop))
        listener.close()
        return stop.code
    path = write_peers(
        Path.cwd(), args.job, args.component, [p.__dict__ for p in peers], args.epoch
    )
    env = {
        **os.environ,
        "GRIDCORE_PEERS": str(path),
        "GRIDCORE_JOB": str(args.job),
        "GRIDCORE_COMPONENT": str(args.component),
        "GRIDCORE_COMPONENTS": str(len(peers)),
        "GRIDCORE_HOST": host,
        "GRIDCORE_PORT": str(port),
        "GRIDCORE_LISTEN_FD": str(listener.fileno()),
    }
    return _run(args.command, env, listener)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m gridcore.barrier",
        description="KOALA's start barrier: wait for every component, then run COMMAND.",
    )
    parser.add_argument("--center", required=True, help="the VJ center's URL")
    parser.add_argument("--job", type=int, required=True)
    parser.add_argument("--component", type=int, required=True)
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--bind", default="127.0.0.1", help="address of the data port")
    parser.add_argument("--advertise", default=None, help="host the other components dial")
    parser.add_argument(
        "--timeout",
        type=float,
        default=float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S),
        help="seconds to wait for the other components",
    )
    parser.add_argument(
        "--unreachable-s",
        type=float,
        default=float(os.environ.get(UNREACHABLE_ENV) or DEFAULT_UNREACHABLE_S),
        help="give up (exit 69) after the center was unreachable this long",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("a COMMAND after -- is required")
    if urllib.parse.urlsplit(args.center).scheme not in ("http", "https"):
        parser.error(f"--center must be an http(s) URL, not {args.center!r}")
    return args


def _meet(center: Center, args: argparse.Namespace, host: str, port: int) -> list[Peer]:
    """Register, wait for every peer, record the release: the peers, or :class:`Stop`."""
    registered = _call(center, "POST", "/register", body={"host": host, "port": port})
    if registered.get("state") != "wait":
        raise Stop(EXIT_ABORTED, "aborted before registering (job re-placed, aborted or cancelled)")
    deadline = time.monotonic() + args.timeout
    while True:
        left = deadline - time.monotonic()
        wait = max(0.0, min(PEERS_WAIT_S, left))
        asked = time.monotonic()
        answer = _call(center, "GET", f"/peers?wait={wait:.2f}", timeout=wait + REQUEST_SLACK_S)
        state = answer.get("state")
        if state == "go":
            peers = [Peer(int(p["index"]), str(p["host"]), int(p["port"])) for p in answer["peers"]]
            break
        if state != "wait":
            raise Stop(EXIT_ABORTED, "aborted while waiting (job re-placed, aborted or cancelled)")
        if time.monotonic() >= deadline:
            raise Stop(
                EXIT_TIMEOUT,
                f"timed out after {args.timeout:g} s waiting for the other components",
            )
        time.sleep(max(0.0, MIN_POLL_S - (time.monotonic() - asked)))
    if _call(center, "POST", "/released").get("state") != "go":
        raise Stop(EXIT_ABORTED, "aborted while being released (job re-placed or cancelled)")
    return peers


def _center(args: argparse.Namespace, token: str) -> Center:
    path = API.format(job=args.job, epoch=args.epoch, component=args.component)
    return Center(args.center.rstrip("/") + path, token, float(args.unreachable_s))


def _call(center: Center, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    """One request through the pilot's client (retried with back-off while the center
    is silent), its failures as the barrier's exit codes: unreachable 69; a refused
    token 77, unless the center accepted it before: then the component's row was
    replaced by a new placement (75); any other 4xx 76."""
    try:
        return center.call(method, path, **kwargs)
    except Unreachable as exc:
        raise Stop(
            EXIT_UNREACHABLE, f"the center at {center.base} is unreachable ({exc})"
        ) from None
    except Refused as exc:
        if exc.status == 401 and center.accepted:
            raise Stop(
                EXIT_ABORTED,
                "aborted while waiting (job re-placed: the center no longer knows this"
                f" component's token; {exc})",
            ) from None
        if exc.status in (401, 403):
            raise Stop(EXIT_REFUSED, f"the center refused this component's token ({exc})") from None
        raise Stop(EXIT_REJECTED, f"the center rejected the request ({exc})") from None


def _run(command: list[str], env: dict[str, str], listener: socket.socket) -> int:
    proc = subprocess.Popen(command, env=env, pass_fds=(listener.fileno(),))
    listener.close()

    def forward(signum: int, _frame: FrameType | None) -> None:
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = proc.wait()
    return 128 - code if code < 0 else code


def _say(args: argparse.Namespace, message: str) -> None:
    print(
        f"gridcore.barrier job {args.job} component {args.component}: {message}",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
