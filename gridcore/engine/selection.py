"""The selection engine: snapshot -> policy -> one transaction that records the decision.

Every function here takes an open connection and does only database work; the callers
(:mod:`gridcore.engine.runtime`) do site I/O outside transactions. The policy is called
inside the transaction on a snapshot read in that same transaction, and a stateful FIT
claim is applied by a conditional UPDATE, so selectors in many processes never grant the
same processors twice: if another selector claimed them first, the UPDATE matches no
row and the decision is retaken on a fresh snapshot.

A burst (:func:`select_and_record_batch`) is decided the same way, on ONE snapshot and
committed in ONE transaction: its counters move once per site and ledger, so a lost
conditional claim rolls the whole burst back and it is retaken.
"""

from __future__ import annotations

import functools
import json
import random
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import (
    Connection,
    String,
    and_,
    bindparam,
    case,
    cast,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError

from gridcore.engine import health, wait_models
from gridcore.errors import NoUsableSite, RequestError, StateError
from gridcore.model import (
    GridSpec,
    JobRequest,
    JobState,
    Outcome,
    SiteObservation,
    SiteSelection,
    SiteSnapshot,
)
from gridcore.policies.selection import (
    InsufficientMode,
    SelectionProtocol,
    select_site,
    select_sites,
)
from gridcore.policies.wait_prediction import DEFAULT_WAIT_MODEL, WaitForecast
from gridcore.state import capacity
from gridcore.state.capacity import HolderKind, Ledger
from gridcore.state.schema import holds, selections, sites
from gridcore.state.store import DEADLOCK_DETECTED, LOCK_NOT_AVAILABLE, Store

# Weight of the newest finished job in the observed queue-wait/runtime averages.
EWMA_WEIGHT = 0.3
MAX_CLAIM_ATTEMPTS = 50
# How long a burst waits for site rows another transaction holds before it gives way and
# is retaken (below PostgreSQL's 1 s deadlock_timeout: the burst is the one to yield).
BURST_LOCK_WAIT_S = 0.5
BURST_TURN = "gridcore.selection.burst"  # bursts decide one at a time (Store.take_turn)


@dataclass(frozen=True)
class Recorded:
    """A selection as committed."""

    id: int
    decision: SiteSelection
    selected_at: float
    attempts: int


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
    sites.c.consecutive_errors,
    sites.c.last_error,
    sites.c.last_error_at,
    sites.c.observed_at,
)
_INSERT_SELECTION = insert(selections)
_SELECTION_FIELDS = (
    "stream",
    "name",
    "site",
    "processors",
    "protocol",
    "mode",
    "outcome",
    "reasons",
    "state",
    "selected_at",
)


def _pg_claim_insert(cte_update: Any) -> Any:
    """ONE statement for PostgreSQL: the counters' UPDATE, then the selection row only if
    it matched, then the selection's hold (holder = the new id). Returns the id."""
    changed = cte_update.returning(sites.c.name).cte("changed")
    values: Any = select(*(bindparam(f"b_{f}") for f in _SELECTION_FIELDS)).select_from(changed)
    selection = (
        insert(selections)
        .from_select(list(_SELECTION_FIELDS), values)
        .returning(selections.c.id)
        .cte("selection")
    )
    hold: Any = select(
        bindparam("b_site"),
        literal_column(f"'{HolderKind.SELECTION.value}'"),
        cast(selection.c.id, String),
        bindparam("b_processors"),
        literal_column("0"),
        bindparam("b_ledger"),
        bindparam("b_selected_at"),
    ).select_from(selection)
    columns = ["site", "kind", "holder", "processors", "storage_bytes", "ledger", "created_at"]
    return insert(holds).from_select(columns, hold).returning(holds.c.holder)


_PG_CLAIM_INSERT = _pg_claim_insert(capacity.CLAIM)
_PG_ADD_INSERT = {ledger: _pg_claim_insert(capacity.ADD[ledger]) for ledger in Ledger}


