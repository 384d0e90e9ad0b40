"""The KOALA model (KOALA 2005 Sec. 3-4): hand-checked event traces, determinism and the
capacity invariant."""

from __future__ import annotations

import pytest

from gridcore.errors import ConfigError
from gridcore.experiments.coallocation_claiming import (
    PAPER_PARAMS,
    background_loads,
    das_sites,
    koala_workload,
)
from gridcore.model import Priority
from gridcore.policies.claiming import CoAllocationParams
from gridcore.policies.transfer import transfer_seconds, uniform_bandwidth
from gridcore.sim.claiming import KoalaJob, KoalaRun, simulate_koala
from gridcore.sim.workload import BackgroundLoad, LocalJob, SimSite

GB = 10**9
BACKBONE = uniform_bandwidth(12.5)  # 100 Mbit/s: 4 GB in 320 s
HIGH, LOW = Priority.HIGH, Priority.LOW


def steps(run: KoalaRun) -> list[tuple[float, str, str]]:
    return [(round(e.at, 4), e.kind, e.job) for e in run.trace]


def test_transfer_of_4gb_on_the_backbone_takes_320_s() -> None:
    assert transfer_seconds(4 * GB, 12.5) == 320.0
    assert BACKBONE("a", "b") == 12.5 and BACKBONE("a", "a") == float("inf")


def test_claiming_starts_at_three_quarters_of_the_transfer_and_runs_at_the_jst() -> None:
    # Component 0 runs where the file is (0 s), component 1 gets it over the backbone.
    run = simulate_koala(
        [SimSite("a", 16), SimSite("b", 32)],
        [KoalaJob("J", 0.0, HIGH, (16, 16), 100.0, 4 * GB, ("a",))],
        bandwidth=BACKBONE,
    )
    assert steps(run) == [
        (0.0, "submit", "J"),
        (0.0, "placed", "J"),
        (240.0, "claim", "J"),  # JCT_0 = 0 + 0.75 * 320
        (320.0, "run", "J"),  # JST = 0 + 320: components claimed at 240 waited at the barrier
        (420.0, "end", "J"),
    ]
    assert run.trace[1].detail.startswith("0:16@a<a, 1:16@b<a; FTT 320 s, JST 320.0")
    job = run.by_name("J")
    assert (job.placement_s, job.start_delay_s, job.wait_s) == (0.0, 0.0, 320.0)
    assert run.peak_used == {"a": 16, "b": 16}


def test_claiming_that_reaches_the_jst_aborts_lowers_l_and_replaces_later() -> None:
    # Another user takes all of b from 100 s to 1000 s, after J was placed on it.
    run = simulate_koala(
        [SimSite("a", 16), SimSite("b", 32)],
        [KoalaJob("J", 0.0, HIGH, (16, 16), 100.0, 4 * GB, ("a",))],
        bandwidth=BACKBONE,
        background=[LocalJob("user", "b", 100.0, 900.0, 32)],
    )
    assert steps(run) == [
        (0.0, "submit", "J"),
        (0.0, "placed", "J"),
        (240.0, "claim", "J"),  # component 0 starts on a; b has no idle processor
        (300.0, "claim", "J"),  # JCT_1 = 240 + 0.75 * 80
        (315.0, "claim", "J"),
        (318.75, "claim", "J"),
        (320.0, "claim", "J"),  # 319.69 would be < 1 s before the JST: the last try is at it
        (320.0, "abort", "J"),
        (1200.0, "placed", "J"),  # scans at 480, 720, 960 find b busy
        (1400.0, "claim", "J"),  # JCT_0 = 1200 + 0.625 * 320 with the lowered L
        (1520.0, "run", "J"),
        (1620.0, "end", "J"),
    ]
    assert [e.detail.split()[0] for e in run.trace if e.kind == "claim"] == [
        "RETRY",
        "RETRY",
        "RETRY",
        "RETRY",
        "ABORT",
        "COMPLETE",
    ]
    assert run.trace[7].detail == "jst: L lowered to 0.625"
    job = run.by_name("J")
    assert job.jst_aborts == 1 and job.claim_tries == 6
    assert job.placement_s == 0.0 + (1200.0 - 320.0)
    assert job.start_delay_s == 1520.0 - 320.0  # last JST - original JST (Sec. 3.2)
    assert job.wait_s == 1520.0


def test_a_high_priority_claim_preempts_a_low_priority_job_that_took_its_processors() -> None:
    # H is placed on a and b (its file is at c), then L is placed on a's processors, which
    # H has not claimed yet (no reservations), and starts at once.
    run = simulate_koala(
        [SimSite("a", 32), SimSite("b", 32), SimSite("c", 1)],
        [
            KoalaJob("H", 0.0, HIGH, (16, 16), 100.0, 4 * GB, ("c",)),
            KoalaJob("L", 10.0, LOW, (32,), 1000.0),
        ],
        bandwidth=BACKBONE,
    )
    assert steps(run) == [
        (0.0, "submit", "H"),
        (0.0, "placed", "H"),
        (10.0, "submit", "L"),
        (10.0, "placed", "L"),
        (10.0, "claim", "L"),
        (10.0, "run", "L"),
        (240.0, "abort", "L"),  # preempted by H's claim at its JCT_0
        (240.0, "claim", "H"),
        (320.0, "run", "H"),
        (420.0, "end", "H"),
        (480.0, "placed", "L"),  # the first low-queue scan after a is free again
        (480.0, "claim", "L"),
        (480.0, "run", "L"),
        (1480.0, "end", "L"),
    ]
    assert run.trace[7].detail == "COMPLETE F=0.50 started [1,0] replaced [] preempted ['L']"
    assert run.preemptions == 1 and run.by_name("L").preemptions == 1
    assert [a.ended for a in run.by_name("L").attempts] == ["preempted", "completed"]


