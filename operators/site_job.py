"""Run one job on a grid site chosen by gridcore's selection policy (or pinned).

The operator is thin: validate, ``GridRuntime.select`` + ``submit`` (through
:class:`~operators.hooks.GridcoreHook`), then defer to
:class:`~sensors.triggers.SiteJobTrigger`, on the one job lifecycle
(:class:`~operators.base.JobLifecycleOperator`); the result is plain JSON for XCom. Given a
``selection_id`` (a burst decided by :class:`~operators.select_sites.SelectSitesOperator`)
it submits that selection instead of selecting.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException

from gridcore.engine.runtime import GridRuntime, JobRecord
from gridcore.errors import AnswerLost, GridError, NoUsableSite, RequestError, StateError
from gridcore.model import JobRequest, JobState, JobSubmission
from gridcore.policies.selection import DEFAULT_PROTOCOL, InsufficientMode, SelectionProtocol
from gridcore.validation import (
    check_choice,
    check_job_request,
    check_job_submission,
    check_selection_stream,
)
from gridcore_airflow.operators.base import (
    RESOURCE_FIELDS,
    JobLifecycleOperator,
    job_name,
    map_index,
    translated,
)
from gridcore_airflow.sensors.base import EventContract
from gridcore_airflow.sensors.triggers import SiteJobTrigger

__all__ = ["AUTO_SITE", "SELECTION_KEY", "JobPlan", "SiteJobOperator"]

AUTO_SITE = "auto"
INPUTS_ENV = "GRIDCORE_INPUTS"
SELECTION_KEY = "gridcore_selection_id"  # in the task state store, shared by all tries
SITE_CONTEXT_KEY = "gridcore_site"
"""The chosen site, put into the task's context once known, so that a ``map_index_template``
(rendered again when the task ends) can show it: ``{{ gridcore_site | default('') }}``."""
SUBMIT_TRIES = 5
"""Tries of a submission whose answer was lost, ``poll_interval`` apart, in one try of
the task: each asks the site for the selection's key first, so none sends it twice."""
USABLE_SITE_WAIT_S = 600.0
"""How long a try waits for a site that could run its job to be usable again (its probe
job completes) before it fails, to be retried as Airflow's retries say."""
RESULT_KEYS = ("site", "job_id", "state", "selected_at", "started_at", "finished_at", "queued_s")


@dataclass(frozen=True)
class JobPlan:
    """What one task instance will ask gridcore for, fully validated."""

    request: JobRequest
    submission: JobSubmission
    protocol: SelectionProtocol
    mode: InsufficientMode
    stream: str
    selection_id: int | None = None  # a selection made for this member beforehand

    @property
    def name(self) -> str:
        return self.request.name


