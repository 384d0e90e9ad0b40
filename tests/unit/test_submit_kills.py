"""Exactly-once submission under SIGKILL (issue 7 item 3), on SQLite and local sites.

A worker process runs select -> submit -> record and kills itself (SIGKILL) at one aimed
point: after the k-th committed transaction (k = 1, 2, ... until the flow ends first),
or inside the local site's submit between its directory, each file and the row. After
each kill a new runtime retries the submission, as a retried Airflow task would: there
must be exactly one site job for the selection, no pending job without its files, and
every processor back once the job has ended.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, select

import gridcore.sites.local as local_site
from gridcore.config import default_grid
from gridcore.engine.runtime import SUBMIT_DEADLINE_S, GridRuntime, JobRecord
from gridcore.errors import SiteRejected
from gridcore.model import GridSpec, JobRequest, JobSubmission, SiteKind, SiteSpec
from gridcore.sites.keys import selection_key
from gridcore.sites.local import SPAWN_GRACE_S, LocalSite
from gridcore.state import capacity
from gridcore.state.schema import local_jobs, selections
from gridcore.state.store import Store, open_store

JOB = JobSubmission("victim", "sleep 0.2", 2)
FILE_POINTS = ("after-mkdir", "after-first-file", "after-second-file")


def _runtime(
    home: Path, clock: Callable[[], float] = time.time, url: str | None = None
) -> GridRuntime:
    """The embedded default grid on SQLite in ``home``, or on the database at ``url``."""
    store = open_store(url or f"sqlite:///{home}/state.db", upgrade=True)
    return GridRuntime(default_grid(home), store, clock=clock)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _die_after_commit(k: int) -> None:
    """Every Store transaction counts; the k-th one dies right after its commit."""
    original = Store.begin
    done = [0]

    @contextlib.contextmanager
    def begin(self: Store) -> Iterator[Connection]:
        with original(self) as conn:
            yield conn
        done[0] += 1
        if done[0] == k:
            _die()

    Store.begin = begin  # type: ignore[method-assign]


def _die_in_files(point: str) -> None:
    """Aim inside the local site's submit: after its mkdir, or after its 1st/2nd file."""
    mkdir, write_whole = Path.mkdir, local_site._write_whole
    writes = [0]

    def aimed_mkdir(self: Path, *args: Any, **kwargs: Any) -> None:
        mkdir(self, *args, **kwargs)
        if point == "after-mkdir" and "jobs" in self.parts:
            _die()

    def aimed_write(path: Path, text: str, mode: int | None = None) -> None:
        write_whole(path, text, mode)
        writes[0] += 1
        if point == f"after-{('first', 'second')[min(writes[0], 2) - 1]}-file":
            _die()

    Path.mkdir = aimed_mkdir  # type: ignore[method-assign]
    local_site._write_whole = aimed_write  # each of the job's files, published whole


def _worker(home: str, point: str, url: str | None) -> None:
    rt = _runtime(Path(home), url=url)
    if point.startswith("commit-"):
        _die_after_commit(int(point.split("-")[1]))
    else:
        _die_in_files(point)
    rec = rt.select(JobRequest(JOB.name, JOB.processors, 1.0), site="local-a")
    rt.submit(rec.selection_id, JOB)


def _run_worker(home: Path, point: str, url: str | None = None) -> int | None:
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_worker, args=(str(home), point, url))
    proc.start()
    proc.join(60)
    return proc.exitcode


def _wait(rt: GridRuntime, sid: int) -> JobRecord:
    deadline = time.time() + 60
    while time.time() < deadline:
        rec = rt.poll(sid)
        if rec.finished:
            return rec
        time.sleep(0.05)
    raise AssertionError(f"selection {sid} not finished: {rt.record(sid)}")


def _recover(home: Path, url: str | None = None) -> GridRuntime:
    """What a retry does: the same selection if it was committed, else select again."""
    first = _runtime(home, url=url)
    with first.store.begin() as conn:
        unspawned = conn.execute(
            select(local_jobs.c.id).where(
                local_jobs.c.state == "running", local_jobs.c.pid.is_(None)
            )
        ).first()
    # A job marked running by a worker killed before it spawned fails after the grace
    # time; the retry's clock is moved past it instead of sleeping.
    offset = SPAWN_GRACE_S + 1 if unspawned else 0.0
    first.store.dispose()
    rt = _runtime(home, clock=lambda: time.time() + offset, url=url)
    with rt.store.begin() as conn:
        sid = conn.execute(select(selections.c.id)).scalar_one_or_none()
    if sid is None:
        sid = rt.select(JobRequest(JOB.name, JOB.processors, 1.0), site="local-a").selection_id
    rt.submit(sid, JOB)
    _wait(rt, sid)
    return rt


