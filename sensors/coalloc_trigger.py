"""Waiting on a co-allocated job in Airflow's triggerer: drive KOALA's scans until it ends.

The KOALA engine has no daemon of its own: whoever waits on a co-allocated job also runs
the engine's scans (placement, staging, claiming, following the components). Any number
of triggers (and workers, in non-deferrable mode) may do so at once: the engine's scan
lease in the state database lets exactly one scan run at a time, the others skip.

Like :mod:`sensors.triggers`, this lives in an installed package (the triggerer never
loads DAG bundles) and runs every synchronous engine call in a worker thread via
``asyncio.to_thread``, so the triggerer's event loop is never blocked.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Literal, TypedDict, cast

from airflow.triggers.base import BaseTrigger, TriggerEvent

from gridcore.engine.koala import LEASE_SCANS, CoAllocationRecord, KoalaEngine
from gridcore.engine.runtime import GridRuntime
from gridcore.errors import GridError
from gridcore.policies.claiming import KoalaParams
from gridcore.staging import ReplicaCatalog
from operators.hooks import install_connection_resolver
from sensors.triggers import (
    DEFAULT_MAX_RETRIES,
    poll_async,
    poll_blocking,
    record_of_success,
    validated_event,
)

EventStatus = Literal["success", "failed", "error"]
# The scan lease must outlive one scan (staging a file or a slow slurmrestd can take a
# while), or a second engine would start scanning while the first still is. A holder
# that stops waiting releases it at once (cleanup), so the floor only matters when a
# triggerer dies while holding it.
MIN_LEASE_S = 60.0
# See sensors.triggers: on_kill has [triggerer] on_kill_timeout (30 s) in all.
_CANCEL_TIMEOUT_S = 20.0


class CoAllocationEvent(TypedDict):
    """The one event a :class:`CoAllocationTrigger` yields: the contract with
    ``CoAllocateOperator.execute_complete``."""

    status: EventStatus
    message: str
    job_id: int
    record: dict[str, Any] | None


REQUIRED_EVENT_KEYS = frozenset(CoAllocationEvent.__annotations__)


def event_for_record(record: CoAllocationRecord) -> CoAllocationEvent:
    """The event for a finished co-allocated job (also used by the non-deferrable path)."""
    where = f"co-allocated job {record.job_id} ({record.name})"
    if record.state == "completed":
        status: EventStatus = "success"
        message = f"{where} completed on {', '.join(c.site for c in record.components)}"
    else:
        status = "failed"
        detail = f": {record.message}" if record.message else ""
        message = f"{where} {record.state}{detail}"
    return CoAllocationEvent(
        status=status, message=message, job_id=record.job_id, record=record.as_json()
    )


def error_event(job_id: int, message: str) -> CoAllocationEvent:
    return CoAllocationEvent(status="error", message=message, job_id=job_id, record=None)


def checked_event(event: Any) -> CoAllocationEvent:
    """``event`` as a :class:`CoAllocationEvent`, or ``ValueError`` naming what is wrong."""
    return cast(CoAllocationEvent, validated_event(event, "CoAllocationTrigger", "job_id"))


def completed_record(event: Any) -> dict[str, Any]:
    """The job record of a successful event; any other event becomes an Airflow failure."""
    return record_of_success(event, "CoAllocationTrigger", "job_id", "co-allocated job")


def open_engine(
    grid_file: str | None, db_url: str | None, poll_interval: float, *, upgrade: bool = False
) -> KoalaEngine:
    """A KOALA engine scanning about every ``poll_interval`` seconds. Without
    ``upgrade`` the state DB must be migrated already (it is once the job exists), which
    keeps Alembic's CPU-bound work away from the triggerer."""
    install_connection_resolver()
    runtime = GridRuntime.open(grid_file, db_url, upgrade=upgrade)
    return KoalaEngine(
        runtime,
        ReplicaCatalog(runtime.store),
        KoalaParams(scan_interval_s=poll_interval),
        lease_s=max(LEASE_SCANS * poll_interval, MIN_LEASE_S),
    )