def pg_decision_sql() -> str:
    """The one statement a counted FIT decision commits on PostgreSQL (conditional claim,
    selection row, hold), as the driver gets it: ``%(b_<field>)s`` placeholders for the
    fields of :func:`_selection_params` and ``b_ledger``, ``b_bytes``. The benchmark
    drives it through pgbench to measure the database's own limit."""
    from sqlalchemy.dialects.postgresql import psycopg

    dialect: Any = psycopg.dialect  # untyped in SQLAlchemy
    return str(_PG_CLAIM_INSERT.compile(dialect=dialect()))


class SnapshotReader:
    """Reads one snapshot of every grid site per decision, for one grid; owned by the
    engine (:class:`gridcore.engine.runtime.GridRuntime`) or the caller of
    :func:`select_and_record`, never by the frozen grid.

    The hot path of every decision: the rows come straight from the driver cursor
    (SQLAlchemy's result processing cost as much as the policy itself), and a row equal
    to one seen before reuses its snapshot, since a decision changes one site's row.
    """

    CACHE_MAX = 20_000

    def __init__(self, grid: GridSpec, wait_model: str | None = DEFAULT_WAIT_MODEL) -> None:
        self.grid = grid
        self._slowness = grid.slowness_by_site
        self._cache: dict[tuple[Any, ...], SiteSnapshot] = {}
        self._thread = threading.local()
        # each site's wait model, fed from its stored observations (None: Eq. W only)
        self.waits = None if wait_model is None else wait_models.WaitBook(wait_model)

    def decision_waits(
        self,
        conn: Connection,
        observed: dict[str, float],
        now: float,
        protocol: SelectionProtocol = SelectionProtocol.EARLIEST_COMPLETION,
    ) -> wait_models.DecisionWaits | None:
        """The wait models' forecasts for one decision or burst by ``protocol``, their
        sites reloaded where a newer observation is stored (in ``conn``'s transaction)."""
        if self.waits is None:
            return None
        self.waits.refresh(conn, observed)
        return wait_models.DecisionWaits(self.waits, now, protocol.counts_in_flight)

    def read(self, conn: Connection) -> list[SiteSnapshot]:
        """One snapshot of every grid site, read in the caller's transaction."""
        snaps, self._thread.observed = self._read(conn)
        return snaps

    def read_observed(self, conn: Connection) -> tuple[list[SiteSnapshot], dict[str, float]]:
        """:meth:`read`, and when each site's stored observation was made (what the
        wait models are keyed by, :class:`gridcore.engine.wait_models.WaitBook`), as
        that read saw it (per thread: a reader may serve several)."""
        snaps = self.read(conn)
        return snaps, getattr(self._thread, "observed", {})

    def _read(self, conn: Connection) -> tuple[list[SiteSnapshot], dict[str, float]]:
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(_driver_sql(conn, _SNAPSHOT_COLUMNS))
            rows = cursor.fetchall()
        finally:
            cursor.close()
        cache, slowness = self._cache, self._slowness
        snaps = []
        observed = {}
        for row in rows:
            if row[0] in slowness:
                observed[row[0]] = row[13]
            snap = cache.get(row)
            if snap is None:
                name, total, idle, claimed, queued, pending_p, pending_n, usable, wait, runtime = (
                    row[:10]
                )
                if name not in slowness:
                    continue
                # an unusable site's decision says why (its errors: the rest of the row)
                why = "" if usable else health.set_aside_because(*row[10:13])
                snap = SiteSnapshot(
                    name, total, idle, slowness[name], claimed + queued, pending_p, pending_n,
                    bool(usable), wait, runtime, why,
                )  # fmt: skip
                if len(cache) > self.CACHE_MAX:
                    cache.clear()
                cache[row] = snap
            snaps.append(snap)
        return snaps, observed


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


P = ParamSpec("P")
R = TypeVar("R")


