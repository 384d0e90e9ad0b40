"""The real start barrier, ``python -m gridcore.barrier``, in subprocesses talking to a
real VJ center (:func:`gridcore.api.server.start_in_thread`) on a SQLite state DB whose
job and component rows (with the components' token hashes) the tests write and change
themselves: no engine, so every path is reached on purpose.

Each barrier's COMMAND creates a marker file: a barrier that ends without releasing must
never have started it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection

from gridcore.barrier import (
    EXIT_ABORTED,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    TOKEN_ENV,
)
from gridcore.engine.phases import ComponentState, JobPhase
from gridcore.engine.pilot_pool import new_token
from gridcore.state.schema import coalloc_components, coalloc_jobs
from gridcore.state.store import Store, open_store
from tests.barrier_checks import assert_released_after_every_registration, running_center

# How often the tests look at the rows the center writes for the barriers.
POLL_S = 0.05
# How long a test waits for something a barrier does within one poll (POLL_S): only a
# guard against hanging, never a measure of speed.
GUARD_S = 30.0
# Barrier --timeout where the test does not exercise the timeout.
NEVER_S = 300.0
# A barrier that does not wait releases within a poll or two of registering; watching
# this many polls with no release shows it waits (a correct barrier passes however slow).
WATCHED_POLLS = 20


@dataclass
class Grid:
    """The state DB of one test, its VJ center, the components' tokens (by (job, index))
    and where its barriers run."""

    url: str
    store: Store
    center: str
    workdir: Path
    started: list[subprocess.Popen[str]]
    tokens: dict[tuple[int, int], str] = field(default_factory=dict)

    def marker(self, component: int) -> Path:
        return self.workdir / f"started-{component}"


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    store = open_store(url, upgrade=True)
    workdir = tmp_path / "work"
    workdir.mkdir()
    with running_center(url) as center:
        grid = Grid(url, store, center, workdir, [])
        try:
            yield grid
        finally:
            for proc in grid.started:  # a failed test leaves no barrier or command running
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its session: the command too
                proc.communicate()
            store.dispose()


def new_job(grid: Grid, components: int, epoch: int = 0) -> int:
    """A job being claimed with ``components`` submitted components: only the columns the
    barrier reads, the schema's defaults for the rest."""
    with grid.store.begin() as conn:
        job_id = conn.execute(
            insert(coalloc_jobs).values(
                name="barrier-test",
                request="{}",
                command="true",
                policy="CM",
                priority="high",
                state=JobPhase.CLAIMING.value,
                epoch=epoch,
                L=1.0,
                submitted_at=time.time(),
            )
        ).inserted_primary_key[0]
        tokens = insert_components(conn, job_id, components, epoch, ComponentState.SUBMITTED)
    grid.tokens.update({(int(job_id), idx): token for idx, token in tokens.items()})
    return int(job_id)


def insert_components(
    conn: Connection, job_id: int, count: int, epoch: int, state: ComponentState
) -> dict[int, str]:
    """The components' rows; a submitted component has a token (its hash in the row, as
    the engine stores it when it claims the component): the tokens by index."""
    tokens = {}
    for idx in range(count):
        token, digest = new_token()
        submitted = state is not ComponentState.PLACED
        conn.execute(
            insert(coalloc_components).values(
                job_id=job_id,
                idx=idx,
                epoch=epoch,
                size=1,
                site=f"site-{idx}",
                transfer_s=0.0,
                state=state.value,
                token_hash=digest if submitted else None,
            )
        )
        if submitted:
            tokens[idx] = token
    return tokens


