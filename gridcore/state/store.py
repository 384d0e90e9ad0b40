"""Connection to the state database: SQLite by default, PostgreSQL via GRIDCORE_DB_URL.

Every engine decision runs in ONE transaction obtained from :meth:`Store.begin`.
On SQLite each transaction starts with ``BEGIN IMMEDIATE`` (one writer at a time, so a
read-check-write cannot interleave); on PostgreSQL rows are locked explicitly where a
decision needs it (``lock_site``) and counters move by conditional UPDATEs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from sqlalchemy import (
    ARRAY,
    Connection,
    Engine,
    String,
    any_,
    bindparam,
    create_engine,
    event,
    func,
    inspect,
    select,
)
from sqlalchemy.pool import NullPool

from gridcore.errors import StateError
from gridcore.state import schema

DB_ENV = "GRIDCORE_DB_URL"
HOME_ENV = "GRIDCORE_HOME"
HEAD_REVISION = "0015"
# PostgreSQL SQLSTATEs a transaction that gave way raises (it may be retried whole)
LOCK_NOT_AVAILABLE = "55P03"
DEADLOCK_DETECTED = "40P01"


def state_dir() -> Path:
    """Where the embedded default keeps its SQLite file and local site storage."""
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".gridcore")


def default_db_url() -> str:
    return os.environ.get(DB_ENV) or f"sqlite:///{state_dir() / 'state.db'}"


class Store:
    """The state database. Create with :func:`open_store`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        self._autocommit: Engine | None = None

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    @contextmanager
    def begin_decision(self) -> Iterator[Connection]:
        """A connection for one selection decision: a transaction on SQLite; autocommit
        on PostgreSQL, where the decision commits as a single statement."""
        if self.is_sqlite:
            with self.engine.begin() as conn:
                yield conn
            return
        if self._autocommit is None:
            # Its own small pool: no pre-ping and no rollback-on-return, which would each
            # cost a round trip per decision; a broken connection surfaces as an error.
            self._autocommit = create_engine(
                self.engine.url,
                isolation_level="AUTOCOMMIT",
                pool_reset_on_return=None,
                pool_size=2,
                max_overflow=2,
            )
        with self._autocommit.connect() as conn:
            yield conn

    def lock_site(self, conn: Connection, site: str) -> None:
        """Serialize decisions that read-then-write one site's rows (PostgreSQL).
        SQLite transactions are already exclusive (BEGIN IMMEDIATE)."""
        if not self.is_sqlite:
            conn.execute(
                select(schema.sites.c.name).where(schema.sites.c.name == site).with_for_update()
            )

    def lock_sites(self, conn: Connection, names: Sequence[str], wait_s: float) -> None:
        """:meth:`lock_site` for several sites in one statement, in name order, waiting
        at most ``wait_s`` for a row another transaction holds (then the driver raises
        lock_not_available, :data:`LOCK_NOT_AVAILABLE`). Set below PostgreSQL's
        deadlock_timeout (1 s), the waiter gives way first: a transaction that locks
        sites in another order (releases, expiries) is never the deadlock's victim."""
        if self.is_sqlite or not names:
            return
        conn.execute(_LOCK_SITES, {"names": sorted(names), "wait": f"{round(wait_s * 1000)}ms"})

    def take_turn(self, conn: Connection, name: str) -> None:
        """Wait until no other transaction holds the turn ``name``, then hold it to the
        end of this one (a PostgreSQL transaction-level advisory lock): transactions
        taking the same turn run their decisions one at a time. SQLite transactions are
        one at a time anyway (BEGIN IMMEDIATE)."""
        if not self.is_sqlite:
            conn.execute(_TAKE_TURN, {"name": name})

    def check_migrated(self) -> None:
        """Refuse a database short of any table or column of this release's schema (one
        at an older revision: its first query would fail on a missing column), naming
        what is missing and what to run."""
        inspector = inspect(self.engine)
        tables = set(inspector.get_table_names())
        missing = sorted({t.name for t in schema.metadata.sorted_tables} - tables)
        if not missing:
            present = {
                table: {column["name"] for column in columns}
                for (_, table), columns in inspector.get_multi_columns().items()
            }
            missing = sorted(
                f"{table.name}.{column.name}"
                for table in schema.metadata.sorted_tables
                for column in table.columns
                if column.name not in present.get(table.name, set())
            )
        if missing:
            raise StateError(
                f"state database {self.engine.url.render_as_string(hide_password=True)} is not "
                f"migrated (missing {missing}): run `gridcore db upgrade`"
            )

    def dispose(self) -> None:
        self.engine.dispose()
        if self._autocommit is not None:
            self._autocommit.dispose()


_LOCK_SITES = (
    select(schema.sites.c.name)
    .where(
        schema.sites.c.name == any_(bindparam("names", type_=ARRAY(String))),
        # lock_timeout for the rest of the transaction, in the same round trip: the
        # filter runs on a row before FOR UPDATE locks it, so before the first wait
        func.set_config("lock_timeout", bindparam("wait", type_=String), True).is_not(None),
    )
    .order_by(schema.sites.c.name)
    .with_for_update()
)
_TAKE_TURN = select(func.pg_advisory_xact_lock(func.hashtext(bindparam("name", type_=String))))


def open_store(url: str | None = None, *, upgrade: bool = False, pool: bool = True) -> Store:
    """Open (and optionally migrate) the state database at ``url`` or the default."""
    url = url or default_db_url()
    engine = _create_engine(url, pool)
    store = Store(engine)
    if upgrade:
        upgrade_db(store)
    return store


def upgrade_db(store: Store) -> str:
    """Run the Alembic migrations to head; returns the revision."""
    from alembic import command
    from alembic.config import Config

    ini = resources.files("gridcore.state.migrations").joinpath("alembic.ini")
    cfg = Config(str(ini))
    cfg.set_main_option("script_location", str(Path(str(ini)).parent))
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    return HEAD_REVISION


def _create_engine(url: str, pool: bool) -> Engine:
    kwargs: dict[str, Any] = {"future": True}
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        kwargs["connect_args"] = {"timeout": 60, "check_same_thread": False}
        engine = create_engine(url, **kwargs)
        _sqlite_immediate_transactions(engine)
        return engine
    if not pool:
        kwargs["poolclass"] = NullPool
    else:
        kwargs["pool_pre_ping"] = True
    return create_engine(url, **kwargs)


def _sqlite_immediate_transactions(engine: Engine) -> None:
    # pysqlite's own transaction handling defers BEGIN until the first write, which lets
    # two processes read the same ledger and both write: take the write lock up front.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
