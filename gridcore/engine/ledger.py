"""The selection ledger: snapshot -> policy -> one transaction that records the decision.

Every function here takes an open connection and does only database work; the callers
(:mod:`gridcore.engine.runtime`) do site I/O outside transactions. The policy is called
inside the transaction on a snapshot read in that same transaction, and a stateful FIT
claim is applied by a conditional UPDATE, so selectors in many processes never grant the
same processors twice: if another selector claimed them first, the UPDATE matches no
row and the decision is retaken on a fresh snapshot.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, bindparam, case, func, insert, select, update

from gridcore.errors import RequestError, StateError
from gridcore.model import (
    GridSpec,
    JobRequest,
    JobState,
    Outcome,
    SiteObservation,
    SiteSelection,
    SiteSnapshot,
    SiteSpec,
)
from gridcore.policies.selection import InsufficientMode, SelectionProtocol, select_site
from gridcore.state.schema import selections, sites
from gridcore.state.store import Store

# Weight of the newest finished job in the observed queue-wait/runtime averages.
EWMA_WEIGHT = 0.3
MAX_CLAIM_ATTEMPTS = 50
UNUSABLE_AFTER_ERRORS = 3


@dataclass(frozen=True)
class Recorded:
    """A selection as committed."""

    id: int
    decision: SiteSelection
    selected_at: float
    attempts: int


def register_sites(conn: Connection, grid: GridSpec) -> None:
    """Insert a ledger row for each grid site not yet known (idempotent). A new row
    reports every processor idle until the first observation replaces it."""
    known = set(conn.execute(select(sites.c.name)).scalars())
    rows = [_site_row(spec) for spec in grid.sites if spec.name not in known]
    if rows:
        # Workers starting together all see the site missing: the insert must skip a row
        # another one added meanwhile (on SQLite, BEGIN IMMEDIATE already serializes them).
        conn.execute(_insert_ignoring_duplicates(conn), rows)


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
        "usable": True,
        "consecutive_errors": 0,
        "finished_jobs": 0,
    }


_SNAPSHOT_COLUMNS = select(
    sites.c.name,
    sites.c.total_processors,
    sites.c.reported_idle,
    sites.c.claimed,
    sites.c.queued,
    sites.c.external_pending,
    sites.c.pending_jobs,
    sites.c.usable,
    sites.c.mean_queue_wait_s,
    sites.c.mean_runtime_s,
)
_FREE = sites.c.reported_idle - sites.c.external_pending - sites.c.claimed - sites.c.queued
# Bind names carry a "b_" prefix: a parameter named like a column (``name``) would
# otherwise be taken by SQLAlchemy as an extra SET clause of the UPDATE.
_CLAIM = (
    update(sites)
    .where(and_(sites.c.name == bindparam("b_site"), bindparam("b_processors") <= _FREE))
    .values(claimed=sites.c.claimed + bindparam("b_processors"))
)
_ADD = {
    column: update(sites)
    .where(sites.c.name == bindparam("b_site"))
    .values({column: sites.c[column] + bindparam("b_processors")})
    for column in ("claimed", "queued")
}
_INSERT_SELECTION = insert(selections)
_SELECTION_FIELDS = (
    "stream",
    "name",
    "site",
    "processors",
    "protocol",
    "mode",
    "outcome",
    "ledger",
    "reasons",
    "state",
    "selected_at",
)


def _pg_insert_from(cte_update: Any) -> Any:
    """INSERT the selection row only if the ledger UPDATE in the CTE matched its row."""
    changed = cte_update.returning(sites.c.name).cte("changed")
    values: Any = select(*(bindparam(f"b_{f}") for f in _SELECTION_FIELDS)).select_from(changed)
    return (
        insert(selections).from_select(list(_SELECTION_FIELDS), values).returning(selections.c.id)
    )


_PG_CLAIM_INSERT = _pg_insert_from(_CLAIM)
_PG_ADD_INSERT = {column: _pg_insert_from(stmt) for column, stmt in _ADD.items()}


def read_snapshots(conn: Connection, grid: GridSpec) -> list[SiteSnapshot]:
    """One snapshot of every grid site, read in the caller's transaction.

    The hot path of every decision: the rows come straight from the driver cursor
    (SQLAlchemy's result processing cost as much as the policy itself), and a row equal
    to one seen before reuses its snapshot, since a decision changes one site's row.
    """
    slowness = grid.slowness_by_site
    cache = grid.snapshot_cache
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(_driver_sql(conn, _SNAPSHOT_COLUMNS))
        rows = cursor.fetchall()
    finally:
        cursor.close()
    snaps = []
    for row in rows:
        snap = cache.get(row)
        if snap is None:
            name, total, idle, claimed, queued, pending_p, pending_n, usable, wait, runtime = row
            if name not in slowness:
                continue
            snap = SiteSnapshot(
                name, total, idle, slowness[name], claimed + queued, pending_p, pending_n,
                bool(usable), wait, runtime,
            )  # fmt: skip
            if len(cache) > _SNAPSHOT_CACHE_MAX:
                cache.clear()
            cache[row] = snap
        snaps.append(snap)
    return snaps


_SNAPSHOT_CACHE_MAX = 20_000
_compiled_sql: dict[tuple[str, int], str] = {}


def _driver_sql(conn: Connection, statement: Any) -> str:
    """The statement compiled once per dialect, for the driver cursor. Its placeholders
    are our own bind names (pyformat on psycopg, and no parameters for the snapshot)."""
    key = (conn.dialect.name, id(statement))
    if key not in _compiled_sql:
        _compiled_sql[key] = str(statement.compile(dialect=conn.dialect))
    return _compiled_sql[key]


def _driver_fetchone(conn: Connection, statement: Any, params: dict[str, Any]) -> Any:
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(_driver_sql(conn, statement), params)
        return cursor.fetchone()
    finally:
        cursor.close()


def select_and_record(
    store: Store,
    grid: GridSpec,
    request: JobRequest,
    protocol: SelectionProtocol,
    mode: InsufficientMode,
    stream: str,
    now: float,
    rng: random.Random,
) -> Recorded:
    """Decide on a fresh snapshot and commit the decision, retrying on a lost claim.

    On PostgreSQL the claim and the selection row are ONE statement (a data-modifying
    CTE) in autocommit: the site row is locked only for that statement, and the snapshot
    needs no transaction because the conditional UPDATE re-checks the room it relies on.
    SQLite serializes writers anyway, so there it is one BEGIN IMMEDIATE transaction.
    """
    for attempt in range(1, MAX_CLAIM_ATTEMPTS + 1):
        with store.begin_decision() as conn:
            decision = select_site(
                request, read_snapshots(conn, grid), grid.bandwidth, protocol, mode, rng=rng
            )
            if decision.site is None:
                raise RequestError(
                    f"request {request.name!r}: no site can run {request.processors} processors: "
                    + "; ".join(decision.reasons)
                )
            row_id = _claim_and_insert(store, conn, request, decision, protocol, stream, now)
            if row_id is None:
                continue  # another selector took those processors: look again
            return Recorded(row_id, decision, now, attempt)
    raise StateError(
        f"request {request.name!r}: lost the claim race {MAX_CLAIM_ATTEMPTS} times in a row"
    )


def _claim_and_insert(
    store: Store,
    conn: Connection,
    request: JobRequest,
    decision: SiteSelection,
    protocol: SelectionProtocol,
    stream: str,
    now: float,
) -> int | None:
    ledger = "claimed" if decision.outcome is Outcome.FIT else "queued"
    conditional = ledger == "claimed" and protocol is SelectionProtocol.STATEFUL
    params = _selection_params(request, decision, ledger, stream, now)
    if not store.is_sqlite:
        statement = _PG_CLAIM_INSERT if conditional else _PG_ADD_INSERT[ledger]
        bound = {f"b_{key}": value for key, value in params.items()}
        row = _driver_fetchone(conn, statement, bound)
        return None if row is None else int(row[0])
    if conditional:
        claim = {"b_site": decision.site, "b_processors": request.processors}
        if conn.execute(_CLAIM, claim).rowcount != 1:
            return None
    else:
        # naive/random do not honour in-flight work by definition; still record it so
        # stateful selectors sharing the database see it.
        _add(conn, str(decision.site), ledger, request.processors)
    return _insert_selection(conn, params)


def record_pinned(
    conn: Connection, request: JobRequest, site: str, stream: str, now: float
) -> Recorded:
    """Record a job sent to a named site (no policy): it still counts as in flight."""
    row = conn.execute(select(sites).where(sites.c.name == site)).mappings().one_or_none()
    if row is None:
        raise RequestError(f"request {request.name!r}: unknown site {site!r}")
    if row["total_processors"] < request.processors:
        raise RequestError(
            f"request {request.name!r}: site {site} has {row['total_processors']} processors"
            f" in all < {request.processors} needed"
        )
    # The same conditional UPDATE as a policy decision: a concurrent selector cannot
    # take the room between reading it and claiming it.
    claim = {"b_site": site, "b_processors": request.processors}
    fits = conn.execute(_CLAIM, claim).rowcount == 1
    if not fits:
        _add(conn, site, "queued", request.processors)
    free = row["reported_idle"] - row["external_pending"] - row["claimed"] - row["queued"]
    reason = f"site {site}: pinned by the request ({free} effective idle when read)"
    decision = SiteSelection(
        site, Outcome.FIT if fits else Outcome.QUEUE, "pinned", "none", (reason,)
    )
    ledger = "claimed" if fits else "queued"
    params = _selection_params(request, decision, ledger, stream, now)
    return Recorded(_insert_selection(conn, params), decision, now, 1)


def _add(conn: Connection, site: str, ledger: str, processors: int) -> None:
    conn.execute(_ADD[ledger], {"b_site": site, "b_processors": processors})


def _selection_params(
    request: JobRequest, decision: SiteSelection, ledger: str, stream: str, now: float
) -> dict[str, object]:
    return {
        "stream": stream,
        "name": request.name,
        "site": decision.site,
        "processors": request.processors,
        "protocol": decision.protocol,
        "mode": decision.mode,
        "outcome": "fit" if decision.outcome is Outcome.FIT else "queue",
        "ledger": ledger,
        "reasons": json.dumps(list(decision.reasons)),
        "state": JobState.SELECTED.value,
        "selected_at": now,
    }


def _insert_selection(conn: Connection, params: dict[str, object]) -> int:
    key = conn.execute(_INSERT_SELECTION, params).inserted_primary_key
    if key is None:
        raise StateError("the database returned no id for the new selection")
    return int(key[0])


def release(conn: Connection, selection_id: int) -> bool:
    """Return a selection's processors to the ledger, exactly once."""
    row = conn.execute(
        select(selections.c.site, selections.c.ledger, selections.c.processors).where(
            selections.c.id == selection_id
        )
    ).one_or_none()
    if row is None or row.ledger is None:
        return False
    done = conn.execute(
        update(selections)
        .where(and_(selections.c.id == selection_id, selections.c.ledger == row.ledger))
        .values(ledger=None)
    )
    if done.rowcount != 1:
        return False
    _add(conn, row.site, row.ledger, -row.processors)
    return True


def expire_unsubmitted(conn: Connection, older_than: float, now: float) -> list[int]:
    """Fail selections never submitted since ``older_than`` (their worker died between
    select and submit) and return their processors; returns the expired ids."""
    stale = list(
        conn.execute(
            select(selections.c.id).where(
                and_(
                    selections.c.state == JobState.SELECTED.value,
                    selections.c.job_id.is_(None),
                    selections.c.selected_at < older_than,
                )
            )
        ).scalars()
    )
    for sid in stale:
        conn.execute(
            update(selections)
            .where(and_(selections.c.id == sid, selections.c.state == JobState.SELECTED.value))
            .values(
                state=JobState.FAILED.value,
                finished_at=now,
                message="abandoned: selected but never submitted (the worker died?)",
            )
        )
        release(conn, sid)
    return stale


def store_observation(conn: Connection, obs: SiteObservation, own_job_ids: Iterable[str]) -> int:
    """Store a site report unless a newer one is stored already, and release our
    selections the report now shows running or finished (they are visible: keeping
    them in flight would count them twice). Returns how many were released."""
    own = set(own_job_ids)
    external = [j for j in obs.pending() if j.job_id not in own]
    stored = conn.execute(
        update(sites)
        .where(and_(sites.c.name == obs.site, sites.c.observed_at < obs.observed_at))
        .values(
            total_processors=obs.total_processors,
            reported_idle=obs.idle_processors,
            external_pending=sum(j.processors for j in external),
            pending_jobs=len(obs.pending()),
            observed_at=obs.observed_at,
            usable=True,
            consecutive_errors=0,
            last_error=None,
        )
    )
    if stored.rowcount != 1:
        return 0  # a newer observation won; releasing against this one could double count
    visible = {j.job_id for j in obs.jobs if j.state is not JobState.PENDING}
    rows = conn.execute(
        select(selections.c.id).where(
            and_(
                selections.c.site == obs.site,
                selections.c.ledger.is_not(None),
                selections.c.job_id.in_(visible),
            )
        )
    ).scalars()
    return sum(release(conn, sid) for sid in list(rows))


def record_site_error(conn: Connection, site: str, message: str) -> bool:
    """Count a failed contact; returns True when the site is now unusable."""
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
    usable = conn.execute(select(sites.c.usable).where(sites.c.name == site)).scalar_one()
    return not usable


def record_finished_stats(
    conn: Connection, site: str, queue_wait_s: float, runtime_s: float
) -> None:
    """Fold a finished job's observed queue wait and runtime into the site averages."""
    w = EWMA_WEIGHT

    def ewma(col: object, value: float) -> object:
        return case((sites.c.finished_jobs == 0, value), else_=(1 - w) * col + w * value)  # type: ignore[operator]

    conn.execute(
        update(sites)
        .where(sites.c.name == site)
        .values(
            mean_queue_wait_s=ewma(
                func.coalesce(sites.c.mean_queue_wait_s, queue_wait_s), queue_wait_s
            ),
            mean_runtime_s=ewma(func.coalesce(sites.c.mean_runtime_s, runtime_s), runtime_s),
            finished_jobs=sites.c.finished_jobs + 1,
        )
    )


def ledger_totals(conn: Connection) -> dict[str, tuple[int, int, int, int]]:
    """Per site: (claimed counter, sum of claimed rows, queued counter, sum of queued rows);
    the two pairs must be equal (used by tests and benchmarks)."""
    sums: dict[tuple[str, str], int] = {}
    for site, ledger, total in conn.execute(
        select(selections.c.site, selections.c.ledger, func.sum(selections.c.processors))
        .where(selections.c.ledger.is_not(None))
        .group_by(selections.c.site, selections.c.ledger)
    ):
        sums[(site, ledger)] = int(total)
    return {
        row.name: (
            row.claimed,
            sums.get((row.name, "claimed"), 0),
            row.queued,
            sums.get((row.name, "queued"), 0),
        )
        for row in conn.execute(select(sites.c.name, sites.c.claimed, sites.c.queued))
    }


__all__: Sequence[str] = (
    "Recorded",
    "ledger_totals",
    "read_snapshots",
    "record_finished_stats",
    "record_pinned",
    "record_site_error",
    "register_sites",
    "release",
    "select_and_record",
    "store_observation",
)
