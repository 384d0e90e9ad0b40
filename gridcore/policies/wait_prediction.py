"""How long will a job wait in one cluster's queue? Wait models over a queue snapshot.

The API the selection and VJM engines and the simulator call (design, the replay that
measures these models on real logs and its figures: ``docs/wait-prediction.md``):

* :class:`QueueView`: what one cluster shows at ``now``: its processors, the jobs
  running (:class:`RunningJob`: processors, start, requested time, user; never their
  actual run time) and the jobs queued, first come first (:class:`QueuedJob`).
* :class:`WaitModel`: ``name``, ``forecast(job, view) -> WaitForecast`` for a job not
  yet in ``view.queued`` (it joins at the back), and ``observe_start(job, submitted_at,
  started_at)`` / ``observe_end(job, started_at, ended_at)``, through which the
  history-keeping models learn the waits of started jobs and the run times of finished
  ones, in time order. A model never sees anything else: a forecast uses the past only.
  Live, two more calls: ``observe_queue(view)``, a queue as observed (a model that
  learns from its own forecasts' errors forecasts the queued jobs it has not yet, and
  returns those forecasts, ``{job: (wait_s, made_at)}``, for the caller to keep), and
  ``recall(job, wait_s, made_at)``, such a forecast given back to a model rebuilt from
  the history, before the history: the job's start then gives its residual.
* :class:`WaitForecast`: the point estimate ``wait_s``, where the model has one a bound
  ``bound_s`` at ``confidence`` (``None``: no bound), and a reason a person can read.
* :data:`WAIT_MODELS`: name -> factory of a fresh model; :data:`DEFAULT_WAIT_MODEL`.

The models (each one ``WAIT_MODELS`` entry):

``eq1``
    VJM Eq. 1 as it is (:func:`gridcore.policies.coreservation.expected_wait` over
    :func:`gridcore.policies.queue_stats.estimate_queue_stats`), ``VJ_seq`` 0.
``eq_w``
    The default selection's Eq. W as it is
    (:func:`gridcore.policies.selection.estimated_queue_delay`) on a snapshot built from
    the view, the job's runtime being its requested time.
``backfill``
    What Slurm's estimate does: conservative backfill planning with requested times
    (:func:`plan_starts`; the first :data:`PLAN_DEPTH` queued jobs, :func:`planned_start`).
``qbets``
    Nurmi, Brevik, Wolski (JSSPP 2007): a binomial upper confidence bound on the 0.95
    quantile of observed waits per size bin, with change-point trimming
    (:class:`QuantileHistory`).
``predicted_backfill`` (the default)
    :func:`plan_starts` with run times predicted as Tsafrir, Etsion & Feitelson 2007
    (:class:`UserRuntimes`), and a split-conformal bound: QBETS's bound on this model's
    own recent residuals, binned by forecast.

Pure: no I/O, no clock, no randomness. The models keep history in memory: ``eq1`` the
last :data:`~gridcore.policies.queue_stats.WINDOW` starts; ``eq_w`` two means and the
waits of the jobs started and not yet ended; ``predicted_backfill`` two run times per
user (growing with the users), at most :data:`RESIDUAL_WINDOW` residuals per bin and
:data:`PENDING_LIMIT` forecasts awaiting their start. ``qbets``'s histories
(:class:`QuantileHistory` without a window) are NOT bounded: one grows until a change
point trims it. On the three logs of docs/wait-prediction.md the largest held 2,025
waits at its peak (CTC; SDSC 1,551, KTH 2,014; CTC's 65+ bin ended with 976), and
:func:`order_statistic`'s answers are cached up to :data:`ORDER_STATISTIC_CACHE`.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from gridcore.model import JobRequest, SiteSnapshot
from gridcore.policies.coreservation import expected_wait
from gridcore.policies.queue_stats import WINDOW, QueueRecord, estimate_queue_stats
from gridcore.policies.selection import (
    DEFAULT_PROTOCOL,
    effective_idle,
    estimated_queue_delay,
)

QUANTILE = 0.95
CONFIDENCE = 0.95
RARE = 0.01
"""QBETS's defaults: the 0.95 quantile at 0.95 confidence; a run of misses is a change
point when it is less likely than 1 % while the bound holds."""

SIZE_BINS = (4, 16, 64)
"""QBETS's processor-count bins as deployed (Nurmi et al. 2007): 1-4, 5-16, 17-64, 65+."""

