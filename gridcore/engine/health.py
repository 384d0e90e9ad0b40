"""Site health: ONE table (``gc_sites``), ONE threshold, one counter, one way back.

* The counter: ``gc_sites.consecutive_errors`` counts, per site, every failed contact
  (an observation, a status or a submission that raised) AND every failed job of ours
  there (a selection's job or a co-allocation component that failed, a failed probe). A
  *completed* job, component or probe resets it to 0. A successful observation does NOT
  reset it: a site that answers its monitoring but fails every job would otherwise never
  be set aside, and KOALA's "consecutive component errors" (seed 000 Sec. 3.4) would be
  wiped by every report in between.
* The threshold: at :data:`UNUSABLE_AFTER_ERRORS` consecutive errors the site becomes
  unusable for selection and for KOALA alike (it is missing from their snapshots). The
  live KOALA engine uses this constant too (``CoAllocationParams.unusable_after_errors`` is the
  simulator's); a reset of the counter does not make an unusable site usable again
  (Sec. 5.1: the cluster "was removed for selection").
* The way back: an unusable site is probed with a tiny real job (one processor,
  :data:`PROBE_COMMAND`), at most one at a time and at most every ``retry_after_s``
  (:data:`PROBE_RETRY_S` by default); a completed probe restores it, a failed or lost
  one leaves it unusable until the next. Probing runs in every
  :meth:`gridcore.engine.runtime.GridRuntime.refresh`, so it happens for ensemble-only
  users and inside every KOALA scan alike. A probe is a holder of the capacity ledger
  (kind ``probe``, one processor) from its submission until the site reports it or it
  ends. An operator can also restore a site: ``gridcore sites --restore NAME``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, and_, case, select, update

from gridcore.engine import capacity
from gridcore.engine.capacity import HolderKind
from gridcore.engine.submission import submit_once
from gridcore.errors import GridError
from gridcore.model import JobResources, JobState, JobSubmission
from gridcore.policies.claiming import CoAllocationParams, SiteHealth
from gridcore.sites.keys import probe_key
from gridcore.state.schema import holds, sites
from gridcore.state.store import Store

if TYPE_CHECKING:
    from gridcore.engine.runtime import GridRuntime

UNUSABLE_AFTER_ERRORS = 3
"""Consecutive errors (contacts, jobs, components, probes) that make a site unusable."""
PROBE_COMMAND = "true"
PROBE_TIME_LIMIT_S = 300
"""A probe asks for 5 minutes (its site's other defaults, account or QOS, still apply):
a short job the cluster can backfill, not the site's default limit for real work."""
PROBE_RETRY_S = 60.0
"""An unusable site gets a new probe at most this often (after a failed or lost one)."""


@dataclass(frozen=True)
class HealthRecord:
    """A site's health as stored."""

    site: str
    usable: bool
    consecutive_errors: int
    last_error: str | None
    probe_job_id: str | None
    probe_started_at: float | None


def site_health(conn: Connection, site: str) -> SiteHealth:
    """The site's health as KOALA's policies take it."""
    row = conn.execute(
        select(sites.c.consecutive_errors, sites.c.usable).where(sites.c.name == site)
    ).one_or_none()
    if row is None:
        return SiteHealth(site)
    return SiteHealth(site, row.consecutive_errors, bool(row.usable))


def read_health(conn: Connection) -> dict[str, HealthRecord]:
    s = sites.c
    rows = conn.execute(
        select(
            s.name,
            s.usable,
            s.consecutive_errors,
            s.last_error,
            s.probe_job_id,
            s.probe_started_at,
        )
    ).all()
    return {r.name: HealthRecord(r[0], bool(r[1]), *r[2:]) for r in rows}


def live_params(params: CoAllocationParams) -> CoAllocationParams:
    """KOALA's parameters with THE threshold: the live engine decides with these."""
    return replace(params, unusable_after_errors=UNUSABLE_AFTER_ERRORS)


def record_failure(conn: Connection, site: str, message: str) -> bool:
    """Count one error (a failed contact, job, component or probe) in one UPDATE;
    returns True when the site is unusable now."""
    conn.execute(
        update(sites)
        .where(sites.c.name == site)
        .values(
            consecutive_errors=sites.c.consecutive_errors + 1,
            last_error=message,
            usable=case(
                (sites.c.consecutive_errors + 1 >= UNUSABLE_AFTER_ERRORS, False),
                else_=sites.c.usable,
            ),
        )
    )
    usable = conn.execute(select(sites.c.usable).where(sites.c.name == site)).scalar()
    return not usable


def record_success(conn: Connection, site: str) -> None:
    """A job, component or probe completed there: its errors are no longer consecutive.
    An unusable site stays so (a probe or an operator restores it)."""
    conn.execute(update(sites).where(sites.c.name == site).values(consecutive_errors=0))


def restore_site(store: Store, site: str) -> None:
    """Make ``site`` usable again, resetting its errors and ending its probe's hold."""
    with store.begin() as conn:
        _restore(conn, site)


def _restore(conn: Connection, site: str) -> None:
    conn.execute(
        update(sites)
        .where(sites.c.name == site)
        .values(
            usable=True,
            consecutive_errors=0,
            last_error=None,
            probe_job_id=None,
            probe_started_at=None,
        )
    )
    _release_probe(conn, site)


# -- probing --------------------------------------------------------------------------------


def probe_unusable_sites(
    runtime: GridRuntime,
    now: float,
    retry_after_s: float = PROBE_RETRY_S,
    command: str = PROBE_COMMAND,
) -> list[str]:
    """One probing step for every unusable grid site; returns readable reasons.

    A site without a probe gets one (at most every ``retry_after_s``); a completed probe
    restores the site; a failed or lost one leaves it unusable until the next probe.
    """
    with runtime.store.begin() as conn:
        unusable = [h for h in read_health(conn).values() if not h.usable]
    reasons: list[str] = []
    for health in unusable:
        if health.site not in runtime.grid.site_names:
            continue
        if health.probe_job_id is None:
            reasons += _start_probe(runtime, health, now, retry_after_s, command)
        else:
            reasons += _check_probe(runtime, health)
    return reasons


def _start_probe(
    runtime: GridRuntime, health: HealthRecord, now: float, retry_after_s: float, command: str
) -> list[str]:
    site = health.site
    last = health.probe_started_at
    if last is not None and now - last < retry_after_s:
        return []
    token = uuid.uuid4().hex[:16]
    holder = f"{site}:{token}"  # gridcore.engine.submission judges its job by this name
    with runtime.store.begin() as conn:
        _release_probe(conn, site)  # one left by a worker that died while submitting it
        # One processor, claimed if free, else queued behind our other work there: the
        # probe is ours and must not look like someone else's queue (or take a grant).
        capacity.claim(conn, HolderKind.PROBE, holder, site, 1, queue_if_full=True, now=now)
        _set_probe(conn, site, None, now)
    try:
        probe = JobSubmission(
            "gridcore-probe",
            command,
            1,
            key=probe_key(runtime.install_id, site, token),
            resources=JobResources(time_limit_s=PROBE_TIME_LIMIT_S),
        )
        job_id, _ = submit_once(runtime.adapter(site), probe)
    except GridError as exc:
        with runtime.store.begin() as conn:
            capacity.release(conn, HolderKind.PROBE, holder, now)
            record_failure(conn, site, f"probe could not be submitted: {exc}")
        return [f"site {site}: probe could not be submitted: {exc}"]
    with runtime.store.begin() as conn:
        capacity.set_site_job(conn, HolderKind.PROBE, holder, job_id)
        _set_probe(conn, site, job_id, now)
    return [f"site {site}: unusable, probe job {job_id} submitted"]


def _check_probe(runtime: GridRuntime, health: HealthRecord) -> list[str]:
    site, job_id = health.site, str(health.probe_job_id)
    try:
        status = runtime.adapter(site).status(job_id)
    except GridError as exc:
        with runtime.store.begin() as conn:
            _end_probe(conn, site, health.probe_started_at)
            record_failure(conn, site, f"probe job {job_id} lost: {exc}")
        return [f"site {site}: probe job {job_id} lost: {exc}"]
    if not status.state.finished:
        return []
    with runtime.store.begin() as conn:
        if status.state is JobState.COMPLETED:
            _restore(conn, site)
            return [f"site {site}: probe job {job_id} completed, usable again"]
        _end_probe(conn, site, health.probe_started_at)
        record_failure(conn, site, f"probe job {job_id} {status.state.value}")
    return [f"site {site}: probe job {job_id} {status.state.value}, still unusable"]


def _end_probe(conn: Connection, site: str, started: float | None) -> None:
    _set_probe(conn, site, None, started)
    _release_probe(conn, site)


def _set_probe(conn: Connection, site: str, job_id: str | None, started: float | None) -> None:
    conn.execute(
        update(sites)
        .where(sites.c.name == site)
        .values(probe_job_id=job_id, probe_started_at=started)
    )


def _release_probe(conn: Connection, site: str) -> None:
    hc = holds.c
    live: Any = conn.execute(
        select(hc.holder).where(
            and_(hc.kind == HolderKind.PROBE.value, hc.site == site, hc.ledger.is_not(None))
        )
    ).scalars()
    capacity.release_where(conn, HolderKind.PROBE, live)


__all__: Sequence[str] = (
    "PROBE_COMMAND",
    "PROBE_RETRY_S",
    "UNUSABLE_AFTER_ERRORS",
    "HealthRecord",
    "live_params",
    "probe_unusable_sites",
    "read_health",
    "record_failure",
    "record_success",
    "restore_site",
    "site_health",
)
