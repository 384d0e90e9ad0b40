"""Site selection for independent jobs (ensemble members).

Design, equations and the choices where a paper is ambiguous: ``docs/selection.md``
(section ``gridcore/policies/selection.py``).
"""

from __future__ import annotations

import enum
import heapq
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from gridcore.model import (
    ASSUMED_RUNTIME_S,
    JobRequest,
    Outcome,
    RuntimeBasis,
    SiteEstimate,
    SiteSelection,
    SiteSnapshot,
)
from gridcore.policies.transfer import Bandwidth, job_transfer_seconds

if TYPE_CHECKING:
    # wait_prediction's eq_w model reads this module's Eq. W: a type only, here.
    from gridcore.policies.wait_prediction import WaitForecast


class SelectionProtocol(enum.StrEnum):
    NAIVE = "naive"
    STATEFUL = "stateful"
    RANDOM = "random"
    EARLIEST_COMPLETION = "earliest-completion"

    @property
    def counts_in_flight(self) -> bool:
        """Does it discount our own work not yet visible (Protocol 1's stateful branch)?
        Such a protocol's FIT claims are conditional: they must still fit when applied."""
        return self in (SelectionProtocol.STATEFUL, SelectionProtocol.EARLIEST_COMPLETION)


DEFAULT_PROTOCOL = SelectionProtocol.EARLIEST_COMPLETION
"""What ``site="auto"`` uses (operators, ``GridRuntime.select``): every site ranked by
estimated completion. The paper's protocols stay for the reproduction."""


class InsufficientMode(enum.StrEnum):
    RANDOM = "random"
    BEST = "best"
    EARLIEST = "earliest"


def select_site(
    request: JobRequest,
    snapshots: Sequence[SiteSnapshot],
    bandwidth: Bandwidth,
    protocol: SelectionProtocol = SelectionProtocol.STATEFUL,
    mode: InsufficientMode = InsufficientMode.BEST,
    *,
    rng: random.Random,
    waits: Mapping[str, WaitForecast] | None = None,
) -> SiteSelection:
    """Choose the site for ``request`` from one snapshot of every site. ``waits``: a
    wait model's forecast of this request's queue wait per site (the caller ran the
    model on the site's queue), used instead of Eq. W where given (:func:`estimate_site`)."""
    candidates, reasons = _candidates(request, snapshots)
    given = waits or {}
    estimates = [
        estimate_site(request, snap, bandwidth, protocol, given.get(snap.site))
        for snap in candidates
    ]
    return _choose_among(request, estimates, protocol, mode, reasons, rng)


def _choose_among(
    request: JobRequest,
    estimates: list[SiteEstimate],
    protocol: SelectionProtocol,
    mode: InsufficientMode,
    reasons: list[str],
    rng: random.Random,
) -> SiteSelection:
    """The decision over the candidates' estimates; ``reasons`` say why the other sites
    are not candidates."""
    if not estimates:
        return SiteSelection(None, Outcome.NO_FIT, protocol.value, mode.value, tuple(reasons))
    if protocol is SelectionProtocol.RANDOM:
        chosen = _draw(estimates, rng)
        reasons.append(f"random protocol picked {chosen.site}")
        return _decision(chosen, estimates, protocol, mode, reasons)
    if protocol is SelectionProtocol.EARLIEST_COMPLETION:
        # Every usable site ranked by Eq. (C) below; a fitting site wins only a tie.
        best = min(estimates, key=_completion_rank)
        return _earliest_completion(best, estimates, mode, reasons)
    fitting = [e for e in estimates if e.fits]
    if fitting:
        best = min(fitting, key=lambda e: (e.completion_s, -e.effective_idle, e.site))
        reasons.append(f"{best.site}: earliest estimated completion among {len(fitting)} fitting")
        return _decision(best, estimates, protocol, mode, reasons)
    reasons.append(f"no site has {request.processors} idle processors; mode {mode.value}")
    chosen = _insufficient(estimates, mode, rng)
    return _decision(chosen, estimates, protocol, mode, reasons)


def _earliest_completion(
    best: SiteEstimate,
    estimates: Sequence[SiteEstimate],
    mode: InsufficientMode,
    reasons: list[str],
) -> SiteSelection:
    reasons.append(f"{best.site}: earliest estimated completion among {len(estimates)}")
    return _decision(best, estimates, SelectionProtocol.EARLIEST_COMPLETION, mode, reasons)


