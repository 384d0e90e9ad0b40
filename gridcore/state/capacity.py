"""THE capacity ledger: processors and storage bytes per site, every holder a row.

It lives with the state it counts, below staging and the engines that both claim from
it (a staged volume is a holder as a selection is), so neither imports the other.

A holder is anything that keeps capacity of a site for a while: a selection (an ensemble
member between its decision and the moment the site's report shows it), a co-allocation
component (from its placement until its site job is seen running or it ends), a probe job,
a staged volume (a replica's bytes while it is registered), and later a pilot. Each is one
row of ``gc_holds`` (``kind`` + ``holder`` unique), and ``gc_sites`` keeps the per-site
counters ``claimed``/``queued`` (processors) and ``storage_claimed`` (bytes).

Every claim and every release is ONE conditional UPDATE of the site's counters plus the
hold row, in the caller's transaction:

* a *claim* matches the site row only while ``processors <= free`` (:data:`FREE`, the one
  free-processor formula) and the bytes fit under ``storage_total`` (NULL = unlimited),
  so two claimers never get the same processors or bytes, whatever the isolation level;
* a *queued* hold (a decision to wait at the site: its processors are other work's
  future, not free ones) adds to ``queued`` unconditionally;
* a *release* first clears the hold's ``ledger`` conditionally (only the transaction that
  changes it from claimed/queued to NULL subtracts), so a hold is released exactly once.

Invariant (:func:`check_invariant`): per site, ``claimed``/``queued``/``storage_claimed``
equal the sums of the live holds, per kind of holder as well as in all; no counter is
negative; storage never exceeds its limit.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)

from gridcore.errors import StateError
from gridcore.model import GridSpec, HolderKind, SiteSpec
from gridcore.state import site_definitions
from gridcore.state.schema import holds, sites


class Ledger(enum.StrEnum):
    """Where a live hold's processors are counted; NULL in the row = released."""

    CLAIMED = "claimed"
    QUEUED = "queued"


FREE: ColumnElement[int] = (
    sites.c.reported_idle - sites.c.external_pending - sites.c.claimed - sites.c.queued
)
"""The processors a new claim may take at a site: what monitoring last reported idle,
minus other users' queued work, minus our own holds not yet visible in that report. The
ONLY place this formula is written."""

_STORAGE_FITS = or_(
    sites.c.storage_total.is_(None),
    sites.c.storage_claimed + bindparam("b_bytes") <= sites.c.storage_total,
)
# Bind names carry a "b_" prefix: a parameter named like a column (``name``) would
# otherwise be taken by SQLAlchemy as an extra SET clause of the UPDATE.
CLAIM = (
    update(sites)
    .where(
        and_(
            sites.c.name == bindparam("b_site"),
            # a claim of bytes only (a volume) needs no processors: it must fit even
            # while the site's processors are over-claimed or queued for (FREE < 0)
            # (0 rendered inline: the statement is also run through the driver with
            # exactly the b_ parameters, gridcore.engine.selection)
            or_(
                bindparam("b_processors") == literal_column("0"), bindparam("b_processors") <= FREE
            ),
            _STORAGE_FITS,
        )
    )
    .values(
        claimed=sites.c.claimed + bindparam("b_processors"),
        storage_claimed=sites.c.storage_claimed + bindparam("b_bytes"),
    )
)
"""The conditional claim: matches the site row only if the processors and bytes fit."""

ADD = {
    ledger: update(sites)
    .where(sites.c.name == bindparam("b_site"))
    .values(
        {
            ledger.value: sites.c[ledger.value] + bindparam("b_processors"),
            "storage_claimed": sites.c.storage_claimed + bindparam("b_bytes"),
        }
    )
    for ledger in Ledger
}
"""Unconditional moves of the counters (queued holds, releases, naive selections)."""

INSERT_HOLD = insert(holds)


@dataclass(frozen=True)
class Hold:
    """One live or released hold as stored."""

    id: int
    site: str
    kind: HolderKind
    holder: str
    processors: int
    storage_bytes: int
    ledger: Ledger | None
    site_job_id: str | None
    created_at: float
    released_at: float | None


@dataclass(frozen=True)
class Usage:
    """A site's capacity and what holds it, for views (``gridcore sites``)."""

    site: str
    total_processors: int
    free_processors: int
    claimed: int
    queued: int
    storage_total: int | None
    storage_claimed: int
    by_kind: dict[str, tuple[int, int, int]]  # kind -> (holds, processors, bytes)


