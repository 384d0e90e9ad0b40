"""The operator's default selection (earliest-completion): every site ranked by its
estimated completion, the two defects of the paper's ``best`` rule that made it lose to
naive on untuned grids, and the burst decided on one snapshot."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridcore.model import JobRequest, Outcome, SiteSnapshot
from gridcore.policies.selection import (
    DEFAULT_PROTOCOL,
    InsufficientMode,
    SelectionProtocol,
    estimated_queue_delay,
    select_site,
    select_sites,
)
from gridcore.policies.transfer import free_bandwidth


def _snap(site: str, total: int, free: int, slowness: float, **extra: object) -> SiteSnapshot:
    """A site whose free processors (idle minus ours in flight) are ``free``."""
    in_flight = max(0, -free)
    return SiteSnapshot(
        site, total, max(0, free), slowness, in_flight_processors=in_flight, **extra
    )  # type: ignore[arg-type]


def _pick(protocol: SelectionProtocol, mode: InsufficientMode, sites: list[SiteSnapshot]) -> str:
    request = JobRequest("m", 2, runtime_s=600.0)
    decision = select_site(request, sites, free_bandwidth, protocol, mode, rng=random.Random(0))
    assert decision.site is not None
    return decision.site


# (case, snapshots, request processors, what `best` picks, what the default must pick)
CASES = [
    pytest.param(
        # No site fits: `best` takes the largest idle count in absolute processors, so a
        # small slow site at -1 beats a large fast one at -3.
        [_snap("small-slow", 4, -1, 2.0), _snap("large-fast", 32, -3, 1.0)],
        "small-slow",
        "large-fast",
        id="no-fit-large-fast-beats-small-slow",
    ),
    pytest.param(
        # A fitting site twice as slow beats any non-fitting one under `best`, even when
        # the fast site is one member's processors short and frees them soon.
        [_snap("fits-slow", 16, 8, 2.0), _snap("fast-short", 32, 1, 1.0)],
        "fits-slow",
        "fast-short",
        id="fast-non-fitting-beats-fitting-twice-as-slow",
    ),
]


@pytest.mark.parametrize(("sites", "best_picks", "default_picks"), CASES)
def test_the_default_picks_the_earliest_completion_where_best_does_not(
    sites: list[SiteSnapshot], best_picks: str, default_picks: str
) -> None:
    assert _pick(SelectionProtocol.STATEFUL, InsufficientMode.BEST, sites) == best_picks
    assert _pick(DEFAULT_PROTOCOL, InsufficientMode.BEST, sites) == default_picks


def test_the_default_counts_our_in_flight_work_and_others_queue() -> None:
    # reported idle 8 on the fast site, but 8 of ours are in flight there: it is full
    fast = SiteSnapshot("fast", 8, 8, 1.0, in_flight_processors=8)
    slow = SiteSnapshot("slow", 8, 8, 1.3)
    assert _pick(DEFAULT_PROTOCOL, InsufficientMode.BEST, [fast, slow]) == "slow"
    assert DEFAULT_PROTOCOL.counts_in_flight
    assert not SelectionProtocol.NAIVE.counts_in_flight


def test_queue_delay_is_the_largest_of_observed_wait_half_a_runtime_and_the_drain() -> None:
    request = JobRequest("m", 4, runtime_s=600.0)
    # Eq. (W): deficit 4 - (-20) = 24 on 8 processors, R = 600 x 1.5 = 900
    deep = SiteSnapshot("s", 8, 0, 1.5, in_flight_processors=20)
    assert estimated_queue_delay(request, deep, deep.free_processors) == pytest.approx(2700.0)
    # a deficit of 1 on 32 processors: half a runtime (450 s) dominates the drain (28 s)
    shallow = SiteSnapshot("s", 32, 3, 1.5)
    assert estimated_queue_delay(request, shallow, 3) == pytest.approx(450.0)
    observed = SiteSnapshot("s", 32, 3, 1.5, mean_queue_wait_s=1000.0)
    assert estimated_queue_delay(request, observed, 3) == pytest.approx(1000.0)
    assert estimated_queue_delay(request, shallow, 4) == 0.0
    # 4-processor members keep only 4 of 6 processors busy: a deficit of 12 drains at
    # 4 per runtime (R = 600): 3 runtimes, not 2
    small = SiteSnapshot("s", 6, 0, 1.0, in_flight_processors=8)
    assert estimated_queue_delay(request, small, small.free_processors) == pytest.approx(1800.0)
    assert estimated_queue_delay(JobRequest("m", 8), small, 0) == math.inf


_site = st.builds(
    lambda total, idle, slowness, in_flight, pending, wait: (
        total, min(idle, total), slowness, in_flight, pending, wait
    ),
    st.integers(1, 64),
    st.integers(0, 64),
    st.floats(1.0, 3.0),
    st.integers(0, 80),
    st.integers(0, 40),
    st.one_of(st.none(), st.floats(0.0, 5000.0)),
)  # fmt: skip


def _snapshots(specs: list[tuple[int, int, float, int, int, float | None]]) -> list[SiteSnapshot]:
    return [
        SiteSnapshot(f"s{i}", total, idle, slowness, in_flight, pending, 0, True, wait)
        for i, (total, idle, slowness, in_flight, pending, wait) in enumerate(specs)
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_site, min_size=1, max_size=8),
    st.integers(1, 16),
    st.floats(1.0, 5000.0),
)
def test_the_defaults_pick_has_no_later_estimated_completion_than_any_other_site(
    specs: list[tuple[int, int, float, int, int, float | None]], processors: int, runtime: float
) -> None:
    snapshots = _snapshots(specs)
    request = JobRequest("m", processors, runtime_s=runtime)
    decision = select_site(
        request, snapshots, free_bandwidth, DEFAULT_PROTOCOL, rng=random.Random(0)
    )
    large_enough = [s for s in snapshots if s.total_processors >= processors]
    if not large_enough:
        assert decision.site is None and decision.outcome is Outcome.NO_FIT
        return
    assert {e.site for e in decision.estimates} == {s.site for s in large_enough}
    chosen = next(e for e in decision.estimates if e.site == decision.site)
    assert all(chosen.completion_s <= e.completion_s for e in decision.estimates)
    assert decision.outcome is (Outcome.FIT if chosen.fits else Outcome.QUEUE)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(_site, min_size=1, max_size=6),
    st.lists(st.integers(1, 8), min_size=1, max_size=30),
    st.sampled_from(list(SelectionProtocol)),
)
def test_a_burst_on_one_snapshot_decides_as_members_one_by_one_with_each_added_in_flight(
    specs: list[tuple[int, int, float, int, int, float | None]],
    sizes: list[int],
    protocol: SelectionProtocol,
) -> None:
    snapshots = _snapshots([(max(t, 8), i, s, f, p, w) for t, i, s, f, p, w in specs])
    requests = [JobRequest(f"m{i}", p, runtime_s=600.0) for i, p in enumerate(sizes)]
    batch = select_sites(requests, snapshots, free_bandwidth, protocol, rng=random.Random(7))
    rng = random.Random(7)
    current = {s.site: s for s in snapshots}
    for request, decided in zip(requests, batch, strict=True):
        one = select_site(request, list(current.values()), free_bandwidth, protocol, rng=rng)
        assert one.site == decided.site and one.outcome is decided.outcome
        assert one.site is not None
        snap = current[one.site]
        current[one.site] = SiteSnapshot(
            snap.site, snap.total_processors, snap.idle_processors, snap.slowness,
            snap.in_flight_processors + request.processors, snap.external_pending_processors,
            snap.pending_jobs, snap.usable, snap.mean_queue_wait_s, snap.mean_runtime_s,
        )  # fmt: skip


def test_a_burst_spreads_over_sites_instead_of_piling_on_one() -> None:
    snapshots = [SiteSnapshot("a", 8, 8, 1.0), SiteSnapshot("b", 8, 8, 1.1)]
    requests = [JobRequest(f"m{i}", 4, runtime_s=600.0) for i in range(4)]
    sites = [
        d.site
        for d in select_sites(
            requests, snapshots, free_bandwidth, DEFAULT_PROTOCOL, rng=random.Random(0)
        )
    ]
    assert sites == ["a", "a", "b", "b"]


def test_adding_in_flight_work_changes_only_that_count() -> None:
    from dataclasses import replace

    snap = SiteSnapshot("s", 16, 7, 1.3, 2, 3, 4, False, 12.0, 34.0)
    assert snap.add_in_flight(5) == replace(snap, in_flight_processors=7)
    assert snap.add_in_flight(5).free_processors == snap.free_processors - 5


def test_a_requests_shape_is_every_field_but_its_name() -> None:
    from dataclasses import astuple, fields

    request = JobRequest("m", 3, 12.5, 7, 9, "elsewhere")
    assert fields(JobRequest)[0].name == "name"
    assert request.shape == astuple(request)[1:]
