"""slurmrestd's REST API as gridcore speaks it, v0.0.38 (Slurm 22.05) to v0.0.45 (26.05):
which version to use, the request bodies (a pure builder per version family) and one
tolerant reader of every response shape. No I/O here: :mod:`gridcore.sites.slurm` sends.

Versions each release serves (checked on real servers, see docs/slurm-test-grid.md):
22.05 v0.0.36-38, 23.02 v0.0.37-39, 23.11 v0.0.38-40, 24.05 v0.0.39-41, 24.11 v0.0.40-42,
25.05 v0.0.40-43, 25.11 v0.0.41-44, 26.05 v0.0.42-45. No single version covers the
releases sites run, so the adapter asks each server (``GET /openapi/v3``) and uses the
newest version both sides know.

What changed after v0.0.38, for the fields used here:

* numbers that may be unset or infinite (``time_limit``, memory, times, ``cpus``) are
  ``{set, infinite, number}`` objects from v0.0.39 on (the reader accepts both shapes);
* ``environment`` is a list of ``"K=V"`` strings from v0.0.39 (a dict is converted with a
  warning); the task count is ``tasks`` in every version (``ntasks`` was never a field:
  newer servers drop it with a warning);
* ``job_state`` and a node's ``state`` are lists of words (``["PENDING", "REQUEUED"]``);
* ``exit_code`` is ``{status: [...], return_code, signal: {id, name}}``;
* ``/ping`` says ``ping: "UP"`` (v0.0.38), ``pinged`` (v0.0.40, 41), ``responding``
  (v0.0.42 on; v0.0.45 drops ``pinged``);
* ``standard_output`` is the raw ``%j`` pattern from v0.0.43 on, ``stdout_expanded``
  beside it;
* ``DELETE /job/{id}`` reports per-signal results in ``status[]`` from v0.0.42;
* GPUs are ``tres_per_job = "gres/gpu:N"`` from v0.0.39 (v0.0.38: ``gpus``).
"""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gridcore.model import JobResources, JobSubmission, JobUsage, MemoryScope

Json = dict[str, Any]

VERSIONS = (
    "v0.0.38",
    "v0.0.39",
    "v0.0.40",
    "v0.0.41",
    "v0.0.42",
    "v0.0.43",
    "v0.0.44",
    "v0.0.45",
)
"""Every slurmctld API version this module reads and writes, oldest first."""
AUTO = "auto"
JOB_PATH = "/usr/local/bin:/usr/bin:/bin"
DEFAULT_PARTITION = "debug"
# Slurm's NO_VAL / INFINITE markers as they leak into v0.0.38's bare numbers.
_INFINITE32 = 0xFFFFFFFF
_NO_VAL32 = 0xFFFFFFFE
_VERSION_PATH = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/")
_GRES_GPU = re.compile(r"(?:^|,)gpu(?::[^:,()]+)?:(\d+)")
_TRES_GPU = re.compile(r"(?:^|,)gres/gpu(?::[^=,]+)?=(\d+)")


def minor(version: str) -> int:
    """38 for ``v0.0.38``."""
    return int(version.rsplit(".", 1)[1])


# --------------------------------------------------------------------------- versions


def served_versions(openapi: Json) -> tuple[str, ...]:
    """The slurmctld API versions a server's ``GET /openapi/v3`` document lists."""
    paths = openapi.get("paths")
    found = set()
    if isinstance(paths, dict):
        for path in paths:
            match = _VERSION_PATH.match(str(path))
            if match:
                found.add(match.group(1))
    return tuple(sorted(found, key=minor))


def choose_version(served: Iterable[str]) -> str | None:
    """The newest version both the server and gridcore speak, or None."""
    common = [v for v in served if v in VERSIONS]
    return max(common, key=minor) if common else None


