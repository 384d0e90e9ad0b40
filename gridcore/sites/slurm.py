"""A Slurm cluster reached through slurmrestd, any release from 22.05 (REST v0.0.38) to
26.05 (v0.0.45): the version is found by asking the server (:mod:`gridcore.sites.slurm_api`
holds what each version says and the pure request builder).

How it works, in full: ``docs/sites.md``
(section ``gridcore/sites/slurm.py``).
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import requests
import urllib3

from gridcore import credentials
from gridcore.errors import (
    AnswerLost,
    ConfigError,
    CredentialError,
    CredentialRejected,
    RequestError,
    SiteError,
    SiteRejected,
    SiteUnavailable,
    UnknownJob,
)
from gridcore.model import (
    JobResources,
    JobState,
    JobStatus,
    JobSubmission,
    JobUsage,
    ObservedJob,
    SiteKind,
    SiteObservation,
    SiteSpec,
)
from gridcore.sites import slurm_api as api
from gridcore.sites.output import OutputFiles

log = logging.getLogger(__name__)

Json = dict[str, Any]

DEFAULT_USER = "root"
LISTING_MAX_AGE_S = 5.0
"""How old a shared job listing may be before a status read fetches it again."""
USAGE_WAIT_S = 10.0
"""How long a finished job's status waits for slurmdbd to record its end (it may still
read RUNNING there for a moment after slurmctld says the job ended)."""
LIMITS_MAX_AGE_S = 300.0
"""How long the cluster's partitions and nodes are trusted for refusing a request."""
_CLOCK_SKEW_S = 60  # between this host's clock and slurmdbd's

# slurm_errno.h values that change how an error is reported.
_ESLURM_INVALID_JOB_ID = 2017
_ESLURM_ALREADY_DONE = 2021
_UNSPECIFIED = -1
_USAGE_KEPT = 10_000
_AUTH_ERROR = 1007  # SLURM_PROTOCOL_AUTHENTICATION_ERROR
_AUTH_STATUS = frozenset({401, 403, 511})
# SLURM_COMMUNICATIONS_* (1001-1005) and SLURMCTLD_COMMUNICATIONS_* (1800-1803): slurmrestd
# could not talk to slurmctld, so the site is down rather than refusing us.
_COMMUNICATION_ERRORS = frozenset({*range(1001, 1006), *range(1800, 1804)})
_UNSPECIFIED_HINT = (
    " (slurmrestd 22.05 reports this when slurmctld rejects the token or cannot be reached;"
    " check the token reference)"
)

_PENDING_STATES = frozenset(
    {
        "PENDING",
        # 22.05 names a job held after a requeue (RequeueExitHold) by its flag
        "SPECIAL_EXIT",
        "CONFIGURING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESV_DEL_HOLD",
        "POWER_UP_NODE",
    }
)
# Suspended/stopped jobs keep their allocation, so for capacity they count as running.
_RUNNING_STATES = frozenset(
    {
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "STOPPED",
        "SIGNALING",
        "STAGE_OUT",
        "RESIZING",
        "UPDATE_DB",
    }
)
# Ends of a run after which Slurm may queue the job again (RequeueExit, preemption, a
# failed node); other flags beside PENDING (COMPLETING while the old run ends) are not.
_REQUEUE_CAUSES = frozenset(
    {"NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "FAILED", "TIMEOUT", "DEADLINE", "OUT_OF_MEMORY"}
)
_JOB_ID = re.compile(r"\d+(?:_\d+)?")
# sbatch's filename pattern: %% or %[width]<letter> (man sbatch, "filename pattern").
_FILENAME_PATTERN = re.compile(r"%(%|(\d*)([AaJjNnstux]))")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/]*)")


class TokenProvider(Protocol):
    """Where a site's token comes from (``gridcore.credentials.TokenSource``)."""

    def token(self) -> str: ...

    def renew(self, rejected: str | None = None) -> str: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class FixedToken:
    """A token given as it is (tests, one-off scripts): renewing gives it again."""

    value: str = field(repr=False)
    reference: str = "the token given"

    def token(self) -> str:
        return self.value

    def renew(self, rejected: str | None = None) -> str:
        return self.value

    def describe(self) -> str:
        return self.reference


def map_job_state(slurm_state: str) -> JobState:
    """Slurm's job state name -> gridcore's; every other (terminal) state is FAILED."""
    name = slurm_state.upper()
    if name in _PENDING_STATES:
        return JobState.PENDING
    if name in _RUNNING_STATES:
        return JobState.RUNNING
    if name == "COMPLETED":
        return JobState.COMPLETED
    if name == "CANCELLED":
        return JobState.CANCELLED
    return JobState.FAILED


