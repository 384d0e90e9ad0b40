"""Fakes at I/O edges, shared by the test modules (fakes live only under tests/)."""

from __future__ import annotations

import io
import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests
from requests.adapters import BaseAdapter

from gridcore.errors import RequestError, UnknownJob
from gridcore.model import (
    JobResources,
    JobState,
    JobStatus,
    JobSubmission,
    ObservedJob,
    SiteObservation,
    SiteSpec,
)
from gridcore.sites.output import OutputFiles


@dataclass(frozen=True)
class FakeTriggerTaskInstance:
    """The task instance a triggerer gives a trigger (``trigger.task_instance``), whose
    state in Airflow's database is ``state`` (what the execution API would answer:
    ``sensors.base.task_instance_state``, the seam :func:`as_airflow_holds` replaces)."""

    state: str | None
    dag_id: str = "dag"
    task_id: str = "task"
    run_id: str = "run"
    map_index: int = -1


def as_airflow_holds(trigger: Any, state: str | None, monkeypatch: Any) -> None:
    """Give ``trigger`` a task instance Airflow holds in ``state`` ("failed": a user
    marked it failed; None: cleared; "deferred": the trigger was only moved)."""
    from gridcore_airflow.sensors import base

    trigger.task_instance = FakeTriggerTaskInstance(state)
    monkeypatch.setattr(base, "task_instance_state", lambda ti: ti.state)


