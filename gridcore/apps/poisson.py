"""A 2-D Poisson solver split into vertical strips, one per co-allocated component.

How it works, in full: ``docs/apps.md``
(section ``gridcore/apps/poisson.py``).
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import math
import os
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gridcore.errors import ConfigError, GridError, RequestError

Grid = NDArray[np.float64]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_TIMEOUT_S = 30.0
# Retrying a refused connection starts fast (neighbours usually start together) and
# backs off so that a slow-starting neighbour is not hammered.
FIRST_RETRY_S = 0.02
MAX_RETRY_S = 0.5
# Polling for a published file costs one stat: poll often, so the barrier's release is
# seen promptly.
MAX_POLL_S = 0.1
# Little-endian on the wire, so components on hosts of either byte order agree.
_WIRE = np.dtype("<f8")
_HELLO = struct.Struct("!4s5I")
_MAGIC = b"GPS1"


class CouplingError(GridError):
    """The components of a split run could not connect, or lost a neighbour; the
    message names the component, the neighbour and its address."""


@dataclass(frozen=True)
class PeerAddress:
    """Where component ``index`` listens: one entry of the peers file."""

    index: int
    host: str
    port: int

    def as_json(self) -> dict[str, Any]:
        return {"index": self.index, "host": self.host, "port": self.port}


@dataclass(frozen=True)
class Rendezvous:
    """How a component finds its neighbours (the protocol in docs/apps.md)."""

    peers: Path
    host: str = DEFAULT_HOST
    listen_port: int = 0
    register: Path | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    listen_fd: int | None = None


@dataclass(frozen=True)
class StripRun:
    """A component's result: its strip, its residual, and the seconds spent exchanging."""

    strip: Grid
    residual: float
    exchange_s: float


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.check:
            return _run_check(args)
        return _run_component(args)
    except GridError as exc:
        print(f"poisson: error: {exc}", file=sys.stderr)
        return 2


def solve_serial(n: int, iterations: int) -> Grid:
    """The reference: ``iterations`` Jacobi sweeps on the whole ``n x n`` interior."""
    _check_problem(n, iterations)
    u = _jacobi(_initial_block(n, 0, n + 2), _source_block(n, 0, n + 2), iterations, _no_halo)
    return u[1:-1, 1:-1].copy()