def release(body: Json) -> str | None:
    """The Slurm release a response's ``meta`` names (``"26.05.5"``), if any."""
    meta = body.get("meta")
    if not isinstance(meta, dict):
        return None
    slurm = meta.get("slurm") or meta.get("Slurm")
    if not isinstance(slurm, dict):
        return None
    named = slurm.get("release")
    if isinstance(named, str) and named:
        return named
    parts = slurm.get("version")
    if isinstance(parts, dict) and {"major", "minor", "micro"} <= parts.keys():
        return f"{parts['major']}.{parts['minor']}.{parts['micro']}"
    return None


# --------------------------------------------------------------------------- numbers


def number(value: Any) -> int | None:
    """An int field, bare or ``{"set": true, "number": n}``; unset, infinite and
    Slurm's NO_VAL/INFINITE markers are None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if value in (_INFINITE32, _NO_VAL32) else value
    if isinstance(value, float) and value.is_integer():
        return number(int(value))
    if isinstance(value, dict) and value.get("set", True) and not value.get("infinite"):
        return number(value.get("number"))
    return None


def is_infinite(value: Any) -> bool:
    if isinstance(value, dict):
        return bool(value.get("infinite"))
    if isinstance(value, str):
        return value.upper() in ("UNLIMITED", "INFINITE")
    return isinstance(value, int) and value == _INFINITE32


def words(value: Any) -> frozenset[str]:
    """A state as upper-case words: ``"idle"``, ``"IDLE+DRAIN"`` or ``["IDLE", "DRAIN"]``."""
    if isinstance(value, str):
        return frozenset(w for w in value.upper().split("+") if w)
    if isinstance(value, list):
        return frozenset(str(v).upper() for v in value if v)
    return frozenset()


def dicts(body: Json, key: str) -> list[Json]:
    """The dict items of the list ``body[key]`` (missing or malformed: empty)."""
    value = body.get(key)
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, dict)]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _epoch(value: Any) -> float | None:
    found = number(value)
    return float(found) if found else None  # Slurm uses 0 for "not yet"


# --------------------------------------------------------------------------- requests


def submission_body(
    version: str,
    job: JobSubmission,
    *,
    partition: str,
    workdir: str,
    resources: JobResources,
) -> Json:
    """The ``POST /job/submit`` body for ``version``: the job's name and key (in its
    ``comment``), one task with ``job.processors`` CPUs, its working directory and
    output files, its environment and the resources asked for (already merged with the
    site's defaults)."""
    n = minor(version)
    env = {"PATH": JOB_PATH, **job.env}
    desc: Json = {
        "name": job.name,
        "partition": partition,
        "tasks": 1,
        "cpus_per_task": job.processors,
        "current_working_directory": workdir,
        "standard_output": posixpath.join(workdir, f"{job.name}-%j.out"),
        "standard_error": posixpath.join(workdir, f"{job.name}-%j.err"),
        # slurmrestd refuses a job without an environment (every release).
        "environment": env if n == 38 else [f"{k}={v}" for k, v in env.items()],
    }
    if job.key is not None:
        desc["comment"] = job.key
    desc.update(_resource_fields(n, resources))
    script = f"#!/bin/bash\n{job.command}\n"
    if n >= 41:
        # Top-level "script" is deprecated in v0.0.41/42 in favour of job.script.
        return {"job": {**desc, "script": script}}
    return {"script": script, "job": desc}


def _resource_fields(n: int, res: JobResources) -> Json:
    out: Json = {}
    if res.time_limit_s is not None:
        # Slurm counts time limits in whole minutes: round up, never cut a job short.
        out["time_limit"] = _uint(n, max(1, math.ceil(res.time_limit_s / 60)))
    if res.memory_mib is not None:
        key = "memory_per_cpu" if res.memory_per is MemoryScope.CPU else "memory_per_node"
        out[key] = _uint(n, res.memory_mib)
    if res.gpus:
        if n == 38:
            out["gpus"] = str(res.gpus)
        else:
            out["tres_per_job"] = f"gres/gpu:{res.gpus}"
    for key, value in (("account", res.account), ("qos", res.qos)):
        if value is not None:
            out[key] = value
    if res.constraint is not None:
        out["constraints"] = res.constraint
    return out


def _uint(n: int, value: int) -> Any:
    return value if n == 38 else {"set": True, "infinite": False, "number": value}


# --------------------------------------------------------------------------- jobs

# Flags (v0.0.40+ put them beside the base state) and states meaning "queued again".
REQUEUE_WORDS = frozenset(
    {"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "REQUEUE_CRON", "SPECIAL_EXIT"}
)
_HOLD_REASONS = frozenset({"JOBHELDUSER", "JOBHELDADMIN"})


@dataclass(frozen=True)
class SlurmJob:
    """One job of a ``/jobs`` or ``/job/{id}`` answer, in every version's shape."""

    job_id: str
    state: str  # the base state: PENDING, RUNNING, COMPLETED, ...
    flags: frozenset[str]
    name: str
    comment: str | None
    cpus: int
    exit_code: int | None
    submit_time: float | None
    start_time: float | None
    end_time: float | None
    # minutes on the wire, seconds here; None: unset or infinite (UNLIMITED)
    time_limit_s: float | None
    user: str | None
    reason: str
    description: str
    restarts: int
    nodes: str
    held: bool
    workdir: str
    stdout: str
    stderr: str
    raw: Mapping[str, Any]

    @property
    def requeued(self) -> bool:
        waiting = self.state in ("PENDING", "SPECIAL_EXIT")
        return bool((self.flags | {self.state}) & REQUEUE_WORDS) or (waiting and self.restarts > 0)


def read_job(raw: Json) -> SlurmJob:
    states = raw.get("job_state")
    base = _base_state(states)
    reason = _text(raw.get("state_reason"))
    comment = raw.get("comment")
    flags = words(states) - {base}
    hold = raw.get("hold")
    held = hold is True or reason.upper() in _HOLD_REASONS
    held = held or bool({"REQUEUE_HOLD", "SPECIAL_EXIT"} & (flags | {base}))
    return SlurmJob(
        job_id=str(raw.get("job_id")),
        state=base,
        flags=flags,
        name=_text(raw.get("name")),
        comment=comment if isinstance(comment, str) and comment else None,
        cpus=number(raw.get("cpus")) or 0,
        exit_code=decode_exit_code(raw.get("exit_code")),
        submit_time=_epoch(raw.get("submit_time")),
        start_time=_epoch(raw.get("start_time")),
        end_time=_epoch(raw.get("end_time")),
        time_limit_s=_minutes(raw.get("time_limit")),
        user=_text(raw.get("user_name")) or None,
        reason="" if reason == "None" else reason,
        description=_text(raw.get("state_description")),
        restarts=number(raw.get("restart_cnt")) or 0,
        nodes=_text(raw.get("nodes")) or _text(raw.get("batch_host")),
        held=held,
        workdir=_text(raw.get("current_working_directory")),
        stdout=_text(raw.get("stdout_expanded")) or _text(raw.get("standard_output")),
        stderr=_text(raw.get("stderr_expanded")) or _text(raw.get("standard_error")),
        raw=raw,
    )


def _minutes(value: Any) -> float | None:
    """A time limit in minutes (bare or ``{set, infinite, number}``) as seconds; unset,
    infinite and 0 are None."""
    found = number(value)
    return float(found * 60) if found and found > 0 else None


def _base_state(value: Any) -> str:
    # v0.0.40+: ["PENDING", "REQUEUED"], the base state first; v0.0.38: "PENDING".
    if isinstance(value, list):
        return str(value[0]).upper() if value else ""
    return str(value or "").upper()


def decode_exit_code(value: Any) -> int | None:
    """``exit_code`` -> the shell's view: the exit status, or 128 + signal. v0.0.38
    gives the raw wait(2) status (``exit 3`` reports 768); newer versions an object."""
    if isinstance(value, dict):
        if "SIGNALED" in words(value.get("status")):
            signal = value.get("signal")
            signal_no = number(signal.get("id")) if isinstance(signal, dict) else None
            if signal_no:
                return 128 + signal_no
        return number(value.get("return_code"))
    status = number(value)
    if status is None:
        return None
    if status & 0x7F:
        return 128 + (status & 0x7F)
    return (status >> 8) & 0xFF


# --------------------------------------------------------------------------- ping


def responding(body: Json) -> bool:
    """Whether any controller in a ``/ping`` answer responds, in every version's words."""
    for ping in dicts(body, "pings"):
        if ping.get("responding") is True:
            return True
        said = ping.get("pinged", ping.get("ping"))
        if isinstance(said, str) and said.upper() == "UP":
            return True
    return False


# --------------------------------------------------------------------------- nodes


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
        "INVALID_REG",
        "MAINTENANCE",
        "RESERVED",
    }
)