class SiteJobOperator(JobLifecycleOperator[GridRuntime, JobRecord, JobPlan]):
    """Run ``command`` with ``processors`` processors on a gridcore site.

    :param command: shell command run at the site (templated). The job sees
        ``GRIDCORE_SITE``, ``GRIDCORE_JOB_ID``, ``GRIDCORE_PROCESSORS`` and, if
        ``input_files`` are given, ``GRIDCORE_INPUTS`` (their absolute paths joined by
        ``os.pathsep``).
    :param processors: processors the job needs (> 0).
    :param input_files: paths whose total size is the request's ``input_bytes``
        (templated); each must exist when the task runs.
    :param runtime_s: estimated runtime on a reference site, seconds (>= 0); None
        (the default): unknown, the site's history of finished jobs is used, else 600 s
        is assumed and the selection's reasons say so.
    :param site: ``"auto"`` for policy selection, or the name of a grid site to pin.
    :param selection_id: a selection already made for this member (templated, or from
        :class:`~operators.select_sites.SelectSitesOperator`'s result through
        ``expand_kwargs``): the member submits it instead of selecting. It must exist,
        be made for this member (its name and processors) and be unsubmitted, or be
        submitted by an earlier try of this task instance; ``site`` stays ``"auto"``.
        If it ended without completing (it expired before the member ran, or an earlier
        try's job failed), the member selects afresh as a retry does.
    :param protocol: ``earliest-completion`` (default: every site ranked by its estimated
        completion for this member) | ``stateful`` | ``naive`` | ``random``.
    :param insufficient_mode: ``best`` | ``random`` | ``earliest`` when no site has room
        (the paper's protocols only; ``earliest-completion`` ignores it).
    :param stream: selection stream (templated); default: the DAG id.
    :param env: extra environment for the job (templated).
    :param poll_interval: seconds between status polls while waiting.
    :param deferrable: wait in the triggerer (default) instead of holding a worker slot.

    ``time_limit``, ``account``, ``qos``, ``partition``, ``memory``, ``memory_per_cpu``,
    ``gpus`` and ``constraint`` (templated): what the job asks of its site
    (:class:`~operators.base.GridcoreJobOperator`). ``grid_file``, ``db_url`` and
    ``gridcore_conn_id`` say where gridcore is (:class:`~operators.base.GridcoreOperator`).

    Returns (XCom) ``{"site", "job_id", "state", "selected_at", "started_at",
    "finished_at", "queued_s", "selection_id", "output_files", "resources"}``; times are
    epoch seconds; ``output_files``: ``{"stdout", "stderr"}``, where the job's output is
    (paths at the site, see :mod:`gridcore.sites.output`), or None if not known;
    ``resources``: what the job asked of its site (its arguments over the site's defaults,
    :meth:`gridcore.model.JobResources.as_json`).

    While the job runs, its new stdout and stderr lines go into the task log at every
    poll (bounded, see :mod:`gridcore.sites.output`); a job that failed has the tail of
    its stderr logged before the task fails.

    Tries of one task instance share its selection through Airflow 3.3's task state store
    (:class:`~operators.base.JobLifecycleOperator`): a retry reattaches to a job still
    queued or running (or submits a selection an earlier try made but did not submit),
    returns the result of one that completed, and starts afresh only after a failed or
    cancelled job.
    """

    noun = "selection"
    state_key = SELECTION_KEY
    completed = JobState.COMPLETED

    template_fields: Sequence[str] = (
        "command",
        "input_files",
        "site",
        "selection_id",
        "stream",
        "env",
        *RESOURCE_FIELDS,
    )
    ui_color = "#d9ead3"

    def __init__(
        self,
        *,
        command: str,
        processors: int = 1,
        input_files: Sequence[str] | None = None,
        runtime_s: float | None = None,
        site: str = AUTO_SITE,
        selection_id: int | str | None = None,
        protocol: str = DEFAULT_PROTOCOL.value,
        insufficient_mode: str = InsufficientMode.BEST.value,
        stream: str | None = None,
        env: Mapping[str, str] | None = None,
        poll_interval: float = 2.0,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.command = command
        self.processors = processors
        self.input_files = input_files
        self.runtime_s = runtime_s
        self.site = site
        self.selection_id = selection_id
        self.protocol = protocol
        self.insufficient_mode = insufficient_mode
        self.stream = stream
        self.env = env
        self.poll_interval = poll_interval
        self.deferrable = deferrable

    @property
    def _selection_id(self) -> int | None:
        """The selection this try runs or waits on."""
        return self._ident

    # -- the lifecycle's specifics -----------------------------------------------------

    def plan(self, context: Context) -> JobPlan:
        return self.plan_job(context)

    def opened(self, *, upgrade: bool) -> AbstractContextManager[GridRuntime]:
        return self.hook().runtime(upgrade=upgrade)

    def resume_or_submit(self, runtime: GridRuntime, state: Any, job: JobPlan) -> JobRecord:
        if job.selection_id is not None:
            return self._run_given(runtime, state, job, job.selection_id)
        return super().resume_or_submit(runtime, state, job)

    def submit(self, runtime: GridRuntime, state: Any, job: JobPlan) -> JobRecord:
        return self._select_and_submit(runtime, state, job)

    def status(self, runtime: GridRuntime, ident: int) -> JobRecord:
        return runtime.record(ident)

    def reattach(self, runtime: GridRuntime, job: JobPlan, record: JobRecord) -> JobRecord:
        if record.job_id is None and not record.finished:  # selected, never submitted
            return self._submit_selected(runtime, record.selection_id, job)
        return record

    def describe(self, record: JobRecord) -> str:
        return f"job {record.job_id} on site {record.site} is {record.state}"

    def cancel(self, runtime: GridRuntime, ident: int) -> str:
        record = runtime.cancel(ident)
        return f"job {record.job_id} is {record.state}"

    def trigger(self, ident: int) -> SiteJobTrigger:
        return SiteJobTrigger(ident, poll_interval=self.poll_interval, **self.location())

    def contract(self) -> EventContract[Any]:
        return SiteJobTrigger.contract

    def ident_of(self, record: JobRecord) -> int:
        return record.selection_id

    def attach(self, context: Context, record: JobRecord) -> None:
        context[SITE_CONTEXT_KEY] = record.site  # type: ignore[literal-required]

    def earlier_output(self, record: JobRecord) -> list[dict[str, Any]]:
        """The files of an earlier try's job (for the result); none if the site forgot it."""
        if record.job_id is None:
            return []
        try:
            with self.hook().runtime(upgrade=False) as runtime:
                files = runtime.output_files(record.site, record.job_id)
        except GridError as exc:
            self.log.warning("job %s: where its output is: %s", record.job_id, exc)
            return []
        return [{"site": record.site, "job_id": record.job_id, "label": "", **files.as_json()}]

    def _select_and_submit(self, runtime: GridRuntime, state: Any, job: JobPlan) -> JobRecord:
        pinned = _pinned_site(runtime, self.site)
        # As sbatch -M: only sites that could ever run it are chosen from (a request no
        # site can run fails here, before anything is written)
        sub = job.submission
        names = [pinned] if pinned is not None else runtime.grid.site_names
        fit, refused = runtime.sites_that_can_run(sub.name, sub.processors, sub.resources, names)
        if not fit:
            raise RequestError("no site can run it: " + "; ".join(refused))
        among = fit if refused and pinned is None else None
        waited, deadline = 0.0, time.monotonic() + USABLE_SITE_WAIT_S
        while True:
            try:
                record = runtime.select(
                    job.request, job.protocol, job.mode, job.stream, site=pinned, among=among
                )
                break
            except NoUsableSite as exc:
                # Set aside is not gone: every select refreshes, which probes the site.
                if time.monotonic() >= deadline:
                    raise
                waited = min(max(self.poll_interval, 2 * waited), 30.0)
                self.log.warning("%s; asking again in %g s", exc, waited)
                time.sleep(waited)
        return self._submit(runtime, state, job, record.selection_id)

    def _run_given(
        self, runtime: GridRuntime, state: Any, job: JobPlan, selection_id: int
    ) -> JobRecord:
        """Submit the selection made for this member, or resume it (see ``selection_id``)."""
        given = _given_selection(runtime, job, selection_id)
        prior = self.remembered(state)
        if given.finished and not self.succeeded(given):
            # It will never run; nothing of it can run twice, so decide as a retry does
            # (an earlier try's own fresh selection first, if it still counts).
            self.log.warning(
                "selection %s given for %s is %s (%s); selecting afresh",
                selection_id,
                job.request.name,
                given.state,
                given.message,
            )
            return super().resume_or_submit(runtime, state, job)
        if prior == selection_id:
            resumed = self.resume(runtime, state, job)
            if resumed is not None:
                return resumed
        if given.job_id is not None or given.finished:
            raise AirflowFailException(
                f"{job.request.name}: selection {selection_id} is already {given.state}"
                f" (job {given.job_id} on site {given.site}), not by an earlier try of this"
                " task: give each member the selection made for it"
            )
        return self._submit(runtime, state, job, selection_id)

    def _submit(
        self, runtime: GridRuntime, state: Any, job: JobPlan, selection_id: int
    ) -> JobRecord:
        # Remembered between select and submit, so a retry after a worker crash (or after
        # Airflow failing the task on a stale executor event) finds the job instead of
        # submitting a duplicate; submit() itself never submits twice.
        self.remember(runtime, state, selection_id)
        record = self._submit_selected(runtime, selection_id, job)
        self.log.info(
            "selection %s: %s on site %s as job %s (%s)",
            record.selection_id,
            job.request.name,
            record.site,
            record.job_id,
            "; ".join(record.reasons),
        )
        return record

    def _submit_selected(self, runtime: GridRuntime, selection_id: int, job: JobPlan) -> JobRecord:
        """``runtime.submit``, asked again while the answer is lost (:data:`SUBMIT_TRIES`):
        the selection keeps its claim and key meanwhile, and each call looks the key up
        before sending, so the job the site made is adopted, never doubled."""
        for attempt in range(1, SUBMIT_TRIES + 1):
            try:
                return runtime.submit(selection_id, job.submission)
            except AnswerLost as exc:
                if attempt == SUBMIT_TRIES:
                    raise
                self.log.warning("%s; asking again in %g s", exc, self.poll_interval)
                time.sleep(self.poll_interval)
        raise AssertionError("unreachable: the last try returns or raises")

    def result(
        self, context: Context, record: dict[str, Any], output: list[dict[str, Any]]
    ) -> dict[str, Any]:
        # a resumed task has a fresh context: the site again, for the label rendered now
        context[SITE_CONTEXT_KEY] = record.get("site")  # type: ignore[literal-required]
        result = {key: record.get(key) for key in RESULT_KEYS}
        result["selection_id"] = record["selection_id"]
        result["output_files"] = (
            {"stdout": output[0]["stdout"], "stderr": output[0]["stderr"]} if output else None
        )
        with translated(str(record.get("name") or self.task_id)):
            asked = self.plan_resources()
        result["resources"] = self.resources_sent(asked, [str(record.get("site"))])[0]
        return result

    # -- validation: everything is checked before anything is selected or submitted ---

    def plan_job(self, context: Context) -> JobPlan:
        """Validate the (rendered) arguments into a plan through gridcore's request
        models (:mod:`gridcore.validation`); AirflowFailException naming the field
        otherwise. Touches nothing but the input files' metadata."""
        inputs = input_paths(self.input_files)  # operator-only: files on this worker
        name = job_name(self.dag_id, self.task_id, map_index(context))
        env = {str(k): str(v) for k, v in (self.env or {}).items()}
        if inputs:
            env[INPUTS_ENV] = os.pathsep.join(str(p) for p in inputs)
        input_bytes = sum(p.stat().st_size for p in inputs)
        stream = self.stream if self.stream else self.dag_id
        selection_id = _given_selection_id(name, self.selection_id, self.site)
        with translated(name):  # nothing selected yet
            request = check_job_request(
                JobRequest(name, self.processors, self.runtime_s, input_bytes=input_bytes)
            )
            resources = self.plan_resources()
            submission = check_job_submission(
                JobSubmission(name, self.command, self.processors, env=env, resources=resources)
            )
            protocol = check_choice(SelectionProtocol, self.protocol, "protocol")
            mode = check_choice(InsufficientMode, self.insufficient_mode, "insufficient_mode")
            stream = check_selection_stream(str(stream))
        return JobPlan(request, submission, protocol, mode, stream, selection_id)


def _given_selection_id(name: str, value: Any, site: Any) -> int | None:
    """The rendered ``selection_id`` (a template renders it as text) or None."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value.strip())  # isdigit alone also takes "²", which int() refuses
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise AirflowFailException(
            f"{name}: selection_id: must be a positive integer (a selection's id), got {value!r}"
        )
    if site != AUTO_SITE:
        raise AirflowFailException(
            f"{name}: selection_id {value} and site {site!r}: give one, not both (a selection"
            f" already has its site); leave site={AUTO_SITE!r}"
        )
    return value


def _given_selection(runtime: GridRuntime, job: JobPlan, selection_id: int) -> JobRecord:
    """The selection ``selection_id`` if it was made for this member; else a failure
    without retries (a wrong id does not become right)."""
    try:
        given = runtime.record(selection_id)
    except StateError as exc:
        raise AirflowFailException(
            f"{job.request.name}: selection_id {selection_id}: {exc}"
        ) from exc
    member = (job.request.name, job.request.processors)
    if (given.name, given.processors) != member:
        raise AirflowFailException(
            f"{job.request.name}: selection {selection_id} was made for {given.name!r} with"
            f" {given.processors} processors, not for this member ({member[1]} processors):"
            " give each member the selection made for it"
        )
    return given


def _pinned_site(runtime: GridRuntime, site: Any) -> str | None:
    if site == AUTO_SITE:
        return None
    names = runtime.grid.site_names
    if not isinstance(site, str) or site not in names:
        raise AirflowFailException(
            f"site {site!r} is not in grid {runtime.grid.source} (sites: {', '.join(names)});"
            f" use {AUTO_SITE!r} to let gridcore choose"
        )
    return site


def input_paths(files: Any) -> list[Path]:
    if files is None:
        return []
    if isinstance(files, str):
        files = [files]
    if not isinstance(files, Sequence):
        raise AirflowFailException(f"input_files: must be a list of paths, got {files!r}")
    paths = [Path(str(f)).expanduser().resolve() for f in files]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise AirflowFailException(f"input_files: not found (or not a file): {', '.join(missing)}")
    return paths
