"""What every gridcore operator shares: where gridcore is, and how a wait ends.

Operators stay thin: they validate, call a gridcore engine opened by
:class:`~operators.hooks.GridcoreHook`, and hand the waiting to a
:class:`~sensors.base.GridcoreTrigger`, deferring to it (the triggerer waits) or running
it inline (the worker waits): one wait loop and one event either way.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator, Context

from gridcore_airflow.operators.hooks import GridcoreHook
from gridcore_airflow.sensors.base import GridcoreTrigger, wait_inline


class GridcoreOperator(BaseOperator):
    """Base of gridcore's operators.

    :param grid_file: grid description; default: the connection's, else
        ``$GRIDCORE_GRID``, else the embedded local sites.
    :param db_url: state database URL; default: the connection's, else
        ``$GRIDCORE_DB_URL``, else SQLite under ``$GRIDCORE_HOME``.
    :param gridcore_conn_id: a ``gridcore`` Airflow connection giving the grid file and
        the state database (see :class:`~operators.hooks.GridcoreHook`).
    """

    def __init__(
        self,
        *,
        grid_file: str | None = None,
        db_url: str | None = None,
        gridcore_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.grid_file = grid_file
        self.db_url = db_url
        self.gridcore_conn_id = gridcore_conn_id

    def hook(self) -> GridcoreHook:
        return GridcoreHook(self.gridcore_conn_id, self.grid_file, self.db_url)

    def location(self) -> dict[str, str | None]:
        """Where gridcore is, as a trigger's constructor takes it (unresolved: the
        triggerer resolves the connection itself, so no secret is stored with it)."""
        return {
            "grid_file": self.grid_file,
            "db_url": self.db_url,
            "gridcore_conn_id": self.gridcore_conn_id,
        }

    def wait_for(
        self, context: Context, trigger: GridcoreTrigger[Any, Any], *, deferrable: bool
    ) -> Any:
        """Defer to ``trigger`` (the task resumes in ``execute_complete``), or run it to
        its event in this worker and finish the same way. An operator that waits
        defines ``execute_complete(context, event)``."""
        if deferrable:
            self.defer(trigger=trigger, method_name="execute_complete")
        return self.execute_complete(context, wait_inline(trigger))
