"""Co-allocation placement: on which clusters the components of a parallel job run.

Design, equations and the choices where a paper is ambiguous: ``docs/coallocation.md``
(section ``gridcore/policies/placement.py``).
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gridcore.errors import RequestError
from gridcore.model import (
    MB,
    CoAllocationRequest,
    Outcome,
    PlacedComponent,
    Placement,
    Replica,
    RequestKind,
    SiteSnapshot,
)
from gridcore.policies.transfer import Bandwidth, best_replica, component_bytes
from gridcore.validation import check_coallocation_request


class PlacementPolicy(enum.StrEnum):
    WF = "WF"
    CF = "CF"
    CM = "CM"
    FCM = "FCM"


# Clusters listed by name in a reason before "... N more": a reason stays readable on a
# grid of a thousand clusters.
_LISTED = 8
# floor(q * total) must not lose a processor to binary rounding (0.29 * 100 = 28.99...).
_QUOTA_SLACK = 1e-9

# (component index, size, cluster position in the snapshot)
_Slot = tuple[int, int, int]


def place(
    request: CoAllocationRequest,
    clusters: Sequence[SiteSnapshot],
    policy: PlacementPolicy,
    quota: float | None = None,
    *,
    replicas: Sequence[Replica] = (),
    bandwidth: Bandwidth | None = None,
) -> Placement:
    """Place ``request`` on one snapshot of the clusters with ``policy``.

    ``request`` is trusted: the boundaries that take one in check it
    (:func:`validate_request`), and a placement queue rescans the same jobs many times."""
    policy = PlacementPolicy(policy)
    _check_quota(quota)
    files = _replicas_of(request, replicas)
    if request.input_file is not None and not files:
        return _no_fit(request, policy, [f"no replica of {request.input_file.logical_name}"])
    if not clusters:
        return _no_fit(request, policy, ["no clusters to place on"])
    pool = _Pool.of(clusters, quota)
    transfers = _Transfers(request, files, pool.sites, bandwidth)
    slots, reasons = _dispatch(policy, request, pool, transfers)
    if quota is not None:
        reasons.append(f"quota {quota:g}: at most floor({quota:g} x total) processors in use")
    if slots is None:
        return _no_fit(request, policy, reasons)
    return _fit(request, policy, slots, pool, files, bandwidth, reasons)


def worst_fit(
    request: CoAllocationRequest,
    clusters: Sequence[SiteSnapshot],
    quota: float | None = None,
    *,
    replicas: Sequence[Replica] = (),
    bandwidth: Bandwidth | None = None,
) -> Placement:
    """WF (KOALA 2006 Sec. 4): each component on the cluster with the most usable idle left."""
    return place(
        request, clusters, PlacementPolicy.WF, quota, replicas=replicas, bandwidth=bandwidth
    )


def close_to_files(
    request: CoAllocationRequest,
    clusters: Sequence[SiteSnapshot],
    quota: float | None = None,
    *,
    replicas: Sequence[Replica] = (),
    bandwidth: Bandwidth | None = None,
) -> Placement:
    """CF (KOALA 2005 Sec. 2.6): among clusters with room, the shortest input transfer."""
    return place(
        request, clusters, PlacementPolicy.CF, quota, replicas=replicas, bandwidth=bandwidth
    )


def cluster_minimization(
    request: CoAllocationRequest,
    clusters: Sequence[SiteSnapshot],
    quota: float | None = None,
    *,
    replicas: Sequence[Replica] = (),
    bandwidth: Bandwidth | None = None,
) -> Placement:
    """CM (KOALA 2006 Fig. 1): first fit over the clusters sorted once by usable idle."""
    return place(
        request, clusters, PlacementPolicy.CM, quota, replicas=replicas, bandwidth=bandwidth
    )


def flexible_cluster_minimization(
    request: CoAllocationRequest,
    clusters: Sequence[SiteSnapshot],
    quota: float | None = None,
    *,
    replicas: Sequence[Replica] = (),
    bandwidth: Bandwidth | None = None,
) -> Placement:
    """FCM (KOALA 2006 Fig. 3): cut a flexible request to fill the emptiest clusters."""
    return place(
        request, clusters, PlacementPolicy.FCM, quota, replicas=replicas, bandwidth=bandwidth
    )


def validate_request(request: CoAllocationRequest, sites: Collection[str] | None = None) -> None:
    """Raise :class:`RequestError` naming the first malformed field of ``request``; with
    ``sites``, a fixed request may only name those sites. The checks are the request
    model's (:func:`gridcore.validation.check_coallocation_request`), run where a request
    comes in (``CoAllocationEngine.submit``); the policies themselves trust the request."""
    check_coallocation_request(request, sites)


def usable_idle(cluster: SiteSnapshot, quota: float | None) -> int:
    """Idle processors a placement may use: with quota q, processors in use after the
    placement stay <= floor(q * total) (KOALA 2006 Sec. 4.1). Idle here is the snapshot's
    :attr:`~SiteSnapshot.free_processors`; the rest of the site counts as in use."""
    idle = cluster.free_processors
    if quota is not None:
        _check_quota(quota)
        total = cluster.total_processors
        idle = min(idle, math.floor(quota * total + _QUOTA_SLACK) - (total - idle))
    return max(0, idle)


# -- policy dispatch -------------------------------------------------------------------


@dataclass
class _Pool:
    """The clusters of one decision: names, usable idle at the start, and what is left."""

    sites: list[str]
    usable: list[int]
    left: list[int]

    @classmethod
    def of(cls, clusters: Sequence[SiteSnapshot], quota: float | None) -> _Pool:
        if quota is None:
            usable = [f if (f := c.free_processors) > 0 else 0 for c in clusters]
        else:
            usable = [usable_idle(c, quota) for c in clusters]
        return cls([c.site for c in clusters], usable, usable.copy())

    def fresh(self) -> _Pool:
        return _Pool(self.sites, self.usable, self.usable.copy())


def _dispatch(
    policy: PlacementPolicy,
    request: CoAllocationRequest,
    pool: _Pool,
    transfers: _Transfers,
) -> tuple[list[_Slot] | None, list[str]]:
    if request.kind is RequestKind.FIXED:
        return _fixed(request, pool)
    # FCM on dictated sizes has nothing to cut: it is CM (docs/coallocation.md).
    sized = PlacementPolicy.CM if policy is PlacementPolicy.FCM else policy
    if request.kind is RequestKind.NON_FIXED:
        slots, reasons = _sized(sized, [c.size for c in request.components], pool, transfers)
        if policy is PlacementPolicy.FCM:
            reasons.append("FCM: a non-fixed request dictates its sizes; placed by CM")
        return slots, reasons
    if request.flexible.splits:
        return _splits(sized, request.flexible.splits, pool, transfers)
    if policy is PlacementPolicy.FCM:
        return _fcm(request, pool)
    return None, ["flexible requests without splits need FCM"]


def _sized(
    policy: PlacementPolicy,
    sizes: Sequence[int],
    pool: _Pool,
    transfers: _Transfers,
) -> tuple[list[_Slot] | None, list[str]]:
    """A non-fixed request (or one split of a flexible one) under WF, CF or CM."""
    # Decreasing size; equal sizes keep request order (sorted is stable).
    order = sorted(enumerate(sizes), key=lambda item: -item[1])
    if policy is PlacementPolicy.CM:
        return _cm(order, pool)
    if policy is PlacementPolicy.CF and transfers.needed:
        return _cf(order, pool, transfers)
    slots, reasons = _wf(order, pool)
    if policy is PlacementPolicy.CF and slots is not None:
        reasons.append("CF: no input file to move, so CF places as WF does")
    return slots, reasons


def _splits(
    policy: PlacementPolicy,
    splits: Sequence[Sequence[int]],
    pool: _Pool,
    transfers: _Transfers,
) -> tuple[list[_Slot] | None, list[str]]:
    """KOALA 2006 Sec. 2.2: the allowed splits in order of preference; the first that fits."""
    reasons: list[str] = []
    for k, split in enumerate(splits):
        label = f"split {k} ({'+'.join(map(str, split))})"
        attempt = pool.fresh()
        slots, why = _sized(policy, split, attempt, transfers)
        if slots is not None:
            pool.left[:] = attempt.left
            return slots, [*reasons, f"{label}: fits under {policy.value}", *why]
        reasons.extend(f"{label}: {line}" for line in why)
    return None, reasons


# -- the policies ----------------------------------------------------------------------


def _wf(order: Sequence[tuple[int, int]], pool: _Pool) -> tuple[list[_Slot] | None, list[str]]:
    """KOALA 2006 Sec. 4: the cluster with the largest remaining number of idle processors."""
    left = pool.left
    positions = range(len(left))
    slots: list[_Slot] = []
    for index, size in order:
        pos = max(positions, key=left.__getitem__)  # max keeps the first of equals
        if left[pos] < size:
            return None, [_cannot(index, size, pool)]
        left[pos] -= size
        slots.append((index, size, pos))
    return slots, ["WF: each component on the cluster with the most usable idle left"]


def _cm(order: Sequence[tuple[int, int]], pool: _Pool) -> tuple[list[_Slot] | None, list[str]]:
    """KOALA 2006 Fig. 1: clusters by decreasing idle, sorted once (lines 1-2); each
    component on the first cluster in that order that can accommodate it (lines 3-8)."""
    left = pool.left
    ranked = sorted(range(len(left)), key=pool.usable.__getitem__, reverse=True)
    slots: list[_Slot] = []
    for index, size in order:
        for pos in ranked:
            if left[pos] >= size:
                break
        else:
            return None, [_cannot(index, size, pool)]  # Fig. 1 lines 9-10
        left[pos] -= size
        slots.append((index, size, pos))
    return slots, [_in_order("CM", pool, ranked)]


def _cf(
    order: Sequence[tuple[int, int]], pool: _Pool, transfers: _Transfers
) -> tuple[list[_Slot] | None, list[str]]:
    """KOALA 2005 Sec. 2.6: "when there is a choice among execution sites for a job
    component, we choose the site such that the (estimated) delay of transferring the
    input file to the execution site is minimal"."""
    left = pool.left
    by_idle = sorted(range(len(left)), key=pool.usable.__getitem__, reverse=True)
    touched: dict[int, None] = {}  # clusters that got a component: their key changed
    slots: list[_Slot] = []
    for index, size in order:
        delay, ranked = transfers.ranking(size, by_idle)
        pos = _closest(size, delay, ranked, left, touched)
        if pos < 0:
            return None, [_cannot(index, size, pool)]
        left[pos] -= size
        touched[pos] = None
        slots.append((index, size, pos))
    return slots, ["CF: each component where its input arrives soonest, among clusters with room"]


