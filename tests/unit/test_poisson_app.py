"""The strip-split Poisson solver: strip widths, convergence of the reference, exact
agreement of split runs (threads in-process, then real OS processes over TCP on
127.0.0.1), and clear, bounded failures when a neighbour never shows up."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pytest

from gridcore.apps.poisson import (
    Channel,
    CouplingError,
    PeerAddress,
    Rendezvous,
    StripRun,
    assemble,
    collect_peers,
    couple,
    manufactured_solution,
    max_abs_difference_from_serial,
    open_listener,
    read_peers,
    residual,
    run_strip,
    solve_serial,
    solve_strip,
    strip_bounds,
    write_peers,
)
from gridcore.errors import ConfigError, RequestError

REPO = Path(__file__).resolve().parents[2]
LOCALHOST = "127.0.0.1"


# --- strip widths ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "n", "sizes", "expected"),
    [
        ("4,8,4 on 64 columns: exactly 1:2:1", 64, [4, 8, 4], [(0, 16), (16, 48), (48, 64)]),
        ("4,8,4 on 50: the spare column to the tie's lower index", 50, [4, 8, 4],
         [(0, 13), (13, 38), (38, 50)]),
        ("three equal on 10: 4,3,3", 10, [1, 1, 1], [(0, 4), (4, 7), (7, 10)]),
        ("a lone component owns everything", 7, [16], [(0, 7)]),
        ("largest remainder wins the spare column", 10, [1, 2], [(0, 3), (3, 10)]),
    ],
)  # fmt: skip
def test_strip_bounds(
    scenario: str, n: int, sizes: list[int], expected: list[tuple[int, int]]
) -> None:
    assert strip_bounds(n, sizes) == expected, scenario


def test_strip_bounds_are_contiguous_and_proportional() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        sizes = rng.integers(1, 64, size=int(rng.integers(1, 8))).tolist()
        n = int(rng.integers(len(sizes) * 64, 2000))
        bounds = strip_bounds(n, sizes)
        assert [lo for lo, _ in bounds] == [0, *(hi for _, hi in bounds[:-1])]
        assert bounds[-1][1] == n
        for (lo, hi), size in zip(bounds, sizes, strict=True):
            assert abs((hi - lo) - n * size / sum(sizes)) < 1.0


@pytest.mark.parametrize(
    ("n", "sizes", "field"),
    [(2, [1, 1, 1], "n:"), (5, [1, 100], "n:"), (8, [4, 0], "sizes:"), (8, [], "sizes:")],
)
def test_strip_bounds_refuses_impossible_splits(n: int, sizes: list[int], field: str) -> None:
    with pytest.raises(RequestError, match=field):
        strip_bounds(n, sizes)


# --- the reference ---------------------------------------------------------------------


def test_serial_converges_to_the_manufactured_solution() -> None:
    n = 15
    exact = manufactured_solution(n)
    errors = [float(np.max(np.abs(solve_serial(n, k) - exact))) for k in (20, 200, 2000)]
    assert errors[0] > errors[1] > errors[2]
    # 2000 sweeps leave no iteration error at h = 1/16: what remains is discretisation.
    assert residual(solve_serial(n, 2000), n) < 1e-8


def test_discretisation_error_is_second_order() -> None:
    # Converged runs (the iteration error is below 1e-10) at h = 1/16 and h = 1/32.
    coarse = np.max(np.abs(solve_serial(15, 2000) - manufactured_solution(15)))
    fine = np.max(np.abs(solve_serial(31, 6000) - manufactured_solution(31)))
    assert 3.5 < coarse / fine < 4.5
    assert fine < 5e-3


def test_zero_iterations_is_the_initial_guess() -> None:
    assert not solve_serial(8, 0).any()


# --- split runs in one process ---------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "n"), [([1, 2, 3, 1], 50), ([4, 8, 4], 48), ([5, 3], 33), ([2], 20)]
)
def test_threads_reproduce_serial_bit_for_bit(sizes: list[int], n: int, tmp_path: Path) -> None:
    iterations = 150
    runs = _split_in_threads(n, iterations, sizes, tmp_path)
    bounds = strip_bounds(n, sizes)
    full = assemble([run.strip for run in runs], bounds, n)
    assert np.array_equal(full, solve_serial(n, iterations))
    # The max-norm residual is a max over strips: the components' own ones combine exactly.
    assert max(run.residual for run in runs) == residual(full, n)


def test_solve_strip_over_hand_made_channels() -> None:
    n, iterations, bounds = 24, 60, strip_bounds(24, [1, 1])
    with _channel_pair(rows=n) as (left_end, right_end), ThreadPoolExecutor(2) as pool:
        first = pool.submit(solve_strip, n, iterations, bounds, 0, None, left_end)
        second = pool.submit(solve_strip, n, iterations, bounds, 1, right_end, None)
        strips = [first.result(timeout=10), second.result(timeout=10)]
    assert max_abs_difference_from_serial(strips, n, iterations) == 0.0


def test_a_neighbour_disagreeing_on_the_problem_is_named(tmp_path: Path) -> None:
    bounds = strip_bounds(16, [1, 1])
    peers = tmp_path / "peers.json"
    registrations = [tmp_path / f"reg{k}.json" for k in range(2)]

    def component(index: int, iterations: int) -> str:
        how = Rendezvous(peers, register=registrations[index], timeout_s=5.0)
        try:
            with couple(16, iterations, bounds, index, how):
                return "coupled"
        except CouplingError as exc:
            return str(exc)

    with ThreadPoolExecutor(2) as pool:
        answers = [pool.submit(component, 0, 10), pool.submit(component, 1, 11)]
        write_peers(peers, collect_peers(registrations, timeout_s=5.0))
        first, second = (answer.result(timeout=10) for answer in answers)
    assert "component 0's right neighbour (component 1) disagrees on the problem" in first
    assert "'iterations': 11" in first
    assert "left neighbour (component 0 at 127.0.0.1:" in second


def test_the_peers_file_must_list_the_port_the_component_listens_on(tmp_path: Path) -> None:
    peers = tmp_path / "peers.json"
    write_peers(peers, [PeerAddress(0, LOCALHOST, 1), PeerAddress(1, LOCALHOST, 2)])
    how = Rendezvous(peers, timeout_s=2.0)
    with (
        pytest.raises(CouplingError, match=r"lists it at 127\.0\.0\.1:1 but it listens on port"),
        couple(16, 5, strip_bounds(16, [1, 1]), 0, how),
    ):
        pass


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cannot read JSON"),
        ('{"peers": []}', "expected {'components'"),
        ('{"components": [{"index": 0, "host": "h", "port": 1}]}', "expected components 0..1"),
        (
            '{"components": [{"index": 0, "host": "h", "port": 1},'
            ' {"index": 0, "host": "h", "port": 2}]}',
            r"got \[0, 0\]",
        ),
        ('{"components": [{"index": 0, "host": "h"}, 1]}', "needs integer index and port"),
        ('{"components": [{"index": 0, "host": "h", "port": 70000}]}', "no valid port"),
    ],
)
def test_malformed_peers_files_are_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "peers.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=message) as caught:
        read_peers(path, 2)
    assert str(path) in str(caught.value)


# --- the channel -----------------------------------------------------------------------


def test_channel_reassembles_a_column_sent_in_pieces() -> None:
    column = np.linspace(-1.0, 1.0, 50)
    payload = column.astype("<f8").tobytes()
    with _tcp_pair() as (sender, receiver):

        def dribble() -> None:
            for start in range(0, len(payload), 150):
                sender.sendall(payload[start : start + 150])
                time.sleep(0.01)

        thread = threading.Thread(target=dribble)
        thread.start()
        with Channel(receiver, rows=50, peer="the test's sender", timeout_s=5.0) as channel:
            received = channel.recv_column()
        thread.join()
    assert np.array_equal(received, column)


def test_channel_names_a_peer_that_hangs_up_mid_column() -> None:
    with _tcp_pair() as (sender, receiver):
        sender.sendall(np.zeros(1).tobytes())
        sender.close()
        with (
            Channel(receiver, rows=50, peer="component 3", timeout_s=5.0) as channel,
            pytest.raises(CouplingError, match="component 3 closed the connection after 8 of 400"),
        ):
            channel.recv_column()


def test_channel_refuses_a_column_of_the_wrong_length() -> None:
    with (
        _channel_pair(rows=4) as (left_end, _),
        pytest.raises(ValueError, match="channel carries 4"),
    ):
        left_end.send_column(np.zeros(5))


# --- real processes --------------------------------------------------------------------


def test_three_processes_4_8_4_match_serial(tmp_path: Path) -> None:
    n, iterations, sizes = 64, 500, "4,8,4"
    outs = [tmp_path / f"strip{k}.npy" for k in range(3)]
    registrations = [tmp_path / f"reg{k}.json" for k in range(3)]
    peers = tmp_path / "peers.json"
    common = ["--n", str(n), "--iterations", str(iterations), "--sizes", sizes]
    common += ["--peers", str(peers), "--timeout", "10"]
    with _processes(
        [
            [*common, "--index", str(k), "--register", str(registrations[k]), "--out", str(outs[k])]
            for k in range(3)
        ]
    ) as components:
        # The launcher's half of the barrier: every component is listening, release them.
        write_peers(peers, collect_peers(registrations, timeout_s=10.0))
        results = [_finish(component) for component in components]
    reports = [json.loads(stdout) for stdout in results]
    assert [report["bounds"] for report in reports] == [[0, 16], [16, 48], [48, 64]]
    assert all(report["iterations"] == iterations for report in reports)
    strips = [np.load(out) for out in outs]
    difference = max_abs_difference_from_serial(strips, n, iterations)
    assert difference < 1e-8
    check = json.loads(_run(["--check", *common[:4], *map(str, outs), "--tolerance", "1e-8"]))
    assert check["max_abs_diff"] == difference
    assert check["residual"] == max(report["residual"] for report in reports)


def test_processes_under_the_barriers_contract_match_serial(tmp_path: Path) -> None:
    # What gridcore.barrier hands its COMMAND: a listening socket it registered (an
    # inherited fd), the peers file it wrote, and the component index, all in the
    # environment.
    n, iterations = 48, 300
    outs = [tmp_path / f"strip{k}.npy" for k in range(2)]
    peers = tmp_path / "peers.json"
    with ExitStack() as stack:
        listeners = [stack.enter_context(open_listener(LOCALHOST)[0]) for _ in range(2)]
        ports = [int(listener.getsockname()[1]) for listener in listeners]
        write_peers(peers, [PeerAddress(k, LOCALHOST, port) for k, port in enumerate(ports)])
        components = [
            _barrier_child(listener, k, peers, ["--sizes", "3,5", "--out", str(outs[k])])
            for k, listener in enumerate(listeners)
        ]
    for component in components:
        _finish(component)
    strips = [np.load(out) for out in outs]
    assert [strip.shape for strip in strips] == [(48, 18), (48, 30)]
    assert max_abs_difference_from_serial(strips, n, iterations) == 0.0


def test_a_single_process_without_neighbours_is_the_serial_run(tmp_path: Path) -> None:
    out = tmp_path / "strip.npy"
    stdout = _run(["--n", "48", "--iterations", "300", "--sizes", "8", "--out", str(out)])
    report = json.loads(stdout)
    assert report["bounds"] == [0, 48]
    assert np.array_equal(np.load(out), solve_serial(48, 300))
    assert report["residual"] == residual(solve_serial(48, 300), 48)


def test_a_left_neighbour_that_never_listens_fails_naming_it_and_its_wait(tmp_path: Path) -> None:
    peers = tmp_path / "peers.json"
    registration = tmp_path / "reg1.json"
    args = ["--n", "48", "--iterations", "10", "--sizes", "4,4", "--index", "1"]
    args += ["--peers", str(peers), "--register", str(registration), "--timeout", "1"]
    # Bound but never listening: every connection attempt is refused, as from a dead host.
    with _silent_port() as dead_port, _processes([args]) as (component,):
        write_peers(peers, [PeerAddress(0, LOCALHOST, dead_port), _registered(registration)])
        stdout, stderr = component.communicate(timeout=10)
    assert component.returncode == 2
    assert stdout == ""
    assert (
        f"component 1's left neighbour (component 0 at 127.0.0.1:{dead_port}) "
        "did not accept a connection within 1 s"
    ) in stderr
    assert "ConnectionRefusedError" in stderr


def test_a_right_neighbour_that_never_connects_fails_naming_it(tmp_path: Path) -> None:
    peers = tmp_path / "peers.json"
    registration = tmp_path / "reg0.json"
    args = ["--n", "48", "--iterations", "10", "--sizes", "4,4", "--index", "0"]
    args += ["--peers", str(peers), "--register", str(registration), "--timeout", "1"]
    with _silent_port() as dead_port, _processes([args]) as (component,):
        write_peers(peers, [_registered(registration), PeerAddress(1, LOCALHOST, dead_port)])
        stdout, stderr = component.communicate(timeout=10)
    assert component.returncode == 2
    assert stdout == ""
    assert "component 0's right neighbour (component 1) never connected to 127.0.0.1:" in stderr


def test_a_peers_file_that_never_appears_fails_naming_it(tmp_path: Path) -> None:
    args = ["--n", "48", "--iterations", "10", "--sizes", "4,4", "--index", "0"]
    args += ["--peers", str(tmp_path / "never.json"), "--timeout", "0.5"]
    with _processes([args]) as (component,):
        _, stderr = component.communicate(timeout=10)
    assert component.returncode == 2
    assert "never.json was not published in time" in stderr


def test_check_exits_1_above_the_tolerance(tmp_path: Path) -> None:
    strip = solve_serial(16, 40)
    strip[3, 3] += 1e-3
    path = tmp_path / "strip.npy"
    np.save(path, strip)
    args = ["--check", "--n", "16", "--iterations", "40", str(path), "--tolerance", "1e-8"]
    completed = _completed(args)
    assert completed.returncode == 1
    assert json.loads(completed.stdout)["max_abs_diff"] == pytest.approx(1e-3)


# --- helpers ---------------------------------------------------------------------------


def _split_in_threads(
    n: int, iterations: int, sizes: Sequence[int], tmp_path: Path
) -> list[StripRun]:
    """Every component in its own thread, coupled through the real rendezvous."""
    bounds = strip_bounds(n, sizes)
    peers = tmp_path / "peers.json"
    registrations = [tmp_path / f"reg{k}.json" for k in range(len(sizes))]

    def component(index: int) -> StripRun:
        how = Rendezvous(peers, register=registrations[index], timeout_s=10.0)
        with couple(n, iterations, bounds, index, how) as (left, right):
            return run_strip(n, iterations, bounds, index, left, right)

    with ThreadPoolExecutor(len(sizes)) as pool:
        futures = [pool.submit(component, k) for k in range(len(sizes))]
        if len(sizes) > 1:
            write_peers(peers, collect_peers(registrations, timeout_s=10.0))
        return [future.result(timeout=20) for future in futures]


def _registered(path: Path) -> PeerAddress:
    """One component's registration, for a launcher whose other component is dead."""
    deadline = time.monotonic() + 10.0
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)
    return PeerAddress(**json.loads(path.read_text(encoding="utf-8")))