@dataclass(frozen=True)
class SlurmNode:
    name: str
    cpus: int
    idle_cpus: int
    usable: bool
    partitions: frozenset[str]
    memory_mib: int | None
    gpus: int


def read_node(raw: Json) -> SlurmNode:
    state = words(raw.get("state")) | words(raw.get("state_flags"))
    cpus = number(raw.get("cpus")) or 0
    if "idle_cpus" in raw:
        idle = number(raw.get("idle_cpus")) or 0
    else:
        idle = max(0, cpus - (number(raw.get("alloc_cpus")) or 0))
    partitions = raw.get("partitions")
    return SlurmNode(
        name=_text(raw.get("name")),
        cpus=cpus,
        idle_cpus=idle,
        usable=not state & _UNUSABLE_NODE_STATES,
        partitions=frozenset(str(p) for p in partitions)
        if isinstance(partitions, list)
        else frozenset(),
        memory_mib=number(raw.get("real_memory")),
        gpus=_gpu_count(raw),
    )


def _gpu_count(raw: Json) -> int:
    """GPUs of a node, from ``gres`` (``gpu:2``, ``gpu:a100:4(S:0-1)``) or its TRES."""
    for text, pattern in ((raw.get("gres"), _GRES_GPU), (raw.get("tres"), _TRES_GPU)):
        if isinstance(text, str) and text:
            found = pattern.findall(text)
            if found:
                return sum(int(count) for count in found)
    return 0


