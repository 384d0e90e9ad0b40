"""SelectSitesOperator and SiteJobOperator(selection_id=...) against a real GridRuntime
(temp SQLite + the embedded local sites): a burst decided in one call, a retry that
returns the same selections, bad input refused naming the member and field with nothing
written, and members that submit exactly the selection made for them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
from sqlalchemy import func, inspect, select

from gridcore.engine.runtime import GridRuntime, JobRecord
from gridcore.state import capacity
from gridcore.state.schema import selections
from gridcore.state.store import open_store
from gridcore_airflow.operators.base import job_name
from gridcore_airflow.operators.select_sites import (
    RESULT_KEYS,
    SELECTIONS_KEY,
    SelectSitesOperator,
    with_selections,
)
from gridcore_airflow.operators.site_job import SELECTION_KEY, SiteJobOperator
from gridcore_airflow.sensors.triggers import SiteJobTrigger
from tests.capacity_checks import assert_capacity_invariant
from tests.fakes import FakeTaskStateStore

WAIT_S = 30.0
DAG = "adhoc_airflow"  # the dag id of an operator outside a DAG


@pytest.fixture
def runtime(db_url: str) -> Iterator[GridRuntime]:
    opened = GridRuntime.open(db_url=db_url)
    try:
        yield opened
    finally:
        opened.store.dispose()


def select_op(members: Any, **kwargs: Any) -> SelectSitesOperator:
    return SelectSitesOperator(task_id="select_sites", members=members, **kwargs)


def member_op(selection_id: Any, **kwargs: Any) -> SiteJobOperator:
    defaults: dict[str, Any] = {
        "task_id": "member",
        "command": "true",
        "processors": 2,
        "runtime_s": 1,
        "poll_interval": 0.05,
        "selection_id": selection_id,
    }
    return SiteJobOperator(**{**defaults, **kwargs})


def member_context(index: int, state: FakeTaskStateStore | None = None) -> dict[str, Any]:
    """What a mapped task instance's context holds for the operator: its map index."""
    context: dict[str, Any] = {"ti": SimpleNamespace(map_index=index)}
    if state is not None:
        context["task_state_store"] = state
    return context


def deferred(op: SiteJobOperator, context: dict[str, Any]) -> SiteJobTrigger:
    with pytest.raises(TaskDeferred) as exc:
        op.execute(context=context)
    assert isinstance(exc.value.trigger, SiteJobTrigger)
    return exc.value.trigger


def event_of(trigger: SiteJobTrigger) -> dict[str, Any]:
    async def first() -> Any:
        return await asyncio.wait_for(trigger.run().__anext__(), WAIT_S)

    payload: dict[str, Any] = asyncio.run(first()).payload
    return payload


def selection_rows(db_url: str) -> list[dict[str, Any]]:
    store = open_store(db_url)
    try:
        if not inspect(store.engine).has_table(selections.name):
            return []
        with store.begin() as conn:
            query = select(selections).order_by(selections.c.id)
            return [dict(row) for row in conn.execute(query).mappings()]
    finally:
        store.dispose()


def wait_finished(runtime: GridRuntime, selection_id: int) -> JobRecord:
    deadline = time.monotonic() + WAIT_S
    while not (record := runtime.poll(selection_id)).finished:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return record


BURST = [{"processors": 2, "runtime_s": 1}] * 6  # 12 processors > local-a's 8


# -- one decision for the burst -------------------------------------------------------------


def test_a_burst_is_decided_in_one_transaction_with_one_selection_per_member(
    db_url: str,
) -> None:
    result = select_op(BURST).execute(context={})

    assert [set(r) for r in result] == [set(RESULT_KEYS)] * len(BURST)
    assert [r["name"] for r in result] == [job_name(DAG, "member", i) for i in range(6)]
    rows = selection_rows(db_url)
    assert [row["id"] for row in rows] == [r["selection_id"] for r in result]
    assert [row["site"] for row in rows] == [r["site"] for r in result]
    # one decision: one clock reading for the whole burst, every member still unsubmitted
    assert len({row["selected_at"] for row in rows}) == 1
    assert {row["state"] for row in rows} == {"selected"}
    assert len({r["site"] for r in result}) > 1, "12 processors fit no single local site"
    assert_capacity_invariant(db_url)