FORECAST_BINS_S = (0.0, 600.0, 3600.0, 14400.0)
"""The conformal bound's bins by forecast: 0, (0, 600], (600, 3600], (3600, 14400], more."""

RESIDUAL_WINDOW = 1000
"""The conformal bound reads the last this many residuals of a bin."""

PENDING_LIMIT = 10_000
"""Forecasts waiting for their job's start that ``predicted_backfill`` remembers; the
oldest are forgotten beyond it (a job cancelled while queued never starts)."""

PLAN_DEPTH = 500
"""Queued jobs a backfill plan places one by one ahead of the job asked about (Slurm's
backfill scheduler likewise tests at most ``bf_max_job_test`` jobs a cycle, 500 by
default in recent releases, 100 in older ones; the live engine plans no queue longer
than this either, ``gridcore.engine.wait_models.MAX_QUEUED``). The jobs queued beyond
them count as their work only (:func:`planned_start`). A plan costs about the queue
times a placement's span, so this bounds a forecast's cost on the deepest queues."""

EWMA_WEIGHT = 0.3
"""Eq. W's observed means, as the live engine folds them
(``gridcore.engine.selection.EWMA_WEIGHT``; policies do not import engines)."""


# -- the view and the answer ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A job waiting (or about to be submitted): its processors, submit time, requested
    time limit (s) and user (``None``: unknown)."""

    job_id: Hashable
    processors: int
    submitted_at: float
    requested_s: float
    user: int | str | None = None


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job running since ``started_at``; its actual run time is not known."""

    job_id: Hashable
    processors: int
    started_at: float
    requested_s: float
    user: int | str | None = None


@dataclass(frozen=True)
class QueueView:
    """One cluster at ``now``: ``queued`` in the order the scheduler serves them (first
    come, first served: submit time, then id)."""

    now: float
    total_processors: int
    running: tuple[RunningJob, ...] = ()
    queued: tuple[QueuedJob, ...] = ()


@dataclass(frozen=True)
class WaitForecast:
    """A model's answer: ``wait_s`` from now; ``bound_s`` (or ``None``) with
    P(wait <= bound) >= ``confidence`` as the model claims it."""

    predictor: str
    wait_s: float
    bound_s: float | None
    confidence: float | None
    reason: str


class WaitModel(Protocol):
    """A wait model (module docstring)."""

    @property
    def name(self) -> str: ...

    def forecast(self, job: QueuedJob, view: QueueView) -> WaitForecast: ...

    def observe_start(self, job: QueuedJob, submitted_at: float, started_at: float) -> None: ...

    def observe_end(self, job: RunningJob, started_at: float, ended_at: float) -> None: ...

    def observe_queue(self, view: QueueView) -> Mapping[Hashable, tuple[float, float]]: ...

    def recall(self, job_id: Hashable, wait_s: float, made_at: float) -> None: ...


class _LearnsFromHistoryOnly:
    """``observe_queue`` and ``recall`` of a model that learns from ``observe_*`` alone:
    a queue shown teaches it nothing, and it keeps no forecast of its own."""

    def observe_queue(self, view: QueueView) -> Mapping[Hashable, tuple[float, float]]:
        return {}

    def recall(self, job_id: Hashable, wait_s: float, made_at: float) -> None:
        return None


@dataclass(frozen=True, slots=True)
class PastJob:
    """A job a cluster's history shows: started (and, unless ``ended_at`` is ``None``,
    ended); what :func:`learn_history` feeds a model."""

    job_id: Hashable
    processors: int
    submitted_at: float
    started_at: float
    requested_s: float
    user: int | str | None = None
    ended_at: float | None = None


def history_events(jobs: Iterable[PastJob]) -> list[tuple[float, bool, PastJob]]:
    """Each job's start and end as ``(at, is_start, job)`` in the order a model must hear
    them: by time; at one instant ends before starts (the processors are free first),
    then by submission and id."""
    events: list[tuple[float, bool, PastJob]] = []
    for job in jobs:
        events.append((job.started_at, True, job))
        if job.ended_at is not None:
            events.append((job.ended_at, False, job))
    events.sort(key=lambda e: (e[0], e[1], e[2].submitted_at, str(e[2].job_id)))
    return events


