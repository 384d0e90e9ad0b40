"""Waiting on a co-allocated job in Airflow's triggerer: drive KOALA's scans until it ends.

The KOALA engine has no daemon of its own: whoever waits on a co-allocated job also runs
the engine's scans (placement, staging, claiming, following the components). Any number
of triggers (and workers, in non-deferrable mode) may do so at once: the engine's scan
lease in the state database lets exactly one scan run at a time, the others skip.
"""

from __future__ import annotations

from gridcore.engine.coallocation import CoAllocationEngine, CoAllocationRecord
from gridcore.engine.phases import ComponentState, JobPhase
from gridcore.sites.output import OutputFiles, SiteJob
from gridcore_airflow.sensors.base import GridcoreTrigger, Outcome
from gridcore_airflow.sensors.connections import close_coallocation

# A component in these states writes nothing more.
_COMPONENT_ENDED = frozenset(
    {ComponentState.COMPLETED, ComponentState.FAILED, ComponentState.ABORTED}
)


class CoAllocationTrigger(GridcoreTrigger[CoAllocationEngine, CoAllocationRecord]):
    """Scan KOALA until co-allocated job ``job_id`` ends; yield exactly one event.

    ``CoAllocationTrigger(job_id, grid_file=None, db_url=None, poll_interval=1.0,
    max_retries=5, gridcore_conn_id=None)``: each poll is one ``CoAllocationEngine.scan``
    (skipped while another engine holds the scan lease) and ``CoAllocationEngine.status``;
    each component's new output lines go into the task log prefixed
    ``[component i @ site]``. See :class:`~sensors.base.GridcoreTrigger` for retries,
    errors, on_kill (cancels the job and its started components) and cleanup.
    """

    subject = "co-allocated job"
    id_field = "job_id"
    job_id: int
    default_poll_interval = 1.0
    poll_noun = "scans"

    def _connect(self) -> CoAllocationEngine:
        return self.location.open_coallocation(self.poll_interval, upgrade=False)

    def _poll(self, handle: CoAllocationEngine) -> CoAllocationRecord:
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

    def _output_jobs(self, record: CoAllocationRecord) -> list[SiteJob]:
        """Every component the sites have (a re-placed job: its current epoch's)."""
        return [
            SiteJob(
                c.site,
                c.site_job_id,
                f"component {c.index} @ {c.site}",
                finished=record.finished or c.state in _COMPONENT_ENDED,
                failed=c.state == ComponentState.FAILED,
            )
            for c in record.components
            if c.site_job_id is not None
        ]

    def _output_files(self, handle: CoAllocationEngine, site: str, job_id: str) -> OutputFiles:
        return handle.runtime.output_files(site, job_id)

    def _finished(self, handle: CoAllocationEngine) -> None:
        # Give the scan lease up now: other waiters should not sit out its expiry, and
        # cleanup() is not called everywhere (dag.test() skips it).
        handle.release_lease()

    def _cancel(self, handle: CoAllocationEngine) -> str:
        return f"{handle.cancel(self.job_id).state}"

    def _close(self, handle: CoAllocationEngine) -> None:
        close_coallocation(handle)