def _closest(
    size: int,
    delay: list[float],
    ranked: list[int],
    left: list[int],
    touched: dict[int, None],
) -> int:
    """The eligible cluster with the least (delay, -remaining idle, position), or -1.

    ``ranked`` orders every cluster by that key on its *initial* idle, so the first
    untouched one with room is the best untouched one; the few touched clusters are
    compared on their remaining idle. No per-cluster work beyond the scan."""
    best = -1
    for pos in ranked:
        if left[pos] >= size and pos not in touched:
            best = pos
            break
    for pos in touched:
        if left[pos] < size:
            continue
        if best < 0 or (delay[pos], -left[pos], pos) < (delay[best], -left[best], best):
            best = pos
    return best


def _fcm(request: CoAllocationRequest, pool: _Pool) -> tuple[list[_Slot] | None, list[str]]:
    """KOALA 2006 Fig. 3, with the user's bounds of Sec. 2.2 (rules in docs/coallocation.md)."""
    least = request.flexible.min_component_size
    most = request.flexible.max_components or len(pool.sites)
    left = pool.left
    ranked = sorted(range(len(left)), key=pool.usable.__getitem__, reverse=True)  # line 2
    remaining = request.total  # line 3
    slots: list[_Slot] = []
    for pos in ranked:  # line 4
        idle = left[pos]  # line 5
        if idle >= remaining:  # lines 6-9
            take = remaining
        elif len(slots) + 1 >= most:
            break  # the last allowed component must take the rest; smaller clusters follow
        else:  # lines 10-13, leaving a remainder that is itself a legal component
            take = min(idle, remaining - least)
            if take < least:
                continue
        left[pos] -= take
        slots.append((len(slots), take, pos))
        remaining -= take
        if remaining == 0:
            return slots, [_in_order("FCM", pool, ranked)]
    return None, [_fcm_failure(request, pool, ranked, least, most)]  # lines 16-17


