"""Wait for a job gridcore already selected (and usually submitted) to finish."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from gridcore.errors import GridError, SiteError
from gridcore_airflow.operators.hooks import GridcoreHook
from gridcore_airflow.sensors.triggers import SiteJobTrigger


class SiteJobSensor(BaseSensorOperator):
    """Succeed when the job of ``selection_id`` completes; fail if it fails or is cancelled.

    :param selection_id: the gridcore selection to follow (templated, e.g. from an XCom).
    :param grid_file: grid description; default ``$GRIDCORE_GRID`` or the embedded grid.
    :param db_url: state database URL; default ``$GRIDCORE_DB_URL`` or SQLite.
    :param gridcore_conn_id: a ``gridcore`` Airflow connection giving the grid file and
        the state database where ``grid_file`` / ``db_url`` are not given.
    :param poll_interval: seconds between polls (also the poke interval).
    :param deferrable: wait in the triggerer (default) instead of poking from a worker.

    Returns (XCom) the selection's record, ``JobRecord.as_json()``.
    """

    template_fields: Sequence[str] = ("selection_id",)
    ui_color = "#cfe2f3"

    def __init__(
        self,
        *,
        selection_id: int | str,
        grid_file: str | None = None,
        db_url: str | None = None,
        poll_interval: float = 2.0,
        deferrable: bool = True,
        gridcore_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", poll_interval)
        super().__init__(**kwargs)
        self.selection_id = selection_id
        self.grid_file = grid_file
        self.db_url = db_url
        self.poll_interval = poll_interval
        self.deferrable = deferrable
        self.gridcore_conn_id = gridcore_conn_id

    def execute(self, context: Context) -> Any:
        selection_id = self._selection()
        if not self.deferrable:
            return super().execute(context)
        self.defer(
            trigger=SiteJobTrigger(
                selection_id,
                self.grid_file,
                self.db_url,
                self.poll_interval,
                gridcore_conn_id=self.gridcore_conn_id,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def poke(self, context: Context) -> bool | PokeReturnValue:
        selection_id = self._selection()
        try:
            hook = GridcoreHook(self.gridcore_conn_id, self.grid_file, self.db_url)
            runtime = hook.open_runtime(upgrade=False)
        except GridError as exc:
            raise AirflowException(f"selection {selection_id}: {exc}") from exc
        try:
            record = runtime.poll(selection_id)
        except SiteError as exc:
            # Transient until the sensor's timeout says otherwise: poke again.
            self.log.warning("selection %s: %s", selection_id, exc)
            return False
        except GridError as exc:
            raise AirflowException(f"selection {selection_id}: {exc}") from exc
        finally:
            runtime.store.dispose()
        if not record.finished:
            return False
        event = SiteJobTrigger.contract.event_for(record)
        return PokeReturnValue(True, self.execute_complete(context, dict(event)))

    def execute_complete(self, context: Context, event: Any = None) -> Any:
        own, about = self._selection(), SiteJobTrigger.contract.about(event)
        if about is not None and about != own:
            # Airflow resumed this task instance with another one's trigger event (seen
            # in CI under load; operators/base.py, JobLifecycleOperator._follow_own_job):
            # it says nothing of this selection, which is waited on again (for the full
            # timeout again: the wait that was cut short is not counted).
            self.log.warning(
                "the event that resumed this task is about selection %s, not %s: waiting"
                " on selection %s again",
                about,
                own,
                own,
            )
            return self.execute(context)
        return SiteJobTrigger.contract.completed_record(event, self.log)

    def _selection(self) -> int:
        value = self.selection_id
        try:
            number = int(str(value).strip())
        except ValueError:
            number = 0
        if number <= 0 or isinstance(value, bool):
            raise AirflowFailException(
                f"selection_id: must be a positive integer (after templating), got {value!r}"
            )
        return number
