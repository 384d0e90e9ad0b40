"""The live engines' wait models (issue 22 item 5): each site's queue as it was last
observed, a model of :data:`~gridcore.policies.wait_prediction.DEFAULT_WAIT_MODEL`
trained on the site's stored history, and its forecasts for a decision.

What is stored (in the transaction that stores an observation,
:func:`gridcore.engine.selection.store_observation` and
:func:`gridcore.engine.queue_stats.record_observation`):

* ``gc_sites.queue``: the observation's live jobs (:func:`encode_queue`): per job its
  processors, running or pending, submit and start times, time limit, user, Slurm's
  start estimate (a pending job's ``start_time`` where the backfill scheduler set one),
  and whether it is ours;
* ``gc_queue_waits``: per job its submit, start, size, user, time limit and, once seen
  finished, its end: the model's ``observe_start`` / ``observe_end`` history.

What a decision reads (:class:`WaitBook`, one per engine; the caller's transaction): the
site's ``observed_at`` comes with its snapshot (:class:`gridcore.engine.selection.SnapshotReader`);
while it is unchanged the site's model and queue are reused, so the hot path runs no
query and trains nothing. A newer observation rebuilds the model from the history (its
rows: at most :data:`gridcore.engine.queue_stats.HISTORY_STARTED` started jobs, fed in
time order, ends before starts at one instant, as the replay of docs/wait-prediction.md,
and the waiting jobs' stored forecasts).
A late, older observation's history reaches the model with the next newer one.

The conformal bound's residuals come from the site's own jobs, and live in the history
so that every engine process (an Airflow task's, the API server's) shares them. A model
rebuilt from the history is first given back the forecasts stored there
(``WaitModel.recall``), so each job's start in the history gives its residual; then it
forecasts the observed queue's pending jobs it has not forecast yet (one plan,
``WaitModel.observe_queue``), and the engine stores those forecasts in the jobs' history
rows (``forecast_s``, ``forecast_at``, ``forecast_by``) right after its decision, in
short transactions of their own (:func:`store_forecasts`; docs/wait-prediction.md, "What
each model knows"). Storing an observation trains nothing. A
forecast is reused for :data:`FORECAST_TTL_S` while the request's shape and our
in-flight work at the site are unchanged, so a decision re-plans only the sites the
previous ones changed.

The view a forecast sees: the observed running jobs (ours too: the report counts them);
others' pending jobs, first come first served; then OUR work in flight (selections and
pilots not yet seen running, ``SiteSnapshot.in_flight_processors``, as the policy counts
it) as jobs of the request's size and run time; then the request itself. Its run time
is the one Eq. (C) uses (:func:`gridcore.policies.selection.expected_runtime`), given
as its requested time without a user, so the model takes it as it is.

When the model cannot be used, the caller falls back to Eq. W / Eq. 1 and the reason
says why (:attr:`SiteQueue.unusable_because`): the site was never observed, or a job of
its queue has no time limit (unlimited, or an adapter that does not say), so no plan of
the queue exists, its queue is longer than :data:`MAX_QUEUED` jobs, or our work in flight
there is more than :data:`MAX_AHEAD` jobs.

Slurm's own estimate is not a wait model: it exists for jobs already pending, not for
the request. It is reported beside the model's forecast (:meth:`SiteQueue.slurm_note`):
the latest start Slurm's backfill plan gives the pending jobs ahead of the request.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Connection, bindparam, or_, select, update
from sqlalchemy.exc import SQLAlchemyError

from gridcore.model import JobRequest, JobState, SiteObservation, SiteSnapshot
from gridcore.policies.selection import expected_runtime
from gridcore.policies.wait_prediction import (
    DEFAULT_WAIT_MODEL,
    WAIT_MODELS,
    PastJob,
    QueuedJob,
    QueueView,
    RunningJob,
    WaitForecast,
    WaitModel,
    history_events,
    learn_event,
)
from gridcore.state.schema import queue_waits, sites
from gridcore.state.store import Store

log = logging.getLogger(__name__)

QUEUE_FORMAT = 1
"""The version of :func:`encode_queue`'s JSON; another one is read as no queue."""

MAX_AHEAD = 256
"""Our in-flight jobs a view queues at most (each a job of the request's size): a plan
is linear in the queue per job, and the hot path must stay cheap. Beyond it: Eq. W."""