def _stores_forecasts(
    decide: Callable[Concatenate[Store, SnapshotReader, P], R],
) -> Callable[Concatenate[Store, SnapshotReader, P], R]:
    """After the decision, however it ends, store the forecasts its wait models made of
    the sites' pending jobs (:func:`gridcore.engine.wait_models.store_forecasts`: the
    live bound's residuals), in transactions of their own."""

    def deciding(store: Store, snapshots: SnapshotReader, /, *args: P.args, **kw: P.kwargs) -> R:
        try:
            return decide(store, snapshots, *args, **kw)
        finally:
            if snapshots.waits is not None:
                wait_models.store_forecasts(store, snapshots.waits)

    functools.update_wrapper(deciding, decide)
    return deciding


@_stores_forecasts
def select_and_record(
    store: Store,
    snapshots: SnapshotReader,
    request: JobRequest,
    protocol: SelectionProtocol,
    mode: InsufficientMode,
    stream: str,
    now: float,
    rng: random.Random,
) -> Recorded:
    """Decide on a fresh snapshot and commit the decision, retrying on a lost claim.

    On PostgreSQL the claim, the selection row and its hold are ONE statement (chained
    data-modifying CTEs) in autocommit: the site row is locked only for that statement,
    and the snapshot needs no transaction because the conditional UPDATE re-checks the
    room it relies on. SQLite serializes writers anyway, so there it is one BEGIN
    IMMEDIATE transaction.
    """
    for attempt in range(1, MAX_CLAIM_ATTEMPTS + 1):
        try:
            with store.begin_decision() as conn:
                decision, _ = _decide(conn, snapshots, request, protocol, mode, now, rng)
                row_id = _claim_and_insert(store, conn, request, decision, protocol, stream, now)
        except DBAPIError as exc:
            # PostgreSQL chose it as a deadlock's victim (a burst holding several sites
            # and a transaction locking them in another order, each waiting behind it):
            # its one statement wrote nothing
            if not _gave_way(exc):
                raise
            continue
        if row_id is None:
            continue  # another selector took those processors: look again
        return Recorded(row_id, decision, now, attempt)
    raise StateError(
        f"request {request.name!r}: lost the claim race {MAX_CLAIM_ATTEMPTS} times in a row"
    )


@_stores_forecasts
def decide(
    store: Store,
    snapshots: SnapshotReader,
    request: JobRequest,
    protocol: SelectionProtocol,
    mode: InsufficientMode,
    now: float,
    rng: random.Random,
    pinned: str | None = None,
) -> tuple[SiteSelection, Mapping[str, WaitForecast]]:
    """The decision :func:`select_and_record` (or, for a ``pinned`` site,
    :func:`record_pinned`) would make now, and the wait model's forecast per site that
    has one, recording nothing (``gridcore submit --test-only``). For a pinned site the
    estimates are the policy's over ``snapshots`` (give a reader of that site alone)."""
    with store.begin() as conn:
        if pinned is None:
            return _decide(conn, snapshots, request, protocol, mode, now, rng)
        row = _pinned_site(conn, request, pinned)
        policy, forecasts = _decide(
            conn, snapshots, request, protocol, mode, now, rng, refuse=False
        )
        fits = row.free >= request.processors
        decision = _pinned_decision(pinned, fits, row.free)
        return replace(decision, estimates=policy.estimates), forecasts


def _decide(
    conn: Connection,
    snapshots: SnapshotReader,
    request: JobRequest,
    protocol: SelectionProtocol,
    mode: InsufficientMode,
    now: float,
    rng: random.Random,
    *,
    refuse: bool = True,
) -> tuple[SiteSelection, Mapping[str, WaitForecast]]:
    """One decision on the snapshot ``conn`` reads, with its wait note; refused when no
    site can run the request (unless not ``refuse``). Also the wait model's forecast per
    site."""
    read, observed = snapshots.read_observed(conn)
    waits = snapshots.decision_waits(conn, observed, now, protocol)
    forecasts = None if waits is None else waits.mapping(request, read)
    decision = select_site(
        request, read, snapshots.grid.bandwidth, protocol, mode, rng=rng, waits=forecasts
    )
    decision = _with_wait_note(decision, request, waits)
    if refuse:
        _refuse_unplaceable([request], [decision], read)
    return decision, forecasts or {}