decode_exit_code = api.decode_exit_code


def _observed_start(job: api.SlurmJob, state: JobState) -> float | None:
    """When the job got its processors, or None if it has not (yet, or ever): a pending
    job's ``start_time`` is a forecast; a job cancelled while pending has no nodes."""
    if state is JobState.PENDING:
        return None
    if state.finished and not job.nodes:
        return None
    return job.start_time


def _int(job: Json, key: str) -> int:
    return api.number(job.get(key)) or 0


def expand_filename_pattern(pattern: str, job: Json) -> str:
    """sbatch's output filename ``pattern`` for ``job`` (a slurmrestd job object):
    ``%j`` and ``%J`` its id, ``%A`` / ``%a`` the array job / task id, ``%x`` its name,
    ``%u`` its user, ``%N`` its batch host, ``%n`` / ``%s`` / ``%t`` 0 (the batch
    script's node, step and task), ``%%`` a ``%``; a width (``%5j``) pads with zeros."""
    job_id = _int(job, "job_id")
    array_job = _int(job, "array_job_id") or job_id
    values: dict[str, str | int] = {
        "j": job_id,
        "J": job_id,
        "A": array_job,
        "a": _int(job, "array_task_id"),
        "x": str(job.get("name") or ""),
        "u": str(job.get("user_name") or ""),
        "N": str(job.get("batch_host") or ""),
        "n": 0,
        "s": 0,
        "t": 0,
    }

    def one(match: re.Match[str]) -> str:
        if match.group(1) == "%":
            return "%"
        value = values[match.group(3)]
        width = int(match.group(2) or 0)
        return str(value).zfill(width) if isinstance(value, int) else str(value)

    return _FILENAME_PATTERN.sub(one, pattern)


def _local_part(location: str) -> str:
    """A path on the cluster: ``location`` without the scheme and host of a URL."""
    host = _URL.match(location)
    return location[host.end() :] or "/" if host else location


# --------------------------------------------------------------------------- shared