MAX_QUEUED = 500
"""Jobs of others a site's stored queue may hold (running and pending) for the model to
plan it: a plan places each queued job by a scan of the profile, so one forecast costs
up to about the square of the queue (``plan_starts`` with sizes 1-64 on 128 processors:
0.4 ms for 100 queued jobs, 21 ms for 1,000, 1.8 s for 10,000 on this project's 2-core
machine), and decisions are made inside a transaction. Beyond it: Eq. W / Eq. 1, and the
reason says so. The models plan at most
:data:`~gridcore.policies.wait_prediction.PLAN_DEPTH` (also 500) queued jobs anyway."""

FORECAST_TTL_S = 1.0
"""A site's forecast for a request's processors and run time, with the same work of ours
in flight there, is reused for this long (its wait then up to 1 s stale; the queue it
plans is as old as the site's observation anyway): a decision changes one site's
in-flight count, so the next one re-plans that site alone instead of every site (100
observed sites re-planned on every decision ran at 0.04 x Eq. W's decision rate; with
this, 0.30 x: docs/selection.md)."""

FORECASTS_KEPT = 4096
"""Forecasts kept per site before they are all dropped (a bound; they live 1 s anyway)."""

REQUEST_ID = "?request"
"""The job id a forecast's request has (the model remembers its last forecast by id)."""

WaitSource = Callable[[JobRequest, SiteSnapshot], WaitForecast | None]
"""A wait model's forecast of a request's wait at a site as its snapshot stands
(``None``: Eq. W there): what a burst's decisions take
(:func:`gridcore.policies.selection.select_sites`)."""


def encode_queue(obs: SiteObservation, own: set[str]) -> str:
    """The observation's live jobs as ``gc_sites.queue`` keeps them (module docstring):
    ``[id, processors, "R"|"P", submitted_at, started_at, time_limit_s, user,
    start_estimate, ours]``."""
    jobs: list[list[Any]] = []
    for job in obs.jobs:
        if job.state is JobState.RUNNING:
            state = "R"
        elif job.state is JobState.PENDING:
            state = "P"
        else:
            continue
        ours = job.key is not None or job.job_id in own
        jobs.append(
            [
                job.job_id, job.processors, state, job.submitted_at, job.started_at,
                job.time_limit_s, job.user, job.start_estimate, ours,
            ]
        )  # fmt: skip
    body = {"v": QUEUE_FORMAT, "at": obs.observed_at, "total": obs.total_processors, "jobs": jobs}
    return json.dumps(body, separators=(",", ":"))


@dataclass(frozen=True)
class SiteQueue:
    """One site's stored queue, as a model's view starts from it."""

    site: str
    observed_at: float
    total_processors: int = 0
    running: tuple[RunningJob, ...] = ()
    queued: tuple[QueuedJob, ...] = ()  # others' pending jobs, first come first served
    estimates: tuple[float, ...] = ()  # Slurm's start estimates of those that have one
    unusable_because: str = ""

    def view(self) -> QueueView:
        """The queue as observed: others' running and pending jobs."""
        return QueueView(self.observed_at, self.total_processors, self.running, self.queued)

    def slurm_note(self, now: float) -> str:
        """Slurm's own estimate for the pending jobs ahead, in words ("" when none)."""
        if not self.estimates:
            return ""
        latest = max(self.estimates) - now
        return (
            f"Slurm's backfill plan starts the {len(self.estimates)} pending jobs ahead"
            f" that it has planned by +{max(0.0, latest):.0f} s"
        )


def decode_queue(site: str, observed_at: float, text: str | None) -> SiteQueue:
    """The stored queue of ``site`` (:func:`encode_queue`); one the model cannot use says
    why in :attr:`SiteQueue.unusable_because`."""
    if not text:
        return SiteQueue(site, observed_at, unusable_because="no observation stored yet")
    body = json.loads(text)
    if body.get("v") != QUEUE_FORMAT:
        return SiteQueue(site, observed_at, unusable_because="no observation stored yet")
    at, total = float(body["at"]), int(body["total"])
    running: list[RunningJob] = []
    queued: list[tuple[float, str, QueuedJob, float | None]] = []
    unlimited = 0
    for job_id, processors, state, submitted, started, limit, user, estimate, ours in body["jobs"]:
        if state != "R" and ours:
            continue  # ours pending are in flight: the snapshot counts them
        if limit is None:
            unlimited += 1
            continue
        if state == "R":
            start = at if started is None else float(started)
            running.append(RunningJob(job_id, int(processors), start, float(limit), user))
        elif int(processors) <= total:
            # a job larger than the site never starts (Slurm holds it), delaying nobody
            submit = at if submitted is None else float(submitted)
            job = QueuedJob(job_id, int(processors), submit, float(limit), user)
            queued.append((submit, str(job_id), job, estimate))
    if unlimited:
        why = f"{unlimited} of its jobs have no time limit (the queue cannot be planned)"
        return SiteQueue(site, observed_at, unusable_because=why)
    if len(running) + len(queued) > MAX_QUEUED:
        why = (
            f"{len(running)} running and {len(queued)} queued jobs > {MAX_QUEUED}"
            " (too long a queue to plan on every decision)"
        )
        return SiteQueue(site, observed_at, unusable_because=why)
    queued.sort(key=lambda q: (q[0], q[1]))
    estimates = tuple(float(e) for _, _, _, e in queued if e is not None)
    return SiteQueue(
        site, observed_at, total, tuple(running), tuple(q[2] for q in queued), estimates
    )


