"""A job's own output (its stdout and stderr files), followed while it runs, for a log.

One mechanism for every operator that waits on site jobs (a site job's trigger, the
co-allocation and co-reservation triggers, the data-plan runner): :class:`JobOutputs`
follows the jobs it is shown, one :class:`OutputFollower` per job, and returns the new
complete lines of each since the last read, prefixed by the job's label and the stream
(``[component 1 @ beta] [stderr] ...``); the caller logs them. :func:`stderr_tail` gives
the end of a failed job's stderr.

Where the files are is the site adapter's answer (``output_files(job_id)``):

* local sites (:class:`~gridcore.sites.local.LocalSite`): ``stdout.txt`` and
  ``stderr.txt`` in the job's directory, on this machine;
* Slurm (:class:`~gridcore.sites.slurm.SlurmSite`): the paths the job was submitted with
  (``<workdir>/<name>-<id>.out`` and ``.err``), as slurmrestd reports them. They are
  paths on the cluster: read directly where this machine shares the cluster's file
  system (the test grid on localhost; an Airflow worker or triggerer on a login node),
  or over SFTP (fsspec, as staging reads sites) when the site's ``storage_dir`` is an
  ``sftp://user@host:port/path`` URL, with the usual SSH credentials (agent,
  ``~/.ssh``). Elsewhere the reads fail, and the log says so once per job instead of
  showing output; the job itself is not affected.

Bounds (:class:`OutputLimits`): each read takes at most ``poll_bytes`` of each stream
(a job writing faster is shown with a lag, and the rest once it has ended); at most
``total_bytes`` of each stream are shown per job, then one marker
``[gridcore] output cut: N more bytes in <path>`` (and, once the job has ended, how many
bytes were not shown in all); a line longer than ``line_bytes`` is shown in pieces.
Bytes that are not UTF-8 are shown as U+FFFD; a file that does not exist (yet) is empty.

Restarts: the offsets live in the follower, in memory. A triggerer that restarts
rebuilds its triggers from their serialized arguments, so a restarted trigger reads the
files from their start again: lines shown before the restart are shown again (within
the same bounds), in the new triggerer's own log file. A local job queued again after
its worker died rewrites its files: the follower notices a file shorter than what it
has read and reads it from its start, saying so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fsspec.core import url_to_fs

from gridcore.errors import GridError

KIB = 1024
STREAMS = ("stdout", "stderr")
MARK = "[gridcore]"


@dataclass(frozen=True)
class OutputFiles:
    """Where a job's stdout and stderr go: paths on this machine or fsspec URLs. The
    same location twice means one file holds both streams."""

    stdout: str
    stderr: str

    def as_json(self) -> dict[str, str]:
        return {"stdout": self.stdout, "stderr": self.stderr}

    @classmethod
    def from_json(cls, data: Any) -> OutputFiles | None:
        """The files named in an event or a result; None if ``data`` names none."""
        if not isinstance(data, Mapping):
            return None
        stdout, stderr = data.get("stdout"), data.get("stderr")
        if not isinstance(stdout, str) or not isinstance(stderr, str):
            return None
        return cls(stdout, stderr)


@dataclass(frozen=True)
class OutputLimits:
    """How much of a job's output goes into a log (bytes per stream)."""

    poll_bytes: int = 64 * KIB  # read at most this much per read
    total_bytes: int = 256 * KIB  # show at most this much per job
    line_bytes: int = 8 * KIB  # a longer line is shown in pieces
    tail_bytes: int = 16 * KIB  # a failed job's stderr tail: at most this much ...
    tail_lines: int = 50  # ... and this many lines

    def __post_init__(self) -> None:
        for name in ("poll_bytes", "total_bytes", "line_bytes", "tail_bytes", "tail_lines"):
            if getattr(self, name) < 1:
                raise ValueError(f"OutputLimits.{name} must be >= 1")


DEFAULT_LIMITS = OutputLimits()


@dataclass(frozen=True)
class SiteJob:
    """A site job whose output to follow. ``label`` prefixes its lines (empty for the
    one job of a task); ``finished``: it writes nothing more, so a last line without
    newline is shown and what is left is read; ``failed``: its stderr tail matters."""

    site: str
    job_id: str
    label: str = ""
    finished: bool = False
    failed: bool = False


FilesOf = Callable[[str, str], OutputFiles]
"""(site, job id) -> the job's files: ``GridRuntime.output_files``."""