@dataclass
class _Shared:
    """What every SlurmSite of this process aimed at one slurmrestd with one user and one
    credential (``gridcore.credentials.token_source`` gives one per site) shares:
    the API version found, the cluster's release, the job listing, the partitions and
    nodes that requests are checked against, and the count of REST calls made."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    version: str | None = None
    release: str | None = None
    jobs: dict[str, Json] | None = None
    jobs_at: float = float("-inf")
    partitions: tuple[api.SlurmPartition, ...] = ()
    nodes: tuple[api.SlurmNode, ...] = ()
    limits_at: float = float("-inf")
    calls: int = 0
    # slurmdbd's API beside slurmctld's (None: not known yet), and usage already read
    accounting: bool | None = None
    usage: dict[str, JobUsage] = field(default_factory=dict)
    session: requests.Session | None = None
    # One listing fetch at a time (the others wait for it); a submit or cancel bumps the
    # generation so a fetch begun before it never installs its older listing.
    fetching: bool = False
    generation: int = 0
    listed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.listed = threading.Condition(self.lock)

    def http(self) -> requests.Session:
        with self.lock:
            if self.session is None:
                self.session = requests.Session()
            return self.session


_SHARED: dict[tuple[str, str, TokenProvider], _Shared] = {}
_SHARED_LOCK = threading.Lock()


def _shared(url: str, user: str, tokens: TokenProvider) -> _Shared:
    # Per credential too: what one token may read is never served to another.
    with _SHARED_LOCK:
        return _SHARED.setdefault((url, user, tokens), _Shared())


def forget_shared() -> None:
    """Drop every cached version, listing and limit and close the shared connection
    pools (tests; a reconfigured process)."""
    with _SHARED_LOCK:
        for shared in _SHARED.values():
            if shared.session is not None:
                shared.session.close()
        _SHARED.clear()


# --------------------------------------------------------------------------- adapter


class SlurmSite:
    """One Slurm cluster behind slurmrestd. Implements ``gridcore.sites.base.SiteAdapter``.

    ``token`` is a :class:`TokenProvider` (``gridcore.credentials.TokenSource`` renews
    ``file`` and ``command`` references) or a plain string. The token is only put in
    request headers: never logged, and scrubbed from every error message. Pass a
    ``session`` to use that connection pool; without one, the adapters of this process
    share one pool per site and credential.
    ``share_listing=False`` reads every status by id (``GET /job/{id}``), as a per-job
    poller does (``gridcore bench slurm-polling`` compares the two).
    """

    def __init__(
        self,
        spec: SiteSpec,
        token: TokenProvider | str,
        session: requests.Session | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        listing_max_age_s: float = LISTING_MAX_AGE_S,
        share_listing: bool = True,
        usage_wait_s: float = USAGE_WAIT_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if spec.kind is not SiteKind.SLURM or not spec.url:
            raise ConfigError(f"site {spec.name}: a Slurm site needs kind 'slurm' and a url")
        if spec.api_version != api.AUTO and spec.api_version not in api.VERSIONS:
            raise ConfigError(
                f"site {spec.name}: api_version {spec.api_version!r} is not one gridcore speaks"
                f" (auto, {', '.join(api.VERSIONS)})"
            )
        self.spec = spec
        if isinstance(token, str):
            ref = spec.token.describe() if spec.token else "the token given"
            token = FixedToken(token, ref)
        self._tokens = token
        self._token = self._checked(token.token())
        self._root = spec.url.rstrip("/")
        self._user = spec.user or DEFAULT_USER
        self._shared = _shared(self._root, self._user, token)
        self._clock = clock
        self._listing_max_age_s = listing_max_age_s
        self._share_listing = share_listing
        self._usage_wait_s = usage_wait_s
        self._sleep = sleep
        # One connection pool per site and process unless given: every trigger holding
        # its own keep-alive connection would take all of slurmrestd's connection
        # threads, and the next caller waits for a free one until its timeout.
        self._session = session if session is not None else self._shared.http()

    def __repr__(self) -> str:
        return f"SlurmSite(site={self.spec.name!r}, url={self.spec.url!r})"

    __str__ = __repr__

    def close(self) -> None:
        """Nothing to release: the connection pool is the process's, shared per site."""

    def __enter__(self) -> SlurmSite:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ what it speaks

    @property
    def api_version(self) -> str:
        """The REST version in use (found by asking the server when ``auto``)."""
        return self._version()

    @property
    def release(self) -> str | None:
        """The cluster's Slurm release (``meta.slurm.release``), once a call returned."""
        if self._shared.release is None:
            self._call("GET", "/ping")  # every answer's meta names the release
        return self._shared.release

    @property
    def rest_calls(self) -> int:
        """REST calls this process made to this slurmrestd (all its SlurmSites)."""
        return self._shared.calls

    # ------------------------------------------------------------------ protocol

    def ping(self) -> None:
        """Raise unless slurmctld answers through slurmrestd. A ``/ping`` saying no
        controller responds is what a rejected token looks like on 24.11+, so it is
        confirmed by a data call (which raises CredentialRejected for a bad token)."""
        body = self._call("GET", "/ping")
        if api.responding(body):
            return
        self._call("GET", "/partitions")
        log.warning(
            "site %s: /ping says no controller responds, yet /partitions answered: up",
            self.spec.name,
        )

    @property
    def user(self) -> str:
        """The Slurm user its requests act as (``X-SLURM-USER-NAME``)."""
        return self._user

    def observe(self) -> SiteObservation:
        observed_at = time.time()
        # Jobs BEFORE nodes: every job this read shows RUNNING already holds its CPUs in
        # the nodes read after it, so the caller may stop counting it as in flight. A job
        # starting between the reads looks pending yet allocated (counted twice: idle
        # under-stated, safe). The other order can show a job running whose CPUs the
        # earlier nodes read still called idle (counted nowhere: idle over-stated).
        jobs = tuple(
            self._observed_job(api.read_job(j)) for j in self._listing(max_age_s=0).values()
        )
        nodes = [api.read_node(n) for n in api.dicts(self._call("GET", "/nodes"), "nodes")]
        partition = self.partition(self.spec.defaults)
        usable = [n for n in nodes if partition in n.partitions and n.usable]
        return SiteObservation(
            site=self.spec.name,
            total_processors=sum(n.cpus for n in usable),
            idle_processors=sum(n.idle_cpus for n in usable),
            jobs=jobs,
            observed_at=observed_at,
            release=self._shared.release,
            api_version=self._version(),
        )

    def submit(self, job: JobSubmission) -> str:
        workdir = job.workdir or self.spec.storage_dir
        if not workdir:
            raise RequestError(
                f"job {job.name}: no workdir given and site {self.spec.name} has no storage_dir"
            )
        if job.processors < 1:
            raise RequestError(f"job {job.name}: processors must be >= 1, got {job.processors}")
        resources = job.resources.over(self.spec.defaults)
        partition = self.partition(resources)
        self.check_request(job.name, job.processors, resources)
        version = self._version()
        payload = api.submission_body(
            version, job, partition=partition, workdir=workdir, resources=resources
        )
        status, body = self._exchange("POST", "/job/submit", payload)
        job_id = api.number(body.get("job_id"))
        if job_id is not None and api.errors(body):
            # Slurm queued the job despite the error (e.g. more CPUs than the partition
            # has); it could never run, so do not leave it pending at the site.
            self._discard(str(job_id))
        self._check(status, body)
        if job_id is None:
            raise SiteRejected(self.spec.name, f"job {job.name}: submit answered without job_id")
        for warning in api.warnings(body):
            log.warning("site %s: job %s: %s", self.spec.name, job_id, self._scrub(warning))
        self._forget_listing()
        log.info("site %s: submitted %s as job %s", self.spec.name, job.name, job_id)
        return str(job_id)

    def partition(self, resources: JobResources) -> str:
        """Where a job asking ``resources`` (over the site's defaults) goes: its own
        partition, else the site's (the grid file's ``partition``), else ``debug``. The
        one rule for submitting, checking and observing capacity."""
        return resources.partition or self.spec.partition or api.DEFAULT_PARTITION

    def check_request(self, name: str, processors: int, resources: JobResources) -> None:
        """Raise RequestError naming each field no node of the job's partition could
        satisfy (``/partitions`` and ``/nodes``, cached for ``LIMITS_MAX_AGE_S``)."""
        partitions, nodes = self._limits()
        partition = self.partition(resources)
        reasons = api.refusals(processors, resources, partition, partitions, nodes)
        if reasons:
            raise RequestError(
                f"site {self.spec.name}: job {name} cannot run there: " + "; ".join(reasons)
            )

    def find(self, key: str, since: float | None = None) -> str | None:
        """The id of the job submitted with ``key`` (its comment), if slurmctld still
        knows it (see the module's note on MinJobAge). Several (a race between two
        submitters): the oldest, which is the one a conditional record keeps. Always a
        fresh listing: a stale one could miss a job another worker just submitted."""
        found = [
            int(job_id)
            for job_id, raw in self._listing(max_age_s=0).items()
            if raw.get("comment") == key and job_id.isdigit()
        ]
        if found:
            return str(min(found))
        # Forgotten by slurmctld (MinJobAge after its end)? slurmdbd still has it, and
        # ``since`` bounds how far back it is asked (None: not asked).
        return None if since is None else self._find_accounted(key, since)

    def status(self, job_id: str) -> JobStatus:
        """The job's state; a finished job's usage from accounting where the site has it.
        A job slurmctld forgot (MinJobAge after its end) is read from slurmdbd's records
        where the site has accounting, else UnknownJob."""
        try:
            raw = self._job(job_id)
        except UnknownJob:
            accounted = self._accounted(job_id)
            if accounted is None:
                raise
            return _accounted_status(job_id, accounted)
        status = self._controller_status(job_id, api.read_job(raw))
        if status.state.finished and self._has_accounting():
            status = replace(status, usage=self._recorded_usage(job_id))
        return status

    def _recorded_usage(self, job_id: str) -> JobUsage | None:
        """The finished job's usage, waiting up to ``USAGE_WAIT_S`` for slurmdbd to have
        its end; best effort: slurmdbd failing never fails the job's status."""
        deadline = self._clock() + self._usage_wait_s
        while True:
            try:
                usage = self._usage(job_id)
            except SiteError as exc:
                log.warning("site %s: no usage of job %s: %s", self.spec.name, job_id, exc)
                return None
            if usage is not None or self._clock() >= deadline or not self._has_accounting():
                return usage
            self._sleep(0.5)

    def _usage(self, job_id: str) -> JobUsage | None:
        """What a finished job used, once slurmdbd has it (kept once read)."""
        known = self._shared.usage.get(job_id)
        if known is not None:
            return known
        accounted = self._accounted(job_id)
        if accounted is None or accounted.usage is None:
            return None
        if not map_job_state(accounted.state).finished:
            return None  # slurmdbd has not had the job's end yet: its figures would grow
        with self._shared.lock:
            if len(self._shared.usage) >= _USAGE_KEPT:
                self._shared.usage.clear()
            self._shared.usage[job_id] = accounted.usage
        return accounted.usage

    def _accounted(self, job_id: str) -> api.AccountedJob | None:
        """slurmdbd's record of the job (``/slurmdb/vX/job/{id}``), None where the site has
        no accounting or no record of it."""
        if not self._has_accounting():
            return None
        body = self._accounting_call(self._job_path(job_id))
        found = [
            api.read_accounted_job(j)
            for j in api.dicts(body or {}, "jobs")
            if str(j.get("job_id")) == job_id
        ]
        # A requeued job has a record per run: the last one is the job's end.
        return found[-1] if found else None

    def _find_accounted(self, key: str, since: float) -> str | None:
        """The job submitted with ``key`` among slurmdbd's records of this user's jobs
        since ``since`` (less a minute of clock skew; slurmdbd's own default window is
        since midnight), without their steps."""
        if not self._has_accounting():
            return None
        start = int(since - _CLOCK_SKEW_S)
        users = "" if api.minor(self._version()) == 38 else f"&users={self._user}"
        body = self._accounting_call(f"/jobs?start_time={start}&skip_steps=true{users}")
        found = [
            int(job.job_id)
            for job in map(api.read_accounted_job, api.dicts(body or {}, "jobs"))
            if job.key == key and job.job_id.isdigit()
        ]
        return str(min(found)) if found else None

    def _has_accounting(self) -> bool:
        if self._shared.accounting is None and self.spec.api_version == api.AUTO:
            self._discover()
        return self._shared.accounting is not False

    def _accounting_call(self, path: str) -> Json | None:
        version = self._version()
        url = f"{self._root}/slurmdb/{version}{path}"
        status, text = self._authorized("GET", url, None)
        if status == 404 and not _is_json(text):
            with self._shared.lock:
                self._shared.accounting = False
            return None
        body = self._parse("GET", f"/slurmdb/{version}{path}", status, text)
        if _ESLURM_INVALID_JOB_ID in {api.error_number(e) for e in api.errors(body)}:
            return None
        with self._shared.lock:
            self._shared.accounting = True
        return self._check(status, body)

    def output_files(self, job_id: str) -> OutputFiles:
        """The job's ``standard_output`` and ``standard_error`` as slurmrestd reports
        them (``%j`` expanded here where the server did not), relative ones under its
        working directory; a job submitted without them writes both streams to
        ``slurm-<id>.out`` there. Paths on the cluster: as URLs on the host of the site's
        ``storage_dir`` when that is one (``sftp://...``), else as paths on this machine
        (see :mod:`gridcore.sites.output`). UnknownJob once slurmctld forgot the job."""
        raw = self._job(job_id)
        job = api.read_job(raw)
        workdir = job.workdir or self.spec.storage_dir or "/"
        stdout = job.stdout or "slurm-%j.out"
        stderr = job.stderr or stdout
        return OutputFiles(
            self._site_file(raw, workdir, stdout), self._site_file(raw, workdir, stderr)
        )

    def cancel(self, job_id: str) -> None:
        # ESLURM_ALREADY_DONE: the job finished meanwhile, which is what we wanted.
        self._call("DELETE", self._job_path(job_id), tolerate=frozenset({_ESLURM_ALREADY_DONE}))
        self._forget_listing()
        log.info("site %s: cancelled job %s", self.spec.name, job_id)

    # ------------------------------------------------------------------ reading jobs

    def _job(self, job_id: str) -> Json:
        """The job's raw object: from the shared listing when it is fresh and has it,
        else asked for by id (UnknownJob when the site forgot it)."""
        path = self._job_path(job_id)
        if self._share_listing:
            listing = self._listing(max_age_s=self._listing_max_age_s)
            if job_id in listing:
                return listing[job_id]
        found = [
            j for j in api.dicts(self._call("GET", path), "jobs") if str(j.get("job_id")) == job_id
        ]
        if not found:
            raise UnknownJob(self.spec.name, f"job {job_id} is not known to the site")
        return found[0]

    def _listing(self, max_age_s: float) -> dict[str, Json]:
        """Every job slurmctld lists, shared by this process's SlurmSites of the site,
        fetched again once older than ``max_age_s``."""
        shared = self._shared
        oldest = self._clock() - max_age_s  # a listing begun before this is stale
        with shared.listed:
            while True:
                if shared.jobs is not None and shared.jobs_at >= oldest:
                    return shared.jobs
                if not shared.fetching:
                    break
                # another thread is fetching: its listing may do (1 call per cycle)
                shared.listed.wait(timeout=self.spec.timeout_s)
            shared.fetching, generation = True, shared.generation
        listed: dict[str, Json] | None = None
        started = self._clock()
        try:
            body = self._call("GET", "/jobs")
            listed = {str(j.get("job_id")): j for j in api.dicts(body, "jobs")}
        finally:
            with shared.listed:
                shared.fetching = False
                if listed is not None and shared.generation == generation:
                    shared.jobs, shared.jobs_at = listed, started
                shared.listed.notify_all()
        return listed

    def _forget_listing(self) -> None:
        with self._shared.listed:
            self._shared.generation += 1
            self._shared.jobs, self._shared.jobs_at = None, float("-inf")

    def _limits(self) -> tuple[tuple[api.SlurmPartition, ...], tuple[api.SlurmNode, ...]]:
        shared = self._shared
        with shared.lock:
            if self._clock() - shared.limits_at <= LIMITS_MAX_AGE_S and shared.partitions:
                return shared.partitions, shared.nodes
        started = self._clock()
        partitions = tuple(
            api.read_partition(p) for p in api.dicts(self._call("GET", "/partitions"), "partitions")
        )
        nodes = tuple(api.read_node(n) for n in api.dicts(self._call("GET", "/nodes"), "nodes"))
        with shared.lock:
            shared.partitions, shared.nodes, shared.limits_at = partitions, nodes, started
        return partitions, nodes

    def _site_file(self, job: Json, workdir: str, pattern: str) -> str:
        name = expand_filename_pattern(_local_part(pattern), job)
        path = posixpath.join(_local_part(workdir), name)
        host = _URL.match(self.spec.storage_dir or "")
        return f"{host.group(1)}{path}" if host else path

    @staticmethod
    def _observed_job(job: api.SlurmJob) -> ObservedJob:
        state = map_job_state(job.state)
        return ObservedJob(
            job_id=job.job_id,
            processors=job.cpus,
            state=state,
            key=job.comment,
            submitted_at=job.submit_time,
            started_at=_observed_start(job, state),
            user=job.user,
            time_limit_s=job.time_limit_s,
            ended_at=job.end_time if state.finished and job.nodes else None,
            start_estimate=job.start_time if state is JobState.PENDING else None,
            name=job.name or None,
        )

    @staticmethod
    def _controller_status(job_id: str, job: api.SlurmJob) -> JobStatus:
        state = map_job_state(job.state)
        pending = state is JobState.PENDING
        return _job_status(
            job_id,
            state,
            job,
            reason="; ".join(r for r in (job.reason, job.description) if r),
            held=pending and job.held,
            requeued_by=_requeue_cause(job) if pending and job.requeued else None,
            restarts=job.restarts,
        )

    def _job_path(self, job_id: str) -> str:
        # The id becomes part of the URL path: accept only what Slurm can have issued.
        if not _JOB_ID.fullmatch(job_id):
            raise UnknownJob(self.spec.name, f"{job_id!r} is not a Slurm job id")
        return f"/job/{job_id}"

    def _discard(self, job_id: str) -> None:
        try:
            self.cancel(job_id)
        except (SiteRejected, SiteUnavailable, UnknownJob) as exc:
            log.warning(
                "site %s: could not cancel rejected job %s: %s", self.spec.name, job_id, exc
            )

    # ------------------------------------------------------------------ versions

    def _version(self) -> str:
        if self.spec.api_version != api.AUTO:
            return self.spec.api_version
        version = self._shared.version
        return version if version is not None else self._discover()

    def _discover(self) -> str:
        """Ask the server which versions it serves (``GET /openapi/v3``, the list every
        release since 20.11 publishes) and keep the newest gridcore speaks."""
        status, text = self._authorized("GET", f"{self._root}/openapi/v3", None)
        body = self._parse("GET", "/openapi/v3", status, text)
        self._check(status, body)
        served = api.served_versions(body)
        chosen = api.choose_version(served)
        if chosen is None:
            listed = ", ".join(served) or "no slurmctld API version"
            raise SiteRejected(
                self.spec.name,
                f"slurmrestd serves {listed}; gridcore speaks {api.VERSIONS[0]} to "
                f"{api.VERSIONS[-1]} (is slurmrestd started with -s openapi/slurmctld?)",
            )
        with self._shared.lock:
            self._shared.version = chosen
            self._shared.accounting = api.serves_accounting(body, chosen)
        log.info("site %s: slurmrestd serves %s; using %s", self.spec.name, served, chosen)
        return chosen

    # ------------------------------------------------------------------ boundary

    def _call(
        self,
        method: str,
        path: str,
        payload: Json | None = None,
        tolerate: frozenset[int] = frozenset(),
    ) -> Json:
        status, body = self._exchange(method, path, payload)
        return self._check(status, body, tolerate)

    def _exchange(self, method: str, path: str, payload: Json | None = None) -> tuple[int, Json]:
        """One API call: ``path`` under the version in use. Under ``auto``, a 404 with a
        non-JSON body (a version the server no longer serves: the site was upgraded)
        makes the adapter ask the server again and retry once."""
        version = self._version()
        status, text = self._authorized(method, f"{self._root}/slurm/{version}{path}", payload)
        if status == 404 and not _is_json(text):
            if self.spec.api_version != api.AUTO:
                raise SiteRejected(
                    self.spec.name,
                    f"slurmrestd does not serve the pinned api_version {version} (HTTP 404 "
                    f'on {path}); set api_version = "auto" or a version it serves',
                )
            log.warning(
                "site %s: %s answers 404: asking for its versions again", self.spec.name, version
            )
            with self._shared.lock:
                if self._shared.version == version:
                    self._shared.version = None
            version = self._version()
            status, text = self._authorized(method, f"{self._root}/slurm/{version}{path}", payload)
        body = self._parse(method, path, status, text)
        self._note_release(body)
        return status, body

    def _authorized(self, method: str, url: str, payload: Json | None) -> tuple[int, str]:
        """Send with the current token; on a refused credential read it anew and send
        once more; refused again: CredentialRejected naming the reference."""
        status, text = self._send(method, url, payload)
        if not _credential_refused(status, text):
            return status, text
        renewed = self._renew()
        status, text = self._send(method, url, payload)
        if not _credential_refused(status, text):
            return status, text
        detail = f"HTTP {status}" if status in _AUTH_STATUS else f"error {_AUTH_ERROR}"
        again = "read anew" if renewed else "read anew (unchanged)"
        raise CredentialRejected(
            self.spec.name,
            f"credential rejected ({detail}) for "
            f"user {self._user!r} with the token from {self._tokens.describe()}, {again}: "
            "check that the token is valid for this cluster and not expired",
        )

    def _renew(self) -> bool:
        old = self._token
        self._token = self._checked(self._tokens.renew(rejected=old))
        return self._token != old

    def _checked(self, token: str) -> str:
        token = token.strip()
        # requests would echo an invalid header value in its exception: refuse it here.
        if not token or any(ch in token for ch in "\r\n\0"):
            raise CredentialError(
                f"site {self.spec.name}: the token from {self._tokens.describe()} is empty "
                "or invalid"
            )
        return token

    def _scrub(self, text: str) -> str:
        return credentials.scrub(text, self._token)

    def _send(self, method: str, url: str, payload: Json | None) -> tuple[int, str]:
        """One HTTP exchange -> (status, text); transport failures raised."""
        site = self.spec.name
        # A file reference that changed, or a command whose JWT nears its exp, renews here.
        self._token = self._checked(self._tokens.token())
        headers = {
            "X-SLURM-USER-NAME": self._user,
            "X-SLURM-USER-TOKEN": self._token,
            "Accept": "application/json",
        }
        for attempt in (1, 2):
            with self._shared.lock:
                self._shared.calls += 1
            try:
                with self._session.request(
                    method, url, headers=headers, json=payload, timeout=self.spec.timeout_s
                ) as resp:
                    status, text = resp.status_code, resp.text
            except requests.RequestException as exc:
                error = self._transport_error(method, url, exc)
                # A dropped connection loses one answer; a read asks again once (a pooled
                # keep-alive connection the server closed is the common case). A silent
                # site (a timeout) is not asked twice: it would cost two timeouts.
                dropped = isinstance(error, AnswerLost) and not isinstance(exc, requests.Timeout)
                if method == "GET" and dropped and attempt == 1:
                    log.info("site %s: %s; asking again", site, error.site_message)
                    continue
                raise error from exc
            log.debug("site %s: %s %s -> HTTP %d", site, method, url, status)
            return status, text
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _transport_error(self, method: str, url: str, exc: requests.RequestException) -> SiteError:
        """The request's transport failure, translated: never sent (a refused or timed-out
        connection) is :class:`SiteUnavailable`; sent and its answer lost (no answer in
        time, or the connection dropped before it) is :class:`AnswerLost`."""
        site = self.spec.name
        if isinstance(exc, requests.ConnectTimeout) or _never_sent(exc):
            return SiteUnavailable(site, self._scrub(f"cannot reach {method} {url}: {exc}"))
        if isinstance(exc, requests.Timeout):
            return AnswerLost(site, f"{method} {url}: no answer within {self.spec.timeout_s:g} s")
        if isinstance(exc, requests.ConnectionError | requests.exceptions.ChunkedEncodingError):
            return AnswerLost(
                site,
                self._scrub(f"{method} {url}: the connection dropped before the answer: {exc}"),
            )
        return SiteUnavailable(site, self._scrub(f"cannot reach {method} {url}: {exc}"))

    def _note_release(self, body: Json) -> None:
        found = api.release(body)
        if found and found != self._shared.release:
            with self._shared.lock:
                self._shared.release = found

    def _parse(self, method: str, path: str, status: int, text: str) -> Json:
        try:
            body = json.loads(text)
        except ValueError:
            snippet = self._scrub(text.strip()[:200])
            raise SiteRejected(
                self.spec.name, f"{method} {path}: HTTP {status} with a non-JSON body: {snippet!r}"
            ) from None
        if not isinstance(body, dict):
            raise SiteRejected(
                self.spec.name, f"{method} {path}: HTTP {status}, body not an object"
            )
        return body

    def _check(self, status: int, body: Json, tolerate: frozenset[int] = frozenset()) -> Json:
        """Raise for a non-empty ``errors[]`` (even on HTTP 200) or an HTTP error code."""
        errors = api.errors(body)
        numbers = {api.error_number(e) for e in errors}
        if errors and not numbers <= tolerate:
            text = self._scrub("; ".join(api.error_text(e) for e in errors))
            if _ESLURM_INVALID_JOB_ID in numbers:
                raise UnknownJob(self.spec.name, text)
            if numbers & _COMMUNICATION_ERRORS:
                raise SiteUnavailable(self.spec.name, text)
            if _UNSPECIFIED in numbers:
                text += _UNSPECIFIED_HINT
            raise SiteRejected(self.spec.name, f"HTTP {status}: {text}")
        if status >= 400 and not errors:
            raise SiteRejected(self.spec.name, f"HTTP {status} without an error message")
        return body


