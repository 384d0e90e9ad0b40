"""A workload log at a glance (``gridcore trace info``): its machine, job count, span,
partitions and what it does not know, counted in one streaming pass over the jobs."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gridcore.workloads.swf import SwfHeader, SwfJob, iter_jobs, read_header

# The fields of SwfJob a log may leave unknown (-1), in SWF's order.
OPTIONAL_FIELDS = (
    "wait_s",
    "run_s",
    "processors",
    "cpu_s",
    "memory_kb",
    "requested_processors",
    "requested_s",
    "requested_memory_kb",
    "user",
    "group",
    "executable",
    "queue",
    "partition",
    "preceding_job",
    "think_s",
)


@dataclass
class LogSummary:
    """Counts over a log's jobs; ``add`` one job at a time, nothing else is kept."""

    header: SwfHeader
    jobs: int = 0
    first_submit_s: float | None = None
    last_submit_s: float | None = None
    size_unknown: int = 0
    partitions: Counter[int] = field(default_factory=Counter)
    unknown: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)

    def add(self, job: SwfJob) -> None:
        self.jobs += 1
        if self.first_submit_s is None:
            self.first_submit_s = job.submit_s
        self.last_submit_s = job.submit_s
        self.size_unknown += job.size is None
        if job.partition is not None:
            self.partitions[job.partition] += 1
        self.statuses[job.status.name] += 1
        for name in OPTIONAL_FIELDS:
            if getattr(job, name) is None:
                self.unknown[name] += 1

    @property
    def span_s(self) -> float:
        """From the first submission to the last."""
        if self.first_submit_s is None or self.last_submit_s is None:
            return 0.0
        return self.last_submit_s - self.first_submit_s

    def to_json(self) -> dict[str, Any]:
        start = self.header.unix_start_time
        return {
            "path": self.header.path,
            "computer": self.header.fields.get("Computer"),
            "installation": self.header.fields.get("Installation"),
            "max_procs": self.header.max_procs,
            "max_partitions": self.header.partitions,
            "unix_start_time": start,
            "jobs": self.jobs,
            "first_submit_s": self.first_submit_s,
            "last_submit_s": self.last_submit_s,
            "span_s": self.span_s,
            "first_submit_utc": _utc(start, self.first_submit_s),
            "last_submit_utc": _utc(start, self.last_submit_s),
            "partitions": {str(p): n for p, n in sorted(self.partitions.items())},
            "size_unknown": self.size_unknown,
            "unknown": {name: self.unknown[name] for name in OPTIONAL_FIELDS},
            "statuses": dict(sorted(self.statuses.items())),
        }


def summarize_log(path: str | os.PathLike[str]) -> LogSummary:
    """Read the whole log once (an SwfError on the first malformed line)."""
    summary = LogSummary(read_header(path))
    for job in iter_jobs(path):
        summary.add(job)
    return summary


def describe(summary: LogSummary) -> str:
    """The summary as lines a person reads."""
    data = summary.to_json()
    machine = ", ".join(str(data[k]) for k in ("computer", "installation") if data[k])
    when = ""
    if data["first_submit_utc"]:
        when = f", {data['first_submit_utc']} to {data['last_submit_utc']}"
    partitions = ", ".join(f"{p}: {n} jobs" for p, n in data["partitions"].items())
    unknown = ", ".join(f"{k} {n}" for k, n in data["unknown"].items() if n)
    return "\n".join(
        [
            f"log         {data['path']}",
            f"machine     {machine or 'not named in the header'}",
            f"max procs   {data['max_procs'] if data['max_procs'] is not None else 'unknown'}",
            f"jobs        {data['jobs']} ({data['size_unknown']} of unknown size)",
            f"span        {data['span_s']:.0f} s ({data['span_s'] / 86400:.1f} days){when}",
            f"partitions  {partitions or 'none given (field 16 is -1)'}",
            f"unknown     {unknown or 'nothing'}",
            "statuses    " + ", ".join(f"{k} {n}" for k, n in data["statuses"].items()),
        ]
    )


def _utc(unix_start: int | None, offset_s: float | None) -> str | None:
    if unix_start is None or offset_s is None:
        return None
    return datetime.fromtimestamp(unix_start + offset_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