def select_sites(
    requests: Sequence[JobRequest],
    snapshots: Sequence[SiteSnapshot],
    bandwidth: Bandwidth,
    protocol: SelectionProtocol = DEFAULT_PROTOCOL,
    mode: InsufficientMode = InsufficientMode.BEST,
    *,
    rng: random.Random,
    wait_for: Callable[[JobRequest, SiteSnapshot], WaitForecast | None] | None = None,
) -> list[SiteSelection]:
    """A burst decided on ONE snapshot ("snapshot, then admit", as Kueue admits a cycle):
    each member in turn by :func:`select_site`, its processors then added to the chosen
    site's in-flight work, so the next member sees it exactly as it would after a
    commit. For one request this is :func:`select_site`. ``wait_for``: a wait model's
    forecast of a member's wait at a site as its snapshot stands (the earlier members
    sent there in flight), used instead of Eq. W where it gives one (``select_site``'s
    ``waits``, asked again as the burst fills a site).

    A member's estimates depend on its shape (all but its name) and the snapshots only,
    and a decision changes one site's: a member shaped like an earlier one re-estimates
    only the sites whose snapshot changed since (a burst of 100 identical members over
    100 sites makes 199 estimates instead of 10,000). For earliest-completion each shape
    also keeps its sites in a heap by rank (stale entries dropped when they surface), so
    a member's pick costs a few heap steps instead of a scan of every site."""
    current = list(snapshots)
    position = {snap.site: index for index, snap in enumerate(current)}
    changed: list[str] = []  # the site of every decision so far, in order
    # shape -> (candidate site -> index, their estimates, the reasons that left sites
    # out, how many of ``changed`` the estimates have seen)
    seen: dict[tuple[object, ...], tuple[dict[str, int], list[SiteEstimate], list[str], int]] = {}
    ranked: dict[tuple[object, ...], list[tuple[tuple[float, bool, int, str], int]]] = {}
    by_rank = protocol is SelectionProtocol.EARLIEST_COMPLETION
    decisions = []
    for request in requests:
        shape = request.shape
        if shape in seen:
            candidate, estimates, left_out, since = seen[shape]
            heap = ranked.get(shape)
            # only an in-flight count changed: a candidate stays one
            for site in set(changed[since:]) & candidate.keys():
                snap = current[position[site]]
                index = candidate[site]
                wait = None if wait_for is None else wait_for(request, snap)
                estimates[index] = estimate_site(request, snap, bandwidth, protocol, wait)
                if heap is not None:
                    heapq.heappush(heap, (_completion_rank(estimates[index]), index))
        else:
            candidates, left_out = _candidates(request, current)
            estimates = [
                estimate_site(
                    request,
                    snap,
                    bandwidth,
                    protocol,
                    None if wait_for is None else wait_for(request, snap),
                )
                for snap in candidates
            ]
            candidate = {snap.site: i for i, snap in enumerate(candidates)}
            if by_rank:
                heap = [(_completion_rank(e), i) for i, e in enumerate(estimates)]
                heapq.heapify(heap)
                ranked[shape] = heap
        seen[shape] = (candidate, estimates, left_out, len(changed))
        if by_rank and estimates:
            heap = ranked[shape]
            while heap[0][0] != _completion_rank(estimates[heap[0][1]]):
                heapq.heappop(heap)  # an estimate replaced since it was pushed
            best = estimates[heap[0][1]]
            decision = _earliest_completion(best, estimates, mode, list(left_out))
        else:
            decision = _choose_among(request, list(estimates), protocol, mode, list(left_out), rng)
        decisions.append(decision)
        if decision.site is not None:
            index = position[decision.site]
            current[index] = current[index].add_in_flight(request.processors)
            changed.append(decision.site)
    return decisions


def effective_idle(snapshot: SiteSnapshot, protocol: SelectionProtocol) -> int:
    """Idle processors as the protocol sees them: the stateful protocol (Protocol 1)
    takes off ours in flight and others' queued work (:attr:`SiteSnapshot.free_processors`),
    the others trust the report."""
    if protocol.counts_in_flight:
        return snapshot.free_processors
    return snapshot.idle_processors


def _completion_rank(e: SiteEstimate) -> tuple[float, bool, int, str]:
    return (e.completion_s, not e.fits, -e.effective_idle, e.site)


def estimated_queue_delay(request: JobRequest, snapshot: SiteSnapshot, idle: int) -> float:
    """Expected wait before a site that lacks room starts ``request`` (beyond the paper).

    Eq. (W): with ``deficit = p - idle`` > 0 (``idle`` as the protocol sees it, so our
    in-flight members and others' queued work are the backlog), ``T`` the site's
    processors, ``T_p = floor(T / p) * p`` the processors members of this size keep busy
    at once, ``R`` the mean runtime there (observed, else this member's runtime x
    slowness) and ``B`` the backlog's (our in-flight processors at this member's runtime
    x slowness, others' queued ones at ``R``), ``W = max(W_obs, R / 2, deficit * B /
    T_p)``: no sooner than the observed
    mean queue wait; no sooner than a running job ends (half a runtime away on average,
    for jobs in random phase); no sooner than the backlog drains at ``T_p`` processors per
    runtime (a FIFO queue without backfill packs a small site badly: 4-processor
    members keep only 4 of 6 processors busy). A fitting site waits 0.
    """
    deficit = request.processors - idle
    if deficit <= 0:
        return 0.0
    own, _ = expected_runtime(request, snapshot)
    runtime = snapshot.mean_runtime_s
    if runtime is None:
        runtime = own
    packed = snapshot.total_processors // request.processors * request.processors
    if packed == 0:
        return math.inf  # the site is smaller than the member: it never starts there
    # The backlog's runtime: our in-flight members (this burst's, shaped like this one)
    # run about ``own``; others' queued work the observed mean. Others' short jobs must
    # not make a queue of our own long members look fast.
    inflight, external = snapshot.in_flight_processors, snapshot.external_pending_processors
    backlog = inflight + external
    backlog_runtime = (inflight * own + external * runtime) / backlog if backlog else runtime
    drain = deficit / packed * backlog_runtime
    observed = snapshot.mean_queue_wait_s or 0.0
    return max(observed, runtime / 2, drain)


