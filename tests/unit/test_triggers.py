"""SiteJobTrigger and ForcingFileTrigger against a real GridRuntime (temp SQLite + the
embedded local sites) and a real directory; the trigger base's wait loop and layering."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import importlib
import json
import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException

from gridcore.engine.runtime import GridRuntime, JobRecord
from gridcore.errors import CredentialRejected, SiteError, SiteUnavailable
from gridcore.model import JobRequest, JobSubmission
from gridcore_airflow.operators.hooks import EngineKind
from gridcore_airflow.sensors import base
from gridcore_airflow.sensors.base import EVENT_KEYS, UNKNOWN_STATE
from gridcore_airflow.sensors.triggers import (
    EngineTrigger,
    ForcingFileTrigger,
    SiteJobTrigger,
    consume_next_file,
    take_forcing_file,
)
from tests.fakes import FakeTriggerTaskInstance, as_airflow_holds

EVENT_TIMEOUT_S = 30.0


def submit(db_url: str, command: str, name: str = "t.job.0", site: str | None = None) -> int:
    runtime = GridRuntime.open(db_url=db_url)
    try:
        record = runtime.select(JobRequest(name, 1, runtime_s=1), site=site)
        runtime.submit(record.selection_id, JobSubmission(name, command, 1))
        return record.selection_id
    finally:
        runtime.store.dispose()


def record_of(db_url: str, selection_id: int) -> JobRecord:
    runtime = GridRuntime.open(db_url=db_url)
    try:
        return runtime.record(selection_id)
    finally:
        runtime.store.dispose()


async def all_events(run: AsyncIterator[Any]) -> list[Any]:
    async def collect() -> list[Any]:
        return [event async for event in run]

    return await asyncio.wait_for(collect(), EVENT_TIMEOUT_S)


# -- SiteJobTrigger ------------------------------------------------------------------------


def test_site_job_trigger_serialize_round_trips_through_its_class_path() -> None:
    trigger = SiteJobTrigger(
        7,
        grid_file="/g.toml",
        db_url="sqlite:///x.db",
        poll_interval=0.5,
        max_retries=2,
        gridcore_conn_id="gridcore_lab",
    )
    classpath, kwargs = trigger.serialize()

    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)

    assert classpath == "gridcore_airflow.sensors.triggers.SiteJobTrigger"
    assert kwargs == {
        "selection_id": 7,
        "grid_file": "/g.toml",
        "db_url": "sqlite:///x.db",
        "poll_interval": 0.5,
        "max_retries": 2,
        "gridcore_conn_id": "gridcore_lab",
        "not_before": None,
    }
    assert json.loads(json.dumps(kwargs)) == kwargs  # plain JSON, as the triggerer stores it
    assert rebuilt.serialize() == (classpath, kwargs)
    assert (rebuilt.selection_id, rebuilt.location) == (7, trigger.location)


def test_the_id_is_given_once_by_position_or_by_its_name() -> None:
    assert SiteJobTrigger(selection_id=4).selection_id == SiteJobTrigger(4).selection_id == 4
    assert SiteJobTrigger(4).poll_interval == 2.0  # the subclass's default
    with pytest.raises(TypeError, match="needs selection_id"):
        SiteJobTrigger()
    with pytest.raises(TypeError, match="unexpected"):
        SiteJobTrigger(4, selection_id=4)
    with pytest.raises(TypeError, match="unexpected"):
        SiteJobTrigger(job_id=4)


@pytest.mark.asyncio
async def test_run_yields_one_success_event_for_a_quick_job(db_url: str) -> None:
    selection_id = submit(db_url, "echo surge")

    events = await all_events(SiteJobTrigger(selection_id, None, db_url, 0.1).run())

    assert len(events) == 1
    payload = events[0].payload
    assert set(payload) == EVENT_KEYS
    assert payload["status"] == "success"
    assert (payload["subject"], payload["id"]) == ("selection", selection_id)
    assert payload["record"]["selection_id"] == selection_id
    assert payload["record"]["state"] == "completed"
    assert payload["record"]["exit_code"] == 0
    assert "completed" in payload["message"]


@pytest.mark.asyncio
async def test_run_yields_one_failed_event_for_exit_3(db_url: str) -> None:
    selection_id = submit(db_url, "exit 3")

    events = await all_events(SiteJobTrigger(selection_id, None, db_url, 0.1).run())

    assert [e.payload["status"] for e in events] == ["failed"]
    payload = events[0].payload
    assert payload["id"] == selection_id
    assert payload["record"]["exit_code"] == 3
    assert "exit code 3" in payload["message"]


@pytest.mark.asyncio
async def test_an_unknown_selection_becomes_an_error_event_not_an_exception(db_url: str) -> None:
    submit(db_url, "true")  # migrates the database

    events = await all_events(SiteJobTrigger(999, None, db_url, 0.1).run())

    assert len(events) == 1
    assert set(events[0].payload) == EVENT_KEYS
    assert events[0].payload["status"] == "error"
    assert (events[0].payload["subject"], events[0].payload["id"]) == ("selection", 999)
    assert events[0].payload["record"] is None
    assert "no selection 999" in events[0].payload["message"]


class FlakySite:
    """A runtime whose site fails ``failures`` polls in a row before the job completes."""

    def __init__(self, failures: int, done: JobRecord, error: SiteError | None = None) -> None:
        self.failures = failures
        self.done = done
        self.polls = 0
        self.error = error or SiteUnavailable("alpha", "connection refused")

    def poll(self, selection_id: int) -> JobRecord:
        self.polls += 1
        if self.polls <= self.failures:
            raise self.error
        return self.done


class FlakyTrigger(SiteJobTrigger):
    site: FlakySite

    def _connect(self) -> Any:  # the seam: no database, a scripted site
        return self.site


def flaky_trigger(failures: int, done: JobRecord, max_retries: int) -> FlakyTrigger:
    trigger = FlakyTrigger(1, None, None, 0.01, max_retries=max_retries)
    trigger.site = FlakySite(failures, done)
    return trigger


@pytest.fixture
def finished(db_url: str) -> JobRecord:
    selection_id = submit(db_url, "true")
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    runtime = GridRuntime.open(db_url=db_url)
    try:
        while not (record := runtime.poll(selection_id)).finished:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        runtime.store.dispose()
    return record


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "_BACKOFF_CAP_S", 0.001)


@pytest.mark.asyncio
@pytest.mark.usefixtures("no_backoff")
async def test_transient_site_errors_are_retried_with_backoff(finished: JobRecord) -> None:
    trigger = flaky_trigger(failures=3, done=finished, max_retries=3)

    events = await all_events(trigger.run())

    assert [e.payload["status"] for e in events] == ["success"]
    assert trigger.site.polls == 4


@pytest.mark.asyncio
@pytest.mark.usefixtures("no_backoff")
async def test_a_rejected_credential_ends_the_wait_at_once(finished: JobRecord) -> None:
    rejected = CredentialRejected("alpha", "credential rejected (HTTP 511) ... env:T")
    trigger = flaky_trigger(failures=10, done=finished, max_retries=5)
    trigger.site.error = rejected

    events = await all_events(trigger.run())

    assert [e.payload["status"] for e in events] == ["error"]
    assert "credential rejected (HTTP 511)" in events[0].payload["message"]
    assert trigger.site.polls == 1  # the adapter renewed once already: no retries


@pytest.mark.asyncio
@pytest.mark.usefixtures("no_backoff")
async def test_retries_are_bounded_then_reported_as_an_error_event(finished: JobRecord) -> None:
    trigger = flaky_trigger(failures=10, done=finished, max_retries=2)

    events = await all_events(trigger.run())

    assert [e.payload["status"] for e in events] == ["error"]
    assert "gave up after 3 failed polls" in events[0].payload["message"]
    assert "connection refused" in events[0].payload["message"]


def test_backoff_is_jittered_and_capped() -> None:
    delays = [base.backoff_delay(attempt) for attempt in (1, 1, 1, 1, 20)]
    assert all(0.1 <= d <= 1.0 for d in delays[:4])
    assert len(set(delays[:4])) > 1
    assert delays[4] <= base._BACKOFF_CAP_S


class BrokenSite:
    """A runtime whose poll fails with something no trigger expects."""

    def poll(self, selection_id: int) -> JobRecord:
        raise RuntimeError("driver exploded")


class BrokenTrigger(SiteJobTrigger):
    def _connect(self) -> Any:
        return BrokenSite()


@pytest.mark.asyncio
async def test_an_unexpected_exception_is_one_error_event_not_a_raise() -> None:
    events = await all_events(BrokenTrigger(5, None, None, 0.01).run())

    assert [e.payload for e in events] == [
        {
            "status": "error",
            "message": "RuntimeError: driver exploded",
            "subject": "selection",
            "id": 5,
            "record": None,
            "output": [],
        }
    ]


class ThreadRecordingSite:
    """A runtime that notes which thread each engine call runs in."""

    def __init__(self, done: JobRecord) -> None:
        self.done = done
        self.threads: list[int] = []
        self.polls = 0

    def poll(self, selection_id: int) -> JobRecord:
        self.threads.append(threading.get_ident())
        self.polls += 1
        if self.polls < 3:
            return dataclasses.replace(self.done, state="running", finished_at=None)
        return self.done


class ThreadRecordingTrigger(SiteJobTrigger):
    site: ThreadRecordingSite
    connect_thread: int | None = None

    def _connect(self) -> Any:
        self.connect_thread = threading.get_ident()
        return self.site


@pytest.mark.asyncio
async def test_engine_calls_never_run_on_the_event_loops_thread(finished: JobRecord) -> None:
    trigger = ThreadRecordingTrigger(finished.selection_id, None, None, 0.01)
    trigger.site = ThreadRecordingSite(finished)

    events = await all_events(trigger.run())

    loop_thread = threading.get_ident()
    assert [e.payload["status"] for e in events] == ["success"]
    assert trigger.site.polls == 3
    assert trigger.connect_thread not in (None, loop_thread)
    assert loop_thread not in trigger.site.threads


def test_sensors_reach_operators_only_through_the_hook() -> None:
    # The Airflow layers point one way: operators -> sensors -> the hook -> gridcore. The
    # hook owns the connections (as the SSH provider's does), so triggers and sensors use
    # it; it (and the package's __init__, which imports it) import nothing else of ours.
    sensors_dir = Path(base.__file__).parent
    operators_dir = sensors_dir.parent / "operators"
    hook = "gridcore_airflow.operators.hooks"
    upward = [
        f"{path.name}: {name}"
        for path in sorted(sensors_dir.glob("*.py"))
        for name in _imported(path)
        if name.split(".")[0] == "operators"
        or (name.startswith("gridcore_airflow.operators") and name != hook)
    ]
    below_hook = [
        f"{path.name}: {name}"
        for path in (operators_dir / "hooks.py", operators_dir / "__init__.py")
        for name in _imported(path)
        if name.startswith("gridcore_airflow") and name != hook
    ]
    assert {p.name for p in sensors_dir.glob("*.py")} >= {"base.py", "triggers.py"}
    assert hook in _imported(sensors_dir / "base.py")
    assert upward == []
    assert below_hook == []


def _imported(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    return names


async def wait_until_running(db_url: str, selection_id: int) -> None:
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while record_of(db_url, selection_id).state != "running":
        assert time.monotonic() < deadline, record_of(db_url, selection_id)
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_on_kill_cancels_the_remote_job(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    selection_id = submit(db_url, "sleep 60")
    trigger = SiteJobTrigger(selection_id, None, db_url, 0.05)
    as_airflow_holds(trigger, "failed", monkeypatch)
    waiting = asyncio.ensure_future(trigger.run().__anext__())
    await wait_until_running(db_url, selection_id)

    # What the triggerer does when a user marks the task failed: cancel run(), on_kill().
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await trigger.on_kill()
    await trigger.cleanup()

    record = record_of(db_url, selection_id)
    assert record.state == "cancelled"
    assert record.finished_at is not None


@pytest.mark.asyncio
async def test_cleanup_alone_leaves_the_remote_job_running(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cleanup() also runs when a triggerer restarts: the job must survive it.
    selection_id = submit(db_url, "sleep 60")
    trigger = SiteJobTrigger(selection_id, None, db_url, 0.05)
    waiting = asyncio.ensure_future(trigger.run().__anext__())
    await wait_until_running(db_url, selection_id)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await trigger.cleanup()

    assert record_of(db_url, selection_id).state == "running"
    user = SiteJobTrigger(selection_id, None, db_url)
    as_airflow_holds(user, "failed", monkeypatch)
    await user.on_kill()  # don't leave it behind
    assert record_of(db_url, selection_id).state == "cancelled"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("state", "why"),
    [("deferred", "still deferred"), (UNKNOWN_STATE, "state unknown")],
    ids=["moved-to-another-triggerer", "state-unreadable"],
)
async def test_on_kill_without_a_users_action_leaves_the_job_running(
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    state: object,
    why: str,
) -> None:
    """Airflow 3.3.2 calls on_kill when a triggerer drops a trigger another process or
    triggerer took over (issue 21 item 2: a second Airflow process cancelled a job):
    the task instance still deferred, or a state that cannot be read, cancels nothing."""
    selection_id = submit(db_url, "sleep 60")
    trigger = SiteJobTrigger(selection_id, None, db_url, 0.05)
    if state is UNKNOWN_STATE:
        monkeypatch.setattr(base, "task_instance_state", _unreadable)
        trigger.task_instance = FakeTriggerTaskInstance(None)
    else:
        as_airflow_holds(trigger, "deferred", monkeypatch)

    said = logged_by(trigger)
    await trigger.on_kill()

    assert record_of(db_url, selection_id).state in ("pending", "running")
    assert any(f"the task instance is {why}" in line for line in said.lines), said.lines
    as_airflow_holds(trigger, None, monkeypatch)  # then the user clears the task
    await trigger.on_kill()
    assert record_of(db_url, selection_id).state == "cancelled"
    assert "the task instance is cleared now (a user's action, or the task ended" in said.lines[-1]


def _unreadable(ti: object) -> str | None:
    raise ConnectionError("the execution API does not answer")


@pytest.mark.asyncio
async def test_an_event_waits_for_not_before_only_in_a_triggerer(db_url: str) -> None:
    """A deferred wait's event is held until ``not_before`` (Airflow 3.3.2 fails a task
    whose trigger fires before the executor reported the deferral: issue 21 item 1),
    but only where a triggerer runs it; ``dag.test()`` sets no ``trigger_id``."""
    selection_id = submit(db_url, "true")
    held = SiteJobTrigger(selection_id, None, db_url, 0.05, not_before=time.time() + 1.5)
    held.trigger_id = 7  # as the triggerer sets it
    started = time.monotonic()
    event = await asyncio.wait_for(held.run().__anext__(), EVENT_TIMEOUT_S)
    assert event.payload["status"] == "success"
    assert time.monotonic() - started >= 1.0

    inline = SiteJobTrigger(selection_id, None, db_url, 0.05, not_before=time.time() + 60)
    event = await asyncio.wait_for(inline.run().__anext__(), 10)  # not held 60 s
    assert event.payload["status"] == "success"


# -- the job's own output in the task log ------------------------------------------------------


class LogLines(logging.Handler):
    """What a trigger logs, in order. Its logger is the edge to the task log: in the
    triggerer a structlog logger, here a stdlib one the same calls go to."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def logged_by(trigger: Any) -> LogLines:
    handler = LogLines()
    logger = logging.getLogger(f"tests.trigger.{id(handler)}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    trigger._log = logger  # LoggingMixin's slot for the logger
    return handler


async def wait_for_line(log: LogLines, line: str) -> None:
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while line not in log.lines:
        assert time.monotonic() < deadline, log.lines
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_the_jobs_lines_are_logged_while_it_runs_and_the_event_names_its_files(
    db_url: str, tmp_path: Path
) -> None:
    # The job waits for the test to see its first line in the log before it goes on:
    # output is copied while the job runs, not once it has ended.
    seen = tmp_path / "seen"
    command = (
        "echo 'surge 1.2 m'; echo 'warming up' >&2;"
        f" while [ ! -e {seen} ]; do sleep 0.05; done;"
        " printf 'surge 1.9 m\\npeak at 03:00'; echo 'no convergence' >&2; exit 3"
    )
    selection_id = submit(db_url, command)
    trigger = SiteJobTrigger(selection_id, None, db_url, 0.05)
    log = logged_by(trigger)
    waiting = asyncio.ensure_future(all_events(trigger.run()))

    await wait_for_line(log, "[stderr] warming up")  # stdout is read first at each poll
    assert "[stdout] surge 1.2 m" in log.lines
    assert record_of(db_url, selection_id).state == "running"
    seen.touch()
    [event] = await waiting

    assert [line for line in log.lines if line.startswith("[stdout]")] == [
        "[stdout] surge 1.2 m",
        "[stdout] surge 1.9 m",
        "[stdout] peak at 03:00",  # no newline at the end: shown once the job ended
    ]
    assert [line for line in log.lines if line.startswith("[stderr]")] == [
        "[stderr] warming up",
        "[stderr] no convergence",
    ]
    payload = event.payload
    assert payload["status"] == "failed"
    [output] = payload["output"]
    record = record_of(db_url, selection_id)
    assert (output["site"], output["job_id"], output["failed"]) == (
        record.site,
        record.job_id,
        True,
    )
    assert Path(output["stdout"]).read_text() == "surge 1.2 m\nsurge 1.9 m\npeak at 03:00"
    assert Path(output["stderr"]).read_text() == "warming up\nno convergence\n"
    assert output["shown"] == {"stdout": 37, "stderr": 26}
    assert json.loads(json.dumps(payload)) == payload  # plain JSON, as the triggerer stores it

    # execute_complete's side: the task's log ends with the stderr tail, then it fails.
    task_log = LogLines()
    task_logger = logging.getLogger(f"tests.task.{id(task_log)}")
    task_logger.addHandler(task_log)
    task_logger.propagate = False
    with pytest.raises(AirflowException, match="exit code 3"):
        SiteJobTrigger.contract.completed_record(payload, task_logger)
    assert task_log.lines == [
        f"[gridcore] stderr of the job (whole, 26 bytes in {output['stderr']}):",
        "[stderr] warming up",
        "[stderr] no convergence",
    ]


@pytest.mark.asyncio
async def test_a_restarted_trigger_shows_the_output_again_from_its_start(db_url: str) -> None:
    # The offsets are not persisted (gridcore.sites.output): a trigger rebuilt from its
    # serialized arguments, as a restarted triggerer does, repeats the lines.
    selection_id = submit(db_url, "echo one; echo two")
    first = SiteJobTrigger(selection_id, None, db_url, 0.05)
    first_log = logged_by(first)
    await all_events(first.run())
    classpath, kwargs = first.serialize()
    module, _, name = classpath.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**kwargs)
    again_log = logged_by(again)

    await all_events(again.run())

    expected = ["[stdout] one", "[stdout] two"]
    assert [line for line in first_log.lines if line.startswith("[std")] == expected
    assert [line for line in again_log.lines if line.startswith("[std")] == expected


