"""SiteJobSensor: wait for a selection someone else made."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from gridcore.engine.runtime import GridRuntime
from gridcore.model import JobRequest, JobSubmission
from gridcore_airflow.sensors.site_job import SiteJobSensor
from gridcore_airflow.sensors.triggers import SiteJobTrigger

WAIT_S = 30.0


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[GridRuntime]:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    monkeypatch.setenv("GRIDCORE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GRIDCORE_DB_URL", url)
    monkeypatch.delenv("GRIDCORE_GRID", raising=False)
    opened = GridRuntime.open(db_url=url)
    try:
        yield opened
    finally:
        opened.store.dispose()


def submitted(runtime: GridRuntime, command: str) -> int:
    record = runtime.select(JobRequest("ext.job.0", 1, runtime_s=1))
    runtime.submit(record.selection_id, JobSubmission("ext.job.0", command, 1))
    return record.selection_id


def sensor(selection_id: Any, **kwargs: Any) -> SiteJobSensor:
    return SiteJobSensor(task_id="wait", selection_id=selection_id, poll_interval=0.05, **kwargs)


def test_deferrable_by_default_with_a_templated_selection_id(runtime: GridRuntime) -> None:
    selection_id = submitted(runtime, "true")
    waiting = sensor(str(selection_id))  # as rendered from "{{ ti.xcom_pull(...) }}"

    with pytest.raises(TaskDeferred) as exc:
        waiting.execute(context={})

    trigger = exc.value.trigger
    assert isinstance(trigger, SiteJobTrigger)
    assert trigger.selection_id == selection_id
    assert "selection_id" in SiteJobSensor.template_fields
    event = asyncio.run(asyncio.wait_for(trigger.run().__anext__(), WAIT_S)).payload
    record = waiting.execute_complete({}, event)
    assert (record["selection_id"], record["state"]) == (selection_id, "completed")


def test_poke_mode_returns_the_record_when_the_job_completes(runtime: GridRuntime) -> None:
    selection_id = submitted(runtime, "sleep 0.3")
    waiting = sensor(selection_id, deferrable=False)

    deadline = time.monotonic() + WAIT_S
    while not (poked := waiting.poke({})):
        assert time.monotonic() < deadline
        time.sleep(0.05)

    assert isinstance(poked, PokeReturnValue)
    assert poked.xcom_value["state"] == "completed"
    assert waiting.execute(context={})["selection_id"] == selection_id


def test_a_failed_job_fails_the_sensor(runtime: GridRuntime) -> None:
    selection_id = submitted(runtime, "exit 3")

    with pytest.raises(AirflowException, match="exit code 3"):
        sensor(selection_id, deferrable=False, timeout=WAIT_S).execute(context={})


@pytest.mark.parametrize("value", ["", "abc", 0, -1, True])
def test_a_bad_selection_id_fails_clearly(value: Any) -> None:
    with pytest.raises(AirflowFailException, match="selection_id: must be a positive integer"):
        sensor(value).execute(context={})


def test_an_event_about_another_selection_is_not_taken_for_this_one(runtime: GridRuntime) -> None:
    # Airflow resumed the task instance with another one's trigger event (CI, under load)
    other = submitted(runtime, "true")
    ours = submitted(runtime, "sleep 30")
    try:
        deadline = time.monotonic() + WAIT_S
        while not runtime.poll(other).finished:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        other_event = dict(SiteJobTrigger.contract.event_for(runtime.record(other)))
        assert other_event["status"] == "success"

        with pytest.raises(TaskDeferred) as exc:
            sensor(str(ours)).execute_complete({}, other_event)  # type: ignore[arg-type]
        assert isinstance(exc.value.trigger, SiteJobTrigger)
        assert exc.value.trigger.selection_id == ours
        assert not runtime.record(ours).finished
    finally:
        runtime.cancel(ours)