def test_the_burst_is_one_select_batch_call(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    original = GridRuntime.select_batch

    def counted(self: GridRuntime, requests: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(requests))
        return original(self, requests, *args, **kwargs)

    monkeypatch.setattr(GridRuntime, "select_batch", counted)
    monkeypatch.setattr(GridRuntime, "select", lambda *a, **k: pytest.fail("single select"))

    select_op(BURST).execute(context={})

    assert calls == [len(BURST)]


def test_input_files_size_each_members_request(tmp_path: Path, db_url: str) -> None:
    forcing = tmp_path / "fort.22"
    forcing.write_bytes(b"\x00" * 700)
    op = select_op([{"processors": 1, "input_files": [str(forcing)]}, {"name": "solo"}])

    plan = op.plan_burst({})

    assert [(r.name, r.processors, r.input_bytes) for r in plan.requests] == [
        (job_name(DAG, "member", 0), 1, 700),
        ("solo", 1, 0),
    ]
    assert plan.stream == DAG


def test_an_empty_burst_decides_nothing(db_url: str) -> None:
    assert select_op([]).execute(context={}) == []


# -- bad input: a clear error naming member and field, nothing written -----------------------


@pytest.mark.parametrize(
    ("members", "kwargs", "message"),
    [
        pytest.param("abc", {}, r"members: must be a list of member mappings, got str", id="str"),
        pytest.param(
            [{"processors": 1}, 5], {}, r"members\[1\]: must be a mapping", id="not-a-mapping"
        ),
        pytest.param(
            [{"processors": 2}, {"processors": 0}],
            {},
            r"members\[1\]: request\.processors: must be a positive integer \(.*\), got 0",
            id="zero-processors",
        ),
        pytest.param(
            [{"processors": "2"}],
            {},
            r"members\[0\]: request\.processors: must be a positive integer",
            id="processors-as-text",
        ),
        pytest.param(
            [{"runtime_s": -1}],
            {},
            r"members\[0\]: request\.runtime_s: must be a finite number >= 0, got -1",
            id="negative-runtime",
        ),
        pytest.param(
            [{}, {"input_files": ["/no/such/fort.22"]}],
            {},
            r"members\[1\]: input_files: not found .*/no/such/fort\.22",
            id="missing-input",
        ),
        pytest.param(
            [{"name": "x"}, {"name": "x"}],
            {},
            r"members\[1\]\.name: 'x' is also members\[0\]'s",
            id="duplicate-names",
        ),
        pytest.param(
            [{"name": "bad\x01name"}],
            {},
            r"members\[0\]: request\.name: must not be blank or contain control characters",
            id="control-character-in-name",
        ),
        pytest.param(
            [{"processors": 2}, {"processors": 64}],
            {},
            r"select_sites: request 'adhoc_airflow\.member\.1': no site can run 64 processors",
            id="too-big-for-every-site",
        ),
        pytest.param(
            BURST,
            {"protocol": "clever"},
            r"protocol: must be naive \| stateful \| random \| earliest-completion",
            id="bad-protocol",
        ),
        pytest.param(
            BURST,
            {"stream": "s" * 129},
            r"stream: must be at most 128 characters",
            id="stream-longer-than-its-column",
        ),
    ],
)
def test_bad_input_fails_naming_the_field_and_writes_nothing(
    db_url: str, members: Any, kwargs: dict[str, Any], message: str
) -> None:
    state = FakeTaskStateStore()
    with pytest.raises(AirflowFailException, match=message):
        select_op(members, **kwargs).execute(context={"task_state_store": state})

    assert selection_rows(db_url) == []
    assert state.values == {}


# -- retries return the burst of the first try ---------------------------------------------


def test_a_retry_returns_the_same_selections_and_decides_nothing(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = FakeTaskStateStore()
    first = select_op(BURST).execute(context={"task_state_store": state})
    assert state.values == {SELECTIONS_KEY: [r["selection_id"] for r in first]}

    # The first try was lost after deciding (worker crash): a new try, the same store.
    monkeypatch.setattr(GridRuntime, "select_batch", lambda *a, **k: pytest.fail("decided"))
    retry = select_op(BURST).execute(context={"task_state_store": state})

    assert retry == first
    assert len(selection_rows(db_url)) == len(BURST)
    assert_capacity_invariant(db_url)


def test_a_retry_returns_the_burst_even_after_its_members_ran(
    runtime: GridRuntime, db_url: str
) -> None:
    state = FakeTaskStateStore()
    first = select_op(BURST[:2]).execute(context={"task_state_store": state})
    trigger = deferred(member_op(first[0]["selection_id"]), member_context(0))
    wait_finished(runtime, trigger.selection_id)

    assert select_op(BURST[:2]).execute(context={"task_state_store": state}) == first
    assert len(selection_rows(db_url)) == 2


def test_a_burst_stored_for_other_members_is_decided_afresh(db_url: str) -> None:
    state = FakeTaskStateStore()
    first = select_op(BURST[:2]).execute(context={"task_state_store": state})

    # The upstream list changed between tries (it was cleared and planned 3 members).
    retry = select_op(BURST[:3]).execute(context={"task_state_store": state})

    assert len(retry) == 3
    assert {r["selection_id"] for r in retry}.isdisjoint(r["selection_id"] for r in first)
    assert state.values == {SELECTIONS_KEY: [r["selection_id"] for r in retry]}


class BrokenTaskStateStore(FakeTaskStateStore):
    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        raise RuntimeError("execution API unavailable")


def test_a_burst_that_cannot_be_persisted_is_released(db_url: str, runtime: GridRuntime) -> None:
    with pytest.raises(RuntimeError, match="execution API unavailable"):
        select_op(BURST).execute(context={"task_state_store": BrokenTaskStateStore()})

    assert {row["state"] for row in selection_rows(db_url)} == {"cancelled"}
    with runtime.store.begin() as conn:
        totals = capacity.totals(conn)
    assert {site: t for site, t in totals.items() if any(t)} == {}
    assert_capacity_invariant(db_url, no_live_holds=True)


# -- SiteJobOperator(selection_id=...): the member submits the selection made for it ---------


def test_a_member_submits_its_selection_exactly_once(runtime: GridRuntime, db_url: str) -> None:
    burst = select_op(BURST[:3]).execute(context={})
    state = FakeTaskStateStore()
    given = burst[1]["selection_id"]

    trigger = deferred(member_op(given, command="sleep 0.3"), member_context(1, state))

    assert trigger.selection_id == given
    assert state.values == {SELECTION_KEY: given}
    submitted = runtime.record(given)
    assert submitted.job_id is not None and submitted.site == burst[1]["site"]

    # A retry (the first try lost after submitting) follows the same job.
    retry = deferred(member_op(given, command="sleep 0.3"), member_context(1, state))
    assert retry.selection_id == given
    assert runtime.record(given).job_id == submitted.job_id

    result = member_op(given).execute_complete({}, event_of(retry))
    assert (result["selection_id"], result["state"]) == (given, "completed")
    assert len(selection_rows(db_url)) == 3  # no member selected anything of its own
    # ... and a retry after completion returns the result without running it again.
    again = member_op(given).execute(context=member_context(1, state))
    assert (again["selection_id"], again["job_id"]) == (given, submitted.job_id)
    assert local_jobs_named(runtime, submitted.name) == 1


def local_jobs_named(runtime: GridRuntime, name: str) -> int:
    from gridcore.state.schema import local_jobs

    with runtime.store.begin() as conn:
        query = select(func.count()).select_from(local_jobs).where(local_jobs.c.name == name)
        return int(conn.execute(query).scalar_one())


def test_a_templated_selection_id_is_rendered_text(runtime: GridRuntime) -> None:
    (decided,) = select_op(BURST[:1]).execute(context={})

    trigger = deferred(member_op(str(decided["selection_id"])), member_context(0))

    assert trigger.selection_id == decided["selection_id"]


@pytest.mark.parametrize(
    ("index", "kwargs", "message"),
    [
        pytest.param(
            1,
            {},
            r"adhoc_airflow\.member\.1: selection \d+ was made for 'adhoc_airflow\.member\.0'"
            r" with 2 processors, not for this member \(2 processors\)",
            id="another-members-selection",
        ),
        pytest.param(
            0,
            {"processors": 4},
            r"selection \d+ was made for 'adhoc_airflow\.member\.0' with 2 processors, not for"
            r" this member \(4 processors\)",
            id="other-processors",
        ),
    ],
)
def test_a_selection_made_for_another_member_is_refused(
    runtime: GridRuntime, db_url: str, index: int, kwargs: dict[str, Any], message: str
) -> None:
    (decided,) = select_op(BURST[:1]).execute(context={})

    with pytest.raises(AirflowFailException, match=message):
        member_op(decided["selection_id"], **kwargs).execute(context=member_context(index))

    assert runtime.record(decided["selection_id"]).job_id is None  # nothing submitted
    assert len(selection_rows(db_url)) == 1


def test_a_selection_another_task_submitted_is_refused(runtime: GridRuntime) -> None:
    (decided,) = select_op(BURST[:1]).execute(context={})
    given = decided["selection_id"]
    deferred(member_op(given, command="sleep 0.3"), member_context(0, FakeTaskStateStore()))

    # Another task instance (its own state store) handed the same id:
    with pytest.raises(AirflowFailException, match=rf"selection {given} is already pending"):
        member_op(given).execute(context=member_context(0, FakeTaskStateStore()))
    wait_finished(runtime, given)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param(
            {"selection_id": 999},
            r"adhoc_airflow\.member\.0: selection_id 999: no selection 999 in the state database",
            id="unknown-id",
        ),
        pytest.param(
            {"selection_id": "twelve"},
            r"selection_id: must be a positive integer \(a selection's id\), got 'twelve'",
            id="not-an-id",
        ),
        pytest.param(
            {"selection_id": "\u00b2"},  # a digit to str.isdigit, not to int()
            r"selection_id: must be a positive integer \(a selection's id\), got '\u00b2'",
            id="superscript-digit",
        ),
        pytest.param(
            {"selection_id": True},
            r"selection_id: must be a positive integer",
            id="bool",
        ),
        pytest.param(
            {"selection_id": 1, "site": "local-b"},
            r"selection_id 1 and site 'local-b': give one, not both",
            id="pinned-too",
        ),
    ],
)
def test_a_bad_selection_id_is_refused_before_anything_is_written(
    db_url: str, runtime: GridRuntime, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(AirflowFailException, match=message):
        member_op(**kwargs).execute(context=member_context(0))

    assert selection_rows(db_url) == []


def test_a_member_whose_selection_ended_unsubmitted_selects_afresh(
    runtime: GridRuntime, db_url: str
) -> None:
    (decided,) = select_op(BURST[:1]).execute(context={})
    given = decided["selection_id"]
    runtime.cancel(given)  # as an expired selection: it will never run
    state = FakeTaskStateStore()

    trigger = deferred(member_op(given), member_context(0, state))

    assert trigger.selection_id != given
    assert state.values == {SELECTION_KEY: trigger.selection_id}
    assert runtime.record(trigger.selection_id).name == job_name(DAG, "member", 0)
    wait_finished(runtime, trigger.selection_id)
    assert_capacity_invariant(db_url, no_live_holds=True)


def test_a_retry_after_the_given_selections_job_failed_selects_afresh(
    runtime: GridRuntime,
) -> None:
    (decided,) = select_op(BURST[:1]).execute(context={})
    given = decided["selection_id"]
    state = FakeTaskStateStore()
    first = deferred(member_op(given, command="exit 3"), member_context(0, state))
    assert wait_finished(runtime, first.selection_id).state == "failed"

    retry = deferred(member_op(given), member_context(0, state))

    assert retry.selection_id not in (given, None)
    assert state.values == {SELECTION_KEY: retry.selection_id}
    wait_finished(runtime, retry.selection_id)


def test_with_selections_joins_each_row_with_its_selection() -> None:
    rows = [{"processors": 2, "env": {"MEMBER": "0"}}, {"processors": 4}]
    decided = [{"selection_id": 7, "site": "a"}, {"selection_id": 8, "site": "b"}]

    assert with_selections(rows, decided) == [
        {"processors": 2, "env": {"MEMBER": "0"}, "selection_id": 7},
        {"processors": 4, "selection_id": 8},
    ]
    with pytest.raises(ValueError, match="2 members but 1 selections"):
        with_selections(rows, decided[:1])
