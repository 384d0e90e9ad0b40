"""The one job lifecycle (operators/base.py) on a fake engine: every job operator resumes,
submits, translates errors, waits and cancels through it, so its decisions are tested
once here, table-driven, without sites, databases or sleeps. The operators' own tests
run it against the real engines."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from gridcore.engine.phases import JobPhase
from gridcore.errors import RequestError, SiteUnavailable, StateError
from gridcore_airflow.operators.base import JobLifecycleOperator
from gridcore_airflow.sensors.base import EventContract, GridcoreTrigger, Outcome
from tests.fakes import FakeTaskStateStore

KEY = "fake_job_id"


@dataclass(frozen=True)
class Record:
    job_id: int
    state: str

    @property
    def finished(self) -> bool:
        return JobPhase(self.state).finished

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Plan:
    name: str


class FakeEngine:
    """Jobs in memory; ``status_error`` is raised by every status read."""

    def __init__(self) -> None:
        self.jobs: dict[int, Record] = {}
        self.submitted: list[int] = []
        self.cancelled: list[int] = []
        self.status_error: Exception | None = None
        self.submit_error: Exception | None = None

    def submit(self) -> int:
        if self.submit_error is not None:
            raise self.submit_error
        job_id = len(self.jobs) + 1
        self.jobs[job_id] = Record(job_id, JobPhase.QUEUED)
        self.submitted.append(job_id)
        return job_id

    def status(self, job_id: int) -> Record:
        if self.status_error is not None:
            raise self.status_error
        if job_id not in self.jobs:
            raise StateError(f"no fake job {job_id} in the state database")
        return self.jobs[job_id]

    def cancel(self, job_id: int) -> Record:
        self.cancelled.append(job_id)
        self.jobs[job_id] = replace(self.jobs[job_id], state=JobPhase.CANCELLED)
        return self.jobs[job_id]


def _outcome(record: Record) -> Outcome:
    done = JobPhase(record.state) is JobPhase.COMPLETED
    return Outcome(record.job_id, done, f"fake job {record.job_id} {record.state}")


CONTRACT: EventContract[Record] = EventContract("fake job", "FakeTrigger", _outcome)


class FakeTrigger(GridcoreTrigger[FakeEngine, Record]):
    """Polls the fake engine; each poll completes the job (the inline wait)."""

    contract = CONTRACT
    id_field = "job_id"

    def __init__(self, job_id: int, engine: FakeEngine) -> None:
        super().__init__(job_id, poll_interval=0.0)
        self.engine = engine

    def _connect(self) -> FakeEngine:
        return self.engine

    def _poll(self, handle: FakeEngine) -> Record:
        handle.jobs[self.ident] = replace(handle.jobs[self.ident], state=JobPhase.COMPLETED)
        return handle.status(self.ident)

    def _cancel(self, handle: FakeEngine) -> str:
        return str(handle.cancel(self.ident).state)

    def _close(self, handle: FakeEngine) -> None:
        pass

    def _output_jobs(self, record: Record) -> list[Any]:
        return []

    def _output_files(self, handle: FakeEngine, site: str, job_id: str) -> Any:
        raise AssertionError("no output to read")


class FakeJobOperator(JobLifecycleOperator[FakeEngine, Record, Plan]):
    """A job operator on the lifecycle: only the specifics, as a new one would give."""

    noun = "fake job"
    state_key = KEY
    completed = JobPhase.COMPLETED

    def __init__(self, *, engine: FakeEngine, deferrable: bool = True, **kwargs: Any) -> None:
        super().__init__(task_id="fake", **kwargs)
        self.engine = engine
        self.poll_interval = 0.0
        self.deferrable = deferrable

    def plan(self, context: Any) -> Plan:
        return Plan("dag.fake.-1")

    @contextmanager
    def opened(self, *, upgrade: bool) -> Iterator[FakeEngine]:
        yield self.engine

    def submit(self, handle: FakeEngine, state: Any, plan: Plan) -> Record:
        job_id = handle.submit()
        self.remember(handle, state, job_id)
        return handle.status(job_id)

    def status(self, handle: FakeEngine, ident: int) -> Record:
        return handle.status(ident)

    def cancel(self, handle: FakeEngine, ident: int) -> str:
        return str(handle.cancel(ident).state)

    def trigger(self, ident: int) -> FakeTrigger:
        return FakeTrigger(ident, self.engine)

    def contract(self) -> EventContract[Any]:
        return CONTRACT

    def ident_of(self, record: Record) -> int:
        return record.job_id

    def result(
        self, context: Any, record: dict[str, Any], output: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return {"job_id": record["job_id"], "state": record["state"]}


def deferred_job(op: FakeJobOperator, state: FakeTaskStateStore) -> int:
    with pytest.raises(TaskDeferred) as exc:
        op.execute({"task_state_store": state})  # type: ignore[arg-type]
    assert exc.value.method_name == "execute_complete"
    trigger = exc.value.trigger
    assert isinstance(trigger, FakeTrigger)
    return trigger.ident


def test_a_first_try_submits_remembers_the_job_and_defers() -> None:
    engine, state = FakeEngine(), FakeTaskStateStore()

    job_id = deferred_job(FakeJobOperator(engine=engine), state)

    assert engine.submitted == [job_id]
    assert state.values == {KEY: job_id}


@pytest.mark.parametrize(
    ("earlier", "submits_afresh"),
    [
        pytest.param(JobPhase.QUEUED, False, id="live: the retry reattaches"),
        pytest.param(JobPhase.RUNNING, False, id="running: the retry reattaches"),
        pytest.param(JobPhase.FAILED, True, id="failed: the retry submits afresh"),
        pytest.param(JobPhase.CANCELLED, True, id="cancelled: the retry submits afresh"),
    ],
)
def test_a_retry_resumes_a_job_that_still_counts(earlier: JobPhase, submits_afresh: bool) -> None:
    engine, state = FakeEngine(), FakeTaskStateStore()
    first = deferred_job(FakeJobOperator(engine=engine), state)
    engine.jobs[first] = replace(engine.jobs[first], state=earlier)

    retry = deferred_job(FakeJobOperator(engine=engine), state)

    assert (retry != first) is submits_afresh
    assert len(engine.submitted) == (2 if submits_afresh else 1)
    assert state.values == {KEY: retry}


def test_a_retry_after_a_completed_job_returns_its_result_without_waiting() -> None:
    engine, state = FakeEngine(), FakeTaskStateStore()
    first = deferred_job(FakeJobOperator(engine=engine), state)
    engine.jobs[first] = replace(engine.jobs[first], state=JobPhase.COMPLETED)

    result = FakeJobOperator(engine=engine).execute({"task_state_store": state})  # type: ignore[arg-type]

    assert result == {"job_id": first, "state": "completed"}
    assert engine.submitted == [first]


def test_a_job_the_state_database_does_not_know_is_submitted_afresh() -> None:
    engine, state = FakeEngine(), FakeTaskStateStore()
    state.set(KEY, 99)  # an earlier try's job, in another state database

    assert deferred_job(FakeJobOperator(engine=engine), state) == 1
    assert engine.submitted == [1]


def test_an_unreadable_earlier_job_fails_the_try_for_a_retry_and_submits_nothing() -> None:
    # Only "unknown to this database" means afresh: a site or database error might hide
    # a live job, and submitting again would run it twice.
    engine, state = FakeEngine(), FakeTaskStateStore()
    first = deferred_job(FakeJobOperator(engine=engine), state)
    engine.status_error = SiteUnavailable("alpha", "connection refused")

    with pytest.raises(AirflowException, match=r"^dag\.fake\.-1: site alpha: connection") as exc:
        FakeJobOperator(engine=engine).execute({"task_state_store": state})  # type: ignore[arg-type]

    assert not isinstance(exc.value, AirflowFailException)
    assert engine.submitted == [first]


def test_errors_are_translated_once_bad_input_without_retries() -> None:
    engine = FakeEngine()
    engine.submit_error = RequestError("processors: 9 > 8 on every site")
    with pytest.raises(AirflowFailException, match=r"^dag\.fake\.-1: processors: 9 > 8"):
        FakeJobOperator(engine=engine).execute({})  # type: ignore[arg-type]

    engine.submit_error = StateError("database is locked")
    with pytest.raises(AirflowException, match=r"^dag\.fake\.-1: database is locked") as exc:
        FakeJobOperator(engine=engine).execute({})  # type: ignore[arg-type]
    assert not isinstance(exc.value, AirflowFailException)


def test_a_job_that_cannot_be_remembered_is_cancelled() -> None:
    class BrokenStore(FakeTaskStateStore):
        def set(self, key: str, value: Any, *, retention: Any = None) -> None:
            raise OSError("task state store unreachable")

    engine = FakeEngine()
    with pytest.raises(OSError, match="unreachable"):
        FakeJobOperator(engine=engine).execute({"task_state_store": BrokenStore()})  # type: ignore[arg-type]

    assert engine.cancelled == engine.submitted == [1]


def test_without_deferral_the_worker_waits_through_the_same_trigger() -> None:
    engine = FakeEngine()

    result = FakeJobOperator(engine=engine, deferrable=False).execute({})  # type: ignore[arg-type]

    assert result == {"job_id": 1, "state": "completed"}


def test_execute_complete_maps_a_failed_event_to_a_failure_naming_the_job() -> None:
    failed = CONTRACT.event_for(Record(4, JobPhase.FAILED))
    with pytest.raises(AirflowException, match="fake job 4: failed: fake job 4 failed"):
        FakeJobOperator(engine=FakeEngine()).execute_complete({}, dict(failed))  # type: ignore[arg-type]


def test_on_kill_cancels_this_tries_job(capsys: pytest.CaptureFixture[str]) -> None:
    engine = FakeEngine()
    op = FakeJobOperator(engine=engine)
    job_id = deferred_job(op, FakeTaskStateStore())

    op.on_kill()

    assert engine.cancelled == [job_id]
    assert f"cancelled fake job {job_id}: cancelled" in capsys.readouterr().out  # the task log
    FakeJobOperator(engine=engine).on_kill()  # a try that has no job yet cancels nothing
    assert engine.cancelled == [job_id]


@pytest.mark.parametrize(
    ("own_state", "outcome"),
    [
        pytest.param(JobPhase.QUEUED, "waits", id="own job live: the wait on it again"),
        pytest.param(JobPhase.COMPLETED, "result", id="own job completed: its result"),
        pytest.param(JobPhase.FAILED, "fails", id="own job failed: the task fails"),
    ],
)
def test_an_event_about_another_job_is_not_taken_for_this_task_instances(
    own_state: JobPhase, outcome: str
) -> None:
    # CI, under load: two runs' deferred task instances were resumed by one trigger's
    # event; the other one succeeded with this one's job's result, and its own job was
    # never waited on again (its processors stayed claimed).
    engine = FakeEngine()
    theirs_state, ours_state = FakeTaskStateStore(), FakeTaskStateStore()
    theirs = deferred_job(FakeJobOperator(engine=engine), theirs_state)
    ours = deferred_job(FakeJobOperator(engine=engine), ours_state)
    engine.jobs[theirs] = replace(engine.jobs[theirs], state=JobPhase.COMPLETED)
    engine.jobs[ours] = replace(engine.jobs[ours], state=own_state)
    their_event = dict(CONTRACT.event_for(engine.jobs[theirs]))
    op = FakeJobOperator(engine=engine)
    context = {"task_state_store": ours_state}

    if outcome == "waits":
        with pytest.raises(TaskDeferred) as deferred:
            op.execute_complete(context, their_event)  # type: ignore[arg-type]
        assert isinstance(deferred.value.trigger, FakeTrigger)
        assert deferred.value.trigger.ident == ours
        assert deferred.value.method_name == "execute_complete"
    elif outcome == "result":
        assert op.execute_complete(context, their_event) == {  # type: ignore[arg-type]
            "job_id": ours,
            "state": "completed",
        }
    else:
        with pytest.raises(AirflowException, match=f"fake job {ours}: failed"):
            op.execute_complete(context, their_event)  # type: ignore[arg-type]
    assert engine.submitted == [theirs, ours]  # nothing submitted again
    # its own job's event is taken as it is; so is any event without a remembered job
    # (dag.test() has no task state store)
    own_event = dict(CONTRACT.event_for(replace(engine.jobs[ours], state=JobPhase.COMPLETED)))
    assert op.execute_complete(context, own_event)["job_id"] == ours  # type: ignore[arg-type]
    assert FakeJobOperator(engine=engine).execute_complete({}, their_event)["job_id"] == theirs  # type: ignore[arg-type]
