"""VJM's pure co-reservation policy (seed ``vjm-virtual-job-model.md`` Sec. 3.2-3.3) and
the queue-statistics estimators Eq. 1 reads, as tables built from the paper's
definitions, one scenario per row."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest

from gridcore.errors import ConfigError
from gridcore.model import Outcome
from gridcore.policies.coreservation import (
    DEFAULT_RULE,
    GLOBAL_ORDER,
    LIFETIME_CEILING_S,
    PAPER_RULE,
    PILOT_TIME_MARGIN_S,
    ClusterReservation,
    ClusterView,
    PendingJob,
    QueueStats,
    Relation,
    ReorganizeRule,
    direct_deadlock,
    expected_wait,
    expected_wait_printed,
    indirect_deadlock,
    pilot_time_limit,
    relation,
    release_slower_half,
    reorganize,
    reservation_lifetime,
    round_robin_order,
    select_clusters,
    select_substitutes,
    settle_lifetime,
)
from gridcore.policies.queue_stats import (
    COLD_INTERVAL_S,
    COLD_WAIT_S,
    QueueRecord,
    estimate_queue_stats,
)


def stats(t_w: float, dt: float = 0.0, ql: int = 0, t_ffw: float = 0.0) -> QueueStats:
    return QueueStats(t_w=t_w, t_ffw=t_ffw, ql=ql, dt=dt)


def view(name: str, t_w: float, dt: float = 0.0, capacity: int = 16) -> ClusterView:
    return ClusterView(name, stats(t_w, dt), capacity)


def job(
    job_id: int,
    submitted_at: float,
    **clusters: tuple[int, int] | tuple[int, int, tuple[float, ...]],
) -> PendingJob:
    """``A=(required, held)`` or ``A=(required, held, waiting_s)`` per cluster."""
    reservations = {
        name: ClusterReservation(spec[0], spec[1], spec[2] if len(spec) == 3 else ())
        for name, spec in clusters.items()
    }
    return PendingJob(job_id, submitted_at, reservations)


# -- Eq. 1 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "queue", "vj_seq", "printed", "clamped"),
    [
        ("idle cluster, first virtual job: the mean wait", stats(30.0), 0, 30.0, 30.0),
        ("each earlier virtual job there adds dt", stats(5.0, dt=10.0), 3, 35.0, 35.0),
        ("jobs waiting add dt each", stats(5.0, dt=2.0, ql=4), 1, 15.0, 15.0),
        (
            "the head waited longer than the mean: printed negative, clamped to 0",
            stats(10.0, dt=5.0, ql=2, t_ffw=30.0),
            1,
            -5.0,
            0.0,
        ),
        (
            "the head's wait is subtracted",
            stats(40.0, dt=1.0, ql=3, t_ffw=25.0),
            2,
            20.0,
            20.0,
        ),
    ],
)
def test_eq1_expected_wait(
    scenario: str, queue: QueueStats, vj_seq: int, printed: float, clamped: float
) -> None:
    assert expected_wait_printed(queue, vj_seq) == pytest.approx(printed), scenario
    assert expected_wait(queue, vj_seq) == pytest.approx(clamped), scenario


@pytest.mark.parametrize("bad", [{"t_w": -1.0}, {"dt": math.nan}, {"t_ffw": math.inf}, {"ql": -1}])
def test_queue_stats_refuse_impossible_values(bad: Mapping[str, float]) -> None:
    values = {"t_w": 1.0, "t_ffw": 0.0, "ql": 0, "dt": 1.0} | dict(bad)
    with pytest.raises(ConfigError):
        QueueStats(**values)  # type: ignore[arg-type]


# -- the cluster selection algorithm, steps 1-3 ---------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "vjs", "clusters", "m", "expected", "t_avails"),
    [
        (
            "A 60 s, B 10 s, idle, 10 VJs, M=2: all on B",
            10,
            [view("A", 30.0), view("B", 5.0)],
            2,
            {"B": 10},
            [5.0] * 10,
        ),
        (
            "A 60 s, B 120 s, idle, 10 VJs, M=2: all on A",
            10,
            [view("A", 30.0), view("B", 60.0)],
            2,
            {"A": 10},
            [30.0] * 10,
        ),
        (
            "equal waits: ties go to the cluster listed first",
            4,
            [view("A", 10.0), view("B", 10.0)],
            2,
            {"A": 4},
            [10.0] * 4,
        ),
        (
            "B fast but dt 10 s per virtual job: A takes the rest once B passes 30 s",
            10,
            [view("A", 30.0), view("B", 5.0, dt=10.0)],
            2,
            {"B": 3, "A": 7},
            [5.0, 15.0, 25.0] + [30.0] * 7,
        ),
        (
            "the fast cluster holds 6: the other 4 spill over to the next best",
            10,
            [view("A", 30.0), view("B", 5.0, capacity=6)],
            2,
            {"B": 6, "A": 4},
            [5.0] * 6 + [30.0] * 4,
        ),
        (
            "3 clusters > M=2: the smallest VJ set (C, 1) is dropped and redistributed",
            6,
            [view("A", 0.0, dt=1.0), view("B", 0.5, dt=1.0), view("C", 1.2, dt=1.0)],
            2,
            {"A": 3, "B": 3},
            [0.0, 0.5, 1.0, 2.5, 1.5, 2.0],
        ),
        (
            "3 clusters, M=1: drops until one cluster holds all",
            6,
            [view("A", 0.0, dt=1.0), view("B", 0.5, dt=1.0), view("C", 1.2, dt=1.0)],
            1,
            {"A": 6},
            [0.0, 3.0, 1.0, 4.0, 5.0, 2.0],
        ),
        ("no virtual jobs: nothing to place", 0, [view("A", 1.0)], 2, {}, []),
    ],
)
def test_select_clusters(
    scenario: str,
    vjs: int,
    clusters: list[ClusterView],
    m: int,
    expected: dict[str, int],
    t_avails: list[float],
) -> None:
    selection = select_clusters(vjs, clusters, m)
    assert selection.outcome is Outcome.FIT, scenario
    assert selection.clusters == expected, scenario
    assert [c.t_avail for c in selection.choices] == pytest.approx(t_avails), scenario
    assert [c.index for c in selection.choices] == list(range(vjs))
    assert len(selection.clusters) <= m


@pytest.mark.parametrize(
    ("scenario", "vjs", "clusters", "m", "choices", "drops"),
    [
        (
            "A, B 0 s and C 1 s, dt 1, M=1: step (1) passes C over (ties to the first listed);"
            " B (2, slower on ties) is dropped and C = C' = {A}: B's two go to A at 2 and 3 s",
            4,
            [view("A", 0.0, dt=1.0), view("B", 0.0, dt=1.0), view("C", 1.0, dt=1.0)],
            1,
            [("A", 0.0), ("A", 2.0), ("A", 1.0), ("A", 3.0)],
            ["B"],
        ),
        (
            "D (2.1 s, flat) passed over; C (1) dropped: its virtual job to B (2.5 s), not D,"
            " which is not in C = C'",
            6,
            [
                view("A", 0.0, dt=1.0),
                view("B", 0.5, dt=1.0),
                view("C", 1.2, dt=1.0),
                view("D", 2.1),
            ],
            2,
            [("A", 0.0), ("B", 0.5), ("A", 1.0), ("B", 2.5), ("B", 1.5), ("A", 2.0)],
            ["C"],
        ),
        (
            "4 clusters, M=1: C (1, slower than B's 1) then B (2, slower than A's 2) dropped,"
            " C = C' shrinking to {A}; D (9 s) never chosen",
            4,
            [
                view("A", 0.0, dt=1.0),
                view("B", 0.5, dt=1.0),
                view("C", 1.0, dt=1.0),
                view("D", 9.0),
            ],
            1,
            [("A", 0.0), ("A", 2.0), ("A", 1.0), ("A", 3.0)],
            ["C", "B"],
        ),
    ],
)
def test_step3_updates_the_available_set_to_c_prime(
    scenario: str,
    vjs: int,
    clusters: list[ClusterView],
    m: int,
    choices: list[tuple[str, float]],
    drops: list[str],
) -> None:
    # Sec. 3.2 step (3): "remove the cluster C_m who has the smallest virtual job set from
    # C', C' = C' - C_m; update the available clusters set C = C', and set the undecided
    # jobs set to VJ(m); go to (2)" (issue 21 item 15: clusters never chosen stayed in C).
    selection = select_clusters(vjs, clusters, m)
    assert selection.outcome is Outcome.FIT, scenario
    assert [(c.cluster, c.t_avail) for c in selection.choices] == choices, scenario
    dropped = [r.split("dropped ")[1].split(" ")[0] for r in selection.reasons if "dropped" in r]
    assert dropped == drops, scenario


def test_step3_drop_is_named_in_the_reasons() -> None:
    selection = select_clusters(
        6, [view("A", 0.0, dt=1.0), view("B", 0.5, dt=1.0), view("C", 1.2, dt=1.0)], 2
    )
    assert any("3 clusters > M=2: dropped C" in r for r in selection.reasons)


def test_step3_tie_on_set_size_drops_the_slower_cluster() -> None:
    # One virtual job each after step 2; all sets tie at 1: C's T_avail (2 s) is the
    # largest, so C goes, and its virtual job to A (10 s, A listed first at 10 vs 11).
    clusters = [view("A", 0.0, dt=10.0), view("B", 1.0, dt=10.0), view("C", 2.0, dt=10.0)]
    selection = select_clusters(3, clusters, 2)
    assert any("dropped C" in r for r in selection.reasons)
    assert selection.clusters == {"A": 2, "B": 1}


@pytest.mark.parametrize(
    ("scenario", "vjs", "clusters", "m"),
    [
        (
            "capacity limit: A 4 + B 3 < 9 once C (2) is dropped: NO_FIT",
            9,
            [view("A", 0.0, capacity=4), view("B", 0.0, capacity=3), view("C", 100.0)],
            2,
        ),
        ("more virtual jobs than every cluster holds", 5, [view("A", 0.0, capacity=4)], 2),
        ("no cluster at all", 1, [], 2),
    ],
)
def test_select_clusters_no_fit(
    scenario: str, vjs: int, clusters: list[ClusterView], m: int
) -> None:
    selection = select_clusters(vjs, clusters, m)
    assert selection.outcome is Outcome.NO_FIT, scenario
    assert selection.choices == ()
    assert selection.reasons, scenario


def test_already_kept_virtual_jobs_count_in_vj_seq_and_capacity() -> None:
    # A keeps 3 (dt 2 s: the next is its 4th at 6 s), capacity 5: two more fit there.
    clusters = [view("A", 0.0, dt=2.0, capacity=5), view("B", 7.0, dt=1.0)]
    selection = select_clusters(4, clusters, 2, already={"A": 3})
    assert [(c.cluster, c.t_avail) for c in selection.choices] == [
        ("A", 6.0),
        ("B", 7.0),
        ("A", 8.0),  # ties with B's 8 s: A is listed first
        ("B", 8.0),  # A is full (3 kept + 2)
    ]


def test_already_kept_clusters_count_against_m() -> None:
    # A is kept: with M=1 the substitutes must go to A, even though B is faster.
    clusters = [view("A", 10.0), view("B", 0.0)]
    assert select_clusters(2, clusters, 1, already={"A": 1}).clusters == {"A": 2}


@pytest.mark.parametrize(("vjs", "m"), [(-1, 2), (1, 0)])
def test_select_clusters_refuses_bad_arguments(vjs: int, m: int) -> None:
    with pytest.raises(ConfigError):
        select_clusters(vjs, [view("A", 0.0)], m)


# -- Eq. 2 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "t_avails", "floor", "lifetime"),
    [
        ("twice the largest T_avail", [5.0, 12.0, 7.0], 0.0, 24.0),
        ("an idle grid gives 0: the floor holds", [0.0, 0.0], 60.0, 60.0),
        ("above the floor, Eq. 2 wins", [50.0], 60.0, 100.0),
        ("no virtual jobs: the floor", [], 30.0, 30.0),
    ],
)
def test_eq2_reservation_lifetime(
    scenario: str, t_avails: list[float], floor: float, lifetime: float
) -> None:
    assert reservation_lifetime(t_avails, floor) == pytest.approx(lifetime), scenario


@pytest.mark.parametrize("floor", [-1.0, math.inf, math.nan])
def test_eq2_refuses_a_bad_floor(floor: float) -> None:
    with pytest.raises(ConfigError):
        reservation_lifetime([1.0], floor)


@pytest.mark.parametrize(
    ("scenario", "t_avails", "floor", "ceiling", "lifetime"),
    [
        ("below the ceiling: Eq. 2", [100.0, 400.0], 60.0, 3600.0, 800.0),
        ("stale waits of hours: capped", [9000.0], 60.0, 3600.0, 3600.0),
        ("a floor above the ceiling wins", [9000.0], 7200.0, 3600.0, 7200.0),
    ],
)
def test_eq2_ceiling(
    scenario: str, t_avails: list[float], floor: float, ceiling: float, lifetime: float
) -> None:
    assert reservation_lifetime(t_avails, floor, ceiling) == lifetime, scenario
    assert LIFETIME_CEILING_S == 3600.0


@pytest.mark.parametrize("ceiling", [0.0, -5.0, math.nan])
def test_eq2_refuses_a_bad_ceiling(ceiling: float) -> None:
    with pytest.raises(ConfigError, match="ceiling"):
        reservation_lifetime([1.0], 0.0, ceiling)


# -- a pilot's time limit: its hold (at most the lifetime) + its command + a margin --------


@pytest.mark.parametrize(
    ("scenario", "lifetime", "command", "limit"),
    [
        ("an idle grid: the floor, a 10-minute command, 5 min margin", 60.0, 600.0, 960),
        ("a fractional lifetime rounds up", 120.5, 600.0, 1021),
        ("10 % once above 5 min: 1 h lifetime + 1 h command", 3600.0, 3600.0, 7920),
        ("the 10 % of a day's command", 3600.0, 86400.0, 99000),
        ("a lifetime of 0 still gets the margin", 0.0, 1.0, 301),
    ],
)
def test_a_pilots_time_limit_covers_its_lifetime_and_its_command(
    scenario: str, lifetime: float, command: float, limit: int
) -> None:
    assert pilot_time_limit(lifetime, command) == limit, scenario
    assert limit >= lifetime + command + PILOT_TIME_MARGIN_S, scenario


def test_a_pilot_time_limit_follows_eq2() -> None:
    lifetime = reservation_lifetime([100.0, 400.0], 60.0, LIFETIME_CEILING_S)
    assert pilot_time_limit(lifetime, 3600.0) == math.ceil(800.0 + 3600.0 + 440.0)


@pytest.mark.parametrize(
    ("lifetime", "command", "field"),
    [(-1.0, 60.0, "lifetime"), (math.inf, 60.0, "lifetime"), (60.0, 0.0, "command"),
     (60.0, math.nan, "command")],
)  # fmt: skip
def test_a_pilot_time_limit_refuses_impossible_values(
    lifetime: float, command: float, field: str
) -> None:
    with pytest.raises(ConfigError, match=field):
        pilot_time_limit(lifetime, command)


# -- Definitions 1 and 2 ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "a", "b", "expected"),
    [
        ("Def. 1: J_a holds all on C, J_b not: J_a > J_b", (2, 2), (2, 1), Relation.GREATER),
        ("Def. 1: J_b holds all on C, J_a not: J_a < J_b", (3, 0), (1, 1), Relation.LESS),
        ("Def. 2: neither holds all on C: J_a = J_b", (2, 1), (3, 2), Relation.EQUAL),
        ("Def. 2: neither holds anything: J_a = J_b", (2, 0), (2, 0), Relation.EQUAL),
        ("both complete: no competition", (2, 2), (1, 1), Relation.BOTH_COMPLETE),
    ],
)
def test_definitions_1_and_2(
    scenario: str, a: tuple[int, int], b: tuple[int, int], expected: Relation
) -> None:
    ja, jb = job(1, 0.0, C=a), job(2, 1.0, C=b)
    assert relation(ja, jb, "C") is expected, scenario
    mirrored = {Relation.GREATER: Relation.LESS, Relation.LESS: Relation.GREATER}
    assert relation(jb, ja, "C") is mirrored.get(expected, expected), scenario


def test_no_relation_unless_both_have_virtual_jobs_on_the_cluster() -> None:
    assert relation(job(1, 0.0, C=(2, 1)), job(2, 0.0, D=(2, 1)), "C") is None
    assert relation(job(1, 0.0, C=(2, 1)), job(2, 0.0, C=(0, 0)), "C") is None


# -- Eq. 3 and Eq. 4, and the reorganization ------------------------------------------------


def test_eq3_indirect_deadlock_shifts_j_a_on_c_n_to_j_b() -> None:
    # J_a complete on Cn, not on Cm; J_b complete on Cm, not on Cn:
    # J_a < J_b on Cm and J_a > J_b on Cn.
    a = job(1, 0.0, Cm=(4, 1, (30.0,) * 3), Cn=(3, 3))
    b = job(2, 5.0, Cm=(2, 2), Cn=(5, 3, (20.0, 20.0)))
    assert indirect_deadlock(a, [b]) == {"Cn": b}
    plan = reorganize(a, [b])
    assert plan.step == "indirect (Eq. 3)"
    # J_b lacks 2 on Cn: it takes 2 of J_a's 3; J_a's third is released with Cn.
    assert [(s.from_job, s.to_job, s.cluster, s.pilots) for s in plan.shifts] == [(1, 2, "Cn", 2)]
    assert plan.release == ("Cn",)
    assert plan.keep == ("Cm",)
    assert plan.substitutes == 3
    assert "job 1 > job 2 on Cn" in plan.reasons[0]


def test_eq3_needs_both_clusters_of_the_pair() -> None:
    # J_a > J_b on Cn but nowhere J_a < J_b: no indirect deadlock (Eq. 4 may still hold).
    a = job(1, 0.0, Cm=(4, 1), Cn=(3, 3))
    b = job(2, 5.0, Cm=(2, 1), Cn=(5, 3))
    assert indirect_deadlock(a, [b]) == {}
    assert direct_deadlock(a, [b]) == {"Cm": b}


def test_eq4_direct_deadlock_shifts_what_j_a_holds_on_c_n() -> None:
    # Both incomplete on C: J_a = J_b on C; J_a also holds all it needs on D.
    a = job(1, 0.0, C=(6, 4, (40.0, 40.0)), D=(2, 2))
    b = job(2, 3.0, C=(6, 5, (10.0,)))
    assert direct_deadlock(a, [b]) == {"C": b}
    plan = reorganize(a, [b])
    assert plan.step == "direct (Eq. 4)"
    assert [(s.to_job, s.cluster, s.pilots) for s in plan.shifts] == [(2, "C", 1)]
    assert plan.release == ("C",)
    assert plan.keep == ("D",)
    assert plan.substitutes == 6


def test_eq4_with_nothing_held_there_shifts_nothing_but_still_reselects() -> None:
    a = job(1, 0.0, C=(3, 0, (9.0,) * 3), D=(1, 1))
    b = job(2, 1.0, C=(3, 1, (9.0,) * 2))
    plan = reorganize(a, [b])
    assert plan.step == "direct (Eq. 4)"
    assert plan.shifts == ()
    assert plan.release == ("C",)
    assert plan.substitutes == 3


def test_the_earliest_submitted_j_b_is_chosen() -> None:
    a = job(1, 0.0, C=(4, 2))
    late, early = job(7, 20.0, C=(4, 1)), job(9, 10.0, C=(4, 1))
    assert direct_deadlock(a, [late, early]) == {"C": early}
    assert reorganize(a, [late, early]).shifts[0].to_job == 9


def test_complete_jobs_and_j_a_itself_are_not_candidates() -> None:
    a = job(1, 0.0, C=(4, 2))
    done = job(2, 0.0, C=(2, 2))
    assert direct_deadlock(a, [a, done]) == {}
    assert indirect_deadlock(a, [a, done]) == {}


@pytest.mark.parametrize(
    ("scenario", "a", "others", "step", "shifts", "release", "keep"),
    [
        (
            "Eq. 3 with J_b (a < b on Cm, a > b on Cn) and Eq. 4 with J_c (a = c on Cm):"
            " both steps shift, Cn to b and Cm to c",
            job(1, 0.0, Cm=(2, 1), Cn=(2, 2)),
            [job(2, 9.0, Cm=(1, 1), Cn=(2, 0)), job(3, 1.0, Cm=(2, 1))],
            "indirect + direct (Eq. 3, 4)",
            [(2, "Cn", 2), (3, "Cm", 1)],
            ("Cn", "Cm"),
            (),
        ),
        (
            "one J_b: a > b on X and a < b on Y (Eq. 3), a = b on Z (Eq. 4): X and Z to b, Y kept",
            job(1, 0.0, X=(2, 2), Y=(2, 1), Z=(2, 1)),
            [job(2, 5.0, X=(2, 0), Y=(1, 1), Z=(2, 1))],
            "indirect + direct (Eq. 3, 4)",
            [(2, "X", 2), (2, "Z", 1)],
            ("X", "Z"),
            ("Y",),
        ),
        (
            "only Eq. 3: the indirect step alone",
            job(1, 0.0, Cm=(4, 1), Cn=(3, 3)),
            [job(2, 5.0, Cm=(2, 2), Cn=(5, 3))],
            "indirect (Eq. 3)",
            [(2, "Cn", 2)],
            ("Cn",),
            ("Cm",),
        ),
        (
            "only Eq. 4: the direct step alone",
            job(1, 0.0, C=(6, 4), D=(2, 2)),
            [job(2, 3.0, C=(6, 5))],
            "direct (Eq. 4)",
            [(2, "C", 1)],
            ("C",),
            ("D",),
        ),
    ],
)
def test_reorganization_takes_both_steps_1_and_2(
    scenario: str,
    a: PendingJob,
    others: list[PendingJob],
    step: str,
    shifts: list[tuple[int, str, int]],
    release: tuple[str, ...],
    keep: tuple[str, ...],
) -> None:
    # Sec. 3.3 lists both actions ("VJM will do the following actions, 1. ... 2. ...") and
    # step 3 only "if neither Eq. 3 nor Eq. 4 satisfied" (issue 21 item 15: step 2 ran
    # only when step 1 found nothing).
    plan = reorganize(a, others, PAPER_RULE)
    assert plan.step == step, scenario
    assert [(s.to_job, s.cluster, s.pilots) for s in plan.shifts] == shifts, scenario
    assert (plan.release, plan.keep) == (release, keep), scenario
    assert plan.substitutes == sum(a.clusters[c].required for c in release)


def test_no_deadlock_with_another_vjm_job_goes_to_step_3() -> None:
    a = job(1, 0.0, A=(2, 1, (50.0,)), B=(2, 0, (10.0, 10.0)))
    other = job(2, 0.0, D=(2, 0))
    assert reorganize(a, [other]).step == "step 3"


@pytest.mark.parametrize(
    ("m", "release", "keep"),
    [
        # Incomplete clusters C1 (fastest) .. Cm: release C_[m/2] .. C_m, keep
        # C_1 .. C_(floor(m/2)-1), [m/2] = floor(m/2) (C_0 of m = 1 is C_1): the two
        # printed ranges split the clusters exactly (issue 21 item 15).
        (1, ["C1"], []),
        (2, ["C1", "C2"], []),
        (3, ["C1", "C2", "C3"], []),
        (4, ["C2", "C3", "C4"], ["C1"]),
        (5, ["C2", "C3", "C4", "C5"], ["C1"]),
        (6, ["C3", "C4", "C5", "C6"], ["C1", "C2"]),
        (7, ["C3", "C4", "C5", "C6", "C7"], ["C1", "C2"]),
    ],
)
def test_step3_releases_the_slower_half(m: int, release: list[str], keep: list[str]) -> None:
    # Listed slowest first so the sort by mean wait is what orders them; one complete
    # cluster is always kept.
    clusters: dict[str, tuple[int, int] | tuple[int, int, tuple[float, ...]]] = {
        f"C{i}": (3, 1, (10.0 * i, 10.0 * i + 4)) for i in range(m, 0, -1)
    }
    clusters["Done"] = (2, 2)
    plan = release_slower_half(job(1, 0.0, **clusters))
    assert plan.step == "step 3"
    assert plan.shifts == ()
    assert list(plan.release) == release
    assert sorted(plan.keep) == sorted([*keep, "Done"])
    assert plan.substitutes == 3 * len(release)


def test_step3_on_a_complete_job_releases_nothing() -> None:
    plan = release_slower_half(job(1, 0.0, A=(2, 2)))
    assert (plan.step, plan.release, plan.substitutes) == ("none", (), 0)


def test_mean_wait_of_the_virtual_jobs_not_yet_held() -> None:
    assert ClusterReservation(4, 1, (10.0, 20.0, 30.0)).mean_wait_s == pytest.approx(20.0)
    assert ClusterReservation(1, 1).mean_wait_s == 0.0


# -- queue statistics for Eq. 1 ---------------------------------------------------------------


def test_cold_start_no_record() -> None:
    assert estimate_queue_stats([], now=100.0) == QueueStats(
        t_w=COLD_WAIT_S, t_ffw=0.0, ql=0, dt=COLD_INTERVAL_S
    )


def test_cold_start_one_start_dt_is_the_wait() -> None:
    est = estimate_queue_stats([QueueRecord(10.0, 25.0)], now=100.0)
    assert (est.t_w, est.dt, est.ql) == (15.0, 15.0, 0)


def test_waiting_jobs_give_ql_and_the_head_s_wait() -> None:
    records = [QueueRecord(0.0, 10.0), QueueRecord(40.0), QueueRecord(55.0)]
    est = estimate_queue_stats(records, now=100.0)
    assert (est.t_w, est.t_ffw, est.ql) == (10.0, 60.0, 2)


def test_window_keeps_the_last_starts() -> None:
    old = [QueueRecord(float(i), float(i) + 100.0) for i in range(10)]  # waited 100 s
    new = [QueueRecord(1000.0 + i, 1000.0 + i + 4.0) for i in range(5)]  # waited 4 s
    est = estimate_queue_stats(old + new, now=2000.0, window=5)
    assert est.t_w == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("scenario", "records", "dt"),
    [
        (
            "a backlog started every 10 s: dt 10",
            [QueueRecord(0.0, 10.0), QueueRecord(0.0, 20.0), QueueRecord(0.0, 30.0)],
            10.0,
        ),
        (
            "batches started together on an idle cluster, an hour apart: dt 0, not the gap",
            [QueueRecord(0.0, 10.0)] * 3 + [QueueRecord(3600.0, 3610.0)] * 3,
            0.0,
        ),
        (
            "never two waiting together: the arrival gap bounds it",
            [QueueRecord(0.0, 5.0), QueueRecord(100.0, 105.0), QueueRecord(300.0, 305.0)],
            150.0,
        ),
    ],
)
def test_dt_is_the_interval_of_a_backlogged_queue(
    scenario: str, records: list[QueueRecord], dt: float
) -> None:
    assert estimate_queue_stats(records, now=5000.0).dt == pytest.approx(dt), scenario


# -- rules beside the paper's (ReorganizeRule) ---------------------------------------------------


def test_rules_are_named_and_wait_needs_the_global_order() -> None:
    assert (PAPER_RULE.name, GLOBAL_ORDER.name, DEFAULT_RULE) == (
        "paper",
        "global_order",
        GLOBAL_ORDER,
    )
    assert ReorganizeRule(held_only=True).name == "held_only"
    with pytest.raises(ConfigError, match="wait_for_younger needs earlier_only"):
        ReorganizeRule(wait_for_younger=True)


def test_substitutes_avoid_released_clusters_unless_nothing_else_fits() -> None:
    idle = QueueStats(0.0, 0.0, 0, 10.0)
    views = [ClusterView("A", idle, 4), ClusterView("B", idle, 4), ClusterView("C", idle, 4)]
    # Without avoid, A (first in file order on equal T_avail) takes a virtual job.
    assert "A" in {c.cluster for c in select_substitutes(3, views, 3).choices}
    # A was just released: B and C take them.
    chosen = select_substitutes(3, views, 3, {}, avoid=("A",))
    assert chosen.outcome is Outcome.FIT
    assert {c.cluster for c in chosen.choices} == {"B", "C"}
    # Where the job keeps virtual jobs, a released cluster stays a candidate.
    kept = select_substitutes(3, views, 3, {"A": 1}, avoid=("A",))
    assert "A" in {c.cluster for c in kept.choices}
    # Nine do not fit on B and C (4 + 4): the fallback over every cluster places them.
    nine = select_substitutes(9, views, 3, {}, avoid=("A",))
    assert nine.outcome is Outcome.FIT
    assert "without the released ['A'] nothing fits" in nine.reasons[0]
    assert len(nine.choices) == 9 and {c.cluster for c in nine.choices} == {"A", "B", "C"}


def test_held_only_eq4_skips_clusters_where_j_a_holds_nothing() -> None:
    # The paper's Eq. 4 fires on C (J_a = J_b) though J_a has nothing there to shift.
    a = job(1, 5.0, C=(3, 0, (9.0,) * 3), D=(2, 1, (9.0,)))
    b = job(2, 1.0, C=(3, 1, (9.0,) * 2))
    assert direct_deadlock(a, [b]) == {"C": b}
    assert direct_deadlock(a, [b], held_only=True) == {}
    # Nothing with another VJM job that J_a could shift: step 3.
    assert reorganize(a, [b], ReorganizeRule(held_only=True)).step == "step 3"
    # Where J_a holds something, held_only changes nothing.
    c = job(3, 1.0, D=(2, 0, (9.0, 9.0)))
    plan = reorganize(a, [b, c], ReorganizeRule(held_only=True))
    assert (plan.step, plan.release, [s.to_job for s in plan.shifts]) == (
        "direct (Eq. 4)",
        ("D",),
        [3],
    )


def test_earlier_only_gives_only_to_older_jobs() -> None:
    old, young = job(1, 0.0, C=(4, 2, (5.0,) * 2)), job(2, 9.0, C=(4, 1, (5.0,) * 3))
    assert direct_deadlock(old, [young], earlier_only=True) == {}
    assert direct_deadlock(young, [old], earlier_only=True) == {"C": old}


@pytest.mark.parametrize(
    ("scenario", "young", "step"),
    [
        (
            "a younger job holds on C where the oldest is incomplete: it will yield, so wait",
            job(2, 9.0, C=(4, 1, (5.0,) * 3)),
            "wait",
        ),
        (
            "the younger job only queues on C (nothing to yield): the time-out is local, step 3",
            job(2, 9.0, C=(4, 0, (5.0,) * 4)),
            "step 3",
        ),
    ],
)
def test_wait_for_younger_keeps_the_oldest_job_s_reservation(
    scenario: str, young: PendingJob, step: str
) -> None:
    oldest = job(1, 0.0, C=(4, 2, (5.0,) * 2), D=(3, 3))
    # The paper's rule (and earlier_only alone) sends the oldest job to step 3 or makes
    # it give; with the global order it keeps what it holds while a younger one yields.
    assert reorganize(oldest, [young], ReorganizeRule(earlier_only=True)).step == "step 3"
    plan = reorganize(oldest, [young], GLOBAL_ORDER)
    assert plan.step == step, scenario
    if step == "wait":
        assert (plan.shifts, plan.release, plan.substitutes) == ((), (), 0)
        assert "younger job 2 holds 1 on C" in plan.reasons[0]


@pytest.mark.parametrize(
    ("scenario", "virtual_jobs", "capacities", "order"),
    [
        ("5 over three roomy clusters: dealt a, b, c, a, b", 5, {"a": 9, "b": 9, "c": 9},
         ["a", "b", "c", "a", "b"]),
        ("a full cluster is skipped on the next turns", 5, {"a": 1, "b": 9, "c": 2},
         ["a", "b", "c", "b", "c"]),
        ("none", 0, {"a": 1}, []),
    ],
)  # fmt: skip
def test_round_robin_deals_virtual_jobs_over_the_machine_file(
    scenario: str, virtual_jobs: int, capacities: dict[str, int], order: list[str]
) -> None:
    assert round_robin_order(virtual_jobs, capacities) == order, scenario


def test_round_robin_refuses_more_virtual_jobs_than_the_machine_file_holds() -> None:
    with pytest.raises(ConfigError, match="4 virtual jobs exceed"):
        round_robin_order(4, {"a": 1, "b": 2})


# -- the lifetime the forecasts are asked for -----------------------------------------------


def test_selections_repeat_with_the_lifetime_they_give_until_it_stops_growing() -> None:
    # T_avail = lifetime / 3 and Eq. 2 = max(300, 2 * T_avail): from 300 the first
    # selection gives 300 again, which settles
    asked: list[float] = []

    def select(lifetime: float) -> float:
        asked.append(lifetime)
        return lifetime / 3 if lifetime < 900 else 300.0

    chosen = settle_lifetime(select, lambda t: max(300.0, 2 * t), 300.0)
    # 300 -> T 100 -> Eq. 2 300 <= 300: the first selection already settled
    assert (chosen, asked) == (100.0, [300.0])
    asked.clear()
    growing = settle_lifetime(lambda life: (asked.append(life), life * 0.75)[1],
                              lambda t: 2 * t, 300.0)  # fmt: skip
    # 300 -> 225 -> 450 -> 337.5 -> 675 -> 506.25 -> 1012.5: four selections at most
    assert asked == [300.0, 450.0, 675.0, 1012.5]
    assert growing == 759.375


def test_a_longer_lifetime_that_fits_nowhere_keeps_the_selection_that_fits() -> None:
    asked: list[float] = []

    def select(lifetime: float) -> float | None:
        asked.append(lifetime)
        return 1000.0 if lifetime == 300.0 else None

    def lifetime_of(chosen: float | None) -> float:
        return 0.0 if chosen is None else 2 * chosen

    # the second round (2,000 s) fits nowhere: the first selection is kept
    assert settle_lifetime(select, lifetime_of, 300.0) == 1000.0
    assert asked == [300.0, 2000.0]
    asked.clear()
    assert settle_lifetime(lambda life: select(life + 1), lifetime_of, 300.0) is None
    with pytest.raises(ConfigError, match="rounds"):
        settle_lifetime(select, lifetime_of, 300.0, rounds=0)
