"""The real pilot program (``python3 -`` fed the job text of
:func:`gridcore.engine.pilot_command.pilot_command`) against the real VJ center on uvicorn
in a thread (:func:`gridcore.api.server.start_in_thread`) and a SQLite state DB whose
reservation and pilot rows the tests write themselves: no engine, so every path is
reached on purpose.

The pilots run under the system's ``python3`` from a directory without gridcore and
with no virtualenv on the path: what a cluster has.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select, update

import gridcore.pilot as pilot_program
from gridcore import barrier
from gridcore.api.server import RunningCenter, start_in_thread
from gridcore.engine import pilot_pool
from gridcore.engine.phases import PilotState, ReservationPhase
from gridcore.engine.pilot_command import DELIMITER, pilot_command, pilot_source
from gridcore.errors import RequestError
from gridcore.model import HolderKind
from gridcore.state import capacity
from gridcore.state.capacity import Ledger
from gridcore.state.schema import holds, pilots, reservations, sites
from gridcore.state.store import Store, open_store

GUARD_S = 60.0  # only a guard against hanging, never a measure of speed
HEARTBEAT_S = 0.2
PYTHON3 = shutil.which("python3") or "python3"

# The real command of the tests: reads its GRIDCORE_* environment and peers file, sends
# a line to the other component's data port and accepts one on its own inherited socket.
CHECK_PROGRAM = textwrap.dedent(
    """
    import json, os, socket
    env = {k: v for k, v in os.environ.items() if k.startswith("GRIDCORE_")}
    me = int(env["GRIDCORE_COMPONENT"])
    peers = json.load(open(env["GRIDCORE_PEERS"]))["components"]
    listener = socket.socket(fileno=int(env["GRIDCORE_LISTEN_FD"]))
    listener.settimeout(30)
    for peer in peers:
        if peer["index"] != me:
            with socket.create_connection((peer["host"], peer["port"]), timeout=30) as out:
                out.sendall(f"hello from {me}".encode())
    got = []
    for _ in range(len(peers) - 1):
        conn, _ = listener.accept()
        with conn:
            got.append(conn.recv(100).decode())
    with open(f"out-{me}.json", "w") as f:
        json.dump({"env": env, "peers": peers, "got": got, "cwd": os.getcwd()}, f)
    """
)


@dataclass
class Grid:
    store: Store
    center: RunningCenter
    tmp: Path
    started: list[subprocess.Popen[str]]

    def reservation(
        self, command: str, count: int = 2, *, workdir: Path | None = None, vj_size: int = 1
    ) -> tuple[int, list[tuple[int, str]]]:
        """A RESERVING job of ``count`` pending pilots at sites site-0, site-1, ...,
        each holding its processors in the capacity ledger: (job, [(pilot, token)])."""
        now = time.time()
        made = []
        with self.store.begin() as conn:
            job = conn.execute(
                insert(reservations).values(
                    name="pilot-test",
                    command=command,
                    processors=count * vj_size,
                    vj_size=vj_size,
                    max_clusters=count,
                    lifetime_floor_s=60.0,
                    workdir=None if workdir is None else str(workdir),
                    state=ReservationPhase.RESERVING.value,
                    submitted_at=now,
                )
            ).inserted_primary_key[0]
            for i in range(count):
                token, digest = pilot_pool.new_token()
                pid = conn.execute(
                    insert(pilots).values(
                        job_id=job,
                        first_job_id=job,
                        site=f"site-{i}",
                        processors=vj_size,
                        state=PilotState.PENDING.value,
                        key=f"key-{job}-{i}",
                        token_hash=digest,
                        submitted_at=now,
                    )
                ).inserted_primary_key[0]
                capacity.add(conn, HolderKind.PILOT, str(pid), f"site-{i}", vj_size, Ledger.QUEUED)
                made.append((int(pid), token))
        return int(job), made

    def start(
        self,
        pilot_id: int,
        token: str,
        *,
        url: str | None = None,
        env: dict[str, str] | None = None,
        processors: int = 1,
    ) -> subprocess.Popen[str]:
        """``/bin/sh -c <pilot_command(...)>`` as a site would run it, in its own cwd."""
        cwd = self.tmp / f"pilot-{pilot_id}"
        cwd.mkdir(exist_ok=True)
        text = pilot_command(url or self.center.url, pilot_id, PYTHON3, bind="127.0.0.1")
        venv_bin = str(Path(sys.executable).parent)
        path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
        proc = subprocess.Popen(
            ["/bin/sh", "-c", text],
            cwd=cwd,
            env={
                "PATH": path,
                "HOME": os.environ.get("HOME", "/"),
                "GRIDCORE_PILOT_TOKEN": token,
                "GRIDCORE_PILOT_PROCESSORS": str(processors),
                **(env or {}),
            },
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # killed with its command if a test fails
        )
        self.started.append(proc)
        return proc

    def pilot(self, pilot_id: int) -> Any:
        with self.store.begin() as conn:
            return conn.execute(select(pilots).where(pilots.c.id == pilot_id)).one()

    def job(self, job_id: int) -> Any:
        with self.store.begin() as conn:
            return conn.execute(select(reservations).where(reservations.c.id == job_id)).one()

    def set_pilot(self, pilot_id: int, state: PilotState) -> None:
        with self.store.begin() as conn:
            conn.execute(update(pilots).where(pilots.c.id == pilot_id).values(state=state.value))


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}", upgrade=True)
    with store.begin() as conn:
        for i in range(4):
            conn.execute(
                insert(sites).values(
                    name=f"site-{i}", kind="local", total_processors=8, reported_idle=8
                )
            )
    center = start_in_thread(store, heartbeat_s=HEARTBEAT_S)
    grid = Grid(store, center, tmp_path, [])
    try:
        yield grid
    finally:
        for proc in grid.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        center.stop()
        store.dispose()


def wait_for(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + GUARD_S
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def beating_for(pilot: Any) -> float:
    """Seconds from a pilot's registration to its last heartbeat."""
    return float(pilot.heartbeat_at or pilot.registered_at) - float(pilot.registered_at)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=GUARD_S)
    return proc.returncode, err


