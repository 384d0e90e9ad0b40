"""Storage plans run on a real local site (issue 10 items 5 and the fault tests): jobs
are real processes, volumes real files staged through the replica catalog, every volume a
holder of bytes in the capacity ledger. The bytes actually on the site's disk are sampled
during every run and never exceed the site's storage; at the end the ledger is
consistent and holds nothing; no job ran twice."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gridcore.engine.dataplan import (
    DataPlanRunner,
    PipelineJobFailed,
    PipelineRun,
    runtime_factory,
)
from gridcore.errors import ConfigError
from gridcore.policies.dataplan import Strategy
from gridcore.policies.dataplan_stages import plan_stages
from gridcore.sites import local as local_site
from gridcore.sites.local import LocalSite
from gridcore.state import capacity
from tests.dataplan_live import SITE, DiskSampler, LiveSetup, setup

REPO = Path(__file__).resolve().parents[2]


def make_run(
    live: LiveSetup, strategy: Strategy, concurrency: int, run_id: str = "r1"
) -> PipelineRun:
    stages = plan_stages(strategy, W=live.spec.W, D=live.spec.D, N_CPU=4, concurrency=concurrency)
    return PipelineRun(run_id, live.spec, SITE, strategy, stages, str(live.base / "home"))


def runner(live: LiveSetup, run: PipelineRun) -> DataPlanRunner:
    # a job that waits for room longer than this fails the test instead of hanging it
    return DataPlanRunner(
        live.grid, runtime_factory(live.grid, live.store), run, poll_s=0.05, room_wait_s=120
    )


def assert_clean(live: LiveSetup) -> None:
    with live.store.begin() as conn:
        assert capacity.check_invariant(conn) == []
        assert capacity.usage(conn)[SITE].storage_claimed == 0
        assert capacity.live_holds(conn, capacity.HolderKind.VOLUME) == []
    homes = sorted(
        p.relative_to(live.base / "home").as_posix()
        for p in (live.base / "home").rglob("*")
        if p.is_file()
    )
    assert homes == [f"p{p}/d{live.spec.D - 1}" for p in range(live.spec.W)]


@pytest.mark.parametrize(
    ("strategy", "concurrency", "storage_mb", "fetches"),
    [
        (Strategy.ALL, 4, 6.0, 2),  # every volume fits
        (Strategy.ALL_BATCH, 2, 2.9, 2),  # both batch volumes + 2 pairs of privates
        (Strategy.SLICE, 4, 2.4, 2),  # one batch volume at a time (Eq. 3's minimum)
        (Strategy.MINIMAL, 2, 1.65, 6),  # groups of 2 refetch every batch volume
    ],
)
def test_a_plan_runs_every_job_once_within_the_storage(
    tmp_path: Path, strategy: Strategy, concurrency: int, storage_mb: float, fetches: int
) -> None:
    live = setup(tmp_path, storage_bytes=int(storage_mb * 1e6))
    limit = int(storage_mb * 1e6)
    with DiskSampler(live.site_dir) as disk:
        report = runner(live, make_run(live, strategy, concurrency)).run()
    assert disk.samples > 10
    assert 0 < disk.peak <= limit, f"{disk.peak} bytes on disk > storage {limit}"
    assert report.peak_held_bytes <= limit
    assert report.jobs == live.spec.W * live.spec.D
    assert report.batch_stagings == fetches
    assert set(live.executions().values()) == {1}
    assert len(live.executions()) == live.spec.W * live.spec.D
    assert_clean(live)
    live.store.dispose()


def test_jobs_wait_for_room_rather_than_exceed_the_storage(tmp_path: Path) -> None:
    # AllBatch at a concurrency the storage cannot hold (an edited DAG): the ledger makes
    # the extra pipelines wait, the run completes and the disk never holds more.
    limit = int(2.5e6)  # two batch volumes + 3 privates
    live = setup(tmp_path, storage_bytes=limit)
    with DiskSampler(live.site_dir) as disk:
        runner(live, make_run(live, Strategy.ALL_BATCH, 4)).run()
    assert disk.peak <= limit
    assert set(live.executions().values()) == {1}
    assert_clean(live)
    live.store.dispose()


def test_an_evicted_batch_volume_is_staged_again_and_the_run_completes(tmp_path: Path) -> None:
    live = setup(tmp_path, storage_bytes=6 * 10**6, W=6, D=2, job_s=0.4)
    run = make_run(live, Strategy.ALL_BATCH, 2)
    r = runner(live, run)
    r.prepare()
    r.run_stage(run.stages[0])  # fetch both batch volumes
    replica = live.catalog.replica("live/batch1", SITE)
    assert replica is not None
    os.unlink(replica.url)  # someone deletes it from the site's disk
    report = r.run()
    assert report.batch_stagings == 3  # both fetched, then batch1 again (batch0 stayed)
    assert set(live.executions().values()) == {1}
    assert_clean(live)
    live.store.dispose()


def test_a_lost_private_input_restarts_its_pipeline_from_depth_zero(tmp_path: Path) -> None:
    # A node reset erases a pipeline's private data (the paper's failure): under AllBatch
    # the pipeline starts again from its first job; the others are not disturbed.
    live = setup(tmp_path, storage_bytes=6 * 10**6, W=2, D=3, job_s=0.1)
    run = make_run(live, Strategy.ALL_BATCH, 2)
    r = runner(live, run)
    r.prepare()
    r.run_stage(run.stages[0])
    r.run_job(0, 0)
    r.run_job(0, 1)  # its input (job 0's output) is evicted once it completed
    lost = r.private_path(0, 2)
    assert lost.is_file()
    lost.unlink()
    report = r.run()
    assert report.jobs == 8  # 6, and p0's first two again
    runs = live.executions()
    assert runs["p0/0"] == 2 and runs["p0/1"] == 2 and runs["p0/2"] == 1
    assert all(runs[f"p1/{d}"] == 1 for d in range(3))
    assert_clean(live)
    live.store.dispose()


def test_a_lost_input_inside_a_slice_fails_its_pipeline_and_holds_nothing_more(
    tmp_path: Path,
) -> None:
    # A Slice stage runs one depth: it cannot go back to depth 0, so the pipeline fails
    # naming the lost volume, and the job's output room is not held.
    live = setup(tmp_path, storage_bytes=6 * 10**6, W=2, D=2, job_s=0.1)
    run = make_run(live, Strategy.SLICE, 2)
    r = runner(live, run)
    r.prepare()
    for stage in run.stages[:3]:  # fetch d0, jobs d0, evict d0
        r.run_stage(stage)
    r.private_path(1, 1).unlink()
    r.run_stage(run.stages[3])  # fetch d1
    with pytest.raises(PipelineJobFailed, match=r"pipeline p1: the input of p1/d1 is gone"):
        r.run_stage(run.stages[4])
    with live.store.begin() as conn:
        assert capacity.check_invariant(conn) == []
        held = {h.holder for h in capacity.live_holds(conn, capacity.HolderKind.VOLUME)}
    assert held == {"live/batch1@alpha"}  # p0 finished; p1's volumes are all released
    assert live.executions()["p1/1"] == 0
    live.store.dispose()


def test_a_job_writing_more_than_declared_fails_and_releases_its_bytes(tmp_path: Path) -> None:
    live = setup(tmp_path, storage_bytes=6 * 10**6, W=1, D=1)
    depth = live.spec.depths[0]
    bad = type(depth)(
        depth.name,
        "head -c 200000 {batch} > {output}",
        depth.runtime_mean_s,
        100_000,
        batch=depth.batch,
    )
    spec = type(live.spec)("live", (bad,), live.spec.pipelines)
    stages = plan_stages(Strategy.ALL_BATCH, W=1, D=1, N_CPU=4, concurrency=1)
    run = PipelineRun("big", spec, SITE, Strategy.ALL_BATCH, stages, str(tmp_path / "home"))
    with pytest.raises(
        Exception, match=r"wrote 200000 bytes: depths\[0\].output_bytes declares 100000"
    ):
        runner(live, run).run()
    with live.store.begin() as conn:
        assert capacity.check_invariant(conn) == []
        held = {h.holder for h in capacity.live_holds(conn, capacity.HolderKind.VOLUME)}
    # the batch volume and the input are still staged; the output's bytes are back
    assert held == {"live/batch0@alpha", "live/in0@alpha"}
    live.store.dispose()


def test_a_pipeline_jobs_output_is_logged_and_a_failed_ones_stderr_tail_last(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Run inside an Airflow worker (operators/dataplan.py), this logger is the task's log.
    live = setup(tmp_path, storage_bytes=6 * 10**6, W=1, D=1)
    depth = live.spec.depths[0]
    noisy = type(depth)(
        depth.name,
        "echo 'pipeline {pipeline} depth {depth}'; echo 'disk full' >&2; exit 5",
        depth.runtime_mean_s,
        depth.output_bytes,
        batch=depth.batch,
    )
    spec = type(live.spec)("live", (noisy,), live.spec.pipelines)
    stages = plan_stages(Strategy.ALL_BATCH, W=1, D=1, N_CPU=4, concurrency=1)
    run = PipelineRun("noisy", spec, SITE, Strategy.ALL_BATCH, stages, str(tmp_path / "home"))
    logger = "gridcore.engine.dataplan"

    noisy_runner = runner(live, run)
    with (
        caplog.at_level(logging.INFO, logger=logger),
        pytest.raises(PipelineJobFailed, match="exit 5"),
    ):
        noisy_runner.run()

    ours = [r for r in caplog.records if r.name == logger]
    infos = [r.getMessage() for r in ours if r.levelno == logging.INFO]
    errors = [r.getMessage() for r in ours if r.levelno == logging.ERROR]
    label = f"[p0/d0 @ {SITE}]"
    assert f"{label} [stdout] pipeline p0 depth 0" in infos
    assert f"{label} [stderr] disk full" in infos
    assert errors[0].startswith(f"{label} [gridcore] stderr of the job (whole, 10 bytes in ")
    assert errors[1:] == [f"{label} [stderr] disk full"]
    # what the pipeline task's XCom names (operators/dataplan.py)
    files = noisy_runner.output_files(0, [0])["p0/d0"]
    assert files is not None
    assert Path(files["stdout"]).read_text() == "pipeline p0 depth 0\n"
    assert errors[0].endswith(f" bytes in {files['stderr']}):")
    live.store.dispose()


def test_remote_is_refused_on_a_live_site(tmp_path: Path) -> None:
    live = setup(tmp_path)
    with pytest.raises(ConfigError, match="Remote is not run on a live site"):
        runner(live, make_run(live, Strategy.REMOTE, 2))
    live.store.dispose()


_RUN_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from tests.dataplan_live import setup
    from tests.integration.test_dataplan_live import make_run, runner
    from gridcore.policies.dataplan import Strategy
    from gridcore.state.store import open_store
    base = Path({base!r})
    live = setup(base, storage_bytes=3_000_000, W=4, D=2, job_s=1.0)
    runner(live, make_run(live, Strategy(sys.argv[1]), 2)).run()
    """
)


