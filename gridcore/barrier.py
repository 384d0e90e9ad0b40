"""The start barrier every co-allocated component passes before its real command.

Seed 000 Sec. 3.3: the components of a job are claimed (started) at their sites possibly
in different claiming tries; each runs "a small piece of code" that waits on the barrier
until it hears from all the other components, so the application starts everywhere at
once. Usage (the KOALA engine writes this command line)::

    python -m gridcore.barrier --db URL --job ID --component I --epoch E -- COMMAND...

1. Binds the component's data port: a TCP socket listening on ``--bind`` (default
   127.0.0.1) port 0. The socket stays open and is inherited by COMMAND (``pass_fds``)
   as ``GRIDCORE_LISTEN_FD``, so no other process can take the port between the barrier
   and the program; ``GRIDCORE_HOST``/``GRIDCORE_PORT`` name it.
2. Registers host, port and the time in its component row (one transaction).
3. Polls the state DB every 50 ms until every component of the job's current epoch has
   registered, or gives up: at once (exit 75) when the job was aborted, cancelled or
   re-placed (a newer epoch), after ``--timeout`` seconds (exit 124).
4. Writes ``peers-<job>-<epoch>-<component>.json`` (``{"components": [{"index", "host",
   "port"}, ...]}``) into its working directory, atomically (temporary name, then
   rename; components sharing a site's directory each get their own file), records
   its release time, and runs COMMAND with ``GRIDCORE_PEERS``, ``GRIDCORE_COMPONENT``,
   ``GRIDCORE_COMPONENTS``, ``GRIDCORE_JOB``.
   SIGTERM/SIGINT are passed on to COMMAND; its exit code is the barrier's (128 + N for
   a command killed by signal N).

The DB URL comes from ``--db`` or ``$GRIDCORE_DB_URL`` (the engine uses the latter when
the URL holds a password, keeping it off command lines).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from sqlalchemy import ColumnElement, and_, select, update

from gridcore.engine.phases import BARRIER_JOB, STARTED_COMPONENT
from gridcore.state.schema import coalloc_components, coalloc_jobs
from gridcore.state.store import Store, default_db_url, open_store

EXIT_ABORTED = 75
EXIT_TIMEOUT = 124
POLL_S = 0.05
DEFAULT_TIMEOUT_S = 600.0
TIMEOUT_ENV = "GRIDCORE_BARRIER_TIMEOUT_S"
PEERS_FILE = "peers-{job}-{epoch}-{component}.json"
# Job and component states in which a component may still wait at (or pass) the barrier.
_LIVE_JOB = tuple(p.value for p in BARRIER_JOB)
_LIVE_COMPONENT = tuple(s.value for s in STARTED_COMPONENT)


@dataclass(frozen=True)
class Peer:
    index: int
    host: str
    port: int


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    listener = socket.create_server((args.bind, 0))
    listener.set_inheritable(True)
    host, port = listener.getsockname()[:2]
    store = open_store(args.db or default_db_url())
    try:
        peers = _meet(store, args, str(host), int(port))
    finally:
        store.dispose()
    if isinstance(peers, int):
        listener.close()
        return peers
    path = _write_peers(args, peers)
    env = {
        **os.environ,
        "GRIDCORE_PEERS": str(path),
        "GRIDCORE_JOB": str(args.job),
        "GRIDCORE_COMPONENT": str(args.component),
        "GRIDCORE_COMPONENTS": str(len(peers)),
        "GRIDCORE_HOST": str(host),
        "GRIDCORE_PORT": str(port),
        "GRIDCORE_LISTEN_FD": str(listener.fileno()),
    }
    return _run(args.command, env, listener)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gridcore.barrier", description=__doc__)
    parser.add_argument("--db", default=None, help="state DB URL (default $GRIDCORE_DB_URL)")
    parser.add_argument("--job", type=int, required=True)
    parser.add_argument("--component", type=int, required=True)
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--bind", default="127.0.0.1", help="address of the data port")
    parser.add_argument(
        "--timeout",
        type=float,
        default=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)),
        help="seconds to wait for the other components",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("a COMMAND after -- is required")
    return args


def _meet(store: Store, args: argparse.Namespace, host: str, port: int) -> list[Peer] | int:
    """Register, wait for every peer, record the release: the peers, or an exit code."""
    if not _register(store, args, host, port):
        _say(args, "aborted before registering (job re-placed, aborted or cancelled)")
        return EXIT_ABORTED
    deadline = time.monotonic() + args.timeout
    while True:
        peers = _peers(store, args)
        if peers is None:
            _say(args, "aborted while waiting (job re-placed, aborted or cancelled)")
            return EXIT_ABORTED
        if peers:
            _release(store, args)
            return peers
        if time.monotonic() >= deadline:
            _say(args, f"timed out after {args.timeout:g} s waiting for the other components")
            return EXIT_TIMEOUT
        time.sleep(POLL_S)


def _mine(args: argparse.Namespace) -> ColumnElement[bool]:
    c = coalloc_components.c
    return and_(
        c.job_id == args.job,
        c.idx == args.component,
        c.epoch == args.epoch,
        c.state.in_(_LIVE_COMPONENT),
    )


def _register(store: Store, args: argparse.Namespace, host: str, port: int) -> bool:
    with store.begin() as conn:
        done = conn.execute(
            update(coalloc_components)
            .where(_mine(args))
            .values(host=host, port=port, registered_at=time.time())
        )
    return done.rowcount == 1


def _write_peers(args: argparse.Namespace, peers: list[Peer]) -> Path:
    """One file per component, published by rename: components of one job that share a
    working directory (two on one site) never read each other's half-written file."""
    name = PEERS_FILE.format(job=args.job, epoch=args.epoch, component=args.component)
    path = Path.cwd() / name
    temporary = path.with_name(f".{name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"components": [p.__dict__ for p in peers]}))
    os.replace(temporary, path)
    return path


def _peers(store: Store, args: argparse.Namespace) -> list[Peer] | None:
    """Every component's address once all registered; [] while some have not; None if
    this component's job or epoch is no longer live."""
    c = coalloc_components.c
    with store.begin() as conn:
        job = conn.execute(
            select(coalloc_jobs.c.state, coalloc_jobs.c.epoch).where(coalloc_jobs.c.id == args.job)
        ).one_or_none()
        rows = conn.execute(
            select(c.idx, c.host, c.port, c.state)
            .where(and_(c.job_id == args.job, c.epoch == args.epoch))
            .order_by(c.idx)
        ).all()
    if job is None or job.state not in _LIVE_JOB or job.epoch != args.epoch:
        return None
    mine = [r for r in rows if r.idx == args.component]
    if not mine or mine[0].state not in _LIVE_COMPONENT:
        return None
    if any(r.port is None for r in rows):
        return []
    return [Peer(r.idx, r.host, r.port) for r in rows]


def _release(store: Store, args: argparse.Namespace) -> None:
    with store.begin() as conn:
        conn.execute(update(coalloc_components).where(_mine(args)).values(released_at=time.time()))


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
    print(f"gridcore.barrier job {args.job} component {args.component}: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
