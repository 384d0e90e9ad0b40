"""Table-driven scenarios for the co-allocation placement policies (KOALA 2005 Sec. 2.6,
KOALA 2006 Sec. 2.2 and 4: WF, CF, CM Fig. 1, FCM Fig. 3, quota)."""

from __future__ import annotations

import math
import time

import pytest

from gridcore.errors import RequestError
from gridcore.experiments import bench_coallocation as bench
from gridcore.experiments.bench_coallocation import bench_close_to_files
from gridcore.model import (
    MB,
    CoAllocationRequest,
    Component,
    FileDelivery,
    FlexibleOptions,
    InputFile,
    Outcome,
    Placement,
    Replica,
    RequestKind,
    SiteSnapshot,
)
from gridcore.policies.placement import (
    PlacementPolicy,
    best_replica,
    close_to_files,
    cluster_minimization,
    flexible_cluster_minimization,
    place,
    usable_idle,
    validate_request,
    worst_fit,
)
from gridcore.policies.transfer import Bandwidth, component_transfer_seconds

WF, CF, CM, FCM = PlacementPolicy.WF, PlacementPolicy.CF, PlacementPolicy.CM, PlacementPolicy.FCM


def clusters(*idle: int, total: int = 32) -> list[SiteSnapshot]:
    """Clusters C1, C2, ... with the given idle processors."""
    return [SiteSnapshot(f"C{i}", total, n) for i, n in enumerate(idle, start=1)]


# Seed 002 Sec. 4.1: "three clusters, C1, C2, and C3, which have 18, 15, and 12 idle".
PAPER = clusters(18, 15, 12)


def non_fixed(*sizes: int, input_file: InputFile | None = None) -> CoAllocationRequest:
    return CoAllocationRequest(
        "job", RequestKind.NON_FIXED, tuple(Component(s) for s in sizes), input_file=input_file
    )


def fixed(*parts: tuple[int, str]) -> CoAllocationRequest:
    return CoAllocationRequest(
        "job", RequestKind.FIXED, tuple(Component(size, site) for size, site in parts)
    )


def flexible(
    total: int,
    *,
    least: int = 1,
    most: int | None = None,
    splits: tuple[tuple[int, ...], ...] = (),
    input_file: InputFile | None = None,
) -> CoAllocationRequest:
    return CoAllocationRequest(
        "job",
        RequestKind.FLEXIBLE,
        total=total,
        flexible=FlexibleOptions(least, most, splits),
        input_file=input_file,
    )


def layout(placement: Placement) -> list[tuple[int, int, str]]:
    return [(c.index, c.size, c.site) for c in placement.components]


# -- the papers' worked examples and the policies' choices ------------------------------


