"""Waiting on a co-reserved (VJM) job in Airflow's triggerer: drive the VJM scans until
it ends.

Like KOALA, the co-reservation engine has no daemon: whoever waits on a job runs
:meth:`~gridcore.engine.coreservation.CoReserveEngine.scan` (follow pilots, dispatch,
reorganize after the lifetime, substitutes); the fenced lease ``vjm-scan`` lets one scan
run at a time. The pilots talk to the VJ center (``gridcore serve``, or the app mounted
in Airflow's api-server), whose URL the connection or ``$GRIDCORE_CENTER_URL`` gives.
"""

from __future__ import annotations

from gridcore.engine.coreservation import CoReserveEngine, ReservationRecord
from gridcore.engine.phases import ReservationPhase
from gridcore_airflow.sensors.base import GridcoreTrigger, Outcome
from gridcore_airflow.sensors.connections import close_coreserve


class CoReservationTrigger(GridcoreTrigger[CoReserveEngine, ReservationRecord]):
    """Scan VJM until co-reserved job ``job_id`` ends; yield exactly one event.

    ``CoReservationTrigger(job_id, grid_file=None, db_url=None, poll_interval=1.0,
    max_retries=5, gridcore_conn_id=None)``: each poll is one ``CoReserveEngine.scan``
    (skipped while another engine holds the lease) and ``status``; on_kill cancels the
    job and releases every pilot.
    """

    subject = "co-reserved job"
    id_field = "job_id"
    job_id: int
    default_poll_interval = 1.0
    poll_noun = "scans"

    def _connect(self) -> CoReserveEngine:
        return self.location.open_coreserve(upgrade=False)

    def _poll(self, handle: CoReserveEngine) -> ReservationRecord:
        handle.scan()
        return handle.status(self.job_id)

    @classmethod
    def outcome(cls, record: ReservationRecord) -> Outcome:
        where = f"co-reserved job {record.job_id} ({record.name})"
        if record.state == ReservationPhase.COMPLETED:
            sites = ", ".join(f"{site} x{n}" for site, n in record.clusters.items())
            return Outcome(record.job_id, True, f"{where} completed through pilots on {sites}")
        detail = f": {record.message}" if record.message else ""
        return Outcome(record.job_id, False, f"{where} {record.state}{detail}")

    def _finished(self, handle: CoReserveEngine) -> None:
        handle.release_lease()

    def _cancel(self, handle: CoReserveEngine) -> str:
        return f"{handle.cancel(self.job_id).state}"

    def _close(self, handle: CoReserveEngine) -> None:
        close_coreserve(handle)