def component_holder(job_id: int, epoch: int, index: int) -> str:
    return f"{job_id}:{epoch}:{index}"


def volume_holder(logical_name: str, site: str) -> str:
    return f"{logical_name}@{site}"


# -- claims -------------------------------------------------------------------------------


def claim(
    conn: Connection,
    kind: HolderKind,
    holder: str,
    site: str,
    processors: int,
    storage_bytes: int = 0,
    *,
    queue_if_full: bool = False,
    site_job_id: str | None = None,
    now: float | None = None,
) -> Ledger | None:
    """Claim ``processors`` and ``storage_bytes`` at ``site`` for ``holder`` by the
    conditional UPDATE. When they do not fit: None (nothing written), or, with
    ``queue_if_full``, a queued hold (processors counted as queued; bytes must fit still).

    A holder with a live hold already is an error (a claim is never doubled); a holder
    whose hold was released may claim again (the row is reused)."""
    params = {"b_site": site, "b_processors": processors, "b_bytes": storage_bytes}
    if conn.execute(CLAIM, params).rowcount == 1:
        ledger = Ledger.CLAIMED
    elif queue_if_full and storage_bytes == 0:
        conn.execute(ADD[Ledger.QUEUED], params)
        ledger = Ledger.QUEUED
    else:
        return None
    _write_hold(conn, kind, holder, site, processors, storage_bytes, ledger, site_job_id, now)
    return ledger


def add(
    conn: Connection,
    kind: HolderKind,
    holder: str,
    site: str,
    processors: int,
    ledger: Ledger,
    *,
    now: float | None = None,
) -> None:
    """Record a hold WITHOUT the room check (naive/random selection and queued decisions,
    which by definition do not honour the free processors)."""
    params = {"b_site": site, "b_processors": processors, "b_bytes": 0}
    conn.execute(ADD[ledger], params)
    _write_hold(conn, kind, holder, site, processors, 0, ledger, None, now)


def hold_params(
    kind: HolderKind,
    holder: str,
    site: str,
    processors: int,
    ledger: Ledger,
    *,
    storage_bytes: int = 0,
    site_job_id: str | None = None,
    now: float | None = None,
) -> dict[str, object]:
    """The values of a new hold row (for callers batching it into their own statement)."""
    return {
        "site": site,
        "kind": kind.value,
        "holder": holder,
        "processors": processors,
        "storage_bytes": storage_bytes,
        "ledger": ledger.value,
        "site_job_id": site_job_id,
        "created_at": time.time() if now is None else now,
        "released_at": None,
    }


def _write_hold(
    conn: Connection,
    kind: HolderKind,
    holder: str,
    site: str,
    processors: int,
    storage_bytes: int,
    ledger: Ledger,
    site_job_id: str | None,
    now: float | None,
) -> None:
    values = hold_params(
        kind,
        holder,
        site,
        processors,
        ledger,
        storage_bytes=storage_bytes,
        site_job_id=site_job_id,
        now=now,
    )
    hc = holds.c
    existing = conn.execute(
        select(hc.ledger).where(and_(hc.kind == kind.value, hc.holder == holder))
    ).one_or_none()
    if existing is None:
        conn.execute(INSERT_HOLD, values)
        return
    if existing.ledger is not None:
        raise StateError(f"{kind.value} {holder!r} already holds capacity: not claimed twice")
    conn.execute(
        update(holds)
        .where(and_(hc.kind == kind.value, hc.holder == holder, hc.ledger.is_(None)))
        .values(values)
    )


# -- releases -----------------------------------------------------------------------------


def release(conn: Connection, kind: HolderKind, holder: str, now: float | None = None) -> bool:
    """Return a holder's processors and bytes, exactly once; False if it held nothing."""
    hc = holds.c
    row = conn.execute(
        select(hc.site, hc.ledger, hc.processors, hc.storage_bytes).where(
            and_(hc.kind == kind.value, hc.holder == holder)
        )
    ).one_or_none()
    if row is None or row.ledger is None:
        return False
    # The site row before the hold row, as a claim takes them (CLAIM, then the hold):
    # a release taking them the other way round deadlocks with a concurrent release or
    # claim at the same site on PostgreSQL (SQLite transactions are exclusive anyway).
    if conn.dialect.name != "sqlite":
        conn.execute(select(sites.c.name).where(sites.c.name == row.site).with_for_update())
    done = conn.execute(
        update(holds)
        .where(and_(hc.kind == kind.value, hc.holder == holder, hc.ledger == row.ledger))
        .values(ledger=None, released_at=time.time() if now is None else now)
    )
    if done.rowcount != 1:
        return False  # another transaction released it first
    params = {"b_site": row.site, "b_processors": -row.processors, "b_bytes": -row.storage_bytes}
    conn.execute(ADD[Ledger(row.ledger)], params)
    return True