def _fcm_failure(
    request: CoAllocationRequest, pool: _Pool, ranked: list[int], least: int, most: int
) -> str:
    room = [pool.usable[pos] for pos in ranked if pool.usable[pos] >= least]
    limits = f"components of >= {least} procs, at most {most} of them"
    listing = _listing(pool, ranked, pool.usable)
    if sum(room[:most]) >= request.total:
        return f"FCM: {request.total} procs do not fit in {limits} ({listing})"
    return (
        f"FCM: {request.total} procs requested, {sum(room[:most])} usable idle"
        f" in {limits} ({listing})"
    )


def _fixed(request: CoAllocationRequest, pool: _Pool) -> tuple[list[_Slot] | None, list[str]]:
    """KOALA 2006 Sec. 2.2: a fixed request names its sites; each must have room."""
    where: dict[str, int] = {}
    for pos, site in enumerate(pool.sites):
        where.setdefault(site, pos)
    slots: list[_Slot] = []
    problems: list[str] = []
    for index, component in enumerate(request.components):
        site = component.site or ""
        pos = where.get(site, -1)
        head = f"component {index} ({component.size} procs)"
        if pos < 0:
            problems.append(f"{head}: site {site} is not in the snapshot")
        elif pool.left[pos] < component.size:
            problems.append(
                f"{head}: site {site}: {pool.left[pos]} usable idle < {component.size} needed"
            )
        else:
            pool.left[pos] -= component.size
            slots.append((index, component.size, pos))
    if problems:
        return None, problems
    return slots, ["fixed request: every component on its named site"]


