"""The one trigger base every gridcore trigger subclasses, and the one event contract.

A gridcore trigger waits on one thing gridcore runs (a selection's site job, a job of
one of the engines): it opens an engine once through
:class:`~gridcore_airflow.operators.hooks.GridcoreHook` (:meth:`GridcoreTrigger._connect`),
calls a poll function on it until the record it returns is finished, and turns that
record into exactly one :class:`GridcoreEvent`, as its :class:`EventContract` says.
The base owns everything else, once: the wait loop, bounded retries of transient
``SiteError``s with jittered exponential back-off, errors reported as an ``"error"``
event instead of raised out of ``run()``, ``serialize()``, ``on_kill()`` (cancel) and
``cleanup()`` (local resources only).

The job's own output goes into the task log as it runs: after every poll the base
copies the new lines of the site jobs a subclass names (:meth:`GridcoreTrigger._output_jobs`)
with ``self.log.info`` (:mod:`gridcore.sites.output`: bounded, prefixed by component and
site where there are several), and the event names their files (``output``), so
``execute_complete`` can log a failed job's stderr tail (:func:`completed_record`) and
put the files into the XCom result. A restarted triggerer shows the output again from
its start (the offsets are not persisted; see :mod:`gridcore.sites.output`).

The engines are synchronous (SQLAlchemy, HTTP, file reads): every call to them runs in a
worker thread via ``asyncio.to_thread``, so the triggerer's event loop is never blocked.
Triggers live in this installed package: the triggerer never loads DAG bundles.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import random
import time
from abc import abstractmethod
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, NamedTuple, Protocol, TypedDict, TypeVar

from airflow.sdk import TaskInstanceState
from airflow.sdk.exceptions import AirflowException
from airflow.triggers.base import BaseTrigger, TriggerEvent

from gridcore.errors import CredentialRejected, GridError, SiteError
from gridcore.sites.output import JobOutputs, OutputFiles, SiteJob, failure_tails
from gridcore_airflow.operators.hooks import GridcoreHook, GridLocation


class EventStatus(enum.StrEnum):
    """How a wait ended: the job succeeded; it failed or was cancelled; or the wait
    itself failed (gridcore or the site could not be read)."""

    SUCCESS = "success"
    FAILED = "failed"
    ERROR = "error"


# Transient site errors (slurmrestd restarting, a network blip) are retried this many
# times in a row before the trigger gives up with an "error" event.
DEFAULT_MAX_RETRIES = 5
_BACKOFF_BASE_S = 1.0
_BACKOFF_CAP_S = 30.0
DEFER_GRACE_S = 10.0
"""A deferred wait's event comes no sooner than this after the deferral. Airflow 3.3.2
fails a task whose trigger fired before the scheduler processed the executor's report
that the deferring try ended ("finished with state success, but the task instance's
state attribute is queued": apache/airflow#67287, #72716); that report takes the
executor's next sync and the scheduler's next loop. Measured in docs/operators.md."""
UNKNOWN_STATE: object = object()
"""A task instance state that could not be read."""

# on_kill() gets a bounded time from the triggerer ([triggerer] on_kill_timeout, 30 s);
# stay inside it so a slow site cannot leave the cancel half done unnoticed.
_CANCEL_TIMEOUT_S = 20.0


class _RequiredEventKeys(TypedDict):
    status: str  # an EventStatus value (plain JSON, as the triggerer stores it)
    message: str
    subject: str  # what was waited on: "selection", "co-allocated job", ...
    id: int  # its id in gridcore's state DB (a selection id, a KOALA job id, ...)
    record: dict[str, Any] | None  # the finished record (as_json); None for "error"


class GridcoreEvent(_RequiredEventKeys, total=False):
    """The one event every gridcore trigger yields: the contract with the
    ``execute_complete`` of the operators and sensors that deferred to it.

    ``output``: the site jobs whose output the trigger copied into the task log, each
    ``{"site", "job_id", "label", "failed", "stdout", "stderr", "shown"}``
    (:meth:`gridcore.sites.output.JobOutputs.as_json`). Every event has it; an event of
    a trigger from before it existed may not, so it is not required."""

    output: list[dict[str, Any]]


REQUIRED_EVENT_KEYS = frozenset(GridcoreEvent.__required_keys__)
EVENT_KEYS = frozenset(GridcoreEvent.__annotations__)


class FinishedRecord(Protocol):
    """What a poll function returns: gridcore's ``JobRecord``, ``CoAllocationRecord``."""

    @property
    def finished(self) -> bool: ...

    def as_json(self) -> dict[str, Any]: ...


class Outcome(NamedTuple):
    """A finished record, read by a trigger: its id, whether it succeeded, and the
    message a person reads in the task log or the failure."""

    id: int
    succeeded: bool
    message: str


H = TypeVar("H")  # the engine a trigger opens once and polls (GridRuntime, an engine)
R = TypeVar("R", bound=FinishedRecord)


@dataclass(frozen=True)
class EventContract(Generic[R]):
    """The event of one kind of wait: what is waited on (``subject``: "selection",
    "co-allocated job", ...), how a finished record ends the wait (``outcome``), and the
    trigger's name for messages. The trigger yields events through it and the operators
    and sensors that deferred read them back through the same one."""

    subject: str
    trigger: str
    outcome: Callable[[R], Outcome]

    def event_for(self, record: R, output: Sequence[dict[str, Any]] = ()) -> GridcoreEvent:
        """The event for a finished record (also for the non-deferrable code paths);
        ``output``: the site jobs' files, as :meth:`JobOutputs.as_json` gives them."""
        ident, succeeded, message = self.outcome(record)
        return GridcoreEvent(
            status=(EventStatus.SUCCESS if succeeded else EventStatus.FAILED).value,
            message=message,
            subject=self.subject,
            id=ident,
            record=record.as_json(),
            output=list(output),
        )

    def error_event(
        self, ident: int, message: str, output: Sequence[dict[str, Any]] = ()
    ) -> GridcoreEvent:
        return GridcoreEvent(
            status=EventStatus.ERROR.value,
            message=message,
            subject=self.subject,
            id=ident,
            record=None,
            output=list(output),
        )

    def checked_event(self, event: Any) -> GridcoreEvent:
        """``event`` as a :class:`GridcoreEvent` of this contract, or ``ValueError``
        naming what is wrong (a trigger from another version, a hand-made event)."""
        return checked_event(event, self.subject, self.trigger)

    def about(self, event: Any) -> int | None:
        """The id ``event`` is about; None for a malformed one (whose reason
        :meth:`completed_record` gives as the task's failure)."""
        try:
            return self.checked_event(event)["id"]
        except ValueError:
            return None

    def completed_record(self, event: Any, log: Any = None) -> dict[str, Any]:
        """The record of a successful event; any other event becomes the Airflow failure
        that ``execute_complete`` of the operators and sensors raise, after the stderr
        tail of the job(s) that failed is written to ``log`` (the task's)."""
        return completed_record(event, self.subject, self.trigger, log)


class GridcoreTrigger(BaseTrigger, Generic[H, R]):
    """Wait until the contract's subject with id ``ident`` is finished; yield exactly one
    event.

    Subclasses give their :class:`EventContract` (``contract``: a class attribute, or set
    per instance by a trigger parametrized by an engine), the constructor argument
    holding the id (``id_field``) and the synchronous pieces: :meth:`_connect`,
    :meth:`_poll`, :meth:`_cancel`, :meth:`_close` (and :meth:`_finished` if the engine
    holds something to give up as soon as the wait ends).

    A user killing the task (mark failed/success, clear) cancels the remote work in
    :meth:`on_kill`, NOT in :meth:`cleanup`: Airflow calls ``cleanup()`` on every exit,
    including a triggerer restart or redistribution, where the work must go on and
    another triggerer resumes waiting on it.
    """

    contract: EventContract[Any]
    id_field: ClassVar[str]  # the constructor argument (and attribute) holding the id
    default_poll_interval: ClassVar[float] = 2.0
    poll_noun: ClassVar[str] = "polls"

    def __init__(
        self,
        ident: int | None = None,
        grid_file: str | None = None,
        db_url: str | None = None,
        poll_interval: float | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        gridcore_conn_id: str | None = None,
        not_before: float | None = None,
        **named_id: int,
    ) -> None:
        """The id comes first, or by its name (``selection_id=7``, as ``serialize`` gives
        it); where gridcore is: :class:`~operators.hooks.GridLocation`. ``not_before``
        (epoch seconds): the event is not yielded earlier (see :data:`DEFER_GRACE_S`)."""
        super().__init__()
        if named_id and (ident is not None or set(named_id) != {self.id_field}):
            raise TypeError(f"{type(self).__name__}: unexpected {sorted(named_id)}")
        ident = named_id.get(self.id_field, ident)
        if ident is None:
            raise TypeError(f"{type(self).__name__} needs {self.id_field}")
        self.ident = int(ident)
        setattr(self, self.id_field, self.ident)
        self.location = GridLocation(grid_file, db_url, gridcore_conn_id)
        self.poll_interval = self.default_poll_interval if poll_interval is None else poll_interval
        self.max_retries = max_retries
        self.not_before = not_before
        self._handle: H | None = None
        self._outputs: JobOutputs | None = None
        self._last_note = ""

    def hook(self) -> GridcoreHook:
        """The hook this trigger opens gridcore through (resolved in the triggerer)."""
        where = self.location
        return GridcoreHook(where.conn_id, where.grid_file, where.db_url)

    @property
    def grid_file(self) -> str | None:
        return self.location.grid_file

    @property
    def db_url(self) -> str | None:
        return self.location.db_url

    # -- what a subclass gives (synchronous: each runs in a worker thread) -------------

    @abstractmethod
    def _connect(self) -> H:
        """Open the engine this trigger polls (the seam tests replace)."""

    @abstractmethod
    def _poll(self, handle: H) -> R:
        """One poll: the record as it is now. ``SiteError`` means try again later."""

    @abstractmethod
    def _cancel(self, handle: H) -> str:
        """Cancel the remote work; what happened, for the log."""

    @abstractmethod
    def _close(self, handle: H) -> None:
        """Release local resources (connection pools, leases), never the remote work."""

    def _finished(self, handle: H) -> None:
        """Called once the record is finished, before the event is yielded."""

    @abstractmethod
    def _output_jobs(self, record: R) -> Sequence[SiteJob]:
        """The site jobs of ``record`` whose output goes into the task log."""

    @abstractmethod
    def _output_files(self, handle: H, site: str, job_id: str) -> OutputFiles:
        """Where a site job of :meth:`_output_jobs` writes its output."""

    # -- Airflow's trigger interface ----------------------------------------------------

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                self.id_field: self.ident,
                "grid_file": self.location.grid_file,
                "db_url": self.location.db_url,
                "poll_interval": self.poll_interval,
                "max_retries": self.max_retries,
                "gridcore_conn_id": self.location.conn_id,
                "not_before": self.not_before,
            },
        )

    async def run(self) -> AsyncGenerator[TriggerEvent, None]:
        try:
            event = await self._wait_until_finished()
        except GridError as exc:
            event = self.contract.error_event(self.ident, f"gridcore: {exc}", self._output_so_far())
        except Exception as exc:  # the event contract: errors are reported, never raised
            self.log.exception("waiting on %s %s failed", self.contract.subject, self.ident)
            message = f"{type(exc).__name__}: {exc}"
            event = self.contract.error_event(self.ident, message, self._output_so_far())
        early = (self.not_before or 0.0) - time.time()
        if early > 0 and self.trigger_id is not None:
            # A triggerer runs it (``dag.test()`` and the inline wait have no executor):
            # the executor may not yet have told the scheduler that the deferring try
            # ended, and an event now would make Airflow 3.3 fail the task.
            await asyncio.sleep(early)
        yield TriggerEvent(dict(event))

    async def on_kill(self) -> None:
        # Airflow 3.3.2 calls on_kill for a user's action on the task (mark failed or
        # success, clear) AND when a triggerer drops a trigger it no longer holds (moved
        # to another triggerer; another Airflow process's trigger loop took it): only
        # the first may cancel the job, so the task instance's own state decides.
        state = await self._task_state()
        subject, ident = self.contract.subject, self.ident
        if state is UNKNOWN_STATE or state == TaskInstanceState.DEFERRED:
            why = "still deferred" if state is not UNKNOWN_STATE else "state unknown"
            self.log.warning(
                "trigger of %s %s stopped, but not by a user's action (the task instance is"
                " %s: the trigger moved or was cleaned up): the job is left running",
                subject,
                ident,
                why,
            )
            return
        handle = await self._handle_once()
        said = await asyncio.wait_for(asyncio.to_thread(self._cancel, handle), _CANCEL_TIMEOUT_S)
        self.log.info(
            # A task instance success or failed now was set so by a user, or by the task's
            # own end in another Airflow process (``dags test`` beside a scheduler runs the
            # same task twice): either may cancel; the job's state says what it did.
            "cancel of %s %s asked: the task instance is %s now (a user's action, or the"
            " task ended in another Airflow process): %s",
            subject,
            ident,
            state or "cleared",
            said,
        )

    async def _task_state(self) -> str | object | None:
        """The state of this trigger's task instance (None: cleared; absent from the
        answer: gone, as ``"removed"``), asked of Airflow's execution API through the
        triggerer; :data:`UNKNOWN_STATE` when it cannot be asked (no task instance here,
        or the call failed): a job is never cancelled on a guess."""
        ti = getattr(self, "task_instance", None)
        if ti is None:
            return UNKNOWN_STATE
        try:
            return await asyncio.to_thread(task_instance_state, ti)
        except Exception as exc:
            self.log.warning("the task instance's state cannot be read: %s", exc)
            return UNKNOWN_STATE

    async def cleanup(self) -> None:
        # Local resources only: the remote work must survive a triggerer restart.
        handle, self._handle = self._handle, None
        if handle is not None:
            await asyncio.to_thread(self._close, handle)

    # -- the one wait loop ----------------------------------------------------------------

    async def _wait_until_finished(self) -> GridcoreEvent:
        handle = await self._handle_once()
        failures = 0
        while True:
            try:
                record = await asyncio.to_thread(self._poll, handle)
            except CredentialRejected as exc:
                # refused even renewed once: waiting will not mend it, and it is not the
                # site's fault (gridcore.sites.slurm)
                return self.contract.error_event(
                    self.ident, f"gridcore: {exc}", self._output_so_far()
                )
            except SiteError as exc:
                failures += 1
                if failures > self.max_retries:
                    return self.contract.error_event(
                        self.ident,
                        f"gave up after {failures} failed {self.poll_noun} in a row: {exc}",
                        self._output_so_far(),
                    )
                delay = backoff_delay(failures)
                self.log.warning(
                    "%s failed (%s); retry %d in %.1f s", self.poll_noun, exc, failures, delay
                )
                await asyncio.sleep(delay)
                continue
            failures = 0
            self._say_progress(record)
            await self._copy_output(handle, record)
            if record.finished:
                await asyncio.to_thread(self._finished, handle)
                return self.contract.event_for(record, self._output_so_far())
            await asyncio.sleep(self.poll_interval)

    def _progress_note(self, record: R) -> str:
        """What the site says of the wait that a person should read (e.g. "requeued by
        Slurm: NODE_FAIL"); empty when there is nothing to say."""
        return ""

    def _say_progress(self, record: R) -> None:
        note = self._progress_note(record)
        if note and note != self._last_note:
            self.log.info("%s %s: %s", self.contract.subject, self.ident, note)
        self._last_note = note

    async def _copy_output(self, handle: H, record: R) -> None:
        """The new output lines of the record's site jobs into the task log; the file
        reads run in a worker thread. Best effort: whatever goes wrong reading output
        is logged, and never ends the wait nor changes its event."""
        jobs = self._output_jobs(record)
        if not jobs:
            return
        if self._outputs is None:
            self._outputs = JobOutputs(functools.partial(self._output_files, handle))
        try:
            lines = await asyncio.to_thread(self._outputs.read, jobs)
        except Exception as exc:
            self.log.warning(
                "cannot copy the output of %s %s: %r", self.contract.subject, self.ident, exc
            )
            return
        for line in lines:
            self.log.info("%s", line)

    def _output_so_far(self) -> list[dict[str, Any]]:
        return self._outputs.as_json() if self._outputs is not None else []

    async def _handle_once(self) -> H:
        if self._handle is None:
            self._handle = await asyncio.to_thread(self._connect)
        return self._handle


