"""A Slurm cluster reached through slurmrestd's OpenAPI (v0.0.38, Slurm 22.05).

Every request goes through :meth:`SlurmSite._send` and :meth:`SlurmSite._check`, which
translate transport failures and the body's ``errors[]`` into :mod:`gridcore.errors`
types; nothing else in this module looks at ``requests`` exceptions or HTTP codes.

Facts about slurmrestd 22.05 this adapter relies on (checked against a real cluster):

* ``errors[]`` must be read even on HTTP 200: a job asking for more CPUs than the
  partition has comes back as HTTP 200 with ``errors: [{"error_code": 2015, ...}]`` AND a
  ``job_id`` -- the job is queued and would pend forever, so :meth:`SlurmSite.submit`
  cancels it before raising.
* A token that slurmctld rejects does not give 401: slurmrestd answers HTTP 500 with
  ``errors: [{"error_number": -1, "error": "Unspecified error"}]``, exactly as when
  slurmctld is unreachable. Only a missing token header gives 401.
* ``exit_code`` is the raw wait(2) status (``exit 3`` reports 768), not the exit status.
* ``end_time`` of a running job is its projected end (start + time limit), so it only
  counts as a finish time once the job is in a finished state.
* ``start_time`` of a pending job is 0 or a forecast; a job cancelled while pending gets
  ``start_time = end_time =`` the cancel time and empty ``nodes`` (it never started).

Submission keys (:mod:`gridcore.sites.keys`) travel in the job's ``comment`` (the name
stays the user's): v0.0.38 accepts ``comment`` at submission and returns it in
``GET /jobs``, which has no filter, so :meth:`SlurmSite.find` lists the jobs and picks
the key. Slurm itself does not refuse a second job with the same comment: exactly-once
rests on the caller looking the key up first and recording the id conditionally.

Finished jobs vanish from slurmctld (and from ``GET /jobs``) ``MinJobAge`` seconds
after they end (300 s in the test grid; there is no slurmdbd to ask instead). A retry
made later than that after a job that already FINISHED cannot see it and submits again;
a retry while the job is pending or running, or within MinJobAge of its end, finds it.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
import time
from typing import Any

import requests

from gridcore.errors import (
    ConfigError,
    CredentialError,
    RequestError,
    SiteRejected,
    SiteUnavailable,
    UnknownJob,
)
from gridcore.model import (
    JobState,
    JobStatus,
    JobSubmission,
    ObservedJob,
    SiteKind,
    SiteObservation,
    SiteSpec,
)
from gridcore.sites.output import OutputFiles

log = logging.getLogger(__name__)

Json = dict[str, Any]

DEFAULT_PARTITION = "debug"
DEFAULT_USER = "root"
JOB_PATH = "/usr/local/bin:/usr/bin:/bin"

# slurm_errno.h values that change how an error is reported.
_ESLURM_INVALID_JOB_ID = 2017
_ESLURM_ALREADY_DONE = 2021
_UNSPECIFIED = -1
# SLURM_COMMUNICATIONS_* (1001-1005) and SLURMCTLD_COMMUNICATIONS_* (1800-1803): slurmrestd
# could not talk to slurmctld, so the site is down rather than refusing us.
_COMMUNICATION_ERRORS = frozenset({*range(1001, 1006), *range(1800, 1804)})
_UNSPECIFIED_HINT = (
    " (slurmrestd reports this when slurmctld rejects the token or cannot be reached;"
    " check the token reference)"
)

_PENDING_STATES = frozenset(
    {
        "PENDING",
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
_UNUSABLE_NODE_STATES = frozenset(
    {
        "DOWN",
        "DRAIN",
        "DRAINED",
        "DRAINING",
        "FAIL",
        "FAILING",
        "ERROR",
        "FUTURE",
        "UNKNOWN",
        "INVALID",
        "NOT_RESPONDING",
        "NO_RESPOND",
        "POWERED_DOWN",
        "POWER_DOWN",
        "POWERING_DOWN",
    }
)
_JOB_ID = re.compile(r"\d+(?:_\d+)?")
# sbatch's filename pattern: %% or %[width]<letter> (man sbatch, "filename pattern").
_FILENAME_PATTERN = re.compile(r"%(%|(\d*)([AaJjNnstux]))")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/]*)")


# --------------------------------------------------------------------------- JSON helpers


def _dicts(body: Json, key: str) -> list[Json]:
    """The dict items of the list ``body[key]`` (missing or malformed -> empty)."""
    value = body.get(key)
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, dict)]


def _number(value: Any) -> int | None:
    """An int field, either bare or in the newer ``{"set": true, "number": n}`` shape."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, dict) and value.get("set", True) and not value.get("infinite"):
        return _number(value.get("number"))
    return None