def strip_bounds(n: int, sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Half-open ranges of interior columns (``0 .. n``), one per component, with widths
    proportional to ``sizes``: each gets ``floor(n * size / total)`` and the columns left
    over go to the largest remainders, the lower index first on a tie."""
    if not sizes or any(size < 1 for size in sizes):
        raise RequestError(f"sizes: need at least one positive processor count, got {sizes}")
    if n < len(sizes):
        raise RequestError(f"n: {n} columns cannot give each of {len(sizes)} components one")
    total = sum(sizes)
    widths = [n * size // total for size in sizes]
    by_remainder = sorted(range(len(sizes)), key=lambda k: (-(n * sizes[k] % total), k))
    for k in by_remainder[: n - sum(widths)]:
        widths[k] += 1
    if min(widths) == 0:
        raise RequestError(f"n: {n} columns leave a component of sizes {list(sizes)} none")
    return _consecutive(widths)


def solve_strip(
    n: int,
    iterations: int,
    bounds: Sequence[tuple[int, int]],
    index: int,
    left: Channel | None,
    right: Channel | None,
) -> Grid:
    """Component ``index``'s strip (``n x width``) after ``iterations`` sweeps, its ghost
    columns kept current through the ``left`` and ``right`` channels."""
    return run_strip(n, iterations, bounds, index, left, right).strip


def run_strip(
    n: int,
    iterations: int,
    bounds: Sequence[tuple[int, int]],
    index: int,
    left: Channel | None,
    right: Channel | None,
) -> StripRun:
    """:func:`solve_strip`, also returning the strip's residual and exchange time."""
    _check_problem(n, iterations)
    lo, hi = bounds[index]
    # Local column c is global column lo + c: the owned ones plus a ghost on each side.
    u0, rhs = _initial_block(n, lo, hi + 2), _source_block(n, lo, hi + 2)
    spent = [0.0]

    def halo(u: Grid) -> None:
        started = time.perf_counter()
        _exchange(u, index, left, right)
        spent[0] += time.perf_counter() - started

    u = _jacobi(u0, rhs, iterations, halo)
    return StripRun(u[1:-1, 1:-1].copy(), _max_residual(u, rhs, n), spent[0])


def assemble(strips: Sequence[Grid], bounds: Sequence[tuple[int, int]], n: int) -> Grid:
    """The ``n x n`` interior from the strips of components ``0, 1, ...`` in order."""
    if len(strips) != len(bounds):
        raise RequestError(f"strips: {len(strips)} strips for {len(bounds)} bounds")
    expected = 0
    for k, (strip, (lo, hi)) in enumerate(zip(strips, bounds, strict=True)):
        if lo != expected or strip.shape != (n, hi - lo):
            raise RequestError(
                f"strips: strip {k} has shape {strip.shape} and bounds {(lo, hi)}; "
                f"expected columns from {expected} and shape {(n, hi - lo)}"
            )
        expected = hi
    if expected != n:
        raise RequestError(f"strips: they cover {expected} of {n} columns")
    return np.hstack(strips)


def bounds_of(strips: Sequence[Grid]) -> list[tuple[int, int]]:
    """Column ranges of consecutive strips, from their widths."""
    return _consecutive([strip.shape[1] for strip in strips])


def max_abs_difference_from_serial(strips: Sequence[Grid], n: int, iterations: int) -> float:
    """Largest pointwise difference between the assembled strips and the serial run."""
    full = assemble(strips, bounds_of(strips), n)
    return float(np.max(np.abs(full - solve_serial(n, iterations))))


def manufactured_solution(n: int) -> Grid:
    """``u*`` on the ``n x n`` interior points."""
    return _exact_block(n, 0, n + 2)[1:-1, 1:-1].copy()


def residual(interior: Grid, n: int) -> float:
    """Max-norm of ``f + laplace_h(u)`` over the interior, boundary values from ``g``."""
    u = _initial_block(n, 0, n + 2)
    u[1:-1, 1:-1] = interior
    return _max_residual(u, _source_block(n, 0, n + 2), n)


class Channel:
    """A connected TCP stream to one neighbour, carrying fixed-size float64 columns.

    Every message has a size both ends know from the hello (``rows`` values), so there
    is no framing beyond reading exactly that many bytes.
    """

    def __init__(self, sock: socket.socket, rows: int, peer: str, timeout_s: float) -> None:
        self._sock = sock
        self.rows = rows
        self.peer = peer
        # Columns are small and answered at once: Nagle would hold each one back waiting
        # for the ACK the receiver delays.
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout_s)

    def __enter__(self) -> Channel:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def settimeout(self, timeout_s: float) -> None:
        self._sock.settimeout(timeout_s)

    def send_column(self, column: Grid) -> None:
        payload = np.ascontiguousarray(column, dtype=_WIRE)
        if payload.shape != (self.rows,):
            raise ValueError(f"column of shape {payload.shape}, channel carries {self.rows}")
        self._send(payload.tobytes())

    def recv_column(self) -> Grid:
        buffer = bytearray(self.rows * _WIRE.itemsize)
        self._recv_exactly(memoryview(buffer))
        return np.frombuffer(buffer, dtype=_WIRE).astype(np.float64)

    def send_hello(self, hello: tuple[int, int, int, int, int]) -> None:
        self._send(_HELLO.pack(_MAGIC, *hello))

    def recv_hello(self) -> tuple[int, ...]:
        buffer = bytearray(_HELLO.size)
        self._recv_exactly(memoryview(buffer))
        magic, *fields = _HELLO.unpack(buffer)
        if magic != _MAGIC:
            raise CouplingError(f"{self.peer} does not speak this protocol (got {magic!r})")
        return tuple(fields)

    def _send(self, payload: bytes) -> None:
        try:
            self._sock.sendall(payload)
        except OSError as exc:
            raise CouplingError(f"sending to {self.peer} failed: {exc!r}") from exc

    def _recv_exactly(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            try:
                count = self._sock.recv_into(view[got:])
            except OSError as exc:
                raise CouplingError(f"receiving from {self.peer} failed: {exc!r}") from exc
            if count == 0:
                raise CouplingError(
                    f"{self.peer} closed the connection after {got} of {len(view)} bytes"
                )
            got += count


def open_listener(host: str = DEFAULT_HOST, port: int = 0) -> tuple[socket.socket, int]:
    """A listening TCP socket on ``host:port`` (0: any free port) and the port it got."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        listener = socket.create_server((host, port), family=family)
    except OSError as exc:
        raise CouplingError(f"cannot listen on {host}:{port}: {exc!r}") from exc
    return listener, int(listener.getsockname()[1])


@contextmanager
def couple(
    n: int, iterations: int, bounds: Sequence[tuple[int, int]], index: int, how: Rendezvous
) -> Iterator[tuple[Channel | None, Channel | None]]:
    """The channels to the left and right neighbours of component ``index`` (None at an
    end), connected as docs/apps.md describes, closed on exit."""
    if len(bounds) == 1:
        yield None, None
        return
    deadline = time.monotonic() + how.timeout_s
    meeting = _Meeting((index, n, iterations, *bounds[index]), bounds, how, deadline)
    with ExitStack() as stack:
        listener, port = _listener(how)
        with listener:
            if how.register is not None:
                write_registration(how.register, PeerAddress(index, how.host, port))
            peers = wait_for_peers(how.peers, len(bounds), meeting.deadline)
            if peers[index].port != port:
                raise CouplingError(
                    f"component {index}: the peers file {how.peers} lists it at "
                    f"{_address(peers[index])} but it listens on port {port} "
                    "(pass --listen-port, or --register and publish what it registers)"
                )
            left: Channel | None = None
            right: Channel | None = None
            if index > 0:
                left = stack.enter_context(_connect_left(peers[index - 1], meeting))
            if index < len(bounds) - 1:
                right = stack.enter_context(_accept_right(listener, peers[index + 1], meeting))
        yield left, right


def write_registration(path: Path, peer: PeerAddress) -> None:
    """Publish where this component listens (one peers-file entry) for the launcher."""
    _publish_json(path, peer.as_json())


def collect_peers(registrations: Sequence[Path], timeout_s: float) -> list[PeerAddress]:
    """The launcher's half of the barrier: wait for every component's registration."""
    deadline = time.monotonic() + timeout_s
    peers = [_parse_entry(_wait_for_json(path, deadline), path) for path in registrations]
    return _validated(peers, len(registrations), "registrations")


def write_peers(path: Path, peers: Sequence[PeerAddress]) -> None:
    """Publish the peers file atomically; components read it as soon as it exists."""
    _publish_json(path, {"components": [peer.as_json() for peer in peers]})


def read_peers(path: Path, count: int) -> list[PeerAddress]:
    """The peers file's entries, indexed by component; malformed files are named."""
    raw = _load_json(path)
    entries = raw.get("components") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: expected {{'components': [...]}}")
    return _validated([_parse_entry(entry, path) for entry in entries], count, str(path))


def wait_for_peers(path: Path, count: int, deadline: float) -> list[PeerAddress]:
    """:func:`read_peers` once the launcher has published the file (by ``deadline``)."""
    _wait_for_json(path, deadline)
    return read_peers(path, count)


# --- numerics --------------------------------------------------------------------------


def _consecutive(widths: Sequence[int]) -> list[tuple[int, int]]:
    return list(itertools.pairwise(itertools.accumulate(widths, initial=0)))


def _check_problem(n: int, iterations: int) -> None:
    if n < 1:
        raise RequestError(f"n: need at least one interior point per side, got {n}")
    if iterations < 0:
        raise RequestError(f"iterations: must not be negative, got {iterations}")


def _exact_block(n: int, c0: int, c1: int) -> Grid:
    """``u*`` on all rows and the global columns ``c0 .. c1``.

    The sines are evaluated on the whole axis and then sliced, and the block combines
    them with multiplications and additions only: a strip's values are then bit-for-bit
    those of the full grid, whatever path numpy's vectorised sine takes on either length.
    """
    axis, sin_x, sin_2y = _axis_and_sines(n)
    x = axis[c0:c1]
    return np.multiply.outer(sin_2y, sin_x[c0:c1]) + (axis * axis)[:, None] + (x * x)[None, :]


def _axis_and_sines(n: int) -> tuple[Grid, Grid, Grid]:
    """The coordinates ``0, h, .., 1`` of either axis, ``sin(pi x)`` and ``sin(2 pi y)``."""
    axis = np.arange(n + 2, dtype=np.float64) / (n + 1)
    return axis, np.sin(np.pi * axis), np.sin(2.0 * np.pi * axis)


def _initial_block(n: int, c0: int, c1: int) -> Grid:
    """The starting iterate on the global columns ``c0 .. c1``: ``g`` on the boundary,
    0 inside."""
    block = _exact_block(n, c0, c1)
    first, last = max(1, c0), min(n, c1 - 1)
    block[1:-1, first - c0 : last - c0 + 1] = 0.0
    return block


def _source_block(n: int, c0: int, c1: int) -> Grid:
    """``h^2 f`` on all rows and the global columns ``c0 .. c1`` (see `_exact_block`)."""
    _, sin_x, sin_2y = _axis_and_sines(n)
    h2 = 1.0 / float((n + 1) ** 2)
    return (5.0 * math.pi**2 * np.multiply.outer(sin_2y, sin_x[c0:c1]) - 4.0) * h2


def _jacobi(u: Grid, rhs: Grid, iterations: int, halo: Callable[[Grid], None]) -> Grid:
    """``iterations`` sweeps, refreshing the ghost columns before each and once after
    the last (so the residual sees the neighbours' final values)."""
    following = u.copy()
    for _ in range(iterations):
        halo(u)
        _sweep(u, rhs, following)
        u, following = following, u
    halo(u)
    return u


def _sweep(u: Grid, rhs: Grid, out: Grid) -> None:
    # One fixed expression for the serial and the split runs: the same operations in the
    # same order on every point, hence the same bits.
    out[1:-1, 1:-1] = 0.25 * (
        u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] + rhs[1:-1, 1:-1]
    )