@pytest.mark.asyncio
async def test_output_that_cannot_be_read_never_changes_the_event(finished: JobRecord) -> None:
    # A runtime whose poll works but that cannot say where the output is (FlakySite has
    # no output_files): the wait ends as before, and the log says why no output is shown.
    trigger = flaky_trigger(failures=0, done=finished, max_retries=0)
    log = logged_by(trigger)

    events = await all_events(trigger.run())

    assert [e.payload["status"] for e in events] == ["success"]
    assert events[0].payload["output"] == []
    assert any(line.startswith("cannot copy the output of selection") for line in log.lines)


# -- ForcingFileTrigger ----------------------------------------------------------------------


def test_forcing_trigger_serialize_round_trips_through_its_class_path(tmp_path: Path) -> None:
    trigger = ForcingFileTrigger(directory=str(tmp_path), pattern="*.nc", poll_interval=1.0)
    classpath, kwargs = trigger.serialize()

    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)

    assert classpath == "gridcore_airflow.sensors.triggers.ForcingFileTrigger"
    assert rebuilt.serialize() == (classpath, kwargs)


@pytest.mark.asyncio
async def test_two_triggers_racing_for_one_file_fire_once(tmp_path: Path) -> None:
    inbox = tmp_path / "forcing"
    inbox.mkdir()
    (inbox / "alberto.json").write_text('{"storm": "alberto"}')
    racers = [
        asyncio.ensure_future(ForcingFileTrigger(str(inbox), "*.json", 0.02).run().__anext__())
        for _ in range(2)
    ]

    done, pending = await asyncio.wait(
        racers, timeout=EVENT_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
    )
    if len(done) == 1:  # give the loser a few more polls to (wrongly) fire too
        more, pending = await asyncio.wait(pending, timeout=0.3)
        done |= more
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)

    assert len(done) == 1
    payload = done.pop().result().payload
    consumed = Path(payload["path"])
    assert payload["name"] == "alberto.json"
    assert payload["size"] == len('{"storm": "alberto"}')
    assert consumed.parent == inbox / "claimed"
    assert consumed.read_text() == '{"storm": "alberto"}'
    assert not (inbox / "alberto.json").exists()