def _claim_and_insert(
    store: Store,
    conn: Connection,
    request: JobRequest,
    decision: SiteSelection,
    protocol: SelectionProtocol,
    stream: str,
    now: float,
) -> int | None:
    params = _selection_params(request, decision, stream, now)
    if decision.outcome is Outcome.FIT:
        row_id = _record(store, conn, request, decision, params, Ledger.CLAIMED, conditional=True)
        if row_id is not None or protocol.counts_in_flight:
            return row_id
        # naive/random do not honour in-flight work by definition: a FIT by their view
        # that the ledger cannot grant will queue at the site, so it is held as queued
        # (the counters never claim more processors than a site has)
    return _record(store, conn, request, decision, params, Ledger.QUEUED, conditional=False)


def _record(
    store: Store,
    conn: Connection,
    request: JobRequest,
    decision: SiteSelection,
    params: dict[str, object],
    ledger: Ledger,
    *,
    conditional: bool,
) -> int | None:
    """Move the counter (by the conditional claim, or unconditionally), insert the
    selection row and its hold; ``None`` when the conditional claim did not fit."""
    if not store.is_sqlite:
        statement = _PG_CLAIM_INSERT if conditional else _PG_ADD_INSERT[ledger]
        bound = {f"b_{key}": value for key, value in params.items()}
        bound.update(b_ledger=ledger.value, b_bytes=0)
        row = _driver_fetchone(conn, statement, bound)
        return None if row is None else int(row[0])
    counters = {"b_site": decision.site, "b_processors": request.processors, "b_bytes": 0}
    if conditional:
        if conn.execute(capacity.CLAIM, counters).rowcount != 1:
            return None
    else:
        conn.execute(capacity.ADD[ledger], counters)
    return _insert_selection(conn, params, ledger)


class _BurstLost(Exception):
    """A burst's conditional claim matched no row: its transaction is rolled back and
    the burst retaken."""


@_stores_forecasts
def select_and_record_batch(
    store: Store,
    snapshots: SnapshotReader,
    requests: Sequence[JobRequest],
    protocol: SelectionProtocol,
    mode: InsufficientMode,
    stream: str,
    now: float,
    rng: random.Random,
) -> list[Recorded]:
    """Decide a burst on ONE snapshot and commit every decision in ONE transaction
    ("snapshot, then admit"); the decisions are those of
    :func:`gridcore.policies.selection.select_sites` on that snapshot.

    The counters move once per site and ledger, in bulk: per site ONE conditional claim
    (``capacity.CLAIM``) for the summed processors of its FIT members when the protocol
    counts in-flight work, and one unconditional ``capacity.ADD`` for its queued ones.
    The summed claim is exact: on one snapshot a member queues at a site only when the
    site's free processors no longer cover it, after which they stay negative, so every
    FIT member at a site comes before its first queued one and the sum must fit. If a
    claim matches no row (another selector took the room since the snapshot), nothing of
    the burst is kept and it is retaken on a fresh snapshot.

    A real transaction on both databases. On SQLite, BEGIN IMMEDIATE: one writer at a
    time. On PostgreSQL, bursts take turns (:data:`BURST_TURN`, an advisory lock held to
    the commit), as Kueue admits one scheduling cycle at a time: bursts decided side by
    side on one snapshot would all pick the same fastest sites and all but one be
    retaken (measured: 5.7 attempts a burst over 8 processes); single decisions do not
    wait for the turn, their conditional claims and the burst's settle any overlap. The
    chosen sites' rows are locked in name order before they change; a burst that waits
    longer than :data:`BURST_LOCK_WAIT_S` for a row another transaction holds gives way
    and is retaken. A member no site can run raises :class:`RequestError` naming it
    before anything is written.
    """
    if not requests:
        return []
    for attempt in range(1, MAX_CLAIM_ATTEMPTS + 1):
        try:
            with store.begin() as conn:
                store.take_turn(conn, BURST_TURN)
                read, observed = snapshots.read_observed(conn)
                waits = snapshots.decision_waits(conn, observed, now, protocol)
                decisions = select_sites(
                    requests, read, snapshots.grid.bandwidth, protocol, mode, rng=rng,
                    wait_for=waits,
                )  # fmt: skip
                decisions = [
                    _with_wait_note(d, r, waits) for r, d in zip(requests, decisions, strict=True)
                ]
                _refuse_unplaceable(requests, decisions, read)
                ids = _record_burst(store, conn, requests, decisions, protocol, stream, now)
        except _BurstLost:
            continue
        except DBAPIError as exc:
            if not _gave_way(exc):
                raise
            continue  # it gave way to a transaction holding its sites: retake it
        return [Recorded(i, d, now, attempt) for i, d in zip(ids, decisions, strict=True)]
    raise StateError(
        f"burst of {len(requests)} (first {requests[0].name!r}): lost the claim race"
        f" {MAX_CLAIM_ATTEMPTS} times in a row"
    )


