"""Every trigger gridcore runs in Airflow's triggerer: waiting on site jobs and on data.

Triggers live in this installed package (the triggerer never loads DAG bundles) and only
ever touch gridcore through :class:`~gridcore.engine.runtime.GridRuntime`, whose calls are
synchronous (SQLAlchemy, HTTP): each call runs in a worker thread via
``asyncio.to_thread`` so the triggerer's event loop is never blocked.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal, Protocol, TypedDict, TypeVar, cast

from airflow.sdk.exceptions import AirflowException
from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from gridcore.engine.runtime import GridRuntime, JobRecord
from gridcore.errors import GridError, SiteError
from gridcore.model import JobState
from operators.hooks import install_connection_resolver

EventStatus = Literal["success", "failed", "error"]
# Transient site errors (slurmrestd restarting, a network blip) are retried this many
# times in a row before the trigger gives up with an "error" event.
DEFAULT_MAX_RETRIES = 5
_BACKOFF_BASE_S = 1.0
_BACKOFF_CAP_S = 30.0
# on_kill() gets a bounded time from the triggerer ([triggerer] on_kill_timeout, 30 s);
# stay inside it so a slow site cannot leave the cancel half done unnoticed.
_CANCEL_TIMEOUT_S = 20.0
CONSUMED_DIR = "consumed"


class _Finishable(Protocol):
    @property
    def finished(self) -> bool: ...


R = TypeVar("R", bound=_Finishable)


def poll_blocking(
    poll: Callable[[], R], poll_interval: float, max_retries: int, noun: str = "polls"
) -> R | str:
    """Call ``poll`` every ``poll_interval`` s until its record is finished; transient
    SiteErrors are retried with back-off. The finished record, or why it gave up."""
    failures = 0
    while True:
        try:
            record = poll()
        except SiteError as exc:
            failures += 1
            if failures > max_retries:
                return f"gave up after {failures} failed {noun} in a row: {exc}"
            time.sleep(backoff_delay(failures))
            continue
        failures = 0
        if record.finished:
            return record
        time.sleep(poll_interval)


async def poll_async(
    poll: Callable[[], R],
    poll_interval: float,
    max_retries: int,
    log: logging.Logger | logging.LoggerAdapter[logging.Logger],
    noun: str = "polls",
) -> R | str:
    """:func:`poll_blocking` for the triggerer: ``poll`` runs in a worker thread and the
    waits are ``asyncio.sleep``, so the event loop is never blocked."""
    failures = 0
    while True:
        try:
            record = await asyncio.to_thread(poll)
        except SiteError as exc:
            failures += 1
            if failures > max_retries:
                return f"gave up after {failures} failed {noun} in a row: {exc}"
            delay = backoff_delay(failures)
            log.warning("%s failed (%s); retry %d in %.1f s", noun, exc, failures, delay)
            await asyncio.sleep(delay)
            continue
        failures = 0
        if record.finished:
            return record
        await asyncio.sleep(poll_interval)


def validated_event(event: Any, trigger: str, id_key: str) -> dict[str, Any]:
    """``event`` checked against the contract every gridcore trigger keeps (exactly one
    event: ``status``, ``message``, the id under ``id_key``, ``record``); ``ValueError``
    naming what is wrong (a trigger from another version, a hand-made event)."""
    if not isinstance(event, dict):
        raise ValueError(f"expected a {trigger} event (a dict), got {type(event).__name__}")
    missing = sorted({"status", "message", id_key, "record"} - set(event))
    if missing:
        raise ValueError(f"{trigger} event lacks key(s) {missing}: {event!r}")
    if event["status"] not in ("success", "failed", "error"):
        raise ValueError(f"{trigger} event has an unknown status {event['status']!r}")
    if event["status"] == "success" and not isinstance(event["record"], dict):
        raise ValueError(f"{trigger} success event has no record: {event!r}")
    return {
        "status": event["status"],
        "message": str(event["message"]),
        id_key: int(event[id_key]),
        "record": event["record"],
    }


def record_of_success(event: Any, trigger: str, id_key: str, what: str) -> dict[str, Any]:
    """The record of a successful event; any other event becomes the Airflow failure
    that the operators' and sensors' ``execute_complete`` raise."""
    try:
        checked = validated_event(event, trigger, id_key)
    except ValueError as exc:
        raise AirflowException(str(exc)) from exc
    if checked["status"] != "success" or checked["record"] is None:
        raise AirflowException(
            f"{what} {checked[id_key]}: {checked['status']}: {checked['message']}"
        )
    record: dict[str, Any] = checked["record"]
    return record


class SiteJobEvent(TypedDict):
    """The one event a :class:`SiteJobTrigger` yields: the contract with
    ``SiteJobOperator.execute_complete`` and ``SiteJobSensor.execute_complete``."""

    status: EventStatus
    message: str
    selection_id: int
    record: dict[str, Any] | None


REQUIRED_EVENT_KEYS = frozenset(SiteJobEvent.__annotations__)


def event_for_record(record: JobRecord) -> SiteJobEvent:
    """The event for a finished job (also used by the non-deferrable code paths)."""
    where = f"job {record.job_id} on site {record.site}"
    if record.state == JobState.COMPLETED.value:
        status: EventStatus = "success"
        message = f"{where} completed"
    else:
        status = "failed"
        code = "" if record.exit_code is None else f", exit code {record.exit_code}"
        detail = f": {record.message}" if record.message else ""
        message = f"{where} {record.state}{code}{detail}"
    return SiteJobEvent(
        status=status, message=message, selection_id=record.selection_id, record=record.as_json()
    )


def error_event(selection_id: int, message: str) -> SiteJobEvent:
    return SiteJobEvent(status="error", message=message, selection_id=selection_id, record=None)


def checked_event(event: Any) -> SiteJobEvent:
    """``event`` as a :class:`SiteJobEvent`, or ``ValueError`` naming what is wrong."""
    return cast(SiteJobEvent, validated_event(event, "SiteJobTrigger", "selection_id"))


def completed_record(event: Any) -> dict[str, Any]:
    """The job record of a successful event; any other event becomes the Airflow
    failure that ``execute_complete`` of the operator and the sensor raise."""
    return record_of_success(event, "SiteJobTrigger", "selection_id", "selection")


def wait_blocking(
    runtime: GridRuntime,
    selection_id: int,
    poll_interval: float,
    max_retries: int = DEFAULT_MAX_RETRIES,
) -> SiteJobEvent:
    """The non-deferrable twin of :meth:`SiteJobTrigger.run` (same retries, same event)."""
    outcome = poll_blocking(lambda: runtime.poll(selection_id), poll_interval, max_retries)
    if isinstance(outcome, str):
        return error_event(selection_id, outcome)
    return event_for_record(outcome)


class SiteJobTrigger(BaseTrigger):
    """Wait for the job of selection ``selection_id`` to finish; yield exactly one event.

    ``run()`` polls ``GridRuntime.poll`` every ``poll_interval`` seconds; transient
    ``SiteError``s are retried up to ``max_retries`` times in a row with jittered
    exponential back-off. Anything that goes wrong becomes an ``"error"`` event.

    A user killing the task (mark failed/success, clear) cancels the remote job in
    :meth:`on_kill`, NOT in :meth:`cleanup`: Airflow calls ``cleanup()`` on every exit,
    including a triggerer restart or redistribution, where the job must keep running and
    another triggerer resumes waiting on it.
    """

    def __init__(
        self,
        selection_id: int,
        grid_file: str | None = None,
        db_url: str | None = None,
        poll_interval: float = 2.0,
        max_retries: int = DEFAULT_MAX_RETRIES,
    ) -> None:
        super().__init__()
        self.selection_id = selection_id
        self.grid_file = grid_file
        self.db_url = db_url
        self.poll_interval = poll_interval
        self.max_retries = max_retries
        self._runtime: GridRuntime | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "selection_id": self.selection_id,
                "grid_file": self.grid_file,
                "db_url": self.db_url,
                "poll_interval": self.poll_interval,
                "max_retries": self.max_retries,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            event = await self._wait_until_finished()
        except GridError as exc:
            event = error_event(self.selection_id, f"gridcore: {exc}")
        except Exception as exc:  # the event contract: errors are reported, never raised
            self.log.exception("waiting on selection %s failed", self.selection_id)
            event = error_event(self.selection_id, f"{type(exc).__name__}: {exc}")
        yield TriggerEvent(dict(event))

    async def _wait_until_finished(self) -> SiteJobEvent:
        runtime = await self._runtime_once()
        outcome = await poll_async(
            lambda: runtime.poll(self.selection_id), self.poll_interval, self.max_retries, self.log
        )
        if isinstance(outcome, str):
            return error_event(self.selection_id, outcome)
        return event_for_record(outcome)

    async def _runtime_once(self) -> GridRuntime:
        if self._runtime is None:
            self._runtime = await asyncio.to_thread(self._open_runtime)
        return self._runtime

    def _open_runtime(self) -> GridRuntime:
        install_connection_resolver()
        # The selection exists, so its database is migrated; skipping Alembic keeps
        # CPU-bound work (and the GIL) away from the triggerer's event loop.
        return GridRuntime.open(self.grid_file, self.db_url, upgrade=False)

    async def on_kill(self) -> None:
        runtime = await self._runtime_once()
        record = await asyncio.wait_for(
            asyncio.to_thread(runtime.cancel, self.selection_id), _CANCEL_TIMEOUT_S
        )
        self.log.info(
            "cancelled selection %s: job %s is %s", record.selection_id, record.job_id, record.state
        )

    async def cleanup(self) -> None:
        # Local resources only (the state DB connection pool): the remote job must
        # survive a triggerer restart, see the class docstring.
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            await asyncio.to_thread(runtime.store.dispose)


def backoff_delay(attempt: int, rng: random.Random | None = None) -> float:
    """Jittered exponential back-off for the ``attempt``-th failure in a row: uniform in
    [0.1 c, c] with c = min(cap, base * 2**(attempt - 1)), so retries of many triggers
    that failed together (one site went down) spread out instead of arriving at once."""
    ceiling = min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2 ** max(0, attempt - 1))
    return (rng or random).uniform(0.1 * ceiling, ceiling)


class ForcingFileEvent(TypedDict):
    path: str
    name: str
    size: int


class ForcingFileTrigger(BaseEventTrigger):
    """Fire once per new file in ``directory`` whose name matches ``pattern``.

    The file is consumed by an atomic ``os.rename`` into ``directory/consumed/`` before
    the event is yielded: the rename succeeds for exactly one of several triggerers
    racing for the same file, and a consumed file can never fire again (an asset watcher
    whose condition stayed true would re-trigger the DAG forever). The event's ``path``
    is the consumed location, which is where tasks read the file.

    Producers should write under a name that does not match ``pattern`` (or outside the
    directory) and rename into place, so a half-written file is never consumed. Consumed
    files are kept: if a triggerer dies between the rename and persisting the event, the
    file can be moved back into the directory to fire again.
    """

    def __init__(self, directory: str, pattern: str = "*", poll_interval: float = 5.0) -> None:
        super().__init__()
        self.directory = directory
        self.pattern = pattern
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "directory": self.directory,
                "pattern": self.pattern,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            event = await asyncio.to_thread(consume_next_file, self.directory, self.pattern)
            if event is not None:
                self.log.info("consumed forcing file %s", event["path"])
                yield TriggerEvent(dict(event))
                return
            await asyncio.sleep(self.poll_interval)


def consume_next_file(directory: str, pattern: str) -> ForcingFileEvent | None:
    """Move the oldest matching file into ``consumed/`` and describe it; None if there is
    none (or every candidate was taken by a concurrent consumer first)."""
    root = Path(directory)
    candidates = _oldest_first(root, pattern)
    if not candidates:
        return None
    target_dir = root / CONSUMED_DIR
    target_dir.mkdir(exist_ok=True)
    for name in candidates:
        # Unique per consumer and call (rename silently replaces an existing target), and
        # time-prefixed so consumed/ lists in arrival order.
        target = target_dir / f"{time.time_ns()}-{uuid.uuid4().hex[:12]}-{name}"
        try:
            os.rename(root / name, target)
        except FileNotFoundError:
            continue  # another consumer won this one
        return ForcingFileEvent(path=str(target), name=name, size=target.stat().st_size)
    return None


def _oldest_first(root: Path, pattern: str) -> list[str]:
    found: list[tuple[int, str]] = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []  # the directory may be created after the DAG is deployed
    for entry in entries:
        if entry.name.startswith(".") or not fnmatch.fnmatch(entry.name, pattern):
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                found.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.name))
        except FileNotFoundError:
            continue  # consumed by someone else between the listing and the stat
    return [name for _, name in sorted(found)]
