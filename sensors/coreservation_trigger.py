"""Waiting on a co-reserved (VJM) job in Airflow's triggerer: drive the VJM scans until
it ends.

Like KOALA, the co-reservation engine has no daemon: whoever waits on a job runs
:meth:`~gridcore.engine.coreservation.CoReservationEngine.scan` (follow pilots, dispatch,
reorganize after the lifetime, substitutes); the fenced lease ``vjm-scan`` lets one scan
run at a time. The pilots talk to the VJ center (``gridcore serve``, or the app mounted
in Airflow's api-server), whose URL the connection or ``$GRIDCORE_CENTER_URL`` gives.
"""

from __future__ import annotations

from gridcore.engine.coreservation import CoReservationEngine, ReservationRecord
from gridcore.engine.phases import PilotState, ReservationPhase
from gridcore.sites.output import OutputFiles, SiteJob
from gridcore_airflow.sensors.base import GridcoreTrigger, Outcome
from gridcore_airflow.sensors.connections import close_coreservation


class CoReservationTrigger(GridcoreTrigger[CoReservationEngine, ReservationRecord]):
    """Scan VJM until co-reserved job ``job_id`` ends; yield exactly one event.

    ``CoReservationTrigger(job_id, grid_file=None, db_url=None, poll_interval=1.0,
    max_retries=5, gridcore_conn_id=None)``: each poll is one ``CoReservationEngine.scan``
    (skipped while another engine holds the lease) and ``status``; on_kill cancels the
    job and releases every pilot.

    The real command runs inside each dispatched pilot and inherits the pilot's stdout
    and stderr, so its output is in the pilot's site job files (with the pilot's own
    few ``gridcore pilot N: ...`` lines on stderr): those of every pilot given a rank
    go into the task log prefixed ``[component i @ site]``. Pilots that only held (and
    were released, shifted or lost) ran nothing and are not shown.
    """

    subject = "co-reserved job"
    id_field = "job_id"
    job_id: int
    default_poll_interval = 1.0
    poll_noun = "scans"

    def _connect(self) -> CoReservationEngine:
        return self.location.open_coreservation(upgrade=False)

    def _poll(self, handle: CoReservationEngine) -> ReservationRecord:
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

    def _output_jobs(self, record: ReservationRecord) -> list[SiteJob]:
        return [
            SiteJob(
                p.site,
                p.site_job_id,
                f"component {p.component} @ {p.site}",
                finished=record.finished or p.state.finished,
                failed=p.state is PilotState.FAILED,
            )
            for p in sorted(record.pilots, key=lambda p: p.component or 0)
            if p.component is not None and p.site_job_id is not None
        ]

    def _output_files(self, handle: CoReservationEngine, site: str, job_id: str) -> OutputFiles:
        return handle.runtime.output_files(site, job_id)

    def _finished(self, handle: CoReservationEngine) -> None:
        handle.release_lease()

    def _cancel(self, handle: CoReservationEngine) -> str:
        return f"{handle.cancel(self.job_id).state}"

    def _close(self, handle: CoReservationEngine) -> None:
        close_coreservation(handle)
