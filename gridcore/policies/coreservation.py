"""VJM's co-reservation decisions: expected-wait cluster selection, the reservation
lifetime, deadlock detection and resource reorganization.

Design, equations and the choices where a paper is ambiguous: ``docs/coreservation.md``
(section ``gridcore/policies/coreservation.py``).
"""

from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from gridcore.errors import ConfigError
from gridcore.model import Outcome


@dataclass(frozen=True)
class QueueStats:
    """What Eq. 1 knows of one cluster (``gridcore.engine.queue_stats`` estimates them).

    ``t_w``: ``T_w(C_i)``, the average waiting time of external jobs (s).
    ``t_ffw``: ``T_ffw(C_i)``, how long the earliest-submitted external job still waiting
    has waited (s; 0 with an empty queue).
    ``ql``: ``QL(C_i)``, the number of external jobs waiting.
    ``dt``: ``dt(C_i)``, the average interval between two external jobs obtaining
    resources (s).
    """

    t_w: float
    t_ffw: float
    ql: int
    dt: float

    def __post_init__(self) -> None:
        for name in ("t_w", "t_ffw", "dt"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ConfigError(f"QueueStats.{name} must be a finite number >= 0, got {value}")
        if self.ql < 0:
            raise ConfigError(f"QueueStats.ql must be >= 0, got {self.ql}")


@dataclass(frozen=True)
class ClusterView:
    """One candidate cluster: its name, its queue statistics, and how many virtual jobs of
    one job it can hold at once (``floor(processors / g)``; see docs/coreservation.md).

    ``t_avails``: a wait model's forecast of the wait of this selection's 1st, 2nd, ...
    virtual job on the cluster (each with the earlier ones queued ahead of it; the caller
    ran the model on the cluster's queue), used instead of Eq. 1 where given; ``None``:
    Eq. 1 over ``stats`` (the ``eq1`` model). A forecast must not decrease along the
    tuple; past its end the cluster takes no more of this selection's virtual jobs."""

    name: str
    stats: QueueStats
    capacity: int
    t_avails: tuple[float, ...] | None = None

    def t_avail(self, vj_seq: int, kept: int = 0) -> float | None:
        """The wait of the virtual job at position ``vj_seq`` (counting ``kept`` ones
        this job already has here); ``None`` when the forecasts end before it."""
        if self.t_avails is None:
            return expected_wait(self.stats, vj_seq)
        index = vj_seq - kept
        return self.t_avails[index] if 0 <= index < len(self.t_avails) else None


@dataclass(frozen=True)
class VirtualJobChoice:
    """Where virtual job ``index`` (0-based ``j - 1``) goes and its Eq. 1 wait there."""

    index: int
    cluster: str
    t_avail: float


@dataclass(frozen=True)
class ClusterSelection:
    """The outcome of the selection algorithm: the candidate set ``C'`` and, per virtual
    job, its cluster and ``T_avail``; ``reasons`` say why (dropped clusters, infeasible)."""

    outcome: Outcome
    choices: tuple[VirtualJobChoice, ...]
    reasons: tuple[str, ...]

    @property
    def clusters(self) -> dict[str, int]:
        """``C'`` with the size of each ``VJ(i)``, in order of first use."""
        counts: dict[str, int] = {}
        for choice in self.choices:
            counts[choice.cluster] = counts.get(choice.cluster, 0) + 1
        return counts


# -- Eq. 1 and Eq. 2 -----------------------------------------------------------------------


def expected_wait_printed(stats: QueueStats, vj_seq: int) -> float:
    """Eq. 1 as printed: ``T_w - T_ffw + dt * QL + dt * VJ_seq`` (may be negative)."""
    return stats.t_w - stats.t_ffw + stats.dt * stats.ql + stats.dt * vj_seq


def expected_wait(stats: QueueStats, vj_seq: int) -> float:
    """Eq. 1, ``T_avail(C_i, VJob_j)``, not below 0 (docs/coreservation.md)."""
    return max(0.0, expected_wait_printed(stats, vj_seq))


LIFETIME_CEILING_S = 3600.0
"""Eq. 2 has no upper bound. Its T_avail come from queue statistics, and after a backlog
(waits of hours) they stay high until new jobs start, so Eq. 2 gives days, during which
held pilots are never reconsidered (found on the simulator's ``vjm-deadlock``, seed 510
case 1: lifetimes of 5 days). gridcore checks a reservation at least hourly."""


def reservation_lifetime(
    t_avails: Sequence[float], floor_s: float = 0.0, ceiling_s: float = math.inf
) -> float:
    """Eq. 2: ``T_life_time(VS(J_a)) = 2 * Max{T_avail(vj1), ..., T_avail(vjn)}``, at
    most ``ceiling_s`` (:data:`LIFETIME_CEILING_S`; the paper has none) and not below
    ``floor_s`` (an idle grid gives ``T_avail = 0``: without a floor the deadlock check
    would fire before any pilot could have started); the floor wins over the ceiling."""
    if floor_s < 0.0 or not math.isfinite(floor_s):
        raise ConfigError(f"lifetime floor must be a finite number >= 0, got {floor_s}")
    if not ceiling_s > 0.0:
        raise ConfigError(f"lifetime ceiling must be > 0, got {ceiling_s}")
    return max(floor_s, min(ceiling_s, 2.0 * max(t_avails, default=0.0)))


PILOT_TIME_MARGIN_S = 300.0
"""The least a pilot's time limit adds beyond its hold and its command: its start-up,
registration, the dispatch and the heartbeat's lag (:func:`pilot_time_limit`)."""
PILOT_TIME_MARGIN = 0.1
"""... or this fraction of hold plus command, if more (Slurm counts whole minutes)."""


def pilot_time_limit(lifetime_s: float, command_limit_s: float) -> int:
    """Whole seconds a pilot (a virtual job) asks its cluster for: it holds its processors
    until every pilot of its job holds, which the deadlock check gives at most the
    reservation's lifetime (Eq. 2, ``lifetime_s``: after it the reorganization shifts or
    releases held pilots), then runs the command for at most its own limit
    (``command_limit_s``); plus a margin of :data:`PILOT_TIME_MARGIN` of that, at least
    :data:`PILOT_TIME_MARGIN_S`. Not in the paper (its pilots were not time-limited); a
    pilot that outlives it anyway (a job that waits past its lifetime for substitutes)
    ends like any lost pilot and is substituted."""
    if not (math.isfinite(lifetime_s) and lifetime_s >= 0.0):
        raise ConfigError(f"lifetime must be a finite number >= 0, got {lifetime_s}")
    if not (math.isfinite(command_limit_s) and command_limit_s > 0.0):
        raise ConfigError(f"command time limit must be a finite number > 0, got {command_limit_s}")
    needed = lifetime_s + command_limit_s
    return math.ceil(needed + max(PILOT_TIME_MARGIN_S, PILOT_TIME_MARGIN * needed))


LIFETIME_ROUNDS = 4
"""Selections :func:`settle_lifetime` makes at most for one decision."""

_Chosen = TypeVar("_Chosen")


def settle_lifetime(
    select: Callable[[float], _Chosen],
    lifetime_of: Callable[[_Chosen], float],
    start_s: float,
    rounds: int = LIFETIME_ROUNDS,
) -> _Chosen:
    """A selection whose wait forecasts were asked for pilots as long as those it sends.

    A wait model that plans a queue with time limits (``backfill``,
    ``predicted_backfill``: docs/wait-prediction.md) forecasts each virtual job's
    ``T_avail`` for a pilot asking :func:`pilot_time_limit` of the reservation's
    lifetime, and Eq. 2 makes that lifetime from those same ``T_avail``. ``select(L)``
    selects with forecasts for pilots of lifetime ``L``; ``lifetime_of`` is Eq. 2 of its
    choices (0 for a selection that sends nothing). Starting from ``start_s`` (the
    lifetime floor, or the job's current lifetime at a reorganization), select again
    with the lifetime the last selection gave while it gives a longer one, at most
    ``rounds`` selections in all (a selection that sends nothing is never preferred to
    one that sends pilots): the result's forecasts were made for pilots at least
    as long as the ones then sent, unless the rounds ran out. The lifetime only grows (a
    longer limit never starts earlier in a backfill plan) and Eq. 2 caps it, so it
    settles. Not in the paper (Eq. 1 ignores time limits: a second round gives the same
    choices and stops). Decided after issue 22's first results showed forecasts for
    770-901 s pilots whose pilots then asked 2,103-4,291 s (docs/experiments.md,
    selection-traces)."""
    if rounds < 1:
        raise ConfigError(f"rounds must be >= 1, got {rounds}")
    lifetime = start_s
    chosen = select(lifetime)
    for _ in range(rounds - 1):
        needed = lifetime_of(chosen)
        if needed <= lifetime:
            break
        again = select(needed)
        if lifetime_of(again) <= 0.0:
            break  # longer pilots fit nowhere: keep the selection that sends some
        lifetime, chosen = needed, again
    return chosen


# -- the cluster selection algorithm (Sec. 3.2, steps 1-3) ---------------------------------


def select_clusters(
    virtual_jobs: int,
    clusters: Sequence[ClusterView],
    max_clusters: int,
    already: Mapping[str, int] | None = None,
) -> ClusterSelection:
    """Steps (1)-(3): distribute ``virtual_jobs`` over ``clusters`` (the available set C),
    spanning at most ``max_clusters`` (M) clusters; step (3) drops the cluster with the
    smallest virtual-job set and, with ``C = C'``, spreads its virtual jobs over the
    clusters still chosen (:func:`_after_drop`).

    ``already``: virtual jobs of this job that stay where they are (a reorganization keeps
    some clusters and seeks substitutes for the rest): they count in ``VJ_seq`` and in
    the cluster limit, and are not in the result."""
    if virtual_jobs < 0:
        raise ConfigError(f"virtual_jobs must be >= 0, got {virtual_jobs}")
    if max_clusters < 1:
        raise ConfigError(f"max clusters M must be >= 1, got {max_clusters}")
    kept = dict(already or {})
    order = {c.name: i for i, c in enumerate(clusters)}
    available = [c for c in clusters if c.capacity - kept.get(c.name, 0) > 0 or c.name in kept]
    reasons: list[str] = []
    placed: dict[int, VirtualJobChoice] = {}
    undecided = list(range(virtual_jobs))
    while True:
        missing = _assign(undecided, available, kept, placed)
        if missing:
            reasons.append(
                f"virtual jobs {_span(missing)} fit on no cluster of "
                f"{[c.name for c in available]} (each holds at most its capacity)"
            )
            return ClusterSelection(Outcome.NO_FIT, (), tuple(reasons))
        spanned = _spanned(placed, kept)
        if len(spanned) <= max_clusters:
            break
        drop = _smallest_set(spanned, placed, kept, order)
        reasons.append(
            f"{len(spanned)} clusters > M={max_clusters}: dropped {drop}"
            f" (smallest virtual-job set, {spanned[drop]})"
        )
        if drop in kept:
            reasons.append(f"cannot drop {drop}: it holds virtual jobs this job keeps")
            return ClusterSelection(Outcome.NO_FIT, (), tuple(reasons))
        undecided = sorted(i for i, c in placed.items() if c.cluster == drop)
        for i in undecided:
            del placed[i]
        available = _after_drop(available, spanned, drop)
    choices = tuple(placed[i] for i in sorted(placed))
    for name, n in _spanned(placed, {}).items():
        waits = [c.t_avail for c in choices if c.cluster == name]
        reasons.append(f"{n} virtual jobs on {name}: T_avail {min(waits):.1f}-{max(waits):.1f} s")
    return ClusterSelection(Outcome.FIT, choices, tuple(reasons))


def _after_drop(
    available: Sequence[ClusterView], spanned: Mapping[str, int], drop: str
) -> list[ClusterView]:
    """Step (3)'s "update the available clusters set C = C'": the dropped cluster's
    virtual jobs go back to the other clusters already chosen, never to one step (1)
    passed over, so the span only shrinks."""
    return [c for c in available if c.name in spanned and c.name != drop]


def select_substitutes(
    virtual_jobs: int,
    clusters: Sequence[ClusterView],
    max_clusters: int,
    already: Mapping[str, int] | None = None,
    avoid: Sequence[str] = (),
) -> ClusterSelection:
    """Sec. 3.3's "reselect substitute clusters": :func:`select_clusters` without the
    clusters ``avoid`` just released (unless the job keeps virtual jobs there); over
    every cluster when the others cannot take them."""
    kept = dict(already or {})
    preferred = [c for c in clusters if c.name not in avoid or c.name in kept]
    selection = select_clusters(virtual_jobs, preferred, max_clusters, kept)
    if selection.outcome is Outcome.FIT or len(preferred) == len(clusters):
        return selection
    fallback = select_clusters(virtual_jobs, clusters, max_clusters, kept)
    why = f"without the released {sorted(avoid)} nothing fits; every cluster considered"
    return ClusterSelection(fallback.outcome, fallback.choices, (why, *fallback.reasons))


def _assign(
    undecided: Sequence[int],
    available: Sequence[ClusterView],
    kept: Mapping[str, int],
    placed: dict[int, VirtualJobChoice],
) -> list[int]:
    """Step (1) repeated (step 2): each undecided virtual job, in order, to the cluster
    with the smallest Eq. 1 wait; returns the ones no cluster could take.

    Eq. 1 never decreases as ``VJ_seq`` grows (``dt >= 0``), so each cluster's next wait
    sits in a heap keyed (wait, listed order): the minimum is the scan's choice, ties to
    the cluster listed first, in O(log clusters) per virtual job."""
    seq = {c.name: kept.get(c.name, 0) for c in available}
    for choice in placed.values():
        seq[choice.cluster] = seq.get(choice.cluster, 0) + 1
    heap = []
    for i, c in enumerate(available):
        first = c.t_avail(seq[c.name], kept.get(c.name, 0))
        if seq[c.name] < c.capacity and first is not None:
            heap.append((first, i, c))
    heapq.heapify(heap)
    missing: list[int] = []
    for j in undecided:
        if not heap:
            missing.append(j)
            continue
        wait, i, cluster = heapq.heappop(heap)
        placed[j] = VirtualJobChoice(j, cluster.name, wait)
        seq[cluster.name] += 1
        following = cluster.t_avail(seq[cluster.name], kept.get(cluster.name, 0))
        if seq[cluster.name] < cluster.capacity and following is not None:
            heapq.heappush(heap, (following, i, cluster))
    return missing


def _spanned(placed: Mapping[int, VirtualJobChoice], kept: Mapping[str, int]) -> dict[str, int]:
    counts = {name: n for name, n in kept.items() if n > 0}
    for choice in placed.values():
        counts[choice.cluster] = counts.get(choice.cluster, 0) + 1
    return counts


def _smallest_set(
    spanned: Mapping[str, int],
    placed: Mapping[int, VirtualJobChoice],
    kept: Mapping[str, int],
    order: Mapping[str, int],
) -> str:
    """Step (3): the cluster with the smallest virtual-job set; ties: the slower one (the
    larger largest T_avail), then the one listed last. Clusters holding kept virtual jobs
    are dropped only when nothing else can be."""

    def worst_wait(name: str) -> float:
        return max((c.t_avail for c in placed.values() if c.cluster == name), default=0.0)

    movable = [n for n in spanned if n not in kept] or list(spanned)
    return min(movable, key=lambda n: (spanned[n], -worst_wait(n), -order.get(n, 0)))


def _span(indices: Sequence[int]) -> str:
    return ", ".join(str(i + 1) for i in indices)


def static_selection(
    counts: Mapping[str, int],
    clusters: Sequence[ClusterView],
    already: Mapping[str, int] | None = None,
) -> ClusterSelection:
    """A static machine file (MPICH-G2's, Sec. 1): ``counts`` virtual jobs per cluster as
    given, not chosen; each still gets its Eq. 1 wait (for the lifetime, Eq. 2). The
    baseline of Fig. 3 (round-robin over the file) and a user's pinned distribution.
    ``already``: virtual jobs of the job that stay; only the rest are returned."""
    kept = dict(already or {})
    views = {c.name: c for c in clusters}
    choices: list[VirtualJobChoice] = []
    for name, count in counts.items():
        view = views.get(name)
        if view is None or count > view.capacity:
            why = "unknown or unusable" if view is None else f"holds at most {view.capacity}"
            return ClusterSelection(
                Outcome.NO_FIT, (), (f"machine file: {count} virtual jobs on {name}: {why}",)
            )
        for seq in range(kept.get(name, 0), count):
            choices.append(VirtualJobChoice(len(choices), name, expected_wait(view.stats, seq)))
    listed = ", ".join(f"{n} x{c}" for n, c in counts.items())
    return ClusterSelection(Outcome.FIT, tuple(choices), (f"static machine file: {listed}",))


def round_robin_order(virtual_jobs: int, capacities: Mapping[str, int]) -> list[str]:
    """MPICH-G2's round-robin over the machine file (Sec. 1, Fig. 3's baseline): the
    cluster of each virtual job in issue order, one to each cluster in file order (the
    order of ``capacities``), again and again, skipping full ones."""
    room = dict(capacities)
    order: list[str] = []
    while len(order) < virtual_jobs:
        progressed = False
        for name in room:
            if len(order) < virtual_jobs and room[name] > 0:
                room[name] -= 1
                order.append(name)
                progressed = True
        if not progressed:
            raise ConfigError(f"{virtual_jobs} virtual jobs exceed the machine file's clusters")
    return order


# -- Definitions 1 and 2, Eq. 3 and Eq. 4 (Sec. 3.3) ----------------------------------------


class Relation(enum.StrEnum):
    """How two pending jobs stand on one cluster both have virtual jobs on."""

    GREATER = ">"  # Def. 1: J_a holds all it needs on C, J_b does not
    LESS = "<"  # Def. 1 the other way round
    EQUAL = "="  # Def. 2: neither holds all it needs on C
    BOTH_COMPLETE = "complete"  # not a relation of the paper: no competition on C


@dataclass(frozen=True)
class ClusterReservation:
    """One job's virtual jobs on one cluster: how many it has there and how many hold
    their processors, and how long those still waiting have waited (s)."""

    required: int
    held: int
    waiting_s: tuple[float, ...] = ()

    @property
    def complete(self) -> bool:
        return self.held >= self.required

    @property
    def mean_wait_s(self) -> float:
        return sum(self.waiting_s) / len(self.waiting_s) if self.waiting_s else 0.0


@dataclass(frozen=True)
class PendingJob:
    """A pending co-reserved job as the deadlock check sees it (a snapshot)."""

    job_id: int
    submitted_at: float
    clusters: Mapping[str, ClusterReservation] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return all(r.complete for r in self.clusters.values())


def relation(a: PendingJob, b: PendingJob, cluster: str) -> Relation | None:
    """Definitions 1 and 2: how ``a`` stands to ``b`` on ``cluster``; None unless both
    have virtual jobs there."""
    ra, rb = a.clusters.get(cluster), b.clusters.get(cluster)
    if ra is None or rb is None or ra.required == 0 or rb.required == 0:
        return None
    if ra.complete and rb.complete:
        return Relation.BOTH_COMPLETE
    if ra.complete:
        return Relation.GREATER
    if rb.complete:
        return Relation.LESS
    return Relation.EQUAL


INDIRECT = "indirect (Eq. 3)"
DIRECT = "direct (Eq. 4)"
BOTH = "indirect + direct (Eq. 3, 4)"
"""The reorganization steps that shift (:attr:`Reorganization.step`): Sec. 3.3's steps 1
and 2, and both at one check."""


@dataclass(frozen=True)
class Shift:
    """Move ``pilots`` held virtual jobs of ``from_job`` on ``cluster`` to ``to_job``."""

    from_job: int
    to_job: int
    cluster: str
    pilots: int
    reason: str


@dataclass(frozen=True)
class Reorganization:
    """What to do with a job whose lifetime ran out: shifts to other jobs, the clusters
    to release (held virtual jobs not shifted are released; waiting ones cancelled), the
    clusters kept, and how many virtual jobs need substitute clusters."""

    job_id: int
    step: str  # INDIRECT | DIRECT | BOTH | "step 3" | "wait" | "none"
    shifts: tuple[Shift, ...]
    release: tuple[str, ...]
    keep: tuple[str, ...]
    substitutes: int
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class ReorganizeRule:
    """How :func:`reorganize` reads Sec. 3.3 (docs/coreservation.md)."""

    earlier_only: bool = False
    held_only: bool = False
    wait_for_younger: bool = False

    def __post_init__(self) -> None:
        if self.wait_for_younger and not self.earlier_only:
            raise ConfigError("reorganize rule: wait_for_younger needs earlier_only")

    @property
    def name(self) -> str:
        if self == PAPER_RULE:
            return "paper"
        if self == GLOBAL_ORDER:
            return "global_order"
        on = [f for f in ("earlier_only", "held_only", "wait_for_younger") if getattr(self, f)]
        return "+".join(on)


PAPER_RULE = ReorganizeRule()
GLOBAL_ORDER = ReorganizeRule(earlier_only=True, held_only=True, wait_for_younger=True)
DEFAULT_RULE = GLOBAL_ORDER


def indirect_deadlock(
    a: PendingJob, others: Sequence[PendingJob], *, earlier_only: bool = False
) -> dict[str, PendingJob]:
    """Eq. 3: ``exists (J_a, J_b, C_m, C_n): J_a < J_b on C_m and J_a > J_b on C_n``.
    Returns, per such ``C_n``, the ``J_b`` that gets ``J_a``'s resources there: the
    earliest-submitted one."""
    found: dict[str, PendingJob] = {}
    for b in _by_submission(others, a, earlier_only):
        shared = [c for c in a.clusters if c in b.clusters]
        if not any(relation(a, b, c) is Relation.LESS for c in shared):
            continue
        for c_n in shared:
            if relation(a, b, c_n) is Relation.GREATER and c_n not in found:
                found[c_n] = b
    return found


def direct_deadlock(
    a: PendingJob,
    others: Sequence[PendingJob],
    *,
    earlier_only: bool = False,
    held_only: bool = False,
) -> dict[str, PendingJob]:
    """Eq. 4: ``exists (J_a, J_b, C_n): J_a = J_b on C_n``. Returns, per such ``C_n``,
    the earliest-submitted ``J_b``. ``held_only``: only clusters where ``J_a`` holds
    something to shift (:func:`reorganize`)."""
    found: dict[str, PendingJob] = {}
    for b in _by_submission(others, a, earlier_only):
        for c_n in a.clusters:
            if held_only and a.clusters[c_n].held == 0:
                continue
            if relation(a, b, c_n) is Relation.EQUAL and c_n not in found:
                found[c_n] = b
    return found


def _by_submission(
    others: Sequence[PendingJob], a: PendingJob, earlier_only: bool = False
) -> list[PendingJob]:
    mine = (a.submitted_at, a.job_id)
    return sorted(
        (
            b
            for b in others
            if b.job_id != a.job_id
            and not b.complete
            and (not earlier_only or (b.submitted_at, b.job_id) < mine)
        ),
        key=lambda b: (b.submitted_at, b.job_id),
    )


def reorganize(
    a: PendingJob, others: Sequence[PendingJob], rule: ReorganizeRule = PAPER_RULE
) -> Reorganization:
    """Sec. 3.3's resource reorganization for ``a`` after its lifetime: step 1 (Eq. 3)
    and step 2 (Eq. 4), both, as the paper lists them; step 3
    (:func:`release_slower_half`) only "if neither Eq. 3 nor Eq. 4 [is] satisfied".
    Eq. 3's ``C_n`` are clusters where ``a`` holds all it needs and Eq. 4's ones where
    it does not, so the two steps never name the same cluster and their order does not
    matter; step ``"indirect + direct (Eq. 3, 4)"`` when both found one.

    ``rule`` (default the paper's; :data:`DEFAULT_RULE` is what gridcore runs):

    ``earlier_only`` (not in the paper): ``a`` gives only to jobs submitted before it.
    The paper shifts to the earliest-submitted ``J_b`` whatever ``a``'s own age, so the
    oldest pending job may give its resources to a younger one and go to the back of the
    queues; with ``earlier_only`` resources only flow toward older jobs, a global order
    (the dining philosophers' remedy of the paper's refs. [8, 9]): the oldest pending
    job never gives, so it completes, and then the next.

    ``held_only`` (a reading): Eq. 4 names only clusters where ``J_a`` holds a virtual
    job. The step's action is to "shift the resources reserved by J_a on C_n to J_b";
    where ``J_a`` has reserved nothing there is nothing to shift, ``J_a`` does not hold
    and wait there, and firing only cancels its place in the queue. (Eq. 3's ``C_n`` is
    a cluster ``J_a`` holds completely, so it always has something.)

    ``wait_for_younger`` (with ``earlier_only``): when no older job qualifies but a
    younger pending job holds virtual jobs on a cluster where ``a`` is incomplete, the
    time-out is competition among VJM jobs that the younger job resolves toward ``a``
    at its own check; step 3's premise ("caused by local jobs or other meta-schedulers")
    does not hold, so ``a`` keeps everything (step ``"wait"``)."""
    steps = {
        INDIRECT: indirect_deadlock(a, others, earlier_only=rule.earlier_only),
        DIRECT: direct_deadlock(
            a, others, earlier_only=rule.earlier_only, held_only=rule.held_only
        ),
    }
    found = {step: by_cluster for step, by_cluster in steps.items() if by_cluster}
    if found:
        return _shift_to_others(a, found)
    if rule.wait_for_younger:
        waiting = _younger_holders(a, others)
        if waiting:
            return Reorganization(a.job_id, "wait", (), (), tuple(a.clusters), 0, tuple(waiting))
    return release_slower_half(a)


def _younger_holders(a: PendingJob, others: Sequence[PendingJob]) -> list[str]:
    """Why ``a`` waits: younger jobs whose own check would shift held virtual jobs to
    ``a`` (Eq. 3 or Eq. 4 with ``a`` as their ``J_b``, ``held_only``)."""
    mine = (a.submitted_at, a.job_id)
    reasons: list[str] = []
    for b in others:
        if (b.submitted_at, b.job_id) <= mine or b.complete:
            continue
        found = {
            **direct_deadlock(b, [a], earlier_only=True, held_only=True),
            **indirect_deadlock(b, [a], earlier_only=True),
        }
        for c in found:
            if b.clusters[c].held > 0:
                reasons.append(
                    f"global order: younger job {b.job_id} holds {b.clusters[c].held} on {c}"
                    f" and yields to job {a.job_id} at its own check: wait"
                )
    return reasons


def _shift_to_others(
    a: PendingJob, by_step: Mapping[str, Mapping[str, PendingJob]]
) -> Reorganization:
    shifts: list[Shift] = []
    reasons: list[str] = []
    found = {
        c_n: (step, b) for step, by_cluster in by_step.items() for c_n, b in by_cluster.items()
    }
    for c_n, (step, b) in found.items():
        mine, theirs = a.clusters[c_n], b.clusters[c_n]
        give = min(mine.held, theirs.required - theirs.held)
        rel = relation(a, b, c_n)
        why = (
            f"{step}: job {a.job_id} {rel} job {b.job_id} on {c_n}"
            f" ({mine.held}/{mine.required} vs {theirs.held}/{theirs.required} held)"
        )
        if give > 0:
            shifts.append(Shift(a.job_id, b.job_id, c_n, give, why))
        reasons.append(f"{why}: {give} held virtual jobs to job {b.job_id}, substitute for {c_n}")
    release = tuple(found)
    keep = tuple(c for c in a.clusters if c not in found)
    substitutes = sum(a.clusters[c].required for c in release)
    step = BOTH if len(by_step) > 1 else next(iter(by_step))
    return Reorganization(a.job_id, step, tuple(shifts), release, keep, substitutes, tuple(reasons))


def release_slower_half(a: PendingJob) -> Reorganization:
    """Step 3: split ``C'`` into complete and incomplete clusters; sort the incomplete
    ones ascending by the mean wait of their not-yet-acquired virtual jobs; release
    ``C_[m/2] .. C_m`` and keep ``C_1 .. C_(floor(m/2)-1)`` and the complete ones, as
    printed: ``[m/2]`` is the integer part, ``floor(m / 2)``, as the second range writes
    it, so the two ranges split the incomplete clusters exactly (``C_0`` of ``m = 1``
    is ``C_1``; docs/coreservation.md)."""
    incomplete = sorted(
        (c for c, r in a.clusters.items() if not r.complete),
        key=lambda c: (a.clusters[c].mean_wait_s, c),
    )
    if not incomplete:
        return Reorganization(a.job_id, "none", (), (), tuple(a.clusters), 0, ("complete",))
    k = max(1, len(incomplete) // 2)
    release = tuple(incomplete[k - 1 :])
    keep = tuple(c for c in a.clusters if c not in release)
    waits = ", ".join(f"{c} {a.clusters[c].mean_wait_s:.0f} s" for c in incomplete)
    reasons = (
        f"step 3: no deadlock with another VJM job; incomplete clusters by mean wait"
        f" [{waits}]: release {list(release)}, keep {list(keep)}",
    )
    substitutes = sum(a.clusters[c].required for c in release)
    return Reorganization(a.job_id, "step 3", (), release, keep, substitutes, reasons)