def start(
    grid: Grid,
    job_id: int,
    component: int,
    command: list[str] | None = None,
    *,
    epoch: int = 0,
    timeout_s: float = NEVER_S,
    token: str | None = None,
    center: str | None = None,
    extra: tuple[str, ...] = (),
) -> subprocess.Popen[str]:
    """``python -m gridcore.barrier`` for one component, with its own token (or
    ``token``; "" for none) in its environment; by default its command creates the
    component's marker file."""
    if command is None:
        marker = grid.marker(component)
        command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    argv = [sys.executable, "-m", "gridcore.barrier", "--center", center or grid.center]
    argv += ["--job", str(job_id), "--component", str(component), "--epoch", str(epoch)]
    argv += ["--timeout", str(timeout_s), *extra]
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    token = grid.tokens.get((job_id, component), "") if token is None else token
    if token:
        env[TOKEN_ENV] = token
    proc = subprocess.Popen(
        [*argv, "--", *command],
        cwd=grid.workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a signal the test sends goes to the barrier alone
    )
    grid.started.append(proc)
    return proc


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """The barrier's exit code and stderr; kills it if it does not end within GUARD_S."""
    try:
        _, stderr = proc.communicate(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"the barrier was still running after {GUARD_S} s: {stderr}")
    return proc.returncode, stderr


def component_row(grid: Grid, job_id: int, component: int) -> dict[str, object]:
    c = coalloc_components.c
    with grid.store.begin() as conn:
        row = conn.execute(
            select(coalloc_components).where(c.job_id == job_id, c.idx == component)
        ).one()
    return dict(row._mapping)