def close_engine(engine: KoalaEngine) -> None:
    # Another waiter may scan at once instead of waiting for the lease to expire.
    try:
        engine.release_lease()
    finally:
        engine.store.dispose()


def scan_and_status(engine: KoalaEngine, job_id: int) -> CoAllocationRecord:
    """One scan (skipped while another engine holds the lease) and the job as it is now."""
    engine.scan()
    return engine.status(job_id)


def wait_blocking(
    engine: KoalaEngine,
    job_id: int,
    poll_interval: float,
    max_retries: int = DEFAULT_MAX_RETRIES,
) -> CoAllocationEvent:
    """The non-deferrable twin of :meth:`CoAllocationTrigger.run` (same retries, event)."""
    try:
        outcome = poll_blocking(
            lambda: scan_and_status(engine, job_id), poll_interval, max_retries, "scans"
        )
    except GridError as exc:
        return error_event(job_id, f"gridcore: {exc}")
    if isinstance(outcome, str):
        return error_event(job_id, outcome)
    engine.release_lease()
    return event_for_record(outcome)


class CoAllocationTrigger(BaseTrigger):
    """Scan KOALA until co-allocated job ``job_id`` ends; yield exactly one event.

    ``run()`` calls ``KoalaEngine.scan`` and ``KoalaEngine.status`` every
    ``poll_interval`` seconds; transient ``SiteError``s are retried up to
    ``max_retries`` times in a row with jittered exponential back-off; anything else
    that goes wrong becomes an ``"error"`` event.

    A user killing the task cancels the job (and its started components) in
    :meth:`on_kill`, never in :meth:`cleanup`, which also runs on a triggerer restart,
    where the job must go on and another triggerer resumes waiting (and scanning).
    """

    def __init__(
        self,
        job_id: int,
        grid_file: str | None = None,
        db_url: str | None = None,
        poll_interval: float = 1.0,
        max_retries: int = DEFAULT_MAX_RETRIES,
    ) -> None:
        super().__init__()
        self.job_id = job_id
        self.grid_file = grid_file
        self.db_url = db_url
        self.poll_interval = poll_interval
        self.max_retries = max_retries
        self._engine: KoalaEngine | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_id": self.job_id,
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
            event = error_event(self.job_id, f"gridcore: {exc}")
        except Exception as exc:  # the event contract: errors are reported, never raised
            self.log.exception("waiting on co-allocated job %s failed", self.job_id)
            event = error_event(self.job_id, f"{type(exc).__name__}: {exc}")
        yield TriggerEvent(dict(event))

    async def _wait_until_finished(self) -> CoAllocationEvent:
        engine = await self._engine_once()
        outcome = await poll_async(
            lambda: scan_and_status(engine, self.job_id),
            self.poll_interval,
            self.max_retries,
            self.log,
            "scans",
        )
        if isinstance(outcome, str):
            return error_event(self.job_id, outcome)
        # Give the scan lease up now: other waiters should not sit out its expiry, and
        # cleanup() is not called everywhere (dag.test() skips it).
        await asyncio.to_thread(engine.release_lease)
        return event_for_record(outcome)

    async def _engine_once(self) -> KoalaEngine:
        if self._engine is None:
            self._engine = await asyncio.to_thread(
                open_engine, self.grid_file, self.db_url, self.poll_interval
            )
        return self._engine

    async def on_kill(self) -> None:
        engine = await self._engine_once()
        record = await asyncio.wait_for(
            asyncio.to_thread(engine.cancel, self.job_id), _CANCEL_TIMEOUT_S
        )
        self.log.info("cancelled co-allocated job %s: %s", record.job_id, record.state)

    async def cleanup(self) -> None:
        # Local resources only (the lease and the DB pool): the job itself must survive
        # a triggerer restart, see the class docstring.
        engine, self._engine = self._engine, None
        if engine is not None:
            await asyncio.to_thread(close_engine, engine)