def task_instance_state(ti: Any) -> str | None:
    """The state Airflow holds for the task instance ``ti`` (a triggerer's
    ``task_instance``), through the execution API (the seam tests replace)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    states = RuntimeTaskInstance.get_task_states(
        dag_id=ti.dag_id, map_index=ti.map_index, task_ids=[ti.task_id], run_ids=[ti.run_id]
    )
    key = ti.task_id if ti.map_index is None or ti.map_index < 0 else f"{ti.task_id}_{ti.map_index}"
    found: str | None = states.get(ti.run_id, {}).get(key, "removed")
    return found


def wait_inline(trigger: GridcoreTrigger[Any, Any]) -> dict[str, Any]:
    """The non-deferrable path: run ``trigger`` to its one event in this (worker) thread,
    so waiting without deferral has the same loop, retries and event as deferring."""

    async def first_event() -> dict[str, Any]:
        events = trigger.run()
        try:
            event = await anext(events)
        finally:
            await events.aclose()
            await trigger.cleanup()
        payload: dict[str, Any] = event.payload
        return payload

    return asyncio.run(first_event())


def checked_event(event: Any, subject: str, trigger: str) -> GridcoreEvent:
    """``event`` checked against :class:`GridcoreEvent` and ``subject``; ``ValueError``
    naming what is wrong."""
    if not isinstance(event, dict):
        raise ValueError(f"expected a {trigger} event (a dict), got {type(event).__name__}")
    missing = sorted(REQUIRED_EVENT_KEYS - set(event))
    if missing:
        raise ValueError(f"{trigger} event lacks key(s) {missing}: {event!r}")
    if event["subject"] != subject:
        raise ValueError(f"{trigger} event is about a {event['subject']!r}, not a {subject!r}")
    if event["status"] not in tuple(EventStatus):
        raise ValueError(f"{trigger} event has an unknown status {event['status']!r}")
    if event["status"] == EventStatus.SUCCESS and not isinstance(event["record"], dict):
        raise ValueError(f"{trigger} success event has no record: {event!r}")
    output = event.get("output")
    if output is not None and not (
        isinstance(output, list) and all(isinstance(entry, dict) for entry in output)
    ):
        raise ValueError(f"{trigger} event has a malformed output {output!r}")
    return GridcoreEvent(
        status=event["status"],
        message=str(event["message"]),
        subject=subject,
        id=int(event["id"]),
        record=event["record"],
        output=list(output or []),
    )


def completed_record(event: Any, subject: str, trigger: str, log: Any = None) -> dict[str, Any]:
    """The record of a successful event; a malformed event, a failure or an error
    becomes an ``AirflowException`` (the task fails, and may be retried). Before that,
    the stderr tail of each failed site job in the event's ``output`` goes to ``log``:
    the task's log ends with it."""
    try:
        checked = checked_event(event, subject, trigger)
    except ValueError as exc:
        raise AirflowException(str(exc)) from exc
    if checked["status"] != EventStatus.SUCCESS or checked["record"] is None:
        if log is not None:
            for line in failure_tails(checked.get("output", [])):
                log.error("%s", line)
        raise AirflowException(
            f"{subject} {checked['id']}: {checked['status']}: {checked['message']}"
        )
    record = checked["record"]
    usage = record.get("usage") if isinstance(record, dict) else None
    if log is not None and isinstance(usage, dict):
        log.info("%s", usage_line(usage))
    return record


