"""Run one co-allocated job: components that start together, possibly on several sites.

The operator is thin: validate into a :class:`~gridcore.model.CoAllocationRequest`,
``CoAllocationEngine.submit`` through :class:`~operators.hooks.GridcoreHook` (the job joins its
placement queue), then defer (or, with the VJ center embedded in this worker, wait here) to
:class:`~sensors.triggers.EngineTrigger`, which drives KOALA's scans until the job ends;
the result is plain JSON for XCom. Everything but planning, submitting and the result is
the one job lifecycle (:class:`~operators.base.EngineJobOperator`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException

from gridcore.engine.coallocation import CoAllocationEngine
from gridcore.engine.coallocation_records import CoAllocationRecord
from gridcore.engine.phases import JobPhase
from gridcore.model import CoAllocationRequest, FileDelivery, Priority, RequestKind
from gridcore.policies.placement import PlacementPolicy
from gridcore.validation import check_choice, check_coallocation_submission
from gridcore_airflow.operators.base import (
    RESOURCE_FIELDS,
    EngineJobOperator,
    job_name,
    map_index,
    translated,
)
from gridcore_airflow.operators.hooks import EngineKind

JOB_KEY = "gridcore_coalloc_job_id"  # in the task state store, shared by all tries
# Per component, in component order (the order of ``components``).
_COMPONENT_KEYS = {
    "sites": "site",
    "sizes": "size",
    "file_sites": "file_site",
    "site_job_ids": "site_job_id",
    "start_times": "released_at",
    "resources": "resources",
}
_JOB_KEYS = (
    "job_id",
    "name",
    "state",
    "policy",
    "jpt",
    "jst",
    "started_at",
    "finished_at",
    "barrier_skew_s",
    "retries",
    "placement_tries",
    "claim_tries",
    "placement",
)


class CoAllocationPlan(NamedTuple):
    """A co-allocated job as validated: the request, its placement policy and quota."""

    request: CoAllocationRequest
    policy: PlacementPolicy
    quota: float | None

    @property
    def name(self) -> str:
        return self.request.name


class CoAllocationOperator(
    EngineJobOperator[CoAllocationEngine, CoAllocationRecord, CoAllocationPlan]
):
    """Run ``command`` as a co-allocated job placed by KOALA (KOALA 2005, KOALA 2006).

    Every component runs ``command`` after the start barrier, which releases them only
    once all have started; each sees ``GRIDCORE_COMPONENT`` (its index),
    ``GRIDCORE_COMPONENTS``, ``GRIDCORE_PEERS`` (a JSON file of every component's host
    and port) and ``GRIDCORE_LISTEN_FD`` (its data port, already listening). Slurm sites
    pass on PATH only: name programs by absolute path (``sys.executable``).

    :param command: shell command every component runs (templated).
    :param components: processors per component (fixed and non-fixed requests).
    :param total: processors in all (flexible requests: KOALA splits them).
    :param kind: ``non-fixed`` | ``fixed`` | ``flexible``.
    :param sites: one grid site per component (fixed requests only).
    :param policy: placement policy ``WF`` | ``CF`` | ``CM`` | ``FCM``.
    :param priority: placement queue, ``low`` | ``high``.
    :param input_file: logical name of the job's input file in the replica catalog.
    :param delivery: ``whole`` (every component reads it all) | ``chunked``.
    :param quota: at most this fraction of each cluster in use after placement, (0, 1].
    :param poll_interval: seconds between KOALA scans while waiting.
    :param deferrable: wait (and scan) in the triggerer instead of a worker slot. The
        components' barriers call the VJ center (connection ``extra.center_url`` or
        ``$GRIDCORE_CENTER_URL``); without one configured the center runs inside this
        worker and the operator waits here instead.

    ``time_limit``, ``account``, ``qos``, ``partition``, ``memory``, ``memory_per_cpu``,
    ``gpus`` and ``constraint`` (templated): what every component's site job asks of its
    site (:class:`~operators.base.GridcoreJobOperator`); the time limit covers the
    component's wait at the start barrier and the command. ``grid_file``, ``db_url`` and
    ``gridcore_conn_id`` say where gridcore is (:class:`~operators.base.GridcoreOperator`).

    Returns (XCom) the job as placed and run: ``sites``, ``sizes``, ``file_sites``,
    ``site_job_ids``, ``start_times`` (barrier release, epoch seconds) and ``resources``
    (what its site job asked of its site: the arguments over the site's defaults,
    :meth:`gridcore.model.JobResources.as_json`) per component,
    and ``job_id``, ``jpt``, ``jst``, ``started_at``, ``finished_at``,
    ``barrier_skew_s``, ``retries``, ``placement_tries``, ``claim_tries``, ``placement``,
    and ``output_files``: per component ``{"stdout", "stderr"}`` (paths at its site) or
    None. While the job runs, each component's new output lines go into the task log
    prefixed ``[component i @ site]``; a failed job's log ends with the stderr tails of
    its failed components.

    Tries of one task instance share the job through Airflow 3.3's task state store
    (:class:`~operators.base.JobLifecycleOperator`): a retry reattaches to a job still
    queued, placed or running, returns the result of one that completed, and submits
    afresh only after one that failed or was cancelled. (``retries`` in the result are
    KOALA's own: re-placements after a component failed.)
    """

    engine = EngineKind.COALLOCATION
    noun = "co-allocated job"
    state_key = JOB_KEY
    completed = JobPhase.COMPLETED

    template_fields: Sequence[str] = (
        "command",
        "components",
        "total",
        "kind",
        "sites",
        "policy",
        "priority",
        "input_file",
        *RESOURCE_FIELDS,
    )
    ui_color = "#cfe2f3"

    def __init__(
        self,
        *,
        command: str,
        components: list[int] | None = None,
        total: int | None = None,
        kind: str = RequestKind.NON_FIXED.value,
        sites: list[str] | None = None,
        policy: str = PlacementPolicy.CM.value,
        priority: str = Priority.LOW.value,
        input_file: str | None = None,
        delivery: str = FileDelivery.WHOLE.value,
        quota: float | None = None,
        poll_interval: float = 1.0,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.command = command
        self.components = components
        self.total = total
        self.kind = kind
        self.sites = sites
        self.policy = policy
        self.priority = priority
        self.input_file = input_file
        self.delivery = delivery
        self.quota = quota
        self.poll_interval = poll_interval
        self.deferrable = deferrable

    def plan(self, context: Context) -> CoAllocationPlan:
        return CoAllocationPlan(*self.plan_request(context))

    def submit(
        self, engine: CoAllocationEngine, state: Any, plan: CoAllocationPlan
    ) -> CoAllocationRecord:
        request = plan.request
        job_id = engine.submit(request, plan.policy, self.command, plan.quota)
        self.remember(engine, state, job_id)
        self.log.info(
            "co-allocated job %s: %s (%s, %s processors) queued for %s placement",
            job_id,
            request.name,
            request.kind.value,
            request.processors,
            plan.policy.value,
        )
        return self.status(engine, job_id)

    def result(
        self, context: Context, record: dict[str, Any], output: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return result_of(record, output)

    # -- validation: everything is checked before anything is written ------------------

    def plan_request(
        self, context: Context
    ) -> tuple[CoAllocationRequest, PlacementPolicy, float | None]:
        """Validate the (rendered) arguments through gridcore's request models
        (:mod:`gridcore.validation`); AirflowFailException naming the field otherwise.
        Touches nothing: the engine's own checks follow in ``submit``."""
        _positive_number("poll_interval", self.poll_interval)  # operator-only
        name = job_name(self.dag_id, self.task_id, map_index(context))
        request = {
            "name": name,
            "kind": self.kind,
            "components": self._components(),
            "total": 0 if self.total is None else self.total,
            "priority": self.priority,
        }
        with translated(name):  # nothing written yet
            request["resources"] = self.plan_resources()
            policy = check_choice(PlacementPolicy, self.policy, "policy")
            # Checked even without an input file: a misspelt option is an error.
            delivery = check_choice(FileDelivery, self.delivery, "delivery")
            if self.input_file is not None:
                request["input_file"] = {"logical_name": self.input_file, "delivery": delivery}
            checked, _, quota = check_coallocation_submission(request, self.command, self.quota)
        return checked, policy, quota

    def _components(self) -> Any:
        """``components`` (sizes) and ``sites`` (fixed requests) as the request's
        components; anything not list-shaped is left for the model to refuse."""
        sizes, sites = self.components, self.sites
        if isinstance(sizes, str | bytes) or not isinstance(sizes, Sequence | None):
            return sizes
        sizes = sizes or ()
        if sites is None:
            return [{"size": size} for size in sizes]
        # Operator-only: the two lists run in parallel (the model has one per component).
        if isinstance(sites, str) or not isinstance(sites, Sequence) or len(sites) != len(sizes):
            raise AirflowFailException(
                f"sites: one site per entry of components ({len(sizes)}), got {sites!r}"
            )
        return [{"size": size, "site": site} for size, site in zip(sizes, sites, strict=True)]


def result_of(record: dict[str, Any], output: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The XCom of a completed job, from its record (``CoAllocationRecord.as_json``) and
    the output files its event names (:func:`~sensors.base.output_files_of`)."""
    parts = record.get("components") or []
    result = {key: record.get(key) for key in _JOB_KEYS}
    for out, key in _COMPONENT_KEYS.items():
        result[out] = [part.get(key) for part in parts]
    result["output_files"] = _component_files(parts, output)
    return result


def _component_files(
    parts: Sequence[dict[str, Any]], output: Sequence[dict[str, Any]]
) -> list[dict[str, str] | None]:
    """Per component (in component order), where its output is, or None if not known."""
    by_job = {(o.get("site"), o.get("job_id")): o for o in output}
    files: list[dict[str, str] | None] = []
    for part in parts:
        found = by_job.get((part.get("site"), part.get("site_job_id")))
        files.append({"stdout": found["stdout"], "stderr": found["stderr"]} if found else None)
    return files


def _positive_number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise AirflowFailException(f"{field}: must be a number > 0, got {value!r}")
    return float(value)