def _int(body: Json, key: str) -> int:
    return _number(body.get(key)) or 0


def _tokens(value: Any) -> set[str]:
    """A state as a set of upper-case words: ``"idle"`` or ``["IDLE", "DRAIN"]``."""
    if isinstance(value, str):
        return {value.upper()} if value else set()
    if isinstance(value, list):
        return {str(v).upper() for v in value}
    return set()


def _state_name(value: Any) -> str:
    # Newer APIs give ["RUNNING", "COMPLETING"]: the base state comes first.
    if isinstance(value, list):
        return str(value[0]).upper() if value else ""
    return str(value or "").upper()


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


def _decode_wait_status(status: int) -> int:
    """A wait(2) status -> the shell's view: the exit status, or 128 + signal."""
    signal_no = status & 0x7F
    if signal_no:
        return 128 + signal_no
    return (status >> 8) & 0xFF


def _exit_from_dict(value: Json) -> int | None:
    """Newer APIs: ``{"status": [...], "return_code": n, "signal": {"id": n}}``."""
    if "SIGNALED" in _tokens(value.get("status")):
        signal = value.get("signal")
        signal_no = _number(signal.get("id")) if isinstance(signal, dict) else None
        if signal_no:
            return 128 + signal_no
    return _number(value.get("return_code"))


def decode_exit_code(value: Any) -> int | None:
    """Slurm's ``exit_code`` field (raw wait status int, or a dict) -> exit status."""
    if isinstance(value, dict):
        return _exit_from_dict(value)
    number = _number(value)
    return None if number is None else _decode_wait_status(number)


def _epoch(value: Any) -> float | None:
    number = _number(value)
    # Slurm uses 0 for "not yet".
    return float(number) if number else None


def _observed_start(job: Json, state: JobState) -> float | None:
    """When the job got its processors, or None if it has not (yet, or ever).

    A pending job's ``start_time`` is 0 or the scheduler's forecast, not a start. A job
    cancelled while pending is reported with ``start_time == end_time ==`` the cancel
    time and no ``nodes``: it never started, so it must not count as a wait that ended.
    A job cancelled while running keeps its ``nodes`` and real ``start_time``.
    """
    if state is JobState.PENDING:
        return None
    if state.finished and not job.get("nodes") and not job.get("batch_host"):
        return None
    return _epoch(job.get("start_time"))


def _node_usable(node: Json) -> bool:
    words = _tokens(node.get("state")) | _tokens(node.get("state_flags"))
    return not words & _UNUSABLE_NODE_STATES


def _node_idle_cpus(node: Json) -> int:
    if "idle_cpus" in node:
        return _int(node, "idle_cpus")
    return max(0, _int(node, "cpus") - _int(node, "alloc_cpus"))


def _error_number(error: Json) -> int | None:
    for key in ("error_number", "error_code", "errno"):
        number = _number(error.get(key))
        if number is not None:
            return number
    return None


def _error_text(error: Json) -> str:
    text = str(error.get("error") or "").strip()
    detail = str(error.get("description") or "").strip()
    if text and detail and detail != text:
        return f"{text}: {detail}"
    return text or detail or f"error {_error_number(error)}"


def _site_errors(body: Json) -> list[Json]:
    raw = body.get("errors")
    if not isinstance(raw, list):
        return []
    # Some releases put bare strings in errors[]; treat them as the error text.
    return [e if isinstance(e, dict) else {"error": str(e)} for e in raw]


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


# --------------------------------------------------------------------------- adapter


