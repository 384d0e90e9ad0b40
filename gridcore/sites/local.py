"""The embedded default site: N processors on this machine, jobs as subprocesses.

Processor accounting lives in the state database (``gc_local_jobs``), not in memory, so
any number of Airflow workers and triggerers on this host share one site correctly: a
job is started only inside a transaction that holds the site lock and sees the sum of
running processors. Jobs run detached (their own session) and write their exit code to
a file, so any process can observe or cancel them, including after the one that
started them has died.

A job is never half-made: its files are written first (in a directory named by its
submission key), then its row is inserted, with its working directory, in one
transaction. A worker killed (or a write failing) before that insert leaves at most a
directory no row refers to; a row always has its files. The key is unique, so a second
submission with the same key returns the first job instead of starting another.

A job is started at most once, even when the worker starting it dies: the site marks it
running (attempt N) in one transaction, then spawns its wrapper, which runs the command
only if it can create the fence directory ``start.N`` first. A running job that has no
pid after ``SPAWN_GRACE_S`` is fenced by whoever looks next (``mkdir start.N``): if that
succeeds no wrapper of attempt N can ever run it, and the job is queued again; if it
fails the wrapper did start, and its pid is read from ``start.N/pid``.

Resources (:class:`~gridcore.model.JobResources`, already over the site's defaults):

* ``time_limit_s`` is enforced by the job's own wrapper, so it holds with nobody watching
  (as slurmd's): the wrapper that won attempt N's fence starts a watchdog beside the
  command; past the limit it marks ``start.N/timed_out``, sends SIGTERM to the job's
  process group (the wrapper, the command and its children; the group ``cancel`` kills)
  and SIGKILL :data:`KILL_GRACE_S` later, as Slurm's KillWait. The job is reported
  FAILED with "time limit of N s exceeded". A command that ends first stops the watchdog.
* ``gpus`` > 0 is refused with RequestError before anything is written: a local site
  has no GPUs (the grid file refuses them in a local site's defaults too).
* ``memory``, ``account``, ``qos``, ``partition`` and ``constraint`` are accepted and
  ignored: this machine has one pool of processors, no accounting, partitions or node
  features, and enforces no memory limit (a request written for a cluster runs on a
  laptop site unchanged).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shlex
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, and_, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from gridcore.errors import RequestError, SiteRejected, UnknownJob
from gridcore.model import (
    JobResources,
    JobState,
    JobStatus,
    JobSubmission,
    ObservedJob,
    SiteObservation,
    SiteSpec,
)
from gridcore.sites.keys import is_valid_key
from gridcore.sites.output import OutputFiles
from gridcore.state.schema import local_jobs
from gridcore.state.store import Store, state_dir

# A job marked running whose process never got a pid within this time was (probably)
# lost by a worker that died between the commit and the spawn: it is fenced and queued
# again, or adopted if its wrapper did start.
SPAWN_GRACE_S = 30.0
STDOUT_FILE = "stdout.txt"
STDERR_FILE = "stderr.txt"
TIME_LIMIT_FILE = "time_limit"  # whole seconds; absent: no limit
TIMED_OUT = "timed_out"  # in start.N: attempt N's watchdog killed it at the limit
KILL_GRACE_S = 10  # SIGTERM at the limit, SIGKILL this much later (Slurm's KillWait)
# The fence: only the wrapper that creates start.N runs attempt N's command. With a time
# limit a watchdog runs beside it in the same process group: past the limit it marks the
# attempt timed out and signals the whole group (itself included, so it ignores TERM
# first). It sleeps one second at a time and stops at the first second the job's rc
# exists (the wrapper also kills it when the command ends): no sleep of the whole limit
# is left for a signal to miss. A single ``sleep LIMIT`` with a TERM trap left an
# orphaned 'sleep 600' behind when the TERM landed while the sleep was being forked (the
# parallel suite hit it twice, after an earlier fix of the same race).
_WATCHDOG = (
    f'( n=$(cat {TIME_LIMIT_FILE}); while [ "$n" -gt 0 ] && [ ! -e rc ]; do '
    "sleep 1; n=$((n - 1)); done; [ -e rc ] && exit 0; "
    f'echo timed out > "start.$GRIDCORE_ATTEMPT/{TIMED_OUT}"; '
    f"trap '' TERM; kill -TERM 0; sleep {KILL_GRACE_S}; kill -KILL 0 ) & w=$!; "
)
_WRAPPER = (
    'mkdir "start.$GRIDCORE_ATTEMPT" 2>/dev/null || exit 0; '
    'echo $$ > "start.$GRIDCORE_ATTEMPT/pid"; '
    f"w=; if [ -s {TIME_LIMIT_FILE} ]; then {_WATCHDOG}fi; "
    f"sh job.sh > {STDOUT_FILE} 2> {STDERR_FILE}; rc=$?; "
    '[ -z "$w" ] || kill $w 2>/dev/null; '
    "echo $rc > rc.tmp && mv rc.tmp rc"
)


class LocalSite:
    """A process-pool site. ``clock`` is injectable for tests."""

    def __init__(
        self, spec: SiteSpec, store: Store, clock: Callable[[], float] = time.time
    ) -> None:
        self.spec = spec
        self.store = store
        self.clock = clock
        self.root = Path(spec.storage_dir or state_dir() / "sites" / spec.name)

    def __repr__(self) -> str:
        return f"LocalSite({self.spec.name!r}, processors={self.spec.processors})"

    # -- SiteAdapter -------------------------------------------------------------

    @property
    def user(self) -> str:
        """Every job here runs as this process's OS user."""
        return _os_user()

    def observe(self) -> SiteObservation:
        self.reconcile()
        now = self.clock()
        with self.store.begin() as conn:
            rows = conn.execute(
                select(
                    local_jobs.c.id,
                    local_jobs.c.name,
                    local_jobs.c.processors,
                    local_jobs.c.state,
                    local_jobs.c.key,
                    local_jobs.c.submitted_at,
                    local_jobs.c.started_at,
                    local_jobs.c.workdir,
                ).where(
                    and_(
                        local_jobs.c.site == self.spec.name,
                        local_jobs.c.state.in_([JobState.PENDING.value, JobState.RUNNING.value]),
                    )
                )
            ).all()
        # Every job here runs as this process's user; its limit is the file its watchdog
        # reads (none: unlimited, as the wait models then cannot plan the queue).
        user = _os_user()
        jobs = tuple(
            ObservedJob(
                str(r.id),
                r.processors,
                JobState(r.state),
                r.key,
                submitted_at=r.submitted_at,
                started_at=r.started_at,
                user=user,
                time_limit_s=_time_limit(Path(r.workdir)),
                name=r.name,
            )
            for r in rows
        )
        busy = sum(j.processors for j in jobs if j.state is JobState.RUNNING)
        return SiteObservation(
            self.spec.name, self.spec.processors, self.spec.processors - busy, jobs, now
        )

    def submit(self, job: JobSubmission) -> str:
        """Files first, then the row (with its workdir) in one transaction; a job with
        ``job.key`` already at this site is returned, not started again."""
        self._check_submission(job)
        if job.key is not None:
            found = self.find(job.key)
            if found is not None:
                return found
        workdir = self._write_job_files(job.key or f"anon-{uuid.uuid4().hex}", job)
        try:
            jid = self._insert(job, workdir)
        except IntegrityError:
            # Another worker inserted the same key between our look-up and our insert.
            found = self.find(job.key) if job.key is not None else None
            if found is None:
                raise
            return found
        self.reconcile()
        return str(jid)

    def find(self, key: str, since: float | None = None) -> str | None:
        """The id of this site's job submitted with ``key``, if there is one (this site
        forgets no job, so ``since`` changes nothing)."""
        with self.store.begin() as conn:
            found = conn.execute(
                select(local_jobs.c.id).where(
                    and_(local_jobs.c.site == self.spec.name, local_jobs.c.key == key)
                )
            ).scalar_one_or_none()
        return None if found is None else str(found)

    def workdir(self, job_id: str) -> Path:
        """Where the job's files and outputs (stdout.txt, stderr.txt, rc) are."""
        jid = _int_id(self.spec.name, job_id)
        with self.store.begin() as conn:
            row = conn.execute(
                select(local_jobs.c.workdir).where(
                    and_(local_jobs.c.id == jid, local_jobs.c.site == self.spec.name)
                )
            ).scalar_one_or_none()
        if row is None:
            raise UnknownJob(self.spec.name, f"no local job {job_id}")
        return Path(row)

    def output_files(self, job_id: str) -> OutputFiles:
        """``stdout.txt`` and ``stderr.txt`` in the job's directory (see ``_WRAPPER``)."""
        workdir = self.workdir(job_id)
        return OutputFiles(str(workdir / STDOUT_FILE), str(workdir / STDERR_FILE))

    def check_request(self, name: str, processors: int, resources: JobResources) -> None:
        """RequestError if this site could never run the job: it has no GPUs (the rest
        of ``resources`` does not apply to a local site, but its time limit)."""
        if resources.gpus:
            raise RequestError(
                f"site {self.spec.name}: job {name!r} asks for {resources.gpus} GPU(s);"
                " a local site has no GPUs"
            )

    def _check_submission(self, job: JobSubmission) -> None:
        self.check_request(job.name, job.processors, job.resources.over(self.spec.defaults))
        if job.processors > self.spec.processors:
            raise SiteRejected(
                self.spec.name,
                f"job {job.name!r} needs {job.processors} processors,"
                f" the site has {self.spec.processors}",
            )
        if job.key is not None and not is_valid_key(job.key):
            raise SiteRejected(self.spec.name, f"job {job.name!r}: invalid key {job.key!r}")

    def _insert(self, job: JobSubmission, workdir: Path) -> int:
        with self.store.begin() as conn:
            job_id = conn.execute(
                insert(local_jobs).values(
                    site=self.spec.name,
                    name=job.name,
                    processors=job.processors,
                    workdir=str(workdir),
                    state=JobState.PENDING.value,
                    submitted_at=self.clock(),
                    key=job.key,
                )
            ).inserted_primary_key
        assert job_id is not None
        return int(job_id[0])

    def status(self, job_id: str) -> JobStatus:
        self.reconcile()
        with self.store.begin() as conn:
            row = (
                conn.execute(
                    select(local_jobs).where(local_jobs.c.id == _int_id(self.spec.name, job_id))
                )
                .mappings()
                .one_or_none()
            )
        if row is None or row["site"] != self.spec.name:
            raise UnknownJob(self.spec.name, f"no local job {job_id}")
        return JobStatus(
            job_id,
            JobState(row["state"]),
            row["exit_code"],
            row["submitted_at"],
            row["started_at"],
            row["finished_at"],
            row["message"] or "",
        )

    def cancel(self, job_id: str) -> None:
        jid = _int_id(self.spec.name, job_id)
        with self.store.begin() as conn:
            row = (
                conn.execute(select(local_jobs).where(local_jobs.c.id == jid))
                .mappings()
                .one_or_none()
            )
            if row is None or row["site"] != self.spec.name:
                raise UnknownJob(self.spec.name, f"no local job {job_id}")
            if JobState(row["state"]).finished:
                return
            conn.execute(
                update(local_jobs)
                .where(local_jobs.c.id == jid)
                .values(
                    state=JobState.CANCELLED.value, finished_at=self.clock(), message="cancelled"
                )
            )
        if row["state"] == JobState.RUNNING.value and row["pid"] is None:
            # a spawn may be under way: fence it so the cancelled job never starts
            _fence(Path(row["workdir"]) / f"start.{row['attempt']}")
            pid = _read_int(Path(row["workdir"]) / f"start.{row['attempt']}" / "pid")
            if pid is not None:
                _kill_group(_pgid(pid) or pid)
        if row["pgid"]:
            _kill_group(int(row["pgid"]))
        self.reconcile()

    # -- the site's own scheduler ------------------------------------------------

    def reconcile(self) -> None:
        """Reap finished jobs, then start pending ones in FIFO order while they fit."""
        with self.store.begin() as conn:
            self.store.lock_site(conn, self.spec.name)
            self._reap(conn)
            to_start = self._admit(conn)
        for jid, workdir, attempt in to_start:
            self._spawn(jid, Path(workdir), attempt)

    def _reap(self, conn: Connection) -> None:
        running = (
            conn.execute(
                select(local_jobs).where(
                    and_(
                        local_jobs.c.site == self.spec.name,
                        local_jobs.c.state == JobState.RUNNING.value,
                    )
                )
            )
            .mappings()
            .all()
        )
        for row in running:
            outcome = self._outcome(row)
            if outcome is not None:
                conn.execute(
                    update(local_jobs).where(local_jobs.c.id == row["id"]).values(**outcome)
                )

    def _outcome(self, row: Any) -> dict[str, Any] | None:
        rc_file = Path(row["workdir"]) / "rc"
        timed_out = self._timed_out(row)
        if timed_out is not None:
            return timed_out
        if rc_file.exists():
            return _exit_outcome(rc_file)
        if row["pid"] is None:
            if self.clock() - (row["started_at"] or 0) <= SPAWN_GRACE_S:
                return None  # its worker is (probably) spawning it now
            return self._unspawned(row)
        if _alive(int(row["pid"]), Path(row["workdir"])):
            return None
        # The job may have written its exit code and exited between the two checks.
        if rc_file.exists():
            return _exit_outcome(rc_file)
        timed_out = self._timed_out(row)
        if timed_out is not None:
            return timed_out
        return {
            "state": JobState.FAILED.value,
            "finished_at": self.clock(),
            "message": "process vanished without an exit code",
        }

    def _timed_out(self, row: Any) -> dict[str, Any] | None:
        """FAILED if attempt N's watchdog killed it at its time limit and its wrapper is
        gone (a command that ended with 0 just before the limit still completed)."""
        workdir = Path(row["workdir"])
        marker = workdir / f"start.{row['attempt']}" / TIMED_OUT
        if not marker.exists():
            return None
        rc_file = workdir / "rc"
        if rc_file.exists() and rc_file.read_text().strip() == "0":
            return None
        if row["pid"] is not None and _alive(int(row["pid"]), workdir):
            return None  # its wrapper is still being stopped
        limit = _read_int(workdir / TIME_LIMIT_FILE)
        return {
            "state": JobState.FAILED.value,
            "finished_at": marker.stat().st_mtime,
            "message": f"time limit of {limit} s exceeded (killed)",
        }

    def _unspawned(self, row: Any) -> dict[str, Any] | None:
        """A running job with no pid past the grace: fence its attempt and queue it
        again, or adopt the wrapper that did start (its pid file)."""
        fence = Path(row["workdir"]) / f"start.{row['attempt']}"
        if _fence(fence):
            return {
                "state": JobState.PENDING.value,
                "started_at": None,
                "message": f"queued again: attempt {row['attempt']} was never spawned",
            }
        pid = _read_int(fence / "pid")
        if pid is not None:
            return {"pid": pid, "pgid": _pgid(pid)}
        if self.clock() - (row["started_at"] or 0) > 2 * SPAWN_GRACE_S:
            return {
                "state": JobState.FAILED.value,
                "finished_at": self.clock(),
                "message": "its wrapper started but vanished before recording its pid",
            }
        return None

    def _admit(self, conn: Connection) -> list[tuple[int, str, int]]:
        busy = conn.execute(
            select(func.coalesce(func.sum(local_jobs.c.processors), 0)).where(
                and_(
                    local_jobs.c.site == self.spec.name,
                    local_jobs.c.state == JobState.RUNNING.value,
                )
            )
        ).scalar_one()
        free = self.spec.processors - int(busy)
        pending = conn.execute(
            select(
                local_jobs.c.id,
                local_jobs.c.processors,
                local_jobs.c.workdir,
                local_jobs.c.attempt,
            )
            .where(
                and_(
                    local_jobs.c.site == self.spec.name,
                    local_jobs.c.state == JobState.PENDING.value,
                )
            )
            .order_by(local_jobs.c.id)
        ).all()
        started: list[tuple[int, str, int]] = []
        for row in pending:
            if row.processors > free:
                break  # strict FIFO: no overtaking, like a batch queue without backfill
            free -= row.processors
            attempt = row.attempt + 1
            conn.execute(
                update(local_jobs)
                .where(local_jobs.c.id == row.id)
                .values(
                    state=JobState.RUNNING.value,
                    started_at=self.clock(),
                    attempt=attempt,
                    pid=None,
                    pgid=None,
                )
            )
            started.append((row.id, row.workdir, attempt))
        return started

    def _spawn(self, jid: int, workdir: Path, attempt: int) -> None:
        # An intermediate shell in a new session backgrounds the wrapper and exits at once:
        # the job is reparented away from this (possibly short-lived) process, and the
        # whole group can be signalled by the intermediate's pgid.
        proc = subprocess.run(
            [
                "/bin/sh",
                "-c",
                f"/bin/sh -c {shlex.quote(_WRAPPER)} </dev/null >/dev/null 2>&1 & echo $!",
            ],
            cwd=workdir,
            env={**self._job_env(jid, workdir), "GRIDCORE_ATTEMPT": str(attempt)},
            capture_output=True,
            text=True,
            start_new_session=True,
            check=False,
        )
        values: dict[str, Any]
        if proc.returncode == 0 and proc.stdout.strip().isdigit():
            pid = int(proc.stdout.strip())
            values = {"pid": pid, "pgid": _pgid(pid)}
        else:
            values = {
                "state": JobState.FAILED.value,
                "finished_at": self.clock(),
                "message": f"could not start: {proc.stderr.strip()[:200]}",
            }
        with self.store.begin() as conn:
            # only for this attempt, if still running: a spawn slower than the grace
            # (fenced and queued again meanwhile) must not overwrite a later attempt
            conn.execute(
                update(local_jobs)
                .where(
                    and_(
                        local_jobs.c.id == jid,
                        local_jobs.c.attempt == attempt,
                        local_jobs.c.state == JobState.RUNNING.value,
                        local_jobs.c.pid.is_(None),
                    )
                )
                .values(**values)
            )

    def _job_env(self, jid: int, workdir: Path) -> dict[str, str]:
        extra = json.loads((workdir / "env.json").read_text())
        return {**os.environ, **extra, "GRIDCORE_JOB_ID": str(jid)}

    def _write_job_files(self, name: str, job: JobSubmission) -> Path:
        """The job's directory with complete files, or SiteRejected naming the problem
        (nothing is recorded then). Each file appears whole, by rename."""
        workdir = self.root / "jobs" / name
        env = {
            **job.env,
            "GRIDCORE_SITE": self.spec.name,
            "GRIDCORE_PROCESSORS": str(job.processors),
        }
        try:
            workdir.mkdir(parents=True, exist_ok=True)
            _write_whole(workdir / "job.sh", _script(job))
            limit = job.resources.time_limit_s
            if limit is not None:
                _write_whole(workdir / TIME_LIMIT_FILE, f"{limit}\n")
            # The environment may hold a secret (a pilot's token): readable by us only.
            _write_whole(workdir / "env.json", json.dumps(env), mode=0o600)
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
            raise SiteRejected(
                self.spec.name, f"job {job.name!r}: cannot write its files in {workdir}: {exc}"
            ) from exc
        return workdir


