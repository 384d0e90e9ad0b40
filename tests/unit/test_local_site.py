"""The embedded local site and the runtime on top of it: real subprocesses, processors
accounted in the state DB across processes, failures and cancellation."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gridcore.config import default_grid
from gridcore.engine import ledger
from gridcore.engine.runtime import GridRuntime, JobRecord
from gridcore.errors import ConfigError, RequestError, SiteRejected
from gridcore.model import JobRequest, JobSubmission
from gridcore.sites.local import LocalSite
from gridcore.state.schema import local_jobs, selections
from gridcore.state.store import open_store
from tests.capacity_checks import assert_capacity_invariant


def runtime(tmp_path: Path) -> GridRuntime:
    return GridRuntime(
        default_grid(tmp_path), open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    )


def run(rt: GridRuntime, name: str, procs: int, command: str, site: str | None = None) -> int:
    rec = rt.select(JobRequest(name, procs, 1.0), site=site)
    return rt.submit(rec.selection_id, JobSubmission(name, command, procs)).selection_id


def wait(rt: GridRuntime, sid: int, timeout: float = 30.0) -> JobRecord:
    deadline = time.time() + timeout
    while time.time() < deadline:
        rec = rt.poll(sid)
        if rec.finished:
            return rec
        time.sleep(0.1)
    raise AssertionError(f"selection {sid} not finished: {rt.record(sid)}")


def in_flight_zero(rt: GridRuntime) -> None:
    with rt.store.begin() as conn:
        assert all(v == (0, 0, 0, 0) for v in ledger.ledger_totals(conn).values())


def test_job_runs_on_its_site_and_releases_its_processors(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    sid = run(rt, "hello", 2, 'echo "on $GRIDCORE_SITE with $GRIDCORE_PROCESSORS"')
    rec = wait(rt, sid)
    assert (rec.state, rec.exit_code) == ("completed", 0)
    site = rt.adapter(rec.site)
    assert isinstance(site, LocalSite)
    out = site.workdir(str(rec.job_id)) / "stdout.txt"
    assert out.read_text().strip() == f"on {rec.site} with 2"
    assert (
        rec.started_at is not None and rec.finished_at is not None and rec.submitted_at is not None
    )
    in_flight_zero(rt)


def test_failing_job_reports_exit_code(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    rec = wait(rt, run(rt, "bad", 1, "exit 3"))
    assert (rec.state, rec.exit_code, rec.message) == ("failed", 3, "exit code 3")
    in_flight_zero(rt)
    assert_capacity_invariant(rt.store, no_live_holds=True)


def test_cancel_kills_the_process_group(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    marker = tmp_path / "survived"
    sid = run(rt, "long", 1, f"sleep 3; touch {marker}")
    time.sleep(0.3)
    assert rt.cancel(sid).state == "cancelled"
    time.sleep(3.5)
    assert not marker.exists()
    in_flight_zero(rt)
    assert_capacity_invariant(rt.store, no_live_holds=True)


def test_a_vanished_process_is_a_failure_not_a_hang(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    sid = run(rt, "victim", 1, "sleep 30", site="local-a")
    job_id = int(rt.record(sid).job_id or 0)
    with rt.store.begin() as conn:
        pgid = conn.execute(select(local_jobs.c.pgid).where(local_jobs.c.id == job_id)).scalar_one()
    os.killpg(pgid, signal.SIGKILL)
    rec = wait(rt, sid)
    assert rec.state == "failed" and "vanished" in rec.message
    assert_capacity_invariant(rt.store, no_live_holds=True)


def test_bad_requests_fail_before_anything_is_recorded(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    with pytest.raises(RequestError, match=r"request\.processors: must be a positive integer"):
        rt.select(JobRequest("zero", 0))
    with pytest.raises(RequestError, match="no site can run 64 processors"):
        rt.select(JobRequest("huge", 64))
    with pytest.raises(ConfigError, match="unknown site 'nowhere'"):
        rt.select(JobRequest("lost", 1), site="nowhere")
    with pytest.raises(RequestError, match="local-c has 4 processors in all < 8 needed"):
        rt.select(JobRequest("pinned", 8), site="local-c")
    with rt.store.begin() as conn:
        assert conn.execute(select(func.count()).select_from(selections)).scalar_one() == 0


def test_a_rejected_submission_fails_the_selection_and_frees_its_claim(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    rec = rt.select(JobRequest("liar", 1), site="local-c")
    with pytest.raises(SiteRejected, match="needs 16 processors, the site has 4"):
        rt.submit(rec.selection_id, JobSubmission("liar", "true", 16))
    assert rt.record(rec.selection_id).state == "failed"
    in_flight_zero(rt)
    assert_capacity_invariant(rt.store, no_live_holds=True)


def _submit_many(home: str, start: int) -> None:
    rt = runtime(Path(home))
    for i in range(start, start + 4):
        run(rt, f"w{i}", 4, "sleep 0.4", site="local-a")


def test_workers_in_different_processes_share_one_site_without_oversubscribing(
    tmp_path: Path,
) -> None:
    rt = runtime(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_submit_many, args=(str(tmp_path), i * 4)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with rt.store.begin() as conn:
        ids = list(conn.execute(select(selections.c.id)).scalars())
    for sid in ids:
        assert wait(rt, sid).state == "completed"
    with rt.store.begin() as conn:
        spans = conn.execute(
            select(local_jobs.c.started_at, local_jobs.c.finished_at, local_jobs.c.processors)
        ).all()
    # At every start instant, the processors of jobs running then never exceed 8.
    for t, _, _ in spans:
        busy = sum(p for s, f, p in spans if s <= t < f)
        assert busy <= 8, f"{busy} processors busy at {t} on an 8-processor site"
    assert len(spans) == 12
    in_flight_zero(rt)
    assert_capacity_invariant(rt.store, no_live_holds=True)


def test_a_selection_never_submitted_gives_its_processors_back(tmp_path: Path) -> None:
    now = [1_000_000.0]
    rt = GridRuntime(
        default_grid(tmp_path),
        open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True),
        clock=lambda: now[0],
    )
    orphan = rt.select(JobRequest("orphan", 8, 1.0), site="local-a")  # worker dies here
    kept = rt.select(JobRequest("kept", 2, 1.0), site="local-b")
    rt.submit(kept.selection_id, JobSubmission("kept", "sleep 5", 2))
    now[0] += 599
    rt.refresh()
    assert rt.record(orphan.selection_id).state == "selected"
    now[0] += 2
    rt.refresh()
    record = rt.record(orphan.selection_id)
    assert record.state == "failed" and "never submitted" in record.message
    assert rt.record(kept.selection_id).state != "failed", "submitted jobs are not expired"
    with rt.store.begin() as conn:
        totals = ledger.ledger_totals(conn)
    assert totals["local-a"] == (0, 0, 0, 0)
    assert_capacity_invariant(rt.store)
    rt.cancel(kept.selection_id)
    assert_capacity_invariant(rt.store, no_live_holds=True)


def test_a_jobs_environment_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """A pilot's token travels in the job's environment: its file is 0600."""
    runtime = GridRuntime(
        default_grid(tmp_path), open_store(f"sqlite:///{tmp_path}/s.db", upgrade=True)
    )
    site = runtime.adapter("local-a")
    assert isinstance(site, LocalSite)
    job_id = site.submit(JobSubmission("secret", "true", 1, env={"GRIDCORE_PILOT_TOKEN": "x"}))
    env_file = site.workdir(job_id) / "env.json"
    assert env_file.stat().st_mode & 0o777 == 0o600
    runtime.store.dispose()
