"""Site health: restoring sites that were set unusable.

KOALA sets a site unusable when its components fail ``unusable_after_errors`` times in
a row (seed 000 Sec. 3.4); selection does when observing it fails repeatedly. A site
KOALA set aside is probed with a tiny real job (one processor, ``true``); a completed
probe restores it. An operator can also restore a site explicitly
(``gridcore sites --restore NAME``), which clears both kinds of unusability.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select, update

from gridcore.engine.runtime import GridRuntime
from gridcore.errors import GridError
from gridcore.model import JobState, JobSubmission
from gridcore.state.schema import coalloc_site_health, sites
from gridcore.state.store import Store

PROBE_COMMAND = "true"


@dataclass(frozen=True)
class KoalaHealth:
    site: str
    usable: bool
    consecutive_errors: int
    probe_job_id: str | None


def probe_unusable_sites(
    runtime: GridRuntime, now: float, retry_after_s: float, command: str = PROBE_COMMAND
) -> list[str]:
    """One probing step for every site KOALA set unusable; returns readable reasons.

    A site without a probe gets one (at most every ``retry_after_s``); a completed probe
    restores the site; a failed one leaves it unusable until the next probe.
    """
    h = coalloc_site_health.c
    with runtime.store.begin() as conn:
        rows = conn.execute(select(coalloc_site_health).where(h.usable.is_(False))).mappings()
        unusable = [dict(r) for r in rows]
    reasons: list[str] = []
    for row in unusable:
        if row["site"] not in runtime.grid.site_names:
            continue
        if row["probe_job_id"] is None:
            reasons += _start_probe(runtime, row, now, retry_after_s, command)
        else:
            reasons += _check_probe(runtime, row)
    return reasons


def _start_probe(
    runtime: GridRuntime, row: dict[str, object], now: float, retry_after_s: float, command: str
) -> list[str]:
    site = str(row["site"])
    last = row["probe_started_at"]
    if isinstance(last, float) and now - last < retry_after_s:
        return []
    try:
        job_id = runtime.adapter(site).submit(JobSubmission("gridcore-probe", command, 1))
    except GridError as exc:
        _set_probe(runtime.store, site, None, now)
        return [f"site {site}: probe could not be submitted: {exc}"]
    _set_probe(runtime.store, site, job_id, now)
    return [f"site {site}: unusable, probe job {job_id} submitted"]


def _check_probe(runtime: GridRuntime, row: dict[str, object]) -> list[str]:
    site, job_id = str(row["site"]), str(row["probe_job_id"])
    started = row["probe_started_at"] if isinstance(row["probe_started_at"], float) else None
    try:
        status = runtime.adapter(site).status(job_id)
    except GridError as exc:
        _set_probe(runtime.store, site, None, started)
        return [f"site {site}: probe job {job_id} lost: {exc}"]
    if not status.state.finished:
        return []
    if status.state is JobState.COMPLETED:
        restore_site(runtime.store, site)
        return [f"site {site}: probe job {job_id} completed, usable again"]
    _set_probe(runtime.store, site, None, started)
    return [f"site {site}: probe job {job_id} {status.state.value}, still unusable"]


def _set_probe(store: Store, site: str, job_id: str | None, started: float | None) -> None:
    with store.begin() as conn:
        conn.execute(
            update(coalloc_site_health)
            .where(coalloc_site_health.c.site == site)
            .values(probe_job_id=job_id, probe_started_at=started)
        )


def restore_site(store: Store, site: str) -> None:
    """Make ``site`` usable again for selection and for KOALA, resetting its errors."""
    with store.begin() as conn:
        conn.execute(
            update(sites)
            .where(sites.c.name == site)
            .values(usable=True, consecutive_errors=0, last_error=None)
        )
        conn.execute(
            update(coalloc_site_health)
            .where(coalloc_site_health.c.site == site)
            .values(usable=True, consecutive_errors=0, probe_job_id=None, probe_started_at=None)
        )


def koala_health(store: Store) -> dict[str, KoalaHealth]:
    """KOALA's view of each site it has seen components on."""
    h = coalloc_site_health.c
    with store.begin() as conn:
        rows = conn.execute(select(h.site, h.usable, h.consecutive_errors, h.probe_job_id)).all()
    return {
        r.site: KoalaHealth(r.site, bool(r.usable), r.consecutive_errors, r.probe_job_id)
        for r in rows
    }