class SlurmSite:
    """One Slurm cluster behind slurmrestd. Implements ``gridcore.sites.base.SiteAdapter``.

    The token is kept only to build request headers; it is never logged and is scrubbed
    from every error message. Pass a ``session`` to share a connection pool (it is then
    not closed by :meth:`close`).
    """

    def __init__(self, spec: SiteSpec, token: str, session: requests.Session | None = None) -> None:
        if spec.kind is not SiteKind.SLURM or not spec.url:
            raise ConfigError(f"site {spec.name}: a Slurm site needs kind 'slurm' and a url")
        token = token.strip()
        # requests would echo an invalid header value in its exception: refuse it here.
        if not token or any(ch in token for ch in "\r\n\0"):
            ref = spec.token.describe() if spec.token else "the token reference"
            raise CredentialError(f"site {spec.name}: the token from {ref} is empty or invalid")
        self.spec = spec
        self._token = token
        self._base = f"{spec.url.rstrip('/')}/slurm/{spec.api_version}"
        self._owns_session = session is None
        self._session = session if session is not None else requests.Session()
        self._headers = {
            "X-SLURM-USER-NAME": spec.user or DEFAULT_USER,
            "X-SLURM-USER-TOKEN": token,
            "Accept": "application/json",
        }

    def __repr__(self) -> str:
        return f"SlurmSite(site={self.spec.name!r}, url={self.spec.url!r})"

    __str__ = __repr__

    def close(self) -> None:
        if self._owns_session:
            self._session.close()

    def __enter__(self) -> SlurmSite:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ protocol

    def ping(self) -> None:
        """Raise SiteUnavailable/SiteRejected unless slurmctld answers through slurmrestd."""
        body = self._call("GET", "/ping")
        pings = _dicts(body, "pings")
        if not any(str(p.get("ping", "")).upper() == "UP" for p in pings):
            raise SiteUnavailable(self.spec.name, f"no controller is UP: {pings}")

    def observe(self) -> SiteObservation:
        observed_at = time.time()
        # Jobs BEFORE nodes: every job this read shows RUNNING already holds its CPUs in
        # the nodes read after it, so the caller may stop counting it as in flight. A job
        # starting between the reads looks pending yet allocated (counted twice: idle
        # under-stated, safe). The other order can show a job running whose CPUs the
        # earlier nodes read still called idle (counted nowhere: idle over-stated).
        jobs = tuple(self._observed_job(j) for j in _dicts(self._call("GET", "/jobs"), "jobs"))
        nodes = _dicts(self._call("GET", "/nodes"), "nodes")
        partition = self.spec.partition or DEFAULT_PARTITION
        usable = [n for n in nodes if partition in (n.get("partitions") or ()) and _node_usable(n)]
        return SiteObservation(
            site=self.spec.name,
            total_processors=sum(_int(n, "cpus") for n in usable),
            idle_processors=sum(_node_idle_cpus(n) for n in usable),
            jobs=jobs,
            observed_at=observed_at,
        )

    def submit(self, job: JobSubmission) -> str:
        payload = self._submission(job)
        status, body = self._send("POST", "/job/submit", payload)
        job_id = _number(body.get("job_id"))
        if job_id is not None and _site_errors(body):
            # Slurm queued the job despite the error (e.g. more CPUs than the partition
            # has); it could never run, so do not leave it pending at the site.
            self._discard(str(job_id))
        self._check(status, body)
        if job_id is None:
            raise SiteRejected(self.spec.name, f"job {job.name}: submit answered without job_id")
        log.info("site %s: submitted %s as job %s", self.spec.name, job.name, job_id)
        return str(job_id)

    def find(self, key: str) -> str | None:
        """The id of the job submitted with ``key`` (its comment), if slurmctld still
        knows it (see the module's note on MinJobAge). Several (a race between two
        submitters): the oldest, which is the one a conditional record keeps."""
        found = [
            int(j["job_id"])
            for j in _dicts(self._call("GET", "/jobs"), "jobs")
            if j.get("comment") == key and isinstance(j.get("job_id"), int)
        ]
        return str(min(found)) if found else None

    def status(self, job_id: str) -> JobStatus:
        path = self._job_path(job_id)
        found = [
            j for j in _dicts(self._call("GET", path), "jobs") if str(j.get("job_id")) == job_id
        ]
        if not found:
            raise UnknownJob(self.spec.name, f"job {job_id} is not known to the site")
        return self._job_status(job_id, found[0])

    def output_files(self, job_id: str) -> OutputFiles:
        """The job's ``standard_output`` and ``standard_error`` as slurmrestd reports
        them (v0.0.38 gives the pattern submitted, ``%j`` unexpanded: expanded here),
        relative ones under its working directory; a job submitted without them writes
        both streams to ``slurm-<id>.out`` there. Paths on the cluster: as URLs on the
        host of the site's ``storage_dir`` when that is one (``sftp://...``), else as
        paths on this machine (see :mod:`gridcore.sites.output`). UnknownJob once
        slurmctld forgot the job (MinJobAge after its end)."""
        path = self._job_path(job_id)
        found = [
            j for j in _dicts(self._call("GET", path), "jobs") if str(j.get("job_id")) == job_id
        ]
        if not found:
            raise UnknownJob(self.spec.name, f"job {job_id} is not known to the site")
        job = found[0]
        workdir = str(job.get("current_working_directory") or self.spec.storage_dir or "/")
        stdout = str(job.get("standard_output") or "slurm-%j.out")
        stderr = str(job.get("standard_error") or stdout)
        return OutputFiles(
            self._site_file(job, workdir, stdout), self._site_file(job, workdir, stderr)
        )

    def _site_file(self, job: Json, workdir: str, pattern: str) -> str:
        name = expand_filename_pattern(_local_part(pattern), job)
        path = posixpath.join(_local_part(workdir), name)
        host = _URL.match(self.spec.storage_dir or "")
        return f"{host.group(1)}{path}" if host else path

    def cancel(self, job_id: str) -> None:
        # ESLURM_ALREADY_DONE: the job finished meanwhile, which is what we wanted.
        self._call("DELETE", self._job_path(job_id), tolerate=frozenset({_ESLURM_ALREADY_DONE}))
        log.info("site %s: cancelled job %s", self.spec.name, job_id)

    # ------------------------------------------------------------------ mapping

    def _submission(self, job: JobSubmission) -> Json:
        workdir = job.workdir or self.spec.storage_dir
        if not workdir:
            raise RequestError(
                f"job {job.name}: no workdir given and site {self.spec.name} has no storage_dir"
            )
        if job.processors < 1:
            raise RequestError(f"job {job.name}: processors must be >= 1, got {job.processors}")
        return {
            "script": f"#!/bin/bash\n{job.command}\n",
            "job": {
                "name": job.name,
                **({"comment": job.key} if job.key is not None else {}),
                "partition": self.spec.partition or DEFAULT_PARTITION,
                "ntasks": 1,
                "cpus_per_task": job.processors,
                "current_working_directory": workdir,
                "standard_output": posixpath.join(workdir, f"{job.name}-%j.out"),
                "standard_error": posixpath.join(workdir, f"{job.name}-%j.err"),
                # slurmrestd refuses a job without an environment (HTTP 400).
                "environment": {"PATH": JOB_PATH, **job.env},
            },
        }

    @staticmethod
    def _observed_job(job: Json) -> ObservedJob:
        comment = job.get("comment")
        state = map_job_state(_state_name(job.get("job_state")))
        return ObservedJob(
            job_id=str(job.get("job_id")),
            processors=_int(job, "cpus"),
            state=state,
            key=comment if isinstance(comment, str) and comment else None,
            submitted_at=_epoch(job.get("submit_time")),
            started_at=_observed_start(job, state),
        )

    @staticmethod
    def _job_status(job_id: str, job: Json) -> JobStatus:
        state = map_job_state(_state_name(job.get("job_state")))
        reason = str(job.get("state_reason") or "")
        detail = str(job.get("state_description") or "")
        reason = "; ".join(r for r in (reason, detail) if r and r != "None")
        return JobStatus(
            job_id=job_id,
            state=state,
            # Running jobs report exit_code 0 and a projected end_time: meaningless yet.
            exit_code=decode_exit_code(job.get("exit_code")) if state.finished else None,
            submitted_at=_epoch(job.get("submit_time")),
            started_at=_epoch(job.get("start_time")) if state is not JobState.PENDING else None,
            finished_at=_epoch(job.get("end_time")) if state.finished else None,
            reason=reason,
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

    # ------------------------------------------------------------------ boundary

    def _call(
        self,
        method: str,
        path: str,
        payload: Json | None = None,
        tolerate: frozenset[int] = frozenset(),
    ) -> Json:
        status, body = self._send(method, path, payload)
        return self._check(status, body, tolerate)

    def _scrub(self, text: str) -> str:
        return text.replace(self._token, "<token>")

    def _send(self, method: str, path: str, payload: Json | None = None) -> tuple[int, Json]:
        """One HTTP exchange -> (status, JSON object); transport and auth errors raised."""
        url = f"{self._base}{path}"
        site = self.spec.name
        try:
            with self._session.request(
                method, url, headers=self._headers, json=payload, timeout=self.spec.timeout_s
            ) as resp:
                status, text = resp.status_code, resp.text
        except requests.Timeout as exc:
            raise SiteUnavailable(
                site, f"{method} {url} timed out after {self.spec.timeout_s:g} s"
            ) from exc
        except requests.RequestException as exc:
            raise SiteUnavailable(site, self._scrub(f"cannot reach {method} {url}: {exc}")) from exc
        log.debug("site %s: %s %s -> HTTP %d", site, method, path, status)
        if status in (401, 403):
            ref = self.spec.token.describe() if self.spec.token else "the token reference"
            raise SiteRejected(
                site,
                f"authentication rejected (check the token reference): HTTP {status} "
                f"for user {self._headers['X-SLURM-USER-NAME']!r}, token from {ref}",
            )
        return status, self._parse(method, path, status, text)

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
        errors = _site_errors(body)
        numbers = {_error_number(e) for e in errors}
        if errors and not numbers <= tolerate:
            text = self._scrub("; ".join(_error_text(e) for e in errors))
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