def test_a_component_failure_requeues_the_job_and_the_site_becomes_unusable() -> None:
    run = simulate_koala(
        [SimSite("a", 32, failure_probability=1.0), SimSite("b", 32)],
        [KoalaJob("J", 0.0, HIGH, (32,), 100.0)],
        CoAllocationParams(unusable_after_errors=1),
        bandwidth=BACKBONE,
    )
    kinds = [(kind, job) for _, kind, job in steps(run)]
    assert kinds == [
        ("submit", "J"),
        ("placed", "J"),
        ("claim", "J"),
        ("run", "J"),
        ("unusable", "a"),
        ("abort", "J"),
        ("placed", "J"),
        ("claim", "J"),
        ("run", "J"),
        ("end", "J"),
    ]
    failed_at = run.trace[4].at
    assert 0.0 < failed_at < 100.0  # during the run, drawn uniformly
    assert run.unusable == {"a": failed_at}
    assert run.trace[6].at == 240.0 and run.trace[6].detail.startswith("0:32@b")
    assert (run.runs, run.failed_runs, run.failure_rate) == (2, 1, 0.5)
    assert run.by_name("J").failures == 1 and run.completed == 1


def test_jobs_beyond_the_queue_cap_wait_to_be_submitted() -> None:
    run = simulate_koala(
        [SimSite("a", 16)],
        [
            KoalaJob("X", 0.0, HIGH, (16,), 1000.0),
            KoalaJob("Y", 1.0, HIGH, (16,), 100.0),
            KoalaJob("Z", 2.0, HIGH, (16,), 100.0),
        ],
        CoAllocationParams(queue_cap=1),
        bandwidth=BACKBONE,
    )
    assert steps(run)[:10] == [
        (0.0, "submit", "X"),
        (0.0, "placed", "X"),
        (0.0, "claim", "X"),
        (0.0, "run", "X"),
        (1.0, "submit", "Y"),
        (1.0, "queued", "Y"),
        (2.0, "held", "Z"),  # the placement queues already hold 1 job
        (1000.0, "end", "X"),
        (1200.0, "placed", "Y"),
        (1200.0, "submit", "Z"),  # the scan emptied the queue
    ]
    assert run.by_name("Z").submit_s == 1200.0
    assert run.completed == 3


def test_the_same_inputs_give_the_same_run() -> None:
    first, second = (_small_experiment(seed=3) for _ in range(2))
    assert first.trace == second.trace
    assert first.jobs == second.jobs
    assert _small_experiment(seed=4).trace != first.trace


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_site_ever_uses_more_processors_than_it_has(seed: int) -> None:
    run = _small_experiment(seed)
    capacity = {site.name: site.processors for site in das_sites()}
    assert all(run.peak_used[name] <= capacity[name] for name in capacity)
    assert run.completed == len(run.jobs)
    for name, (ours, others) in run.busy_s.items():
        assert 0.0 <= ours + others <= capacity[name] * run.end_s
    for job in run.jobs:
        assert job.start_s is not None and job.end_s is not None
        assert job.attempts[-1].ended == "completed" and job.attempts[-1].jst == job.start_s
        assert job.failures + job.preemptions + job.jst_aborts == len(job.attempts) - 1


def _small_experiment(seed: int) -> KoalaRun:
    sites = das_sites()
    return simulate_koala(
        sites,
        koala_workload(seed, 60),
        PAPER_PARAMS,
        bandwidth=BACKBONE,
        background_load=background_loads(sites, 0.25),
        seed=seed,
    )


@pytest.mark.parametrize(
    ("sites", "jobs", "message"),
    [
        ([], [], "sites: need at least one"),
        ([SimSite("a", 0)], [], "site a: processors must be >= 1"),
        ([SimSite("a", 8, failure_probability=1.5)], [], "failure_probability in"),
        ([SimSite("a", 8)], [KoalaJob("J", 0.0, HIGH, (), 1.0)], "job J: needs"),
        ([SimSite("a", 8)], [KoalaJob("J", 0.0, HIGH, (0,), 1.0)], "job J: component sizes"),
        (
            [SimSite("a", 8)],
            [KoalaJob("J", 0.0, HIGH, (4,), 1.0, GB, ("nowhere",))],
            "unknown: \\['nowhere'\\]",
        ),
        (
            [SimSite("a", 8)],
            [KoalaJob("J", 0.0, HIGH, (4,), 1.0), KoalaJob("J", 1.0, LOW, (4,), 1.0)],
            "names must be unique",
        ),
    ],
)
def test_invalid_models_are_refused(
    sites: list[SimSite], jobs: list[KoalaJob], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        simulate_koala(sites, jobs, bandwidth=BACKBONE)


def test_other_users_must_fit_their_site() -> None:
    with pytest.raises(ConfigError, match="local job u: 9 processors > site 'a'"):
        simulate_koala(
            [SimSite("a", 8)],
            [],
            bandwidth=BACKBONE,
            background=[LocalJob("u", "a", 0, 1, 9)],
        )
    with pytest.raises(ConfigError, match="background load at 'a'"):
        simulate_koala(
            [SimSite("a", 8)],
            [],
            bandwidth=BACKBONE,
            background_load=[BackgroundLoad.at_site("a", 10.0, (1, 16), 60.0)],
        )
