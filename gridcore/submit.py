"""``gridcore submit``: one job on a grid site, the command-line twin of ``sbatch -M a,b,c``.

Plan, then run (STYLE.md 3). :func:`plan_submit` checks everything the command line
gives against the grid, without opening the state database, into a :class:`SubmitPlan`:
bad input is refused naming its field and writes nothing. :func:`submit_planned`
selects a site with the default policy (``GridRuntime.select``: pinned to one site, or
choosing only among several) and submits under the selection's key
(``GridRuntime.submit``: at most one site job per selection). :func:`follow` polls the
job until it ends, showing its new output lines through :mod:`gridcore.sites.output`
(the reader every trigger uses), and :func:`describe` says what was done, as JSON.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gridcore.engine.runtime import GridRuntime, JobRecord
from gridcore.engine.submission import refuse_gpus_on_local, resources_at
from gridcore.errors import CredentialRejected, GridError, RequestError, SiteError
from gridcore.model import (
    GridSpec,
    JobRequest,
    JobResources,
    JobState,
    JobSubmission,
    SiteKind,
)
from gridcore.sites.output import JobOutputs, SiteJob
from gridcore.validation import check_job_request, check_job_submission, check_resources

STREAM = "cli"  # the selection stream of every job submitted from the command line
POLL_FIRST_S = 0.25  # a short job's end is seen at once; the interval then doubles ...
POLL_EVERY_S = 2.0  # ... up to the site job trigger's default poll interval
MAX_POLL_FAILURES = 5  # transient site errors in a row tolerated, as the triggers do
RETRY_CAP_S = 30.0  # the longest wait before polling again after a site error
INTERRUPTED = 130  # the exit status of a wait ended by Ctrl-C (128 + SIGINT)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubmitPlan:
    """What ``gridcore submit`` will ask, fully checked. ``pinned``: the one site
    given; ``among``: the sites the policy chooses from (None: every site)."""

    request: JobRequest
    submission: JobSubmission
    pinned: str | None = None
    among: tuple[str, ...] | None = None


def plan_submit(
    grid: GridSpec,
    command: Sequence[str],
    processors: object,
    *,
    sites: Sequence[str] = (),
    name: str | None = None,
    workdir: str | None = None,
    env: Sequence[str] = (),
    resources: Mapping[str, object] | None = None,
) -> SubmitPlan:
    """The checked plan, or RequestError / ConfigError naming the field. ``command``:
    the words to run (quoted for the site's shell, so they arrive as given);
    ``processors`` and ``resources["gpus"]`` may be the command line's text; a relative
    ``workdir`` is made absolute here, as sbatch's ``--chdir``."""
    if not command:
        raise RequestError(
            "command: nothing to run: give it after -- (gridcore submit --processors 1 -- hostname)"
        )
    names = list(dict.fromkeys(sites))
    unknown = [site for site in names if site not in grid.site_names]
    if unknown:
        known = ", ".join(grid.site_names)
        raise RequestError(f"site: unknown site {unknown[0]!r} (grid {grid.source} has: {known})")
    candidates = [grid.site(site) for site in names or grid.site_names]
    asked = check_resources(_numbers(dict(resources or {}), "gpus"))
    # GPUs only local sites could get: refused here, before a selection is written
    refuse_gpus_on_local(asked, candidates, every=len(names) != 1, field="gpus")
    count = _number(processors)
    job_name = name if name is not None else os.path.basename(command[0]) or "job"
    request = check_job_request(JobRequest(job_name, count), grid.site_names)
    submission = check_job_submission(
        JobSubmission(
            job_name,
            shlex.join(command),
            request.processors,
            workdir if workdir is None else os.path.abspath(workdir),
            _environment(env),
            resources=asked,
        )
    )
    pinned = names[0] if len(names) == 1 else None
    return SubmitPlan(request, submission, pinned, tuple(names) if len(names) > 1 else None)


def submit_planned(runtime: GridRuntime, plan: SubmitPlan) -> JobRecord:
    """Select (pinned, among the plan's sites, or among all) and submit, once. As
    ``sbatch -M``, the choice skips sites that would refuse the request (more CPUs,
    GPUs or memory than any node, a time limit over the partition's); none left: a
    RequestError naming each site's reason, before anything is written."""
    among = plan.among if plan.pinned is not None else _can_run(runtime, plan)
    chosen = runtime.select(plan.request, stream=STREAM, site=plan.pinned, among=among)
    return runtime.submit(chosen.selection_id, plan.submission)


def _can_run(runtime: GridRuntime, plan: SubmitPlan) -> tuple[str, ...] | None:
    """The plan's sites (the pinned one; ``None``: every site) less those that would
    refuse the request; none left: a RequestError naming each site's reason."""
    names = (
        (plan.pinned,) if plan.pinned is not None
        else plan.among if plan.among is not None else runtime.grid.site_names
    )  # fmt: skip
    job = plan.submission
    fit, refused = runtime.sites_that_can_run(job.name, job.processors, job.resources, names)
    if not fit:
        raise RequestError("no site can run it: " + "; ".join(refused))
    return tuple(fit) if refused else plan.among


def test_only(runtime: GridRuntime, plan: SubmitPlan) -> dict[str, Any]:
    """``gridcore submit --test-only`` (``sbatch --test-only``'s twin): the site the job
    would go to now (the default policy's choice among the sites that can run it, or
    the pinned one) and why; per site its estimate, and the wait model's forecast with
    its bound where it has one. No selection is recorded and nothing is submitted
    (:meth:`GridRuntime.estimate`). As ``--json`` prints it: ``site``, ``outcome``
    (``fit``, or ``queue``: it would wait there), ``reasons`` and ``sites`` {NAME:
    ``fits``, ``queue_delay_s``, ``completion_s``, ``wait_model`` (null, or
    ``predictor``, ``wait_s``, ``bound_s``, ``confidence``, ``reason``)}."""
    among = _can_run(runtime, plan)
    if plan.pinned is not None:
        decision, forecasts = runtime.estimate(plan.request, site=plan.pinned)
    else:
        decision, forecasts = runtime.estimate(plan.request, among=among)
    per_site: dict[str, Any] = {}
    for est in decision.estimates:
        forecast = forecasts.get(est.site)
        per_site[est.site] = {
            "fits": est.fits,
            "queue_delay_s": est.queue_delay_s,
            "completion_s": est.completion_s,
            "wait_model": None if forecast is None else asdict(forecast),
        }
    return {
        "site": decision.site,
        "outcome": decision.outcome.label,
        "reasons": list(decision.reasons),
        "sites": per_site,
    }


def test_only_lines(found: Mapping[str, Any]) -> list[str]:
    """:func:`test_only`'s answer for a person: the choice, then one line per site with
    the wait model's own words."""
    verb = "would run on" if found["outcome"] == "fit" else "would queue at"
    lines = [f"{verb} site {found['site']} ({found['outcome']})", *found["reasons"]]
    for name, est in sorted(found["sites"].items()):
        model = est["wait_model"]
        if model is None:
            how = "by Eq. W"
        else:
            bound = model["bound_s"]
            at = "" if bound is None else f"bound {bound:.0f} s at {model['confidence']}; "
            how = f"by {model['predictor']} ({at}{model['reason']})"
        lines.append(
            f"site {name}: queue delay {est['queue_delay_s']:.0f} s {how},"
            f" completion {est['completion_s']:.0f} s"
        )
    return lines


def follow(
    runtime: GridRuntime,
    record: JobRecord,
    show: Callable[[str], None],
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> JobRecord:
    """Poll the job until it has ended, passing its new output lines (``[stdout] ...``,
    ``[stderr] ...``, bounded as in task logs) to ``show`` as they appear. Site errors
    are retried with back-off, :data:`MAX_POLL_FAILURES` in a row at most."""
    outputs = JobOutputs(runtime.output_files)
    delay, failures, said = POLL_FIRST_S, 0, _progress(record)
    while True:
        try:
            record = runtime.poll(record.selection_id)
        except CredentialRejected:
            raise  # renewed once already: waiting will not mend it
        except SiteError as exc:
            failures += 1
            if failures > MAX_POLL_FAILURES:
                raise
            retry_s = min(RETRY_CAP_S, 2.0**failures)
            log.warning("poll %d failed (%s); again in %.0f s", failures, exc, retry_s)
            sleep(retry_s)
            continue
        failures = 0
        note = _progress(record)
        if note != said and not record.finished:  # the end is the caller's to say
            log.info("job %s on site %s: %s", record.job_id, record.site, note)
        said = note
        for line in outputs.read(_site_jobs(record)):
            show(line)
        if record.finished:
            return record
        sleep(delay)
        delay = min(POLL_EVERY_S, delay * 2)


def exit_status(record: JobRecord) -> int:
    """The job's exit code when it has one (a completed job without one: 0); 1 for a
    job that failed or was cancelled without a code (or with one a shell cannot
    return)."""
    code = record.exit_code
    if record.state == JobState.COMPLETED.value:
        return code if code is not None and 0 <= code < 256 else 0
    return code if code is not None and 0 < code < 256 else 1


def outcome(record: JobRecord) -> str:
    """One line: which job, where, and how it stands (or ended)."""
    where = f"job {record.job_id} on site {record.site} (selection {record.selection_id})"
    code = "" if record.exit_code is None else f", exit code {record.exit_code}"
    # a local site's message for a failed job is its exit code: said once
    said = record.message in ("", record.state, code.removeprefix(", "))
    detail = "" if said else f": {record.message}"
    return f"{where}: {record.state}{code}{detail}"


def describe(runtime: GridRuntime, record: JobRecord, asked: JobResources) -> dict[str, Any]:
    """What was done, as ``--json`` prints it: ``site``, ``job_id``, ``selection_id``,
    ``state``, ``exit_code``, ``message``, ``release`` and ``api_version`` (Slurm
    sites), ``stdout`` and ``stderr`` (the output files), ``resources`` (what was sent:
    ``asked`` over the site's defaults), ``reasons`` (the selection's) and ``usage``
    (what the finished job used, kept with its selection where the site has
    accounting). A fact the site cannot give now is null."""
    release, api_version = _slurm_versions(runtime, record.site)
    files = _output_files(runtime, record)
    return {
        "site": record.site,
        "job_id": record.job_id,
        "selection_id": record.selection_id,
        "state": record.state,
        "exit_code": record.exit_code,
        "message": record.message,
        "release": release,
        "api_version": api_version,
        "stdout": files.get("stdout"),
        "stderr": files.get("stderr"),
        "resources": resources_at(asked, runtime.grid.site(record.site)).as_json(),
        "reasons": list(record.reasons),
        "usage": record.usage,
    }


# -- helpers --------------------------------------------------------------------------


def _number(value: object) -> Any:
    """Command-line text of digits as an integer; anything else as given, for the
    validator to refuse in its words."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value.strip())
    return value


def _numbers(raw: dict[str, object], *keys: str) -> dict[str, object]:
    return raw | {key: _number(raw[key]) for key in keys if key in raw}


def _environment(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals:
            raise RequestError(f"env: {pair!r} is not NAME=VALUE")
        env[key] = value
    return env


def _site_jobs(record: JobRecord) -> list[SiteJob]:
    if record.job_id is None:
        return []
    failed = record.finished and record.state != JobState.COMPLETED.value
    return [SiteJob(record.site, record.job_id, finished=record.finished, failed=failed)]


def _progress(record: JobRecord) -> str:
    """The job's state, with what the site says of it (requeued, held) if anything."""
    return f"{record.state}: {record.message}" if record.message else record.state


def _slurm_versions(runtime: GridRuntime, site: str) -> tuple[str | None, str | None]:
    """The Slurm release and the REST version the adapter speaks; nulls elsewhere."""
    if runtime.grid.site(site).kind is not SiteKind.SLURM:
        return None, None
    from gridcore.sites.slurm import SlurmSite

    adapter = runtime.adapter(site)
    if not isinstance(adapter, SlurmSite):
        return None, None
    try:
        return adapter.release, adapter.api_version
    except GridError as exc:
        log.warning("site %s: its Slurm version is not known: %s", site, exc)
        return None, None


def _output_files(runtime: GridRuntime, record: JobRecord) -> dict[str, str]:
    if record.job_id is None:
        return {}
    try:
        return runtime.output_files(record.site, record.job_id).as_json()
    except GridError as exc:
        log.warning("job %s: where its output is is not known: %s", record.job_id, exc)
        return {}
