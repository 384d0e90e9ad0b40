"""CoAllocationOperator and its EngineTrigger against a real CoAllocationEngine: temp SQLite and
the embedded local sites (local-a 8, local-b 4, local-c 4 processors).

The components' barriers call a VJ center: a test on a state DB (``db_url``) gets one
configured (``$GRIDCORE_CENTER_URL``), as a deployment has, so the operator defers; the
embedded default (no center configured: one in the worker, which waits) has its own
test."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from sqlalchemy import func, inspect, select

from gridcore.engine.coallocation import CoAllocationEngine
from gridcore.sites.local import TIME_LIMIT_FILE, LocalSite
from gridcore.state.schema import coalloc_components, coalloc_jobs
from gridcore.state.store import open_store
from gridcore_airflow.operators.coallocation import JOB_KEY, CoAllocationOperator
from gridcore_airflow.operators.hooks import CENTER_ENV, EngineKind, GridcoreHook
from gridcore_airflow.sensors.base import EVENT_KEYS
from gridcore_airflow.sensors.triggers import ENGINE_WAITS, EngineTrigger
from tests.barrier_checks import assert_released_after_every_registration, running_center
from tests.fakes import FakeTaskStateStore, as_airflow_holds

WAIT_S = 60.0
COALLOCATION = EngineKind.COALLOCATION


@pytest.fixture(autouse=True)
def configured_center(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str | None]:
    """A VJ center on the test's state DB, configured by ``$GRIDCORE_CENTER_URL``, for
    every test that has a state DB (the ``db_url`` fixture)."""
    if "db_url" not in request.fixturenames:
        yield None
        return
    with running_center(request.getfixturevalue("db_url")) as url:
        monkeypatch.setenv(CENTER_ENV, url)
        yield url


def operator(**kwargs: Any) -> CoAllocationOperator:
    defaults: dict[str, Any] = {
        "task_id": "coalloc",
        "command": "true",
        "components": [2, 2],
        "policy": "WF",
        "poll_interval": 0.1,
    }
    return CoAllocationOperator(**{**defaults, **kwargs})


def deferred(op: CoAllocationOperator, context: dict[str, Any] | None = None) -> EngineTrigger:
    with pytest.raises(TaskDeferred) as exc:
        op.execute(context=context or {})
    assert exc.value.method_name == "execute_complete"
    assert isinstance(exc.value.trigger, EngineTrigger)
    assert exc.value.trigger.engine is COALLOCATION
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


def engine_of(db_url: str, scan_interval: float = 1.0) -> Any:
    """A KOALA engine on the test's state DB, opened as operators open it."""
    return GridcoreHook(db_url=db_url).engine(COALLOCATION, scan_interval)


def open_coallocation(db_url: str, scan_interval: float) -> CoAllocationEngine:
    """A KOALA engine opened as triggers open it (close with close_coallocation)."""
    engine = GridcoreHook(db_url=db_url).open_engine(COALLOCATION, scan_interval, upgrade=False)
    assert isinstance(engine, CoAllocationEngine)
    return engine


def close_coallocation(engine: CoAllocationEngine) -> None:
    GridcoreHook.close_engine(engine)


def test_execute_submits_a_queued_job_and_defers(db_url: str) -> None:
    trigger = deferred(operator(components=[8, 4, 4]))

    assert (trigger.grid_file, trigger.db_url, trigger.poll_interval) == (None, None, 0.1)
    with engine_of(db_url) as engine:
        record = engine.status(trigger.job_id)
    assert record.state == "queued"
    assert record.policy == "WF"
    assert record.name.endswith(".coalloc")  # dag.task: unmapped, no map index
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
        ({"kind": "fixed", "sites": ["local-a", ""]}, r"components\[1\]\.site: must not be empty"),
        ({"kind": "flexible", "total": 4}, "components"),
        ({"kind": "flexible", "components": None, "total": -1}, "total"),
        ({"total": 4}, "total"),
        ({"input_file": " "}, "input_file"),
        ({"time_limit": "10x"}, "time_limit: '10x' is not a duration"),
        ({"memory": -1}, "memory: must be from 1 MiB"),
        ({"gpus": 1}, r"request\.resources\.gpus: .* local-a, local-b, local-c are local"),
        ({"kind": "fixed", "sites": ["local-a", "local-b"], "gpus": 2}, "local-a, local-b"),
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


