"""The Standard Workload Format (SWF 2.2) of the Parallel Workloads Archive: one job per
line, 18 whitespace-separated numeric fields, -1 where the log does not know the value,
and ``;`` comment lines whose ``; Key: value`` lines before the first job are the header
(Feitelson, Tsafrir and Krakov, JPDC 2014, Sec. 2 and the Archive's format page).

:func:`iter_jobs` streams: it reads one line at a time (``.swf`` or gzipped, told by the
file's first bytes) and keeps only the previous submit time, so a log of any length is
read in bounded memory. Every malformed line is refused with :class:`SwfError` naming the
file, the line and the field; nothing is guessed.
"""

from __future__ import annotations

import enum
import gzip
import math
import os
import re
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import IO

from gridcore.errors import ConfigError

FIELD_COUNT = 18
UNKNOWN = -1
_GZIP_MAGIC = b"\x1f\x8b"


class SwfError(ConfigError):
    """A workload log is unreadable or malformed. The message reads
    ``FILE:LINE: field N (name): what is wrong`` (without the field part when the whole
    line or file is at fault)."""


class SwfStatus(enum.IntEnum):
    """Field 11. The partial codes are for jobs checkpointed or swapped out and resumed:
    each part is a line, the last part's line says how the job ended."""

    UNKNOWN = -1
    FAILED = 0
    COMPLETED = 1
    PARTIAL = 2
    LAST_PARTIAL_COMPLETED = 3
    LAST_PARTIAL_FAILED = 4
    CANCELLED = 5


@dataclass(frozen=True, slots=True)
class SwfJob:
    """One data line; ``None`` where the log has -1 (unknown). Times are seconds, the
    submit time from the log's start (its header's UnixStartTime)."""

    number: int
    submit_s: float
    wait_s: float | None
    run_s: float | None
    processors: int | None
    cpu_s: float | None
    memory_kb: float | None
    requested_processors: int | None
    requested_s: float | None
    requested_memory_kb: float | None
    status: SwfStatus
    user: int | None
    group: int | None
    executable: int | None
    queue: int | None
    partition: int | None
    preceding_job: int | None
    think_s: float | None
    line: int

    @property
    def size(self) -> int | None:
        """Processors the job held: the allocated count, else the requested one. A count
        of 0 (logs write it for jobs cancelled before they started) is no size."""
        if self.processors:
            return self.processors
        return self.requested_processors or None

    @property
    def is_part(self) -> bool:
        """A line of one part of a checkpointed or swapped job (status 2, 3 or 4): the
        job's own line carries the whole job, so a replay that also took its parts
        would run it twice. Every replay of a log skips these lines (and counts them)."""
        return self.status in _PART_STATUSES

    @property
    def start_s(self) -> float | None:
        return None if self.wait_s is None else self.submit_s + self.wait_s

    @property
    def end_s(self) -> float | None:
        start = self.start_s
        return None if start is None or self.run_s is None else start + self.run_s


_PART_STATUSES = frozenset(
    {SwfStatus.PARTIAL, SwfStatus.LAST_PARTIAL_COMPLETED, SwfStatus.LAST_PARTIAL_FAILED}
)


@dataclass(frozen=True)
class SwfHeader:
    """The ``; Key: value`` lines before the first job. A key given again, and the
    indented ``;`` lines that continue a value, are joined to it with newlines."""

    path: str
    fields: Mapping[str, str]
    max_procs: int | None
    unix_start_time: int | None
    partitions: int | None


# (name in messages, integer field): the 18 fields in order; -1 is unknown in each (but
# _parse refuses it for the job number and the submit time).
_FIELDS: tuple[tuple[str, bool], ...] = (
    ("job number", True),
    ("submit time", False),
    ("wait time", False),
    ("run time", False),
    ("allocated processors", True),
    ("average CPU time", False),
    ("used memory", False),
    ("requested processors", True),
    ("requested time", False),
    ("requested memory", False),
    ("status", True),
    ("user id", True),
    ("group id", True),
    ("executable number", True),
    ("queue number", True),
    ("partition number", True),
    ("preceding job number", True),
    ("think time", False),
)
FIELD_NAMES: tuple[str, ...] = tuple(name for name, _ in _FIELDS)
_STATUS_FIELD = 10  # 0-based index of field 11
_STATUSES: dict[int | float, SwfStatus] = {int(status): status for status in SwfStatus}
# "; Key: value" with at most one blank after ';'; deeper-indented lines continue a value
# (the Archive's "; Information: http://..." is followed by ";              http://...").
_HEADER_KEY = re.compile(r";[ \t]?([A-Za-z][A-Za-z0-9_]*):[ \t]*(.*)")
_LEADING_INT = re.compile(r"\s*(-?\d+)")


