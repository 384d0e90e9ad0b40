"""What every gridcore operator shares: where gridcore is, how a wait ends, and the one
lifecycle of the operators that run jobs.

Operators stay thin: they validate, call a gridcore engine opened by
:class:`~operators.hooks.GridcoreHook`, and hand the waiting to a
:class:`~sensors.base.GridcoreTrigger`, deferring to it (the triggerer waits) or running
it inline (the worker waits): one wait loop and one event either way.

:class:`JobLifecycleOperator` is that lifecycle, written once: resume an earlier try's
job through the task state store or submit a new one, defer (or wait inline), complete
from the trigger's event, cancel on kill; gridcore's errors translated once
(:func:`translated`) and states compared through their enums. An operator on it gives
only how to plan, submit, read and cancel its kind of job, and the XCom result;
:class:`EngineJobOperator` gives the rest for a job of an engine of
:class:`~operators.hooks.EngineKind`.
"""

from __future__ import annotations

import enum
import time
from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from gridcore.api.dashboard import task_job_name
from gridcore.engine.submission import resources_at
from gridcore.errors import ConfigError, GridError, RequestError, StateError
from gridcore.model import GridSpec, JobResources
from gridcore.validation import RESOURCE_KEYS, check_resources
from gridcore_airflow.operators.hooks import EngineKind, GridcoreHook, ScanEngine
from gridcore_airflow.sensors.base import (
    DEFER_GRACE_S,
    EventContract,
    GridcoreTrigger,
    output_files_of,
    wait_inline,
)
from gridcore_airflow.sensors.triggers import ENGINE_WAITS, EngineTrigger

RESOURCE_FIELDS: tuple[str, ...] = RESOURCE_KEYS
"""The resource arguments, templated wherever an operator templates its other arguments."""