@pytest.mark.parametrize(
    ("request_", "snapshot", "policy", "quota", "expected"),
    [
        pytest.param(
            non_fixed(8, 8, 8),
            PAPER,
            WF,
            None,
            [(0, 8, "C1"), (1, 8, "C2"), (2, 8, "C3")],
            id="three 8-proc components, 18/15/12 idle: WF uses 3 clusters (KOALA 2006 Fig. 2)",
        ),
        pytest.param(
            non_fixed(8, 8, 8),
            PAPER,
            CM,
            None,
            [(0, 8, "C1"), (1, 8, "C1"), (2, 8, "C2")],
            id="three 8-proc components, 18/15/12 idle: CM uses 2 clusters, C1 16 of 18",
        ),
        pytest.param(
            flexible(24),
            PAPER,
            FCM,
            None,
            [(0, 18, "C1"), (1, 6, "C2")],
            id="flexible 24, 18/15/12 idle: FCM places 18 on C1 and 6 on C2 (KOALA 2006 Fig. 4)",
        ),
        pytest.param(
            non_fixed(8, 8, 8),
            PAPER,
            CF,
            None,
            [(0, 8, "C1"), (1, 8, "C2"), (2, 8, "C3")],
            id="CF without an input file places as WF",
        ),
        pytest.param(
            non_fixed(8, 8, 8),
            PAPER,
            FCM,
            None,
            [(0, 8, "C1"), (1, 8, "C1"), (2, 8, "C2")],
            id="FCM on a non-fixed request places as CM",
        ),
        pytest.param(
            non_fixed(4, 10, 6),
            PAPER,
            WF,
            None,
            [(0, 4, "C3"), (1, 10, "C1"), (2, 6, "C2")],
            id="WF in decreasing size: 10 on C1, 6 on C2, then 4 on C3 (12 left, the most)",
        ),
        pytest.param(
            non_fixed(5, 5),
            clusters(10, 10, 10),
            WF,
            None,
            [(0, 5, "C1"), (1, 5, "C2")],
            id="WF ties go to the first cluster in snapshot order",
        ),
        pytest.param(
            non_fixed(6, 6),
            clusters(7, 12, 12),
            CM,
            None,
            [(0, 6, "C2"), (1, 6, "C2")],
            id="CM sorts by idle once, ties in snapshot order: C2 before C3",
        ),
        pytest.param(
            non_fixed(8, 8, 4),
            PAPER,
            CM,
            None,
            [(0, 8, "C1"), (1, 8, "C1"), (2, 4, "C2")],
            id="CM first fit: the 4 does not fit C1 (2 left) and goes to C2",
        ),
        pytest.param(
            non_fixed(8, 8, 8),
            PAPER,
            CM,
            0.75,
            None,
            id="quota 0.75 on 32-proc clusters leaves 10/7/4 usable: CM cannot place 3x8",
        ),
        pytest.param(
            non_fixed(8, 8),
            PAPER,
            WF,
            0.75,
            None,
            id="quota 0.75: WF cannot place a second 8 (C1 2, C2 7, C3 4 left)",
        ),
        pytest.param(
            non_fixed(8, 7),
            PAPER,
            WF,
            0.75,
            [(0, 8, "C1"), (1, 7, "C2")],
            id="quota 0.75: WF places 8 on C1 (usable 10) and 7 on C2 (usable 7)",
        ),
        pytest.param(
            flexible(16),
            PAPER,
            FCM,
            0.75,
            [(0, 10, "C1"), (1, 6, "C2")],
            id="quota 0.75: FCM cuts 16 into 10 (C1) + 6 (C2)",
        ),
        pytest.param(
            flexible(15),
            clusters(10, 0, 5),
            FCM,
            None,
            [(0, 10, "C1"), (1, 5, "C3")],
            id="FCM skips a cluster with no idle processors",
        ),
        pytest.param(
            flexible(24, least=8),
            PAPER,
            FCM,
            None,
            [(0, 16, "C1"), (1, 8, "C2")],
            id="FCM min size 8: C1 gets 16 so the remainder 8 is a legal component",
        ),
        pytest.param(
            flexible(24, least=10),
            clusters(18, 9, 12),
            FCM,
            None,
            [(0, 14, "C1"), (1, 10, "C3")],
            id="FCM min size 10: 14 on C1, then the largest next cluster C3 takes 10",
        ),
        pytest.param(
            flexible(30, most=3),
            clusters(18, 10, 10),
            FCM,
            None,
            [(0, 18, "C1"), (1, 10, "C2"), (2, 2, "C3")],
            id="FCM max 3 components: 18 + 10 + 2",
        ),
        pytest.param(
            flexible(24, splits=((24,), (16, 8), (8, 8, 8))),
            PAPER,
            CM,
            None,
            [(0, 16, "C1"), (1, 8, "C2")],
            id="splits under CM: (24) does not fit, (16, 8) does",
        ),
        pytest.param(
            flexible(24, splits=((24,), (16, 8), (8, 8, 8))),
            PAPER,
            FCM,
            None,
            [(0, 16, "C1"), (1, 8, "C2")],
            id="splits under FCM: tried in order under CM, not cut freely",
        ),
        pytest.param(
            flexible(24, splits=((12, 12),)),
            PAPER,
            WF,
            None,
            [(0, 12, "C1"), (1, 12, "C2")],
            id="splits under WF: 12 on C1, then 12 on C2 (15 > 6 left on C1)",
        ),
        pytest.param(
            fixed((8, "C2"), (4, "C3")),
            PAPER,
            FCM,
            None,
            [(0, 8, "C2"), (1, 4, "C3")],
            id="a fixed request goes where it says, under any policy",
        ),
        pytest.param(
            fixed((8, "C2"), (7, "C2")),
            PAPER,
            CM,
            None,
            [(0, 8, "C2"), (1, 7, "C2")],
            id="two fixed components on one site fit its 15 together",
        ),
    ],
)
def test_placement_scenarios(
    request_: CoAllocationRequest,
    snapshot: list[SiteSnapshot],
    policy: PlacementPolicy,
    quota: float | None,
    expected: list[tuple[int, int, str]] | None,
) -> None:
    placement = place(request_, snapshot, policy, quota)
    assert placement.policy == policy.value
    assert placement.request == "job"
    assert placement.reasons
    if expected is None:
        assert placement.outcome is Outcome.NO_FIT
        assert placement.components == ()
    else:
        assert placement.outcome is Outcome.FIT
        assert layout(placement) == expected


