"""CoReservationOperator and its EngineTrigger with Airflow's real classes against a real
CoReservationEngine: temp SQLite, the embedded local sites (local-a 8, local-b 4, local-c 4
processors), real pilot processes and a real VJ center (embedded in this process when
none is configured, else one the test serves and names in ``$GRIDCORE_CENTER_URL``)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from sqlalchemy import func, inspect, select

from gridcore.api.server import RunningCenter, start_in_thread
from gridcore.engine.coreservation import CoReservationEngine
from gridcore.engine.coreservation_records import ReservationRecord
from gridcore.engine.phases import PilotState, ReservationPhase
from gridcore.engine.runtime import GridRuntime
from gridcore.model import HolderKind
from gridcore.policies.coreservation import pilot_time_limit
from gridcore.sites.local import TIME_LIMIT_FILE, LocalSite
from gridcore.state import capacity
from gridcore.state.schema import local_jobs, reservations
from gridcore.state.store import open_store
from gridcore_airflow.operators.coreservation import JOB_KEY, CoReservationOperator
from gridcore_airflow.operators.hooks import EngineKind
from gridcore_airflow.sensors.base import EVENT_KEYS
from gridcore_airflow.sensors.triggers import ENGINE_WAITS, EngineTrigger
from tests.capacity_checks import assert_capacity_invariant
from tests.fakes import FakeTaskStateStore, as_airflow_holds

WAIT_S = 60.0
CORESERVATION = EngineKind.CORESERVATION
# The XCom keys the operator's docstring promises ("Returns (XCom)").
DOCUMENTED_KEYS = {
    "job_id",
    "state",
    "clusters",
    "t_avail_s",
    "lifetime_s",
    "coallocation_s",
    "dispatch_skew_s",
    "shifts_received",
    "shifts_given",
    "substitutes",
    "reorganizations",
    "site_job_ids",
    "sites",
    "resources",
}


def operator(**kwargs: Any) -> CoReservationOperator:
    defaults: dict[str, Any] = {
        "task_id": "coreserve",
        "command": "true",
        "processors": 3,
        "max_clusters": 3,
        "poll_interval": 0.1,
    }
    return CoReservationOperator(**{**defaults, **kwargs})


@pytest.fixture
def center(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningCenter]:
    """A configured VJ center (as ``gridcore serve`` would be): the operator defers."""
    store = open_store(db_url, upgrade=True)
    running = start_in_thread(store, heartbeat_s=1.0)
    monkeypatch.setenv("GRIDCORE_CENTER_URL", running.url)
    try:
        yield running
    finally:
        with engine_on(db_url, running.url) as engine:
            for job_id in unfinished(engine):  # no pilot outlives its test
                engine.cancel(job_id)
        running.stop()
        store.dispose()


@contextmanager
def engine_on(db_url: str, center_url: str) -> Iterator[CoReservationEngine]:
    """A CoReservationEngine on the test's state DB whose pilots call ``center_url``."""
    engine = CoReservationEngine(GridRuntime.open(db_url=db_url), center_url)
    try:
        yield engine
    finally:
        engine.release_lease()
        engine.store.dispose()


def deferred(op: CoReservationOperator, context: dict[str, Any] | None = None) -> EngineTrigger:
    with pytest.raises(TaskDeferred) as exc:
        op.execute(context=context or {})
    assert exc.value.method_name == "execute_complete"
    assert isinstance(exc.value.trigger, EngineTrigger)
    assert exc.value.trigger.engine is CORESERVATION
    return exc.value.trigger


async def all_events(run: AsyncIterator[Any]) -> list[Any]:
    async def collect() -> list[Any]:
        return [event async for event in run]

    return await asyncio.wait_for(collect(), WAIT_S)


def run_trigger(trigger: EngineTrigger) -> dict[str, Any]:
    async def one() -> list[Any]:
        try:
            return await all_events(trigger.run())
        finally:
            await trigger.cleanup()

    (event,) = asyncio.run(one())
    payload: dict[str, Any] = event.payload
    return payload


def reservation_rows(db_url: str) -> int:
    store = open_store(db_url)
    try:
        if not inspect(store.engine).has_table(reservations.name):
            return 0
        with store.begin() as conn:
            return int(conn.execute(select(func.count()).select_from(reservations)).scalar_one())
    finally:
        store.dispose()