def release_where(
    conn: Connection, kind: HolderKind, holders: Iterable[str], now: float | None = None
) -> int:
    """Release each of ``holders`` (those still live), their sites in name order (the
    order every multi-site writer locks ``gc_sites`` in); returns how many were released."""
    wanted = list(holders)
    hc = holds.c
    site_of = dict(
        conn.execute(
            select(hc.holder, hc.site).where(and_(hc.kind == kind.value, hc.holder.in_(wanted)))
        ).all()
    )
    ordered = sorted(wanted, key=lambda h: (site_of.get(h, ""), h))
    return sum(release(conn, kind, h, now) for h in ordered)


def release_prefix(
    conn: Connection, kind: HolderKind, prefix: str, now: float | None = None
) -> int:
    """Release every live hold of ``kind`` whose holder starts with ``prefix`` (all the
    components of a co-allocation job: ``f"{job}:"``); returns how many."""
    hc = holds.c
    live = conn.execute(
        select(hc.holder).where(
            and_(
                hc.kind == kind.value,
                hc.ledger.is_not(None),
                hc.holder.startswith(prefix, autoescape=True),
            )
        )
    ).scalars()
    return release_where(conn, kind, live, now)


def release_visible(conn: Connection, site: str, visible_job_ids: Iterable[str]) -> int:
    """Release every live hold at ``site`` whose site job an observation shows running
    or finished: the report counts those processors now, holding them would count them
    twice. Returns how many were released."""
    visible = list(visible_job_ids)
    if not visible:
        return 0
    hc = holds.c
    rows = conn.execute(
        select(hc.kind, hc.holder)
        .where(and_(hc.site == site, hc.ledger.is_not(None), hc.site_job_id.in_(visible)))
        .order_by(hc.id)
    ).all()
    return sum(release(conn, HolderKind(r.kind), r.holder) for r in rows)


def set_site_job(conn: Connection, kind: HolderKind, holder: str, site_job_id: str) -> None:
    """Name the site job whose appearance in an observation releases the hold."""
    conn.execute(
        update(holds)
        .where(and_(holds.c.kind == kind.value, holds.c.holder == holder))
        .values(site_job_id=site_job_id)
    )


def own_job_ids(conn: Connection, site: str) -> list[str]:
    """The site jobs of live holds at ``site`` (all kinds): an observation must not count
    them as other users' pending work, since their holds count them already."""
    hc = holds.c
    return [
        str(j)
        for j in conn.execute(
            select(hc.site_job_id).where(
                and_(hc.site == site, hc.ledger.is_not(None), hc.site_job_id.is_not(None))
            )
        ).scalars()
    ]


# -- views ----------------------------------------------------------------------------------


def live_holds(conn: Connection, kind: HolderKind | None = None) -> list[Hold]:
    hc = holds.c
    query = select(holds).where(hc.ledger.is_not(None)).order_by(hc.id)
    if kind is not None:
        query = query.where(hc.kind == kind.value)
    return [_hold(r) for r in conn.execute(query).mappings()]


def hold(conn: Connection, kind: HolderKind, holder: str) -> Hold | None:
    hc = holds.c
    row = (
        conn.execute(select(holds).where(and_(hc.kind == kind.value, hc.holder == holder)))
        .mappings()
        .one_or_none()
    )
    return None if row is None else _hold(row)


def held_by_prefix(conn: Connection, kind: HolderKind, prefix: str) -> dict[str, int]:
    """Processors held per site by live holds of ``kind`` whose holder starts with
    ``prefix`` (a co-allocation job's own components: ``f"{job}:{epoch}:"``)."""
    hc = holds.c
    rows = conn.execute(
        select(hc.site, func.sum(hc.processors))
        .where(
            and_(
                hc.kind == kind.value,
                hc.ledger.is_not(None),
                hc.holder.startswith(prefix, autoescape=True),
            )
        )
        .group_by(hc.site)
    ).all()
    return {site: int(n) for site, n in rows}


def free_processors(conn: Connection) -> dict[str, int]:
    """:data:`FREE` per site, as stored now."""
    return {name: int(n) for name, n in conn.execute(select(sites.c.name, FREE)).all()}