def learn_event(models: Iterable[WaitModel], is_start: bool, job: PastJob) -> None:
    """Tell ``models`` of one :func:`history_events` event."""
    if is_start:
        queued = QueuedJob(job.job_id, job.processors, job.submitted_at, job.requested_s, job.user)
        for model in models:
            model.observe_start(queued, job.submitted_at, job.started_at)
    else:
        running = RunningJob(job.job_id, job.processors, job.started_at, job.requested_s, job.user)
        for model in models:
            model.observe_end(running, job.started_at, job.ended_at or job.started_at)


# -- conservative backfill planning ---------------------------------------------------------


def plan_starts(
    now: float,
    total_processors: int,
    running_ends: Iterable[tuple[float, int]],
    jobs: Iterable[tuple[int, float]],
) -> list[float]:
    """Conservative backfill (Mu'alem & Feitelson 2001; Slurm's start-time estimate):
    the start of each of ``jobs`` ((processors, duration s), first come first) when each
    is placed, in turn, at the earliest time from ``now`` at which its processors are free
    for its whole duration, given the running jobs (``running_ends``: (end, processors);
    an end not after ``now`` frees its processors at ``now``) and the jobs placed before
    it. A job may start before earlier ones (a hole), never delaying them.

    The profile is a step function: ``free[i]`` processors from ``times[i]`` to
    ``times[i + 1]`` (the last step for ever). A placement scans it from the first step
    that had room for its size when the last job of that size was placed (free
    processors only fall as jobs are placed, so no earlier step has room again). With a
    deep queue of a few sizes (thousands of queued jobs in a flurry) the booked-up front
    of the profile is then not scanned again for every job: a plan costs about the queue
    times a placement's own span, not the square of the queue. Plain
    lists, which beat numpy's per-call overhead at the queue lengths of real logs."""
    plan = QueuePlan()
    plan.reset(now, total_processors, _ends_after(now, running_ends))
    return [plan.add(processors, duration) for processors, duration in jobs]


def _ends_after(now: float, running_ends: Iterable[tuple[float, int]]) -> list[tuple[float, int]]:
    """The running jobs' ends after ``now``, each time once with its processors, in time
    order (the rest free theirs at ``now``)."""
    ends: dict[float, int] = {}
    for end, processors in running_ends:
        if end > now:
            ends[end] = ends.get(end, 0) + processors
    return sorted(ends.items())