def _max_residual(u: Grid, rhs: Grid, n: int) -> float:
    neighbours = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:]
    scaled = rhs[1:-1, 1:-1] + neighbours - 4.0 * u[1:-1, 1:-1]
    return float(np.max(np.abs(scaled))) * float((n + 1) ** 2)


def _no_halo(u: Grid) -> None:
    """The serial grid has no neighbours: its edge columns are the Dirichlet boundary."""


def _exchange(u: Grid, index: int, left: Channel | None, right: Channel | None) -> None:
    """Refresh the ghost columns of ``u``: links with an even left end first, and the
    left end of a link sends first (deadlock-free for any column size)."""
    links = ((right, True), (left, False)) if index % 2 == 0 else ((left, False), (right, True))
    for channel, is_right in links:
        if channel is None:
            continue
        if is_right:
            channel.send_column(u[1:-1, -2])
            u[1:-1, -1] = channel.recv_column()
        else:
            u[1:-1, 0] = channel.recv_column()
            channel.send_column(u[1:-1, 1])


# --- rendezvous ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Meeting:
    """What both ends of a link check in the hello, and when the rendezvous gives up."""

    me: tuple[int, int, int, int, int]  # index, n, iterations, lo, hi
    bounds: Sequence[tuple[int, int]]
    how: Rendezvous
    deadline: float

    def remaining(self) -> float:
        return max(self.deadline - time.monotonic(), 0.0)

    def expected(self, peer_index: int) -> tuple[int, ...]:
        return (peer_index, self.me[1], self.me[2], *self.bounds[peer_index])

    def open_channel(self, sock: socket.socket, who: str) -> Channel:
        # The hello shares the rendezvous deadline; afterwards a neighbour may stay
        # silent for up to the full timeout per column before it counts as lost.
        return Channel(sock, self.me[1], who, timeout_s=max(self.remaining(), 0.001))

    def check(self, channel: Channel, peer_index: int) -> None:
        got, expected = channel.recv_hello(), self.expected(peer_index)
        if got != expected:
            names = ("index", "n", "iterations", "lo", "hi")
            raise CouplingError(
                f"{channel.peer} disagrees on the problem: "
                f"got {dict(zip(names, got, strict=True))}, "
                f"expected {dict(zip(names, expected, strict=True))}"
            )


