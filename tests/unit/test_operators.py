"""SiteJobOperator against a real GridRuntime: temp SQLite + the embedded local sites."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from sqlalchemy import func, inspect, select

from gridcore.engine import health
from gridcore.engine.runtime import GridRuntime, JobRecord
from gridcore.model import JobResources
from gridcore.sites.local import TIME_LIMIT_FILE, LocalSite
from gridcore.state import capacity
from gridcore.state.schema import selections
from gridcore.state.store import open_store
from gridcore.validation import RESOURCE_KEYS
from gridcore_airflow.operators.base import job_name
from gridcore_airflow.operators.site_job import INPUTS_ENV, SELECTION_KEY, SiteJobOperator
from gridcore_airflow.sensors.triggers import SiteJobTrigger
from tests.fakes import FakeTaskStateStore

RESULT_KEYS = {
    "site",
    "job_id",
    "state",
    "selected_at",
    "started_at",
    "finished_at",
    "queued_s",
    "selection_id",
    "output_files",
    "resources",
}
WAIT_S = 30.0


@pytest.fixture
def runtime(db_url: str) -> Iterator[GridRuntime]:
    opened = GridRuntime.open(db_url=db_url)
    try:
        yield opened
    finally:
        opened.store.dispose()


def operator(**kwargs: Any) -> SiteJobOperator:
    defaults: dict[str, Any] = {
        "task_id": "member",
        "command": "true",
        "processors": 1,
        "runtime_s": 1,
        "poll_interval": 0.05,
    }
    return SiteJobOperator(**{**defaults, **kwargs})


def deferred(op: SiteJobOperator, context: dict[str, Any] | None = None) -> SiteJobTrigger:
    with pytest.raises(TaskDeferred) as exc:
        op.execute(context=context or {})
    assert exc.value.method_name == "execute_complete"
    assert isinstance(exc.value.trigger, SiteJobTrigger)
    return exc.value.trigger


def event_of(trigger: SiteJobTrigger) -> dict[str, Any]:
    async def first() -> Any:
        return await asyncio.wait_for(trigger.run().__anext__(), WAIT_S)

    payload: dict[str, Any] = asyncio.run(first()).payload
    return payload


def selection_rows(db_url: str) -> int:
    store = open_store(db_url)
    try:
        if not inspect(store.engine).has_table(selections.name):
            return 0
        with store.begin() as conn:
            return int(conn.execute(select(func.count()).select_from(selections)).scalar_one())
    finally:
        store.dispose()


# -- execute -> defer -> trigger -> execute_complete ----------------------------------------


def test_execute_selects_submits_and_defers_to_a_trigger_for_the_selection(
    runtime: GridRuntime, db_url: str
) -> None:
    op = operator(command="echo $GRIDCORE_SITE")

    trigger = deferred(op)

    record = runtime.record(trigger.selection_id)
    assert record.name == "adhoc_airflow.member"
    assert record.site == "local-a"  # all idle: the fastest site with the best bandwidth
    assert record.job_id is not None
    assert trigger.poll_interval == 0.05

    result = op.execute_complete({}, event_of(trigger))

    assert set(result) == RESULT_KEYS
    assert (result["site"], result["state"]) == ("local-a", "completed")
    assert result["selection_id"] == trigger.selection_id
    assert result["job_id"] == record.job_id
    assert result["queued_s"] >= 0


def test_a_job_without_a_runtime_estimate_is_said_to_be_assumed_then_taken_from_history(
    runtime: GridRuntime,
) -> None:
    """Issue 21 item 6: runtime_s defaulted to 600 s, so a job of a moment was reported as
    "est. completion 600 s"; without one the reasons say 600 s is assumed, and once a job
    finished at the site, its runtime there is used."""

    def local_a(task_id: str) -> str:
        """The reason given for local-a (all idle: the fastest site, chosen)."""
        op = SiteJobOperator(task_id=task_id, command="true", poll_interval=0.05)
        trigger = deferred(op)
        record = runtime.record(trigger.selection_id)
        assert record.site == "local-a"
        op.execute_complete({}, event_of(trigger))  # the job's runtime joins the history
        (reason,) = [r for r in record.reasons if r.startswith("site local-a: ")]
        return reason

    assert local_a("first").endswith("est. completion 600 s, runtime unknown (600 s assumed)")
    assert re.search(
        r"est\. completion \d+ s, runtime \d+ s from the site's history$", local_a("second")
    )


def test_a_pinned_site_is_used_as_given(runtime: GridRuntime) -> None:
    trigger = deferred(operator(site="local-c"))

    assert runtime.record(trigger.selection_id).site == "local-c"
    assert runtime.record(trigger.selection_id).outcome == "fit"


def test_input_files_size_the_request_and_reach_the_job(tmp_path: Path, db_url: str) -> None:
    inputs = [tmp_path / "wind.nc", tmp_path / "tide.nc"]
    inputs[0].write_bytes(b"\x00" * 300)
    inputs[1].write_bytes(b"\x00" * 200)
    seen = tmp_path / "seen.txt"
    op = operator(
        input_files=[str(p) for p in inputs], command=f'printf %s "${INPUTS_ENV}" > {seen}'
    )

    plan = op.plan_job({})
    result = op.execute_complete({}, event_of(deferred(op)))

    assert plan.request.input_bytes == 500
    assert result["state"] == "completed"
    assert seen.read_text().split(":") == [str(p) for p in inputs]


def test_job_names_are_safe_for_batch_systems() -> None:
    assert job_name("surge ensemble", "member/x", 3) == "surge_ensemble.member_x.3"
    assert job_name("d", "t", -1) == "d.t"  # unmapped: no index, not ".-1"
    assert len(job_name("d" * 300, "t", 1)) == 200


# -- execute_complete: the event contract -----------------------------------------------------


def test_execute_complete_raises_the_sites_message_for_a_failed_job(db_url: str) -> None:
    op = operator(command="exit 3")
    event = event_of(deferred(op))

    with pytest.raises(
        AirflowException, match=r"failed: job \d+ on site local-a failed, exit code 3"
    ):
        op.execute_complete({}, event)


def test_execute_complete_raises_for_an_error_event() -> None:
    with pytest.raises(AirflowException, match="selection 4: error: site alpha: unreachable"):
        operator().execute_complete(
            {}, dict(SiteJobTrigger.contract.error_event(4, "site alpha: unreachable"))
        )


@pytest.mark.parametrize(
    "event",
    [
        None,
        "success",
        {"status": "success", "message": "", "subject": "selection", "id": 1},
        {"status": "weird", "message": "", "subject": "selection", "id": 1, "record": None},
        {"status": "success", "message": "", "subject": "selection", "id": 1, "record": None},
        # A co-allocated job's event handed to a site job's execute_complete:
        {
            "status": "success",
            "message": "",
            "subject": "co-allocated job",
            "id": 1,
            "record": {"state": "completed"},
        },
    ],
    ids=[
        "none",
        "not-a-dict",
        "missing-record",
        "unknown-status",
        "success-without-record",
        "another-triggers-event",
    ],
)
def test_execute_complete_rejects_events_that_break_the_contract(event: Any) -> None:
    with pytest.raises(AirflowException, match="SiteJobTrigger"):
        operator().execute_complete({}, event)


# -- bad input: a clear error before anything is recorded ---------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"site": "nowhere"}, r"site 'nowhere' is not in grid .*local-a, local-b, local-c"),
        ({"processors": 0}, r"request\.processors: must be a positive integer \(.*\), got 0"),
        ({"processors": -2}, r"request\.processors: must be a positive integer \(.*\), got -2"),
        ({"processors": 64}, "no site can run 64 processors"),
        ({"input_files": ["/no/such/forcing.nc"]}, "input_files: not found .*/no/such/forcing.nc"),
        ({"runtime_s": -1}, r"request\.runtime_s: must be a finite number >= 0, got -1"),
        (
            {"protocol": "clever"},
            r"protocol: must be naive \| stateful \| random \| earliest-completion, got 'clever'",
        ),
        ({"insufficient_mode": "wait"}, r"insufficient_mode: must be random \| best \| earliest"),
        ({"command": "  "}, r"job\.command: must not be blank"),
        ({"time_limit": "10x"}, r"time_limit: '10x' is not a duration \(use 90s, 10m, 2h"),
        ({"time_limit": 0}, r"time_limit: must be from 1 second"),
        ({"memory": "1G", "memory_per_cpu": "1G"}, "memory_per_cpu: give memory .* not both"),
        ({"gpus": -1}, r"gpus: must be an integer of GPUs >= 0"),
        ({"gpus": 1}, r"no site can run it: site local-a: .* has no GPUs; site local-b"),
        ({"gpus": 1, "site": "local-b"}, r"no site can run it: site local-b: .* no GPUs$"),
        ({"qos": ""}, "qos: must not be empty"),
    ],
    ids=[
        "unknown-site",
        "zero-processors",
        "negative-processors",
        "too-big-for-every-site",
        "missing-input",
        "negative-runtime",
        "bad-protocol",
        "bad-mode",
        "blank-command",
        "bad-time-limit",
        "zero-time-limit",
        "two-memories",
        "negative-gpus",
        "gpus-on-local-sites",
        "gpus-on-a-pinned-local-site",
        "empty-qos",
    ],
)
def test_bad_input_fails_before_anything_is_recorded(
    db_url: str, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(AirflowFailException, match=message):
        operator(**kwargs).execute(context={})

    assert selection_rows(db_url) == 0


# -- without deferral, and on_kill ----------------------------------------------------------------


def test_non_deferrable_waits_on_the_worker_and_returns_the_result(db_url: str) -> None:
    result = operator(deferrable=False).execute(context={})

    assert set(result) == RESULT_KEYS
    assert result["state"] == "completed"


def test_non_deferrable_failed_job_raises(db_url: str) -> None:
    with pytest.raises(AirflowException, match="exit code 3"):
        operator(deferrable=False, command="exit 3").execute(context={})


def test_on_kill_cancels_the_job_of_a_running_execute(runtime: GridRuntime) -> None:
    op = operator(deferrable=False, command="sleep 60")
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            op.execute(context={})
        except BaseException as exc:  # collected for the assertion below
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + WAIT_S
    while op._selection_id is None or runtime.record(op._selection_id).job_id is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)

    op.on_kill()
    worker.join(WAIT_S)

    assert runtime.record(op._selection_id).state == "cancelled"
    assert len(outcome) == 1 and isinstance(outcome[0], AirflowException)
    assert "cancelled" in str(outcome[0])


# -- retries reattach through the task state store ----------------------------------------


def wait_finished(runtime: GridRuntime, selection_id: int) -> JobRecord:
    deadline = time.monotonic() + WAIT_S
    while not (record := runtime.poll(selection_id)).finished:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return record


def test_a_retry_reattaches_to_the_running_job_instead_of_submitting_again(
    runtime: GridRuntime, db_url: str
) -> None:
    state = FakeTaskStateStore()
    first = deferred(operator(command="sleep 0.5"), {"task_state_store": state})
    assert state.values == {SELECTION_KEY: first.selection_id}

    # The first try was lost (worker crash, stale executor event): a new try, same store.
    retry = deferred(operator(command="sleep 0.5"), {"task_state_store": state})

    assert retry.selection_id == first.selection_id
    assert selection_rows(db_url) == 1
    result = operator().execute_complete({"task_state_store": state}, event_of(retry))
    assert result["state"] == "completed"


def test_a_retry_after_the_job_completed_returns_its_result(
    runtime: GridRuntime, db_url: str
) -> None:
    state = FakeTaskStateStore()
    first = deferred(operator(), {"task_state_store": state})
    wait_finished(runtime, first.selection_id)

    result = operator().execute(context={"task_state_store": state})

    assert (result["selection_id"], result["state"]) == (first.selection_id, "completed")
    assert selection_rows(db_url) == 1


def test_a_retry_after_the_job_failed_starts_a_new_one(runtime: GridRuntime, db_url: str) -> None:
    state = FakeTaskStateStore()
    first = deferred(operator(command="exit 3"), {"task_state_store": state})
    wait_finished(runtime, first.selection_id)

    retry = deferred(operator(command="exit 3"), {"task_state_store": state})

    assert retry.selection_id != first.selection_id
    assert state.values == {SELECTION_KEY: retry.selection_id}
    assert selection_rows(db_url) == 2


class BrokenTaskStateStore(FakeTaskStateStore):
    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        raise RuntimeError("execution API unavailable")


def test_a_selection_that_cannot_be_persisted_is_released(runtime: GridRuntime) -> None:
    with pytest.raises(RuntimeError, match="execution API unavailable"):
        operator().execute(context={"task_state_store": BrokenTaskStateStore()})

    with runtime.store.begin() as conn:
        totals = capacity.totals(conn)
        states = list(conn.execute(select(selections.c.state)).scalars())
    assert states == ["cancelled"]
    assert {site: t for site, t in totals.items() if any(t)} == {}


# -- resources: asked, merged over the site's defaults, shown in XCom ----------------------


def test_the_xcom_shows_the_resources_sent_over_the_sites_defaults(
    grid_with_defaults: Path, runtime: GridRuntime
) -> None:
    op = operator(site="local-a", time_limit="10m", memory_per_cpu="512M", constraint="x86")
    trigger = deferred(op)
    result = op.execute_complete({}, event_of(trigger))

    # asked: time limit, per-cpu memory, constraint; local-a's defaults: account, memory
    # (per node, replaced by the per-cpu memory asked), time limit (replaced)
    assert result["resources"] == {
        "time_limit_s": 600,
        "account": "proj42",
        "constraint": "x86",
        "memory_mib": 512,
        "memory_per": "cpu",
    }
    site = runtime.adapter("local-a")
    assert isinstance(site, LocalSite)
    workdir = site.workdir(str(result["job_id"]))
    assert (workdir / TIME_LIMIT_FILE).read_text().strip() == "600"  # what the site enforces


def test_a_job_asking_nothing_gets_its_sites_defaults_or_nothing(
    grid_with_defaults: Path,
) -> None:
    op = operator(site="local-b")
    assert op.execute_complete({}, event_of(deferred(op)))["resources"] == {"qos": "short"}
    op = operator(site="local-c", time_limit=90)  # an integer: seconds
    assert op.execute_complete({}, event_of(deferred(op)))["resources"] == {"time_limit_s": 90}


def test_resources_are_templated_and_a_rendered_gpu_count_is_a_number(db_url: str) -> None:
    assert set(RESOURCE_KEYS) <= set(SiteJobOperator.template_fields)
    assert operator(gpus="2", time_limit="90").plan_resources() == JobResources(
        time_limit_s=5400,
        gpus=2,  # "90" rendered: Slurm's 90 minutes
    )
    result = operator(deferrable=False).execute(context={})
    assert result["resources"] == {}  # the embedded default's sites have no defaults


def test_a_try_waits_while_every_site_is_only_set_aside_and_runs_when_a_probe_restores_one(
    runtime: GridRuntime,
) -> None:
    """No usable site now is a reason to wait, not to fail for good (issue 21 item 17):
    every select refreshes, which probes the unusable sites; a completed probe restores
    its site and the try goes on, in this same try."""
    with runtime.store.begin() as conn:
        for site in runtime.grid.site_names:
            for _ in range(health.UNUSABLE_AFTER_ERRORS):
                health.record_failure(conn, site, "connection refused")
        assert not any(h.usable for h in health.read_health(conn).values())

    trigger = deferred(operator())

    record = runtime.record(trigger.selection_id)
    assert record.job_id is not None
    with runtime.store.begin() as conn:
        assert health.read_health(conn)[record.site].usable  # restored by its probe