def wait_until(check: Callable[[], bool], what: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + GUARD_S
    while not check():
        if proc.poll() is not None:
            _, stderr = proc.communicate()
            pytest.fail(f"the barrier exited {proc.returncode} before {what}: {stderr}")
        if time.monotonic() > deadline:
            pytest.fail(f"not {what} within {GUARD_S} s")
        time.sleep(POLL_S / 2)


def registered(grid: Grid, job_id: int, component: int, proc: subprocess.Popen[str]) -> None:
    wait_until(
        lambda: component_row(grid, job_id, component)["registered_at"] is not None,
        f"component {component} registered",
        proc,
    )


# -- every component registered: release, in order ------------------------------------------


def test_no_component_is_released_before_every_component_registered(grid: Grid) -> None:
    job_id = new_job(grid, components=2)
    first = start(grid, job_id, 0)
    registered(grid, job_id, 0, first)
    # Component 1 has not registered: component 0 waits, poll after poll.
    for _ in range(WATCHED_POLLS):
        row = component_row(grid, job_id, 0)
        assert row["released_at"] is None, "released while component 1 had not registered"
        assert not grid.marker(0).exists()
        assert first.poll() is None
        time.sleep(POLL_S)
    assert component_row(grid, job_id, 1)["registered_at"] is None

    second = start(grid, job_id, 1)

    assert finish(second)[0] == 0
    assert finish(first)[0] == 0
    assert grid.marker(0).exists() and grid.marker(1).exists()
    assert_released_after_every_registration(grid.store, job_id)


def test_released_components_learn_every_peer_address(grid: Grid) -> None:
    job_id = new_job(grid, components=3)
    show = [sys.executable, "-c", "import os; print(open(os.environ['GRIDCORE_PEERS']).read())"]
    procs = [start(grid, job_id, k, show) for k in range(3)]
    outs = [proc.communicate(timeout=GUARD_S)[0] for proc in procs]

    assert [proc.returncode for proc in procs] == [0, 0, 0]
    rows = [component_row(grid, job_id, k) for k in range(3)]
    expected = [{"index": k, "host": r["host"], "port": r["port"]} for k, r in enumerate(rows)]
    assert all(r["port"] is not None for r in rows)
    assert [json.loads(out)["components"] for out in outs] == [expected] * 3
    assert_released_after_every_registration(grid.store, job_id)


# -- a job that is no longer live: exit 75, the command never starts ------------------------


def abort(conn: Connection, job_id: int) -> None:
    """KOALA aborted the job (Sec. 3.4): back to its placement queue."""
    conn.execute(
        update(coalloc_jobs).where(coalloc_jobs.c.id == job_id).values(state=JobPhase.QUEUED.value)
    )


def fail(conn: Connection, job_id: int) -> None:
    """The job failed for good."""
    conn.execute(
        update(coalloc_jobs).where(coalloc_jobs.c.id == job_id).values(state=JobPhase.FAILED.value)
    )


def re_place(conn: Connection, job_id: int) -> None:
    """A newer placement: the epoch is bumped and the components replaced by the new
    epoch's, as the engine re-places a job."""
    c = coalloc_components.c
    count = conn.execute(select(func.count()).where(c.job_id == job_id)).scalar_one()
    conn.execute(update(coalloc_jobs).where(coalloc_jobs.c.id == job_id).values(epoch=1))
    conn.execute(delete(coalloc_components).where(c.job_id == job_id))
    insert_components(conn, job_id, count, 1, ComponentState.PLACED)


def bump_epoch(conn: Connection, job_id: int) -> None:
    """Only the job's epoch moved on (its old component rows still there)."""
    conn.execute(update(coalloc_jobs).where(coalloc_jobs.c.id == job_id).values(epoch=1))


def cancel(conn: Connection, job_id: int) -> None:
    """The user cancelled the job: job cancelled, components aborted (CoAllocationEngine.cancel)."""
    conn.execute(
        update(coalloc_jobs)
        .where(coalloc_jobs.c.id == job_id)
        .values(state=JobPhase.CANCELLED.value)
    )
    conn.execute(
        update(coalloc_components)
        .where(coalloc_components.c.job_id == job_id)
        .values(state=ComponentState.ABORTED.value)
    )


def abort_component(conn: Connection, job_id: int) -> None:
    """Only this component was aborted (its job row not yet updated)."""
    conn.execute(
        update(coalloc_components)
        .where(coalloc_components.c.job_id == job_id, coalloc_components.c.idx == 0)
        .values(state=ComponentState.ABORTED.value)
    )


ENDINGS = {
    "aborted": abort,
    "failed": fail,
    "re-placed": re_place,
    "newer epoch": bump_epoch,
    "cancelled": cancel,
    "component aborted": abort_component,
}


@pytest.mark.parametrize("ending", ENDINGS, ids=list(ENDINGS))
def test_a_waiting_component_whose_job_ends_exits_75_without_its_command(
    grid: Grid, ending: str
) -> None:
    job_id = new_job(grid, components=2)
    waiting = start(grid, job_id, 0)
    registered(grid, job_id, 0, waiting)
    with grid.store.begin() as conn:
        ENDINGS[ending](conn, job_id)

    code, stderr = finish(waiting)

    assert code == EXIT_ABORTED, stderr
    assert "aborted while waiting" in stderr
    assert not grid.marker(0).exists(), "the command started though the job had ended"


# Where a barrier started after the ending stops: its own component row no longer live
# (or of an older epoch) refuses the registration; otherwise it registers and then sees
# the job row. A re-placement replaced the component's row (and token): the center
# never knew this barrier's token, which is refused like any unknown one (77).
STOPS_AT = {
    "aborted": (EXIT_ABORTED, "aborted while waiting"),
    "failed": (EXIT_ABORTED, "aborted while waiting"),
    "re-placed": (EXIT_REFUSED, "the center refused this component's token (POST /register:"),
    "newer epoch": (EXIT_ABORTED, "aborted while waiting"),
    "cancelled": (EXIT_ABORTED, "aborted before registering"),
    "component aborted": (EXIT_ABORTED, "aborted before registering"),
}


@pytest.mark.parametrize("ending", ENDINGS, ids=list(ENDINGS))
def test_a_component_of_a_job_already_ended_never_runs_its_command(grid: Grid, ending: str) -> None:
    # One component: were the job live, it would pass straight through (the test below).
    job_id = new_job(grid, components=1)
    with grid.store.begin() as conn:
        ENDINGS[ending](conn, job_id)

    code, stderr = finish(start(grid, job_id, 0))

    expected_code, says = STOPS_AT[ending]
    assert code == expected_code, stderr
    assert says in stderr
    assert not grid.marker(0).exists()


def test_a_live_one_component_job_runs_its_command(grid: Grid) -> None:
    # The control of the test above: the same job, not ended.
    job_id = new_job(grid, components=1)
    code, stderr = finish(start(grid, job_id, 0))
    assert code == 0, stderr
    assert grid.marker(0).exists()


def test_the_command_never_sees_the_component_token(grid: Grid) -> None:
    job_id = new_job(grid, components=1)
    show = [sys.executable, "-c", f"import os; print(os.environ.get({TOKEN_ENV!r}, 'none'))"]
    proc = start(grid, job_id, 0, show)
    out, stderr = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 0, stderr
    assert out.strip() == "none"
    assert grid.tokens[(job_id, 0)] not in out + stderr


# -- tokens and an unreachable center: clear exit codes, the command never starts -----------


def test_a_barrier_without_a_token_exits_2_before_calling_the_center(grid: Grid) -> None:
    job_id = new_job(grid, components=1)
    code, stderr = finish(start(grid, job_id, 0, token=""))
    assert code == EXIT_USAGE, stderr
    assert f"no token: set ${TOKEN_ENV}" in stderr
    assert component_row(grid, job_id, 0)["registered_at"] is None
    assert not grid.marker(0).exists()


def test_a_refused_token_exits_77_saying_so_and_changes_nothing(grid: Grid) -> None:
    job_id = new_job(grid, components=2)
    other_job = new_job(grid, components=1)
    refusals = {
        "unknown": ("not-a-token", "HTTP 401"),
        "component 1's": (grid.tokens[(job_id, 1)], "HTTP 403"),
        "another job's": (grid.tokens[(other_job, 0)], "HTTP 403"),
    }
    for what, (token, status) in refusals.items():
        code, stderr = finish(start(grid, job_id, 0, token=token))
        assert code == EXIT_REFUSED, (what, stderr)
        assert f"the center refused this component's token (POST /register: {status}" in stderr
        assert token not in stderr, "a token was repeated in a message"
    assert component_row(grid, job_id, 0)["registered_at"] is None
    assert component_row(grid, job_id, 1)["registered_at"] is None
    assert not grid.marker(0).exists()


def test_an_unreachable_center_exits_69_after_the_bound(grid: Grid) -> None:
    job_id = new_job(grid, components=1)
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}"
    proc = start(grid, job_id, 0, center=nowhere, extra=("--unreachable-s", "0.5"))
    code, stderr = finish(proc)
    assert code == EXIT_UNREACHABLE, stderr
    assert f"the center at {nowhere}/api/v1/components/{job_id}/0/0 is unreachable" in stderr
    assert not grid.marker(0).exists()


