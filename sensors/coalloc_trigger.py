"""Waiting on a co-allocated job in Airflow's triggerer: drive KOALA's scans until it ends.

The KOALA engine has no daemon of its own: whoever waits on a co-allocated job also runs
the engine's scans (placement, staging, claiming, following the components). Any number
of triggers (and workers, in non-deferrable mode) may do so at once: the engine's scan
lease in the state database lets exactly one scan run at a time, the others skip.
"""

from __future__ import annotations

from gridcore.engine.koala import CoAllocationRecord, JobPhase, KoalaEngine
from sensors.base import DEFAULT_MAX_RETRIES, GridcoreTrigger, Outcome
from sensors.connections import GridLocation, close_koala


class CoAllocationTrigger(GridcoreTrigger[KoalaEngine, CoAllocationRecord]):
    """Scan KOALA until co-allocated job ``job_id`` ends; yield exactly one event.

    Each poll is one ``KoalaEngine.scan`` (skipped while another engine holds the scan
    lease) and ``KoalaEngine.status``; see :class:`~sensors.base.GridcoreTrigger` for
    retries, errors, on_kill (cancels the job and its started components) and cleanup.
    """

    subject = "co-allocated job"
    id_field = "job_id"
    poll_noun = "scans"

    def __init__(
        self,
        job_id: int,
        grid_file: str | None = None,
        db_url: str | None = None,
        poll_interval: float = 1.0,
        max_retries: int = DEFAULT_MAX_RETRIES,
        gridcore_conn_id: str | None = None,
    ) -> None:
        location = GridLocation(grid_file, db_url, gridcore_conn_id)
        super().__init__(job_id, location, poll_interval, max_retries)

    @property
    def job_id(self) -> int:
        return self.ident

    def _connect(self) -> KoalaEngine:
        return self.location.open_koala(self.poll_interval, upgrade=False)

    def _poll(self, handle: KoalaEngine) -> CoAllocationRecord:
        handle.scan()
        return handle.status(self.job_id)

    @classmethod
    def outcome(cls, record: CoAllocationRecord) -> Outcome:
        where = f"co-allocated job {record.job_id} ({record.name})"
        if record.state == JobPhase.COMPLETED:
            sites = ", ".join(c.site for c in record.components)
            return Outcome(record.job_id, True, f"{where} completed on {sites}")
        detail = f": {record.message}" if record.message else ""
        return Outcome(record.job_id, False, f"{where} {record.state}{detail}")

    def _finished(self, handle: KoalaEngine) -> None:
        # Give the scan lease up now: other waiters should not sit out its expiry, and
        # cleanup() is not called everywhere (dag.test() skips it).
        handle.release_lease()

    def _cancel(self, handle: KoalaEngine) -> str:
        return f"{handle.cancel(self.job_id).state}"

    def _close(self, handle: KoalaEngine) -> None:
        close_koala(handle)