def test_paper_cm_combines_fewer_clusters_than_wf() -> None:
    request = non_fixed(8, 8, 8)
    assert worst_fit(request, PAPER).clusters_combined == 3
    assert cluster_minimization(request, PAPER).clusters_combined == 2


@pytest.mark.parametrize("policy", [WF, CM, CF])
def test_paper_a_single_24_component_fits_no_cluster(policy: PlacementPolicy) -> None:
    # Seed 002 Sec. 4.2: "WF and CM are not able to place this job".
    placement = place(non_fixed(24), PAPER, policy)
    assert placement.outcome is Outcome.NO_FIT
    assert placement.reasons == (
        "component 0 (24 procs): no cluster has 24 usable idle (C1 18, C2 15, C3 12)",
    )


def test_cm_is_first_fit_and_can_combine_more_clusters_than_wf() -> None:
    # Fig. 1 taken literally packs C1 and C4 down to fragments of 0 and 1, so the two
    # 2-proc components end on two more clusters; WF's even spread leaves fragments of 2
    # that take them. The paper's "CM minimizes clusters" holds for equal-size components
    # (see test_placement_properties), not for every request.
    snapshot = clusters(3, 10, 0, 7, 9, 2)
    request = non_fixed(5, 5, 5, 3, 3, 3, 2, 2)
    assert cluster_minimization(request, snapshot).clusters_combined == 5
    assert worst_fit(request, snapshot).clusters_combined == 4


# -- NO_FIT reasons ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "snapshot", "policy", "quota", "reasons"),
    [
        pytest.param(
            non_fixed(8, 8, 8),
            PAPER,
            CM,
            0.75,
            (
                "component 1 (8 procs): no cluster has 8 usable idle (C1 2, C2 7, C3 4)",
                "quota 0.75: at most floor(0.75 x total) processors in use",
            ),
            id="CM under quota: the second 8 finds no room",
        ),
        pytest.param(
            flexible(24),
            PAPER,
            WF,
            None,
            ("flexible requests without splits need FCM",),
            id="a flexible request without splits under WF",
        ),
        pytest.param(
            flexible(24),
            PAPER,
            CF,
            None,
            ("flexible requests without splits need FCM",),
            id="a flexible request without splits under CF",
        ),
        pytest.param(
            fixed((8, "C2"), (8, "C2"), (20, "C1")),
            PAPER,
            WF,
            None,
            (
                "component 1 (8 procs): site C2: 7 usable idle < 8 needed",
                "component 2 (20 procs): site C1: 18 usable idle < 20 needed",
            ),
            id="fixed: every component that does not fit its site is named",
        ),
        pytest.param(
            fixed(
                (8, "C9"),
            ),
            PAPER,
            CM,
            None,
            ("component 0 (8 procs): site C9 is not in the snapshot",),
            id="fixed: a site missing from the snapshot",
        ),
        pytest.param(
            flexible(50),
            PAPER,
            FCM,
            None,
            (
                "FCM: 50 procs requested, 45 usable idle in components of >= 1 procs,"
                " at most 3 of them (C1 18, C2 15, C3 12)",
            ),
            id="FCM: not enough idle processors in all clusters together",
        ),
        pytest.param(
            flexible(30, least=5),
            clusters(20, 4, 4, 4),
            FCM,
            None,
            (
                "FCM: 30 procs requested, 20 usable idle in components of >= 5 procs,"
                " at most 4 of them (C1 20, C2 4, C3 4, C4 4)",
            ),
            id="FCM: clusters below the minimum component size do not count",
        ),
        pytest.param(
            flexible(30, most=2),
            clusters(18, 10, 10),
            FCM,
            None,
            (
                "FCM: 30 procs requested, 28 usable idle in components of >= 1 procs,"
                " at most 2 of them (C1 18, C2 10, C3 10)",
            ),
            id="FCM: the largest two clusters cannot hold 30",
        ),
        pytest.param(
            flexible(24, splits=((24,), (12, 12))),
            clusters(11, 11),
            CM,
            None,
            (
                "split 0 (24): component 0 (24 procs): no cluster has 24 usable idle"
                " (C1 11, C2 11)",
                "split 1 (12+12): component 0 (12 procs): no cluster has 12 usable idle"
                " (C1 11, C2 11)",
            ),
            id="splits: each failed split explains itself",
        ),
        pytest.param(
            non_fixed(8),
            [],
            WF,
            None,
            ("no clusters to place on",),
            id="an empty snapshot",
        ),
    ],
)
def test_no_fit_reasons(
    request_: CoAllocationRequest,
    snapshot: list[SiteSnapshot],
    policy: PlacementPolicy,
    quota: float | None,
    reasons: tuple[str, ...],
) -> None:
    placement = place(request_, snapshot, policy, quota)
    assert placement.outcome is Outcome.NO_FIT
    assert placement.components == ()
    assert placement.reasons == reasons