class QueuePlan:
    """A :func:`plan_starts` profile that the next forecast reuses when it can: the
    same plan, exactly, for less work.

    Between two submissions with no start and no end in between (a flurry; on the
    shared logs 40-58 % of forecasts weighted by queue length, 86-88 % in deep queues),
    the queue ahead is the last one plus the jobs submitted since, and the running jobs
    are the same. Planned at the later ``now``, every job the last plan placed at or
    after that ``now`` starts where it did: the profile from ``now`` on is the same, and
    no earlier start is feasible then that was not before (a start at ``now`` needs the
    room of the step around ``now`` for a span ending later than one from that step's
    start). So when the inputs match, the profile is cut at the new ``now`` and only the
    new jobs are placed; anything else (a job placed before the new ``now``, another
    running end after it, another total, another queue prefix or durations) plans afresh.
    Checked against fresh plans on random queues (tests/unit/test_wait_prediction.py)
    and by identical JSON on the shared logs."""

    def __init__(self) -> None:
        self._now = -math.inf
        self._total: int | None = None
        self._ends: list[tuple[float, int]] = []
        self.queue: list[tuple[int, float]] = []
        self._times: list[float] = []
        self._free: list[int] = []
        self._room: dict[int, float] = {}
        self._earliest = math.inf  # the earliest start of a placed job that holds room

    def reset(self, now: float, total: int, ends: list[tuple[float, int]]) -> None:
        """An empty plan at ``now`` with the running jobs' ``ends`` (:func:`_ends_after`)."""
        self._now, self._total, self._ends = now, total, ends
        self.queue = []
        self._times = [now]
        self._free = [total - sum(processors for _, processors in ends)]
        for end, processors in ends:
            self._times.append(end)
            self._free.append(self._free[-1] + processors)
        self._room = {}
        self._earliest = math.inf

    def add(self, processors: int, duration: float) -> float:
        """Place one more job behind the others; its start."""
        start, self._room[processors] = _place(
            self._times, self._free, processors, duration, self._room.get(processors, self._now)
        )
        self.queue.append((processors, duration))
        if duration > 0:
            self._earliest = min(self._earliest, start)
        return start

    def start_behind(
        self,
        now: float,
        total: int,
        running_ends: Iterable[tuple[float, int]],
        ahead: Sequence[tuple[int, float]],
        job: tuple[int, float],
    ) -> float:
        """:func:`plan_starts` of ``ahead`` then ``job``: ``job``'s start, the plan of
        ``ahead`` kept for the next call."""
        ends = _ends_after(now, running_ends)
        if not self._continues(now, total, ends, ahead):
            self.reset(now, total, ends)
        for processors, duration in ahead[len(self.queue) :]:
            self.add(processors, duration)
        processors, duration = job
        start, _ = _place(
            self._times[:], self._free[:], processors, duration, self._room.get(processors, now)
        )
        return start

    def _continues(
        self,
        now: float,
        total: int,
        ends: list[tuple[float, int]],
        ahead: Sequence[tuple[int, float]],
    ) -> bool:
        """Whether the kept plan, cut at ``now``, is the plan of ``ahead``'s first jobs
        (the class docstring); if so it is cut."""
        kept = len(self.queue)
        if total != self._total or now < self._now or len(ahead) < kept:
            return False
        if now > self._now and self._earliest < now:
            return False
        if ends != self._ends[bisect.bisect_right(self._ends, (now, math.inf)) :]:
            return False
        if list(ahead[:kept]) != self.queue:
            return False
        cut = bisect.bisect_right(self._times, now) - 1
        self._times[: cut + 1] = [now]
        del self._free[:cut]
        self._now, self._ends = now, ends
        return True


def planned_start(
    now: float,
    total_processors: int,
    running_ends: Iterable[tuple[float, int]],
    ahead: Sequence[tuple[int, float]],
    job: tuple[int, float],
    plan: QueuePlan | None = None,
) -> tuple[float, str]:
    """When ``job`` ((processors, duration)) starts behind the queue ``ahead``: the
    :func:`plan_starts` of the first :data:`PLAN_DEPTH` of ``ahead`` and ``job``; with
    more queued, the rest's work (processor-seconds) spread over the whole machine is
    added to that start, a fluid approximation that ignores their shapes (it never
    applies on the logs of docs/wait-prediction.md, whose queues reach 303 jobs). Also
    a few words for the reason when the approximation applied ("" otherwise). ``plan``:
    a model's :class:`QueuePlan`, reused from its last forecast where it can be."""
    planned = ahead[:PLAN_DEPTH]
    plan = plan if plan is not None else QueuePlan()
    start = plan.start_behind(now, total_processors, running_ends, planned, job)
    if len(ahead) == len(planned):
        return start, ""
    rest = ahead[PLAN_DEPTH:]
    work = sum(processors * max(0.0, duration) for processors, duration in rest)
    note = f" ({len(rest)} queued beyond the first {PLAN_DEPTH} counted as their work)"
    return start + work / total_processors, note


def _place(
    times: list[float], free: list[int], processors: int, duration: float, room_after: float
) -> tuple[float, float]:
    """Place one job on the profile (:func:`plan_starts`), updating it: its start, and
    the first step with room for its size. No step before ``room_after`` has room."""
    if free[-1] < processors:
        raise ValueError(f"{processors} processors never free (at most {free[-1]})")
    steps = len(times)
    first = max(0, bisect.bisect_right(times, room_after) - 1)
    while free[first] < processors:
        first += 1
    room = times[first]
    while True:
        while free[first] < processors:
            first += 1
        start = times[first]
        end = start + duration
        last = first + 1  # the first step not before the job's end
        while last < steps and times[last] < end and free[last] >= processors:
            last += 1
        if last == steps or times[last] >= end:
            break
        first = last  # too short a run: the next one starts after this step
    if duration <= 0:
        return start, room
    if last == steps or times[last] != end:
        times.insert(last, end)
        free.insert(last, free[last - 1])
    for step in range(first, last):
        free[step] -= processors
    return start, room


