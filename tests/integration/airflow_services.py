"""Run Airflow's real services (scheduler, dag-processor, triggerer, execution API) for a test.

``dag.test()`` runs mapped tasks one after another and each deferred trigger inline to
completion, so an ensemble never arrives as a burst there and site selection under
concurrency is never exercised. The tests that need the burst (and the asset watcher,
which only the triggerer runs) start these services against the session's metadata DB,
drop a forcing file, and read the run's outcome from the metadata DB.

Every service runs in its own session (process group) and is stopped through that group,
so nothing they spawned (LocalExecutor workers, trigger runner) is left behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gridcore_airflow.demo.harness import (  # noqa: F401  (re-exported for the tests)
    AIRFLOW_BIN,
    migrate_metadata_db,
    rendered_map_indexes,
    task_states,
    xcom_values,
)

_STOP_GRACE_S = 10.0
_READY_WITHIN_S = 300.0


@dataclass
class AirflowServices:
    log_dir: Path
    env: dict[str, str] = field(repr=False)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @classmethod
    def start(cls, log_dir: Path, extra_env: Mapping[str, str] | None = None) -> AirflowServices:
        port = _free_port()
        env = {
            **os.environ,
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            # Workers authenticate to the execution API with JWTs signed by the scheduler.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            **(extra_env or {}),
        }
        services = cls(log_dir, env)
        log_dir.mkdir(parents=True, exist_ok=True)
        commands = {
            "api-server": [
                "api-server",
                "--apps",
                "execution",
                "-H",
                "127.0.0.1",
                "-p",
                str(port),
                "-w",
                "1",
            ],
            "scheduler": ["scheduler", "--skip-serve-logs"],
            "dag-processor": ["dag-processor"],
            "triggerer": ["triggerer", "--skip-serve-logs"],
        }
        try:
            # The API server first, alone: four Airflow imports at once on a loaded two-core
            # machine kept it from answering within 60 s (CI, stop 28). The others start once
            # it answers, and the deadline only bounds a hang; a service that dies fails at once.
            services._spawn("api-server", commands.pop("api-server"))
            services._wait_http(f"http://127.0.0.1:{port}/execution/health", _READY_WITHIN_S)
            since = datetime.now(UTC)
            for name, args in commands.items():
                services._spawn(name, args)
            # and the scheduler and triggerer have started their jobs, so the callers'
            # own deadlines (a run, a parse) do not pay for their imports
            services._wait_jobs(("SchedulerJob", "TriggererJob"), since, _READY_WITHIN_S)
        except BaseException:
            services.stop()
            raise
        return services

    def _spawn(self, name: str, args: list[str]) -> None:
        with open(self.log_dir / f"{name}.log", "wb") as out:
            self.processes[name] = subprocess.Popen(
                [AIRFLOW_BIN, *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _wait_http(self, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s; logs in {self.log_dir}")

    def _wait_jobs(self, job_types: tuple[str, ...], since: datetime, timeout_s: float) -> None:
        """Until each of ``job_types`` has a running job started at or after ``since`` in
        the metadata DB this process shares with the services."""
        from airflow.jobs.job import Job, JobState
        from airflow.utils.session import create_session

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            with create_session() as session:
                started = {
                    job_type
                    for (job_type,) in session.query(Job.job_type).filter(
                        Job.job_type.in_(job_types),
                        Job.state == JobState.RUNNING,
                        Job.start_date >= since,
                    )
                }
            if started >= set(job_types):
                return
            time.sleep(0.5)
        raise TimeoutError(
            f"{', '.join(job_types)} not all started within {timeout_s:.0f} s; logs in"
            f" {self.log_dir}"
        )

    def check_alive(self) -> None:
        dead = {n: p.returncode for n, p in self.processes.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"Airflow service(s) exited: {dead}; logs in {self.log_dir}")

    def stop(self) -> None:
        for proc in self.processes.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        for proc in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        for proc in self.processes.values():
            # Also reaps children that outlived their service (LocalExecutor workers).
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        self.processes.clear()

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.log_dir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # the group the service leads (start_new_session)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- reading a run's outcome from the metadata DB (the test process is not a task) --


def wait_for_run(dag_id: str, since: datetime, timeout_s: float, services: AirflowServices) -> Any:
    """The first DagRun of ``dag_id`` started at or after ``since`` to finish; fails with
    the service logs on timeout."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        services.check_alive()
        with create_session() as session:
            runs = session.query(DagRun).filter(
                DagRun.dag_id == dag_id,
                DagRun.start_date >= since,
                DagRun.state.in_([DagRunState.SUCCESS, DagRunState.FAILED]),
            )
            done = runs.order_by(DagRun.start_date).first()
            if done is not None:
                session.expunge(done)
                return done
        time.sleep(1.0)
    raise TimeoutError(
        f"no run of {dag_id} since {since} finished within {timeout_s:.0f} s\n"
        f"--- scheduler ---\n{services.log_tail('scheduler')}\n"
        f"--- triggerer ---\n{services.log_tail('triggerer')}"
    )
