"""Every trigger gridcore runs in Airflow's triggerer: waiting on site jobs and on data.

Triggers live in this installed package (the triggerer never loads DAG bundles). The
ones that wait on gridcore's work subclass
:class:`gridcore_airflow.sensors.base.GridcoreTrigger` (one wait loop, one event
contract); :class:`ForcingFileTrigger` watches a directory for an asset. Synchronous
calls run in a worker thread via ``asyncio.to_thread``, so the triggerer's event loop is
never blocked.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypedDict

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from gridcore.engine.runtime import GridRuntime, JobRecord
from gridcore.model import JobState
from gridcore_airflow.sensors.base import GridcoreTrigger, Outcome

CONSUMED_DIR = "consumed"


class SiteJobTrigger(GridcoreTrigger[GridRuntime, JobRecord]):
    """Wait for the job of selection ``selection_id`` to finish; yield exactly one event.

    ``SiteJobTrigger(selection_id, grid_file=None, db_url=None, poll_interval=2.0,
    max_retries=5, gridcore_conn_id=None)`` polls ``GridRuntime.poll`` every
    ``poll_interval`` seconds (see :class:`~sensors.base.GridcoreTrigger` for retries,
    errors, on_kill and cleanup).
    """

    subject = "selection"
    id_field = "selection_id"
    selection_id: int

    def _connect(self) -> GridRuntime:
        # The selection exists, so its database is migrated; skipping Alembic keeps
        # CPU-bound work (and the GIL) away from the triggerer's event loop.
        return self.location.open_runtime(upgrade=False)

    def _poll(self, handle: GridRuntime) -> JobRecord:
        return handle.poll(self.selection_id)

    @classmethod
    def outcome(cls, record: JobRecord) -> Outcome:
        where = f"job {record.job_id} on site {record.site}"
        if record.state == JobState.COMPLETED.value:
            return Outcome(record.selection_id, True, f"{where} completed")
        code = "" if record.exit_code is None else f", exit code {record.exit_code}"
        detail = f": {record.message}" if record.message else ""
        return Outcome(record.selection_id, False, f"{where} {record.state}{code}{detail}")

    def _cancel(self, handle: GridRuntime) -> str:
        record = handle.cancel(self.selection_id)
        return f"job {record.job_id} is {record.state}"

    def _close(self, handle: GridRuntime) -> None:
        handle.store.dispose()


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
