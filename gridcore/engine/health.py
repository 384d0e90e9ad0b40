"""Site health: ONE table (``gc_sites``), ONE threshold, one counter, one way back.

* The counter: ``gc_sites.consecutive_errors`` counts, per site, every failed contact
  (an observation, a status or a submission that raised) AND every failed job of ours
  there (a selection's job or a co-allocation component that failed, a failed probe). A
  *completed* job, component or probe resets it to 0. A successful observation does NOT
  reset it: a site that answers its monitoring but fails every job would otherwise never
  be set aside, and KOALA's "consecutive component errors" (KOALA 2005 Sec. 3.4) would be
  wiped by every report in between.
* The threshold: at :data:`UNUSABLE_AFTER_ERRORS` consecutive errors the site becomes
  unusable for selection and for KOALA alike (it is missing from their snapshots). The
  live KOALA engine uses this constant too (``CoAllocationParams.unusable_after_errors`` is the
  simulator's); a reset of the counter does not make an unusable site usable again
  (Sec. 5.1: the cluster "was removed for selection").
* The way back: an unusable site is probed with a tiny real job (one processor), at
  most one at a time and at most every so often; a completed probe restores it, a failed
  or lost one leaves it unusable until the next. The probing itself (site I/O) is the
  runtime's (:meth:`gridcore.engine.runtime.GridRuntime.probe_unusable_sites`, run in
  every refresh, so for ensemble-only users and inside every scan alike); this module
  only records what it did (:func:`start_probe`, :func:`probe_submitted`,
  :func:`probe_not_submitted`, :func:`probe_ended`). A probe is a holder of the capacity
  ledger (kind ``probe``, one processor) from its submission until the site reports it
  or it ends. An operator can also restore a site: ``gridcore sites --restore NAME``.
* Looking is not using: ``gridcore sites`` observes every site without counting a
  failed observation or sending a probe (``GridRuntime.refresh(count_health=False)``),
  so running it never sets a site aside under the DAGs that use it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, and_, case, select, update

from gridcore.model import SiteHealth
from gridcore.policies.claiming import CoAllocationParams
from gridcore.state import capacity
from gridcore.state.capacity import HolderKind
from gridcore.state.schema import holds, sites
from gridcore.state.store import Store

UNUSABLE_AFTER_ERRORS = 3
"""Consecutive errors (contacts, jobs, components, probes) that make a site unusable."""


@dataclass(frozen=True)
class HealthRecord:
    """A site's health as stored."""

    site: str
    usable: bool
    consecutive_errors: int
    last_error: str | None
    probe_job_id: str | None
    probe_started_at: float | None
    last_error_at: float | None = None

    def set_aside_because(self) -> str:
        """Why an unusable site is set aside (:func:`set_aside_because`)."""
        return set_aside_because(self.consecutive_errors, self.last_error, self.last_error_at)


def set_aside_because(
    consecutive_errors: int, last_error: str | None, last_error_at: float | None
) -> str:
    """Why a site is unusable, in the words every decision and view gives ("site b:
    marked unusable " + this): "after 3 consecutive errors, the last at 2026-01-01
    10:32:05 UTC: connection refused". The count it was set aside at is the threshold;
    errors since (failed probes) are said too."""
    since = f" ({consecutive_errors} so far)" if consecutive_errors > UNUSABLE_AFTER_ERRORS else ""
    when = "" if last_error_at is None else f" at {utc(last_error_at)}"
    last = f", the last{when}: {last_error}" if last_error else ""
    return f"after {UNUSABLE_AFTER_ERRORS} consecutive errors{since}{last}"


def utc(t: float) -> str:
    """An epoch time as health messages give it (UTC: workers may be anywhere)."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


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
            s.last_error_at,
        )
    ).all()
    return {r.name: HealthRecord(r[0], bool(r[1]), *r[2:]) for r in rows}


def live_params(params: CoAllocationParams) -> CoAllocationParams:
    """KOALA's parameters with THE threshold: the live engine decides with these."""
    return replace(params, unusable_after_errors=UNUSABLE_AFTER_ERRORS)


def record_failure(conn: Connection, site: str, message: str, now: float | None = None) -> bool:
    """Count one error (a failed contact, job, component or probe) at ``now`` (default:
    the wall clock) in one UPDATE; returns True when the site is unusable now."""
    conn.execute(
        update(sites)
        .where(sites.c.name == site)
        .values(
            consecutive_errors=sites.c.consecutive_errors + 1,
            last_error=message,
            last_error_at=time.time() if now is None else now,
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
            last_error_at=None,
            probe_job_id=None,
            probe_started_at=None,
        )
    )
    _release_probe(conn, site)


# -- probes (the runtime probes; these record) -------------------------------------------


def start_probe(conn: Connection, site: str, holder: str, now: float) -> None:
    """A probe of ``site`` is about to be submitted as ``holder`` (``<site>:<token>``,
    the name :mod:`gridcore.engine.submission` judges its job by): one left by a worker
    that died while submitting it lets go; one processor is claimed if free, else
    queued behind our other work there (the probe is ours and must not look like
    someone else's queue, or take a grant)."""
    _release_probe(conn, site)
    capacity.claim(conn, HolderKind.PROBE, holder, site, 1, queue_if_full=True, now=now)
    _set_probe(conn, site, None, now)


def probe_submitted(conn: Connection, site: str, holder: str, job_id: str, now: float) -> None:
    capacity.set_site_job(conn, HolderKind.PROBE, holder, job_id)
    _set_probe(conn, site, job_id, now)


def probe_not_submitted(conn: Connection, site: str, holder: str, now: float, message: str) -> None:
    capacity.release(conn, HolderKind.PROBE, holder, now)
    record_failure(conn, site, message)


def probe_ended(
    conn: Connection, site: str, completed: bool, started: float | None, message: str
) -> None:
    """A completed probe restores ``site``; a failed or lost one counts an error and the
    site waits for the next probe."""
    if completed:
        _restore(conn, site)
        return
    _end_probe(conn, site, started)
    record_failure(conn, site, message)


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
    "UNUSABLE_AFTER_ERRORS",
    "HealthRecord",
    "live_params",
    "probe_ended",
    "probe_not_submitted",
    "probe_submitted",
    "read_health",
    "record_failure",
    "record_success",
    "restore_site",
    "set_aside_because",
    "site_health",
    "start_probe",
    "utc",
)
