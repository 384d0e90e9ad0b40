"""Run one parallel program through pilots that co-reserve processors on several clusters
(VJM: virtual jobs that hold their processors until all have started).

The operator is thin: validate into a :class:`~gridcore.model.CoReservationRequest`,
``CoReservationEngine.submit`` (cluster selection by Eq. 1, pilots submitted) through
:class:`~operators.hooks.GridcoreHook`, then wait with
:class:`~sensors.triggers.EngineTrigger`, which drives the VJM scans (dispatch, lost
pilots, reorganization after the lifetime) until the job ends. Everything but planning,
submitting and the result is the one job lifecycle
(:class:`~operators.base.EngineJobOperator`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import Context

from gridcore.engine.coreservation import CoReservationEngine
from gridcore.engine.coreservation_records import ReservationRecord
from gridcore.engine.phases import ReservationPhase
from gridcore.model import CoReservationRequest
from gridcore.validation import check_coreservation_request
from gridcore_airflow.operators.base import (
    RESOURCE_FIELDS,
    EngineJobOperator,
    job_name,
    map_index,
    translated,
)
from gridcore_airflow.operators.hooks import EngineKind

JOB_KEY = "gridcore_coreserved_job_id"  # in the task state store, shared by all tries
_RESULT_KEYS = (
    "job_id",
    "name",
    "state",
    "clusters",
    "t_avail_s",
    "lifetime_s",
    "coallocation_s",
    "dispatch_skew_s",
    "shifts_received",
    "shifts_given",
    "substitutes",
    "reorganizations",
)


class CoReservationOperator(
    EngineJobOperator[CoReservationEngine, ReservationRecord, CoReservationRequest]
):
    """Run ``command`` on ``processors`` processors co-reserved by pilots (VJM).

    ``processors / vj_size`` pilots (virtual jobs of ``vj_size`` processors) go to the
    clusters with the smallest expected wait (VJM Eq. 1), over at most ``max_clusters``
    clusters; each holds its processors once its site starts it; when all hold, every
    pilot starts ``command`` at once with ``GRIDCORE_COMPONENT`` (its rank),
    ``GRIDCORE_COMPONENTS``, ``GRIDCORE_PEERS`` (a JSON file of every rank's host and
    port) and ``GRIDCORE_LISTEN_FD`` (its data port, listening): the same interface as
    :class:`~operators.coallocation.CoAllocationOperator`'s barrier. A job not started
    within its lifetime (Eq. 2, at least ``lifetime_floor_s``) is reorganized (held
    pilots shift between deadlocked jobs; slow clusters are released and substituted).

    :param command: shell command every rank runs (templated).
    :param processors: processors in all.
    :param vj_size: processors per pilot (g); ``processors`` is a multiple of it.
    :param max_clusters: at most this many clusters (M).
    :param lifetime_floor_s: the lifetime never below this (Eq. 2 is 0 on an idle grid).
    :param sites: candidate clusters (default: every site of the grid).
    :param machine_file: ``{site: pilots}`` pinned instead of selected (a static
        machine file, like MPICH-G2's); its pilots must sum to ``processors / vj_size``.
    :param workdir: where the ranks run (default: each pilot's job directory).
    :param poll_interval: seconds between VJM scans while waiting.
    :param deferrable: wait in the triggerer. Without a configured VJ center (connection
        ``extra.center_url`` or ``$GRIDCORE_CENTER_URL``) the center runs inside this
        worker and the operator waits here instead.

    ``time_limit``, ``account``, ``qos``, ``partition``, ``memory``, ``memory_per_cpu``,
    ``gpus`` and ``constraint`` (templated): what each pilot asks of its cluster
    (:class:`~operators.base.GridcoreJobOperator`); ``time_limit`` is the COMMAND's: each
    pilot asks for the reservation's lifetime (Eq. 2) plus it plus a margin (10 %, at
    least 5 minutes), since it holds its processors before the command starts.

    Returns (XCom): ``job_id``, ``state``, ``clusters`` (pilots per cluster),
    ``t_avail_s`` (Eq. 1 per virtual job, substitutes included), ``lifetime_s``,
    ``coallocation_s`` (submission to all held), ``dispatch_skew_s``,
    ``shifts_received``, ``shifts_given``, ``substitutes``, ``reorganizations``,
    ``site_job_ids``, ``sites``, ``output_files`` (``{"stdout", "stderr"}`` of the
    pilot's site job, which the command's output goes to, or None) and ``resources``
    (what the pilot's site job asked of its site, its computed time limit included,
    :meth:`gridcore.model.JobResources.as_json`) per rank. While the
    job runs, each rank's new output lines go into the task log prefixed
    ``[component i @ site]``; a failed job's log ends with the stderr tails of its
    failed ranks.

    Tries of one task instance share the job through Airflow 3.3's task state store
    (:class:`~operators.base.JobLifecycleOperator`).
    """

    engine = EngineKind.CORESERVATION
    noun = "co-reserved job"
    state_key = JOB_KEY
    completed = ReservationPhase.COMPLETED

    template_fields: Sequence[str] = (
        "command",
        "processors",
        "vj_size",
        "max_clusters",
        "sites",
        "machine_file",
        *RESOURCE_FIELDS,
    )
    ui_color = "#d9ead3"

    def __init__(
        self,
        *,
        command: str,
        processors: int,
        vj_size: int = 1,
        max_clusters: int = 4,
        lifetime_floor_s: float = 60.0,
        sites: list[str] | None = None,
        machine_file: dict[str, int] | None = None,
        workdir: str | None = None,
        poll_interval: float = 1.0,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.command = command
        self.processors = processors
        self.vj_size = vj_size
        self.max_clusters = max_clusters
        self.lifetime_floor_s = lifetime_floor_s
        self.sites = sites
        self.machine_file = machine_file
        self.workdir = workdir
        self.poll_interval = poll_interval
        self.deferrable = deferrable

    def plan(self, context: Context) -> CoReservationRequest:
        return self.plan_request(context)

    def submit(
        self, engine: CoReservationEngine, state: Any, request: CoReservationRequest
    ) -> ReservationRecord:
        job_id = engine.submit(request)
        self.remember(engine, state, job_id)
        record = engine.status(job_id)
        self.log.info(
            "co-reserved job %s: %s (%s processors in %s pilots) on %s, lifetime %.0f s",
            job_id,
            request.name,
            request.processors,
            request.virtual_jobs,
            record.clusters,
            record.lifetime_s or 0.0,
        )
        return record

    def result(
        self, context: Context, record: dict[str, Any], output: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return result_of(record, output)

    def plan_request(self, context: Context) -> CoReservationRequest:
        """Validate the rendered arguments through gridcore's request model;
        AirflowFailException naming the field otherwise. Touches nothing."""
        name = job_name(self.dag_id, self.task_id, map_index(context))
        with translated(name):
            resources = self.plan_resources()
            return check_coreservation_request(
                {
                    "name": name,
                    "command": self.command,
                    "processors": self.processors,
                    "vj_size": self.vj_size,
                    "max_clusters": self.max_clusters,
                    "lifetime_floor_s": self.lifetime_floor_s,
                    "sites": self.sites,
                    "machine_file": self.machine_file,
                    "workdir": self.workdir,
                    "resources": resources,
                }
            )


def result_of(record: dict[str, Any], output: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The XCom of a completed job from its record (``ReservationRecord.as_json``) and
    the output files its event names (:func:`~sensors.base.output_files_of`)."""
    result = {key: record.get(key) for key in _RESULT_KEYS}
    ranks = sorted(
        (p for p in record.get("pilots") or [] if p.get("component") is not None),
        key=lambda p: p["component"],
    )
    result["sites"] = [p["site"] for p in ranks]
    result["site_job_ids"] = [p["site_job_id"] for p in ranks]
    result["resources"] = [p.get("resources") or {} for p in ranks]
    by_job = {(o.get("site"), o.get("job_id")): o for o in output}
    found = [by_job.get((p["site"], p["site_job_id"])) for p in ranks]
    result["output_files"] = [
        {"stdout": f["stdout"], "stderr": f["stderr"]} if f else None for f in found
    ]
    return result
