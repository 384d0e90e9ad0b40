"""Hooks: how the Airflow layer reaches gridcore (``gridcore`` connections) and Slurm
site tokens (``gridcore_slurm`` connections).

The hook owns the connections, as the SSH provider's ``SSHHook`` does: operators (in
workers) and triggers (in the triggerer) open gridcore's runtime and engines only
through :class:`GridcoreHook`, so both find the same grid and state database and
resolve the grid file's ``{ airflow_conn = ... }`` credentials the same way. This module
imports nothing else of the Airflow layer, so the triggers in ``sensors/`` can use it.

Where gridcore's grid and state are (:class:`GridLocation`): explicit arguments first,
then a ``gridcore`` Airflow connection, then ``$GRIDCORE_GRID`` / ``$GRIDCORE_DB_URL``
(:meth:`GridRuntime.open`'s own defaults). A ``gridcore`` connection gives the state
database as host/port/login/password/schema (PostgreSQL; the password stays in Airflow's
connections or secrets backend, never in a DAG or a trigger's stored arguments) or as
``extra.db_url``, and the grid description as ``extra.grid_file``. The connection is
the one named (``gridcore_conn_id``), else ``gridcore_default`` (:data:`DEFAULT_CONN_ID`,
as Airflow providers have a default connection) when it is defined
(``AIRFLOW_CONN_GRIDCORE_DEFAULT`` or any secrets backend); a named connection that is
not defined is an error, a missing default one leaves the environment to decide.

The VJ center (the HTTP API pilots and barriers talk to, ``gridcore serve``):
``extra.center_url``, else ``$GRIDCORE_CENTER_URL``; ``extra.site_center_urls`` /
``$GRIDCORE_SITE_CENTER_URLS`` (JSON ``{"site": "url"}``) name another address for the
jobs of one site (a cluster that reaches this host by another interface). Without any,
:func:`embedded_center` starts one inside this process (the embedded default: local
sites, one process).
"""

from __future__ import annotations

import enum
import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from sqlalchemy.engine import URL

from gridcore import credentials
from gridcore.api.server import RunningCenter, start_in_thread
from gridcore.engine.coallocation import LEASE_SCANS, CoAllocationEngine
from gridcore.engine.coreservation import CoReservationEngine
from gridcore.engine.runtime import GridRuntime
from gridcore.errors import CredentialError
from gridcore.policies.claiming import CoAllocationParams
from gridcore.staging import ReplicaCatalog
from gridcore.state.store import Store, open_store

__all__ = [
    "DEFAULT_CONN_ID",
    "EngineKind",
    "GridLocation",
    "GridcoreHook",
    "GridcoreSlurmHook",
    "ScanEngine",
    "install_connection_resolver",
]

DEFAULT_DB_DRIVER = "postgresql+psycopg"
# Not a correctness parameter (the lease is fenced and renewed while a scan runs, see
# gridcore.engine.lease): it is how long a triggerer that died holding the lease keeps
# the others from scanning. A holder that stops waiting releases it at once
# (GridcoreHook.close_engine); a floor keeps renewals rare for short scan intervals.
MIN_LEASE_S = 60.0
DEFAULT_CONN_ID = "gridcore_default"
CENTER_ENV = "GRIDCORE_CENTER_URL"
SITE_CENTERS_ENV = "GRIDCORE_SITE_CENTER_URLS"


class EngineKind(enum.StrEnum):
    """The engines whose jobs an operator submits and a trigger waits on by scanning."""

    COALLOCATION = "coallocation"  # KOALA (gridcore.engine.coallocation)
    CORESERVATION = "coreservation"  # VJM pilots (gridcore.engine.coreservation)


class ScanEngine(Protocol):
    """What every engine of :class:`EngineKind` offers the Airflow layer: no daemon,
    whoever waits on a job scans (under the engine's fenced lease)."""

    runtime: GridRuntime
    store: Store

    def scan(self) -> Any: ...

    def status(self, job_id: int) -> Any: ...

    def cancel(self, job_id: int) -> Any: ...

    def release_lease(self) -> None: ...