# -- QBETS: the binomial order statistic and change points ---------------------------------


ORDER_STATISTIC_CACHE = 4096
"""How many (n, quantile, confidence) answers :func:`order_statistic` keeps, the least
recently used dropped: each costs O(n) to compute and a history's n moves by one per
observation, so the sizes in use stay cached while the cache itself stays bounded."""


@functools.lru_cache(maxsize=ORDER_STATISTIC_CACHE)
def order_statistic(
    n: int, quantile: float = QUANTILE, confidence: float = CONFIDENCE
) -> int | None:
    """The smallest k (1-based) such that P(Binomial(n, quantile) < k) >= ``confidence``:
    the k-th smallest of n exchangeable observations is then an upper bound on their
    ``quantile`` at that confidence (Nurmi et al. 2007). ``None`` when even the largest
    (k = n) is not enough: too little history (n < 59 at 0.95 / 0.95)."""
    return _order_statistic(n, quantile, confidence)


def _order_statistic(n: int, quantile: float, confidence: float) -> int | None:
    # P(X < k) >= c  <=>  P(X >= k) <= 1 - c; the upper tail summed from X = n down
    # (log-space terms: q ** n underflows for long histories).
    if n <= 0:
        return None
    allowed = 1.0 - confidence
    log_q, log_p = math.log(quantile), math.log1p(-quantile)
    log_n = math.lgamma(n + 1)
    tail = 0.0
    for k in range(n, -1, -1):
        term = log_n - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_q + (n - k) * log_p
        if tail + math.exp(term) > allowed * (1 + 1e-12):
            return k + 1 if k + 1 <= n else None
        tail += math.exp(term)
    return 1


def change_point_run(quantile: float = QUANTILE, rare: float = RARE) -> int:
    """The least number of consecutive observations above a bound on the ``quantile``
    whose probability, while the bound holds, is below ``rare``: ``(1 - quantile) ** r
    < rare`` (2 at 0.95 and 1 %). A run that long marks a change point (Nurmi et al.)."""
    miss = 1.0 - quantile
    run = 1
    while miss**run >= rare:
        run += 1
    return run


class QuantileHistory:
    """QBETS on one series: observations in time order, the bound on their quantile
    (:func:`order_statistic`), and change-point trimming: an observation above the bound
    the history gave just before it is a miss; a run of :func:`change_point_run` misses
    in a row trims the history to that run (the observations since the change).

    ``window``: keep at most the last this many observations (``None``: all)."""

    def __init__(
        self,
        quantile: float = QUANTILE,
        confidence: float = CONFIDENCE,
        rare: float = RARE,
        window: int | None = None,
    ) -> None:
        self.quantile, self.confidence = quantile, confidence
        self.window = window
        self._values: deque[float] = deque()
        self._sorted: list[float] = []
        self._misses = 0
        self._run = change_point_run(quantile, rare)
        self.trims = 0

    def __len__(self) -> int:
        return len(self._values)

    def add(self, value: float) -> None:
        bound = self.bound()
        self._misses = self._misses + 1 if bound is not None and value > bound else 0
        self._values.append(value)
        bisect.insort(self._sorted, value)
        if self.window is not None and len(self._values) > self.window:
            old = self._values.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        if self._misses >= self._run:
            kept = list(self._values)[-self._misses :]
            self._values = deque(kept)
            self._sorted = sorted(kept)
            self._misses = 0
            self.trims += 1

    def bound(self) -> float | None:
        """The upper bound on the quantile; the largest value when the history is too
        short for one; ``None`` with no history."""
        if not self._sorted:
            return None
        k = order_statistic(len(self._sorted), self.quantile, self.confidence)
        return self._sorted[-1] if k is None else self._sorted[k - 1]

    def exact(self) -> bool:
        """Is :meth:`bound` the order statistic (not the fallback to the largest)?"""
        return order_statistic(len(self._sorted), self.quantile, self.confidence) is not None

    def median(self) -> float | None:
        if not self._sorted:
            return None
        n = len(self._sorted)
        middle = n // 2
        if n % 2:
            return self._sorted[middle]
        return (self._sorted[middle - 1] + self._sorted[middle]) / 2.0