# --------------------------------------------------------------------------- partitions


@dataclass(frozen=True)
class SlurmPartition:
    name: str
    max_time_s: int | None  # None: unlimited
    usable: bool


def read_partition(raw: Json) -> SlurmPartition:
    maximums = raw.get("maximums")
    if isinstance(maximums, dict):  # v0.0.40+
        limit: Any = maximums.get("time")
    else:
        limit = raw.get("max_time_limit")  # v0.0.38: minutes, INFINITE as 2**32 - 1
    minutes = None if is_infinite(limit) else number(limit)
    if minutes is not None and minutes < 0:  # v0.0.38 says -1 for UNLIMITED
        minutes = None
    state = raw.get("partition")
    state_words = words(state.get("state")) if isinstance(state, dict) else words(raw.get("state"))
    return SlurmPartition(
        name=_text(raw.get("name")),
        max_time_s=None if minutes is None else minutes * 60,
        usable=not state_words or bool(state_words & {"UP"}),
    )


def refusals(
    processors: int,
    resources: JobResources,
    partition: str,
    partitions: Iterable[SlurmPartition],
    nodes: Iterable[SlurmNode],
) -> list[str]:
    """Why no node of ``partition`` could ever run the job (empty: some node could). Each
    reason names the request's field: Slurm 26.05 accepts such a job and lets it pend for
    ever, 24.11 refuses it, so gridcore refuses it itself before submitting. Several
    partitions (``"short,long"``, as sbatch takes them): refused only if none could."""
    known = {p.name: p for p in partitions}
    names = [name.strip() for name in partition.split(",") if name.strip()]
    nodes = tuple(nodes)
    every: list[str] = []
    for name in names or [partition]:
        found = known.get(name)
        if found is None:
            listed = ", ".join(sorted(known)) or "none"
            reasons = [f"partition: {name!r} is not a partition of this cluster (it has: {listed})"]
        else:
            reasons = _partition_refusals(processors, resources, found, nodes)
        if not reasons:
            return []
        every.extend(reasons)
    return every