def assert_exactly_once_and_everything_back(rt: GridRuntime, where: str) -> None:
    with rt.store.begin() as conn:
        sids = list(conn.execute(select(selections.c.id)).scalars())
        jobs = conn.execute(select(local_jobs)).mappings().all()
        assert len(sids) == 1, f"{where}: selections {sids}"
        keys = [j["key"] for j in jobs]
        assert keys == [selection_key(rt.install_id, sids[0])], f"{where}: site jobs {keys}"
        for job in jobs:
            assert job["state"] in ("completed", "failed"), f"{where}: {dict(job)}"
            workdir = Path(job["workdir"])
            assert (workdir / "job.sh").is_file() and (workdir / "env.json").is_file(), where
        assert_capacity_back(conn, where)
    assert rt.record(sids[0]).job_id == str(jobs[0]["id"]), f"{where}: the job is recorded"


def assert_capacity_back(conn: Connection, where: str) -> None:
    totals = capacity.totals(conn)
    assert all(v == (0, 0, 0, 0) for v in totals.values()), f"{where}: {totals}"
    assert capacity.check_invariant(conn) == [], where
    assert capacity.live_holds(conn) == [], where


def kill_after_each_commit(
    tmp_path: Path, database: Callable[[], contextlib.AbstractContextManager[str | None]]
) -> int:
    """Kill after commit 1, 2, ... (each on a fresh ``database()``: None = SQLite) until
    the flow ends before the aimed commit; check each recovery. Returns the points."""
    for k in range(1, 40):
        home = tmp_path / f"commit-{k}"
        with database() as url:
            code = _run_worker(home, f"commit-{k}", url)
            if code == 0:
                return k - 1  # the whole flow has fewer commits: every point was covered
            assert code == -signal.SIGKILL, f"commit {k}: worker exited with {code}"
            rt = _recover(home, url)
            assert_exactly_once_and_everything_back(rt, f"killed after commit {k}")
            rt.store.dispose()
    raise AssertionError("the flow never ended: more than 39 commits?")


def test_a_worker_killed_after_any_commit_submits_one_job(tmp_path: Path) -> None:
    points = kill_after_each_commit(tmp_path, lambda: contextlib.nullcontext(None))
    assert points >= 5, "select, the site's row, its start, its spawn and the record commit"


@pytest.mark.parametrize("point", FILE_POINTS)
def test_a_worker_killed_inside_the_local_submit_leaves_no_half_made_job(
    tmp_path: Path, point: str
) -> None:
    code = _run_worker(tmp_path, point)
    assert code == -signal.SIGKILL, f"{point}: worker exited with {code}"
    rt = _runtime(tmp_path)
    with rt.store.begin() as conn:
        rows = conn.execute(select(local_jobs)).mappings().all()
    assert rows == [], f"{point}: a job row exists before its files are complete"
    assert_exactly_once_and_everything_back(_recover(tmp_path), point)


def test_an_unsubmitted_selection_whose_job_exists_is_adopted_not_expired(
    tmp_path: Path,
) -> None:
    """No retry comes: the worker died after the site accepted the job, and the
    selection's deadline passes. Expiry looks the key up and adopts the job."""
    late = [0.0]
    rt = _runtime(tmp_path, clock=lambda: time.time() + late[0])
    sid = rt.select(JobRequest("late", 2, 1.0), site="local-b").selection_id
    keyed = JobSubmission("late", "sleep 0.2", 2, key=selection_key(rt.install_id, sid))
    job_id = rt.adapter("local-b").submit(keyed)  # the worker dies here, before recording
    late[0] = SUBMIT_DEADLINE_S + 1
    rt.refresh()
    record = rt.record(sid)
    assert (record.state, record.job_id) == ("pending", job_id), record
    assert _wait(rt, sid).state == "completed"
    with rt.store.begin() as conn:
        assert_capacity_back(conn, "adopted at expiry")


def test_a_keyed_job_without_a_live_holder_is_cancelled_by_refresh(tmp_path: Path) -> None:
    rt = _runtime(tmp_path)
    gone = rt.select(JobRequest("gone", 1, 1.0), site="local-c").selection_id
    waiting = rt.select(JobRequest("waiting", 1, 1.0), site="local-c").selection_id
    site = rt.adapter("local-c")
    orphans = [
        site.submit(JobSubmission("o1", "sleep 30", 1, key=selection_key(rt.install_id, gone))),
        # a key of ours naming a selection that does not exist
        site.submit(JobSubmission("o2", "sleep 30", 1, key=selection_key(rt.install_id, 999))),
    ]
    live = site.submit(JobSubmission("w", "sleep 30", 1, key=selection_key(rt.install_id, waiting)))
    others = site.submit(JobSubmission("not-ours", "sleep 30", 1, key="gc-0123456789ab-s1"))
    rt.cancel(gone)  # its worker died after the site accepted the job: nothing recorded it
    rt.refresh()
    assert [site.status(j).state.value for j in orphans] == ["cancelled", "cancelled"]
    # A selection still waiting for its job is a live holder: it adopts the job.
    assert rt.record(waiting).job_id == live
    assert site.status(live).state.value == "running"
    assert site.status(others).state.value == "running", "another database's job"
    rt.cancel(waiting)
    site.cancel(others)
    with rt.store.begin() as conn:
        assert_capacity_back(conn, "orphans")