def test_fcm_min_size_cut_that_fits_both_clusters() -> None:
    # 20 with minimum 8 on 11/11: C1 takes min(11, 20 - 8) = 11, C2 the remaining 9.
    placement = flexible_cluster_minimization(flexible(20, least=8), clusters(11, 11))
    assert layout(placement) == [(0, 11, "C1"), (1, 9, "C2")]


def test_fcm_min_size_no_legal_cut() -> None:
    # 15 with minimum 8 on 10/10: a first component of >= 8 leaves < 8, and no cluster
    # holds all 15; 20 processors are idle but no cut respects the minimum.
    placement = flexible_cluster_minimization(flexible(15, least=8), clusters(10, 10))
    assert placement.outcome is Outcome.NO_FIT
    assert placement.reasons == (
        "FCM: 15 procs do not fit in components of >= 8 procs, at most 2 of them (C1 10, C2 10)",
    )


def test_no_fit_reason_lists_a_few_clusters_of_a_large_grid() -> None:
    snapshot = [SiteSnapshot(f"S{i:02d}", 8, 1 + i % 4) for i in range(20)]
    (reason,) = worst_fit(non_fixed(8), snapshot).reasons
    assert reason == (
        "component 0 (8 procs): no cluster has 8 usable idle (S00 1, S01 2, S02 3, S03 4,"
        " S04 1, S05 2, S06 3, S07 4, ... 12 more, the most 4)"
    )


def test_fit_reasons_say_where_and_why() -> None:
    placement = cluster_minimization(non_fixed(8, 8, 8), PAPER)
    assert placement.reasons == (
        "CM: 3 components on 2 clusters",
        "CM: clusters in fixed order of usable idle: C1 18, C2 15, C3 12",
        "component 0 (8 procs) -> C1 (usable idle 18 before)",
        "component 1 (8 procs) -> C1 (usable idle 18 before)",
        "component 2 (8 procs) -> C2 (usable idle 15 before)",
    )


def test_split_reasons_name_the_split_that_fits() -> None:
    placement = place(flexible(24, splits=((24,), (16, 8))), PAPER, CM)
    assert placement.reasons[:3] == (
        "CM: 2 components on 2 clusters",
        "split 0 (24): component 0 (24 procs): no cluster has 24 usable idle (C1 18, C2 15, C3 12)",
        "split 1 (16+8): fits under CM",
    )


# -- quota ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "idle", "quota", "usable"),
    [
        pytest.param(32, 18, None, 18, id="no quota: all idle processors"),
        pytest.param(32, 18, 1.0, 18, id="quota 1 is no quota"),
        pytest.param(32, 18, 0.75, 10, id="0.75 of 32 = 24 in use at most; 14 busy -> 10"),
        pytest.param(32, 18, 0.9, 14, id="floor(0.9 x 32) = 28; 14 busy -> 14"),
        pytest.param(32, 10, 0.5, 0, id="already over the quota: nothing usable"),
        pytest.param(100, 100, 0.29, 29, id="0.29 x 100 rounds to 29, not 28"),
        pytest.param(10, 10, 0.7, 7, id="an empty cluster under quota 0.7"),
        pytest.param(8, -3, None, 0, id="a negative idle count is 0"),
    ],
)
def test_usable_idle(total: int, idle: int, quota: float | None, usable: int) -> None:
    assert usable_idle(SiteSnapshot("C", total, idle), quota) == usable


