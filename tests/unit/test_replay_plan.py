"""The plan of ``gridcore replay`` (gridcore.workloads.replay): which log job goes where,
when, with what size, sleep and time limit, what is skipped and why, where the plan
stops (and that it reads the log no further), and the command's options refused by
name. Real log heads from tests/data/swf."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gridcore.errors import ConfigError
from gridcore.workloads.replay import (
    SLURM_LIMIT_STEP_S,
    Oversize,
    ReplayError,
    ReplayPlan,
    ReplaySettings,
    ReplaySite,
    SkipReason,
    StopReason,
    Window,
    check_settings,
    parse_site_map,
    parse_window,
    plan_replay,
)
from gridcore.workloads.swf import SwfJob, SwfStatus, iter_jobs

DATA = Path(__file__).resolve().parents[1] / "data" / "swf"
KTH = DATA / "kth-sp2-head.swf.gz"
TWO_CLUSTERS = DATA / "two-clusters.swf"
SITES = (ReplaySite("a", 8), ReplaySite("b", 4), ReplaySite("s", 16, SLURM_LIMIT_STEP_S))
# KTH jobs 20..38: submitted 605396..608745 s, sizes 1..36, runs 4..1074 s
KTH_WINDOW = Window(605396, 608800)


def _job(number: int, submit_s: float, **fields: object) -> SwfJob:
    values: dict[str, object] = {
        "number": number, "submit_s": submit_s, "wait_s": 0.0, "run_s": 100.0,
        "processors": 4, "cpu_s": None, "memory_kb": None, "requested_processors": 4,
        "requested_s": 200.0, "requested_memory_kb": None, "status": SwfStatus.COMPLETED,
        "user": 1, "group": 1, "executable": None, "queue": None, "partition": None,
        "preceding_job": None, "think_s": None, "line": number,
    }  # fmt: skip
    values.update(fields)
    return SwfJob(**values)  # type: ignore[arg-type]


def _plan(jobs: Iterable[SwfJob], site_map: str = "*=a", **settings: Any) -> ReplayPlan:
    options: dict[str, Any] = {"speedup": 100.0} | settings
    return plan_replay(
        jobs,
        parse_site_map([site_map], ["a", "b", "s"]),
        SITES,
        ReplaySettings(**options),
    )


def test_kth_head_at_speedup_100_submit_times_sizes_sleeps_and_limits() -> None:
    plan = _plan(iter_jobs(KTH), "*=a", window=KTH_WINDOW)
    jobs = {j.number: j for j in plan.jobs}
    assert sorted(jobs) == list(range(20, 39))
    assert plan.stopped_by is StopReason.WINDOW_END
    first, long_one = jobs[20], jobs[32]
    # 20: submitted at the window's start, 16 s run, 60 s requested, 1 processor
    assert (first.at_s, first.sleep_s, first.time_limit_s, first.processors) == (0.0, 0.16, 1, 1)
    assert first.command == "sleep 0.16"
    # 32: 608387 s -> 29.91 s after the start; 1074 s run; 9000 s requested
    assert long_one.at_s == pytest.approx((608387 - 605396) / 100)
    assert (long_one.sleep_s, long_one.time_limit_s, long_one.site_limit_s) == (10.74, 90, 90)
    # 34 asked 16 processors of an 8-processor site: capped, and said so
    assert (jobs[34].processors, jobs[34].log_processors, jobs[34].capped) == (8, 16, True)
    assert plan.capped() == 6  # 30 (9), 31 (10), 33 (12), 34 (16), 36 (25), 37 (36)
    assert not any(j.expected_timeout for j in plan.jobs)
    assert [j.at_s for j in plan.jobs] == sorted(j.at_s for j in plan.jobs)


def test_a_slurm_site_enforces_whole_minutes_rounded_up() -> None:
    plan = _plan([_job(1, 0, run_s=500.0, requested_s=6100.0)], "*=s")
    job = plan.jobs[0]
    assert (job.time_limit_s, job.site_limit_s) == (61, 120)
    local = _plan([_job(1, 0, run_s=500.0, requested_s=6100.0)], "*=a").jobs[0]
    assert (local.time_limit_s, local.site_limit_s) == (61, 61)


def test_a_job_that_ran_past_its_request_is_expected_to_time_out_where_the_limit_holds() -> None:
    over = _job(1, 0, run_s=6150.0, requested_s=6000.0)  # 61.5 s sleep, 60 s limit
    local = _plan([over], "*=a").jobs[0]
    slurm = _plan([over], "*=s").jobs[0]
    assert (local.sleep_s, local.site_limit_s, local.expected_timeout) == (61.5, 60, True)
    assert (slurm.site_limit_s, slurm.expected_timeout) == (60, True)
    within_a_minute = _plan([_job(1, 0, run_s=5000.0, requested_s=4900.0)], "*=s").jobs[0]
    # 50 s sleep, 49 s asked: Slurm enforces 60 s, so it runs to its end there
    assert (within_a_minute.time_limit_s, within_a_minute.site_limit_s) == (49, 60)
    assert not within_a_minute.expected_timeout


def test_unknown_requested_time_gives_the_run_time_as_limit_and_is_counted() -> None:
    job = _plan([_job(1, 0, run_s=250.0, requested_s=None)]).jobs[0]
    assert (job.sleep_s, job.time_limit_s, job.limit_from_run_time) == (2.5, 3, True)
    assert not job.expected_timeout


def test_two_clusters_partitions_map_to_sites_and_each_skip_has_its_reason() -> None:
    plan = _plan(iter_jobs(TWO_CLUSTERS), "1=a,2=b", speedup=1.0)
    assert [(j.number, j.site) for j in plan.jobs] == [(1, "a"), (3, "a")]
    # 2: cancelled before it ran (run time unknown); 4: no processor count at all;
    # 5, 6, 7: lines of partial executions (SWF status 2, 3, 4)
    assert plan.skipped == {
        SkipReason.RUN_TIME_UNKNOWN: 1,
        SkipReason.SIZE_UNKNOWN: 1,
        SkipReason.PARTIAL_LINE: 3,
    }
    assert plan.skipped_jobs[SkipReason.PARTIAL_LINE] == (5, 6, 7)
    only_one = _plan(iter_jobs(TWO_CLUSTERS), "1=a", speedup=1.0)
    # its partition-2 jobs are skipped for what they lack before their partition is asked
    assert SkipReason.PARTITION_UNMAPPED not in only_one.skipped
    jobs = [_job(1, 0, partition=1), _job(2, 1, partition=2), _job(3, 2, partition=None)]
    routed = _plan(jobs, "1=a")
    assert [j.number for j in routed.jobs] == [1]
    assert routed.skipped == {SkipReason.PARTITION_UNMAPPED: 2}
    star = _plan(jobs, "1=a,*=b")
    assert [(j.number, j.site) for j in star.jobs] == [(1, "a"), (2, "b"), (3, "b")]


def test_a_partition_mapped_to_several_sites_sends_its_jobs_in_turn() -> None:
    jobs = [_job(n, n) for n in range(1, 6)]
    plan = _plan(jobs, "*=a+b+s")
    assert [j.site for j in plan.jobs] == ["a", "b", "s", "a", "b"]


def test_oversized_jobs_are_capped_or_skipped_as_asked() -> None:
    jobs = [_job(1, 0, processors=6), _job(2, 1, processors=4), _job(3, 2, processors=64)]
    capped = _plan(jobs, "*=b")
    assert [(j.processors, j.log_processors) for j in capped.jobs] == [(4, 6), (4, 4), (4, 64)]
    assert capped.capped("b") == 2 and capped.skipped == {}
    skipped = _plan(jobs, "*=b", oversize=Oversize.SKIP)
    assert [j.number for j in skipped.jobs] == [2]
    assert skipped.skipped == {SkipReason.OVERSIZE: 2}


def test_a_skipped_oversized_job_does_not_take_a_turn_of_its_sites() -> None:
    jobs = [_job(1, 0, processors=6), _job(2, 1, processors=2), _job(3, 2, processors=2)]
    plan = _plan(jobs, "*=b+a", oversize=Oversize.SKIP)
    # job 1 is too big for b (its turn): skipped; b's turn is then job 2's
    assert [(j.number, j.site) for j in plan.jobs] == [(2, "b"), (3, "a")]


def _log_that_must_not_be_read_past(jobs: list[SwfJob]) -> Iterator[SwfJob]:
    yield from jobs
    raise AssertionError("the plan read the log past where it stops")


@pytest.mark.parametrize(
    ("settings", "stopped_by", "planned"),
    [
        ({"max_jobs": 2}, StopReason.MAX_JOBS, [1, 2]),
        ({"window": Window(1000, 2500)}, StopReason.WINDOW_END, [2, 3]),
        # due at (3000 - 0) / 100 = 30 s: past a 25 s replay
        ({"max_duration_s": 25.0}, StopReason.MAX_DURATION, [1, 2, 3]),
    ],
    ids=["max-jobs", "window-end", "max-duration"],
)
def test_the_plan_stops_and_reads_no_further(
    settings: dict[str, Any], stopped_by: StopReason, planned: list[int]
) -> None:
    jobs = [_job(n, (n - 1) * 1000.0) for n in range(1, 6)]
    plan = _plan(_log_that_must_not_be_read_past(jobs), **settings)
    assert plan.stopped_by is stopped_by
    assert [j.number for j in plan.jobs] == planned


def test_the_window_shifts_the_clock_and_the_speedup_divides_it() -> None:
    jobs = [_job(1, 500.0), _job(2, 1000.0), _job(3, 1600.0)]
    plan = _plan(jobs, window=Window(900.0, None), speedup=20.0)
    assert [(j.number, j.at_s) for j in plan.jobs] == [(2, 5.0), (3, 35.0)]
    assert plan.stopped_by is StopReason.END_OF_LOG
    assert plan.window_json == {"start_s": 900.0, "end_s": None}
    # no start: the replay's start stands for the first job's submit time
    from_first = _plan(jobs, speedup=20.0)
    assert [(j.number, j.at_s) for j in from_first.jobs] == [(1, 0.0), (2, 25.0), (3, 55.0)]
    assert from_first.origin_s == 500.0


def test_an_empty_plan_says_why() -> None:
    far = _plan(iter_jobs(KTH), speedup=1.0, window=Window(0.0, None))
    # KTH's head starts at log second 599850: at speedup 1 not due within 600 s
    assert far.jobs == () and far.stopped_by is StopReason.MAX_DURATION
    assert far.why_empty() == (
        "no job is due before --max-duration 600 s after the window's start (log second 0)"
    )
    late = _plan(iter_jobs(KTH), window=Window(1e9, None))
    assert late.why_empty() == "the log has no job in the window"
    unmapped = _plan([_job(1, 0, partition=2)], "1=a")
    assert unmapped.why_empty() == "skipped: 1 partition_unmapped; stopped by end_of_log"


def test_a_site_the_map_names_needs_its_size() -> None:
    with pytest.raises(ReplayError, match="no size given for site"):
        plan_replay([], parse_site_map(["*=c"], ["c"]), SITES, ReplaySettings(1.0))


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([], "give at least one PARTITION=SITE"),
        ([""], "give at least one PARTITION=SITE"),
        (["alpha"], "--site-map 'alpha': not PARTITION=SITE"),
        (["=a"], "--site-map '=a': not PARTITION=SITE"),
        (["x=a"], "partition 'x' is neither a number"),
        (["-1=a"], "partition '-1' is neither a number"),
        (["1=a", "01=b"], "partition 1 is mapped twice"),
        (["*=a,*=b"], "partition \\* is mapped twice"),
        (["1=zeta"], "unknown site 'zeta' \\(the grid has: a, b, s\\)"),
        (["1=a+"], "unknown site ''"),
    ],
)
def test_site_map_refusals_name_the_option_and_entry(entries: list[str], message: str) -> None:
    with pytest.raises(ReplayError, match=message) as caught:
        parse_site_map(entries, ["a", "b", "s"])
    assert isinstance(caught.value, ConfigError)  # the command exits 2
    assert "--site-map" in str(caught.value)


def test_site_map_entries_may_be_repeated_or_comma_separated() -> None:
    one = parse_site_map(["1=a, 2=b+s", "*=a"], ["a", "b", "s"])
    assert dict(one.routes) == {"1": ("a",), "2": ("b", "s"), "*": ("a",)}
    assert one.sites_for(2) == ("b", "s") and one.sites_for(None) == ("a",)
    assert one.sites_for(9) == ("a",) and one.site_names == ("a", "b", "s")


@pytest.mark.parametrize(
    ("text", "window"),
    [
        ("0:", Window(0.0, None)),
        (":2d", Window(None, 172800.0)),
        (":", Window(None, None)),
        ("1h:90m", Window(3600.0, 5400.0)),
        ("605396:608800", Window(605396.0, 608800.0)),
        ("1.5h:", Window(5400.0, None)),
    ],
)
def test_windows(text: str, window: Window) -> None:
    assert parse_window(text) == window


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("100", "not START:END"),
        ("x:", "START 'x' is not a duration"),
        ("0:1w", "END '1w' is not a duration"),
        ("-5:", "START '-5' is not a duration"),
        ("2h:1h", "END must be after START"),
    ],
)
def test_window_refusals_name_the_option(text: str, message: str) -> None:
    with pytest.raises(ReplayError, match=message) as caught:
        parse_window(text)
    assert str(caught.value).startswith(f"--window {text!r}")


@pytest.mark.parametrize(
    ("speedup", "max_jobs", "max_duration", "message"),
    [
        (0.0, 10, 60.0, "--speedup 0"),
        (float("nan"), 10, 60.0, "--speedup nan"),
        (-2.0, 10, 60.0, "--speedup -2"),
        (10.0, 0, 60.0, "--max-jobs 0"),
        (10.0, 10, 0.0, "--max-duration 0"),
        (10.0, 10, float("inf"), "--max-duration inf"),
    ],
)
def test_settings_refusals_name_the_option(
    speedup: float, max_jobs: int, max_duration: float, message: str
) -> None:
    with pytest.raises(ReplayError, match=message):
        check_settings(speedup, max_jobs, max_duration)


def test_a_job_of_no_run_time_sleeps_zero_and_still_has_a_limit() -> None:
    job = _plan([_job(1, 0, run_s=0.0, requested_s=0.0)]).jobs[0]
    assert (job.command, job.time_limit_s, job.limit_from_run_time) == ("sleep 0", 1, True)
    assert replace(job, sleep_s=1.25).command == "sleep 1.25"