def test_execute_complete_maps_a_record_to_the_xcom_shape() -> None:
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
             "released_at": 11.95, "resources": {"time_limit_s": 60, "account": "x"}},
            {"index": 1, "size": 2, "site": "b", "file_site": "a", "site_job_id": "2",
             "released_at": 12.0, "resources": {"time_limit_s": 60}},
        ],
    }  # fmt: skip
    event = {"status": "success", "message": "ok", "subject": "co-allocated job", "id": 7,
             "record": record}  # fmt: skip

    assert operator().execute_complete({}, event) == {
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
        "sites": ["a", "b"],
        "sizes": [4, 2],
        "file_sites": [None, "a"],
        "site_job_ids": ["1", "2"],
        "start_times": [11.95, 12.0],
        "resources": [{"time_limit_s": 60, "account": "x"}, {"time_limit_s": 60}],
        "output_files": [None, None],  # the event names no files
    }


def rows_of(db_url: str, job_id: int) -> tuple[Any, list[Any]]:
    """The job's row and its current epoch's component rows, straight from the tables."""
    store = open_store(db_url)
    try:
        with store.begin() as conn:
            job = conn.execute(select(coalloc_jobs).where(coalloc_jobs.c.id == job_id)).one()
            parts = conn.execute(
                select(coalloc_components)
                .where(coalloc_components.c.job_id == job_id)
                .where(coalloc_components.c.epoch == job.epoch)
                .order_by(coalloc_components.c.idx)
            ).all()
    finally:
        store.dispose()
    return job, list(parts)


def test_the_xcom_of_a_finished_job_agrees_with_its_rows_and_the_grid(db_url: str) -> None:
    # WF on local-a 8, local-b 4, local-c 4: the 8 fills local-a, the 4 goes elsewhere.
    op = operator(components=[8, 4], command='test -n "$GRIDCORE_PEERS"')
    trigger = deferred(op)
    result = op.execute_complete({}, run_trigger(trigger))
    job, parts = rows_of(db_url, trigger.job_id)

    assert result["job_id"] == job.id == trigger.job_id
    assert (result["name"], result["state"], result["policy"]) == (job.name, "completed", "WF")
    assert job.state == "completed" and job.name == "adhoc_airflow.coalloc"
    assert (result["jpt"], result["jst"]) == (job.jpt, job.jst)
    assert (result["started_at"], result["finished_at"]) == (job.started_at, job.finished_at)
    assert (result["retries"], result["placement_tries"], result["claim_tries"]) == (
        job.retries,
        job.placement_tries,
        job.claim_tries,
    )
    assert result["placement"] == json.loads(job.placement)
    # Per component, in request order, from the component rows:
    assert [p.idx for p in parts] == [0, 1]
    assert result["sizes"] == [p.size for p in parts] == [8, 4]
    assert result["sites"] == [p.site for p in parts]
    assert result["sites"][0] == "local-a" and result["sites"][1] in {"local-b", "local-c"}
    assert result["file_sites"] == [p.file_site for p in parts] == [None, None]
    assert result["site_job_ids"] == [p.site_job_id for p in parts]
    assert None not in result["site_job_ids"] and len(set(result["site_job_ids"])) == 2
    assert result["start_times"] == [p.released_at for p in parts]
    assert all(p.state == "completed" and p.exit_code == 0 for p in parts)
    # Every component was released at the barrier only after all had registered.
    assert min(p.released_at for p in parts) >= max(p.registered_at for p in parts)
    assert result["barrier_skew_s"] == max(result["start_times"]) - min(result["start_times"])