def _with_wait_note(
    decision: SiteSelection, request: JobRequest, waits: wait_models.DecisionWaits | None
) -> SiteSelection:
    """The decision with a reason saying how its site's queue delay was estimated: the
    wait model's forecast (and Slurm's own estimate beside it) or Eq. W, and why."""
    if waits is None or decision.site is None:
        return decision
    chosen = decision.estimate_for(decision.site)
    if chosen is None:
        return decision
    note = waits.note(request, decision.site, chosen.in_flight, chosen.compute_s)
    if note is None:
        return decision
    return replace(decision, reasons=(*decision.reasons, note))


def _gave_way(exc: DBAPIError) -> bool:
    """Did PostgreSQL end the transaction to let another go on (it may be retried)?"""
    return getattr(exc.orig, "sqlstate", None) in (LOCK_NOT_AVAILABLE, DEADLOCK_DETECTED)


def _refuse_unplaceable(
    requests: Sequence[JobRequest],
    decisions: Sequence[SiteSelection],
    snapshots: Sequence[SiteSnapshot],
) -> None:
    """Raise for the first request no site was chosen for: :class:`NoUsableSite` when a
    site big enough for it is only set aside as unusable (it may be back once its probe
    completes: wait), else :class:`RequestError` (no site of the grid could run it)."""
    for request, decision in zip(requests, decisions, strict=True):
        if decision.site is None:
            why = (
                f"request {request.name!r}: no site can run {request.processors} processors: "
                + "; ".join(decision.reasons)
            )
            set_aside = any(
                not s.usable and s.total_processors >= request.processors for s in snapshots
            )
            raise NoUsableSite(why) if set_aside else RequestError(why)


def _record_burst(
    store: Store,
    conn: Connection,
    requests: Sequence[JobRequest],
    decisions: Sequence[SiteSelection],
    protocol: SelectionProtocol,
    stream: str,
    now: float,
) -> list[int]:
    """Move the counters per site and ledger, then insert every selection row and its
    hold in bulk; raises :class:`_BurstLost` when a conditional claim does not fit."""
    ledgers = _move_burst_counters(store, conn, requests, decisions, protocol)
    rows = [
        _selection_params(request, decision, stream, now)
        for request, decision in zip(requests, decisions, strict=True)
    ]
    if conn.dialect.name == "postgresql":
        returned = _insert_burst_pg(conn, rows, ledgers)
    else:
        returned = _insert_burst_sqlite(conn, rows, ledgers)
    if [name for _, name in returned] != [row["name"] for row in rows]:
        raise StateError("the new selections' ids came back out of order")
    return [int(sid) for sid, _ in returned]