def _write_whole(path: Path, text: str, mode: int | None = None) -> None:
    # A concurrent submission of the same key writes the same files: neither ever sees
    # (nor leaves) a half-written one.
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    if mode is None:
        tmp.write_text(text)
    else:
        descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
    os.replace(tmp, path)


def _exit_outcome(rc_file: Path) -> dict[str, Any]:
    code = int(rc_file.read_text().strip() or "255")
    state = JobState.COMPLETED if code == 0 else JobState.FAILED
    return {
        "state": state.value,
        "exit_code": code,
        "finished_at": rc_file.stat().st_mtime,
        "message": "" if code == 0 else f"exit code {code}",
    }


def _script(job: JobSubmission) -> str:
    cd = f"cd {shlex.quote(job.workdir)}\n" if job.workdir else ""
    return f"set -e\n{cd}{job.command}\n"


def _int_id(site: str, job_id: str) -> int:
    if not job_id.isdigit():
        raise UnknownJob(site, f"local job ids are integers, got {job_id!r}")
    return int(job_id)


def _fence(directory: Path) -> bool:
    """Create ``directory``; False if it exists (the wrapper got there first)."""
    try:
        directory.mkdir()
    except FileExistsError:
        return False
    return True


def _os_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid with no passwd entry (containers)
        return str(os.getuid())


def _time_limit(workdir: Path) -> float | None:
    try:
        limit = _read_int(workdir / TIME_LIMIT_FILE)
    except OSError:
        return None
    return float(limit) if limit else None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None  # already finished; the rc file tells the outcome


def _alive(pid: int, workdir: Path) -> bool:
    """True if ``pid`` is still our wrapper (not a zombie, not a reused pid)."""
    proc = Path(f"/proc/{pid}")
    try:
        stat = (proc / "stat").read_text()
        cwd = os.readlink(proc / "cwd")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state != "Z" and Path(cwd) == workdir.resolve()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