# -- the whole path ------------------------------------------------------------------------


def test_two_pilots_hold_then_run_the_command_together(grid: Grid) -> None:
    program = grid.tmp / "check.py"
    program.write_text(CHECK_PROGRAM)
    workdir = grid.tmp / "work"
    job, made = grid.reservation(f"{PYTHON3} {program}", workdir=workdir)
    (first, first_token), (second, second_token) = made

    one = grid.start(first, first_token)
    wait_for("pilot 1 holds", lambda: grid.pilot(first).state == PilotState.HELD.value)

    # it holds, heartbeats for a few periods, and is not dispatched alone
    wait_for("pilot 1 beats 3 periods", lambda: beating_for(grid.pilot(first)) >= 3 * HEARTBEAT_S)
    assert grid.job(job).state == ReservationPhase.RESERVING.value
    assert one.poll() is None

    two = grid.start(second, second_token)
    assert finish(one)[0] == 0 and finish(two)[0] == 0

    rows = [grid.pilot(first), grid.pilot(second)]
    row = grid.job(job)
    # The second registration dispatched both in its own transaction (one `now`).
    assert row.dispatched_at == rows[1].registered_at == row.held_at
    assert [r.dispatched_at for r in rows] == [row.dispatched_at] * 2
    assert [r.component for r in rows] == [0, 1]  # site-0, site-1
    assert [r.state for r in rows] == [PilotState.COMPLETED.value] * 2
    assert all(r.started_at >= r.dispatched_at and r.finished_at >= r.started_at for r in rows)
    assert [r.exit_code for r in rows] == [0, 0]
    assert row.state == ReservationPhase.COMPLETED.value and row.finished_at is not None

    for r in rows:
        out = json.loads((workdir / f"out-{r.component}.json").read_text())
        env = out["env"]
        assert env["GRIDCORE_JOB"] == str(job)
        assert env["GRIDCORE_COMPONENT"] == str(r.component)
        assert env["GRIDCORE_COMPONENTS"] == "2"
        assert (env["GRIDCORE_HOST"], env["GRIDCORE_PORT"]) == (r.host, str(r.port))
        assert "GRIDCORE_PILOT_TOKEN" not in env  # the user's command never sees it
        peers_file = barrier.PEERS_FILE.format(job=job, epoch=0, component=r.component)
        assert env["GRIDCORE_PEERS"] == str(workdir / peers_file)
        assert out["peers"] == [
            {"index": p.component, "host": p.host, "port": p.port} for p in rows
        ]
        assert out["got"] == [f"hello from {1 - r.component}"]  # through the inherited fd
        assert Path(out["cwd"]) == workdir
    assert not list(workdir.glob(".peers-*"))  # published by rename, no leftovers

    with grid.store.begin() as conn:
        ledgers = conn.execute(select(holds.c.ledger).where(holds.c.kind == "pilot")).scalars()
        assert list(ledgers) == [None, None]  # each result released its pilot's hold
        assert capacity.check_invariant(conn) == []


