"""What every gridcore operator shares: where gridcore is, and how a wait ends.

Operators stay thin: they validate, call a gridcore engine opened by
:class:`~operators.hooks.GridcoreHook`, and hand the waiting to a
:class:`~sensors.base.GridcoreTrigger`, deferring to it (the triggerer waits) or running
it inline (the worker waits): one wait loop and one event either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from gridcore.engine.submission import resources_at
from gridcore.errors import GridError
from gridcore.model import GridSpec, JobResources
from gridcore.validation import RESOURCE_KEYS, check_resources
from gridcore_airflow.operators.hooks import GridcoreHook
from gridcore_airflow.sensors.base import GridcoreTrigger, wait_inline

RESOURCE_FIELDS: tuple[str, ...] = RESOURCE_KEYS
"""The resource arguments, templated wherever an operator templates its other arguments."""


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


class GridcoreJobOperator(GridcoreOperator):
    """Base of the operators whose work runs as site jobs: what every job asks of its
    site besides processors, named as everywhere in gridcore (and as sbatch names them),
    checked by :func:`gridcore.validation.check_resources`:

    :param time_limit: ``"90s"``, ``"10m"``, ``"2h"``, ``"1d"``, Slurm's ``"MM"``,
        ``"MM:SS"``, ``"HH:MM:SS"``, ``"D-HH"``, ``"D-HH:MM"``, ``"D-HH:MM:SS"``, or an
        integer of seconds. A rendered template is text: ``"90"`` is Slurm's 90
        MINUTES; write ``"90s"``.
    :param account: the account charged.
    :param qos: the quality of service.
    :param partition: the partition (over the site's ``partition``).
    :param memory: per node, ``"512M"``, ``"4G"``, ``"1T"`` or an integer of MiB.
    :param memory_per_cpu: per processor, same units; not with ``memory``.
    :param gpus: GPUs per job (an integer >= 0; a local site has none).
    :param constraint: a Slurm feature expression (``"intel&ib"``).

    Unset arguments are taken from the site's ``[sites.NAME.defaults]`` in the grid file,
    else the cluster's own defaults apply. What was sent is in the XCom result as
    ``resources`` (:meth:`gridcore.model.JobResources.as_json`: ``time_limit_s``,
    ``memory_mib``...).
    """

    def __init__(
        self,
        *,
        time_limit: str | int | None = None,
        account: str | None = None,
        qos: str | None = None,
        partition: str | None = None,
        memory: str | int | None = None,
        memory_per_cpu: str | int | None = None,
        gpus: int | str | None = None,
        constraint: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.time_limit = time_limit
        self.account = account
        self.qos = qos
        self.partition = partition
        self.memory = memory
        self.memory_per_cpu = memory_per_cpu
        self.gpus = gpus
        self.constraint = constraint

    def plan_resources(self) -> JobResources:
        """The (rendered) resource arguments, checked: RequestError naming the field
        (operators turn it into a failure without retries)."""
        raw = {key: getattr(self, key) for key in RESOURCE_KEYS}
        gpus = raw["gpus"]
        if isinstance(gpus, str) and gpus.strip().isascii() and gpus.strip().isdigit():
            raw["gpus"] = int(gpus.strip())  # a rendered template is text
        return check_resources(raw)

    def resources_sent(self, asked: JobResources, sites: Sequence[str]) -> list[dict[str, Any]]:
        """What a job asking ``asked`` was sent at each of ``sites``: over the site's
        defaults (:func:`gridcore.engine.submission.resources_at`, as the engine sent it),
        or ``asked`` alone if the grid cannot be read now (a warning says so)."""
        grid = self._grid()
        return [
            (
                resources_at(asked, grid.site(site))
                if grid is not None and site in grid.site_names
                else asked
            ).as_json()
            for site in sites
        ]

    def _grid(self) -> GridSpec | None:
        try:
            with self.hook().runtime(upgrade=False) as runtime:
                return runtime.grid
        except GridError as exc:
            self.log.warning("the grid's site defaults are not known: %s", exc)
            return None