class JobOutputs:
    """Followers of several site jobs' output, made as the jobs appear. Not
    thread-safe: one reader (a trigger's poll, a runner's wait) at a time."""

    def __init__(self, files_of: FilesOf, limits: OutputLimits = DEFAULT_LIMITS) -> None:
        self.files_of = files_of
        self.limits = limits
        self._followers: dict[tuple[str, str], OutputFollower] = {}
        self._jobs: dict[tuple[str, str], SiteJob] = {}
        self._unreadable: set[tuple[str, str]] = set()

    def read(self, jobs: Iterable[SiteJob]) -> list[str]:
        """The new lines of every job in ``jobs`` (in that order), ready to log. A job
        whose files cannot be found or read is named once in a ``[gridcore]`` line and
        tried again at the next read."""
        lines: list[str] = []
        for job in jobs:
            key = (job.site, job.job_id)
            self._jobs[key] = job
            try:
                follower = self._followers.get(key)
                if follower is None:
                    follower = OutputFollower(
                        self.files_of(job.site, job.job_id), _prefix(job.label), self.limits
                    )
                    self._followers[key] = follower
                lines += follower.read(final=job.finished)
            except (GridError, OSError) as exc:
                if key not in self._unreadable:
                    self._unreadable.add(key)
                    where = f"job {job.job_id} at site {job.site}"
                    lines.append(
                        f"{_prefix(job.label)}{MARK} cannot read the output of {where}: {exc}"
                    )
        return lines

    def as_json(self) -> list[dict[str, Any]]:
        """Per job followed so far: ``site``, ``job_id``, ``label``, ``failed``,
        ``stdout``, ``stderr`` (the files) and ``shown`` (bytes shown per stream)."""
        entries = []
        for key, follower in self._followers.items():
            job = self._jobs[key]
            entries.append(
                {
                    "site": job.site,
                    "job_id": job.job_id,
                    "label": job.label,
                    "failed": job.failed,
                    **follower.files.as_json(),
                    "shown": follower.shown(),
                }
            )
        return entries


def failure_tails(
    entries: Sequence[Mapping[str, Any]], limits: OutputLimits = DEFAULT_LIMITS
) -> list[str]:
    """The stderr tails to log when a wait ended in failure, from :meth:`JobOutputs.as_json`
    entries (carried in an event): of the jobs marked failed, or of every job if none is."""
    failed = [e for e in entries if e.get("failed")] or list(entries)
    lines: list[str] = []
    for entry in failed:
        files = OutputFiles.from_json(entry)
        if files is None:
            continue
        prefix = _prefix(str(entry.get("label") or ""))
        try:
            lines += [f"{prefix}{line}" for line in stderr_tail(files, limits)]
        except OSError as exc:
            lines.append(f"{prefix}{MARK} cannot read the stderr of the job: {exc}")
    return lines


def stderr_tail(files: OutputFiles, limits: OutputLimits = DEFAULT_LIMITS) -> list[str]:
    """The end of the job's stderr (at most ``tail_lines`` lines of its last
    ``tail_bytes``), after a ``[gridcore]`` line naming the file; one line saying so if
    the file is missing or empty."""
    location = files.stderr
    found = _read_end(location, limits.tail_bytes)
    if found is None or found[1] == 0:
        state = "does not exist" if found is None else "is empty"
        return [f"{MARK} stderr of the job: {location} {state}"]
    data, size = found
    if len(data) < size:  # started mid-file: drop the partial first line
        data = data[data.find(b"\n") + 1 :] if b"\n" in data else data
    texts = [_text(line) for line in data.split(b"\n")]
    if texts and texts[-1] == "":
        texts.pop()  # the final newline ends the last line; it does not start one
    shown = texts[-limits.tail_lines :]
    whole = len(shown) == len(texts) and len(data) == size
    what = "whole" if whole else f"last {len(shown)} lines"
    stream = "stderr" if files.stderr != files.stdout else "output"
    header = f"{MARK} {stream} of the job ({what}, {size} bytes in {location}):"
    return [header, *(f"[{stream}] {text}" for text in shown)]


class OutputFollower:
    """Follows one job's stdout and stderr (one stream if both go to one file)."""

    def __init__(
        self, files: OutputFiles, prefix: str = "", limits: OutputLimits = DEFAULT_LIMITS
    ) -> None:
        self.files = files
        self.prefix = prefix
        self.limits = limits
        names = ("stdout",) if files.stderr == files.stdout else STREAMS
        self._cursors = {name: _Cursor(name, getattr(files, name), limits) for name in names}

    def read(self, *, final: bool = False) -> list[str]:
        """The new lines of each stream since the last read, prefixed. ``final``: the
        job has ended, so its last line needs no newline and everything up to the
        total bound is read now."""
        lines: list[str] = []
        for cursor in self._cursors.values():
            try:
                lines += [f"{self.prefix}{line}" for line in cursor.read(final)]
            except OSError as exc:  # said once per stream; tried again at the next read
                if not cursor.unreadable:
                    cursor.unreadable = True
                    lines.append(f"{self.prefix}{MARK} cannot read {cursor.stream}: {exc}")
        return lines

    def shown(self) -> dict[str, int]:
        return {name: cursor.shown for name, cursor in self._cursors.items()}