def test_execute_complete_maps_failed_error_and_malformed_events_to_failures() -> None:
    op = operator()
    failed = {"status": "failed", "message": "component 1: exit 3", "subject": "co-allocated job",
              "id": 7, "record": {"state": "failed"}}  # fmt: skip
    with pytest.raises(AirflowException, match="job 7: failed: component 1: exit 3"):
        op.execute_complete({}, failed)
    with pytest.raises(AirflowException, match="error: gridcore: boom"):
        op.execute_complete({}, dict(ENGINE_WAITS[COALLOCATION].error_event(7, "gridcore: boom")))
    with pytest.raises(AirflowException, match="lacks key"):
        op.execute_complete({}, {"status": "success"})
    with pytest.raises(AirflowException, match="about a 'selection'"):
        op.execute_complete({}, {**failed, "status": "success", "subject": "selection"})


@pytest.mark.asyncio
async def test_an_unknown_job_is_one_error_event(db_url: str) -> None:
    await asyncio.to_thread(deferred, operator())  # migrates the database
    trigger = EngineTrigger(999, COALLOCATION, None, db_url, 0.05)

    events = await all_events(trigger.run())
    await trigger.cleanup()

    assert [e.payload["status"] for e in events] == ["error"]
    payload = events[0].payload
    assert set(payload) == EVENT_KEYS
    assert (payload["subject"], payload["id"], payload["record"]) == ("co-allocated job", 999, None)
    assert "no co-allocation job 999" in payload["message"]


@pytest.mark.asyncio
async def test_trigger_scans_a_two_site_job_to_one_success_event(db_url: str) -> None:
    # 8 + 4 with WF: local-a (8) is full after the first, so two sites.
    op = operator(components=[8, 4], command='test -n "$GRIDCORE_PEERS"')
    trigger = await asyncio.to_thread(deferred, op)

    events = await all_events(trigger.run())
    await trigger.cleanup()

    assert len(events) == 1
    payload = events[0].payload
    assert set(payload) == EVENT_KEYS
    assert payload["status"] == "success", payload
    assert (payload["subject"], payload["id"]) == ("co-allocated job", trigger.job_id)
    record = payload["record"]
    assert record["state"] == "completed"
    assert [c["state"] for c in record["components"]] == ["completed", "completed"]
    assert len({c["site"] for c in record["components"]}) == 2
    assert_released_after_every_registration(db_url, trigger.job_id)
    result = op.execute_complete({}, payload)
    assert result["sizes"] == [8, 4] and all(t is not None for t in result["start_times"])


@pytest.mark.asyncio
async def test_each_components_output_goes_into_the_log_prefixed_by_component_and_site(
    db_url: str,
) -> None:
    command = (
        'echo "rank $GRIDCORE_COMPONENT of $GRIDCORE_COMPONENTS";'
        ' echo "rank $GRIDCORE_COMPONENT done" >&2'
    )
    op = operator(components=[8, 4], command=command)
    trigger = await asyncio.to_thread(deferred, op)
    logged: list[str] = []
    trigger._log = _ListLogger(logged)  # the edge to the task log (structlog in the triggerer)

    events = await all_events(trigger.run())
    await trigger.cleanup()

    payload = events[0].payload
    assert payload["status"] == "success", payload
    sites = [c["site"] for c in payload["record"]["components"]]
    copied = sorted(line for line in logged if line.startswith("[component"))
    assert copied == [
        f"[component 0 @ {sites[0]}] [stderr] rank 0 done",
        f"[component 0 @ {sites[0]}] [stdout] rank 0 of 2",
        f"[component 1 @ {sites[1]}] [stderr] rank 1 done",
        f"[component 1 @ {sites[1]}] [stdout] rank 1 of 2",
    ]
    result = op.execute_complete({}, payload)
    assert [Path(f["stdout"]).read_text() for f in result["output_files"]] == [
        "rank 0 of 2\n",
        "rank 1 of 2\n",
    ]