def _accounted_status(job_id: str, job: api.AccountedJob) -> JobStatus:
    state = map_job_state(job.state)
    reason = job.reason if job.reason != "None" else ""
    return _job_status(job_id, state, job, reason=reason, usage=job.usage)


def _job_status(
    job_id: str, state: JobState, job: api.SlurmJob | api.AccountedJob, **fields: Any
) -> JobStatus:
    """A status from what slurmctld or slurmdbd said of the job: a running job's exit
    code (0) and end time (its projected end) and a pending job's start time (a
    forecast) mean nothing yet, so they are left out."""
    return JobStatus(
        job_id=job_id,
        state=state,
        exit_code=job.exit_code if state.finished else None,
        submitted_at=job.submit_time,
        started_at=job.start_time if state is not JobState.PENDING else None,
        finished_at=job.end_time if state.finished else None,
        **fields,
    )


def _never_sent(exc: requests.RequestException) -> bool:
    """Did the request fail before anything was sent (no connection could be made)?
    urllib3 reports it as MaxRetryError over a connection error; a connection that
    dropped after sending is a bare ProtocolError (requests does not retry a POST)."""
    cause = exc.args[0] if exc.args else None
    reason = getattr(cause, "reason", None)
    return isinstance(
        reason, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError
    )


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _credential_refused(status: int, text: str) -> bool:
    if status in _AUTH_STATUS:
        return True
    if '"error_number"' not in text and '"error_code"' not in text:
        return False
    try:
        body = json.loads(text)
    except ValueError:
        return False
    return isinstance(body, dict) and any(
        api.error_number(e) == _AUTH_ERROR for e in api.errors(body)
    )


def _requeue_cause(job: api.SlurmJob) -> str:
    """What Slurm says put the job back in the queue: a state flag beside PENDING
    (NODE_FAIL, PREEMPTED, ...), else that it was requeued (``scontrol requeue`` leaves
    no cause; the job's reason then says why it waits, e.g. BeginTime or a hold)."""
    causes = sorted(job.flags & _REQUEUE_CAUSES)
    return ", ".join(causes) if causes else "REQUEUED"
