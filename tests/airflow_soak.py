"""Soak: the README's minimal DAG, no retries, run N times under Airflow's real services.

Issue 21's "done when": the complete minimal DAG of the README (``dags/minimal.py``, two
deferrable :class:`~operators.site_job.SiteJobOperator` tasks, ``retries=0``) runs 50
times under the real scheduler, dag-processor, triggerer and workers, with LocalExecutor
and with CeleryExecutor, with zero failed runs; the same while a second Airflow process
runs ``airflow dags test`` of it beside them, in the README's CLI environment (the same
metadata DB, state DB and grid). Two races of Airflow 3.3.2 fail such runs
(docs/operators.md, "Deferral and Airflow 3.3.2's races"); this harness shows whether
they still do, and measures what the grace of ``sensors.base.DEFER_GRACE_S`` must cover::

    python -m tests.airflow_soak --runs 50 --executor local [--beside-dags-test] --json

LocalExecutor runs :class:`~tests.integration.airflow_services.AirflowServices` on the
demo's environment (SQLite, the embedded local sites: what ``make airflow`` runs);
CeleryExecutor the deployment of ``docker/compose.yaml``
(:mod:`tests.deployment.deployment`: PostgreSQL, Redis, two Celery workers). The report
(one JSON object with ``--json``; exit status 0 only if every run of both succeeded and
no job was cancelled):

- ``runs``, ``succeeded``, ``failed``: each failed run with its task instances' states
  and why (the scheduler's "state mismatch" audit-log entries, the tasks' error lines);
- ``seconds_per_run``: from the run's start to its end, in Airflow's metadata DB;
- ``executor_report_after_deferral_s``: per deferral of a soak run, from the task's
  "Pausing task as DEFERRED" (its task log) to the scheduler's processing of that try's
  executor event ("TaskInstance Finished: ... state=..."; scheduler log), with the task
  instance's state then (``deferred`` unless the trigger's event came first: the race);
  median, p95 and max. The grace must exceed it;
- ``trigger_fired_after_deferral_s``: from the deferral to the trigger's event (its
  trigger log): the grace at work;
- ``beside_dags_test``: each ``airflow dags test`` run's exit status and run state;
- ``cancelled_selections``: gridcore selections of the DAG ended ``cancelled`` (no user
  cancelled anything, so every one is a trigger's on_kill that should not have been);
  ``trigger_kills``: the triggerer's on_kill lines; ``ledger``: the capacity ledger's
  problems after the last run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import select

REPO = Path(__file__).resolve().parents[1]
DAG_ID = "minimal"
DAGS = REPO / "dags"
DAG_FILE = DAGS / "minimal.py"
RUN_TIMEOUT_S = 600.0
"""A run not finished this long after it was triggered counts as failed."""
PARSE_TIMEOUT_S = 300.0
REPORT_WAIT_S = 60.0
POLL_S = 2.0
CLI_PREFIXES = ("AIRFLOW", "GRIDCORE_")
"""The variables of the README's CLI environment (``airflow.env``): the rest of a user's
shell does not name Airflow or gridcore."""


@dataclass(frozen=True)
class RunRow:
    run_id: str
    state: str
    seconds: float | None  # start to end, once ended


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    state: str | None
    try_number: int


class SoakedAirflow(Protocol):
    """Airflow's services running for the soak, whichever the executor."""

    executor: str
    log_dir: Path  # the services' logs: scheduler.log, triggerer.log, ...
    task_log_dir: Path  # Airflow's base_log_folder
    cli_env: Path  # the README's CLI environment, to source before `airflow ...`
    gridcore_db_url: str

    def check_alive(self) -> None: ...

    def unpause_when_parsed(self, dag_id: str) -> None: ...

    def trigger(self, dag_id: str, run_id: str) -> None: ...

    def runs(self, dag_id: str) -> list[RunRow]: ...

    def task_instances(self, dag_id: str, run_id: str) -> list[TaskRow]: ...

    def state_mismatches(self, dag_id: str, run_id: str) -> list[str]: ...