# -- Tsafrir's run-time prediction ----------------------------------------------------------


def tsafrir_runtime(recent: Sequence[float], requested_s: float) -> float:
    """Tsafrir, Etsion & Feitelson 2007 (IEEE TPDS), Sec. 3: the mean of the user's last
    two finished jobs' run times (``recent``, oldest first), at most the job's requested
    time; the requested time when the user has fewer than two."""
    if len(recent) < 2:
        return requested_s
    return min(requested_s, (recent[-1] + recent[-2]) / 2.0)


class UserRuntimes:
    """The last two run times of each user's finished jobs (:func:`tsafrir_runtime`)."""

    def __init__(self) -> None:
        self._recent: dict[int | str, deque[float]] = {}

    def add(self, user: int | str | None, runtime_s: float) -> None:
        if user is not None:
            self._recent.setdefault(user, deque(maxlen=2)).append(runtime_s)

    def predict(self, user: int | str | None, requested_s: float) -> float:
        recent = self._recent.get(user) if user is not None else None
        return tsafrir_runtime(recent or (), requested_s)

    def predicted_end(self, job: RunningJob, now: float) -> float:
        """When ``job`` is predicted to end: start + predicted run time; one that has
        outlived its prediction, at its requested end; one past that, now."""
        end = job.started_at + self.predict(job.user, job.requested_s)
        if end <= now:
            end = job.started_at + job.requested_s
        return max(end, now)


# -- the models -----------------------------------------------------------------------------


class Eq1Model(_LearnsFromHistoryOnly):
    """VJM Eq. 1 over the last :data:`~gridcore.policies.queue_stats.WINDOW` starts and
    the queue (module docstring)."""

    name = "eq1"

    def __init__(self) -> None:
        self._started: deque[QueueRecord] = deque(maxlen=WINDOW)

    def forecast(self, job: QueuedJob, view: QueueView) -> WaitForecast:
        records = [QueueRecord(q.submitted_at) for q in view.queued]
        records.extend(self._started)
        stats = estimate_queue_stats(records, view.now)
        wait = expected_wait(stats, 0)
        reason = (
            f"Eq. 1: T_w {stats.t_w:.0f} - T_ffw {stats.t_ffw:.0f}"
            f" + dt {stats.dt:.0f} x (QL {stats.ql} + VJ_seq 0) = {wait:.0f} s"
        )
        return WaitForecast(self.name, wait, None, None, reason)

    def observe_start(self, job: QueuedJob, submitted_at: float, started_at: float) -> None:
        self._started.append(QueueRecord(submitted_at, started_at))

    def observe_end(self, job: RunningJob, started_at: float, ended_at: float) -> None:
        return None


class EqWModel(_LearnsFromHistoryOnly):
    """The default selection's Eq. W on a snapshot built from the view (module
    docstring); the observed means are the live engine's EWMAs over finished jobs."""

    name = "eq_w"

    def __init__(self) -> None:
        self._mean_wait: float | None = None
        self._mean_runtime: float | None = None
        self._waits: dict[Hashable, float] = {}

    def forecast(self, job: QueuedJob, view: QueueView) -> WaitForecast:
        running = sum(r.processors for r in view.running)
        snapshot = SiteSnapshot(
            site="cluster",
            total_processors=view.total_processors,
            idle_processors=view.total_processors - running,
            external_pending_processors=sum(q.processors for q in view.queued),
            pending_jobs=len(view.queued),
            mean_queue_wait_s=self._mean_wait,
            mean_runtime_s=self._mean_runtime,
        )
        request = JobRequest(str(job.job_id), job.processors, job.requested_s)
        idle = effective_idle(snapshot, DEFAULT_PROTOCOL)
        wait = estimated_queue_delay(request, snapshot, idle)
        reason = (
            f"Eq. W: {idle} free of {view.total_processors} for {job.processors}"
            f" (observed wait {self._mean_wait or 0:.0f} s,"
            f" runtime {self._mean_runtime or 0:.0f} s)"
        )
        return WaitForecast(self.name, wait, None, None, reason)

    def observe_start(self, job: QueuedJob, submitted_at: float, started_at: float) -> None:
        self._waits[job.job_id] = started_at - submitted_at

    def observe_end(self, job: RunningJob, started_at: float, ended_at: float) -> None:
        wait = self._waits.pop(job.job_id, None)
        if wait is not None:
            self._mean_wait = _ewma(self._mean_wait, wait)
        self._mean_runtime = _ewma(self._mean_runtime, ended_at - started_at)