class GridcoreHook(BaseHook):
    """gridcore's grid and state database, and the runtime and engines on them.

    Where they are: ``grid_file`` / ``db_url`` when given, else the ``gridcore``
    connection ``gridcore_conn_id`` (state database as host/port/login/password/schema,
    or ``extra.db_url``; grid file as ``extra.grid_file``; none named:
    ``gridcore_default`` if it is defined), else ``$GRIDCORE_GRID`` /
    ``$GRIDCORE_DB_URL``, else the embedded local sites on SQLite. Slurm tokens the grid
    file references as ``{ airflow_conn = "id" }`` resolve through Airflow connections
    (the token is the connection's password).

    ``open_runtime`` / ``open_engine`` return what a trigger holds across its polls
    (closed with ``store.dispose()`` / :meth:`close_engine`); the ``runtime`` /
    ``engine`` / ``catalog`` context managers close what they open (the database pool,
    an engine's scan lease). Errors are gridcore's own (``GridError``); operators
    translate them into Airflow failures, triggers into error events.
    """

    conn_name_attr = "gridcore_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "gridcore"
    hook_name = "gridcore grid"

    def __init__(
        self,
        gridcore_conn_id: str | None = None,
        grid_file: str | None = None,
        db_url: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gridcore_conn_id = gridcore_conn_id
        self.location = GridLocation(grid_file, db_url, gridcore_conn_id)

    def get_conn(self) -> GridLocation:
        """The grid file and state database URL this hook opens (resolved)."""
        return self.location.resolved()

    def open_runtime(self, *, upgrade: bool) -> GridRuntime:
        """A :class:`GridRuntime` (close with ``store.dispose()``). Without ``upgrade``
        the state DB must be migrated already (it is once a job exists), which keeps
        Alembic's CPU-bound work away from the triggerer."""
        install_connection_resolver()
        where = self.location.resolved()
        return GridRuntime.open(where.grid_file, where.db_url, upgrade=upgrade)

    def open_engine(self, kind: EngineKind, scan_interval: float, *, upgrade: bool) -> ScanEngine:
        """The engine of ``kind`` scanning about every ``scan_interval`` seconds (close
        with :meth:`close_engine`); its jobs call the configured VJ center, else one
        embedded in this process (:func:`embedded_center`)."""
        runtime = self.open_runtime(upgrade=upgrade)
        url, sites = self.location.configured_center()
        if url is None:
            url = embedded_center(runtime.store).url
        return _ENGINES[kind](runtime, url, sites, scan_interval)

    @staticmethod
    def close_engine(engine: ScanEngine) -> None:
        """Give the scan lease up (another waiter may scan at once instead of waiting for
        its expiry) and close the engine's database pool."""
        try:
            engine.release_lease()
        finally:
            engine.store.dispose()

    @contextmanager
    def runtime(self, *, upgrade: bool = True) -> Iterator[GridRuntime]:
        """A :class:`GridRuntime`; ``upgrade`` migrates the state DB first (a fresh one)."""
        opened = self.open_runtime(upgrade=upgrade)
        try:
            yield opened
        finally:
            opened.store.dispose()

    @contextmanager
    def catalog(self, *, upgrade: bool = True) -> Iterator[tuple[GridRuntime, ReplicaCatalog]]:
        """The runtime and the replica catalog in its state DB."""
        with self.runtime(upgrade=upgrade) as opened:
            yield opened, ReplicaCatalog(opened.store)

    @contextmanager
    def engine(
        self, kind: EngineKind, scan_interval: float, *, upgrade: bool = False
    ) -> Iterator[ScanEngine]:
        """:meth:`open_engine`, closed (its scan lease given up) on exit."""
        opened = self.open_engine(kind, scan_interval, upgrade=upgrade)
        try:
            yield opened
        finally:
            self.close_engine(opened)

    def center_is_embedded(self) -> bool:
        """No VJ center configured: pilots and barriers call a center inside this process."""
        return self.location.configured_center()[0] is None

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": [],
            "relabeling": {
                "host": "state DB host (PostgreSQL; empty: $GRIDCORE_DB_URL or SQLite)",
                "schema": "state DB name",
                "login": "state DB user",
                "password": "state DB password",
            },
            "placeholders": {
                "host": "postgres.example.org",
                "port": "5432",
                "extra": '{"grid_file": "/etc/gridcore/grid.toml"}',
            },
        }


class GridcoreSlurmHook(BaseHook):
    """A slurmrestd endpoint of one gridcore site: host = REST URL, login = Slurm user,
    password = JWT token. A grid file names it as ``token = { airflow_conn = "id" }``."""

    conn_name_attr = "gridcore_conn_id"
    default_conn_name = "gridcore_slurm_default"
    conn_type = "gridcore_slurm"
    hook_name = "gridcore Slurm site"

    def __init__(self, gridcore_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gridcore_conn_id = gridcore_conn_id

    def get_token(self) -> str:
        """The site's slurmrestd token; raises naming the connection if it has none."""
        return connection_token(self.gridcore_conn_id)

    def get_conn(self) -> dict[str, str | None]:
        conn = self.get_connection(self.gridcore_conn_id)
        return {"url": conn.host, "user": conn.login, "token": self.get_token()}

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["schema", "port", "extra"],
            "relabeling": {
                "host": "slurmrestd URL",
                "login": "Slurm user",
                "password": "slurmrestd JWT token",
            },
            "placeholders": {"host": "http://cluster.example.org:6820", "login": "root"},
        }