@pytest.mark.parametrize("quota", [0.0, -0.5, 1.5, math.nan])
def test_quota_out_of_range_is_a_request_error(quota: float) -> None:
    with pytest.raises(RequestError, match=r"^quota: must be in \(0, 1\]"):
        worst_fit(non_fixed(8), PAPER, quota)
    with pytest.raises(RequestError, match=r"^quota: must be in \(0, 1\]"):
        usable_idle(PAPER[0], quota)


# -- input files: Close-to-Files and transfer estimates --------------------------------

DATA = InputFile("data.h5")
CHUNKS = InputFile("data.h5", FileDelivery.CHUNKED)


def replica(site: str, size_bytes: int = 800 * MB, name: str = "data.h5") -> Replica:
    return Replica(name, site, f"file:///{site}/{name}", size_bytes, "sha256:" + "0" * 64)


def links(table: dict[tuple[str, str], float], default: float = 10.0) -> Bandwidth:
    """MB/s from ``table``, ``default`` for every other pair."""

    def bandwidth(src: str, dst: str) -> float:
        return table.get((src, dst), default)

    return bandwidth


def test_cf_picks_the_cluster_that_holds_a_replica() -> None:
    placement = close_to_files(
        non_fixed(8, input_file=DATA), PAPER, replicas=[replica("C3")], bandwidth=links({})
    )
    assert layout(placement) == [(0, 8, "C3")]
    assert placement.components[0].file_site == "C3"
    assert placement.components[0].transfer_s == 0.0


def test_cf_picks_the_faster_link() -> None:
    bandwidth = links({("store", "C1"): 10.0, ("store", "C2"): 100.0, ("store", "C3"): 50.0})
    placement = close_to_files(
        non_fixed(8, input_file=DATA), PAPER, replicas=[replica("store")], bandwidth=bandwidth
    )
    assert layout(placement) == [(0, 8, "C2")]
    assert placement.components[0].file_site == "store"
    assert placement.components[0].transfer_s == pytest.approx(8.0)  # 800 MB at 100 MB/s


def test_cf_uses_each_clusters_best_replica() -> None:
    # Replica at A reaches C1 fast, replica at B reaches C2 faster still.
    bandwidth = links({("A", "C1"): 100.0, ("B", "C2"): 400.0, ("B", "C1"): 1.0})
    placement = close_to_files(
        non_fixed(8, 8, input_file=DATA),
        clusters(8, 8),
        replicas=[replica("A"), replica("B")],
        bandwidth=bandwidth,
    )
    assert [(c.site, c.file_site) for c in placement.components] == [("C2", "B"), ("C1", "A")]
    assert [c.transfer_s for c in placement.components] == pytest.approx([2.0, 8.0])
    assert placement.file_transfer_s == pytest.approx(8.0)  # FTT, KOALA 2005 Sec. 3.2


def test_cf_moves_on_when_the_replica_site_is_full() -> None:
    bandwidth = links({("C3", "C1"): 20.0, ("C3", "C2"): 40.0})
    placement = close_to_files(
        non_fixed(8, 8, input_file=DATA), PAPER, replicas=[replica("C3")], bandwidth=bandwidth
    )
    # The first 8 takes C3 (12 idle, 0 s); the second no longer fits there: C2 is faster.
    assert layout(placement) == [(0, 8, "C3"), (1, 8, "C2")]


def test_cf_equal_delays_prefer_more_remaining_idle_then_cluster_order() -> None:
    placement = close_to_files(
        non_fixed(8, 8, 8, input_file=DATA),
        clusters(12, 18, 18),
        replicas=[replica("store")],
        bandwidth=links({}),
    )
    assert layout(placement) == [(0, 8, "C2"), (1, 8, "C3"), (2, 8, "C1")]


def test_every_policy_fills_the_file_site_and_transfer_time() -> None:
    bandwidth = links({("store", "C1"): 100.0})
    placement = cluster_minimization(
        non_fixed(8, 8, input_file=DATA),
        PAPER,
        replicas=[replica("store"), replica("C2")],
        bandwidth=bandwidth,
    )
    # CM puts both on C1, where the store replica (100 MB/s) beats C2's (10 MB/s).
    assert [(c.site, c.file_site, c.transfer_s) for c in placement.components] == [
        ("C1", "store", 8.0),
        ("C1", "store", 8.0),
    ]
    assert placement.reasons[-1] == (
        "component 1 (8 procs) -> C1 (usable idle 18 before); input from store, est. 8.0 s"
    )


