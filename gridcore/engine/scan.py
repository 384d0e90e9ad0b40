"""The scanning engine's mechanism, shared by every engine that scans its jobs under a
lease: KOALA's co-allocation (:mod:`gridcore.engine.coallocation`, KOALA 2005 Sec. 3.1:
KOALA scans its queues periodically) and VJM's co-reservation
(:mod:`gridcore.engine.coreservation`). An engine keeps only its paper's steps; a
:class:`FencedScan` it owns does the rest:

* the fenced lease (:mod:`gridcore.engine.lease`): one scan at a time per lease name; a
  scan takes the lease, keeps it renewed while it works (slow site I/O does not let it
  expire under a live holder), and every transition it commits runs in :meth:`tx`,
  which commits only while the scan's token is current. A lost lease stops the scan:
  what it committed before stays, nothing after is written;
* the report (:class:`ScanReport`): per named event of the engine's steps (KOALA's
  ``placed``, VJM's ``dispatched``...), the ids it concerned, and readable reasons;
* the per-job guard (:meth:`handling`, issue 7 item 4): an unexpected error while
  handling one job (a database error, an adapter's unhandled exception) rolls back that
  job's transaction and is counted against the job, in a fenced transaction of its
  own; at :data:`MAX_HANDLING_ERRORS` the job fails with the error's message and the
  scan goes on with the other jobs;
* holder ids (:func:`holder_id`) and giving the lease up (:meth:`release_lease`).

A submitter that died between the site accepting a job and recording its id is adopted
by :func:`gridcore.engine.submission.adopt_stale`, the look-up shared by these scans and
the selection runtime.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy import Connection, Table, select, update

from gridcore.engine.lease import Grant, Lease, LeaseLost
from gridcore.state.store import Store

log = logging.getLogger(__name__)

MAX_HANDLING_ERRORS = 3
"""Unexpected errors while handling one job (anything but a lost lease) after which the
job fails with the error's message; below it the job's transaction is rolled back and
the next scan tries again."""
ERROR_TEXT_CHARS = 500
"""A handling error is kept in the job's message cut to this many characters."""

FAILED = "failed"
"""The event of a job the handling-error guard failed (an engine may add to it too)."""

SiteJobs = Sequence[tuple[str, str]]
"""(site, site job id) pairs to cancel once a transaction committed."""

FailJob = Callable[[Connection, int, str], SiteJobs | None]
"""Fail job ``id`` with ``message`` in the caller's fenced transaction; returns its site
jobs to cancel, or None when the job had already finished (it is left as it is)."""


@dataclass(frozen=True)
class ScanReport:
    """What one scan did. ``events``: per event name of the engine's steps, the ids it
    concerned in the order they happened (every name the engine declares is present).
    ``skipped``: another engine holds the scan lease; ``lease_lost``: the lease was
    taken over mid-scan, which stopped (what it did before was committed, nothing
    after)."""

    skipped: bool = False
    lease_lost: bool = False
    events: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()

    def __getitem__(self, event: str) -> tuple[int, ...]:
        return self.events[event]


@dataclass
class ScanLog:
    """What a scan under way did so far; its steps add to it."""

    events: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    reasons: list[str] = field(default_factory=list)

    def add(self, event: str, job_id: int) -> None:
        self.events[event].append(job_id)

    def report(self, names: Sequence[str], *, lease_lost: bool = False) -> ScanReport:
        unknown = set(self.events) - set(names)
        if unknown:
            raise ValueError(f"scan events {sorted(unknown)} are not among {list(names)}")
        events = {name: tuple(self.events.get(name, ())) for name in names}
        return ScanReport(False, lease_lost, events, tuple(self.reasons))