class _Cursor:
    """One stream of one job: how far it was read, what of it was shown."""

    def __init__(self, stream: str, location: str, limits: OutputLimits) -> None:
        self.stream = stream
        self.location = location
        self.limits = limits
        self.offset = 0  # bytes read from the file (shown, or pending in ``partial``)
        self.partial = b""  # the start of a line whose end has not been read yet
        self.shown = 0  # bytes of the file shown (lines and their newlines)
        self.cut = False
        self.told_final = False
        self.unreadable = False

    def read(self, final: bool) -> list[str]:
        lines: list[str] = []
        while not self.cut:
            found = _read_range(self.location, self.offset, self.limits.poll_bytes)
            if found is None:
                return lines  # not created yet (or never: a job that has not started)
            data, size = found
            if size < self.offset:
                lines.append(f"{MARK} {self.stream} was written anew: reading it from its start")
                self.offset, self.partial = 0, b""
                continue
            self.offset += len(data)
            at_end = len(data) < self.limits.poll_bytes
            lines += self._lines(self.partial + data, final and at_end, size)
            if not final or at_end:
                break
        if self.cut and final and not self.told_final:
            self.told_final = True
            found = _read_range(self.location, 0, 0)
            size = found[1] if found is not None else self.offset
            lines.append(
                f"{MARK} {self.stream}: {max(0, size - self.shown)} of its {size} bytes"
                f" were not shown; all are in {self.location}"
            )
        return lines

    def _lines(self, data: bytes, last: bool, size: int) -> list[str]:
        pieces, self.partial = split_lines(data, self.limits.line_bytes, last)
        lines: list[str] = []
        for piece, consumed in pieces:
            if self.shown + consumed > self.limits.total_bytes:
                self.cut = True
                self.partial = b""
                lines.append(
                    f"{MARK} output cut: {max(0, size - self.shown)} more bytes in {self.location}"
                )
                break
            self.shown += consumed
            lines.append(f"[{self.stream}] {_text(piece)}")
        return lines


def split_lines(data: bytes, line_bytes: int, last: bool) -> tuple[list[tuple[bytes, int]], bytes]:
    """``data`` as complete lines ``(bytes without the newline, bytes consumed)`` and the
    rest (a line not ended yet). A line longer than ``line_bytes`` comes in pieces of
    that size; with ``last`` the rest is a line too (output that ends without newline)."""
    pieces: list[tuple[bytes, int]] = []
    start = 0
    while start < len(data):
        end = data.find(b"\n", start, start + line_bytes + 1)
        if end >= 0:
            pieces.append((data[start:end], end + 1 - start))
            start = end + 1
        elif len(data) - start > line_bytes:
            pieces.append((data[start : start + line_bytes], line_bytes))
            start += line_bytes
        elif last:
            pieces.append((data[start:], len(data) - start))
            start = len(data)
        else:
            break
    return pieces, data[start:]


def _text(line: bytes) -> str:
    # NUL would end the line in C-string readers of the log; CR before LF is Windows'.
    return line.removesuffix(b"\r").decode("utf-8", errors="replace").replace("\x00", "\ufffd")


def _prefix(label: str) -> str:
    return f"[{label}] " if label else ""


# -- reading a site's file ----------------------------------------------------------------

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _read_range(location: str, offset: int, max_bytes: int) -> tuple[bytes, int] | None:
    """Up to ``max_bytes`` from ``offset`` and the file's size; None if it does not exist."""
    if _SCHEME.match(location) is None:
        try:
            with open(location, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                handle.seek(offset)
                data = handle.read(max_bytes)
        except FileNotFoundError:
            return None
        return data, _size(size, offset, data)
    return _read_remote(location, offset, max_bytes)


def _read_remote(url: str, offset: int, max_bytes: int) -> tuple[bytes, int] | None:
    try:
        fs, path = url_to_fs(url)  # the instance cache keeps an SFTP connection open
        with fs.open(path, "rb") as handle:
            size = int(fs.size(path))
            handle.seek(offset)
            data = handle.read(max_bytes)
    except FileNotFoundError:
        return None
    except OSError:
        raise
    except Exception as exc:  # the boundary: paramiko's and fsspec's own errors
        raise OSError(f"{url}: {type(exc).__name__}: {exc}") from exc
    return bytes(data), _size(size, offset, data)


def _size(stat_size: int, offset: int, data: bytes) -> int:
    # The file may have grown between the stat and the read; an offset past its end
    # means it is shorter than what was read of it before (written anew).
    return max(stat_size, offset + len(data)) if data else stat_size


def _read_end(location: str, max_bytes: int) -> tuple[bytes, int] | None:
    """The last ``max_bytes`` of the file and its size; None if it does not exist."""
    found = _read_range(location, 0, 0)
    if found is None:
        return None
    size = found[1]
    start = max(0, size - max_bytes)
    tail = _read_range(location, start, max_bytes)
    if tail is None:
        return None
    return tail[0], start + len(tail[0])