def usage(conn: Connection) -> dict[str, Usage]:
    """Per site: capacity, counters and the live holds by kind."""
    hc = holds.c
    by_kind: dict[str, dict[str, tuple[int, int, int]]] = {}
    for site, kind, n, procs, nbytes in conn.execute(
        select(hc.site, hc.kind, func.count(), func.sum(hc.processors), func.sum(hc.storage_bytes))
        .where(hc.ledger.is_not(None))
        .group_by(hc.site, hc.kind)
    ):
        by_kind.setdefault(site, {})[kind] = (int(n), int(procs or 0), int(nbytes or 0))
    s = sites.c
    return {
        r.name: Usage(
            r.name,
            r.total_processors,
            int(r.free),
            r.claimed,
            r.queued,
            r.storage_total,
            r.storage_claimed,
            by_kind.get(r.name, {}),
        )
        for r in conn.execute(
            select(
                s.name,
                s.total_processors,
                FREE.label("free"),
                s.claimed,
                s.queued,
                s.storage_total,
                s.storage_claimed,
            )
        )
    }


def totals(conn: Connection) -> dict[str, tuple[int, int, int, int]]:
    """Per site: (claimed counter, sum of claimed holds, queued counter, sum of queued
    holds); each pair must be equal."""
    sums = _sums(conn)
    return {
        r.name: (
            r.claimed,
            sums.get((r.name, Ledger.CLAIMED.value), (0, 0))[0],
            r.queued,
            sums.get((r.name, Ledger.QUEUED.value), (0, 0))[0],
        )
        for r in conn.execute(select(sites.c.name, sites.c.claimed, sites.c.queued))
    }


def check_invariant(conn: Connection) -> list[str]:
    """Every way the ledger is wrong, as readable lines; empty when sound.

    Per site: ``claimed``, ``queued`` and ``storage_claimed`` equal the sums of the live
    holds; no counter is negative; no hold is negative; claimed storage is within the
    site's limit. (Claimed processors may exceed what a LATER report shows idle: the
    report changes under the claims; the claim itself is checked when it is made.)"""
    problems: list[str] = []
    for r in conn.execute(_INVARIANT_ROWS).mappings():
        name, claimed, queued, held_bytes = r["name"], r["h_claimed"], r["h_queued"], r["h_bytes"]
        checks = (
            (r["claimed"] == claimed, f"claimed counter {r['claimed']} != holds {claimed}"),
            (r["queued"] == queued, f"queued counter {r['queued']} != holds {queued}"),
            (
                r["storage_claimed"] == held_bytes,
                f"storage counter {r['storage_claimed']} != holds {held_bytes} bytes",
            ),
            (min(r["claimed"], r["queued"], r["storage_claimed"]) >= 0, "a negative counter"),
            (
                r["storage_total"] is None or r["storage_claimed"] <= r["storage_total"],
                f"storage {r['storage_claimed']} bytes claimed > limit {r['storage_total']}",
            ),
            (
                r["claimed"] <= r["total_processors"],
                f"claimed {r['claimed']} > {r['total_processors']} processors in all",
            ),
        )
        problems += [f"site {name}: {why}" for ok, why in checks if not ok]
    problems += _orphan_holds(conn, {r for r in conn.execute(select(sites.c.name)).scalars()})
    return problems


def _live_sums() -> Any:
    hc = holds.c

    def total(column: Any, ledger: Ledger | None = None) -> Any:
        value = column if ledger is None else case((hc.ledger == ledger.value, column), else_=0)
        return func.coalesce(func.sum(value), 0)

    return (
        select(
            hc.site,
            total(hc.processors, Ledger.CLAIMED).label("h_claimed"),
            total(hc.processors, Ledger.QUEUED).label("h_queued"),
            total(hc.storage_bytes).label("h_bytes"),
        )
        .where(hc.ledger.is_not(None))
        .group_by(hc.site)
        .subquery("live")
    )


_LIVE = _live_sums()
# ONE statement, so the counters and the sums come from one snapshot even under READ
# COMMITTED (a check taken while others claim sees no drift that is not there).
_INVARIANT_ROWS = select(
    sites.c.name,
    sites.c.total_processors,
    sites.c.claimed,
    sites.c.queued,
    sites.c.storage_total,
    sites.c.storage_claimed,
    func.coalesce(_LIVE.c.h_claimed, 0).label("h_claimed"),
    func.coalesce(_LIVE.c.h_queued, 0).label("h_queued"),
    func.coalesce(_LIVE.c.h_bytes, 0).label("h_bytes"),
).select_from(sites.outerjoin(_LIVE, _LIVE.c.site == sites.c.name))