def _ewma(mean: float | None, value: float) -> float:
    return value if mean is None else (1 - EWMA_WEIGHT) * mean + EWMA_WEIGHT * value


class BackfillModel(_LearnsFromHistoryOnly):
    """Slurm's estimate: :func:`plan_starts` with every job's requested time."""

    name = "backfill"

    def __init__(self) -> None:
        self._plan = QueuePlan()

    def forecast(self, job: QueuedJob, view: QueueView) -> WaitForecast:
        ends = ((r.started_at + r.requested_s, r.processors) for r in view.running)
        queue = [(q.processors, q.requested_s) for q in view.queued]
        job_shape = (job.processors, job.requested_s)
        start, beyond = planned_start(
            view.now, view.total_processors, ends, queue, job_shape, self._plan
        )
        wait = start - view.now
        reason = (
            f"conservative backfill with requested times: {len(view.queued)} queued ahead"
            f"{beyond}, starts at +{wait:.0f} s"
        )
        return WaitForecast(self.name, wait, None, None, reason)

    def observe_start(self, job: QueuedJob, submitted_at: float, started_at: float) -> None:
        return None

    def observe_end(self, job: RunningJob, started_at: float, ended_at: float) -> None:
        return None


def size_bin(processors: int) -> int:
    """The index of ``processors`` in :data:`SIZE_BINS` (0: 1-4, ..., 3: 65+)."""
    return bisect.bisect_left(SIZE_BINS, processors)


class QbetsModel(_LearnsFromHistoryOnly):
    """QBETS: per size bin, the median observed wait and the bound of a
    :class:`QuantileHistory` of observed waits."""

    name = "qbets"

    def __init__(self) -> None:
        self._bins = [QuantileHistory() for _ in range(len(SIZE_BINS) + 1)]

    def forecast(self, job: QueuedJob, view: QueueView) -> WaitForecast:
        index = size_bin(job.processors)
        history = self._bins[index]
        label = _size_label(index)
        median, bound = history.median(), history.bound()
        if median is None:
            why = f"no wait observed yet for {label} processors: 0, no bound"
            return WaitForecast(self.name, 0.0, None, None, why)
        how = "binomial bound" if history.exact() else "too little history: the largest wait"
        reason = f"{label} processors, {len(history)} waits: median {median:.0f} s, {how}"
        return WaitForecast(self.name, median, bound, CONFIDENCE, reason)

    def observe_start(self, job: QueuedJob, submitted_at: float, started_at: float) -> None:
        self._bins[size_bin(job.processors)].add(started_at - submitted_at)

    def observe_end(self, job: RunningJob, started_at: float, ended_at: float) -> None:
        return None


def _size_label(index: int) -> str:
    low = 1 if index == 0 else SIZE_BINS[index - 1] + 1
    return f"{low}+" if index == len(SIZE_BINS) else f"{low}-{SIZE_BINS[index]}"


def forecast_bin(wait_s: float) -> int:
    """The index of ``wait_s`` in :data:`FORECAST_BINS_S` (0: exactly 0 s)."""
    return bisect.bisect_left(FORECAST_BINS_S, wait_s)