def test_fcm_components_get_their_chunks() -> None:
    placement = flexible_cluster_minimization(
        flexible(24, input_file=CHUNKS), PAPER, replicas=[replica("C2")], bandwidth=links({})
    )
    # 18/24 of 800 MB from C2 to C1 at 10 MB/s; C2's 6 read the local copy.
    assert [(c.site, c.transfer_s) for c in placement.components] == [
        ("C1", pytest.approx(60.0)),
        ("C2", 0.0),
    ]


@pytest.mark.parametrize("policy", list(PlacementPolicy))
def test_an_input_file_without_a_replica_cannot_be_placed(policy: PlacementPolicy) -> None:
    request = flexible(24, input_file=DATA) if policy is FCM else non_fixed(8, input_file=DATA)
    placement = place(request, PAPER, policy, replicas=[replica("C1", name="other.h5")])
    assert placement.outcome is Outcome.NO_FIT
    assert placement.reasons == ("no replica of data.h5",)


def test_no_bandwidth_function_is_fine_while_no_transfer_is_needed() -> None:
    placement = close_to_files(non_fixed(8, input_file=DATA), PAPER, replicas=[replica("C2")])
    assert [(c.site, c.transfer_s) for c in placement.components] == [("C2", 0.0)]


def test_no_bandwidth_function_with_a_needed_transfer_is_a_request_error() -> None:
    with pytest.raises(RequestError, match=r"^bandwidth: needed to estimate moving data.h5"):
        worst_fit(non_fixed(8, input_file=DATA), PAPER, replicas=[replica("C2")])


@pytest.mark.parametrize(
    ("request_", "component_size", "source", "site", "rate", "seconds"),
    [
        pytest.param(non_fixed(8, 8, 8, input_file=DATA), 8, "A", "B", 100.0, 8.0, id="whole"),
        pytest.param(
            non_fixed(8, 8, 8, input_file=CHUNKS),
            8,
            "A",
            "B",
            100.0,
            266_666_667 / MB / 100.0,
            id="chunked: ceil(800 MB x 8 / 24) bytes",
        ),
        pytest.param(
            flexible(24, input_file=CHUNKS), 18, "A", "B", 10.0, 60.0, id="chunked flexible"
        ),
        pytest.param(non_fixed(8, input_file=DATA), 8, "A", "A", 0.0, 0.0, id="same site"),
        pytest.param(non_fixed(8, input_file=DATA), 8, "A", "B", 0.0, math.inf, id="no link"),
        pytest.param(non_fixed(8, input_file=DATA), 8, "A", "B", math.inf, 0.0, id="free link"),
    ],
)
def test_transfer_seconds(
    request_: CoAllocationRequest,
    component_size: int,
    source: str,
    site: str,
    rate: float,
    seconds: float,
) -> None:
    got = component_transfer_seconds(
        request_, component_size, replica(source), site, lambda s, d: rate
    )
    assert got == pytest.approx(seconds)


def test_transfer_seconds_without_a_replica() -> None:
    assert component_transfer_seconds(non_fixed(8), 8, None, "C1", None) == 0.0
    assert (
        component_transfer_seconds(non_fixed(8, input_file=DATA), 8, None, "C1", None) == math.inf
    )


def test_best_replica() -> None:
    request = non_fixed(8, input_file=DATA)
    table = links({("A", "C1"): 50.0, ("B", "C1"): 200.0})
    reps = [replica("A"), replica("B"), replica("C1", name="other.h5")]
    assert best_replica(request, 8, "C1", reps, table) == (reps[1], 4.0)
    assert best_replica(request, 8, "A", reps, None) == (reps[0], 0.0)
    assert best_replica(request, 8, "C1", reps[2:], table) == (None, math.inf)
    assert best_replica(non_fixed(8), 8, "C1", reps, table) == (None, 0.0)