@dataclass(frozen=True)
class GridLocation:
    """Where gridcore's grid description and state database are (see the module doc).
    Plain strings only: triggers serialize the unresolved fields, so a password read from
    a connection never lands in Airflow's trigger table."""

    grid_file: str | None = None
    db_url: str | None = None
    conn_id: str | None = None
    center_url: str | None = None
    site_center_urls: str | None = None  # JSON {"site": "url"}

    def resolved(self) -> GridLocation:
        """Explicit fields, completed from the ``gridcore`` connection: the one named,
        else ``gridcore_default`` when it is defined."""
        if self.conn_id is None or self.conn_id == DEFAULT_CONN_ID:
            conn = _defined_connection(DEFAULT_CONN_ID)
            if conn is None:
                return replace(self, conn_id=None)  # the environment decides
        else:
            conn = _connection(self.conn_id)
        extra: dict[str, Any] = conn.extra_dejson or {}
        sites = extra.get("site_center_urls")
        return GridLocation(
            grid_file=self.grid_file or _text(extra.get("grid_file")),
            db_url=self.db_url or _text(extra.get("db_url")) or _db_url(conn, extra),
            center_url=self.center_url or _text(extra.get("center_url")),
            site_center_urls=self.site_center_urls
            or (json.dumps(sites) if isinstance(sites, dict) else None),
        )

    def configured_center(self) -> tuple[str | None, dict[str, str]]:
        """The VJ center URL and per-site URLs configured (connection, then env)."""
        where = self.resolved()
        url = where.center_url or _text(os.environ.get(CENTER_ENV))
        raw = where.site_center_urls or os.environ.get(SITE_CENTERS_ENV) or "{}"
        try:
            sites = json.loads(raw)
        except ValueError:
            raise CredentialError(f"site center URLs are not JSON: {raw[:60]!r}") from None
        if not isinstance(sites, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in sites.items()
        ):
            raise CredentialError('site center URLs must be a JSON object {"site": "url"}')
        return url, sites


def connection_token(conn_id: str) -> str:
    """The secret of Airflow connection ``conn_id`` (its password): how a grid file's
    ``token = { airflow_conn = "id" }`` is resolved, in workers and in the triggerer."""
    password = _connection(conn_id).password
    if not password:
        raise CredentialError(f"Airflow connection {conn_id!r} has no password (the token)")
    return str(password)


def install_connection_resolver() -> None:
    """Let gridcore resolve ``{ airflow_conn = ... }`` through Airflow connections (and
    thus every secrets backend Airflow is configured with). Idempotent; called before any
    engine is opened, in workers and in the triggerer alike."""
    credentials.register_connection_resolver(connection_token)


_EMBEDDED: dict[str, RunningCenter] = {}
_EMBEDDED_LOCK = threading.Lock()


def embedded_center(store: Store) -> RunningCenter:
    """A VJ center serving ``store``'s database from a thread of this process, on
    127.0.0.1 (one per database, for the process's life). Only for the embedded default:
    jobs on local sites reach it; it lives as long as this process, so a job whose
    center is embedded is waited on in this process (the operator does not defer)."""
    key = store.engine.url.render_as_string(hide_password=False)
    with _EMBEDDED_LOCK:
        center = _EMBEDDED.get(key)
        if center is None:
            center = start_in_thread(open_store(key, upgrade=False))
            _EMBEDDED[key] = center
        return center


def _coallocation(
    runtime: GridRuntime, center_url: str, sites: dict[str, str], scan_interval: float
) -> CoAllocationEngine:
    # with the replica catalog its staging step needs
    return CoAllocationEngine(
        runtime,
        ReplicaCatalog(runtime.store),
        CoAllocationParams(scan_interval_s=scan_interval),
        center_url=center_url,
        site_center_urls=sites,
        lease_s=max(LEASE_SCANS * scan_interval, MIN_LEASE_S),
    )


def _coreservation(
    runtime: GridRuntime, center_url: str, sites: dict[str, str], scan_interval: float
) -> CoReservationEngine:
    # VJM's scan period and lease are its own parameters (CoReservationParams)
    return CoReservationEngine(runtime, center_url, site_center_urls=sites)


# How each kind is built on a runtime and a VJ center: one line per engine.
_ENGINES: dict[EngineKind, Callable[[GridRuntime, str, dict[str, str], float], ScanEngine]] = {
    EngineKind.COALLOCATION: _coallocation,
    EngineKind.CORESERVATION: _coreservation,
}


def _connection(conn_id: str) -> Any:
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException as exc:
        raise CredentialError(f"Airflow connection {conn_id!r} is not defined") from exc


def _defined_connection(conn_id: str) -> Any | None:
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def _db_url(conn: Any, extra: dict[str, Any]) -> str | None:
    if not conn.host:
        return None  # the connection names only the grid file: $GRIDCORE_DB_URL or SQLite
    url = URL.create(
        _text(extra.get("drivername")) or DEFAULT_DB_DRIVER,
        username=conn.login or None,
        password=conn.password or None,
        host=conn.host,
        port=conn.port or None,
        database=conn.schema or None,
    )
    return url.render_as_string(hide_password=False)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None