def expected_runtime(request: JobRequest, snapshot: SiteSnapshot) -> tuple[float, RuntimeBasis]:
    """How long the member runs at the site, and how that is known: the request's runtime
    x the site's slowness; a request without one (None: nobody said), the mean runtime of
    the jobs that finished there (``SiteSnapshot.mean_runtime_s``); with no history
    either, :data:`~gridcore.model.ASSUMED_RUNTIME_S` x slowness, which the estimate's
    reason then says was assumed (a 2 s job was reported as "est. completion 600 s")."""
    if request.runtime_s is not None:
        return request.runtime_s * snapshot.slowness, RuntimeBasis.GIVEN
    if snapshot.mean_runtime_s is not None:
        return snapshot.mean_runtime_s, RuntimeBasis.HISTORY
    return ASSUMED_RUNTIME_S * snapshot.slowness, RuntimeBasis.ASSUMED


def estimate_site(
    request: JobRequest,
    snapshot: SiteSnapshot,
    bandwidth: Bandwidth,
    protocol: SelectionProtocol,
    wait: WaitForecast | None = None,
) -> SiteEstimate:
    """Eq. (C) at one site. Its queue delay is ``wait``'s point estimate when a wait
    model gave one for this site (``gridcore.policies.wait_prediction``: the model sees
    the site's queue, which a snapshot does not carry), else Eq. W (the ``eq_w`` model)."""
    idle = effective_idle(snapshot, protocol)
    fits = idle >= request.processors
    transfer = job_transfer_seconds(request, snapshot.site, bandwidth)
    compute, basis = expected_runtime(request, snapshot)
    if wait is None:
        queue_delay = estimated_queue_delay(request, snapshot, idle)
    else:
        queue_delay = max(0.0, wait.wait_s)
    completion = queue_delay + transfer + compute
    return SiteEstimate(
        snapshot.site,
        idle,
        fits,
        transfer,
        compute,
        queue_delay,
        completion,
        request.processors,
        snapshot.idle_processors,
        snapshot.in_flight_processors,
        snapshot.external_pending_processors,
        basis,
    )


def _candidates(
    request: JobRequest, snapshots: Sequence[SiteSnapshot]
) -> tuple[list[SiteSnapshot], list[str]]:
    usable: list[SiteSnapshot] = []
    reasons: list[str] = []
    for snap in snapshots:
        if not snap.usable:
            why = f" {snap.unusable_because}" if snap.unusable_because else ""
            reasons.append(f"site {snap.site}: marked unusable{why}")
        elif snap.total_processors < request.processors:
            reasons.append(
                f"site {snap.site}: {snap.total_processors} processors in all"
                f" < {request.processors} needed"
            )
        else:
            usable.append(snap)
    return usable, reasons


def _insufficient(
    estimates: Sequence[SiteEstimate],
    mode: InsufficientMode,
    rng: random.Random,
) -> SiteEstimate:
    if mode is InsufficientMode.RANDOM:
        return _draw(estimates, rng)
    if mode is InsufficientMode.BEST:
        # "the resource with the largest number of idle CPUs, even if that number is
        # negative because multiple jobs have been dispatched to it" (Sec. 4).
        return min(estimates, key=lambda e: (-e.effective_idle, e.completion_s, e.site))
    return min(estimates, key=lambda e: (e.completion_s, -e.effective_idle, e.site))


def _draw(estimates: Sequence[SiteEstimate], rng: random.Random) -> SiteEstimate:
    """A uniform draw among ``estimates`` in site-name order, so that the same ``rng``
    picks the same site whatever order the sites are listed in (the other choices break
    ties by name too): a grid listed in another order decides the same."""
    return rng.choice(sorted(estimates, key=lambda e: e.site))


def _decision(
    chosen: SiteEstimate,
    estimates: Sequence[SiteEstimate],
    protocol: SelectionProtocol,
    mode: InsufficientMode,
    reasons: list[str],
) -> SiteSelection:
    outcome = Outcome.FIT if chosen.fits else Outcome.QUEUE
    if not math.isfinite(chosen.completion_s):
        reasons.append(f"site {chosen.site}: completion estimate is not finite")
    return SiteSelection(
        chosen.site,
        outcome,
        protocol.value,
        mode.value,
        (*reasons, chosen.reason),
        tuple(estimates),
    )