@pytest.mark.parametrize(
    "storage_dir", ["with-a-nul\0byte", "a-file/below-it"], ids=["nul", "not-a-dir"]
)
def test_a_storage_dir_that_cannot_hold_files_fails_the_selection_and_frees_it(
    tmp_path: Path, storage_dir: str
) -> None:
    (tmp_path / "a-file").write_text("")
    spec = SiteSpec("odd", SiteKind.LOCAL, 4, storage_dir=str(tmp_path / storage_dir))
    grid = GridSpec((spec,))
    rt = GridRuntime(grid, open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True))
    sid = rt.select(JobRequest("j", 2, 1.0), site="odd").selection_id
    with pytest.raises(SiteRejected, match="cannot write its files"):
        rt.submit(sid, JobSubmission("j", "true", 2))
    assert rt.record(sid).state == "failed"
    with rt.store.begin() as conn:
        assert conn.execute(select(local_jobs)).all() == []
        assert_capacity_back(conn, storage_dir)


def test_a_second_submission_with_the_same_key_returns_the_first_job(tmp_path: Path) -> None:
    rt = _runtime(tmp_path)
    site = rt.adapter("local-a")
    assert isinstance(site, LocalSite)
    job = JobSubmission("twice", "sleep 0.1", 1, key="gc-0123456789ab-s7")
    first = site.submit(job)
    assert site.submit(job) == first
    assert site.find("gc-0123456789ab-s7") == first and site.find("gc-0123456789ab-s8") is None
    with rt.store.begin() as conn:
        assert len(conn.execute(select(local_jobs)).all()) == 1


def test_a_job_whose_selection_expired_while_it_was_submitted_is_cancelled(
    tmp_path: Path,
) -> None:
    """A slow worker: its selection passes the deadline and expires (the look-up found
    nothing yet) while the site is accepting the job. The worker's record then fails, and
    the job it got, holder-less, is cancelled at once instead of running unreferenced."""
    late = [0.0]
    rt = _runtime(tmp_path, clock=lambda: time.time() + late[0])
    sid = rt.select(JobRequest("slow", 2, 1.0), site="local-a").selection_id
    site = rt.adapter("local-a")
    assert isinstance(site, LocalSite)
    accept = site.submit
    submitted: list[str] = []

    def slow_submit(job: JobSubmission) -> str:
        late[0] = SUBMIT_DEADLINE_S + 1
        rt.refresh()  # another worker's refresh: nothing at the site yet, so it expires
        submitted.append(accept(job))
        return submitted[0]

    site.submit = slow_submit  # type: ignore[method-assign]
    record = rt.submit(sid, JobSubmission("slow", "sleep 30", 2))
    assert record.state == "failed" and record.job_id is None, record
    assert site.status(submitted[0]).state.value == "cancelled"
    with rt.store.begin() as conn:
        assert_capacity_back(conn, "expired while submitting")


def _probe_and_die(home: str) -> None:
    rt = _runtime(Path(home))
    accept = LocalSite.submit

    def accepted_then_killed(self: LocalSite, job: JobSubmission) -> str:
        accept(self, job)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

    LocalSite.submit = accepted_then_killed  # type: ignore[method-assign]
    rt.probe_unusable_sites(time.time(), retry_after_s=0, command="sleep 30")


def test_a_probe_whose_worker_died_is_kept_until_a_newer_probe_replaces_it(
    tmp_path: Path,
) -> None:
    from gridcore.engine import health

    rt = _runtime(tmp_path)
    with rt.store.begin() as conn:
        for _ in range(health.UNUSABLE_AFTER_ERRORS):
            health.record_failure(conn, "local-b", "component failed")
    ctx = multiprocessing.get_context("spawn")
    worker = ctx.Process(target=_probe_and_die, args=(str(tmp_path),))
    worker.start()
    worker.join(60)
    assert worker.exitcode == -signal.SIGKILL
    site = rt.adapter("local-b")
    with rt.store.begin() as conn:
        (first,) = conn.execute(select(local_jobs.c.id)).scalars()
    rt.refresh()  # its hold is live: the submission may still be under way
    assert site.status(str(first)).state.value == "running"
    rt.probe_unusable_sites(time.time(), retry_after_s=0, command="sleep 30")
    with rt.store.begin() as conn:
        second = health.read_health(conn)["local-b"].probe_job_id
    assert second is not None and second != str(first)
    rt.refresh()  # the newer probe released the older one's hold: an orphan now
    assert site.status(str(first)).state.value == "cancelled"
    assert site.status(second).state.value == "running"
    site.cancel(second)
    health.restore_site(rt.store, "local-b")
    with rt.store.begin() as conn:
        assert capacity.check_invariant(conn) == []