def test_a_failing_component_fails_the_job_naming_it(grid: Grid) -> None:
    job, made = grid.reservation('exit "$GRIDCORE_COMPONENT"')
    procs = [grid.start(pid, token) for pid, token in made]
    assert sorted(finish(p)[0] for p in procs) == [0, 1]
    row = grid.job(job)
    assert row.state == ReservationPhase.FAILED.value
    failed = grid.pilot(made[1][0])
    assert failed.state == PilotState.FAILED.value and failed.exit_code == 1
    assert row.message.startswith(f"component 1 (pilot {failed.id} at site-1) exited 1")


def test_sigterm_reaches_the_command_and_its_status_is_reported(grid: Grid) -> None:
    job, made = grid.reservation("exec sleep 60", count=1)
    ((pid, token),) = made
    proc = grid.start(pid, token)
    wait_for("the command started", lambda: grid.pilot(pid).started_at is not None)
    proc.send_signal(signal.SIGTERM)
    code, _ = finish(proc)
    assert code == 128 + signal.SIGTERM
    row = grid.pilot(pid)
    assert (row.state, row.exit_code) == (PilotState.FAILED.value, 128 + signal.SIGTERM)
    assert grid.job(job).state == ReservationPhase.FAILED.value


# -- exits without running ---------------------------------------------------------------


def test_a_released_pilot_exits_0_without_running_anything(grid: Grid) -> None:
    marker = grid.tmp / "ran"
    _, made = grid.reservation(f"touch {marker}")
    (pid, token), _ = made
    grid.set_pilot(pid, PilotState.RELEASED)
    code, err = finish(grid.start(pid, token))
    assert code == 0, err
    assert "told to exit" in err
    assert not marker.exists()
    row = grid.pilot(pid)
    assert (row.state, row.host, row.registered_at) == (PilotState.RELEASED.value, None, None)


def test_a_pilot_released_while_holding_exits_0_promptly(grid: Grid) -> None:
    marker = grid.tmp / "ran"
    _, made = grid.reservation(f"touch {marker}")
    (pid, token), _ = made
    proc = grid.start(pid, token)
    wait_for("it holds", lambda: grid.pilot(pid).state == PilotState.HELD.value)
    released = time.monotonic()
    grid.set_pilot(pid, PilotState.RELEASED)
    code, err = finish(proc)
    assert code == 0, err
    assert time.monotonic() - released < 5.0  # the long poll answers "exit" at once
    assert not marker.exists()


def test_a_pilot_given_fewer_processors_than_asked_exits(grid: Grid) -> None:
    job, made = grid.reservation("true", count=1, vj_size=2)
    ((pid, token),) = made
    code, _ = finish(grid.start(pid, token, processors=1))
    assert code == 0
    assert grid.pilot(pid).state == PilotState.PENDING.value
    assert grid.job(job).state == ReservationPhase.RESERVING.value


def test_a_pilot_without_a_token_exits_2(grid: Grid) -> None:
    _, made = grid.reservation("true", count=1)
    code, err = finish(grid.start(made[0][0], ""))
    assert code == pilot_program.EXIT_USAGE and "GRIDCORE_PILOT_TOKEN" in err


def test_a_refused_token_makes_the_pilot_exit_77(grid: Grid) -> None:
    _, made = grid.reservation("true")
    (first, _), (_, other_token) = made
    code, err = finish(grid.start(first, other_token))
    assert code == pilot_program.EXIT_REFUSED and "403" in err
    assert grid.pilot(first).state == PilotState.PENDING.value


# -- an unreachable center ---------------------------------------------------------------


def test_a_pilot_that_never_reaches_the_center_exits_nonzero(grid: Grid) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    _, made = grid.reservation("true", count=1)
    began = time.monotonic()
    proc = grid.start(*made[0], url=url, env={"GRIDCORE_PILOT_UNREACHABLE_S": "1.5"})
    code, err = finish(proc)
    assert code == pilot_program.EXIT_UNREACHABLE, err
    assert 1.5 <= time.monotonic() - began < 20.0
    assert "unreachable" in err


def test_a_holding_pilot_whose_center_goes_away_exits_nonzero(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}", upgrade=True)
    with store.begin() as conn:
        conn.execute(
            insert(sites).values(name="site-0", kind="local", total_processors=8, reported_idle=8)
        )
        conn.execute(
            insert(sites).values(name="site-1", kind="local", total_processors=8, reported_idle=8)
        )
    center = start_in_thread(store, heartbeat_s=HEARTBEAT_S)
    grid = Grid(store, center, tmp_path, [])
    try:
        _, made = grid.reservation("true")
        (pid, token), _ = made
        proc = grid.start(pid, token, env={"GRIDCORE_PILOT_UNREACHABLE_S": "1.5"})
        wait_for("it holds", lambda: grid.pilot(pid).state == PilotState.HELD.value)
        gone = time.monotonic()
        center.stop()
        assert time.monotonic() - gone < 2.0  # its long poll did not hold the shutdown
        code, err = finish(proc)
        assert code == pilot_program.EXIT_UNREACHABLE, err
        assert 1.5 <= time.monotonic() - gone < 20.0
    finally:
        for proc in grid.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        center.stop()
        store.dispose()