def _partition_refusals(
    processors: int, resources: JobResources, found: SlurmPartition, nodes: Iterable[SlurmNode]
) -> list[str]:
    partition = found.name
    reasons = []
    limit, most = resources.time_limit_s, found.max_time_s
    if limit is not None and most is not None and limit > most:
        reasons.append(
            f"time_limit: {_duration(limit)} exceeds partition "
            f"{partition}'s MaxTime of {_duration(most)}"
        )
    members = [n for n in nodes if partition in n.partitions]
    reasons.extend(_node_refusals(processors, resources, partition, members))
    if not reasons and not any(_fits(processors, resources, n) for n in members):
        reasons.append(
            f"processors, gpus, memory: no single node of partition {partition} has "
            f"{processors} CPUs{_and_more(processors, resources)} together (a job runs on one node)"
        )
    return reasons


def _fits(processors: int, res: JobResources, node: SlurmNode) -> bool:
    memory = res.memory_mib or 0
    if res.memory_per is MemoryScope.CPU:
        memory *= processors
    enough_memory = not memory or node.memory_mib is None or node.memory_mib >= memory
    return node.cpus >= processors and node.gpus >= (res.gpus or 0) and enough_memory


def _and_more(processors: int, res: JobResources) -> str:
    memory = (res.memory_mib or 0) * (processors if res.memory_per is MemoryScope.CPU else 1)
    gpus = f", {res.gpus} GPUs" if res.gpus else ""
    return gpus + (f", {memory} MiB" if memory else "")


def _node_refusals(
    processors: int, res: JobResources, partition: str, members: list[SlurmNode]
) -> list[str]:
    if not members:
        return [f"partition: {partition!r} has no nodes"]
    reasons = []
    most_cpus = max(n.cpus for n in members)
    if processors > most_cpus:
        reasons.append(
            f"processors: {processors} exceeds the largest node of partition {partition} "
            f"({most_cpus} CPUs; a job runs on one node)"
        )
    most_gpus = max(n.gpus for n in members)
    if (res.gpus or 0) > most_gpus:
        reasons.append(
            f"gpus: {res.gpus} exceeds the most GPUs of a node of partition {partition} "
            f"({most_gpus})"
        )
    memories = [n.memory_mib for n in members if n.memory_mib]
    if res.memory_mib is not None and memories:
        needed = res.memory_mib * (processors if res.memory_per is MemoryScope.CPU else 1)
        if needed > max(memories):
            field = "memory_per_cpu" if res.memory_per is MemoryScope.CPU else "memory"
            reasons.append(
                f"{field}: {needed} MiB per node exceeds the largest node of partition "
                f"{partition} ({max(memories)} MiB)"
            )
    return reasons