# -- the report ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Deferral:
    """One deferral of a soak run's task, as the logs tell it."""

    run_id: str
    task_id: str
    try_number: int
    deferred_at: datetime
    processed_at: datetime | None  # the scheduler processed the executor's report
    state_then: str | None  # the task instance's state when it did
    fired_at: datetime | None  # the trigger's event

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.run_id, self.task_id, self.try_number)

    @property
    def report_after_s(self) -> float | None:
        if self.processed_at is None:
            return None
        return (self.processed_at - self.deferred_at).total_seconds()

    @property
    def fired_after_s(self) -> float | None:
        return None if self.fired_at is None else (self.fired_at - self.deferred_at).total_seconds()


@dataclass
class DagsTestRun:
    """One ``airflow dags test``: how it exited, its run and why it failed."""

    exit_status: int
    seconds: float
    log: str
    run_id: str | None = None  # from its "DagRun Finished" line
    state: str | None = None
    errors: list[str] = field(default_factory=list)


@dataclass
class SoakReport:
    executor: str
    grace_s: float
    code: str  # where gridcore_airflow's sensors were imported from
    runs: int
    concurrency: int
    succeeded: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)
    seconds_per_run: dict[str, Any] = field(default_factory=dict)
    executor_report_after_deferral_s: dict[str, Any] = field(default_factory=dict)
    trigger_fired_after_deferral_s: dict[str, Any] = field(default_factory=dict)
    beside_dags_test: dict[str, Any] | None = None
    cancelled_selections: list[dict[str, Any]] = field(default_factory=list)
    trigger_kills: dict[str, int] = field(default_factory=dict)
    ledger: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    logs: str = ""

    @property
    def ok(self) -> bool:
        beside = self.beside_dags_test
        # a dags-test run may fail by Airflow's double scheduling (its cause says so),
        # never for another reason
        beside_ok = beside is None or (
            beside["runs"] > 0 and all(f["cause"] == DOUBLE_SCHEDULED for f in beside["failed"])
        )
        return (
            self.succeeded == self.runs
            and beside_ok
            and not self.cancelled_selections
            and not self.ledger
        )

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def distribution(values: Sequence[float]) -> dict[str, Any]:
    """count, median, p95 (nearest rank), min and max, rounded to ms."""
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    p95 = ordered[max(0, -(-95 * len(ordered) // 100) - 1)]
    return {
        "count": len(ordered),
        "median": round(statistics.median(ordered), 3),
        "p95": round(p95, 3),
        "min": round(ordered[0], 3),
        "max": round(ordered[-1], 3),
    }


# -- the soak ------------------------------------------------------------------------------


def soak(
    airflow: SoakedAirflow, runs: int, *, beside_dags_test: bool, concurrency: int = 1
) -> SoakReport:
    """``runs`` runs of the minimal DAG, ``concurrency`` at a time (and ``airflow dags
    test`` of it over and over beside them if asked), then what the logs and databases
    say about them."""
    from gridcore_airflow.sensors import base as sensors_base

    report = SoakReport(
        airflow.executor,
        sensors_base.DEFER_GRACE_S,
        code_version(sensors_base.__file__),
        runs,
        concurrency,
    )
    began, started = time.time(), time.monotonic()
    airflow.unpause_when_parsed(DAG_ID)
    prefix = f"soak-{secrets.token_hex(3)}-"
    loop = DagsTestLoop(airflow.cli_env, DAG_ID, airflow.log_dir) if beside_dags_test else None
    if loop is not None:
        loop.start()
    try:
        finished = run_all(airflow, [f"{prefix}{i:03d}" for i in range(runs)], concurrency)
    finally:
        if loop is not None:
            loop.stop()
    report.wall_s = round(time.monotonic() - started, 1)
    describe_runs(report, airflow, finished)
    describe_deferrals(report, airflow, prefix)
    if loop is not None:
        report.beside_dags_test = loop.summary(airflow.log_dir / "scheduler.log")
    describe_gridcore(report, airflow, began)
    report.logs = str(airflow.log_dir)
    return report


def run_all(airflow: SoakedAirflow, run_ids: Sequence[str], concurrency: int) -> list[RunRow]:
    """Trigger every run, at most ``concurrency`` in flight; each one's end (a run not
    ended within :data:`RUN_TIMEOUT_S` as ``timed out``)."""
    waiting, in_flight, done = list(run_ids), dict[str, float](), dict[str, RunRow]()
    while waiting or in_flight:
        while waiting and len(in_flight) < concurrency:
            run_id = waiting.pop(0)
            airflow.trigger(DAG_ID, run_id)
            in_flight[run_id] = time.monotonic()
        time.sleep(POLL_S)
        airflow.check_alive()
        rows = {row.run_id: row for row in airflow.runs(DAG_ID)}
        for run_id, since in list(in_flight.items()):
            row = rows.get(run_id)
            if row is not None and row.state in ("success", "failed"):
                done[run_id] = row
            elif time.monotonic() - since > RUN_TIMEOUT_S:
                state = f"timed out ({row.state if row else 'absent'})"
                done[run_id] = RunRow(run_id, state, None)
            else:
                continue
            del in_flight[run_id]
            print(f"soak: {run_id} {done[run_id].state}", file=sys.stderr, flush=True)
    return [done[run_id] for run_id in run_ids]


def describe_runs(report: SoakReport, airflow: SoakedAirflow, finished: Sequence[RunRow]) -> None:
    report.succeeded = sum(row.state == "success" for row in finished)
    report.seconds_per_run = distribution([r.seconds for r in finished if r.seconds is not None])
    for row in finished:
        if row.state == "success":
            continue
        tasks = airflow.task_instances(DAG_ID, row.run_id)
        report.failed.append(
            {
                "run_id": row.run_id,
                "state": row.state,
                "tasks": {t.task_id: t.state for t in tasks},
                "reasons": airflow.state_mismatches(DAG_ID, row.run_id)
                + [
                    line
                    for t in tasks
                    if t.state != "success"
                    for line in task_errors(airflow.task_log_dir, row.run_id, t)
                ],
            }
        )


def describe_deferrals(report: SoakReport, airflow: SoakedAirflow, prefix: str) -> None:
    deferrals = wait_for_reports(airflow, prefix)
    reported = [d.report_after_s for d in deferrals if d.report_after_s is not None]
    states: dict[str, int] = {}
    for d in deferrals:
        states[str(d.state_then)] = states.get(str(d.state_then), 0) + 1
    report.executor_report_after_deferral_s = {
        **distribution(reported),
        "deferrals": len(deferrals),
        "state_when_processed": states,
        "raced": [
            f"{d.run_id} {d.task_id}: processed {d.report_after_s} s after deferring, in state"
            f" {d.state_then}"
            for d in deferrals
            if d.state_then not in ("deferred", None)
        ],
    }
    report.trigger_fired_after_deferral_s = distribution(
        [d.fired_after_s for d in deferrals if d.fired_after_s is not None]
    )


def describe_gridcore(report: SoakReport, airflow: SoakedAirflow, since: float) -> None:
    from gridcore.model import JobState
    from gridcore.state.schema import selections
    from gridcore.state.store import open_store
    from tests.capacity_checks import assert_capacity_invariant

    store = open_store(airflow.gridcore_db_url)
    try:
        with store.begin() as conn:
            rows = conn.execute(
                select(selections.c.id, selections.c.name, selections.c.message).where(
                    selections.c.name.like(f"{DAG_ID}.%"),
                    selections.c.selected_at >= since,
                    selections.c.state == JobState.CANCELLED.value,
                )
            ).mappings()
            report.cancelled_selections = [dict(row) for row in rows]
    finally:
        store.dispose()
    for cancelled in report.cancelled_selections:
        cancelled["cancelled_in"] = logs_saying(
            airflow.task_log_dir, f"cancelled selection {cancelled['id']}:"
        )
    try:
        assert_capacity_invariant(airflow.gridcore_db_url, no_live_holds=True)
    except AssertionError as exc:
        report.ledger = [str(exc)]
    report.trigger_kills = trigger_kills(airflow.task_log_dir)


# What a trigger's on_kill logs (the triggerer writes it into the task's trigger log):
# Airflow's "Trigger cancelled by user action, invoking on_kill", then gridcore's
# "... the job is left running" (the task instance still deferred: the trigger only
# moved) or "cancelled selection N: the task instance is <state> now ...".
ON_KILL_LINES = {
    "on_kill invoked": "invoking on_kill",
    "job left running": "the job is left running",
    "cancel requested": "(a user's action",
}


def trigger_kills(task_logs: Path) -> dict[str, int]:
    """How often each of :data:`ON_KILL_LINES` is in the DAG's trigger logs."""
    logs = [read_text(log) for log in (task_logs / f"dag_id={DAG_ID}").glob("*/*/*.trigger.*")]
    return {name: sum(log.count(line) for log in logs) for name, line in ON_KILL_LINES.items()}


# -- reading the logs ----------------------------------------------------------------------

# The scheduler, when it processes an executor's event for a task instance's try
# (SchedulerJobRunner._process_executor_events, Airflow 3.3.2).
_PROCESSED = re.compile(
    r"^(?P<at>\S+)\s.*TaskInstance Finished: dag_id=(?P<dag>[^,]+), task_id=(?P<task>[^,]+),"
    r" run_id=(?P<run>[^,]+), map_index=-?\d+, .*?, state=(?P<state>[^,]+), .*?"
    r"try_number=(?P<try>\d+),"
)
_ATTEMPT = re.compile(r"attempt=(\d+)\.log")  # a try's task log (its trigger's: .trigger.N.log)
_DEFERRED = "Pausing task as DEFERRED"  # the task runner's log line when a task defers
_FIRED = "Trigger fired event"  # the triggerer's, in the trigger's log


Processed = dict[tuple[str, str, int], list[tuple[datetime, str]]]
"""(run, task, try) -> when the scheduler processed an executor event of it, and the
task instance's state then."""
FINAL_STATES = ("success", "failed", "upstream_failed", "up_for_retry")


def wait_for_reports(
    airflow: SoakedAirflow, prefix: str, timeout_s: float = REPORT_WAIT_S
) -> list[Deferral]:
    """The soak's deferrals (:func:`find_deferrals`) once the scheduler has processed
    the last executor event of every try that deferred, or after ``timeout_s``: the
    last ones come after their run has ended, which may have ended the soak."""
    deadline = time.monotonic() + timeout_s
    while True:
        processed = processed_events(airflow.log_dir / "scheduler.log", prefix)
        deferrals = find_deferrals(airflow.task_log_dir, processed, prefix)
        if time.monotonic() > deadline or all(
            any(state in FINAL_STATES for _, state in processed.get(d.key, [])) for d in deferrals
        ):
            return deferrals
        time.sleep(POLL_S)


def processed_events(scheduler_log: Path, prefix: str) -> Processed:
    """The executor events the scheduler processed for runs whose id starts with
    ``prefix``."""
    processed: Processed = {}
    for line in read_text(scheduler_log).splitlines():
        match = _PROCESSED.match(line)
        if match and match["dag"] == DAG_ID and match["run"].startswith(prefix):
            key = (match["run"], match["task"], int(match["try"]))
            processed.setdefault(key, []).append((parse_time(match["at"]), match["state"]))
    return processed


def find_deferrals(task_logs: Path, processed: Processed, prefix: str) -> list[Deferral]:
    """Every deferral of a run whose id starts with ``prefix`` (its task log), with the
    scheduler's first processing of that try's executor event after it (a deferral
    whose report came after the resumed try's, in the same buffer, has that one's) and
    the trigger's event (its trigger log)."""
    deferrals = []
    for attempt in sorted(task_logs.glob(f"dag_id={DAG_ID}/run_id={prefix}*/task_id=*/attempt=*")):
        tried = _ATTEMPT.fullmatch(attempt.name)  # not the trigger's log beside it
        if tried is None:
            continue
        run_id = attempt.parts[-3].removeprefix("run_id=")
        task_id = attempt.parts[-2].removeprefix("task_id=")
        try_number = int(tried[1])
        deferred_at = first_event(attempt, _DEFERRED)
        if deferred_at is None:
            continue
        after = [p for p in processed.get((run_id, task_id, try_number), []) if p[0] >= deferred_at]
        fired = [first_event(t, _FIRED) for t in attempt.parent.glob(f"{attempt.name}.trigger.*")]
        deferrals.append(
            Deferral(
                run_id,
                task_id,
                try_number,
                deferred_at,
                after[0][0] if after else None,
                after[0][1] if after else None,
                min((f for f in fired if f is not None), default=None),
            )
        )
    return deferrals


def first_event(log: Path, event: str) -> datetime | None:
    """When a JSON-lines task or trigger log first logged ``event`` (a prefix)."""
    for line in read_text(log).splitlines():
        if event not in line:
            continue
        with contextlib.suppress(ValueError, KeyError, TypeError):
            record = json.loads(line)
            if str(record["event"]).startswith(event):
                return parse_time(record["timestamp"])
    return None


def task_errors(task_logs: Path, run_id: str, task: TaskRow, limit: int = 5) -> list[str]:
    """The error lines of a task instance's logs (its try's, and its trigger's)."""
    folder = task_logs / f"dag_id={DAG_ID}" / f"run_id={run_id}" / f"task_id={task.task_id}"
    found = []
    for log in sorted(folder.glob(f"attempt={task.try_number}.log*")):
        for line in read_text(log).splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                record = json.loads(line)
                if record["level"] in ("error", "critical"):
                    found.append(f"{task.task_id} ({log.name}): {str(record['event'])[:400]}")
    return found[-limit:] or [f"{task.task_id}: {task.state}, no error line in {folder}"]


def logs_saying(task_logs: Path, text: str) -> list[str]:
    """The task and trigger logs of the DAG (relative paths: run, task, try) with
    ``text`` in them."""
    folder = task_logs / f"dag_id={DAG_ID}"
    return [str(log.relative_to(folder)) for log in folder.glob("*/*/*") if text in read_text(log)]


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def read_text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


# -- `airflow dags test` beside the services -----------------------------------------------


class DagsTestLoop:
    """``airflow dags test <dag>`` again and again in the README's CLI environment (a
    user's shell that sourced ``airflow.env``), each to its end, until stopped; each
    one's output in ``dags-test-<n>.log`` beside the services' logs."""

    def __init__(self, cli_env: Path, dag_id: str, log_dir: Path) -> None:
        self.command = (
            f"set -a; . {shlex.quote(str(cli_env))}; set +a;"
            f" exec {shlex.quote(airflow_bin())} dags test {shlex.quote(dag_id)}"
        )
        self.log_dir = log_dir
        self.done: list[DagsTestRun] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dags-test", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the ``dags test`` under way has ended."""
        self._stop.set()
        self._thread.join(RUN_TIMEOUT_S)

    def _loop(self) -> None:
        shell = {k: v for k, v in os.environ.items() if not k.startswith(CLI_PREFIXES)}
        while not self._stop.is_set():
            log = self.log_dir / f"dags-test-{len(self.done):03d}.log"
            begun = time.monotonic()
            with open(log, "wb") as out:
                done = subprocess.run(
                    ["bash", "-c", self.command],
                    env=shell,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    check=False,
                )
            run = DagsTestRun(done.returncode, round(time.monotonic() - begun, 1), str(log))
            read_dags_test_output(run, read_text(log))
            self.done.append(run)
            print(f"soak: dags test {run.run_id} {run.state}", file=sys.stderr, flush=True)

    def summary(self, scheduler_log: Path) -> dict[str, Any]:
        """How the ``dags test`` runs ended; a failed one with its errors and its
        ``cause``: :data:`DOUBLE_SCHEDULED` (:func:`double_scheduled`) or unexplained."""
        scheduler = read_text(scheduler_log)
        failed = [
            {
                **asdict(r),
                "cause": DOUBLE_SCHEDULED if double_scheduled(r, scheduler) else "unexplained",
            }
            for r in self.done
            if r.exit_status != 0 or r.state != "success"
        ]
        return {
            "runs": len(self.done),
            "succeeded": len(self.done) - len(failed),
            "failed_double_scheduled": sum(f["cause"] == DOUBLE_SCHEDULED for f in failed),
            "seconds": distribution([r.seconds for r in self.done]),
            "failed": failed,
        }


_RUN_FINISHED = re.compile(r"DagRun Finished: dag_id=[^,]+, .*?run_id=([^,]+), .*?, state=(\w+),")
_DETAIL = "Server error detail"  # what the execution API answered (always kept)
_DAGS_TEST_ERRORS = ("[error", "Error")


def read_dags_test_output(run: DagsTestRun, output: str) -> None:
    """Its run id and state (the "DagRun Finished" line ``dag.test()`` logs) and its
    error lines."""
    for line in output.splitlines():
        finished = _RUN_FINISHED.search(line)
        if finished:
            run.run_id, run.state = finished[1], finished[2]
        elif _DETAIL in line or (
            any(marker in line for marker in _DAGS_TEST_ERRORS) and len(run.errors) < 8
        ):
            run.errors.append(line[:400])


DOUBLE_SCHEDULED = "the scheduler queued its task too (Airflow)"
# The execution API refusing a task instance's transition because another process moved
# it ("TI was not in a state where it could be marked as running", "TI was not in the
# running state so it cannot be updated", with the state it found).
_REFUSED = "'reason': 'invalid_state'"


def double_scheduled(run: DagsTestRun, scheduler_log: str) -> bool:
    """Whether the ``dags test`` run failed because the services' scheduler ran its
    task too: its run is an ordinary running DagRun of an unpaused DAG in the same
    metadata DB, so the scheduler queues a task instance ``dag.test()`` has just set to
    scheduled and is about to run itself (as apache/airflow#35994 reports for ``tasks
    test``), and one of the two cannot start it or report its end. Both are required:
    the scheduler's "Trying to enqueue tasks" line naming the run, and the execution API
    refusing a transition of its task instance."""
    if run.run_id is None or not any(_REFUSED in error for error in run.errors):
        return False
    return any(
        "Trying to enqueue tasks" in line and run.run_id in line
        for line in scheduler_log.splitlines()
    )


def code_version(module_file: str) -> str:
    """Where gridcore's Airflow layer was imported from, and its checkout's commit
    ("+changes" when the checkout differs from it)."""
    where = Path(module_file).resolve().parent
    git = ["git", "-C", str(where)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    changed = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    mark = "+changes" if changed.stdout.strip() else ""
    return f"{module_file} at {commit.stdout.strip() or '?'}{mark}"


def airflow_bin() -> str:
    return str(Path(sys.executable).with_name("airflow"))


def write_cli_env(path: Path, variables: Mapping[str, str]) -> Path:
    """The Airflow and gridcore variables of ``variables`` as an env file to source
    (``gridcore_airflow.demo.harness.write_airflow_env``, which writes ``airflow.env``)."""
    from gridcore_airflow.demo.harness import write_airflow_env

    chosen = {k: v for k, v in variables.items() if k.startswith(CLI_PREFIXES)}
    written: Path = write_airflow_env(path, chosen)
    return written


# -- LocalExecutor: AirflowServices, read through Airflow's own models ---------------------


class LocalAirflow:
    """:class:`~tests.integration.airflow_services.AirflowServices` on this process's
    Airflow configuration (its metadata DB is read and written here, in-process)."""

    executor = "LocalExecutor"

    def __init__(self, services: Any, cli_env: Path) -> None:
        from airflow.configuration import conf

        self.services = services
        self.log_dir: Path = services.log_dir
        self.task_log_dir = Path(conf.get("logging", "base_log_folder"))
        self.cli_env = cli_env
        self.gridcore_db_url = os.environ["GRIDCORE_DB_URL"]

    def check_alive(self) -> None:
        self.services.check_alive()

    def unpause_when_parsed(self, dag_id: str) -> None:
        from airflow.models.dag import DagModel
        from airflow.models.serialized_dag import SerializedDagModel
        from airflow.utils.session import create_session

        deadline = time.monotonic() + PARSE_TIMEOUT_S
        while time.monotonic() < deadline:
            self.check_alive()
            with create_session() as session:
                model = session.get(DagModel, dag_id)
                if model is not None and SerializedDagModel.has_dag(dag_id, session=session):
                    model.is_paused = False
                    return
            time.sleep(POLL_S)
        raise TimeoutError(f"{dag_id} not parsed in {PARSE_TIMEOUT_S:.0f} s; see {self.log_dir}")

    def trigger(self, dag_id: str, run_id: str) -> None:
        from airflow.api.common.trigger_dag import trigger_dag
        from airflow.utils.types import DagRunTriggeredByType

        trigger_dag(dag_id, run_id=run_id, triggered_by=DagRunTriggeredByType.CLI)

    def runs(self, dag_id: str) -> list[RunRow]:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session

        with create_session() as session:
            return [
                RunRow(
                    run.run_id,
                    str(run.state),
                    _seconds(run.start_date, run.end_date),
                )
                for run in session.scalars(select(DagRun).where(DagRun.dag_id == dag_id))
            ]

    def task_instances(self, dag_id: str, run_id: str) -> list[TaskRow]:
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session

        with create_session() as session:
            query = select(TaskInstance).where(
                TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id
            )
            return [
                TaskRow(ti.task_id, None if ti.state is None else str(ti.state), ti.try_number)
                for ti in session.scalars(query)
            ]

    def state_mismatches(self, dag_id: str, run_id: str) -> list[str]:
        from airflow.models.log import Log
        from airflow.utils.session import create_session

        with create_session() as session:
            query = select(Log.extra).where(
                Log.dag_id == dag_id, Log.run_id == run_id, Log.event == "state mismatch"
            )
            return [str(extra) for extra in session.scalars(query)]


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else round((end - start).total_seconds(), 1)


@contextlib.contextmanager
def local_airflow(base: Path) -> Iterator[LocalAirflow]:
    """LocalExecutor services on the Airflow and gridcore this process is configured for
    (the demo's environment from :func:`main`, or a test session's)."""
    from tests.integration.airflow_services import AirflowServices

    cli_env = write_cli_env(base, os.environ)
    services = AirflowServices.start(base / "services")
    try:
        yield LocalAirflow(services, cli_env)
    finally:
        services.stop()


# -- CeleryExecutor: the deployment, read through its REST API -----------------------------


class CeleryAirflow:
    """The deployment of ``docker/compose.yaml`` (:mod:`tests.deployment.deployment`),
    through its REST API: its metadata DB is not this process's Airflow's."""

    executor = "CeleryExecutor"

    def __init__(self, deployment: Any) -> None:
        self.deployment = deployment
        self.log_dir: Path = deployment.log_dir
        self.task_log_dir = Path(deployment.env["AIRFLOW__LOGGING__BASE_LOG_FOLDER"])
        self.cli_env = write_cli_env(deployment.base, deployment.env)
        self.gridcore_db_url: str = deployment.gridcore_db_url

    def check_alive(self) -> None:
        self.deployment.check_alive()

    def unpause_when_parsed(self, dag_id: str) -> None:
        deadline = time.monotonic() + PARSE_TIMEOUT_S
        while time.monotonic() < deadline:
            self.check_alive()
            found = self.deployment.api("GET", "/dags", params={"dag_id_pattern": dag_id})
            if any(d["dag_id"] == dag_id for d in found["dags"]):
                self.deployment.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
                return
            time.sleep(POLL_S)
        raise TimeoutError(f"{dag_id} not parsed in {PARSE_TIMEOUT_S:.0f} s; see {self.log_dir}")

    def trigger(self, dag_id: str, run_id: str) -> None:
        body = {"dag_run_id": run_id, "logical_date": None}
        self.deployment.api("POST", f"/dags/{dag_id}/dagRuns", json=body)

    def runs(self, dag_id: str) -> list[RunRow]:
        rows = self._all(f"/dags/{dag_id}/dagRuns", "dag_runs")
        return [
            RunRow(
                r["dag_run_id"],
                str(r["state"]),
                _seconds(_maybe_time(r.get("start_date")), _maybe_time(r.get("end_date"))),
            )
            for r in rows
        ]

    def task_instances(self, dag_id: str, run_id: str) -> list[TaskRow]:
        rows = self._all(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", "task_instances")
        return [TaskRow(t["task_id"], t["state"], int(t["try_number"])) for t in rows]

    def state_mismatches(self, dag_id: str, run_id: str) -> list[str]:
        params = {"dag_id": dag_id, "run_id": run_id, "event": "state mismatch"}
        rows = self.deployment.api("GET", "/eventLogs", params=params)["event_logs"]
        return [str(r.get("extra")) for r in rows]

    def _all(self, path: str, key: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        while True:
            page = self.deployment.api("GET", path, params={"limit": 100, "offset": len(found)})
            found += page[key]
            if not page[key] or len(found) >= page["total_entries"]:
                return found


def _maybe_time(text: str | None) -> datetime | None:
    return None if not text else parse_time(text)


@contextlib.contextmanager
def celery_airflow(base: Path) -> Iterator[CeleryAirflow]:
    from tests.deployment.deployment import reachable, running

    problem = reachable()
    if problem:
        raise RuntimeError(f"the CeleryExecutor deployment cannot start: {problem}")
    with running(base) as deployment:
        yield CeleryAirflow(deployment)


# -- the command line ----------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.airflow_soak", description=__doc__)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--executor", choices=("local", "celery"), default="local")
    parser.add_argument("--beside-dags-test", action="store_true")
    parser.add_argument(
        "--concurrency", type=int, default=1, help="runs in flight at once (default 1)"
    )
    parser.add_argument("--base", type=Path, help="where everything goes (default: a new tmp dir)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.concurrency < 1:
        parser.error("--runs and --concurrency must be at least 1")
    if not DAG_FILE.exists():
        parser.error(f"{DAG_FILE}: the README's minimal DAG is missing")
    base = args.base or Path(tempfile.mkdtemp(prefix="gridcore-soak-"))
    base.mkdir(parents=True, exist_ok=True)
    # SIGTERM (a timeout, a stopped job) ends this process through its finally blocks,
    # which stop the services and drop the deployment's databases: by default it would
    # leave them running, and a Celery worker left behind takes the tasks of the next
    # deployment that picks its Redis database.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    with stdout_to_stderr():  # Airflow logs to stdout; the report alone goes there
        if args.executor == "local":
            prepare_demo_environment(base)
        started = local_airflow(base) if args.executor == "local" else celery_airflow(base)
        with started as airflow:
            report = soak(
                airflow,
                args.runs,
                beside_dags_test=args.beside_dags_test,
                concurrency=args.concurrency,
            )
    print(json.dumps(report.as_json(), indent=2) if args.json else format_report(report))
    return 0 if report.ok else 1


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 onto 2 meanwhile (Airflow's log handlers keep their own
    reference to stdout, so swapping ``sys.stdout`` would not do)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def prepare_demo_environment(base: Path) -> None:
    """This process becomes ``make airflow``'s environment under ``base`` (before Airflow
    is imported): SQLite for Airflow and gridcore, the embedded local sites, the
    checkout's DAGs; the metadata DB migrated."""
    from gridcore.demo import UNSET_FOR_DEFAULT
    from gridcore_airflow.demo.harness import demo_environment, migrate_metadata_db

    if "airflow" in sys.modules:
        raise RuntimeError("Airflow was imported before its environment was set")
    for name in UNSET_FOR_DEFAULT:
        os.environ.pop(name, None)
    os.environ.update(demo_environment(base, DAGS, {}))
    migrate_metadata_db()


def format_report(report: SoakReport) -> str:
    lines = [
        f"{report.executor}: {report.succeeded} of {report.runs} runs succeeded in"
        f" {report.wall_s:.0f} s (grace {report.grace_s} s, {report.concurrency} at a time)",
        f"  seconds per run: {report.seconds_per_run}",
        f"  executor report after deferral (s): {report.executor_report_after_deferral_s}",
        f"  trigger fired after deferral (s): {report.trigger_fired_after_deferral_s}",
        f"  beside dags test: {report.beside_dags_test}",
        f"  cancelled selections: {report.cancelled_selections}",
        f"  triggerer on_kill lines: {report.trigger_kills}",
        f"  ledger: {report.ledger or 'consistent, nothing held'}",
        *(f"  FAILED {json.dumps(f)}" for f in report.failed),
        f"  logs: {report.logs}",
        "OK" if report.ok else "NOT OK",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
