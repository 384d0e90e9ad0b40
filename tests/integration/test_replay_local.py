"""``gridcore replay`` on the embedded local sites: the head of a real log (KTH SP2,
tests/data/swf) replayed at speedup 150 as others' sleep jobs, every job checked at its
site (its sleep, its time limit, completed) and nothing of it left running; and the
engines counting replayed jobs as other users' load (a selection's snapshot and
reasons, the queue-wait history); and a replay killed with SIGKILL, whose jobs
``gridcore replay-cancel RUN`` then cancels (and no other job)."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from gridcore.config import default_grid
from gridcore.engine.replay import ReplayRunner, replay_site
from gridcore.engine.runtime import GridRuntime
from gridcore.model import JobRequest, JobState, JobSubmission
from gridcore.policies.selection import DEFAULT_PROTOCOL, select_site
from gridcore.sites.local import TIME_LIMIT_FILE, LocalSite
from gridcore.state.schema import queue_waits
from gridcore.state.store import open_store
from gridcore.workloads.replay import ReplaySettings, Window, parse_site_map, plan_replay
from gridcore.workloads.swf import iter_jobs
from tests.fakes import FakeClock

KTH = Path(__file__).resolve().parents[1] / "data" / "swf" / "kth-sp2-head.swf.gz"
# KTH jobs 20..38 (19 jobs, 1 to 36 processors, runs of 4 to 1074 s), submitted over
# 3349 s: at speedup 150 over 22 s, the longest sleeping 7.2 s
WINDOW = "605396:608800"
SPEEDUP = 150.0


def _processes_under(root: Path) -> list[int]:
    """Live processes whose working directory is under ``root`` (a job's wrapper, its
    command, its watchdog all run in the job's directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue  # gone, or a zombie
        if cwd.startswith(str(root)):
            found.append(int(proc.name))
    return found


def _none_left_under(root: Path, timeout_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := _processes_under(root)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _runtime(home: Path) -> GridRuntime:
    """The embedded default grid over ``home``, as the command sees it."""
    return GridRuntime(default_grid(home), open_store(f"sqlite:///{home}/state.db", upgrade=True))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "home"
    monkeypatch.setenv("GRIDCORE_HOME", str(home))
    for name in ("GRIDCORE_GRID", "GRIDCORE_DB_URL"):
        monkeypatch.delenv(name, raising=False)
    yield home
    # whatever a failing test left: stopped by its site's own cancel, never by name
    runtime = GridRuntime(
        default_grid(home), open_store(f"sqlite:///{home}/state.db", upgrade=True)
    )
    try:
        for spec in runtime.grid.sites:
            site = runtime.adapter(spec.name)
            for job in site.observe().jobs:
                site.cancel(job.job_id)
    finally:
        runtime.store.dispose()


def test_a_real_log_head_replayed_on_local_sites_runs_every_job_and_leaves_nothing(
    home: Path,
) -> None:
    argv = [
        sys.executable, "-m", "gridcore.cli", "replay", str(KTH),
        "--site-map", "*=local-a+local-b+local-c", "--speedup", str(SPEEDUP),
        "--window", WINDOW, "--max-jobs", "20", "--max-duration", "60", "--json",
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    wall = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)

    assert (data["planned"], data["submitted"], data["completed"]) == (19, 19, 19)
    assert (data["failed"], data["cancelled"], data["lost"], data["left_running"]) == (0, 0, 0, [])
    assert data["skipped"] == {} and data["stopped_by"] == "window_end"
    # in turn to local-a (8), -b (4), -c (4): jobs 28 (6 -> c), 30 (9 -> b), 31 (10 -> c),
    # 33 (12 -> b), 34 (16 -> c), 36 (25 -> b), 37 (36 -> c)
    assert data["capped"] == 7
    assert wall < 60, f"the replay took {wall:.1f} s"
    assert data["lag_s"]["p95"] < 2.0, data["lag_s"]

    runtime = GridRuntime(
        default_grid(home), open_store(f"sqlite:///{home}/state.db", upgrade=True)
    )
    try:
        for job in data["jobs"]:
            site = runtime.adapter(job["site"])
            assert isinstance(site, LocalSite)
            status = site.status(job["job_id"])
            assert status.state is JobState.COMPLETED, (job, status)
            workdir = site.workdir(job["job_id"])
            assert (workdir / "job.sh").read_text().splitlines()[-1] == f"sleep {job['sleep_s']:g}"
            assert (workdir / TIME_LIMIT_FILE).read_text().strip() == str(job["time_limit_s"])
            assert job["time_limit_s"] >= job["sleep_s"]
            assert status.started_at is not None and status.finished_at is not None
            ran = status.finished_at - status.started_at
            assert job["sleep_s"] - 0.05 <= ran <= job["sleep_s"] + 3.0, (job, ran)
        assert sorted({j["site"] for j in data["jobs"]}) == ["local-a", "local-b", "local-c"]
    finally:
        runtime.store.dispose()
    assert _none_left_under(home / "sites") == []


def test_replayed_jobs_are_other_users_load_to_the_engines(home: Path) -> None:
    runtime = GridRuntime(
        default_grid(home), open_store(f"sqlite:///{home}/state.db", upgrade=True)
    )
    clock = FakeClock(0.0)
    try:
        # KTH 15 (4 processors, 3477 s) and 16 (25 -> 4, 2488 s) at speedup 100: 35 s and
        # 25 s sleeps on 4-processor local-b: one runs, the other waits behind it
        site_map = parse_site_map(["*=local-b"], runtime.grid.site_names)
        sites = [replay_site(runtime.adapter("local-b"))]
        settings = ReplaySettings(100.0, Window(599850, 600100))
        plan = plan_replay(iter_jobs(KTH), site_map, sites, settings)
        assert [(j.number, j.processors) for j in plan.jobs] == [(15, 4), (16, 4)]
        runner = ReplayRunner(plan, runtime.adapter, clock=clock)
        runner.check()
        runner.start()
        clock.now += 5.0
        assert runner.submit_due() == 2
        runner.poll()
        assert [j.state for j in runner.jobs] == [JobState.RUNNING, JobState.PENDING]

        runtime.refresh()
        with runtime.store.begin() as conn:
            snapshots = {s.site: s for s in runtime.snapshots.read(conn)}
            external = conn.execute(
                select(queue_waits.c.site_job_id, queue_waits.c.external).where(
                    queue_waits.c.site == "local-b"
                )
            ).all()
        b = snapshots["local-b"]
        # running: busy, so not idle; pending: others' queued work; none of it ours
        assert (b.total_processors, b.idle_processors) == (4, 0)
        assert (b.external_pending_processors, b.in_flight_processors) == (4, 0)
        assert b.free_processors == -4
        assert snapshots["local-a"].idle_processors == 8
        assert sorted(external) == sorted((j.job_id, True) for j in runner.jobs)

        # the default selection's estimate says so in its reason
        request = JobRequest("mine", 4, 10.0)
        decision = select_site(
            request, list(snapshots.values()), runtime.grid.bandwidth, DEFAULT_PROTOCOL,
            rng=random.Random(0),
        )  # fmt: skip
        estimate = decision.estimate_for("local-b")
        assert estimate is not None and decision.site != "local-b"
        assert (estimate.reported_idle, estimate.in_flight, estimate.others_queued) == (0, 0, 4)
        assert not estimate.fits and "others queued 4" in estimate.reason

        runner.stop()
        assert [j.state for j in runner.jobs] == [JobState.CANCELLED, JobState.CANCELLED]
        assert runner.report().left_running == ()
    finally:
        runtime.store.dispose()
    assert _none_left_under(home / "sites") == []


def _live_of_run(home: Path, run: str) -> dict[str, list[str]]:
    """Each local site's pending or running jobs named ``gcreplay-<run>-...``."""
    runtime = _runtime(home)
    try:
        return {
            spec.name: [
                j.job_id
                for j in runtime.adapter(spec.name).observe().jobs
                if (j.name or "").startswith(f"gcreplay-{run}-") and not j.state.finished
            ]
            for spec in runtime.grid.sites
        }
    finally:
        runtime.store.dispose()


def test_a_replay_killed_outright_is_cleaned_up_by_its_run_id(home: Path) -> None:
    sites = "*=local-a+local-b+local-c"
    # KTH 15, 16, 17 at speedup 100: due at 0, 1.7 and 6.3 s, sleeping 35, 25, 2153 s
    argv = [
        sys.executable, "-m", "gridcore.cli", "replay", str(KTH), "--site-map", sites,
        "--speedup", "100", "--window", "599850:600500", "--max-jobs", "3", "--json",
        "--db", f"sqlite:///{home}/state.db",  # the printed clean-up must name it too
    ]  # fmt: skip
    runtime = _runtime(home)
    try:  # someone else's job, beside the replay's
        other = runtime.adapter("local-a")
        other_id = other.submit(JobSubmission("someone", "sleep 60", 1))
    finally:
        runtime.store.dispose()
    stderr = home.parent / "replay.stderr"
    with stderr.open("w") as err:
        replay = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 30.0
        run = None
        while time.monotonic() < deadline and replay.poll() is None:
            found = re.search(r"^replay ([0-9a-f]{6}): submitting 3 jobs", stderr.read_text(), re.M)
            if found and sum(map(len, _live_of_run(home, run := found.group(1)).values())) == 3:
                break
            time.sleep(0.2)
        assert run is not None, stderr.read_text()[-3000:]
        replay.send_signal(signal.SIGKILL)  # no handler: it cancels nothing
        replay.wait(timeout=10)
    finally:
        if replay.poll() is None:
            replay.kill()
            replay.wait(timeout=10)
    printed = re.search(r"if this process is killed: (gridcore replay-cancel .*)$",
                        stderr.read_text(), re.M)  # fmt: skip
    assert printed is not None, stderr.read_text()[-3000:]
    assert printed.group(1) == shlex.join(
        [
            "gridcore",
            "replay-cancel",
            run,
            "--site-map",
            sites,
            "--db",
            f"sqlite:///{home}/state.db",
        ]
    )
    left = _live_of_run(home, run)
    assert sum(map(len, left.values())) == 3, left  # they outlive the replay

    # the command as printed
    cancel = [sys.executable, "-m", "gridcore.cli", *shlex.split(printed.group(1))[1:]]
    done = subprocess.run([*cancel, "--json"], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)
    assert (data["run"], data["found"], data["cancelled"], data["left_running"]) == (
        run, 3, 3, [],
    )  # fmt: skip
    assert {(j["site"], j["job_id"]) for j in data["jobs"]} == {
        (site, job_id) for site, ids in left.items() for job_id in ids
    }
    assert _live_of_run(home, run) == {"local-a": [], "local-b": [], "local-c": []}
    runtime = _runtime(home)
    try:
        for job in data["jobs"]:
            site = runtime.adapter(job["site"])
            assert isinstance(site, LocalSite)
            assert site.status(job["job_id"]).state is JobState.CANCELLED
            assert _none_left_under(site.workdir(job["job_id"])) == []
        assert runtime.adapter("local-a").status(other_id).state is JobState.RUNNING
    finally:
        runtime.store.dispose()