def _move_burst_counters(
    store: Store,
    conn: Connection,
    requests: Sequence[JobRequest],
    decisions: Sequence[SiteSelection],
    protocol: SelectionProtocol,
) -> list[Ledger]:
    """The counters moved per site and ledger; the ledger each member is held in."""
    ledgers = [Ledger.CLAIMED if d.outcome is Outcome.FIT else Ledger.QUEUED for d in decisions]
    moves: dict[tuple[str, Ledger], int] = {}
    for request, decision, held in zip(requests, decisions, ledgers, strict=True):
        key = (str(decision.site), held)
        moves[key] = moves.get(key, 0) + request.processors
    claims: list[dict[str, object]] = []
    queued: list[dict[str, object]] = []
    for (site, held), processors in moves.items():
        counters = {"b_site": site, "b_processors": processors, "b_bytes": 0}
        (claims if held is Ledger.CLAIMED else queued).append(counters)
    # Every site row it will change, locked first in name order: two bursts never
    # deadlock, and a burst gives way to any other lock holder after BURST_LOCK_WAIT_S.
    store.lock_sites(conn, [site for site, _ in moves], BURST_LOCK_WAIT_S)
    if protocol.counts_in_flight:
        if claims and conn.execute(capacity.CLAIM, claims).rowcount != len(claims):
            raise _BurstLost
    elif claims:
        # naive/random FITs the ledger cannot grant are held as queued, member by member
        # in burst order, exactly as one decision at a time (_claim_and_insert)
        for index, (request, decision) in enumerate(zip(requests, decisions, strict=True)):
            if ledgers[index] is Ledger.CLAIMED:
                counters = {"b_site": decision.site, "b_processors": request.processors}
                if conn.execute(capacity.CLAIM, counters | {"b_bytes": 0}).rowcount != 1:
                    queued.append(counters | {"b_bytes": 0})
                    ledgers[index] = Ledger.QUEUED
    if queued:
        conn.execute(capacity.ADD[Ledger.QUEUED], queued)
    return ledgers


# A burst's selection rows and holds go to the driver in a few statements of fixed text:
# SQLAlchemy's multi-row INSERT (insertmanyvalues) spent more time rendering 100 rows and
# psycopg more parsing the result than the database took to write them. The holds name
# their selections' ids, which come back in the rows' order: numbered in the order
# inserted (SQLite's INSERTs under its exclusive write lock, PostgreSQL's one INSERT ...
# SELECT ... ORDER BY, as SQLAlchemy's own sorted RETURNING assumes); the names returned
# beside them check it.
_HOLD_FIELDS = ("site", "kind", "holder", "processors", "storage_bytes", "ledger", "created_at")
_PG_TYPES = {"processors": "int", "reasons": "text", "selected_at": "float8"}
_PG_ARRAYS = ", ".join(f"%({f})b::{_PG_TYPES.get(f, 'varchar')}[]" for f in _SELECTION_FIELDS)
_PG_INSERT_BURST = f"""
WITH burst AS (
    SELECT * FROM unnest({_PG_ARRAYS}, %(ledger)b::varchar[])
        WITH ORDINALITY AS b({", ".join(_SELECTION_FIELDS)}, ledger, n)
), new AS (
    INSERT INTO {selections.name} ({", ".join(_SELECTION_FIELDS)})
    SELECT {", ".join(_SELECTION_FIELDS)} FROM burst ORDER BY n
    RETURNING id, name
), numbered AS (
    SELECT id, name, row_number() OVER (ORDER BY id) AS n FROM new
), held AS (
    INSERT INTO {holds.name} ({", ".join(_HOLD_FIELDS)})
    SELECT b.site, %(kind)s, CAST(numbered.id AS varchar), b.processors, 0, b.ledger,
           b.selected_at
    FROM numbered JOIN burst b USING (n)
)
SELECT id, name FROM numbered ORDER BY n
"""
_SQLITE_ROWS_PER_INSERT = 500  # 5,000 parameters, well under SQLite's limit of 32,766
_SQLITE_INSERT_HOLDS = (
    f"INSERT INTO {holds.name} ({', '.join(_HOLD_FIELDS)})"
    f" VALUES ({', '.join('?' for _ in _HOLD_FIELDS)})"
)