def _connect_left(peer: PeerAddress, meeting: _Meeting) -> Channel:
    who = f"component {meeting.me[0]}'s left neighbour (component {peer.index} at {_address(peer)})"
    channel = meeting.open_channel(_connect_with_retry(peer, meeting, who), who)
    try:
        channel.send_hello(meeting.me)
        meeting.check(channel, peer.index)
        channel.settimeout(meeting.how.timeout_s)
    except BaseException:
        channel.close()
        raise
    return channel


def _accept_right(listener: socket.socket, peer: PeerAddress, meeting: _Meeting) -> Channel:
    host, port = listener.getsockname()[:2]
    who = f"component {meeting.me[0]}'s right neighbour (component {peer.index})"
    listener.settimeout(max(meeting.remaining(), 0.001))
    try:
        sock, _ = listener.accept()
    except TimeoutError as exc:
        raise CouplingError(
            f"{who} never connected to {host}:{port} within {meeting.how.timeout_s:g} s"
        ) from exc
    except OSError as exc:
        raise CouplingError(f"accepting {who} on {host}:{port} failed: {exc!r}") from exc
    channel = meeting.open_channel(sock, who)
    try:
        meeting.check(channel, peer.index)
        channel.send_hello(meeting.me)
        channel.settimeout(meeting.how.timeout_s)
    except BaseException:
        channel.close()
        raise
    return channel


