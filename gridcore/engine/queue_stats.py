"""The queue-wait history behind VJM Eq. 1: what every site showed of its queue, over time.

VJM (``docs/papers.md`` Sec. 3.2) evaluates a cluster "via the
average waiting time of the external jobs from history". :func:`record_observation`
keeps that history in ``gc_queue_waits`` from each site observation (one row per job the
site showed with a submit time: Slurm's ``/jobs`` ``submit_time``/``start_time``, a local
site's own job rows), and :func:`queue_stats` turns a site's rows into Eq. 1's ``T_w``,
``T_ffw``, ``QL`` and ``dt`` with the pure estimator
:func:`gridcore.policies.queue_stats.estimate_queue_stats` (estimators and cold-start
values are documented there).

Which jobs count. The paper's external jobs are those "submitted outside of the domain by
grid users", as opposed to the cluster's local users' jobs, which local policies favour.
A site shows us neither label: it shows its whole queue. Our own pilots and site jobs are
grid jobs, so to the cluster they are external jobs too, and the issue asks for "every
pilot's own wait" as well; so every job counts, ours and others' alike. The row's
``external`` column (True: the job carries none of our submission keys) keeps the
distinction for whoever wants to estimate from others' jobs alone; the estimate here
does not filter on it.

How a row evolves (all in the caller's transaction, the one that stores the
observation):

* a job seen with a submit time gets a row (unique per site and site job id), ``seen_at``
  set to the observation's time (never moved backwards by a late, older observation);
* ``started_at`` is set once, the first time the job is seen running or finished with a
  start time (a running job whose site gives no start time: the observation's time, an
  upper bound); it never changes afterwards;
* ``processors``, ``owner`` and ``time_limit_s`` are what the site last said of the job;
  ``ended_at`` is set once, the first time the job is seen finished with an end time (a
  site that shows only live jobs, like a local site, never gives one): the wait models'
  run-time history (:mod:`gridcore.engine.wait_models`);
* a waiting row that an observation did not refresh is dropped: the job left the queue
  without being seen started (cancelled while pending, or started and finished between
  two observations of a site that, like a local site, shows only live jobs), and must
  not count as waiting for ever. Slurm reports a job cancelled while pending as finished
  with no nodes; the adapter gives it no start, so it is dropped the same way;
* per site only the newest :data:`HISTORY_STARTED` started rows are kept (by start,
  then id), plus every waiting row (bounded by what the site shows). The estimator reads
  only the last ``WINDOW`` starts; the rest is history for a person or a later estimator.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, and_, case, delete, func, insert, select
from sqlalchemy.sql.dml import Insert

from gridcore.model import JobState, ObservedJob, SiteObservation
from gridcore.policies.coreservation import QueueStats
from gridcore.policies.queue_stats import QueueRecord, estimate_queue_stats
from gridcore.state.schema import queue_waits

HISTORY_STARTED = 500


def record_observation(
    conn: Connection,
    obs: SiteObservation,
    own_job_ids: set[str] | None = None,
    *,
    keep_started: int = HISTORY_STARTED,
) -> None:
    """Fold one site observation into the site's queue-wait history (module docstring).

    A job is ours (``external`` False) if it carries one of our submission keys or its id
    is in ``own_job_ids``. Jobs without a submit time are skipped.
    """
    rows = _rows(obs, own_job_ids or set())
    if rows:
        conn.execute(_upsert(conn), rows)
    conn.execute(
        delete(queue_waits).where(
            and_(
                queue_waits.c.site == obs.site,
                queue_waits.c.started_at.is_(None),
                queue_waits.c.seen_at < obs.observed_at,
            )
        )
    )
    _trim_started(conn, obs.site, keep_started)


def queue_stats(conn: Connection, site_names: Iterable[str], now: float) -> dict[str, QueueStats]:
    """Eq. 1's ``T_w``, ``T_ffw``, ``QL``, ``dt`` per site from its history at ``now``; a
    site with no history gets the estimator's cold-start values."""
    names = list(dict.fromkeys(site_names))
    records: dict[str, list[QueueRecord]] = {name: [] for name in names}
    if names:
        found = conn.execute(
            select(queue_waits.c.site, queue_waits.c.submitted_at, queue_waits.c.started_at).where(
                queue_waits.c.site.in_(names)
            )
        )
        for site, submitted_at, started_at in found:
            records[site].append(QueueRecord(submitted_at, started_at))
    return {name: estimate_queue_stats(records[name], now) for name in names}


def _rows(obs: SiteObservation, own: set[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for job in obs.jobs:
        if job.submitted_at is None:
            continue
        started = _started_at(job, obs.observed_at)
        if job.state.finished and started is None:
            continue  # never started: its waiting row, if any, is dropped as not seen
        rows.append(
            {
                "site": obs.site,
                "site_job_id": job.job_id,
                "external": job.key is None and job.job_id not in own,
                "submitted_at": job.submitted_at,
                "started_at": started,
                "seen_at": obs.observed_at,
                "processors": job.processors,
                "owner": job.user,
                "time_limit_s": job.time_limit_s,
                "ended_at": job.ended_at if started is not None else None,
            }
        )
    # one lock order for every writer (PostgreSQL: concurrent upserts cannot deadlock)
    return sorted(rows, key=lambda row: str(row["site_job_id"]))


def _started_at(job: ObservedJob, observed_at: float) -> float | None:
    """When the job left the queue, as far as this observation tells."""
    if job.state is not JobState.RUNNING and not job.state.finished:
        return None
    if job.started_at is not None:
        return job.started_at
    # Running with no start time reported: it started by now at the latest. Finished
    # with none: it never started (cancelled while pending).
    return observed_at if job.state is JobState.RUNNING else None


def _upsert(conn: Connection) -> Insert:
    """Insert a row, or refresh the existing one: the first start sticks, ``seen_at``
    only moves forward, and once seen ours a job stays ours."""
    stmt: Any
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        stmt = pg_insert(queue_waits)
    elif conn.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        stmt = sqlite_insert(queue_waits)
    else:  # pragma: no cover - the state DB is SQLite or PostgreSQL
        return insert(queue_waits)
    new = stmt.excluded
    upsert: Insert = stmt.on_conflict_do_update(
        index_elements=[queue_waits.c.site, queue_waits.c.site_job_id],
        set_={
            "started_at": func.coalesce(queue_waits.c.started_at, new.started_at),
            "seen_at": case(
                (new.seen_at > queue_waits.c.seen_at, new.seen_at),
                else_=queue_waits.c.seen_at,
            ),
            "external": and_(queue_waits.c.external, new.external),
            # the first end sticks, as the first start; a limit changed while the job
            # waited (scontrol update) is the newest one seen
            "ended_at": func.coalesce(queue_waits.c.ended_at, new.ended_at),
            "processors": func.coalesce(new.processors, queue_waits.c.processors),
            "owner": func.coalesce(new.owner, queue_waits.c.owner),
            "time_limit_s": func.coalesce(new.time_limit_s, queue_waits.c.time_limit_s),
        },
    )
    return upsert


def _trim_started(conn: Connection, site: str, keep: int) -> None:
    newest = (
        select(queue_waits.c.id)
        .where(and_(queue_waits.c.site == site, queue_waits.c.started_at.is_not(None)))
        .order_by(queue_waits.c.started_at.desc(), queue_waits.c.id.desc())
        .limit(max(0, keep))
    )
    conn.execute(
        delete(queue_waits).where(
            and_(
                queue_waits.c.site == site,
                queue_waits.c.started_at.is_not(None),
                queue_waits.c.id.not_in(newest),
            )
        )
    )
