"""Hooks: how operators reach gridcore (``gridcore`` connections) and Slurm site tokens
(``gridcore_slurm`` connections).

Operators open gridcore's engines only through :class:`GridcoreHook`; the triggers, which
live one layer below (``sensors/``) and never import ``operators/``, open them through the
same :class:`~sensors.connections.GridLocation` the hook wraps, so a worker and the
triggerer always find the same grid and state database, and resolve the grid file's
``{ airflow_conn = ... }`` credentials the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow.sdk import BaseHook

from gridcore.engine.coallocation import CoAllocationEngine
from gridcore.engine.coreservation import CoReservationEngine
from gridcore.engine.runtime import GridRuntime
from gridcore.staging import ReplicaCatalog
from gridcore_airflow.sensors.connections import (
    GridLocation,
    close_coallocation,
    close_coreservation,
    connection_token,
    install_connection_resolver,
)

__all__ = ["GridcoreHook", "GridcoreSlurmHook", "install_connection_resolver"]


class GridcoreHook(BaseHook):
    """gridcore's grid and state database, and the engines on them.

    Where they are: ``grid_file`` / ``db_url`` when given, else the ``gridcore``
    connection ``gridcore_conn_id`` (state database as host/port/login/password/schema,
    or ``extra.db_url``; grid file as ``extra.grid_file``), else ``$GRIDCORE_GRID`` /
    ``$GRIDCORE_DB_URL``, else the embedded local sites on SQLite. Slurm tokens the grid
    file references as ``{ airflow_conn = "id" }`` resolve through Airflow connections.

    The ``runtime``/``koala_engine``/``catalog`` context managers close what they open
    (the database pool; KOALA's scan lease). Errors are gridcore's own (``GridError``);
    operators translate them into Airflow failures.
    """

    conn_name_attr = "gridcore_conn_id"
    default_conn_name = "gridcore_default"
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

    @contextmanager
    def runtime(self, *, upgrade: bool = True) -> Iterator[GridRuntime]:
        """A :class:`GridRuntime`; ``upgrade`` migrates the state DB first (a fresh one)."""
        opened = self.location.open_runtime(upgrade=upgrade)
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
    def koala_engine(
        self, scan_interval: float, *, upgrade: bool = False
    ) -> Iterator[CoAllocationEngine]:
        """A KOALA engine scanning about every ``scan_interval`` s (with the replica
        catalog); its scan lease is given up on exit."""
        engine = self.location.open_coallocation(scan_interval, upgrade=upgrade)
        try:
            yield engine
        finally:
            close_coallocation(engine)

    @contextmanager
    def coreserve_engine(self, *, upgrade: bool = False) -> Iterator[CoReservationEngine]:
        """A VJM co-reservation engine (its scan lease is given up on exit); its pilots
        call the configured VJ center, else one embedded in this process."""
        engine = self.location.open_coreservation(upgrade=upgrade)
        try:
            yield engine
        finally:
            close_coreservation(engine)

    def center_is_embedded(self) -> bool:
        """No VJ center configured: pilots call a center inside this process."""
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