def _connect_with_retry(peer: PeerAddress, meeting: _Meeting, who: str) -> socket.socket:
    delay = FIRST_RETRY_S
    while True:
        try:
            return socket.create_connection(
                (peer.host, peer.port), timeout=max(meeting.remaining(), 0.001)
            )
        except OSError as exc:
            last = exc
        if meeting.remaining() <= 0:
            raise CouplingError(
                f"{who} did not accept a connection within {meeting.how.timeout_s:g} s "
                f"(last error: {last!r})"
            ) from last
        time.sleep(min(delay, meeting.remaining()))
        delay = min(2.0 * delay, MAX_RETRY_S)


def _listener(how: Rendezvous) -> tuple[socket.socket, int]:
    if how.listen_fd is None:
        return open_listener(how.host, how.listen_port)
    try:
        listener = socket.socket(fileno=how.listen_fd)
    except OSError as exc:
        raise CouplingError(f"inherited listening socket {how.listen_fd}: {exc!r}") from exc
    return listener, int(listener.getsockname()[1])


def _address(peer: PeerAddress) -> str:
    return f"[{peer.host}]:{peer.port}" if ":" in peer.host else f"{peer.host}:{peer.port}"


def _publish_json(path: Path, payload: dict[str, Any]) -> None:
    _publish(Path(path), json.dumps(payload).encode("utf-8"))


