"""Decide the sites of a burst of members at once: one snapshot, one transaction.

Members that arrive together (one mapped task expansion, one forcing event) are decided
by ONE :meth:`~gridcore.engine.runtime.GridRuntime.select_batch` call, each member in turn
seeing the ones before it in flight (Kueue's "snapshot, then admit"), instead of one
decision per member task racing the others. The members then run as
:class:`~operators.site_job.SiteJobOperator` tasks given ``selection_id=`` (they submit
the selection made here instead of selecting); :func:`with_selections` joins the
members' own arguments and this operator's result into their ``expand_kwargs`` rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException

from gridcore.engine.runtime import GridRuntime, JobRecord
from gridcore.errors import StateError
from gridcore.model import JobRequest
from gridcore.policies.selection import DEFAULT_PROTOCOL, InsufficientMode, SelectionProtocol
from gridcore.validation import check_choice, check_job_request, check_selection_stream
from gridcore_airflow.operators.base import GridcoreOperator, job_name, state_store, translated
from gridcore_airflow.operators.site_job import input_paths

SELECTIONS_KEY = "gridcore_burst_selection_ids"  # in the task state store, shared by all tries
DEFAULT_PROCESSORS = 1  # SiteJobOperator's defaults
RESULT_KEYS = ("name", "selection_id", "site", "processors", "outcome", "selected_at")


@dataclass(frozen=True)
class BurstPlan:
    """What one task instance will ask gridcore for, fully validated."""

    requests: tuple[JobRequest, ...]
    protocol: SelectionProtocol
    mode: InsufficientMode
    stream: str


class SelectSitesOperator(GridcoreOperator):
    """Decide a burst of members' sites in one decision; run them with SiteJobOperator.

    :param members: one mapping per member (templated; typically an upstream task's
        list), read for ``processors`` (default 1), ``runtime_s`` (default: unknown,
        as :class:`SiteJobOperator`'s), ``input_files`` (paths whose total size is the
        member's input) and ``name``.
        Other keys (the member task's own arguments, e.g. ``env``) are not read, so the
        member task's ``expand_kwargs`` rows can be given as they are.
    :param member_task_id: the mapped SiteJobOperator task that runs the members: member
        ``i`` is named as that task's map index ``i`` names its job, the name the member
        checks before it submits. A member's ``name`` overrides it (members of other
        tasks: :func:`~operators.site_job.job_name` of their dag, task and map index).
    :param protocol: ``earliest-completion`` (default) | ``stateful`` | ``naive`` |
        ``random``; the burst is decided member by member on one snapshot.
    :param insufficient_mode: ``best`` | ``random`` | ``earliest`` (the paper's
        protocols only).
    :param stream: selection stream (templated); default: the DAG id.

    ``grid_file``, ``db_url`` and ``gridcore_conn_id`` say where gridcore is
    (:class:`~operators.base.GridcoreOperator`).

    Returns (XCom) one ``{"name", "selection_id", "site", "processors", "outcome",
    "selected_at"}`` per member, in the order of ``members``.

    A malformed member fails the task without retries naming it and the field, and a
    member no site can run names it, before anything is written: the burst is decided
    whole or not at all. Tries of one task instance share the burst through Airflow's
    task state store: a retry (or a cleared task instance) returns the selections the
    first try made and never decides the burst a second time.
    """

    template_fields: Sequence[str] = ("members", "stream")
    ui_color = "#cfe2f3"

    def __init__(
        self,
        *,
        members: Sequence[Mapping[str, Any]] | Any,
        member_task_id: str = "member",
        protocol: str = DEFAULT_PROTOCOL.value,
        insufficient_mode: str = InsufficientMode.BEST.value,
        stream: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.members = members
        self.member_task_id = member_task_id
        self.protocol = protocol
        self.insufficient_mode = insufficient_mode
        self.stream = stream

    def execute(self, context: Context) -> list[dict[str, Any]]:
        burst = self.plan_burst(context)
        state = state_store(context)
        with translated(self.task_id), self.hook().runtime() as runtime:
            records = self._resume(runtime, state, burst)
            if records is None:
                records = self._decide(runtime, state, burst)
        return [selection_result(record) for record in records]

    def _decide(self, runtime: GridRuntime, state: Any, burst: BurstPlan) -> list[JobRecord]:
        records = runtime.select_batch(burst.requests, burst.protocol, burst.mode, burst.stream)
        if state is not None:
            # Persisted before any member can run, so a retry of this task returns this
            # burst instead of deciding (and claiming for) a second one.
            try:
                state.set(SELECTIONS_KEY, [record.selection_id for record in records])
            except Exception:
                for record in records:  # release their processors: nobody will run them
                    try:
                        runtime.cancel(record.selection_id)
                    except Exception:  # the rest still get released; expiry frees this one
                        self.log.exception("could not release selection %s", record.selection_id)
                raise
        per_site: dict[str, int] = {}
        for record in records:
            per_site[record.site] = per_site.get(record.site, 0) + 1
        self.log.info(
            "burst of %d decided in one transaction (%s): %s",
            len(records),
            burst.protocol.value,
            ", ".join(f"{site} {n}" for site, n in sorted(per_site.items())),
        )
        return records

    def _resume(self, runtime: GridRuntime, state: Any, burst: BurstPlan) -> list[JobRecord] | None:
        """The burst an earlier try of this task instance decided, whatever its members
        have done since (each member task follows its own selection). None when there is
        none, or it was made for other members (the upstream list changed)."""
        prior = state.get(SELECTIONS_KEY) if state is not None else None
        if not isinstance(prior, list) or not all(_is_id(sid) for sid in prior):
            return None
        try:
            records = runtime.records(prior)
        except StateError:
            return None  # a different state database than the earlier try used
        made_for = [(r.name, r.processors) for r in records]
        if made_for != [(r.name, r.processors) for r in burst.requests]:
            self.log.warning(
                "the burst of an earlier try (selections %s) was made for other members;"
                " deciding this one afresh",
                prior,
            )
            return None
        self.log.info("resuming the burst of an earlier try: selections %s", prior)
        return records

    # -- validation: everything is checked before anything is selected ------------------

    def plan_burst(self, context: Context) -> BurstPlan:
        """Validate the (rendered) arguments into a plan through gridcore's request
        models (:mod:`gridcore.validation`); AirflowFailException naming the member and
        the field otherwise. Touches nothing but the input files' metadata."""
        members = _member_list(self.members)
        requests = tuple(self._request(i, member) for i, member in enumerate(members))
        _refuse_duplicate_names(requests)
        stream = self.stream if self.stream else self.dag_id
        with translated(self.task_id):
            protocol = check_choice(SelectionProtocol, self.protocol, "protocol")
            mode = check_choice(InsufficientMode, self.insufficient_mode, "insufficient_mode")
            stream = check_selection_stream(str(stream))
        return BurstPlan(requests, protocol, mode, stream)

    def _request(self, index: int, member: Any) -> JobRequest:
        where = f"members[{index}]"
        if not isinstance(member, Mapping):
            raise AirflowFailException(
                f"{where}: must be a mapping of processors, runtime_s, input_files, name;"
                f" got {type(member).__name__}"
            )
        name = member.get("name", job_name(self.dag_id, self.member_task_id, index))
        try:
            inputs = input_paths(member.get("input_files"))
        except AirflowFailException as exc:
            raise AirflowFailException(f"{where}: {exc}") from exc
        with translated(where):
            return check_job_request(
                {
                    "name": name,
                    "processors": member.get("processors", DEFAULT_PROCESSORS),
                    "runtime_s": member.get("runtime_s"),
                    "input_bytes": sum(p.stat().st_size for p in inputs),
                }
            )


def with_selections(
    rows: Sequence[Mapping[str, Any]], selections: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Each member's own ``expand_kwargs`` row with its ``selection_id`` (from
    :class:`SelectSitesOperator`'s result over the same rows, in the same order)."""
    if len(rows) != len(selections):
        raise ValueError(f"{len(rows)} members but {len(selections)} selections")
    return [
        {**row, "selection_id": selection["selection_id"]}
        for row, selection in zip(rows, selections, strict=True)
    ]


def selection_result(record: JobRecord) -> dict[str, Any]:
    """One member's part of the XCom: plain JSON."""
    return {
        "name": record.name,
        "selection_id": record.selection_id,
        "site": record.site,
        "processors": record.processors,
        "outcome": record.outcome,
        "selected_at": record.selected_at,
    }


def _member_list(members: Any) -> Sequence[Any]:
    # A list, or the lazy sequence Airflow hands over for a mapped upstream's output.
    if isinstance(members, str | bytes | Mapping) or not isinstance(members, Sequence):
        raise AirflowFailException(
            f"members: must be a list of member mappings, got {type(members).__name__}"
        )
    return list(members)


def _refuse_duplicate_names(requests: Sequence[JobRequest]) -> None:
    """A member checks its selection by name: two members of one name could swap them."""
    first: dict[str, int] = {}
    for index, request in enumerate(requests):
        if request.name in first:
            raise AirflowFailException(
                f"members[{index}].name: {request.name!r} is also members[{first[request.name]}]'s"
            )
        first[request.name] = index


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