def _duration(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


# --------------------------------------------------------------------------- errors


def errors(body: Json) -> list[Json]:
    """``errors[]`` and, from v0.0.42 on a delete, the failed entries of ``status[]``."""
    out: list[Json] = []
    for key in ("errors", "status"):
        raw = body.get(key)
        if not isinstance(raw, list):
            continue
        for item in raw:
            # Some releases put bare strings in errors[]; treat them as the error text.
            entry = item if isinstance(item, dict) else {"error": str(item)}
            if key == "status" and not error_number(entry):
                continue  # a signal that was delivered
            out.append(entry)
    return out


def warnings(body: Json) -> list[str]:
    out = []
    for item in body.get("warnings") or ():
        if isinstance(item, dict):
            text = _text(item.get("description")) or _text(item.get("warning"))
            if text:
                out.append(text)
        elif isinstance(item, str):
            out.append(item)
    return out


def error_number(error: Json) -> int | None:
    for key in ("error_number", "error_code", "errno"):
        found = number(error.get(key))
        if found is not None:
            return found
    return None


def error_text(error: Json) -> str:
    text = _text(error.get("error")).strip()
    detail = _text(error.get("description")).strip()
    if text and detail and detail != text:
        return f"{text}: {detail}"
    return text or detail or f"error {error_number(error)}"


# --------------------------------------------------------------------------- accounting


def serves_accounting(openapi: Json, version: str) -> bool:
    """Whether a server's ``GET /openapi/v3`` lists slurmdbd's API at ``version``
    (slurmrestd started with ``-s openapi/slurmdbd``, or ``dbv0.0.38`` on 22.05)."""
    paths = openapi.get("paths")
    prefix = f"/slurmdb/{version}/"
    return isinstance(paths, dict) and any(str(p).startswith(prefix) for p in paths)


@dataclass(frozen=True)
class AccountedJob:
    """One job as slurmdbd keeps it (``/slurmdb/vX/job/{id}``), after slurmctld forgot it."""

    job_id: str
    key: str | None
    state: str
    exit_code: int | None
    submit_time: float | None
    start_time: float | None
    end_time: float | None
    reason: str
    usage: JobUsage | None


def read_accounted_job(raw: Json) -> AccountedJob:
    state, times = _obj(raw.get("state")), _obj(raw.get("time"))
    comment = raw.get("comment")
    # the submission's comment is comment.job in slurmdbd's records (a string in /jobs)
    key = comment.get("job") if isinstance(comment, dict) else comment
    return AccountedJob(
        job_id=str(raw.get("job_id")),
        key=key if isinstance(key, str) and key else None,
        state=_base_state(state.get("current")),
        exit_code=decode_exit_code(raw.get("exit_code")),
        submit_time=_epoch(times.get("submission")),
        start_time=_epoch(times.get("start")),
        end_time=_epoch(times.get("end")),
        reason=_text(state.get("reason")),
        usage=_usage(raw, times),
    )


def _usage(raw: Json, times: Json) -> JobUsage | None:
    """Elapsed, CPU time (user + system, as ``seff``), CPUs and max RSS of a job that ran."""
    elapsed = number(times.get("elapsed"))
    if not elapsed:
        return None
    return JobUsage(
        elapsed_s=float(elapsed),
        cpu_time_s=_seconds(times.get("total")) or _steps_cpu_time(raw),
        cpus=_allocated_cpus(raw),
        max_rss_bytes=_max_rss(raw),
    )


def _steps_cpu_time(raw: Json) -> float:
    """The CPU time of the job's steps added up, as sacct does: slurmdbd's record of the
    job itself keeps ``time.total`` at 0 (seen on 26.05, v0.0.45)."""
    return sum(_seconds(_obj(step.get("time")).get("total")) for step in dicts(raw, "steps"))


def _obj(value: Any) -> Json:
    return value if isinstance(value, dict) else {}


def _seconds(value: Any) -> float:
    if not isinstance(value, dict):
        return 0.0
    return (number(value.get("seconds")) or 0) + (number(value.get("microseconds")) or 0) / 1e6


def _allocated_cpus(raw: Json) -> int:
    required = raw.get("required")
    cpus = number(required.get("CPUs")) if isinstance(required, dict) else None
    if cpus:
        return cpus
    tres = raw.get("tres")
    allocated = tres.get("allocated") if isinstance(tres, dict) else None
    for item in allocated if isinstance(allocated, list) else ():
        if isinstance(item, dict) and item.get("type") == "cpu":
            return number(item.get("count")) or 0
    return 0


def _max_rss(raw: Json) -> int | None:
    """The largest ``mem`` of any step's ``tres.requested.max`` (sacct's MaxRSS, bytes)."""
    peaks = []
    for step in dicts(raw, "steps"):
        tres = step.get("tres")
        requested = tres.get("requested") if isinstance(tres, dict) else None
        peak = requested.get("max") if isinstance(requested, dict) else None
        for item in peak if isinstance(peak, list) else ():
            if isinstance(item, dict) and item.get("type") == "mem":
                found = number(item.get("count"))
                if found is not None:
                    peaks.append(found)
    return max(peaks) if peaks else None