def holder_id() -> str:
    """A lease holder id unique to this engine object: host, process and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class FencedScan:
    """One engine's scan mechanism (module docstring): the lease ``lease_name`` held as
    ``holder``, the report's event ``events``, and the handling-error guard over the
    engine's job table ``jobs`` (its ``id`` and ``handling_errors`` columns), failing a
    job with ``fail`` and cancelling its site jobs with ``cancel``.

    ``renew``: False only in tests that stand for a stalled scanner (its renewals
    stopped too)."""

    def __init__(
        self,
        store: Store,
        lease_name: str,
        holder: str,
        lease_s: float,
        clock: Callable[[], float],
        *,
        events: Sequence[str],
        jobs: Table,
        fail: FailJob,
        cancel: Callable[[SiteJobs], None],
        renew: bool = True,
    ) -> None:
        self.lease = Lease(store, lease_name, holder, lease_s, clock)
        self.events = tuple(dict.fromkeys((*events, FAILED)))
        self.jobs = jobs
        self.fail = fail
        self.cancel = cancel
        self.renew = renew
        self._grant: Grant | None = None

    @property
    def grant(self) -> Grant | None:
        """The grant of the scan under way (None outside a scan)."""
        return self._grant

    def run(self, now: float, steps: Callable[[Grant, ScanLog], None]) -> ScanReport:
        """Take the lease at ``now`` and run ``steps`` under it (each transition in
        :meth:`tx`); a skipped report while another holder has the lease."""
        grant = self.lease.take(now)
        if grant is None:
            return ScanReport(
                skipped=True,
                events={name: () for name in self.events},
                reasons=(f"lease {self.lease.name} held by another",),
            )
        work = ScanLog()
        self._grant = grant
        try:
            with self._kept(grant):
                steps(grant, work)
        except LeaseLost as lost:
            work.reasons.append(str(lost))
            return work.report(self.events, lease_lost=True)
        finally:
            self._grant = None
        return work.report(self.events)

    def release_lease(self) -> None:
        """Give up the scan lease now (another engine may scan at once)."""
        self.lease.release()

    @contextmanager
    def tx(self) -> Iterator[Connection]:
        """The transaction of one transition: during a scan it commits only while the
        scan still holds its lease (fenced: LeaseLost otherwise, and it rolls back);
        outside a scan (an engine's submit or cancel) a plain one."""
        with self.lease.transaction(self._grant) as conn:
            yield conn

    @contextmanager
    def handling(self, job_id: int, work: ScanLog) -> Iterator[None]:
        """Issue 7 item 4: an unexpected error while handling job ``job_id`` rolls back
        its transaction and is counted against it (fenced), which fails after
        MAX_HANDLING_ERRORS; the scan goes on with the other jobs. A lost lease is not
        the job's fault: it stops the scan."""
        try:
            yield
        except LeaseLost:
            raise
        except Exception as exc:
            log.error("%s %s: error while handling it", self.jobs.name, job_id, exc_info=exc)
            self._handling_error(job_id, error_message(exc), work)

    def _handling_error(self, job_id: int, message: str, work: ScanLog) -> None:
        table = self.jobs
        with self.tx() as conn:
            conn.execute(
                update(table)
                .where(table.c.id == job_id)
                .values(handling_errors=table.c.handling_errors + 1)
            )
            errors = conn.execute(
                select(table.c.handling_errors).where(table.c.id == job_id)
            ).scalar_one()
            final = f"failed after {errors} errors while handling it: {message}"
            cancels = self.fail(conn, job_id, final) if errors >= MAX_HANDLING_ERRORS else None
            if cancels is None:
                work.reasons.append(
                    f"job {job_id}: handling error {errors} of {MAX_HANDLING_ERRORS}: {message}"
                )
                return
        work.add(FAILED, job_id)
        work.reasons.append(f"job {job_id}: {final}")
        self.cancel(cancels)

    @contextmanager
    def _kept(self, grant: Grant) -> Iterator[None]:
        if not self.renew:
            yield
            return
        with self.lease.kept(grant):
            yield


def error_message(exc: BaseException) -> str:
    """One line naming the error: a database error by its driver's message (the SQL and
    parameters SQLAlchemy appends go to the log, not into the job's message)."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    text = f"{type(cause).__name__}: {lines[0] if lines else type(cause).__name__}"
    return text[:ERROR_TEXT_CHARS]