@pytest.mark.asyncio
async def test_only_matching_visible_files_fire_and_a_missing_directory_is_awaited(
    tmp_path: Path,
) -> None:
    inbox = tmp_path / "not-yet"
    waiting = asyncio.ensure_future(ForcingFileTrigger(str(inbox), "*.nc", 0.02).run().__anext__())
    await asyncio.sleep(0.1)
    assert not waiting.done()  # no directory yet: keep polling, no error

    inbox.mkdir()
    (inbox / "notes.txt").write_text("x")
    (inbox / ".half-written.nc").write_text("x")
    await asyncio.sleep(0.1)
    assert not waiting.done()

    (inbox / "surge.nc").write_bytes(b"\x00" * 5)
    event = await asyncio.wait_for(waiting, EVENT_TIMEOUT_S)

    assert event.payload["name"] == "surge.nc"
    assert event.payload["size"] == 5
    assert sorted(p.name for p in inbox.iterdir()) == [".half-written.nc", "claimed", "notes.txt"]


def test_concurrent_consumers_take_each_file_exactly_once(tmp_path: Path) -> None:
    for i in range(40):
        (tmp_path / f"member-{i:02d}.json").write_text(str(i))
    taken: list[str] = []
    lock = threading.Lock()

    def consume() -> None:
        while (event := consume_next_file(str(tmp_path), "*.json")) is not None:
            with lock:
                taken.append(event["name"])

    workers = [threading.Thread(target=consume) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    assert sorted(taken) == [f"member-{i:02d}.json" for i in range(40)]
    assert len(os.listdir(tmp_path / "claimed")) == 40


def test_exactly_one_run_takes_a_claimed_file_and_its_retry_finds_it(tmp_path: Path) -> None:
    (tmp_path / "debby.json").write_text("{}")
    event = consume_next_file(str(tmp_path), "*.json")
    assert event is not None
    taken = take_forcing_file(event["path"], "manual__2026-11-24T00:00:00+00:00")
    assert taken is not None and taken.parent == tmp_path / "consumed"
    assert take_forcing_file(event["path"], "manual__2026-11-24T00:00:00+00:00") == taken
    assert take_forcing_file(event["path"], "asset_triggered__other") is None  # a duplicate


@pytest.mark.asyncio
async def test_a_claimed_file_whose_event_was_lost_is_announced_again_and_used_once(
    tmp_path: Path,
) -> None:
    """A triggerer stopped between claiming (firing) and persisting the event: no run
    ever takes the file. The next trigger announces it again after ``reemit_after_s``;
    only the run of the new event uses it."""
    (tmp_path / "debby.json").write_text('{"storm": "debby"}')
    lost = consume_next_file(str(tmp_path), "*.json")
    assert lost is not None
    trigger = ForcingFileTrigger(str(tmp_path), "*.json", 0.02, reemit_after_s=0.3)
    again = await asyncio.wait_for(trigger.run().__anext__(), EVENT_TIMEOUT_S)

    assert again.payload["name"] == "debby.json" and again.payload["path"] != lost["path"]
    assert take_forcing_file(lost["path"], "run-of-the-lost-event") is None
    taken = take_forcing_file(again.payload["path"], "run-of-the-new-event")
    assert taken is not None and taken.read_text() == '{"storm": "debby"}'
    # taken: nothing is announced any more
    quiet = asyncio.ensure_future(trigger.run().__anext__())
    await asyncio.sleep(0.5)
    assert not quiet.done()
    quiet.cancel()
    await asyncio.gather(quiet, return_exceptions=True)


@pytest.mark.parametrize(
    ("kind", "subject"),
    [(EngineKind.COALLOCATION, "co-allocated job"), (EngineKind.CORESERVATION, "co-reserved job")],
)
def test_an_engine_trigger_serialize_round_trips_through_its_class_path(
    kind: EngineKind, subject: str
) -> None:
    trigger = EngineTrigger(
        5,
        kind,
        "/g.toml",
        "sqlite:////x.db",
        0.5,
        max_retries=2,
        gridcore_conn_id="gridcore_lab",
    )
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    clone = getattr(importlib.import_module(module), name)(**kwargs)

    assert path == "gridcore_airflow.sensors.triggers.EngineTrigger"
    assert kwargs == {
        "job_id": 5,
        "engine": kind.value,
        "grid_file": "/g.toml",
        "db_url": "sqlite:////x.db",
        "poll_interval": 0.5,
        "max_retries": 2,
        "gridcore_conn_id": "gridcore_lab",
        "not_before": None,
    }
    assert json.loads(json.dumps(kwargs)) == kwargs  # plain JSON, as the triggerer stores it
    assert clone.serialize() == trigger.serialize()
    assert (clone.job_id, clone.engine, clone.location) == (5, kind, trigger.location)
    assert clone.contract.subject == subject
    assert EngineTrigger(5, kind).poll_interval == 1.0  # the engines' default