def read_header(path: str | os.PathLike[str]) -> SwfHeader:
    """The header: the ``;`` lines before the first job line (blank lines are skipped)."""
    name = os.fspath(path)
    fields: dict[str, list[str]] = {}
    current: list[str] | None = None
    with _lines(name) as numbered:
        for _, text in numbered:
            stripped = text.strip()
            if not stripped:
                continue
            if not stripped.startswith(";"):
                break
            current = _header_line(text.rstrip("\r\n"), fields, current)
    joined = {key: "\n".join(values) for key, values in fields.items()}
    return SwfHeader(
        path=name,
        fields=MappingProxyType(joined),
        max_procs=_leading_int(joined.get("MaxProcs")) or _leading_int(joined.get("MaxNodes")),
        unix_start_time=_leading_int(joined.get("UnixStartTime")),
        partitions=_leading_int(joined.get("MaxPartitions")),
    )


def skip_reason(job: SwfJob) -> str | None:
    """Why a replay of the log's waits leaves ``job`` out (a ``skipped`` key of the
    experiments' JSON), or ``None`` when it can replay it: a part of a job (status 2-4),
    an unknown wait, run time or size (a size of 0 is none)."""
    if job.is_part:
        return "part_line"
    if job.wait_s is None:
        return "unknown_wait"
    if job.run_s is None:
        return "unknown_run_time"
    size = job.size
    if size is None or size <= 0:
        return "unknown_size"
    return None


class JobLabels:
    """A name for each job of one log that no other job of it has: its number (field 1),
    or ``NUMBER@LINE`` when an earlier job had that number. The parts of a checkpointed
    or swapped job (status 2, then 3 or 4) are one line each under the job's number, and
    some logs repeat numbers; a replay that names its jobs by number alone would take
    two parts for one job."""

    def __init__(self) -> None:
        self._seen: set[int] = set()

    def __call__(self, job: SwfJob) -> str:
        if job.number in self._seen:
            return f"{job.number}@{job.line}"
        self._seen.add(job.number)
        return str(job.number)


def iter_jobs(path: str | os.PathLike[str], *, partition: int | None = None) -> Iterator[SwfJob]:
    """The jobs of the log in file order, one line at a time; ``partition`` keeps only
    that partition's jobs (field 16, the cluster of a multi-cluster log), though every
    line is still checked. ``;`` lines and blank lines anywhere are skipped. A log without
    a single job line is refused."""
    name = os.fspath(path)
    previous_submit = -math.inf
    seen = False
    with _lines(name) as numbered:
        for number, text in numbered:
            words = text.split()
            if not words or words[0].startswith(";"):
                continue
            job = _parse(words, name, number)
            if job.submit_s < previous_submit:
                raise SwfError(
                    f"{name}:{number}: field 2 (submit time): {words[1]} is earlier than the"
                    f" previous job's {_number_text(previous_submit)} (SWF lists jobs by"
                    " submit time)"
                )
            previous_submit = job.submit_s
            seen = True
            if partition is None or job.partition == partition:
                yield job
    if not seen:
        raise SwfError(f"{name}: no job lines (an SWF log has one line of 18 fields per job)")