# -- transfers -------------------------------------------------------------------------


class _Transfers:
    """Transfer delays from each cluster's best replica, computed once per decision (per
    distinct number of bytes to move) and reused by every component."""

    def __init__(
        self,
        request: CoAllocationRequest,
        files: Sequence[Replica],
        sites: list[str],
        bandwidth: Bandwidth | None,
    ) -> None:
        self.request = request
        self.files = files
        self.sites = sites
        self.bandwidth = bandwidth
        self.needed = bool(files)
        self._rates: list[list[float]] | None = None
        self._ranked: dict[tuple[int, ...], tuple[list[float], list[int]]] = {}

    def ranking(self, size: int, by_idle: list[int]) -> tuple[list[float], list[int]]:
        """Per cluster the delay for a component of ``size``, and the clusters ordered by
        (delay, -usable idle, position); ``by_idle`` is the order of the last two."""
        moved = tuple(component_bytes(self.request, r, size) for r in self.files)
        found = self._ranked.get(moved)
        if found is None:
            delay = self._delays(moved)
            found = self._ranked[moved] = (delay, sorted(by_idle, key=delay.__getitem__))
        return found

    def _delays(self, moved: tuple[int, ...]) -> list[float]:
        rates = self.rates()
        if len(set(moved)) == 1:
            # Every replica moves the same bytes, so the fastest link wins: division is
            # monotone, hence min over replicas of k / rate == k / (max rate), exactly.
            fastest = rates[0] if len(rates) == 1 else list(map(max, *rates))
            return _seconds(moved[0] / MB, fastest)
        return list(map(min, *(_seconds(n / MB, r) for n, r in zip(moved, rates, strict=True))))

    def rates(self) -> list[list[float]]:
        """MB/s from each replica to each cluster; inf at the replica's own site (0 s)
        and 0 (never) where no bandwidth function can tell."""
        if self._rates is None:
            self._rates = [self._rates_from(replica.site) for replica in self.files]
        return self._rates

    def _rates_from(self, source: str) -> list[float]:
        sites = self.sites
        local = _positions(sites, source)
        if self.bandwidth is None:
            rates = [0.0] * len(sites)
        else:
            # The bandwidth function is never asked about a site to itself; map() keeps
            # this loop of a thousand calls out of the interpreter.
            rates, start = [], 0
            for pos in [*local, len(sites)]:
                rates.extend(map(self.bandwidth, itertools.repeat(source), sites[start:pos]))
                rates.append(math.inf)
                start = pos + 1
            rates.pop()
        for pos in local:
            rates[pos] = math.inf
        return rates