def usage_line(usage: dict[str, Any]) -> str:
    """What a finished job used, from the site's accounting, as ``seff`` would say it."""
    parts = [f"elapsed {usage.get('elapsed_s', 0):g} s"]
    parts.append(f"CPU time {usage.get('cpu_time_s', 0):g} s on {usage.get('cpus', 0)} CPU(s)")
    efficiency = usage.get("cpu_efficiency")
    if isinstance(efficiency, int | float):
        parts.append(f"CPU efficiency {efficiency:.1%}")
    rss = usage.get("max_rss_bytes")
    if isinstance(rss, int):
        parts.append(f"max RSS {rss / 2**20:.1f} MiB")
    return "job used (site accounting): " + ", ".join(parts)


def output_files_of(event: GridcoreEvent) -> list[dict[str, Any]]:
    """The files of each site job an event names, for XCom results: ``label``,
    ``site``, ``job_id``, ``stdout``, ``stderr``."""
    keys = ("label", "site", "job_id", "stdout", "stderr")
    return [{key: entry.get(key) for key in keys} for entry in event.get("output", [])]


def backoff_delay(attempt: int, rng: random.Random | None = None) -> float:
    """Jittered exponential back-off for the ``attempt``-th failure in a row: uniform in
    [0.1 c, c] with c = min(cap, base * 2**(attempt - 1)), so retries of many triggers
    that failed together (one site went down) spread out instead of arriving at once."""
    ceiling = min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2 ** max(0, attempt - 1))
    return (rng or random).uniform(0.1 * ceiling, ceiling)