class PredictedBackfillModel:
    """The default: :func:`plan_starts` with Tsafrir's predicted run times, and a
    split-conformal bound from this model's own residuals (module docstring).

    A residual is a forecast's error once its job starts: the wait from the forecast's
    time to the start, minus the forecast (in the replay of a log every job is forecast
    at its submission, so this is its logged wait minus the forecast)."""

    name = "predicted_backfill"

    def __init__(self) -> None:
        self.runtimes = UserRuntimes()
        self._residuals = [
            QuantileHistory(window=RESIDUAL_WINDOW) for _ in range(len(FORECAST_BINS_S) + 1)
        ]
        self._pending: dict[Hashable, tuple[float, float]] = {}  # job -> (forecast, made at)
        self._plan = QueuePlan()

    def _ends(self, view: QueueView) -> Iterator[tuple[float, int]]:
        return ((self.runtimes.predicted_end(r, view.now), r.processors) for r in view.running)

    def _duration(self, job: QueuedJob) -> tuple[int, float]:
        return job.processors, self.runtimes.predict(job.user, job.requested_s)

    def forecast(self, job: QueuedJob, view: QueueView) -> WaitForecast:
        now = view.now
        queue = [self._duration(q) for q in view.queued]
        start, beyond = planned_start(
            now, view.total_processors, self._ends(view), queue, self._duration(job), self._plan
        )
        wait = start - now
        self._remember(job.job_id, wait, now)
        index = forecast_bin(wait)
        history = self._residuals[index]
        margin = history.bound()
        plan = (
            f"backfill with predicted run times: {len(view.queued)} queued ahead{beyond},"
            f" +{wait:.0f} s"
        )
        if margin is None:
            return WaitForecast(self.name, wait, None, None, f"{plan}; no residual yet in its bin")
        how = "binomial bound" if history.exact() else "too few residuals: the largest"
        reason = f"{plan}; {len(history)} residuals in its bin, {how} +{max(0.0, margin):.0f} s"
        return WaitForecast(self.name, wait, wait + max(0.0, margin), CONFIDENCE, reason)

    def _remember(self, job_id: Hashable, wait: float, now: float) -> None:
        self._pending.pop(job_id, None)
        self._pending[job_id] = (wait, now)
        if len(self._pending) > PENDING_LIMIT:
            del self._pending[next(iter(self._pending))]

    def observe_queue(self, view: QueueView) -> Mapping[Hashable, tuple[float, float]]:
        """Forecast, as of ``view.now``, each of the first :data:`PLAN_DEPTH` queued jobs
        not forecast yet, to learn its residual when it starts; return those forecasts
        (job -> (wait, made at)). One plan serves them all: conservative backfill places
        a queued job behind the jobs ahead of it only, so its planned start is the
        forecast it would have had, asked then behind them. Live, a site's jobs are seen
        queued at its observations, not asked about at their submission: this is where
        the live conformal bound's residuals come from."""
        queued = view.queued[:PLAN_DEPTH]
        if all(q.job_id in self._pending for q in queued):
            return {}
        now = view.now
        plan = [self._duration(q) for q in queued]
        starts = plan_starts(now, view.total_processors, self._ends(view), plan)
        fresh = {}
        for job, start in zip(queued, starts, strict=True):
            if job.job_id not in self._pending:
                self._remember(job.job_id, start - now, now)
                fresh[job.job_id] = (start - now, now)
        return fresh

    def recall(self, job_id: Hashable, wait_s: float, made_at: float) -> None:
        """A forecast of ``job_id`` made at ``made_at`` (by a model of this kind): its
        start, when observed, gives the residual, and the job is not forecast again."""
        self._remember(job_id, wait_s, made_at)

    def observe_start(self, job: QueuedJob, submitted_at: float, started_at: float) -> None:
        made = self._pending.pop(job.job_id, None)
        if made is not None:
            forecast, made_at = made
            self._residuals[forecast_bin(forecast)].add(started_at - made_at - forecast)

    def observe_end(self, job: RunningJob, started_at: float, ended_at: float) -> None:
        self.runtimes.add(job.user, ended_at - started_at)


WAIT_MODELS: Mapping[str, Callable[[], WaitModel]] = MappingProxyType(
    {
        "eq1": Eq1Model,
        "eq_w": EqWModel,
        "backfill": BackfillModel,
        "qbets": QbetsModel,
        "predicted_backfill": PredictedBackfillModel,
    }
)
"""Every wait model by name: a factory of a fresh one (no history)."""

DEFAULT_WAIT_MODEL = "predicted_backfill"
"""The model decisions use: fixed before the measurements (docs/wait-prediction.md)."""
