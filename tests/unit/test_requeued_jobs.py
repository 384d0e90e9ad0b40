"""A job the site queues again (Slurm's requeue after a node failure or preemption) or
holds is pending, not failed: the selection's record says why, the trigger's task log
says it once, and the job that runs again and completes ends the task as completed.
The site's answers are scripted at the adapter edge (the real ones are tested against
the Slurm clusters in tests/slurm/test_slurm_contract.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gridcore.config import default_grid
from gridcore.engine.runtime import GridRuntime
from gridcore.errors import RequestError
from gridcore.model import (
    JobRequest,
    JobResources,
    JobState,
    JobStatus,
    JobSubmission,
    JobUsage,
)
from gridcore.sites.base import SiteAdapter
from gridcore.state.store import open_store
from gridcore.submit import plan_submit, submit_planned

GPU = JobResources(gpus=1)


@dataclass
class ScriptedStatus:
    """The real local site for submitting; status answers taken from ``script``."""

    inner: SiteAdapter
    script: list[JobStatus] = field(default_factory=list)
    refuse: str | None = None  # what check_request says (e.g. a partition's MaxTime)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def check_request(self, name: str, processors: int, resources: JobResources) -> None:
        if self.refuse is not None:
            raise RequestError(f"site local-a: job {name} cannot run there: {self.refuse}")
        self.inner.check_request(name, processors, resources)

    def status(self, job_id: str) -> JobStatus:
        return self.script.pop(0)


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[tuple[GridRuntime, ScriptedStatus]]:
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    base = GridRuntime(default_grid(tmp_path / "home"), store)
    scripted = ScriptedStatus(base.adapter("local-a"))
    yield GridRuntime(base.grid, store, adapters={"local-a": scripted}), scripted
    store.dispose()


def test_a_requeued_then_held_job_is_pending_with_its_reason_until_it_completes(
    runtime: tuple[GridRuntime, ScriptedStatus],
) -> None:
    rt, scripted = runtime
    record = rt.select(JobRequest("j", 1), site="local-a")
    record = rt.submit(record.selection_id, JobSubmission("j", "true", 1))
    job = str(record.job_id)
    scripted.script = [
        JobStatus(job, JobState.RUNNING, started_at=10.0),
        JobStatus(job, JobState.PENDING, requeued_by="NODE_FAIL", restarts=1),
        JobStatus(job, JobState.PENDING, requeued_by="REQUEUED", held=True, reason="JobHeldAdmin"),
        JobStatus(job, JobState.RUNNING, started_at=20.0, restarts=1),
        JobStatus(job, JobState.COMPLETED, exit_code=0, started_at=20.0, finished_at=30.0),
    ]
    seen = [rt.poll(record.selection_id) for _ in range(5)]
    assert [(r.state, r.message) for r in seen] == [
        ("running", ""),
        ("pending", "requeued by Slurm: NODE_FAIL"),
        ("pending", "requeued by Slurm: REQUEUED; held (JobHeldAdmin)"),
        ("running", ""),
        ("completed", ""),
    ]
    assert seen[-1].exit_code == 0


def test_a_job_held_before_it_ever_ran_says_held(
    runtime: tuple[GridRuntime, ScriptedStatus],
) -> None:
    rt, scripted = runtime
    record = rt.select(JobRequest("j", 1), site="local-a")
    record = rt.submit(record.selection_id, JobSubmission("j", "true", 1))
    job = str(record.job_id)
    scripted.script = [
        JobStatus(job, JobState.PENDING, held=True, reason="JobHeldUser"),
        JobStatus(job, JobState.PENDING, reason="Priority"),
    ]
    assert rt.poll(record.selection_id).message == "held (JobHeldUser)"
    # released, waiting for its turn: nothing more to say
    released = rt.poll(record.selection_id)
    assert (released.state, released.message) == ("pending", "")


def test_what_a_finished_job_used_goes_into_its_record_and_the_task_logs_last_line(
    runtime: tuple[GridRuntime, ScriptedStatus],
) -> None:
    from gridcore_airflow.sensors.triggers import SiteJobTrigger

    rt, scripted = runtime
    record = rt.select(JobRequest("j", 2), site="local-a")
    record = rt.submit(record.selection_id, JobSubmission("j", "true", 2))
    usage = JobUsage(elapsed_s=40.0, cpu_time_s=30.5, cpus=2, max_rss_bytes=50 * 2**20)
    scripted.script = [
        JobStatus(str(record.job_id), JobState.COMPLETED, exit_code=0, finished_at=9.0, usage=usage)
    ]
    done = rt.poll(record.selection_id)
    assert done.usage == usage.as_json()
    assert rt.record(record.selection_id).as_json()["usage"]["cpu_efficiency"] == 30.5 / 80
    event = SiteJobTrigger.contract.event_for(done)
    lines: list[str] = []

    class TaskLog:
        def info(self, fmt: str, *args: object) -> None:
            lines.append(fmt % args)

    SiteJobTrigger.contract.completed_record(dict(event), TaskLog())
    assert lines[-1] == (
        "job used (site accounting): elapsed 40 s, CPU time 30.5 s on 2 CPU(s), "
        "CPU efficiency 38.1%, max RSS 50.0 MiB"
    )


def test_requests_a_site_refuses_do_not_set_the_site_aside(
    runtime: tuple[GridRuntime, ScriptedStatus],
) -> None:
    """A request no node can run (here: GPUs on a local site) is the request's fault:
    the selection fails, the site's health is untouched (unusable after 3 counted)."""
    rt, _ = runtime
    for i in range(4):
        record = rt.select(JobRequest(f"gpu{i}", 1), site="local-a")
        with pytest.raises(RequestError, match="GPU"):
            rt.submit(record.selection_id, JobSubmission(f"gpu{i}", "true", 1, resources=GPU))
        assert rt.record(record.selection_id).state == "failed"
    [site] = [s for s in rt.site_rows() if s.name == "local-a"]
    assert (site.usable, site.consecutive_errors) == (True, 0)


def test_a_choice_among_sites_skips_those_that_would_refuse_the_request(
    runtime: tuple[GridRuntime, ScriptedStatus],
) -> None:
    """As ``sbatch -M``: a site whose limits refuse the request is not chosen; with
    none left the request is refused naming each site's reason, nothing written."""
    rt, scripted = runtime
    scripted.refuse = "time_limit: 02:00:00 exceeds partition debug's MaxTime of 01:00:00"
    plan = plan_submit(rt.grid, ["true"], 1, sites=["local-a", "local-b"])
    assert submit_planned(rt, plan).site == "local-b"
    fit, refused = rt.sites_that_can_run("big", 1, JobResources(gpus=1), ["local-a", "local-c"])
    assert fit == []
    assert refused[0].endswith("MaxTime of 01:00:00")
    assert refused[1] == "site local-c: job 'big' asks for 1 GPU(s); a local site has no GPUs"


def test_a_request_can_ask_no_gpus_where_the_site_default_asks_some() -> None:
    assert JobResources(gpus=0).over(JobResources(gpus=2)).gpus == 0
    assert JobResources().over(JobResources(gpus=2)).gpus == 2