def _publish(path: Path, data: bytes) -> None:
    """Write to a temporary file beside ``path`` and rename it into place, so a reader
    polling for ``path`` never sees a partial file."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _wait_for_json(path: Path, deadline: float) -> Any:
    delay = FIRST_RETRY_S
    while not Path(path).exists():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CouplingError(f"{path} was not published in time")
        time.sleep(min(delay, remaining))
        delay = min(2.0 * delay, MAX_POLL_S)
    return _load_json(path)


def _load_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read JSON: {exc}") from exc


def _parse_entry(entry: Any, source: Path) -> PeerAddress:
    fields = entry if isinstance(entry, dict) else {}
    index, host, port = fields.get("index"), fields.get("host"), fields.get("port")
    if not (isinstance(index, int) and isinstance(host, str) and isinstance(port, int)):
        raise ConfigError(f"{source}: entry {entry!r} needs integer index and port, string host")
    if not 0 < port < 65536:
        raise ConfigError(f"{source}: entry {entry!r} has no valid port")
    return PeerAddress(index, host, port)


def _validated(peers: Sequence[PeerAddress], count: int, source: str) -> list[PeerAddress]:
    """The peers ordered by index, which must be exactly ``0 .. count - 1``."""
    ordered = sorted(peers, key=lambda peer: peer.index)
    if [peer.index for peer in ordered] != list(range(count)):
        raise ConfigError(
            f"{source}: expected components 0..{count - 1} once each, "
            f"got {[peer.index for peer in peers]}"
        )
    return ordered


# --- command line ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gridcore.apps.poisson",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--n", type=int, required=True, help="interior points per side")
    parser.add_argument("--iterations", type=int, required=True, help="Jacobi sweeps")
    parser.add_argument(
        "--index",
        type=int,
        default=os.environ.get("GRIDCORE_COMPONENT", "0"),
        help="this component, from 0 (default $GRIDCORE_COMPONENT or 0)",
    )
    parser.add_argument("--sizes", default="1", help="processors per component, e.g. 4,8,4")
    parser.add_argument(
        "--peers",
        type=Path,
        default=os.environ.get("GRIDCORE_PEERS"),
        help="peers file (JSON) the launcher publishes (default $GRIDCORE_PEERS)",
    )
    parser.add_argument("--register", type=Path, help="publish this component's address here")
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to listen on and publish")
    parser.add_argument("--listen-port", type=int, default=0, help="0: any free port")
    parser.add_argument(
        "--listen-fd",
        type=int,
        default=os.environ.get("GRIDCORE_LISTEN_FD"),
        help="adopt this inherited listening socket (default $GRIDCORE_LISTEN_FD)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds to wait for the peers file and the neighbours, and then for each column",
    )
    parser.add_argument("--out", type=Path, help="write this component's strip here (.npy)")
    parser.add_argument("--check", action="store_true", help="compare strips with the serial run")
    parser.add_argument("--tolerance", type=float, help="--check: exit 1 above this difference")
    parser.add_argument("strips", nargs="*", type=Path, help="--check: strip files, in order")
    return parser


def _run_component(args: argparse.Namespace) -> int:
    sizes = _parse_sizes(args.sizes)
    bounds = strip_bounds(args.n, sizes)
    if not 0 <= args.index < len(sizes):
        raise RequestError(f"index: {args.index} is not one of the {len(sizes)} components")
    if len(sizes) > 1 and args.peers is None:
        raise RequestError("peers: a split run (more than one size) needs --peers")
    how = Rendezvous(
        args.peers, args.host, args.listen_port, args.register, args.timeout, args.listen_fd
    )
    started = time.perf_counter()
    with couple(args.n, args.iterations, bounds, args.index, how) as (left, right):
        coupled = time.perf_counter()
        run = run_strip(args.n, args.iterations, bounds, args.index, left, right)
        finished = time.perf_counter()
    if args.out is not None:
        _save_strip(args.out, run.strip)
    report = {
        "index": args.index,
        "bounds": list(bounds[args.index]),
        "n": args.n,
        "iterations": args.iterations,
        "residual": run.residual,
        "wall_time_s": round(finished - coupled, 6),
        "exchange_s": round(run.exchange_s, 6),
        "rendezvous_s": round(coupled - started, 6),
    }
    print(json.dumps(report), flush=True)
    return 0


def _run_check(args: argparse.Namespace) -> int:
    if not args.strips:
        raise RequestError("strips: --check needs the strip files, in component order")
    strips = [_load_strip(path) for path in args.strips]
    full = assemble(strips, bounds_of(strips), args.n)
    difference = float(np.max(np.abs(full - solve_serial(args.n, args.iterations))))
    report = {
        "max_abs_diff": difference,
        "residual": residual(full, args.n),
        "max_error_vs_exact": float(np.max(np.abs(full - manufactured_solution(args.n)))),
        "n": args.n,
        "iterations": args.iterations,
        "bounds": [list(pair) for pair in bounds_of(strips)],
    }
    print(json.dumps(report), flush=True)
    return 1 if args.tolerance is not None and difference > args.tolerance else 0


def _parse_sizes(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError as exc:
        raise RequestError(f"sizes: expected comma-separated integers, got {text!r}") from exc


def _save_strip(path: Path, strip: Grid) -> None:
    buffer = io.BytesIO()
    np.save(buffer, strip)
    _publish(path, buffer.getvalue())


def _load_strip(path: Path) -> Grid:
    try:
        strip = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise RequestError(f"strips: cannot read {path}: {exc}") from exc
    return np.asarray(strip, dtype=np.float64)


if __name__ == "__main__":
    sys.exit(main())