# -- timeout, signals -------------------------------------------------------------------------


def test_a_component_whose_peer_never_registers_times_out_with_124(grid: Grid) -> None:
    job_id = new_job(grid, components=2)

    code, stderr = finish(start(grid, job_id, 0, timeout_s=0.5))

    assert code == EXIT_TIMEOUT, stderr
    assert "timed out after 0.5 s" in stderr
    assert not grid.marker(0).exists()
    row = component_row(grid, job_id, 0)
    assert row["registered_at"] is not None and row["released_at"] is None


SIGNALLED = """
import os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def got(signum, frame):
    out.write_text(str(signum))
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # die of the signal, as an unprepared program would
signal.signal(signal.SIGTERM, got)
signal.signal(signal.SIGINT, got)
pathlib.Path(sys.argv[2]).touch()
while True:
    time.sleep(1)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_signal_to_the_barrier_reaches_the_command_and_exits_128_plus_n(
    grid: Grid, signum: signal.Signals
) -> None:
    job_id = new_job(grid, components=1)
    got, ready = grid.workdir / "got", grid.workdir / "ready"
    proc = start(grid, job_id, 0, [sys.executable, "-c", SIGNALLED, str(got), str(ready)])
    wait_until(ready.exists, "the command ready", proc)

    proc.send_signal(signum)  # to the barrier only: the command has to be told by it
    code, stderr = finish(proc)

    assert got.read_text() == str(int(signum)), "the command never received the signal"
    assert code == 128 + signum, stderr