@pytest.mark.parametrize("strategy", [Strategy.ALL_BATCH, Strategy.SLICE])
@pytest.mark.parametrize("kill_after_executions", [1, 3, 6])
def test_a_runner_killed_mid_run_is_resumed_without_running_a_job_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: Strategy, kill_after_executions: int
) -> None:
    """The runner (a worker) is SIGKILLed once ``kill_after_executions`` jobs have
    started; a new runner of the same run resumes it: every job ran once, the ledger is
    consistent and holds nothing at the end, the disk never held more than the storage."""
    script = _RUN_SCRIPT.format(repo=str(REPO), base=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-c", script, strategy.value],
        cwd=REPO,
        start_new_session=True,  # its site jobs are detached anyway; kill only the runner
    )
    runs_log = tmp_path / "runs.log"
    deadline = time.monotonic() + 60
    sampler = DiskSampler(tmp_path / SITE)
    with sampler:
        while time.monotonic() < deadline:
            if runs_log.exists() and len(runs_log.read_text().split()) >= kill_after_executions:
                break
            assert proc.poll() is None, "the runner ended before the kill"
            time.sleep(0.02)
        else:
            pytest.fail("no job started within 60 s")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # a job the killed runner marked running but never spawned is fenced and
        # started again after the grace, shortened here
        monkeypatch.setattr(local_site, "SPAWN_GRACE_S", 2.0)
        live = setup(tmp_path, storage_bytes=3_000_000, W=4, D=2, job_s=1.0)
        runner(live, make_run(live, strategy, 2)).run()
    assert sampler.peak <= 3_000_000
    assert set(live.executions().values()) == {1}, live.executions()
    assert len(live.executions()) == 8
    assert_clean(live)
    live.store.dispose()


