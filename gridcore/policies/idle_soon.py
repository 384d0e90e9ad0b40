"""An "idle soon" view for KOALA placement from a wait model's backfill plan (issue 22).

Design, where it is used and the measurement that decides its default:
``docs/coallocation.md`` (section "Idle soon from a wait model (issue 22)").

Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from gridcore.errors import ConfigError
from gridcore.model import CoAllocationRequest, Outcome, Placement, SiteSnapshot
from gridcore.policies.placement import PlacementPolicy, place
from gridcore.policies.wait_prediction import (
    DEFAULT_WAIT_MODEL,
    PLAN_DEPTH,
    QueueView,
    UserRuntimes,
    plan_starts,
)

PLAN_MODELS = frozenset({"backfill", "predicted_backfill"})
"""The wait models whose forecast is a backfill plan, the only ones that give a view."""

HORIZON_S = 60.0
"""How far ahead the view looks, and the longest a job defers (15 scans of 4 s); fixed
before the measurement (docs/coallocation.md)."""


@dataclass(frozen=True)
class IdleSoon:
    """The option: look ``horizon_s`` ahead with wait model ``model`` (a plan model)."""

    horizon_s: float = HORIZON_S
    model: str = DEFAULT_WAIT_MODEL

    def __post_init__(self) -> None:
        if not (math.isfinite(self.horizon_s) and self.horizon_s > 0):
            raise ConfigError(f"idle soon: horizon_s must be finite and > 0, got {self.horizon_s}")
        if self.model not in PLAN_MODELS:
            raise ConfigError(
                f"idle soon: model {self.model!r} has no backfill plan; use one of"
                f" {sorted(PLAN_MODELS)}"
            )


def idle_at(view: QueueView, at: float, runtimes: UserRuntimes | None) -> int:
    """Processors free at ``at`` (>= ``view.now``) in the backfill plan of ``view``: the
    running jobs end at their predicted ends (``runtimes``; ``None``: the requested end,
    as the ``backfill`` model plans), the queued jobs (the first :data:`PLAN_DEPTH`,
    those larger than the cluster left out) are planned ahead with their predicted run
    times, and what is neither still running nor planned busy at ``at`` is free."""
    now, total = view.now, view.total_processors
    ends = [
        (
            runtimes.predicted_end(r, now)
            if runtimes is not None
            else max(now, r.started_at + r.requested_s),
            r.processors,
        )
        for r in view.running
    ]
    queue = [
        (q.processors, runtimes.predict(q.user, q.requested_s) if runtimes else q.requested_s)
        for q in view.queued[:PLAN_DEPTH]
        if q.processors <= total
    ]
    starts = plan_starts(now, total, ends, queue)
    busy = sum(p for end, p in ends if end > at)
    busy += sum(p for (p, d), s in zip(queue, starts, strict=True) if s <= at < s + d)
    return max(0, total - busy)


def soon_snapshot(snapshot: SiteSnapshot, idle_soon: int) -> SiteSnapshot:
    """``snapshot`` with ``idle_soon`` idle processors (nothing else pending): the view a
    placement policy is given."""
    return dataclasses.replace(
        snapshot,
        idle_processors=max(0, min(idle_soon, snapshot.total_processors)),
        external_pending_processors=0,
        in_flight_processors=0,
    )


@dataclass(frozen=True)
class SoonChoice:
    """Defer ``request`` (wait for the soon placement) or take the placement now."""

    defer: bool
    now: Placement
    soon: Placement | None
    reason: str


def defer_for_fewer_clusters(
    request: CoAllocationRequest,
    now: Placement,
    soon_clusters: Sequence[SiteSnapshot],
    policy: PlacementPolicy,
    quota: float | None = None,
) -> SoonChoice:
    """Defer a job that fits now (``now``) on two or more clusters when ``policy`` places
    it on fewer on the idle-soon view ``soon_clusters`` (fewer clusters, a shorter
    execution: docs/coallocation.md); otherwise take ``now``."""
    if now.outcome is not Outcome.FIT or now.clusters_combined < 2:
        return SoonChoice(False, now, None, "fits on one cluster or not at all: no deferral")
    soon = place(request, soon_clusters, policy, quota)
    if soon.outcome is Outcome.FIT and soon.clusters_combined < now.clusters_combined:
        reason = (
            f"defer: {now.clusters_combined} clusters now,"
            f" {soon.clusters_combined} on the idle-soon view"
        )
        return SoonChoice(True, now, soon, reason)
    return SoonChoice(False, now, soon, "the idle-soon view needs no fewer clusters: place now")
