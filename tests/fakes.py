"""Fakes at I/O edges, shared by the test modules (fakes live only under tests/)."""

from __future__ import annotations

import threading
import time
from typing import Any


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

    def find(self, key: str) -> str | None:
        found = self.inner.find(key)
        return None if found is None else str(found) + self.job_id_suffix

    def status(self, job_id: str) -> Any:
        if self.status_error is not None:
            raise self.status_error
        return self.inner.status(job_id)