def _insert_burst_pg(
    conn: Connection, rows: list[dict[str, object]], ledgers: list[Ledger]
) -> list[tuple[int, str]]:
    """Every selection row and its hold in ONE statement; (id, name) in the rows' order."""
    params: dict[str, object] = {f: [row[f] for row in rows] for f in _SELECTION_FIELDS}
    params.update(ledger=[held.value for held in ledgers], kind=HolderKind.SELECTION.value)
    return [(int(i), str(n)) for i, n in conn.exec_driver_sql(_PG_INSERT_BURST, params)]


def _insert_burst_sqlite(
    conn: Connection, rows: list[dict[str, object]], ledgers: list[Ledger]
) -> list[tuple[int, str]]:
    """The selection rows by multi-row INSERTs, then their holds; (id, name) in order."""
    returned: list[tuple[int, str]] = []
    for start in range(0, len(rows), _SQLITE_ROWS_PER_INSERT):
        chunk = rows[start : start + _SQLITE_ROWS_PER_INSERT]
        values = tuple(row[f] for row in chunk for f in _SELECTION_FIELDS)
        result = conn.exec_driver_sql(_sqlite_insert_selections(len(chunk)), values)
        returned += [(int(i), str(n)) for i, n in result]
    returned.sort()
    kind = HolderKind.SELECTION.value
    conn.exec_driver_sql(
        _SQLITE_INSERT_HOLDS,
        [
            (row["site"], kind, str(sid), row["processors"], 0, held.value, row["selected_at"])
            for (sid, _), row, held in zip(returned, rows, ledgers, strict=True)
        ],
    )
    return returned


@functools.cache
def _sqlite_insert_selections(count: int) -> str:
    one = f"({', '.join('?' for _ in _SELECTION_FIELDS)})"
    return (
        f"INSERT INTO {selections.name} ({', '.join(_SELECTION_FIELDS)})"
        f" VALUES {', '.join(one for _ in range(count))} RETURNING id, name"
    )


def record_pinned(
    conn: Connection, request: JobRequest, site: str, stream: str, now: float
) -> Recorded:
    """Record a job sent to a named site (no policy): it still counts as in flight."""
    row = _pinned_site(conn, request, site)
    # The same conditional UPDATE as a policy decision: a concurrent selector cannot
    # take the room between reading it and claiming it.
    counters = {"b_site": site, "b_processors": request.processors, "b_bytes": 0}
    fits = conn.execute(capacity.CLAIM, counters).rowcount == 1
    if not fits:
        conn.execute(capacity.ADD[Ledger.QUEUED], counters)
    decision = _pinned_decision(site, fits, row.free)
    ledger = Ledger.CLAIMED if fits else Ledger.QUEUED
    params = _selection_params(request, decision, stream, now)
    return Recorded(_insert_selection(conn, params, ledger), decision, now, 1)


def _pinned_site(conn: Connection, request: JobRequest, site: str) -> Any:
    """The pinned site's size and free processors; refused when unknown or too small."""
    row = conn.execute(
        select(sites.c.total_processors, capacity.FREE.label("free")).where(sites.c.name == site)
    ).one_or_none()
    if row is None:
        raise RequestError(f"request {request.name!r}: unknown site {site!r}")
    if row.total_processors < request.processors:
        raise RequestError(
            f"request {request.name!r}: site {site} has {row.total_processors} processors"
            f" in all < {request.processors} needed"
        )
    return row