class GridcoreOperator(BaseOperator):
    """Base of gridcore's operators.

    :param grid_file: grid description; default: the connection's, else
        ``$GRIDCORE_GRID``, else the embedded local sites.
    :param db_url: state database URL; default: the connection's, else
        ``$GRIDCORE_DB_URL``, else SQLite under ``$GRIDCORE_HOME``.
    :param gridcore_conn_id: a ``gridcore`` Airflow connection giving the grid file and
        the state database (see :class:`~operators.hooks.GridcoreHook`).
    """

    def __init__(
        self,
        *,
        grid_file: str | None = None,
        db_url: str | None = None,
        gridcore_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.grid_file = grid_file
        self.db_url = db_url
        self.gridcore_conn_id = gridcore_conn_id

    def hook(self) -> GridcoreHook:
        return GridcoreHook(self.gridcore_conn_id, self.grid_file, self.db_url)

    def location(self) -> dict[str, str | None]:
        """Where gridcore is, as a trigger's constructor takes it (unresolved: the
        triggerer resolves the connection itself, so no secret is stored with it)."""
        return {
            "grid_file": self.grid_file,
            "db_url": self.db_url,
            "gridcore_conn_id": self.gridcore_conn_id,
        }

    def wait_for(
        self, context: Context, trigger: GridcoreTrigger[Any, Any], *, deferrable: bool
    ) -> Any:
        """Defer to ``trigger`` (the task resumes in ``execute_complete``), or run it to
        its event in this worker and finish the same way. An operator that waits
        defines ``execute_complete(context, event)``."""
        if deferrable:
            # Immune to Airflow 3.3.2's race between a trigger that fires at once (a short
            # job) and the executor's report of the deferring try (sensors.base).
            trigger.not_before = time.time() + DEFER_GRACE_S
            self.defer(trigger=trigger, method_name="execute_complete")
        return self.execute_complete(context, wait_inline(trigger))


class GridcoreJobOperator(GridcoreOperator):
    """Base of the operators whose work runs as site jobs: what every job asks of its
    site besides processors, named as everywhere in gridcore (and as sbatch names them),
    checked by :func:`gridcore.validation.check_resources`:

    :param time_limit: ``"90s"``, ``"10m"``, ``"2h"``, ``"1d"``, Slurm's ``"MM"``,
        ``"MM:SS"``, ``"HH:MM:SS"``, ``"D-HH"``, ``"D-HH:MM"``, ``"D-HH:MM:SS"``, or an
        integer of seconds. A rendered template is text: ``"90"`` is Slurm's 90
        MINUTES; write ``"90s"``.
    :param account: the account charged.
    :param qos: the quality of service.
    :param partition: the partition (over the site's ``partition``).
    :param memory: per node, ``"512M"``, ``"4G"``, ``"1T"`` or an integer of MiB.
    :param memory_per_cpu: per processor, same units; not with ``memory``.
    :param gpus: GPUs per job (an integer >= 0; a local site has none).
    :param constraint: a Slurm feature expression (``"intel&ib"``).

    Unset arguments are taken from the site's ``[sites.NAME.defaults]`` in the grid file,
    else the cluster's own defaults apply. What was sent is in the XCom result as
    ``resources`` (:meth:`gridcore.model.JobResources.as_json`: ``time_limit_s``,
    ``memory_mib``...).
    """

    def __init__(
        self,
        *,
        time_limit: str | int | None = None,
        account: str | None = None,
        qos: str | None = None,
        partition: str | None = None,
        memory: str | int | None = None,
        memory_per_cpu: str | int | None = None,
        gpus: int | str | None = None,
        constraint: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.time_limit = time_limit
        self.account = account
        self.qos = qos
        self.partition = partition
        self.memory = memory
        self.memory_per_cpu = memory_per_cpu
        self.gpus = gpus
        self.constraint = constraint

    def plan_resources(self) -> JobResources:
        """The (rendered) resource arguments, checked: RequestError naming the field
        (operators turn it into a failure without retries)."""
        raw = {key: getattr(self, key) for key in RESOURCE_KEYS}
        gpus = raw["gpus"]
        if isinstance(gpus, str) and gpus.strip().isascii() and gpus.strip().isdigit():
            raw["gpus"] = int(gpus.strip())  # a rendered template is text
        return check_resources(raw)

    def resources_sent(self, asked: JobResources, sites: Sequence[str]) -> list[dict[str, Any]]:
        """What a job asking ``asked`` was sent at each of ``sites``: over the site's
        defaults (:func:`gridcore.engine.submission.resources_at`, as the engine sent it),
        or ``asked`` alone if the grid cannot be read now (a warning says so)."""
        grid = self._grid()
        return [
            (
                resources_at(asked, grid.site(site))
                if grid is not None and site in grid.site_names
                else asked
            ).as_json()
            for site in sites
        ]

    def _grid(self) -> GridSpec | None:
        try:
            with self.hook().runtime(upgrade=False) as runtime:
                return runtime.grid
        except GridError as exc:
            self.log.warning("the grid's site defaults are not known: %s", exc)
            return None


class LifecycleRecord(Protocol):
    """What the lifecycle reads of a record: the selection's, or an engine's job's."""

    @property
    def finished(self) -> bool: ...

    @property
    def state(self) -> str: ...

    def as_json(self) -> dict[str, Any]: ...


class EngineRecord(LifecycleRecord, Protocol):
    """An engine's job record (``CoAllocationRecord``, ``ReservationRecord``)."""

    @property
    def job_id(self) -> int: ...


class NamedPlan(Protocol):
    """A validated plan; its ``name`` (``dag.task.map_index``) prefixes its failures."""

    @property
    def name(self) -> str: ...


H = TypeVar("H")  # what the operator opens: the runtime, an engine
R = TypeVar("R", bound=LifecycleRecord)
E = TypeVar("E", bound=ScanEngine)
ER = TypeVar("ER", bound=EngineRecord)
P = TypeVar("P", bound=NamedPlan)


class JobLifecycleOperator(GridcoreJobOperator, Generic[H, R, P]):
    """The lifecycle of an operator that runs one job (see the module doc).

    A subclass names its job in logs (``noun``), its key in the task state store
    (``state_key``) and the state whose result stands (``completed``, a member of the
    state's enum), and gives :meth:`plan`, :meth:`opened`, :meth:`submit`,
    :meth:`status`, :meth:`cancel`, :meth:`trigger`, :meth:`contract`, :meth:`ident_of`
    and :meth:`result`; it sets ``poll_interval`` and ``deferrable``.

    Tries of one task instance share the job through Airflow 3.3's task state store (the
    ``ResumableJobMixin`` convention): a retry reattaches to a job still live, returns
    the result of one that completed, and submits afresh only after one that failed or
    was cancelled. A cleared task instance follows the same rule; a new DAG run always
    starts new jobs.
    """

    noun: ClassVar[str]
    state_key: ClassVar[str]
    completed: ClassVar[enum.StrEnum]
    poll_interval: float
    deferrable: bool

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._ident: int | None = None  # the job this try runs or waits on (on_kill)

    def execute(self, context: Context) -> dict[str, Any]:
        plan = self.plan(context)
        state = state_store(context)
        # The first job on a fresh state DB creates its tables (upgrade).
        with translated(plan.name), self.opened(upgrade=True) as handle:
            record = self.resume_or_submit(handle, state, plan)
        self.attach(context, record)
        return self._result_or_wait(context, record)

    def _result_or_wait(self, context: Context, record: R) -> dict[str, Any]:
        """The result of this task instance's own job if it has finished (a completed
        one's stands), else the wait on it."""
        self._ident = self.ident_of(record)
        if record.finished:
            event = self.contract().event_for(record, self.earlier_output(record))
            return self.execute_complete(context, dict(event))
        result: dict[str, Any] = self.wait_for(
            context, self.trigger(self._ident), deferrable=self.defers()
        )
        return result

    def execute_complete(self, context: Context, event: Any = None) -> dict[str, Any]:
        """Map the trigger's event to the XCom result or an Airflow failure. Everything
        comes from the event (``dag.test()`` in Airflow 3.3.2 drops ``defer(kwargs=)``),
        once it is known to be about this task instance's own job: an event about another
        job is not taken for this one's (:meth:`_follow_own_job`)."""
        contract = self.contract()
        own, about = self.remembered(state_store(context)), contract.about(event)
        if own is not None and about is not None and about != own:
            return self._follow_own_job(context, own, about)
        record = contract.completed_record(event, self.log)
        return self.result(context, record, output_files_of(contract.checked_event(event)))

    def _follow_own_job(self, context: Context, own: int, about: int) -> dict[str, Any]:
        """The event that resumed this task instance is about ``about``, not its own job
        ``own`` (the task state store's): Airflow resumed it with another task
        instance's trigger event. Seen once in CI under heavy load (two runs' deferred
        task instances resumed by one trigger's event): the task succeeded with the other
        job's result while its own job, never waited on again, kept its processors
        claimed. Its own job decides: its result if it has finished, else the wait on it
        again."""
        self.log.warning(
            "the event that resumed this task is about %s %s, but its own is %s: the event is"
            " not taken for it; following %s %s",
            self.noun,
            about,
            own,
            self.noun,
            own,
        )
        name = job_name(self.dag_id, self.task_id, map_index(context))
        with translated(name), self.opened(upgrade=False) as handle:
            record = self.status(handle, own)
        return self._result_or_wait(context, record)

    def on_kill(self) -> None:
        # Runs on the worker only while execute() is still here (planning, submitting or
        # waiting without deferral); a deferred wait is cancelled by the trigger's on_kill.
        if self._ident is None:
            return
        try:
            with self.opened(upgrade=False) as handle:
                said = self.cancel(handle, self._ident)
            self.log.info("cancelled %s %s: %s", self.noun, self._ident, said)
        except GridError as exc:
            self.log.warning("could not cancel %s %s: %s", self.noun, self._ident, exc)

    # -- resume or submit -------------------------------------------------------------

    def resume_or_submit(self, handle: H, state: Any, plan: P) -> R:
        """The earlier try's job if it still counts (:meth:`resume`), else a new one."""
        resumed = self.resume(handle, state, plan)
        return resumed if resumed is not None else self.submit(handle, state, plan)

    def resume(self, handle: H, state: Any, plan: P) -> R | None:
        """The job an earlier try of this task instance submitted, if it still counts:
        live (reattach) or completed (its result stands). None when there is none, it
        failed or was cancelled, or the state database does not know it (a different one
        than the earlier try used): start afresh."""
        prior = self.remembered(state)
        if prior is None:
            return None
        try:
            record = self.status(handle, prior)
        except StateError:
            return None
        if record.finished and not self.succeeded(record):
            self.log.info(
                "%s %s of an earlier try %s; starting afresh", self.noun, prior, record.state
            )
            return None
        record = self.reattach(handle, plan, record)
        self.log.info("resuming %s %s: %s", self.noun, prior, self.describe(record))
        return record

    def remembered(self, state: Any) -> int | None:
        """The job this task instance's tries share (:meth:`remember`), if any."""
        prior = state.get(self.state_key) if state is not None else None
        return None if isinstance(prior, bool) or not isinstance(prior, int) else prior

    def remember(self, handle: H, state: Any, ident: int) -> None:
        """Put ``ident`` into the task state store, so a retry (a worker crash, or
        Airflow 3.3.2 failing a deferred task whose trigger fired early) reattaches
        instead of running the job twice; a job nobody could find again is cancelled
        (its claimed processors released)."""
        if state is None:
            return
        try:
            state.set(self.state_key, ident)
        except Exception:
            self.cancel(handle, ident)
            raise

    def succeeded(self, record: R) -> bool:
        return type(self.completed)(record.state) is self.completed

    # -- what an operator gives --------------------------------------------------------

    @abstractmethod
    def plan(self, context: Context) -> P:
        """The (rendered) arguments validated; AirflowFailException naming the field."""

    @abstractmethod
    def opened(self, *, upgrade: bool) -> AbstractContextManager[H]:
        """What jobs are submitted, read and cancelled through (closed on exit)."""

    @abstractmethod
    def submit(self, handle: H, state: Any, plan: P) -> R:
        """Submit a new job; :meth:`remember` it as soon as it has an id."""

    @abstractmethod
    def status(self, handle: H, ident: int) -> R:
        """The job's record; StateError if the state database does not know it."""

    @abstractmethod
    def cancel(self, handle: H, ident: int) -> str:
        """Cancel the job; what happened, for the log."""

    @abstractmethod
    def trigger(self, ident: int) -> GridcoreTrigger[Any, Any]:
        """The trigger that waits on job ``ident``."""

    @abstractmethod
    def contract(self) -> EventContract[Any]:
        """The event contract of :meth:`trigger` (also read without a trigger)."""

    @abstractmethod
    def ident_of(self, record: R) -> int:
        """The job's id, as the state store and the trigger know it."""

    @abstractmethod
    def result(
        self, context: Context, record: dict[str, Any], output: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The XCom result of a completed job, from its record (``as_json``) and the
        output files its event names (:func:`~sensors.base.output_files_of`)."""

    def reattach(self, handle: H, plan: P, record: R) -> R:
        """An earlier try's job that still counts, made ready to wait on."""
        return record

    def describe(self, record: R) -> str:
        """The job as the log says it on resuming."""
        return record.state

    def attach(self, context: Context, record: R) -> None:
        """Called once this try has its job (resumed or new)."""

    def earlier_output(self, record: R) -> list[dict[str, Any]]:
        """The output files of an earlier try's completed job, for its result."""
        return []

    def defers(self) -> bool:
        """Whether the wait is deferred to the triggerer (else it runs in this worker)."""
        return self.deferrable


class EngineJobOperator(JobLifecycleOperator[E, ER, P]):
    """A job of the engine ``engine``: opened through :meth:`GridcoreHook.engine`, waited
    on by :class:`~sensors.triggers.EngineTrigger`. A subclass gives :meth:`plan`,
    :meth:`submit` and :meth:`result`.

    The job's site jobs call the VJ center (connection ``extra.center_url`` or
    ``$GRIDCORE_CENTER_URL``); without one configured the center runs inside this
    worker, which then waits on the job itself instead of deferring.
    """

    engine: ClassVar[EngineKind]

    def opened(self, *, upgrade: bool) -> AbstractContextManager[E]:
        # the hook opens the engine of self.engine, which is the subclass's E
        opened = self.hook().engine(self.engine, self.poll_interval, upgrade=upgrade)
        return cast("AbstractContextManager[E]", opened)

    def status(self, handle: E, ident: int) -> ER:
        record: ER = handle.status(ident)
        return record

    def cancel(self, handle: E, ident: int) -> str:
        return f"{handle.cancel(ident).state}"

    def trigger(self, ident: int) -> EngineTrigger:
        where = self.location()
        return EngineTrigger(ident, self.engine, poll_interval=self.poll_interval, **where)

    def contract(self) -> EventContract[Any]:
        return ENGINE_WAITS[self.engine]

    def ident_of(self, record: ER) -> int:
        return record.job_id

    def defers(self) -> bool:
        # One embedded center lives only as long as this process: wait here.
        embedded = self.hook().center_is_embedded()
        if embedded and self.deferrable:
            self.log.info("no VJ center configured: it runs in this worker, which waits")
        return self.deferrable and not embedded


@contextmanager
def translated(name: str) -> Iterator[None]:
    """gridcore errors as Airflow failures: bad input (a malformed grid, an impossible
    request) fails without retries, anything else (a site, the state DB) may be retried."""
    try:
        yield
    except (ConfigError, RequestError) as exc:
        raise AirflowFailException(f"{name}: {exc}") from exc
    except GridError as exc:
        raise AirflowException(f"{name}: {exc}") from exc


def job_name(dag_id: str, task_id: str, map_index: int) -> str:
    """``dag.task`` (unmapped) or ``dag.task.map_index`` (mapped) with anything a batch
    system might mangle replaced by ``_`` (one formula,
    :func:`gridcore.api.dashboard.task_job_name`, which the Grid page uses to find a task
    instance's records)."""
    return task_job_name(dag_id, task_id, map_index)


def state_store(context: Mapping[str, Any] | None) -> Any:
    """Airflow 3.3's per-task-instance store (shared by all tries); None outside a task."""
    return context.get("task_state_store") if context else None


def map_index(context: Mapping[str, Any]) -> int:
    ti = context.get("ti") if context else None
    index = getattr(ti, "map_index", None)
    return index if isinstance(index, int) else -1