@dataclass
class _Site:
    queue: SiteQueue
    model: WaitModel | None  # None: the queue cannot be planned (queue.unusable_because)
    # (processors, run time, ours in flight) -> (made at, forecast): FORECAST_TTL_S
    forecasts: dict[tuple[int, float, int], tuple[float, SiteWait]] = field(default_factory=dict)


@dataclass(frozen=True)
class SiteWait:
    """A forecast at one site, or why there is none (then Eq. W / Eq. 1 decides)."""

    site: str
    forecast: WaitForecast | None
    why_not: str = ""
    slurm: str = ""

    def note(self) -> str:
        """The line a decision's reasons carry for this site."""
        if self.forecast is None:
            return f"queue delay at site {self.site} by Eq. W: {self.why_not}"
        f = self.forecast
        bound = f", bound {f.bound_s:.0f} s at {f.confidence}" if f.bound_s is not None else ""
        slurm = f"; {self.slurm}" if self.slurm else ""
        return (
            f"queue delay at site {self.site}: {f.wait_s:.0f} s by wait model {f.predictor}"
            f"{bound} ({f.reason}){slurm}"
        )


@dataclass
class WaitBook:
    """Each site's model and stored queue for one engine (module docstring); safe to
    share between threads (one lock around the models)."""

    model_name: str = DEFAULT_WAIT_MODEL
    _sites: dict[str, _Site] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    builds: int = 0  # models trained so far (tests and benchmarks read it)
    _unstored: dict[str, dict[Hashable, tuple[float, float]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model_name not in WAIT_MODELS:
            known = ", ".join(WAIT_MODELS)
            raise ValueError(f"unknown wait model {self.model_name!r} (known: {known})")

    def refresh(self, conn: Connection, observed: Mapping[str, float]) -> None:
        """Reload every site whose observation is newer than its model's (in ``conn``'s
        transaction)."""
        stale = [
            s
            for s, at in observed.items()
            if s not in self._sites or self._sites[s].queue.observed_at != at
        ]
        if not stale:
            return
        rows = conn.execute(
            select(sites.c.name, sites.c.observed_at, sites.c.queue).where(sites.c.name.in_(stale))
        ).all()
        for name, observed_at, text in rows:
            queue = decode_queue(name, observed_at, text)
            model = None if queue.unusable_because else self._train(conn, queue)
            with self._lock:
                self._sites[name] = _Site(queue, model)

    def take_forecasts(self) -> dict[str, dict[Hashable, tuple[float, float]]]:
        """The forecasts of pending jobs the models made since the last call, per site
        (job -> (wait, made at)), for :func:`store_forecasts`; forgotten here."""
        with self._lock:
            taken, self._unstored = self._unstored, {}
        return taken

    def _train(self, conn: Connection, queue: SiteQueue) -> WaitModel:
        """A model of the site's history, given back the forecasts stored there; it
        forecasts the queue's pending jobs it has not forecast yet (kept for
        :meth:`take_forecasts`)."""
        site = queue.site
        model = WAIT_MODELS[self.model_name]()
        rows = conn.execute(
            select(
                queue_waits.c.site_job_id,
                queue_waits.c.processors,
                queue_waits.c.owner,
                queue_waits.c.time_limit_s,
                queue_waits.c.submitted_at,
                queue_waits.c.started_at,
                queue_waits.c.ended_at,
                queue_waits.c.forecast_s,
                queue_waits.c.forecast_at,
                queue_waits.c.forecast_by,
            ).where(
                queue_waits.c.site == site,
                or_(
                    queue_waits.c.started_at.is_not(None),
                    queue_waits.c.forecast_by == self.model_name,
                ),
            )
        ).all()
        for row in rows:
            if row.forecast_by == model.name and row.forecast_s is not None:
                model.recall(row.site_job_id, row.forecast_s, row.forecast_at)
        jobs = (
            PastJob(row.site_job_id, row.processors or 1, row.submitted_at, row.started_at,
                    row.time_limit_s or 0.0, row.owner, row.ended_at)
            for row in rows
            if row.started_at is not None
        )  # fmt: skip
        for _, is_start, job in history_events(jobs):
            learn_event((model,), is_start, job)
        fresh = model.observe_queue(queue.view())
        if fresh:
            with self._lock:
                self._unstored.setdefault(site, {}).update(fresh)
        self.builds += 1
        return model

    def has_model(self, site: str) -> bool:
        entry = self._sites.get(site)
        return entry is not None and entry.model is not None

    def made(self, site: str, processors: int, runtime: float, in_flight: int) -> SiteWait | None:
        """The forecast made last for that request shape and in-flight count at ``site``."""
        entry = self._sites.get(site)
        made = None if entry is None else entry.forecasts.get((processors, runtime, in_flight))
        return None if made is None else made[1]

    def why_no_model(self, site: str) -> str | None:
        """Why ``site`` has no model (``None``: it has one)."""
        entry = self._sites.get(site)
        if entry is None:
            return "no observation stored yet"
        return None if entry.model is not None else entry.queue.unusable_because

    def wait_at(self, request: JobRequest, snapshot: SiteSnapshot, now: float) -> SiteWait:
        """The model's forecast of ``request``'s wait at the site as ``snapshot`` stands
        (our in-flight work queued ahead), or why there is none."""
        entry = self._sites.get(snapshot.site)
        if entry is None:
            return SiteWait(snapshot.site, None, "no observation stored yet")
        queue = entry.queue
        if entry.model is None:
            return SiteWait(snapshot.site, None, queue.unusable_because)
        runtime, _ = expected_runtime(request, snapshot)
        key = (request.processors, runtime, snapshot.in_flight_processors)
        made = entry.forecasts.get(key)
        if made is not None and 0.0 <= now - made[0] < FORECAST_TTL_S:
            return made[1]
        ahead = _in_flight_jobs(snapshot.in_flight_processors, request.processors, runtime, now)
        if ahead is None:
            why = f"ours in flight ({snapshot.in_flight_processors} processors) > {MAX_AHEAD} jobs"
            return SiteWait(snapshot.site, None, why)
        view = QueueView(
            now, max(snapshot.total_processors, request.processors), queue.running,
            (*queue.queued, *ahead),
        )  # fmt: skip
        job = QueuedJob(REQUEST_ID, request.processors, now, runtime)
        with self._lock:
            forecast = entry.model.forecast(job, view)
        found = SiteWait(snapshot.site, forecast, slurm=queue.slurm_note(now))
        if len(entry.forecasts) >= FORECASTS_KEPT:
            entry.forecasts.clear()
        entry.forecasts[key] = (now, found)
        return found


def store_forecasts(store: Store, book: WaitBook) -> None:
    """Store the forecasts ``book``'s models made of pending jobs (:meth:`WaitBook.
    take_forecasts`) in the jobs' history rows, one short transaction per site, after
    the decision that made them (module docstring). Each transaction locks the site's
    row first, as storing an observation does, then the jobs' rows in one order: it
    cannot deadlock with an observation or a decision. A job already forecast keeps its
    forecast, and so does one whose recorded start came before this forecast (a job
    requeued after it first ran: the history keeps its first start). Best effort: a
    failure is logged, and those forecasts are lost (their jobs' residuals with them)."""
    for site, fresh in sorted(book.take_forecasts().items()):
        rows = [
            {"job": str(job_id), "wait": wait, "at": made_at}
            for job_id, (wait, made_at) in sorted(fresh.items(), key=lambda f: str(f[0]))
        ]
        try:
            with store.begin() as conn:
                store.lock_site(conn, site)
                conn.execute(
                    update(queue_waits)
                    .where(
                        queue_waits.c.site == site,
                        queue_waits.c.site_job_id == bindparam("job"),
                        # a start before the forecast is an earlier run's (a requeued job)
                        or_(
                            queue_waits.c.started_at.is_(None),
                            queue_waits.c.started_at >= bindparam("at"),
                        ),
                        queue_waits.c.forecast_s.is_(None),
                    )
                    .values(
                        forecast_s=bindparam("wait"),
                        forecast_at=bindparam("at"),
                        forecast_by=book.model_name,
                    ),
                    rows,
                )
        except SQLAlchemyError as exc:
            log.warning("site %s: %d wait forecasts not stored: %s", site, len(rows), exc)


def _in_flight_jobs(
    processors: int, size: int, runtime: float, now: float
) -> tuple[QueuedJob, ...] | None:
    """Our in-flight processors as queued jobs of ``size`` (the last one the rest)."""
    if processors <= 0:
        return ()
    count = math.ceil(processors / size)
    if count > MAX_AHEAD:
        return None
    jobs = [QueuedJob(f"?ours{i}", size, now, runtime) for i in range(processors // size)]
    if processors % size:
        jobs.append(QueuedJob(f"?ours{len(jobs)}", processors % size, now, runtime))
    return tuple(jobs)


@dataclass
class DecisionWaits:
    """One decision's (or burst's) forecasts: the :data:`WaitSource` a burst takes, the
    mapping a single decision takes, and the note each decision's reasons get.
    ``counts_in_flight``: the protocol's (``SelectionProtocol.counts_in_flight``); a
    protocol that does not discount our in-flight work (naive, random) does not see it
    queued ahead in the model's view either."""

    book: WaitBook
    now: float
    counts_in_flight: bool = True

    def __call__(self, request: JobRequest, snapshot: SiteSnapshot) -> WaitForecast | None:
        if not self.book.has_model(snapshot.site):
            return None  # the hot path on unobserved sites: nothing to build
        return self.site_wait(request, snapshot).forecast

    def site_wait(self, request: JobRequest, snapshot: SiteSnapshot) -> SiteWait:
        if not self.counts_in_flight and snapshot.in_flight_processors:
            snapshot = replace(snapshot, in_flight_processors=0)
        return self.book.wait_at(request, snapshot, self.now)

    def mapping(
        self, request: JobRequest, snapshots: Sequence[SiteSnapshot]
    ) -> dict[str, WaitForecast]:
        """The forecast per site that has one (a single decision's ``waits``)."""
        out = {}
        has_model = self.book.has_model
        for snap in snapshots:
            if has_model(snap.site) and snap.usable and snap.total_processors >= request.processors:
                forecast = self.site_wait(request, snap).forecast
                if forecast is not None:
                    out[snap.site] = forecast
        return out

    def note(self, request: JobRequest, site: str, in_flight: int, runtime: float) -> str | None:
        """The chosen site's line, as its forecast was made (``in_flight``: ours there
        when the decision was taken; ``runtime``: the request's there)."""
        ours = in_flight if self.counts_in_flight else 0
        found = self.book.made(site, request.processors, runtime, ours)
        if found is None:
            why = self.book.why_no_model(site)
            return None if why is None else SiteWait(site, None, why).note()
        return found.note()


def virtual_job_waits(
    book: WaitBook, snapshot: SiteSnapshot, vj_size: int, count: int, limit_s: float, now: float
) -> tuple[tuple[float, ...] | None, str]:
    """VJM's ``T_avail`` of this selection's 1st, 2nd, ... virtual job at a cluster
    (:attr:`gridcore.policies.coreservation.ClusterView.t_avails`): the model's forecast
    of each, the earlier ones in flight ahead of it, never decreasing (the cluster's
    heap order); a pilot asks ``limit_s``. ``None`` and why: Eq. 1 decides there."""
    request = JobRequest("?virtual-job", vj_size, limit_s)
    waits: list[float] = []
    first: SiteWait | None = None
    for _ in range(count):
        found = book.wait_at(request, snapshot, now)
        if found.forecast is None:
            return None, f"T_avail at cluster {snapshot.site} by Eq. 1: {found.why_not}"
        first = first or found
        waits.append(max(found.forecast.wait_s, waits[-1] if waits else 0.0))
        snapshot = snapshot.add_in_flight(vj_size)
    if first is None or first.forecast is None:
        return (), f"T_avail at cluster {snapshot.site}: room for no more virtual jobs"
    slurm = f"; {first.slurm}" if first.slurm else ""
    note = (
        f"T_avail at cluster {snapshot.site}: {waits[0]:.0f} to {waits[-1]:.0f} s for"
        f" {len(waits)} virtual jobs by wait model {first.forecast.predictor}"
        f" ({first.forecast.reason}){slurm}"
    )
    return tuple(waits), note
