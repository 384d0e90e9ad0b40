"""The replay runner (gridcore.engine.replay) on in-memory sites (tests/fakes.FakeSite)
and a hand-moved clock: jobs at their times as others' jobs (no key), the end (wait,
then cancel at the deadline; or cancel at once), an interrupt that cancels what was
submitted (also one arriving while a site accepts a job), refusals and failures
counted, a lost answer found by the job's name, the summary's figures; and the clean-up
after a replay killed outright (``cancel_run``: its run's jobs only)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from gridcore.engine.replay import (
    MAX_CANCEL_ATTEMPTS,
    AtEnd,
    ReplayRunner,
    cancel_run,
    replay_site,
)
from gridcore.errors import AnswerLost, RequestError, SiteRejected, SiteUnavailable
from gridcore.model import JobResources, JobState, JobSubmission, SiteKind, SiteSpec
from gridcore.workloads.replay import (
    ReplayError,
    ReplaySettings,
    ReplaySite,
    SkipReason,
    parse_site_map,
    plan_replay,
)
from gridcore.workloads.swf import SwfJob, SwfStatus
from tests.fakes import FakeClock, FakeSite, FaultySite


def _job(number: int, submit_s: float, processors: int = 2, run_s: float = 100.0) -> SwfJob:
    return SwfJob(
        number, submit_s, 0.0, run_s, processors, None, None, processors, 2 * run_s, None,
        SwfStatus.COMPLETED, 1, 1, None, None, None, None, None, number,
    )  # fmt: skip


class Grid:
    """Two fake sites whose jobs run their sleep once started (at submission) and end;
    the runner's sleep moves the clock and lets the sites' jobs end."""

    def __init__(self) -> None:
        self.clock = FakeClock(1000.0)
        self.sites = {
            name: FakeSite(SiteSpec(name, SiteKind.LOCAL, cpus), clock=self.clock)
            for name, cpus in (("a", 8), ("b", 4))
        }
        self.runs_jobs = True
        self.interrupt_at: float | None = None
        self.runner: ReplayRunner | None = None

    def adapter(self, name: str) -> Any:
        return self.sites[name]

    def sleep(self, seconds: float) -> None:
        self.clock.now += max(seconds, 0.01)
        if self.interrupt_at is not None and self.clock.now >= self.interrupt_at:
            self.interrupt_at = None
            assert self.runner is not None
            self.runner.interrupt("SIGTERM")
        if not self.runs_jobs:
            return
        for site in self.sites.values():
            for job in site.jobs.values():
                sleep_s = float(job.submission.command.split()[1])
                if not job.state.finished and job.submitted_at + sleep_s <= self.clock.now:
                    site.finish(job.job_id)


def _runner(grid: Grid, jobs: list[SwfJob], **options: Any) -> ReplayRunner:
    settings: dict[str, Any] = {"speedup": 10.0, "max_duration_s": 60.0}
    settings.update(options.pop("settings", {}))
    plan = plan_replay(
        jobs,
        parse_site_map([options.pop("site_map", "*=a+b")], ["a", "b"]),
        [ReplaySite("a", 8), ReplaySite("b", 4)],
        ReplaySettings(**settings),
    )
    options.setdefault("run", "t1")
    grid.runner = ReplayRunner(plan, grid.adapter, clock=grid.clock, sleep=grid.sleep, **options)
    return grid.runner


@pytest.fixture
def grid() -> Iterator[Grid]:
    yield Grid()


def test_jobs_go_at_their_times_as_others_jobs_and_the_replay_ends_when_they_do(
    grid: Grid,
) -> None:
    # 0, 50, 120 log s at speedup 10: 0, 5, 12 s; runs 100 s: sleeps of 10 s
    runner = _runner(grid, [_job(1, 0), _job(2, 50), _job(3, 120, processors=12)])
    runner.check()
    report = runner.run()
    data = report.as_json()

    submitted = [j for site in grid.sites.values() for j in site.jobs.values()]
    assert sorted(j.submission.name for j in submitted) == [
        "gcreplay-t1-1",
        "gcreplay-t1-2",
        "gcreplay-t1-3",
    ]
    # no key: no engine takes them for its own (orphans, holds, queue-wait history)
    assert all(j.key is None for j in submitted)
    by_name = {j.submission.name: j for j in submitted}
    third = by_name["gcreplay-t1-3"]
    assert third.submission.command == "sleep 10"
    assert third.submission.resources == JobResources(time_limit_s=20)
    assert third.submission.processors == 8  # 12 asked, site a has 8: capped
    assert [by_name[f"gcreplay-t1-{n}"].submitted_at - 1000.0 for n in (1, 2, 3)] == [
        0.0,
        5.0,
        12.0,
    ]
    assert (data["submitted"], data["completed"], data["capped"]) == (3, 3, 1)
    assert data["lag_s"] == {"median": 0.0, "p95": 0.0, "max": 0.0}
    assert data["left_running"] == [] and report.ok and data["interrupted"] is None
    assert data["sites"] == {
        "a": {"submitted": 2, "capped": 1, "completed": 2, "failed": 0, "cancelled": 0,
              "refused": 0, "submit_failed": 0},
        "b": {"submitted": 1, "capped": 0, "completed": 1, "failed": 0, "cancelled": 0,
              "refused": 0, "submit_failed": 0},
    }  # fmt: skip
    # it stopped once the last job ended (12 s + 10 s), not at the 60 s deadline
    assert grid.clock.now - 1000.0 < 25.0
    assert [j["state"] for j in data["jobs"]] == ["completed"] * 3


def test_jobs_still_running_at_the_deadline_are_cancelled(grid: Grid) -> None:
    grid.runs_jobs = False
    report = _runner(grid, [_job(1, 0), _job(2, 100)], settings={"max_duration_s": 30.0}).run()
    data = report.as_json()
    assert (data["cancelled"], data["cancelled_by_replay"], data["left_running"]) == (2, 2, [])
    assert 30.0 <= grid.clock.now - 1000.0 < 31.0
    assert sorted(grid.sites["a"].cancelled + grid.sites["b"].cancelled) == ["1", "1"]


class CancelFails(FaultySite):
    """Site a, whose cancel raises a site error the first ``failures`` times."""

    def __init__(self, inner: FakeSite, failures: int) -> None:
        super().__init__(inner)
        self.failures = failures
        self.cancel_calls = 0

    def cancel(self, job_id: str) -> None:
        self.cancel_calls += 1
        if self.cancel_calls <= self.failures:
            raise SiteUnavailable("a", "slurmrestd: connection reset")
        self.inner.cancel(job_id)


def test_a_cancel_that_failed_once_is_asked_again_after_the_next_poll(grid: Grid) -> None:
    grid.runs_jobs = False
    flaky = CancelFails(grid.sites["a"], failures=1)
    runner = _runner(grid, [_job(1, 0)], site_map="*=a", at_end=AtEnd.CANCEL)
    runner.adapter = {"a": flaky}.__getitem__
    data = runner.run().as_json()
    assert (data["cancelled_by_replay"], data["left_running"]) == (1, [])
    assert flaky.cancel_calls == 2 and grid.sites["a"].cancelled == ["1"]


def test_a_job_the_site_never_cancels_is_asked_a_bounded_number_of_times_and_reported(
    grid: Grid,
) -> None:
    grid.runs_jobs = False
    broken = CancelFails(grid.sites["a"], failures=1000)
    runner = _runner(grid, [_job(1, 0)], site_map="*=a", at_end=AtEnd.CANCEL)
    runner.adapter = {"a": broken}.__getitem__
    report = runner.run()
    assert not report.ok and broken.cancel_calls == MAX_CANCEL_ATTEMPTS
    assert report.as_json()["left_running"] == [
        {"site": "a", "job_id": "1", "cancel_error": "site a: slurmrestd: connection reset"}
    ]


def test_at_end_cancel_stops_once_the_last_job_is_submitted(grid: Grid) -> None:
    grid.runs_jobs = False
    report = _runner(grid, [_job(1, 0), _job(2, 100)], at_end=AtEnd.CANCEL).run()
    assert report.as_json()["cancelled_by_replay"] == 2
    assert grid.clock.now - 1000.0 < 11.0  # the last job was due at 10 s


def test_an_interrupt_cancels_what_was_submitted_and_submits_nothing_more(grid: Grid) -> None:
    grid.runs_jobs = False
    grid.interrupt_at = 1007.0
    report = _runner(grid, [_job(1, 0), _job(2, 50), _job(3, 120)]).run()
    data = report.as_json()
    assert data["interrupted"] == "SIGTERM"
    assert (data["submitted"], data["cancelled_by_replay"], data["left_running"]) == (2, 2, [])
    assert sum(len(s.jobs) for s in grid.sites.values()) == 2  # job 3 (due at 12 s) never went


def test_a_signal_while_a_site_accepts_a_job_comes_after_the_job_is_recorded(
    grid: Grid,
) -> None:
    runner = _runner(grid, [_job(1, 0), _job(2, 50)], site_map="*=a")

    def handler(signum: int, frame: object) -> None:
        runner.interrupt(signal.Signals(signum).name)

    main = threading.get_ident()
    grid.sites["a"].after_accept = lambda job: signal.pthread_kill(main, signal.SIGTERM)
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        report = runner.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    # the signal only stopped the replay: job 1 was recorded and cancelled, job 2 never went
    assert report.interrupted == "SIGTERM"
    assert list(grid.sites["a"].jobs) == ["1"] and grid.sites["a"].cancelled == ["1"]
    assert report.as_json()["cancelled_by_replay"] == 1


def test_jobs_a_site_could_never_run_are_refused_before_anything_is_submitted(
    grid: Grid,
) -> None:
    grid.sites["b"] = FakeSite(SiteSpec("b", SiteKind.LOCAL, 2), clock=grid.clock)
    runner = _runner(grid, [_job(1, 0, processors=1), _job(2, 10, processors=3)], site_map="*=b")
    runner.check()
    assert [j.planned.number for j in runner.jobs] == [1]
    data = runner.run().as_json()
    assert data["skipped"] == {SkipReason.REFUSED.value: 1}
    assert data["sites"]["b"]["refused"] == 1 and data["submitted"] == 1


def test_the_largest_job_a_site_accepts_is_its_cap() -> None:
    class TwoNodes(FakeSite):  # 8 CPUs in all, 4 per node: a job runs on one node
        def check_request(self, name: str, processors: int, resources: JobResources) -> None:
            if processors > 4:
                raise RequestError(f"processors: {processors} exceeds the largest node")

    assert replay_site(TwoNodes(SiteSpec("t", SiteKind.LOCAL, 8))) == ReplaySite("t", 4, 1)
    slurm = FakeSite(SiteSpec("s", SiteKind.SLURM, 16, url="http://x"))
    assert replay_site(slurm) == ReplaySite("s", 16, 60)


def test_failed_and_lost_submissions_are_counted_and_the_replay_goes_on(grid: Grid) -> None:
    fake_a = grid.sites["a"]
    failing = FaultySite(fake_a, submit_error=SiteRejected("a", "queue full"))
    sites: dict[str, Any] = {"a": failing, "b": grid.sites["b"]}
    runner = _runner(grid, [_job(1, 0), _job(2, 10), _job(3, 20)])
    runner.adapter = sites.__getitem__
    data = runner.run().as_json()
    assert (data["submitted"], data["skipped"]) == (1, {SkipReason.SUBMIT_FAILED.value: 2})
    assert data["sites"]["a"]["submit_failed"] == 2
    failing.submit_error = AnswerLost("a", "no answer within 10 s")
    lost = _runner(grid, [_job(4, 0)], site_map="*=a")
    lost.adapter = sites.__getitem__
    assert lost.run().as_json()["lost"] == 1


def test_lag_is_achieved_minus_intended_in_wall_and_log_seconds(grid: Grid) -> None:
    slow = FaultySite(grid.sites["a"])

    def submit_taking_two_seconds(job: Any) -> str:
        grid.clock.now += 2.0
        return str(grid.sites["a"].submit(job))

    slow.submit = submit_taking_two_seconds  # type: ignore[method-assign]
    runner = _runner(grid, [_job(1, 0), _job(2, 10), _job(3, 20), _job(4, 30)], site_map="*=a")
    runner.adapter = {"a": slow}.__getitem__
    data = runner.run().as_json()
    # each submission returns 2 s after it began, and jobs due 1 s apart queue behind
    # each other: lags 2, 3, 4, 5 s
    assert data["lag_s"] == {"median": 3.5, "p95": 4.85, "max": 5.0}
    assert data["lag_log_s"]["median"] == pytest.approx(35.0)


def test_the_summary_names_its_settings() -> None:
    grid = Grid()
    runner = _runner(grid, [_job(1, 0)], settings={"speedup": 4.0})
    data = runner.run().as_json()
    assert {k: data[k] for k in ("speedup", "max_jobs", "max_duration_s", "at_end")} == {
        "speedup": 4.0, "max_jobs": 100, "max_duration_s": 60.0, "at_end": "wait",
    }  # fmt: skip
    assert data["window"] == {"start_s": 0.0, "end_s": None}  # its first job's time
    assert data["stopped_by"] == "end_of_log" and data["oversize"] == "cap"
    assert replace(runner.plan.jobs[0], sleep_s=0.5).command == "sleep 0.5"
    assert data["jobs"][0]["state"] == JobState.COMPLETED.value


class AnswerLostAfterAccepting(FaultySite):
    """Site a, which makes the job and then loses its answer (a Slurm call that timed
    out after slurmctld accepted it)."""

    def submit(self, job: Any) -> str:
        self.inner.submit(job)
        raise AnswerLost("a", "no answer within 10 s")


def test_a_lost_answer_is_found_by_the_jobs_name_and_followed_and_cancelled(
    grid: Grid,
) -> None:
    grid.runs_jobs = False
    lossy = AnswerLostAfterAccepting(grid.sites["a"])
    # another run's job of the same log job number is not it
    grid.sites["a"].submit(JobSubmission("gcreplay-t0-1", "sleep 9", 1))
    runner = _runner(grid, [_job(1, 0), _job(2, 10)], site_map="*=a", at_end=AtEnd.CANCEL)
    runner.adapter = {"a": lossy}.__getitem__
    runner.start()
    assert runner.submit_due() == 0  # job 1's answer was lost
    runner.poll()
    first = runner.jobs[0]
    assert (first.job_id, first.state) == ("2", JobState.PENDING)  # adopted by its name
    report = runner.run()
    data = report.as_json()
    assert (data["lost"], data["lost_found"], data["submitted"]) == (0, 2, 2)
    assert (data["cancelled_by_replay"], data["left_running"]) == (2, [])
    assert sorted(grid.sites["a"].cancelled) == ["2", "3"]
    assert grid.sites["a"].jobs["1"].state is JobState.PENDING  # gcreplay-t0-1: not ours


def test_a_lost_answer_that_made_no_job_stays_lost(grid: Grid) -> None:
    lossy = FaultySite(grid.sites["a"], submit_error=AnswerLost("a", "no answer"))
    grid.sites["a"].submit(JobSubmission("gcreplay-t1-1", "sleep 9", 1, key="gc-x-s1"))
    runner = _runner(grid, [_job(1, 0)], site_map="*=a", at_end=AtEnd.CANCEL)
    runner.adapter = {"a": lossy}.__getitem__
    data = runner.run().as_json()
    # the keyed job of that name is some engine's, not the replay's
    assert (data["lost"], data["lost_found"], data["submitted"]) == (1, 0, 0)
    assert grid.sites["a"].cancelled == []


def _killed_replay(grid: Grid, run: str, jobs: list[SwfJob]) -> ReplayRunner:
    """A replay whose process was killed outright: it submitted its due jobs, then its
    runner was abandoned (no stop(), no cancel)."""
    runner = _runner(grid, jobs, run=run)
    runner.start()
    runner.submit_due()
    return runner


def test_the_jobs_of_a_killed_replay_are_cancelled_by_its_run_id_and_no_other(
    grid: Grid,
) -> None:
    grid.runs_jobs = False
    killed = _killed_replay(grid, "k1", [_job(1, 0), _job(2, 0), _job(3, 0)])
    other = _killed_replay(grid, "k12", [_job(4, 0)])  # a run whose id starts with k1
    grid.sites["a"].submit(JobSubmission("mine", "sleep 9", 1, key="gc-0123456789ab-s1"))
    grid.sites["b"].submit(JobSubmission("gcreplay-k1-keyed", "sleep 9", 1, key="gc-x-s2"))
    grid.sites["b"].submit(JobSubmission("someone", "sleep 9", 1))
    grid.sites["a"].finish("1")  # k1's job 1 ended by itself before the clean-up
    ours = {(j.planned.site, j.job_id) for j in killed.jobs}
    assert len(ours) == 3 and all(j.live for j in killed.jobs)

    report = cancel_run("k1", ["a", "b"], grid.adapter, clock=grid.clock, sleep=grid.sleep)
    data = report.as_json()
    assert report.ok and (data["found"], data["cancelled"], data["left_running"]) == (2, 2, [])
    assert {(j["site"], j["job_id"]) for j in data["jobs"]} == ours - {("a", "1")}
    assert data["prefix"] == "gcreplay-k1-" and data["unread_sites"] == {}
    cancelled = {(s, i) for s, site in grid.sites.items() for i in site.cancelled}
    assert cancelled == ours - {("a", "1")}
    untouched = [j for site in grid.sites.values() for j in site.jobs.values() if j.state
                 is JobState.PENDING]  # fmt: skip
    assert sorted(j.submission.name for j in untouched) == [
        "gcreplay-k1-keyed", "gcreplay-k12-4", "mine", "someone",
    ]  # fmt: skip
    assert other.jobs[0].live
    again = cancel_run("k1", ["a", "b"], grid.adapter, clock=grid.clock, sleep=grid.sleep)
    assert again.ok and again.as_json()["found"] == 0


def test_another_users_job_of_the_runs_name_is_never_cancelled_or_adopted(
    grid: Grid,
) -> None:
    # slurmrestd lists every user's jobs: one of another user's may carry the name
    grid.runs_jobs = False
    for site in grid.sites.values():
        site.user = "me"
    killed = _killed_replay(grid, "k5", [_job(1, 0)])
    theirs_id = grid.sites["b"].submit(JobSubmission("gcreplay-k5-1", "sleep 9", 1))
    grid.sites["b"].jobs[theirs_id].user = "them"
    report = cancel_run("k5", ["a", "b"], grid.adapter, clock=grid.clock, sleep=grid.sleep)
    assert report.as_json()["found"] == 1
    assert {(j["site"], j["job_id"]) for j in report.as_json()["jobs"]} == {
        (j.planned.site, j.job_id) for j in killed.jobs
    }
    assert grid.sites["b"].jobs[theirs_id].state is JobState.PENDING


def test_the_clean_up_asks_again_and_reports_what_it_could_not_cancel(grid: Grid) -> None:
    grid.runs_jobs = False
    _killed_replay(grid, "k2", [_job(1, 0), _job(2, 0)])  # one job at a, one at b
    flaky = CancelFails(grid.sites["a"], failures=1)
    sites: dict[str, Any] = {"a": flaky, "b": grid.sites["b"]}
    report = cancel_run("k2", ["a", "b"], sites.__getitem__, clock=grid.clock, sleep=grid.sleep)
    assert report.ok and flaky.cancel_calls == 2 and report.as_json()["cancelled"] == 2

    _killed_replay(grid, "k3", [_job(1, 0), _job(2, 0)])
    broken = CancelFails(grid.sites["a"], failures=1000)
    sites["a"] = broken
    report = cancel_run("k3", ["a", "b"], sites.__getitem__, clock=grid.clock, sleep=grid.sleep)
    assert not report.ok and broken.cancel_calls == MAX_CANCEL_ATTEMPTS
    assert [(j["site"], j["cancel_error"]) for j in report.as_json()["left_running"]] == [
        ("a", "site a: slurmrestd: connection reset")
    ]


def test_a_site_the_clean_up_cannot_list_is_reported_and_not_ok(grid: Grid) -> None:
    class Unreadable(FaultySite):
        def observe(self) -> Any:
            raise SiteUnavailable("b", "connection refused")

    _killed_replay(grid, "k4", [_job(1, 0)])
    sites: dict[str, Any] = {"a": grid.sites["a"], "b": Unreadable(grid.sites["b"])}
    report = cancel_run("k4", ["a", "b"], sites.__getitem__, clock=grid.clock, sleep=grid.sleep)
    assert not report.ok and report.as_json()["found"] == 1
    assert report.as_json()["unread_sites"] == {"b": "site b: connection refused"}
    with pytest.raises(ReplayError, match="RUN 'k4-1': not a replay's run id"):
        cancel_run("k4-1", ["a"], grid.adapter)
