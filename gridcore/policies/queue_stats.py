"""Estimate VJM Eq. 1's queue statistics of one cluster from what it showed over time.

VJM (``docs/papers.md`` Sec. 3.2) treats each cluster as a black
box and evaluates it "via the average waiting time of the external jobs from history".
Eq. 1 needs four numbers per cluster (:class:`gridcore.policies.coreservation.QueueStats`):

* ``T_w``: the mean wait (start - submit) of the last :data:`WINDOW` jobs that started
  (external jobs and our own pilots alike: a pilot is an external job to the cluster);
* ``T_ffw``: how long the earliest-submitted job still waiting has waited;
* ``QL``: how many jobs are waiting (other users' and ours not yet started);
* ``dt``: the mean interval between consecutive starts of those last jobs, counting only
  the intervals in which the later job was already waiting when the earlier one started
  (its submit <= that start): Eq. 1 multiplies ``dt`` by a queue position, so it is the
  interval at which a backlogged queue starts jobs, not the gap between arrivals. When no
  such pair was seen (no two jobs ever waited together), ``(last start - first start) /
  (n - 1)`` over those jobs: the cluster started each before the next arrived, so the
  arrival gap bounds the interval from above.

Cold start (the paper gives none): with no start seen, ``T_w`` is :data:`COLD_WAIT_S`
and ``dt`` is :data:`COLD_INTERVAL_S`; with one start, ``dt`` is ``T_w`` (one sample of
an interval we cannot see). These defaults make an unknown cluster look like a moderately
slow one, so a cluster that has shown short waits is preferred to one never tried, and an
unknown one still beats a cluster that has shown long waits.

Pure: the records come from the state DB (``gridcore.engine.queue_stats``) or from the
simulator (``gridcore.sim.coreservation``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from gridcore.policies.coreservation import QueueStats

WINDOW = 50
COLD_WAIT_S = 60.0
COLD_INTERVAL_S = 30.0


@dataclass(frozen=True)
class QueueRecord:
    """One job a cluster showed: submitted at, started at (None while it waits)."""

    submitted_at: float
    started_at: float | None = None


def estimate_queue_stats(
    records: Iterable[QueueRecord],
    now: float,
    *,
    window: int = WINDOW,
    cold_wait_s: float = COLD_WAIT_S,
    cold_interval_s: float = COLD_INTERVAL_S,
) -> QueueStats:
    """``T_w``, ``T_ffw``, ``QL``, ``dt`` (module docstring) from a cluster's records."""
    started: list[QueueRecord] = []
    waiting: list[float] = []
    for r in records:
        if r.started_at is None:
            waiting.append(r.submitted_at)
        else:
            started.append(r)
    started.sort(key=lambda r: r.started_at or 0.0)
    recent = started[-window:] if window > 0 else []
    if recent:
        t_w = sum(max(0.0, (r.started_at or 0.0) - r.submitted_at) for r in recent) / len(recent)
    else:
        t_w = cold_wait_s
    if len(recent) >= 2:
        dt = _start_interval(recent)
    elif recent:
        dt = t_w
    else:
        dt = cold_interval_s
    t_ffw = max(0.0, now - min(waiting)) if waiting else 0.0
    return QueueStats(t_w=t_w, t_ffw=t_ffw, ql=len(waiting), dt=max(0.0, dt))


def _start_interval(recent: list[QueueRecord]) -> float:
    """``dt`` of two or more started records sorted by start (module docstring)."""
    backlogged = [
        (later.started_at or 0.0) - (earlier.started_at or 0.0)
        for earlier, later in itertools.pairwise(recent)
        if later.submitted_at <= (earlier.started_at or 0.0)
    ]
    if backlogged:
        return sum(backlogged) / len(backlogged)
    first, last = recent[0].started_at or 0.0, recent[-1].started_at or 0.0
    return (last - first) / (len(recent) - 1)
