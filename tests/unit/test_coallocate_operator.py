"""CoAllocateOperator and CoAllocationTrigger against a real KoalaEngine: temp SQLite and
the embedded local sites (local-a 8, local-b 4, local-c 4 processors)."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from sqlalchemy import func, inspect, select

from gridcore.state.schema import coalloc_jobs
from gridcore.state.store import open_store
from operators.coallocate import JOB_KEY, CoAllocateOperator, result_of
from sensors.coalloc_trigger import (
    REQUIRED_EVENT_KEYS,
    CoAllocationTrigger,
    close_engine,
    error_event,
    open_engine,
)
from tests.fakes import FakeTaskStateStore

WAIT_S = 60.0


def operator(**kwargs: Any) -> CoAllocateOperator:
    defaults: dict[str, Any] = {
        "task_id": "coalloc",
        "command": "true",
        "components": [2, 2],
        "policy": "WF",
        "poll_interval": 0.1,
    }
    return CoAllocateOperator(**{**defaults, **kwargs})


def deferred(op: CoAllocateOperator, context: dict[str, Any] | None = None) -> CoAllocationTrigger:
    with pytest.raises(TaskDeferred) as exc:
        op.execute(context=context or {})
    assert exc.value.method_name == "execute_complete"
    assert isinstance(exc.value.trigger, CoAllocationTrigger)
    return exc.value.trigger


async def all_events(run: AsyncIterator[Any]) -> list[Any]:
    async def collect() -> list[Any]:
        return [event async for event in run]

    return await asyncio.wait_for(collect(), WAIT_S)


def job_rows(db_url: str) -> int:
    store = open_store(db_url)
    try:
        if not inspect(store.engine).has_table(coalloc_jobs.name):
            return 0
        with store.begin() as conn:
            return int(conn.execute(select(func.count()).select_from(coalloc_jobs)).scalar_one())
    finally:
        store.dispose()


def test_execute_submits_a_queued_job_and_defers(db_url: str) -> None:
    trigger = deferred(operator(components=[8, 4, 4]))

    assert (trigger.grid_file, trigger.db_url, trigger.poll_interval) == (None, None, 0.1)
    engine = open_engine(None, db_url, 1.0)
    try:
        record = engine.status(trigger.job_id)
    finally:
        close_engine(engine)
    assert record.state == "queued"
    assert record.policy == "WF"
    assert record.name.endswith(".coalloc.-1")  # dag.task.map_index
    assert job_rows(db_url) == 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"command": "  "}, "command"),
        ({"components": []}, "components"),
        ({"components": [2, 0]}, r"components\[1\]"),
        ({"components": "4,4"}, "components"),
        ({"kind": "partial"}, "kind"),
        ({"policy": "BF"}, "policy"),
        ({"priority": "urgent"}, "priority"),
        ({"delivery": "torrent"}, "delivery"),
        ({"quota": 1.5}, "quota"),
        ({"poll_interval": 0}, "poll_interval"),
        ({"sites": ["local-a", "local-b"]}, "sites"),
        ({"kind": "fixed", "sites": ["local-a"]}, "sites"),
        ({"kind": "fixed", "sites": ["local-a", ""]}, r"sites\[1\]"),
        ({"kind": "flexible", "total": 4}, "components"),
        ({"kind": "flexible", "components": None, "total": -1}, "total"),
        ({"total": 4}, "total"),
        ({"input_file": " "}, "input_file"),
        # The engine's own checks, still before any row is written:
        ({"kind": "fixed", "sites": ["local-a", "nowhere"]}, "nowhere"),
        ({"components": [9]}, "idle grid"),
        ({"input_file": "in/missing.dat"}, "missing.dat"),
    ],
)
def test_bad_input_fails_naming_the_field_before_anything_is_written(
    db_url: str, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(AirflowFailException, match=field):
        operator(**kwargs).execute(context={})
    assert job_rows(db_url) == 0


def test_execute_complete_returns_the_placement_and_maps_other_events_to_failures() -> None:
    record = {
        "job_id": 7,
        "name": "d.t.-1",
        "state": "completed",
        "policy": "WF",
        "jpt": 10.0,
        "jst": 10.0,
        "started_at": 12.0,
        "finished_at": 20.0,
        "barrier_skew_s": 0.05,
        "retries": 0,
        "placement_tries": 1,
        "claim_tries": 1,
        "placement": {"policy": "WF", "clusters_combined": 2},
        "components": [
            {"index": 0, "size": 4, "site": "a", "file_site": None, "site_job_id": "1",
             "released_at": 11.95},
            {"index": 1, "size": 2, "site": "b", "file_site": None, "site_job_id": "2",
             "released_at": 12.0},
        ],
    }  # fmt: skip
    op = operator()
    event = {"status": "success", "message": "ok", "job_id": 7, "record": record}
    result = op.execute_complete({}, event)
    assert result["sites"] == ["a", "b"] and result["sizes"] == [4, 2]
    assert result["start_times"] == [11.95, 12.0] and result["site_job_ids"] == ["1", "2"]
    assert result["file_sites"] == [None, None]
    assert (result["jpt"], result["jst"], result["barrier_skew_s"]) == (10.0, 10.0, 0.05)
    assert result["placement"]["clusters_combined"] == 2 and result["retries"] == 0
    assert result == result_of(record)

    failed = {**event, "status": "failed", "message": "component 1: exit 3"}
    with pytest.raises(AirflowException, match="failed: component 1: exit 3"):
        op.execute_complete({}, failed)
    with pytest.raises(AirflowException, match="error: gridcore: boom"):
        op.execute_complete({}, dict(error_event(7, "gridcore: boom")))
    with pytest.raises(AirflowException, match="lacks key"):
        op.execute_complete({}, {"status": "success"})


def test_trigger_serialize_round_trips_through_its_class_path() -> None:
    trigger = CoAllocationTrigger(5, "/g.toml", "sqlite:////x.db", 0.5, max_retries=2)
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    clone = getattr(importlib.import_module(module), name)(**kwargs)

    assert path == "sensors.coalloc_trigger.CoAllocationTrigger"
    assert clone.serialize() == trigger.serialize()


@pytest.mark.asyncio
async def test_trigger_scans_a_two_site_job_to_one_success_event(db_url: str) -> None:
    # 8 + 4 with WF: local-a (8) is full after the first, so two sites.
    op = operator(components=[8, 4], command='test -n "$GRIDCORE_PEERS"')
    trigger = await asyncio.to_thread(deferred, op)

    events = await all_events(trigger.run())
    await trigger.cleanup()

    assert len(events) == 1
    payload = events[0].payload
    assert set(payload) == REQUIRED_EVENT_KEYS
    assert payload["status"] == "success", payload
    record = payload["record"]
    assert record["state"] == "completed"
    assert [c["state"] for c in record["components"]] == ["completed", "completed"]
    assert len({c["site"] for c in record["components"]}) == 2
    assert record["barrier_skew_s"] is not None and record["barrier_skew_s"] <= 1.0
    result = op.execute_complete({}, payload)
    assert result["sizes"] == [8, 4] and all(t is not None for t in result["start_times"])


@pytest.mark.asyncio
async def test_a_failing_job_is_retried_until_on_kill_cancels_it(db_url: str) -> None:
    # A failed component sends the whole job back to its placement queue (Sec. 3.4);
    # wait for the first such retry, then kill the task as a user would.
    op = operator(components=[1, 1], command="exit 3")
    trigger = await asyncio.to_thread(deferred, op)
    engine = await asyncio.to_thread(open_engine, None, db_url, 0.1)
    try:

        async def retried() -> None:
            while (await asyncio.to_thread(engine.status, trigger.job_id)).retries < 1:
                await asyncio.to_thread(engine.scan)
                await asyncio.sleep(0.1)

        await asyncio.wait_for(retried(), WAIT_S)
    finally:
        await asyncio.to_thread(close_engine, engine)
    await trigger.on_kill()
    events = await all_events(trigger.run())
    await trigger.cleanup()

    assert len(events) == 1
    assert events[0].payload["status"] == "failed"
    assert "cancelled" in events[0].payload["message"]
    assert events[0].payload["record"]["state"] == "cancelled"
    assert events[0].payload["record"]["retries"] >= 1


def test_non_deferrable_mode_waits_in_the_worker(db_url: str) -> None:
    result = operator(deferrable=False, components=[8, 4, 4], policy="WF").execute(context={})

    assert result["state"] == "completed"
    assert result["sites"] == ["local-a", "local-b", "local-c"]
    assert result["barrier_skew_s"] is not None and result["barrier_skew_s"] <= 1.0


def run_trigger(trigger: CoAllocationTrigger) -> dict[str, Any]:
    async def one() -> list[Any]:
        try:
            return await all_events(trigger.run())
        finally:
            await trigger.cleanup()

    (event,) = asyncio.run(one())
    payload: dict[str, Any] = event.payload
    return payload


def test_a_retry_reattaches_to_the_live_job_and_returns_a_completed_one(db_url: str) -> None:
    state = FakeTaskStateStore()
    first = deferred(operator(command="sleep 0.3"), {"task_state_store": state})
    assert state.values == {JOB_KEY: first.job_id}

    retry = deferred(operator(command="sleep 0.3"), {"task_state_store": state})
    assert retry.job_id == first.job_id
    assert run_trigger(retry)["status"] == "success"
    # A try after the job completed returns its result instead of running it again.
    result = operator().execute(context={"task_state_store": state})
    assert result["job_id"] == first.job_id and result["state"] == "completed"
    assert job_rows(db_url) == 1


def test_a_retry_after_a_cancelled_job_submits_afresh(db_url: str) -> None:
    state = FakeTaskStateStore()
    first = deferred(operator(command="sleep 5"), {"task_state_store": state})
    engine = open_engine(None, db_url, 0.1)
    try:
        assert engine.cancel(first.job_id).state == "cancelled"
    finally:
        close_engine(engine)

    retry = deferred(operator(), {"task_state_store": state})
    assert retry.job_id != first.job_id
    assert state.values == {JOB_KEY: retry.job_id}
    assert job_rows(db_url) == 2


@pytest.mark.asyncio
async def test_a_finished_trigger_leaves_the_scan_lease_free(db_url: str) -> None:
    # dag.test() does not call cleanup(): a trigger that kept the lease after its event
    # would make every other waiter skip its scans until the lease expired (60 s).
    op = operator(components=[4], command="true")
    trigger = await asyncio.to_thread(deferred, op)
    (event,) = await all_events(trigger.run())
    assert event.payload["status"] == "success", event.payload

    other = await asyncio.to_thread(open_engine, None, db_url, 1.0)
    try:
        report = await asyncio.to_thread(other.scan)
        assert not report.skipped, report.reasons
    finally:
        await asyncio.to_thread(close_engine, other)
        await trigger.cleanup()
