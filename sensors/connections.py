"""Airflow connections -> gridcore: the lowest Airflow layer, shared by hooks and triggers.

Both the workers (operators, through
:class:`gridcore_airflow.operators.hooks.GridcoreHook`) and the triggerer (every trigger,
through :class:`gridcore_airflow.sensors.base.GridcoreTrigger`) open gridcore's engines
the same way, and both must resolve ``{ airflow_conn = "..." }`` credential references of
the grid file. Both do it here, so nothing in ``sensors/`` ever imports
``operators/`` (the arrow runs one way: operators -> sensors -> gridcore).

Where gridcore's grid and state are (:class:`GridLocation`): explicit arguments first,
then a ``gridcore`` Airflow connection, then ``$GRIDCORE_GRID`` / ``$GRIDCORE_DB_URL``
(:meth:`GridRuntime.open`'s own defaults). A ``gridcore`` connection gives the state
database as host/port/login/password/schema (PostgreSQL; the password stays in Airflow's
connections or secrets backend, never in a DAG or a trigger's stored arguments) or as
``extra.db_url``, and the grid description as ``extra.grid_file``.

The VJ center (the HTTP API pilots talk to, ``gridcore serve``): ``extra.center_url``,
else ``$GRIDCORE_CENTER_URL``; ``extra.site_center_urls`` / ``$GRIDCORE_SITE_CENTER_URLS``
(JSON ``{"site": "url"}``) name another address for the pilots of one site (a cluster
that reaches this host by another interface). Without any, :func:`embedded_center`
starts one inside this process (the embedded default: local sites, one process).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any

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

DEFAULT_DB_DRIVER = "postgresql+psycopg"
# Not a correctness parameter (the lease is fenced and renewed while a scan runs, see
# gridcore.engine.lease): it is how long a triggerer that died holding the lease keeps
# the others from scanning. A holder that stops waiting releases it at once
# (close_coallocation); a floor keeps renewals rare for short scan intervals.
MIN_LEASE_S = 60.0
CENTER_ENV = "GRIDCORE_CENTER_URL"
SITE_CENTERS_ENV = "GRIDCORE_SITE_CENTER_URLS"


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
        """Explicit fields, completed from the ``gridcore`` connection if one is named."""
        if self.conn_id is None:
            return self
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

    def open_coreservation(self, *, upgrade: bool) -> CoReservationEngine:
        """A VJM co-reservation engine whose pilots call the configured center, else a
        center embedded in this process (:func:`embedded_center`)."""
        runtime = self.open_runtime(upgrade=upgrade)
        url, sites = self.configured_center()
        if url is None:
            url = embedded_center(runtime.store).url
        return CoReservationEngine(runtime, url, site_center_urls=sites)

    def open_runtime(self, *, upgrade: bool) -> GridRuntime:
        """A :class:`GridRuntime` on this location. Without ``upgrade`` the state DB must
        be migrated already (it is once a job exists), which keeps Alembic's CPU-bound
        work away from the triggerer."""
        install_connection_resolver()
        where = self.resolved()
        return GridRuntime.open(where.grid_file, where.db_url, upgrade=upgrade)

    def open_coallocation(self, scan_interval: float, *, upgrade: bool) -> CoAllocationEngine:
        """A KOALA engine scanning about every ``scan_interval`` seconds, with the
        replica catalog its staging step needs; its components' barriers call the
        configured center, else a center embedded in this process (:func:`embedded_center`)."""
        runtime = self.open_runtime(upgrade=upgrade)
        url, sites = self.configured_center()
        if url is None:
            url = embedded_center(runtime.store).url
        return CoAllocationEngine(
            runtime,
            ReplicaCatalog(runtime.store),
            CoAllocationParams(scan_interval_s=scan_interval),
            center_url=url,
            site_center_urls=sites,
            lease_s=max(LEASE_SCANS * scan_interval, MIN_LEASE_S),
        )


def close_coallocation(engine: CoAllocationEngine) -> None:
    """Give the scan lease up (another waiter may scan at once instead of waiting for its
    expiry) and close the engine's database pool."""
    try:
        engine.release_lease()
    finally:
        engine.store.dispose()


def close_coreservation(engine: CoReservationEngine) -> None:
    try:
        engine.release_lease()
    finally:
        engine.store.dispose()


_EMBEDDED: dict[str, RunningCenter] = {}
_EMBEDDED_LOCK = threading.Lock()


def embedded_center(store: Store) -> RunningCenter:
    """A VJ center serving ``store``'s database from a thread of this process, on
    127.0.0.1 (one per database, for the process's life). Only for the embedded default:
    pilots on local sites reach it; it lives as long as this process, so a job whose
    center is embedded is waited on in this process (the operator does not defer)."""
    key = store.engine.url.render_as_string(hide_password=False)
    with _EMBEDDED_LOCK:
        center = _EMBEDDED.get(key)
        if center is None:
            center = start_in_thread(open_store(key, upgrade=False))
            _EMBEDDED[key] = center
        return center


def _connection(conn_id: str) -> Any:
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException as exc:
        raise CredentialError(f"Airflow connection {conn_id!r} is not defined") from exc


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