@contextmanager
def _lines(name: str) -> Iterator[Iterator[tuple[int, str]]]:
    """The file's lines numbered from 1, gunzipped when it starts with gzip's magic bytes;
    an unreadable file, or a gzip stream cut short or corrupt, is an SwfError naming the
    line reached."""
    try:
        stream = _open_text(name)
    except OSError as exc:
        raise SwfError(f"{name}: cannot read the log: {exc.strerror or exc}") from exc
    reached = [0]

    def numbered() -> Iterator[tuple[int, str]]:
        for number, text in enumerate(stream, 1):
            reached[0] = number
            yield number, text

    with stream:
        try:
            yield numbered()
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise SwfError(
                f"{name}:{reached[0] + 1}: the gzip stream is cut short or corrupt after line"
                f" {reached[0]} ({exc})"
            ) from exc
        except OSError as exc:
            raise SwfError(f"{name}:{reached[0] + 1}: cannot read the log: {exc}") from exc


def _open_text(name: str) -> IO[str]:
    """Text lines of the file, through gzip when its first two bytes are gzip's magic
    (whatever the file is called); bytes that are not UTF-8 (names in a header) are
    replaced rather than refused: a job line is numbers only and fails on its own."""
    with open(name, "rb") as probe:
        gzipped = probe.read(2) == _GZIP_MAGIC
    if gzipped:
        return gzip.open(name, "rt", encoding="utf-8", errors="replace")
    return open(name, encoding="utf-8", errors="replace")


def _header_line(
    text: str, fields: dict[str, list[str]], current: list[str] | None
) -> list[str] | None:
    """Add one ``;`` line to ``fields``; return the value list a continuation extends."""
    match = _HEADER_KEY.fullmatch(text)
    if match:
        values = fields.setdefault(match.group(1), [])
        values.append(match.group(2).rstrip())
        return values
    rest = text[1:].strip()
    if not rest:
        return None  # a bare ';' ends the value it followed
    if current is not None:
        current.append(rest)
    return current


def _leading_int(value: str | None) -> int | None:
    """The first integer of a header value ("338 (batch partition; 512 total)" -> 338)."""
    match = _LEADING_INT.match(value or "")
    return int(match.group(1)) if match else None


def _parse(words: list[str], name: str, line: int) -> SwfJob:
    if len(words) != FIELD_COUNT:
        raise SwfError(
            f"{name}:{line}: {len(words)} fields, SWF has {FIELD_COUNT} per job line"
            f" ({' '.join(words[: FIELD_COUNT + 2])})"
        )
    values: list[int | float | None] = [
        _value(word, index, name, line) for index, word in enumerate(words)
    ]
    if values[0] is None or values[1] is None:
        index = 0 if values[0] is None else 1
        raise SwfError(
            f"{name}:{line}: field {index + 1} ({FIELD_NAMES[index]}): -1 (unknown), but"
            " SWF's job number and submit time are always known"
        )
    status = values[_STATUS_FIELD]
    values[_STATUS_FIELD] = _STATUSES.get(UNKNOWN if status is None else status)
    if values[_STATUS_FIELD] is None:
        raise SwfError(
            f"{name}:{line}: field 11 (status): {words[_STATUS_FIELD]} is not an SWF status"
            " (-1 unknown, 0 failed, 1 completed, 2-4 partial, 5 cancelled)"
        )
    return SwfJob(*values, line)  # type: ignore[arg-type, call-arg]


def _value(word: str, index: int, name: str, line: int) -> int | float | None:
    """One field: an int or float, None for -1; anything else negative is refused."""
    label, integer = _FIELDS[index]
    try:
        value: int | float = int(word) if integer else float(word)
    except ValueError:
        value = _integral(word, integer, f"{name}:{line}: field {index + 1} ({label})")
    if value >= 0 and math.isfinite(value):
        return value
    if value == UNKNOWN:
        return None
    what = "not a finite number" if not math.isfinite(value) else "negative (only -1, unknown)"
    raise SwfError(f"{name}:{line}: field {index + 1} ({label}): {word} is {what}")


def _integral(word: str, integer: bool, where: str) -> int | float:
    """A number written some other way: an integer field takes "4.00" (some logs write
    counts so) but not "4.5"; anything not a number is refused."""
    try:
        number = float(word)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise SwfError(f"{where}: {word!r} is not {kind}") from None
    if integer and math.isfinite(number):
        if not number.is_integer():
            raise SwfError(f"{where}: {word} is not an integer")
        return int(number)
    return number


def _number_text(value: float) -> str:
    return str(int(value)) if value.is_integer() else str(value)