# -- the program and its job text --------------------------------------------------------


def test_the_pilot_imports_only_the_standard_library() -> None:
    tree = ast.parse(Path(pilot_program.__file__).read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0
            modules.add((node.module or "").split(".")[0])
    assert modules - {"__future__"}  # the walk found the imports
    assert modules - {"__future__"} <= sys.stdlib_module_names, modules - sys.stdlib_module_names


def test_the_job_text_is_a_quoted_heredoc_of_the_source() -> None:
    source = pilot_source()
    assert DELIMITER not in source
    assert DELIMITER not in Path(pilot_program.__file__).read_text()
    text = pilot_command("http://center.example:8790/", 42, "/opt/py 3/python3")
    first, *body, last, tail = text.split("\n")
    assert first == (
        "exec '/opt/py 3/python3' -I -S - --center http://center.example:8790 --pilot 42"
        f" <<'{DELIMITER}'"
    )
    assert "\n".join(body) + "\n" == source and last == DELIMITER and tail == ""
    assert "TOKEN" not in first
    syntax = subprocess.run(["/bin/sh", "-n", "-c", text], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    with_bind = pilot_command("https://c", 1, bind="0.0.0.0", advertise="10.1.2.3")
    assert with_bind.split("\n")[0].endswith(
        f"--pilot 1 --bind 0.0.0.0 --advertise 10.1.2.3 <<'{DELIMITER}'"
    )


def test_the_job_text_refuses_a_center_that_is_not_http() -> None:
    with pytest.raises(RequestError, match="http"):
        pilot_command("postgresql://user:pw@db/state", 1)


def test_the_pilot_writes_the_barriers_peers_format(tmp_path: Path) -> None:
    assert pilot_program.PEERS_FILE == barrier.PEERS_FILE
    peers = [{"index": 0, "host": "a", "port": 1}, {"index": 1, "host": "b", "port": 2}]
    path = pilot_program.write_peers(tmp_path, 7, 1, peers)
    assert path == tmp_path / barrier.PEERS_FILE.format(job=7, epoch=0, component=1)
    ours = json.loads(path.read_text())
    theirs = {"components": [barrier.Peer(**p).__dict__ for p in peers]}
    assert ours == theirs


def test_the_advertised_host_is_the_route_to_the_center() -> None:
    assert pilot_program.advertised_host("http://127.0.0.1:8790", "0.0.0.0") == "127.0.0.1"
    assert pilot_program.advertised_host("http://127.0.0.1:8790", "127.0.0.2") == "127.0.0.2"


# -- the pool's answers to repeated calls --------------------------------------------------


def test_repeated_calls_change_nothing_more(grid: Grid) -> None:
    store = grid.store
    job, made = grid.reservation("true")
    (first, _), (second, _) = made
    assert pilot_pool.register(store, first, "h1", 1, 1, 10.0)["action"] == "hold"
    assert pilot_pool.register(store, first, "h1", 1, 1, 11.0)["state"] == "held"
    assert grid.pilot(first).registered_at == 10.0
    assert pilot_pool.work(store, first) == {"action": "wait"}
    with store.begin() as conn:  # one pilot still pending at its site: not yet
        assert not pilot_pool.dispatch_if_ready(conn, job, 11.5)
    assert pilot_pool.register(store, second, "h2", 2, 1, 12.0)["state"] == "dispatched"
    assert pilot_pool.register(store, second, "h2", 2, 1, 13.0)["state"] == "dispatched"
    assert grid.job(job).dispatched_at == 12.0
    order = pilot_pool.work(store, second)
    assert order["action"] == "run" and order["component"] == 1
    assert [p["index"] for p in order["peers"]] == [0, 1]
    for at in (14.0, 15.0):
        assert pilot_pool.started(store, first, at)["action"] == "run"
    assert grid.pilot(first).started_at == 14.0
    for at in (16.0, 17.0):
        assert pilot_pool.result(store, first, 0, "ok", at)["state"] == "completed"
    assert grid.pilot(first).finished_at == 16.0
    assert grid.job(job).state == ReservationPhase.DISPATCHED.value
    pilot_pool.result(store, second, 0, "ok", 18.0)
    assert grid.job(job).state == ReservationPhase.COMPLETED.value
    assert pilot_pool.heartbeat(store, first, 19.0)["action"] == "exit"
    assert pilot_pool.work(store, first) == {"action": "exit"}