class _Crash(BaseException):
    """The process dies here (a BaseException: nothing catches it on the way out)."""


def _crash_once(target: object, name: str, *, after: bool, pipeline: int = 1) -> None:
    """Make ``target.name`` die once, before or after doing its work, on its first call
    for ``pipeline`` (``pipeline`` is its first argument when it takes one)."""
    real = getattr(target, name)
    fired = []

    def wrapper(self: object, *args: object, **kwargs: object) -> object:
        mine = not args or not isinstance(args[0], int) or args[0] == pipeline
        if mine and not fired:
            fired.append(True)
            if not after:
                raise _Crash(name)
            real(self, *args, **kwargs)
            raise _Crash(name)
        return real(self, *args, **kwargs)

    setattr(target, name, wrapper)


@pytest.mark.parametrize(
    ("target", "step", "after"),
    [
        ("runner", "_claim_room", True),  # room held, nothing staged
        ("runner", "_submit", False),  # room held, input staged, nothing selected
        ("runtime", "select", True),  # selected, not submitted
        ("runtime", "submit", True),  # submitted, not yet waited for
        ("runner", "_register_output", False),  # job completed, output not registered
        ("runner", "_after_job", False),  # output registered, input not evicted
        ("runner", "_evict", True),  # a volume evicted, the next one not
        ("runner", "fetch_batch", True),  # a batch volume fetched, the next not
        ("site", "_insert", False),  # the site wrote the job's files, not its row
        ("site", "_spawn", False),  # the site marked the job running, did not spawn it
        ("site", "_spawn", True),  # the site spawned the job, the runner did not see it
    ],
)
def test_a_crash_at_every_step_of_a_job_is_resumed_without_doubling_or_leaking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, step: str, after: bool
) -> None:
    """The runner dies at each step of a job's transition (aimed: once, for pipeline 1's
    first call of that step); a new runner of the same run completes it: every job ran
    exactly once, the ledger is consistent and holds nothing, every output is home."""
    from gridcore.engine.runtime import GridRuntime

    live = setup(tmp_path, storage_bytes=3 * 10**6, W=3, D=2, job_s=0.1)
    owner = {"runner": DataPlanRunner, "runtime": GridRuntime, "site": LocalSite}[target]
    # a job recorded as running but never spawned is fenced and started again after
    # the grace, shortened here
    monkeypatch.setattr(local_site, "SPAWN_GRACE_S", 2.0)
    with monkeypatch.context() as patched:
        _crash_once_patched(patched, owner, step, after=after)
        with pytest.raises(_Crash):
            runner(live, make_run(live, Strategy.ALL_BATCH, 1)).run()
    report = runner(live, make_run(live, Strategy.ALL_BATCH, 1)).run()
    assert report.jobs <= 6
    assert set(live.executions().values()) == {1}, live.executions()
    assert len(live.executions()) == 6
    assert_clean(live)
    live.store.dispose()