class _ListLogger(logging.Logger):
    """A stdlib logger that keeps each message it is given."""

    def __init__(self, into: list[str]) -> None:
        super().__init__("tests.coalloc.trigger", logging.DEBUG)
        self.into = into

    def handle(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


@pytest.mark.asyncio
async def test_a_failing_job_is_retried_until_on_kill_cancels_it(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failed component sends the whole job back to its placement queue (Sec. 3.4);
    # wait for the first such retry, then kill the task as a user would.
    op = operator(components=[1, 1], command="exit 3")
    trigger = await asyncio.to_thread(deferred, op)
    engine = await asyncio.to_thread(open_coallocation, db_url, 0.1)
    try:

        async def retried() -> None:
            while (await asyncio.to_thread(engine.status, trigger.job_id)).retries < 1:
                await asyncio.to_thread(engine.scan)
                await asyncio.sleep(0.1)

        await asyncio.wait_for(retried(), WAIT_S)
    finally:
        await asyncio.to_thread(close_coallocation, engine)
    as_airflow_holds(trigger, "failed", monkeypatch)  # the user marked it failed
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
    assert_released_after_every_registration(db_url, result["job_id"])


def test_without_a_configured_center_a_deferrable_operator_waits_in_the_worker(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The embedded default: the center runs in this process, which must outlive the job.
    monkeypatch.delenv(CENTER_ENV)
    op = operator(components=[8, 4], command='test -n "$GRIDCORE_PEERS"')
    assert op.deferrable
    result = op.execute(context={})  # no TaskDeferred

    assert result["state"] == "completed" and result["sizes"] == [8, 4]
    assert_released_after_every_registration(db_url, result["job_id"])


def test_the_engine_of_a_location_calls_the_configured_center(
    db_url: str, configured_center: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRIDCORE_SITE_CENTER_URLS", '{"local-b": "http://10.9.9.9:1"}')
    engine = open_coallocation(db_url, 1.0)
    try:
        assert engine.center_url == configured_center
        assert engine.site_center_urls == {"local-b": "http://10.9.9.9:1"}
    finally:
        close_coallocation(engine)


def run_trigger(trigger: EngineTrigger) -> dict[str, Any]:
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
    with engine_of(db_url, 0.1) as engine:
        assert engine.cancel(first.job_id).state == "cancelled"

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

    other = await asyncio.to_thread(open_coallocation, db_url, 1.0)
    try:
        report = await asyncio.to_thread(other.scan)
        assert not report.skipped, report.reasons
    finally:
        await asyncio.to_thread(close_coallocation, other)
        await trigger.cleanup()


def test_each_components_xcom_shows_what_its_site_job_asked_of_its_site(
    db_url: str, grid_with_defaults: Path
) -> None:
    # WF on local-a 8, local-b 4, local-c 4: the 8 fills local-a, the 4 goes elsewhere.
    result = operator(
        deferrable=False, components=[8, 4], command="true", time_limit="10m", account="mine"
    ).execute(context={})

    assert result["state"] == "completed"
    asked = {"time_limit_s": 600, "account": "mine"}  # over each site's own defaults
    expected = {
        "local-a": {**asked, "memory_mib": 1024, "memory_per": "node"},
        "local-b": {**asked, "qos": "short"},
        "local-c": asked,
    }
    assert result["resources"] == [expected[site] for site in result["sites"]]
    with engine_of(db_url) as engine:
        for site, job_id in zip(result["sites"], result["site_job_ids"], strict=True):
            local = engine.runtime.adapter(site)
            assert isinstance(local, LocalSite)
            assert (local.workdir(job_id) / TIME_LIMIT_FILE).read_text().strip() == "600"