def _positions(sites: list[str], site: str) -> list[int]:
    """Where ``site`` occurs in ``sites`` (list.index scans in C)."""
    found: list[int] = []
    with contextlib.suppress(ValueError):
        while True:
            found.append(sites.index(site, found[-1] + 1 if found else 0))
    return found


def _seconds(megabytes: float, rates: list[float]) -> list[float]:
    """megabytes / rate per cluster (as transfer.transfer_seconds); inf if rate <= 0."""
    if min(rates, default=1.0) > 0:
        return list(map(megabytes.__truediv__, rates))
    return [megabytes / rate if rate > 0 else math.inf for rate in rates]


def _replicas_of(request: CoAllocationRequest, replicas: Sequence[Replica]) -> list[Replica]:
    if request.input_file is None:
        return []
    name = request.input_file.logical_name
    return [r for r in replicas if r.logical_name == name]


# -- decisions -------------------------------------------------------------------------


def _fit(
    request: CoAllocationRequest,
    policy: PlacementPolicy,
    slots: list[_Slot],
    pool: _Pool,
    files: Sequence[Replica],
    bandwidth: Bandwidth | None,
    reasons: list[str],
) -> Placement:
    placed: list[PlacedComponent] = []
    lines: list[str] = []
    for index, size, pos in sorted(slots):
        site = pool.sites[pos]
        line = f"component {index} ({size} procs) -> {site} (usable idle {pool.usable[pos]} before)"
        if files:
            replica, seconds = best_replica(request, size, site, files, bandwidth)
            file_site = replica.site if replica is not None else None
            placed.append(PlacedComponent(index, size, site, file_site, seconds))
            line += f"; input from {file_site}, est. {seconds:.1f} s"
        else:
            placed.append(PlacedComponent(index, size, site))
        lines.append(line)
    combined = len({c.site for c in placed})
    head = f"{policy.value}: {len(placed)} components on {combined} clusters"
    return Placement(
        request.name, policy.value, Outcome.FIT, tuple(placed), (head, *reasons, *lines)
    )


def _no_fit(request: CoAllocationRequest, policy: PlacementPolicy, reasons: list[str]) -> Placement:
    return Placement(request.name, policy.value, Outcome.NO_FIT, (), tuple(reasons))


def _cannot(index: int, size: int, pool: _Pool) -> str:
    return (
        f"component {index} ({size} procs): no cluster has {size} usable idle"
        f" ({_listing(pool, range(len(pool.sites)))})"
    )


def _in_order(policy: str, pool: _Pool, ranked: list[int]) -> str:
    return (
        f"{policy}: clusters in fixed order of usable idle: {_listing(pool, ranked, pool.usable)}"
    )


def _listing(pool: _Pool, order: Sequence[int], values: list[int] | None = None) -> str:
    """Usable idle per cluster (by default what is left), the first few in ``order``."""
    values = pool.left if values is None else values
    shown = ", ".join(f"{pool.sites[pos]} {values[pos]}" for pos in order[:_LISTED])
    if len(order) <= _LISTED:
        return shown
    return f"{shown}, ... {len(order) - _LISTED} more, the most {max(values)}"


# -- validation ------------------------------------------------------------------------


def _check_quota(quota: float | None) -> None:
    if quota is not None and not 0.0 < quota <= 1.0:
        raise RequestError(f"quota: must be in (0, 1], got {quota}")