def _crash_once_patched(
    patched: pytest.MonkeyPatch, owner: type, name: str, *, after: bool
) -> None:
    real = getattr(owner, name)
    patched.setattr(owner, name, real)  # restored when the context ends
    _crash_once(owner, name, after=after)


def test_runs_refine_the_runtimes_and_the_origin_rate_a_plan_is_made_with(
    tmp_path: Path,
) -> None:
    from gridcore.engine.dataplan import refine_from_runs

    live = setup(tmp_path, storage_bytes=6 * 10**6, W=3, D=2, job_s=0.3)
    before = refine_from_runs(live.spec, live.grid, live.store)
    assert before.spec == live.spec and before.notes == () and dict(before.measured) == {}
    runner(live, make_run(live, Strategy.ALL_BATCH, 3)).run()
    after = refine_from_runs(live.spec, live.grid, live.store)
    for depth in after.spec.depths:  # 3 jobs each, every one sleeping 0.3 s
        assert depth.runtime_mean_s >= 0.3
        assert depth.runtime_sd_s >= 0.0
    assert [n.split(":")[0] for n in after.notes[:2]] == ["depth d0", "depth d1"]
    assert "measured over 3 job(s), was 0.3 s" in after.notes[0]
    (rate,) = after.measured.values()  # staging 1 MB batch volumes recorded a rate
    assert rate["BW_R"] > 0
    # another workload's jobs (other pipeline names) are not taken for this one's
    other = type(live.spec)(
        "other", live.spec.depths, (type(live.spec.pipelines[0])("zz", 1, logical_name="x/y"),)
    )
    assert refine_from_runs(other, live.grid, live.store).spec == other
    live.store.dispose()


def test_a_failed_staging_gives_back_the_room_held_for_it(tmp_path: Path) -> None:
    live = setup(tmp_path, storage_bytes=6 * 10**6, W=1, D=1)
    (tmp_path / "origin" / "batch0.bin").write_bytes(b"not the registered bytes")
    run = make_run(live, Strategy.ALL_BATCH, 1)
    with pytest.raises(Exception, match="live/batch0"):
        runner(live, run).run()
    with live.store.begin() as conn:
        assert capacity.check_invariant(conn) == []
        assert capacity.usage(conn)[SITE].storage_claimed == 0
    assert live.executions() == {}
    live.store.dispose()
