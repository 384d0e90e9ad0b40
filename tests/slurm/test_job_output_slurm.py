"""A site job's own output on the real Slurm grid: slurmrestd says where the job writes
(``SlurmSite.output_files``), the trigger copies its lines into the task log while it
runs, and a failed job's stderr tail is read from the cluster's file."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException

from gridcore.config import load_grid
from gridcore.engine.runtime import GridRuntime
from gridcore.model import JobRequest, JobSubmission
from gridcore.state.store import open_store
from gridcore_airflow.sensors.triggers import SiteJobTrigger
from tests.slurmgrid import SlurmGrid

pytestmark = pytest.mark.slurm
WAIT_S = 60.0
SITE = "gamma"


class LogLines(logging.Handler):
    """What a logger was given, in order: the edge to the task log."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def logger_into(handler: LogLines) -> logging.Logger:
    logger = logging.getLogger(f"tests.slurm.output.{id(handler)}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    return logger


@pytest.fixture
def db_url(slurm_grid: SlurmGrid, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name, value in slurm_grid.env.items():
        monkeypatch.setenv(name, value)
    url = f"sqlite:///{tmp_path}/state.db"
    open_store(url, upgrade=True).dispose()
    yield url


@pytest.mark.asyncio
async def test_a_slurm_jobs_output_reaches_the_log_as_it_runs_and_its_tail_the_failure(
    slurm_grid: SlurmGrid, db_url: str
) -> None:
    storage = slurm_grid.cluster(SITE).storage_dir
    seen = storage / f"seen-{uuid.uuid4().hex}"  # on the cluster's (shared) file system
    command = (
        "echo 'step 1 on the cluster'; echo 'careful: coarse mesh' >&2;"
        f" while [ ! -e {seen} ]; do sleep 0.1; done;"
        " echo 'step 2 on the cluster'; echo 'fatal: no convergence' >&2; exit 3"
    )
    runtime = GridRuntime(load_grid(slurm_grid.grid_toml), open_store(db_url))
    try:
        record = runtime.select(JobRequest("out.slurm.0", 1, runtime_s=5), site=SITE)
        record = runtime.submit(record.selection_id, JobSubmission("out.slurm.0", command, 1))
    finally:
        runtime.store.dispose()
    trigger = SiteJobTrigger(
        record.selection_id, grid_file=str(slurm_grid.grid_toml), db_url=db_url, poll_interval=0.2
    )
    copied = LogLines()
    trigger._log = logger_into(copied)  # structlog in the triggerer; the same calls
    waiting = asyncio.ensure_future(asyncio.wait_for(trigger.run().__anext__(), WAIT_S))

    deadline = time.monotonic() + WAIT_S
    while "[stderr] careful: coarse mesh" not in copied.lines:  # the job is still running
        assert time.monotonic() < deadline and not waiting.done(), copied.lines
        await asyncio.sleep(0.1)
    seen.touch()
    event = await waiting
    await trigger.cleanup()

    assert [line for line in copied.lines if line.startswith("[stdout]")] == [
        "[stdout] step 1 on the cluster",
        "[stdout] step 2 on the cluster",
    ]
    assert [line for line in copied.lines if line.startswith("[stderr]")] == [
        "[stderr] careful: coarse mesh",
        "[stderr] fatal: no convergence",
    ]
    payload = event.payload
    assert payload["status"] == "failed", payload
    [output] = payload["output"]
    job_id = payload["record"]["job_id"]
    assert (output["site"], output["job_id"]) == (SITE, job_id)
    # where the Slurm adapter submitted the job to write: <storage_dir>/<name>-<id>.out|.err
    assert output["stdout"] == str(storage / f"out.slurm.0-{job_id}.out")
    assert output["stderr"] == str(storage / f"out.slurm.0-{job_id}.err")
    assert Path(output["stdout"]).read_text() == "step 1 on the cluster\nstep 2 on the cluster\n"

    task_log = LogLines()
    with pytest.raises(AirflowException, match="exit code 3"):
        SiteJobTrigger.contract.completed_record(payload, logger_into(task_log))
    assert task_log.lines == [
        f"[gridcore] stderr of the job (whole, 43 bytes in {output['stderr']}):",
        "[stderr] careful: coarse mesh",
        "[stderr] fatal: no convergence",
    ]
    seen.unlink()
