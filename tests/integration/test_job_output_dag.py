"""The job_output example DAG: a SiteJobOperator's task log holds its job's own lines,
a failed job's log ends with its stderr tail, and the XCom names the output files.

* ``dag.test()`` (triggers inline): task and trigger logs go to this process's console,
  which ``capfd`` reads at the file descriptors (Airflow's renderer holds its stream).
* the real scheduler, triggerer and LocalExecutor: the lines the triggerer logged and
  the tail the worker logged are read back as the UI reads a task's log (Airflow's
  ``TaskLogReader``, which merges the attempt's file with the triggerer's file)."""

from __future__ import annotations

import gc
import json
import re
import subprocess
import time
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.integration.airflow_services import (
    AIRFLOW_BIN,
    AirflowServices,
    task_states,
    wait_for_run,
    xcom_values,
)
from tests.integration.conftest import IntegrationEnv

pytestmark = pytest.mark.airflow
DAG_ID = "job_output"
# One of our lines as rendered in the console: whatever Airflow puts before it, ours last.
OURS = re.compile(r"(\[(?:stdout|stderr|gridcore)\] .*?)\s*(?:\[[\w.]+\]\s*(?:loc=\S+)?)?$")


def our_lines(console: str) -> list[str]:
    """The job's lines and gridcore's markers, in the order they were logged."""
    found = []
    for line in console.splitlines():
        match = OURS.search(line)
        if match:
            found.append(match.group(1))
    return found


def test_a_site_jobs_own_lines_are_in_its_task_log(
    dagbag: Any, airflow_env: IntegrationEnv, capfd: pytest.CaptureFixture[str]
) -> None:
    run = dagbag.dags[DAG_ID].test(run_conf={"lines": 4, "exit_code": 0})
    console = "".join(capfd.readouterr())

    assert run.state == "success", task_states(DAG_ID, run.run_id)
    [result] = xcom_values(DAG_ID, run.run_id, "job").values()
    site = result["site"]
    lines = our_lines(console)
    assert [x for x in lines if x.startswith("[stdout]")] == [
        f"[stdout] step {i} of 4 on site {site}" for i in range(1, 5)
    ]
    assert [x for x in lines if x.startswith("[stderr]")] == [
        f"[stderr] debug: step {i} done" for i in range(1, 5)
    ]
    # what the job asked for, as sent (the DAG's, over the site's defaults)
    assert result["resources"] == {"time_limit_s": 300, "memory_mib": 256, "memory_per": "node"}
    files = result["output_files"]
    assert Path(files["stdout"]).read_text().splitlines() == [
        f"step {i} of 4 on site {site}" for i in range(1, 5)
    ]
    assert Path(files["stderr"]).read_text().splitlines()[-1] == "debug: step 4 done"


def test_a_failed_jobs_log_ends_with_its_stderr_tail(
    dagbag: Any, airflow_env: IntegrationEnv, capfd: pytest.CaptureFixture[str]
) -> None:
    run = dagbag.dags[DAG_ID].test(run_conf={"lines": 2, "exit_code": 3})
    console = "".join(capfd.readouterr())

    assert run.state == "failed", task_states(DAG_ID, run.run_id)
    assert task_states(DAG_ID, run.run_id) == {("job", -1): "failed"}
    lines = our_lines(console)
    # while it ran: every line, as the trigger copied it
    assert "[stderr] error: giving up after 2 steps, exit code 3" in lines
    # then, before the task failed: the stderr tail, last
    tail = [
        "[stderr] debug: step 1 done",
        "[stderr] debug: step 2 done",
        "[stderr] error: giving up after 2 steps, exit code 3",
    ]
    assert lines[-len(tail) :] == tail, lines
    header = lines[-len(tail) - 1]
    assert re.fullmatch(
        r"\[gridcore\] stderr of the job \(whole, 82 bytes in .*stderr\.txt\):", header
    )
    assert "exit code 3" in console  # the task's failure names it too


# -- Airflow's real services: the log as the UI reads it -----------------------------------


@pytest.fixture(scope="module")
def services(airflow_env: IntegrationEnv) -> Iterator[AirflowServices]:
    running = AirflowServices.start(airflow_env.base / "services-job-output")
    try:
        yield running
    finally:
        running.stop()


def trigger_run(services: AirflowServices, conf: dict[str, Any]) -> None:
    """``airflow dags trigger``, once the dag-processor has parsed the DAG."""
    deadline = time.monotonic() + 120
    while True:
        done = subprocess.run(
            [AIRFLOW_BIN, "dags", "trigger", DAG_ID, "--conf", json.dumps(conf)],
            env=services.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode == 0:
            return
        assert time.monotonic() < deadline, done.stdout + done.stderr
        services.check_alive()
        time.sleep(2)


def task_log(dag_id: str, run_id: str, task_id: str) -> list[str]:
    """The messages of the task's last try, as the UI's log endpoint reads them."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.log.log_reader import TaskLogReader
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = (
            session.query(TaskInstance)
            .filter_by(dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=-1)
            .one()
        )
        # Airflow 3.3.2's reader leaves the log files it streams open (ResourceWarning,
        # an error under this suite): they are collected while that warning is ignored.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            stream, _ = TaskLogReader().read_log_chunks(ti, ti.try_number, {})
            events = [str(getattr(message, "event", "")) for message in stream]
            del stream
            gc.collect()
        return events


def test_with_airflows_services_the_task_log_holds_the_lines_and_ends_with_the_tail(
    services: AirflowServices, airflow_env: IntegrationEnv
) -> None:
    since = datetime.now(UTC)
    trigger_run(services, {"lines": 8, "exit_code": 3})
    run = wait_for_run(DAG_ID, since, 180, services)

    assert run.state == "failed", task_states(DAG_ID, run.run_id)
    events = task_log(DAG_ID, run.run_id, "job")
    ours = [e for e in events if e.startswith(("[stdout]", "[stderr]", "[gridcore]"))]
    # the triggerer's lines, while the job ran
    steps = [e for e in ours if e.startswith("[stdout]")]
    assert [re.sub(r" on site \S+$", "", e) for e in steps] == [
        f"[stdout] step {i} of 8" for i in range(1, 9)
    ], events
    # the worker's, after it: the stderr tail ends what gridcore wrote
    tail = [f"[stderr] debug: step {i} done" for i in range(1, 9)]
    tail.append("[stderr] error: giving up after 8 steps, exit code 3")
    assert ours[-len(tail) :] == tail, events
    assert ours[-len(tail) - 1].startswith("[gridcore] stderr of the job (whole, "), events