class FakeTaskStateStore:
    """Airflow 3.3's ``context["task_state_store"]``: one per task instance, all tries."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        self.values[key] = value

    def delete(self, key: str) -> None:
        self.values.pop(key, None)


@dataclass
class FakeJob:
    """One job as :class:`FakeSite` holds it."""

    job_id: str
    submission: JobSubmission
    submitted_at: float
    state: JobState = JobState.PENDING
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    user: str | None = None  # who it runs as (the submitting site's user)

    @property
    def key(self) -> str | None:
        return self.submission.key


@dataclass
class FakeSite:
    """A site adapter (:class:`gridcore.sites.base.SiteAdapter`) in memory, for unit
    tests of engines and operators: no process, no file, no database of its own.

    It does NOT deduplicate by submission key: two submissions with one key are two
    jobs, as on Slurm, so what a test sees is the engines' own exactly-once logic;
    ``find(key)`` looks up what was submitted with the key. A job stays pending until
    the test ends it (:meth:`finish`). ``after_accept`` runs after the site recorded a
    submission and before its id is returned (a test's submitter dies there). ``forgets_finished``:
    as a Slurm controller past MinJobAge, ``find`` sees a finished job only when asked
    with ``since`` (its accounting records)."""

    spec: SiteSpec
    forgets_finished: bool = False
    user: str | None = None  # unknown: ObservedJob.user is None too
    clock: Callable[[], float] = time.time
    after_accept: Callable[[FakeJob], None] | None = None
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    cancelled: list[str] = field(default_factory=list)

    def observe(self) -> SiteObservation:
        busy = sum(j.submission.processors for j in self.jobs.values() if not j.state.finished)
        listed = tuple(
            ObservedJob(
                j.job_id,
                j.submission.processors,
                j.state,
                j.key,
                j.submitted_at,
                j.started_at,
                name=j.submission.name,
                user=j.user,
            )
            for j in self.jobs.values()
            if not j.state.finished
        )
        total = self.spec.processors
        return SiteObservation(
            self.spec.name, total, max(0, total - busy), listed, observed_at=self.clock()
        )

    def submit(self, job: JobSubmission) -> str:
        self.check_request(job.name, job.processors, job.resources)
        fake = FakeJob(str(len(self.jobs) + 1), job, self.clock(), user=self.user)
        self.jobs[fake.job_id] = fake
        if self.after_accept is not None:
            self.after_accept(fake)
        return fake.job_id

    def check_request(self, name: str, processors: int, resources: JobResources) -> None:
        if processors > self.spec.processors:
            raise RequestError(
                f"site {self.spec.name}: job {name!r} asks {processors} processors,"
                f" the site has {self.spec.processors}"
            )

    def find(self, key: str, since: float | None = None) -> str | None:
        found = [
            j.job_id
            for j in self.jobs.values()
            if j.key == key
            and (since is None or j.submitted_at >= since)
            and (since is not None or not (self.forgets_finished and j.state.finished))
        ]
        return found[0] if found else None

    def status(self, job_id: str) -> JobStatus:
        job = self._job(job_id)
        return JobStatus(
            job_id,
            job.state,
            job.exit_code,
            job.submitted_at,
            job.started_at,
            job.finished_at,
        )

    def cancel(self, job_id: str) -> None:
        job = self._job(job_id)
        if not job.state.finished:
            job.state, job.finished_at = JobState.CANCELLED, self.clock()
            self.cancelled.append(job_id)

    def output_files(self, job_id: str) -> OutputFiles:
        self._job(job_id)
        return OutputFiles(
            f"memory://{self.spec.name}/{job_id}.out", f"memory://{self.spec.name}/{job_id}.err"
        )

    def finish(self, job_id: str, state: JobState = JobState.COMPLETED) -> None:
        """End the job as ``state`` (a completed job exits 0, any other 1)."""
        job = self._job(job_id)
        job.started_at = job.started_at or self.clock()
        job.state, job.finished_at = state, self.clock()
        job.exit_code = 0 if state is JobState.COMPLETED else 1

    def keyed(self, key: str) -> list[FakeJob]:
        """Every job submitted with ``key`` (exactly-once: at most one)."""
        return [j for j in self.jobs.values() if j.key == key]

    def _job(self, job_id: str) -> FakeJob:
        if job_id not in self.jobs:
            raise UnknownJob(f"site {self.spec.name}: no job {job_id}")
        return self.jobs[job_id]


class FaultySite:
    """A site adapter wrapping a real one, with faults at its I/O edge: ``gate`` holds
    every submission until it is set (``entered`` tells the test one is held), as a
    slow slurmrestd would; ``delay_s`` slows submissions; ``submit_error`` and
    ``status_error`` are raised instead of the call; ``job_id_suffix`` lengthens the
    site job ids it returns and finds (a site whose ids do not fit our column). Anything else is
    the wrapped adapter's."""

    def __init__(
        self,
        inner: Any,
        *,
        gate: threading.Event | None = None,
        delay_s: float = 0.0,
        submit_error: BaseException | None = None,
        status_error: BaseException | None = None,
        job_id_suffix: str = "",
    ) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.gate = gate
        self.delay_s = delay_s
        self.submit_error = submit_error
        self.status_error = status_error
        self.job_id_suffix = job_id_suffix
        self.entered = threading.Event()
        self.submitted: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def submit(self, job: Any) -> str:
        self.entered.set()
        if self.gate is not None and not self.gate.wait(timeout=120):
            raise TimeoutError("FaultySite: the test never opened the gate")
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.submit_error is not None:
            raise self.submit_error
        site_job_id = str(self.inner.submit(job))
        self.submitted.append(site_job_id)
        return site_job_id + self.job_id_suffix

    def find(self, key: str, since: float | None = None) -> str | None:
        found = self.inner.find(key, since)
        return None if found is None else str(found) + self.job_id_suffix

    def status(self, job_id: str) -> Any:
        if self.status_error is not None:
            raise self.status_error
        return self.inner.status(job_id)


SlurmReply = tuple[int, Any] | Exception
"""A canned slurmrestd answer: (HTTP status, JSON body or raw text), or a transport error."""


class FakeSlurmrestd(BaseAdapter):
    """slurmrestd at the ``requests`` edge (httpx's MockTransport, for requests): answers
    each (method, path) from a table, ``path`` being the URL without ``prefix`` and
    without the moving ``start_time=`` of accounting look-ups; an entry may be a list of
    replies given in turn (the last one repeats). ``missing`` answers paths the table
    lacks (None: a KeyError fails the test). Records every request it saw."""

    def __init__(
        self,
        replies: Mapping[tuple[str, str], SlurmReply | list[SlurmReply]],
        prefix: str,
        missing: Callable[[str, str], SlurmReply | None] | None = None,
    ) -> None:
        super().__init__()
        self.replies = {k: list(v) if isinstance(v, list) else [v] for k, v in replies.items()}
        self.prefix = prefix
        self.missing = missing
        self.sent: list[requests.PreparedRequest] = []

    def send(  # type: ignore[override]
        self, request: requests.PreparedRequest, **kwargs: Any
    ) -> requests.Response:
        self.sent.append(request)
        method = request.method or ""
        path = (request.url or "").removeprefix(self.prefix)
        path = re.sub(r"start_time=\d+&?", "", path).rstrip("?&")
        queue = self.replies.get((method, path))
        fallback = self.missing(method, path) if queue is None and self.missing else None
        if queue is None and fallback is None:
            raise KeyError((method, path))
        reply = fallback if queue is None else queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(reply, Exception):
            raise reply
        assert reply is not None
        status, body = reply
        resp = requests.Response()
        resp.status_code = status
        resp.raw = io.BytesIO((body if isinstance(body, str) else json.dumps(body)).encode())
        resp.encoding = "utf-8"
        resp.request = request
        resp.url = request.url or ""
        return resp

    def close(self) -> None:
        """Nothing to release."""

    def paths(self) -> list[str]:
        return [f"{r.method} {(r.url or '').removeprefix(self.prefix)}" for r in self.sent]

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.body or b"") for r in self.sent if r.method == "POST"]


class FakeClock:
    """A clock a test moves by hand (``clock.now += 10``)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def fake_site_runtime(tmp_path: Any, clock: FakeClock) -> Any:
    """A GridRuntime over the embedded grid's sites as :class:`FakeSite` s, on a fresh
    SQLite state database under ``tmp_path`` (dispose ``runtime.store`` after)."""
    from gridcore.config import default_grid
    from gridcore.engine.runtime import GridRuntime
    from gridcore.state.store import open_store

    grid = default_grid(tmp_path)
    fakes = {s.name: FakeSite(s, clock=clock) for s in grid.sites}
    store = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    return GridRuntime(grid, store, adapters=fakes, clock=clock)