def _pinned_decision(site: str, fits: bool, free: int) -> SiteSelection:
    reason = f"site {site}: pinned by the request ({free} effective idle when read)"
    return SiteSelection(site, Outcome.FIT if fits else Outcome.QUEUE, "pinned", "none", (reason,))


def _selection_params(
    request: JobRequest, decision: SiteSelection, stream: str, now: float
) -> dict[str, object]:
    return {
        "stream": stream,
        "name": request.name,
        "site": decision.site,
        "processors": request.processors,
        "protocol": decision.protocol,
        "mode": decision.mode,
        "outcome": decision.outcome.label,
        "reasons": json.dumps(list(decision.reasons)),
        "state": JobState.SELECTED.value,
        "selected_at": now,
    }


def _insert_selection(conn: Connection, params: dict[str, object], ledger: Ledger) -> int:
    """The selection row and its hold (the counters were moved by the caller)."""
    key = conn.execute(_INSERT_SELECTION, params).inserted_primary_key
    if key is None:
        raise StateError("the database returned no id for the new selection")
    selection_id = int(key[0])
    hold = capacity.hold_params(
        HolderKind.SELECTION,
        str(selection_id),
        str(params["site"]),
        int(str(params["processors"])),
        ledger,
        now=float(str(params["selected_at"])),
    )
    conn.execute(capacity.INSERT_HOLD, hold)
    return selection_id


def release(conn: Connection, selection_id: int) -> bool:
    """Return a selection's processors to the ledger, exactly once."""
    return capacity.release(conn, HolderKind.SELECTION, str(selection_id))


def set_job_id(conn: Connection, selection_id: int, job_id: str, now: float) -> None:
    """The selection was submitted as ``job_id``: its hold ends when a report shows it."""
    conn.execute(
        update(selections)
        .where(selections.c.id == selection_id)
        .values(job_id=job_id, state=JobState.PENDING.value, submitted_at=now)
    )
    capacity.set_site_job(conn, HolderKind.SELECTION, str(selection_id), job_id)


def expire_unsubmitted(conn: Connection, older_than: float, now: float) -> list[int]:
    """Fail selections never submitted since ``older_than`` (their worker died between
    select and submit) and return their processors; returns the expired ids."""
    stale = list(
        conn.execute(
            select(selections.c.id)
            .where(
                and_(
                    selections.c.state == JobState.SELECTED.value,
                    selections.c.job_id.is_(None),
                    selections.c.selected_at < older_than,
                )
            )
            # site rows change in name order, the order bursts lock them in
            .order_by(selections.c.site, selections.c.id)
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


def store_observation(
    conn: Connection, obs: SiteObservation, own_job_ids: Iterable[str] | None = None
) -> int:
    """Store a site report unless a newer one is stored already, and release every hold
    (any kind) whose site job the report now shows running or finished (it is visible:
    keeping it in flight would count it twice). Our own pending jobs, by default the
    site jobs of the live holds, are not counted as others' queued work. Returns how
    many holds were released. Health is not touched: a site that answers can still
    fail every job (:mod:`gridcore.engine.health`)."""
    own = set(capacity.own_job_ids(conn, obs.site) if own_job_ids is None else own_job_ids)
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
            release=obs.release,
            api_version=obs.api_version,
            queue=wait_models.encode_queue(obs, own),
        )
    )
    if stored.rowcount != 1:
        return 0  # a newer observation won; releasing against this one could double count
    visible = [j.job_id for j in obs.jobs if j.state is not JobState.PENDING]
    return capacity.release_visible(conn, obs.site, visible)


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


__all__: Sequence[str] = (
    "Recorded",
    "SnapshotReader",
    "pg_decision_sql",
    "record_finished_stats",
    "record_pinned",
    "release",
    "select_and_record",
    "select_and_record_batch",
    "set_job_id",
    "store_observation",
)