@contextmanager
def _tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    listener, port = open_listener(LOCALHOST)
    with listener, socket.create_connection((LOCALHOST, port), timeout=5) as near:
        far, _ = listener.accept()
        with far:
            yield near, far


@contextmanager
def _channel_pair(rows: int) -> Iterator[tuple[Channel, Channel]]:
    with (
        _tcp_pair() as (near, far),
        Channel(near, rows, "right end", timeout_s=10.0) as left_end,
        Channel(far, rows, "left end", timeout_s=10.0) as right_end,
    ):
        yield left_end, right_end


@contextmanager
def _silent_port() -> Iterator[int]:
    """A port that refuses connections: bound (so nobody else takes it), not listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCALHOST, 0))
        yield int(sock.getsockname()[1])


def _command(args: Sequence[str]) -> list[str]:
    # -X dev shows any unclosed socket as a ResourceWarning on stderr, which the tests
    # require to be empty.
    return [sys.executable, "-X", "dev", "-m", "gridcore.apps.poisson", *args]


def _environment() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


@contextmanager
def _processes(commands: Sequence[Sequence[str]]) -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    try:
        for args in commands:
            started.append(
                subprocess.Popen(
                    _command(args),
                    cwd=REPO,
                    env=_environment(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
            process.communicate()


def _barrier_child(
    listener: socket.socket, index: int, peers: Path, args: Sequence[str]
) -> subprocess.Popen[str]:
    environment = {
        **_environment(),
        "GRIDCORE_LISTEN_FD": str(listener.fileno()),
        "GRIDCORE_PEERS": str(peers),
        "GRIDCORE_COMPONENT": str(index),
    }
    return subprocess.Popen(
        _command(["--n", "48", "--iterations", "300", "--timeout", "10", *args]),
        cwd=REPO,
        env=environment,
        pass_fds=[listener.fileno()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> str:
    stdout, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr
    assert stderr == ""
    return stdout


def _completed(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _command(args), cwd=REPO, env=_environment(), capture_output=True, text=True, timeout=20
    )


def _run(args: Sequence[str]) -> str:
    completed = _completed(args)
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr == ""
    return completed.stdout