# -- validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        pytest.param(
            CoAllocationRequest("", RequestKind.NON_FIXED, (Component(8),)),
            r"^request\.name: must not be empty",
            id="empty name",
        ),
        pytest.param(
            CoAllocationRequest("j", RequestKind.NON_FIXED),
            r"^request\.components: a non-fixed request needs at least one",
            id="non-fixed without components",
        ),
        pytest.param(
            CoAllocationRequest("j", RequestKind.FIXED),
            r"^request\.components: a fixed request needs at least one",
            id="fixed without components",
        ),
        pytest.param(
            non_fixed(8, 0),
            r"^request\.components\[1\]\.size: must be a positive integer .*, got 0$",
            id="a zero-size component",
        ),
        pytest.param(
            CoAllocationRequest("j", RequestKind.FIXED, (Component(8, "C1"), Component(4))),
            r"^request\.components\[1\]\.site: a fixed request names every component's site",
            id="fixed without a site",
        ),
        pytest.param(
            CoAllocationRequest("j", RequestKind.NON_FIXED, (Component(8, "C1"),)),
            r"^request\.components\[0\]\.site: a non-fixed request leaves sites",
            id="non-fixed naming a site",
        ),
        pytest.param(
            flexible(0), r"^request\.total: a flexible request needs a total > 0", id="total 0"
        ),
        pytest.param(
            CoAllocationRequest("j", RequestKind.FLEXIBLE, (Component(8),), total=8),
            r"^request\.components: a flexible request gives only a total",
            id="flexible with components",
        ),
        pytest.param(
            flexible(8, least=0),
            r"^request\.flexible\.min_component_size: must be a positive integer .*, got 0",
            id="min component size 0",
        ),
        pytest.param(
            flexible(8, least=9),
            r"^request\.flexible\.min_component_size: must be in \[1, 8\], got 9",
            id="min component size above the total",
        ),
        pytest.param(
            flexible(8, most=0),
            r"^request\.flexible\.max_components: must be a positive integer .*, got 0",
            id="max components 0",
        ),
        pytest.param(
            flexible(8, splits=((4, 4), (4, 3))),
            r"^request\.flexible\.splits\[1\]: parts sum to 7, not the total 8",
            id="a split that does not add up",
        ),
        pytest.param(
            flexible(8, splits=((8, 0),)),
            r"^request\.flexible\.splits\[0\]\[1\]: must be a positive integer .*, got 0",
            id="a split with an empty part",
        ),
        pytest.param(
            non_fixed(8, input_file=InputFile("")),
            r"^request\.input_file\.logical_name: must not be empty",
            id="an input file without a name",
        ),
    ],
)
def test_validation_names_the_field(request_: CoAllocationRequest, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        validate_request(request_)


def test_validation_of_fixed_sites_against_known_sites() -> None:
    request = fixed((8, "C1"), (4, "C9"))
    validate_request(request)
    with pytest.raises(RequestError, match=r"^request\.components\[1\]\.site: unknown site 'C9'"):
        validate_request(request, sites={"C1", "C2"})


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(non_fixed(8, 4), id="non-fixed"),
        pytest.param(fixed((8, "C1")), id="fixed"),
        pytest.param(flexible(24, least=4, most=3, splits=((12, 12),)), id="flexible"),
    ],
)
def test_valid_requests_pass(request_: CoAllocationRequest) -> None:
    validate_request(request_, sites={"C1", "C2"})


class SteppedClock:
    """Stands in for the ``time`` module in gridcore.experiments.bench_coallocation:
    ``perf_counter()`` returns the given readings in turn; everything else is the real module."""

    def __init__(self, readings: list[float]) -> None:
        self._readings = iter(readings)

    def perf_counter(self) -> float:
        return next(self._readings)

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


def test_bench_close_to_files_reports_the_median(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three decisions timed at 9, 1 and 2 ms: the median is 2 (mean 4, min 1, max 9).
    readings = [0.0, 0.009, 1.0, 1.001, 2.0, 2.002]
    monkeypatch.setattr(bench, "time", SteppedClock(readings))

    result = bench_close_to_files(clusters=50, components=4, repeats=3)

    assert result == {"cf_4comp_50sites_p50_ms": pytest.approx(2.0)}


def test_a_live_snapshot_places_on_its_free_processors() -> None:
    # C1 reports 32 idle, but 10 are ours in flight and 6 others' queued: 16 free, so it
    # places (and counts the quota's processors in use) exactly as 16 reported idle would.
    live = [
        SiteSnapshot("C1", 32, 32, in_flight_processors=10, external_pending_processors=6),
        *clusters(0, 12)[1:],
    ]
    assert live[0].free_processors == 16
    for quota in (None, 0.75):
        assert usable_idle(live[0], quota) == usable_idle(clusters(16)[0], quota)
        for policy in (WF, CM):
            got = place(non_fixed(16, 8), live, policy, quota)
            assert got == place(non_fixed(16, 8), clusters(16, 12), policy, quota)