def _orphan_holds(conn: Connection, known: set[str]) -> list[str]:
    hc = holds.c
    rows = conn.execute(
        select(hc.site, hc.kind, hc.holder, hc.processors, hc.storage_bytes).where(
            hc.ledger.is_not(None)
        )
    ).all()
    problems = []
    for r in rows:
        if r.site not in known:
            problems.append(f"{r.kind} {r.holder}: holds capacity at unknown site {r.site}")
        if r.processors < 0 or r.storage_bytes < 0:
            problems.append(f"{r.kind} {r.holder}: negative hold")
    return problems


def _sums(conn: Connection) -> dict[tuple[str, str], tuple[int, int]]:
    """(site, ledger) -> (processors, bytes) of the live holds."""
    hc = holds.c
    sums: dict[tuple[str, str], tuple[int, int]] = {}
    for site, ledger, procs, nbytes in conn.execute(
        select(hc.site, hc.ledger, func.sum(hc.processors), func.sum(hc.storage_bytes))
        .where(hc.ledger.is_not(None))
        .group_by(hc.site, hc.ledger)
    ):
        sums[(site, ledger)] = (int(procs or 0), int(nbytes or 0))
    return sums


def _hold(row: Any) -> Hold:
    return Hold(
        row["id"],
        row["site"],
        HolderKind(row["kind"]),
        row["holder"],
        row["processors"],
        row["storage_bytes"],
        Ledger(row["ledger"]) if row["ledger"] is not None else None,
        row["site_job_id"],
        row["created_at"],
        row["released_at"],
    )


# -- the ledger's site rows ----------------------------------------------------------------


def register_sites(conn: Connection, grid: GridSpec, now: float | None = None) -> None:
    """Record that ``grid`` opens the database (:mod:`gridcore.state.site_definitions`:
    a grid file that defines one of its sites otherwise than another file in use is
    refused with ConfigError, before anything is written), insert a ledger row for each
    of its sites not yet known (idempotent), and set each one's storage limit to the
    smallest of the files in use. A new row reports every processor idle until the
    first observation replaces it."""
    now = time.time() if now is None else now
    site_definitions.record(conn, grid, now)
    known = dict(conn.execute(select(sites.c.name, sites.c.storage_total)).all())
    rows = [_site_row(spec) for spec in grid.sites if spec.name not in known]
    if rows:
        # Workers starting together all see the site missing: the insert must skip a row
        # another one added meanwhile (on SQLite, BEGIN IMMEDIATE already serializes them).
        conn.execute(_insert_ignoring_duplicates(conn), rows)
        known.update({row["name"]: row["storage_total"] for row in rows})
    for name, limit in site_definitions.storage_limits(conn, grid.site_names, now).items():
        if known[name] != limit:
            # the grid files in use are the authority on the storage limit (claims
            # already held stay; a lower limit only refuses new ones)
            conn.execute(update(sites).where(sites.c.name == name).values(storage_total=limit))


def _insert_ignoring_duplicates(conn: Connection) -> Any:
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(sites).on_conflict_do_nothing(index_elements=[sites.c.name])
    if conn.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(sites).on_conflict_do_nothing(index_elements=[sites.c.name])
    return insert(sites)


def _site_row(spec: SiteSpec) -> dict[str, object]:
    return {
        "name": spec.name,
        "kind": spec.kind.value,
        "total_processors": spec.processors,
        "reported_idle": spec.processors,
        "external_pending": 0,
        "pending_jobs": 0,
        "observed_at": 0.0,
        "claimed": 0,
        "queued": 0,
        "storage_total": spec.storage_bytes,
        "storage_claimed": 0,
        "usable": True,
        "consecutive_errors": 0,
        "finished_jobs": 0,
    }


__all__: Sequence[str] = (
    "ADD",
    "CLAIM",
    "FREE",
    "Hold",
    "HolderKind",
    "Ledger",
    "Usage",
    "add",
    "check_invariant",
    "claim",
    "component_holder",
    "free_processors",
    "held_by_prefix",
    "hold",
    "hold_params",
    "live_holds",
    "own_job_ids",
    "register_sites",
    "release",
    "release_prefix",
    "release_visible",
    "release_where",
    "set_site_job",
    "totals",
    "usage",
    "volume_holder",
)