def unfinished(engine: CoReservationEngine) -> list[int]:
    with engine.store.begin() as conn:
        return list(
            conn.execute(
                select(reservations.c.id).where(
                    reservations.c.state.in_(
                        (ReservationPhase.RESERVING.value, ReservationPhase.DISPATCHED.value)
                    )
                )
            ).scalars()
        )


def scan_until(
    engine: CoReservationEngine, job_id: int, phase: ReservationPhase
) -> ReservationRecord:
    deadline = time.time() + WAIT_S
    while time.time() < deadline:
        engine.scan()
        record = engine.status(job_id)
        if record.state == phase:
            return record
        assert not record.finished, record.as_json()
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not {phase}: {engine.status(job_id).as_json()}")


def live_pilot_holds(engine: CoReservationEngine) -> list[Any]:
    with engine.store.begin() as conn:
        return [h for h in capacity.live_holds(conn) if h.kind == HolderKind.PILOT]


def wait_local_jobs_ended(engine: CoReservationEngine) -> None:
    deadline = time.time() + WAIT_S
    while True:
        engine.runtime.refresh()
        with engine.store.begin() as conn:
            live = conn.execute(
                select(local_jobs.c.id).where(local_jobs.c.state.in_(("pending", "running")))
            ).all()
        if not live:
            return
        assert time.time() < deadline, f"local jobs still live: {live}"
        time.sleep(0.2)


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"processors": 3, "vj_size": 2}, "processors 3 is not a multiple of vj_size 2"),
        ({"sites": ["local-a", "local-z"]}, r"sites\[1\]: unknown site 'local-z'"),
        ({"processors": "four"}, "processors"),
        ({"processors": 2.5}, "processors"),
        ({"lifetime_floor_s": -1.0}, "lifetime_floor_s"),
        ({"machine_file": {"local-z": 3}}, r"machine_file\.local-z: unknown site"),
        # the engine's own check, still before any row is written
        ({"processors": 64}, "cannot be held even by the idle grid"),
        ({"time_limit": "soon"}, "time_limit: 'soon' is not a duration"),
        ({"gpus": 1}, r"resources\.gpus: asks for 1 GPU\(s\), but site\(s\) local-a"),
    ],
)
def test_bad_input_fails_naming_the_field_before_anything_is_written(
    db_url: str, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(AirflowFailException, match=field):
        operator(**kwargs).execute(context={})
    assert reservation_rows(db_url) == 0


# -- a run to completion ---------------------------------------------------------------------


def test_without_a_configured_center_the_worker_runs_one_and_waits_to_the_documented_xcom(
    db_url: str,
) -> None:
    # deferrable (the default), but the center is embedded in this worker: it waits here
    result = operator(command='test -n "$GRIDCORE_PEERS"').execute(context={})

    assert set(result) >= DOCUMENTED_KEYS, DOCUMENTED_KEYS - set(result)
    assert json.loads(json.dumps(result)) == result  # XCom-serializable as it is
    runtime = GridRuntime.open(db_url=db_url, upgrade=False)
    try:
        record = CoReservationEngine(runtime, "http://unused").status(result["job_id"])
    finally:
        runtime.store.dispose()
    assert result["state"] == record.state == ReservationPhase.COMPLETED
    assert result["name"] == record.name == "adhoc_airflow.coreserve"
    ranks = sorted(record.pilots, key=lambda p: p.component if p.component is not None else -1)
    assert [p.component for p in ranks] == [0, 1, 2]
    assert result["sites"] == [p.site for p in ranks]
    assert result["site_job_ids"] == [p.site_job_id for p in ranks]
    assert result["clusters"] == record.clusters and sum(result["clusters"].values()) == 3
    assert len(result["t_avail_s"]) == 3
    assert result["lifetime_s"] == record.lifetime_s and result["lifetime_s"] >= 60.0
    assert result["coallocation_s"] == record.coallocation_s >= 0
    assert result["dispatch_skew_s"] == record.dispatch_skew_s
    assert (result["shifts_received"], result["shifts_given"]) == (0, 0)
    assert (result["substitutes"], result["reorganizations"]) == (0, 0)
    assert_capacity_invariant(db_url)


# -- retries and cancelling ------------------------------------------------------------------


def test_a_retry_reattaches_to_its_job_instead_of_submitting_twice(
    db_url: str, center: RunningCenter
) -> None:
    state = FakeTaskStateStore()
    first = deferred(operator(command="sleep 0.5"), {"task_state_store": state})
    assert state.values == {JOB_KEY: first.job_id}

    retry = deferred(operator(command="sleep 0.5"), {"task_state_store": state})
    assert retry.job_id == first.job_id
    assert run_trigger(retry)["status"] == "success"
    # a try after the job completed returns its result instead of running it again
    result = operator().execute(context={"task_state_store": state})
    assert (result["job_id"], result["state"]) == (first.job_id, "completed")
    assert reservation_rows(db_url) == 1


def test_on_kill_cancels_the_job_and_releases_every_pilot(
    db_url: str, center: RunningCenter
) -> None:
    op = operator(command="sleep 60")
    trigger = deferred(op)
    with engine_on(db_url, center.url) as engine:
        scan_until(engine, trigger.job_id, ReservationPhase.DISPATCHED)

        op.on_kill()

        record = engine.status(trigger.job_id)
        assert record.state is ReservationPhase.CANCELLED
        assert [p.state for p in record.pilots] == [PilotState.RELEASED] * 3
        assert live_pilot_holds(engine) == []
        wait_local_jobs_ended(engine)  # the ranks and their pilots were stopped
        engine.scan()
    assert_capacity_invariant(db_url, no_live_holds=True)


# -- the real command's output ------------------------------------------------------------------


class LogLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def logger_into(handler: LogLines) -> logging.Logger:
    logger = logging.getLogger(f"tests.coreserve.{id(handler)}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    return logger


def test_each_ranks_output_is_copied_and_a_failed_ranks_stderr_tail_ends_the_log(
    db_url: str, center: RunningCenter
) -> None:
    # The command runs inside the pilot and writes to the pilot's site job files.
    command = (
        'echo "rank $GRIDCORE_COMPONENT says hi";'
        ' if [ "$GRIDCORE_COMPONENT" = 1 ]; then echo "rank 1: out of memory" >&2; exit 3; fi'
    )
    op = operator(command=command, processors=2)
    trigger = deferred(op)
    copied = LogLines()
    trigger._log = logger_into(copied)  # the edge to the task log (structlog in the triggerer)

    payload = run_trigger(trigger)

    assert payload["status"] == "failed", payload
    rank1 = next(p for p in payload["record"]["pilots"] if p["component"] == 1)
    prefix = f"[component 1 @ {rank1['site']}]"
    assert f"{prefix} [stdout] rank 1 says hi" in copied.lines
    assert f"{prefix} [stderr] rank 1: out of memory" in copied.lines
    [entry] = [o for o in payload["output"] if o["label"] == f"component 1 @ {rank1['site']}"]
    assert (entry["job_id"], entry["failed"]) == (rank1["site_job_id"], True)

    task_log = LogLines()
    op._cached_logger = logger_into(task_log)  # the worker's edge to the task log
    with pytest.raises(AirflowException, match="failed"):
        op.execute_complete({}, payload)
    assert task_log.lines[0].startswith(f"{prefix} [gridcore] stderr of the job (")
    assert task_log.lines[-1] == f"{prefix} [stderr] rank 1: out of memory"


# -- the trigger -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_trigger_on_kill_cancels_the_job_and_its_one_event_says_so(
    db_url: str, center: RunningCenter, monkeypatch: pytest.MonkeyPatch
) -> None:
    trigger = await asyncio.to_thread(deferred, operator(command="sleep 60", processors=2))
    with engine_on(db_url, center.url) as engine:
        await asyncio.to_thread(scan_until, engine, trigger.job_id, ReservationPhase.DISPATCHED)

        as_airflow_holds(trigger, "failed", monkeypatch)  # the user marked it failed
        await trigger.on_kill()
        events = await all_events(trigger.run())
        await trigger.cleanup()

        assert len(events) == 1
        payload = events[0].payload
        assert set(payload) == EVENT_KEYS
        assert (payload["status"], payload["id"]) == ("failed", trigger.job_id)
        assert payload["subject"] == "co-reserved job"
        assert "cancelled" in payload["message"]
        assert payload["record"]["state"] == "cancelled"
        assert [p["state"] for p in payload["record"]["pilots"]] == ["released"] * 2
        assert await asyncio.to_thread(live_pilot_holds, engine) == []
        await asyncio.to_thread(wait_local_jobs_ended, engine)
        await asyncio.to_thread(engine.scan)
    assert_capacity_invariant(db_url, no_live_holds=True)
    with pytest.raises(AirflowException, match=f"job {trigger.job_id}: failed: .*cancelled"):
        operator().execute_complete({}, payload)


# -- the event contract ----------------------------------------------------------------------


def test_execute_complete_maps_failed_error_and_malformed_events_to_failures() -> None:
    op = operator()
    failed = {"status": "failed", "message": "component 1 (pilot 4 at local-b) exited 3",
              "subject": "co-reserved job", "id": 7, "record": {"state": "failed"}}  # fmt: skip
    with pytest.raises(AirflowException, match=r"job 7: failed: component 1 .* exited 3"):
        op.execute_complete({}, failed)
    with pytest.raises(AirflowException, match="error: gridcore: boom"):
        op.execute_complete({}, dict(ENGINE_WAITS[CORESERVATION].error_event(7, "gridcore: boom")))
    with pytest.raises(AirflowException, match="lacks key"):
        op.execute_complete({}, {"status": "success"})
    with pytest.raises(AirflowException, match="about a 'co-allocated job'"):
        op.execute_complete({}, {**failed, "status": "success", "subject": "co-allocated job"})


def test_execute_complete_maps_a_success_record_to_the_xcom_in_rank_order() -> None:
    record = {
        "job_id": 7, "name": "d.t.-1", "state": "completed", "clusters": {"a": 1, "b": 1},
        "t_avail_s": [0.0, 1.5], "lifetime_s": 60.0, "coallocation_s": 0.4,
        "dispatch_skew_s": 0.01, "shifts_received": 1, "shifts_given": 0, "substitutes": 2,
        "reorganizations": 1,
        "pilots": [
            {"id": 9, "site": "b", "site_job_id": "19", "component": 1,
             "resources": {"time_limit_s": 1020}},
            {"id": 8, "site": "a", "site_job_id": "18", "component": 0,
             "resources": {"time_limit_s": 960, "qos": "q"}},
            {"id": 3, "site": "a", "site_job_id": "13", "component": None},  # lost
        ],
    }  # fmt: skip
    event = {"status": "success", "message": "ok", "subject": "co-reserved job", "id": 7,
             "record": record}  # fmt: skip

    result = operator().execute_complete({}, event)

    assert set(result) >= DOCUMENTED_KEYS
    assert (result["sites"], result["site_job_ids"]) == (["a", "b"], ["18", "19"])
    assert result["resources"] == [{"time_limit_s": 960, "qos": "q"}, {"time_limit_s": 1020}]
    per_rank = {"sites", "site_job_ids", "resources"}
    assert {k: result[k] for k in DOCUMENTED_KEYS - per_rank} == {
        k: record[k] for k in DOCUMENTED_KEYS - per_rank
    }


def test_each_pilot_asks_for_its_lifetime_plus_the_commands_time_limit(
    db_url: str, grid_with_defaults: Path
) -> None:
    result = operator(
        command="true", processors=2, max_clusters=2, time_limit="10m", lifetime_floor_s=120.0
    ).execute(context={})

    assert result["state"] == ReservationPhase.COMPLETED and result["lifetime_s"] >= 120.0
    # the lifetime (Eq. 2, at least the floor) + 600 s + max(300 s, 10 %)
    limit = pilot_time_limit(result["lifetime_s"], 600)
    assert limit == math.ceil(result["lifetime_s"] + 600 + 300)
    by_site = {"local-a": {"account": "proj42", "memory_mib": 1024, "memory_per": "node"},
               "local-b": {"qos": "short"}, "local-c": {}}  # fmt: skip
    assert result["resources"] == [
        {"time_limit_s": limit, **by_site[site]} for site in result["sites"]
    ]
    runtime = GridRuntime.open(db_url=db_url, upgrade=False)
    try:
        for site, job_id in zip(result["sites"], result["site_job_ids"], strict=True):
            local = runtime.adapter(site)
            assert isinstance(local, LocalSite)
            assert (local.workdir(job_id) / TIME_LIMIT_FILE).read_text().strip() == str(limit)
    finally:
        runtime.store.dispose()
