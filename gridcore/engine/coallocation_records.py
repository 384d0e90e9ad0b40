"""Rows of the co-allocation tables <-> values: the stored request, the placement and
the job record handed to operators and the CLI.

Kept apart from the scan (:mod:`gridcore.engine.coallocation`) because the codecs are pure and
read by more than the engine: the Airflow layer returns :class:`CoAllocationRecord` as
XCom (plain JSON, :meth:`CoAllocationRecord.as_json`), and every scan step decodes the
request it stored at submission (KOALA 2005 Sec. 2.3-2.4: fixed, non-fixed and flexible
requests, with their input file).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import RowMapping

from gridcore.engine.phases import JobPhase
from gridcore.engine.submission import resources_at
from gridcore.model import (
    CoAllocationRequest,
    Component,
    FileDelivery,
    FlexibleOptions,
    GridSpec,
    InputFile,
    JobResources,
    Placement,
    Priority,
    RequestKind,
)


@dataclass(frozen=True)
class ComponentRecord:
    index: int
    size: int
    site: str
    file_site: str | None
    transfer_s: float
    state: str
    site_job_id: str | None
    host: str | None
    port: int | None
    claimed_at: float | None
    released_at: float | None
    finished_at: float | None
    exit_code: int | None
    message: str
    # what its site job asks of its site (JobResources.as_json): the request's over the
    # site's defaults; the request's alone when the grid is not known
    resources: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CoAllocationRecord:
    """A co-allocated job as the state DB knows it; plain JSON via :meth:`as_json`."""

    job_id: int
    name: str
    state: str
    policy: str
    priority: str
    epoch: int
    placement_tries: int
    claim_tries: int
    retries: int
    L: float
    jpt: float | None
    ftt: float | None
    jst: float | None
    jct: float | None
    submitted_at: float
    placed_at: float | None
    started_at: float | None
    finished_at: float | None
    message: str
    placement: dict[str, Any] | None = None
    components: tuple[ComponentRecord, ...] = ()
    # what the request asks of every component's site (JobResources.as_json)
    resources: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return JobPhase(self.state).finished

    @property
    def barrier_skew_s(self) -> float | None:
        """Spread of the components' barrier release times (None until all passed)."""
        released = [c.released_at for c in self.components]
        if not released or any(t is None for t in released):
            return None
        times = [t for t in released if t is not None]
        return max(times) - min(times)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["components"] = [asdict(c) for c in self.components]
        data["barrier_skew_s"] = self.barrier_skew_s
        return data


def job_record(
    row: RowMapping, parts: Sequence[RowMapping], grid: GridSpec | None = None
) -> CoAllocationRecord:
    """The record of a ``gc_coalloc_jobs`` row and its current epoch's component rows;
    with ``grid``, each component's resources over its site's defaults (as sent)."""
    asked = request_from_json(row["request"]).resources
    return CoAllocationRecord(
        row["id"],
        row["name"],
        row["state"],
        row["policy"],
        row["priority"],
        row["epoch"],
        row["placement_tries"],
        row["claim_tries"],
        row["retries"],
        row["L"],
        row["jpt"],
        row["ftt"],
        row["jst"],
        row["jct"],
        row["submitted_at"],
        row["placed_at"],
        row["started_at"],
        row["finished_at"],
        row["message"] or "",
        json.loads(row["placement"]) if row["placement"] else None,
        tuple(component_record(p, _sent(asked, p["site"], grid)) for p in parts),
        asked.as_json(),
    )


def _sent(asked: JobResources, site: str, grid: GridSpec | None) -> JobResources:
    if grid is None or site not in grid.site_names:
        return asked
    return resources_at(asked, grid.site(site))


def component_record(part: RowMapping, resources: JobResources | None = None) -> ComponentRecord:
    return ComponentRecord(
        part["idx"],
        part["size"],
        part["site"],
        part["file_site"],
        part["transfer_s"],
        part["state"],
        part["site_job_id"],
        part["host"],
        part["port"],
        part["claimed_at"],
        part["released_at"],
        part["finished_at"],
        part["exit_code"],
        part["message"] or "",
        {} if resources is None else resources.as_json(),
    )


def placement_to_json(placement: Placement) -> str:
    """The placement as stored in ``gc_coalloc_jobs.placement`` (and shown in records)."""
    return json.dumps(
        {
            "policy": placement.policy,
            "clusters_combined": placement.clusters_combined,
            "file_transfer_s": placement.file_transfer_s,
            "components": [asdict(c) for c in placement.components],
            "reasons": list(placement.reasons),
        }
    )


def request_to_json(request: CoAllocationRequest) -> str:
    """The request as one JSON object (enums by value); :func:`request_from_json` inverts."""
    data = asdict(request)
    data["resources"] = request.resources.as_json()
    return json.dumps(data)


def request_from_json(text: str) -> CoAllocationRequest:
    data = json.loads(text)
    flexible = data["flexible"]
    input_file = data["input_file"]
    return CoAllocationRequest(
        data["name"],
        RequestKind(data["kind"]),
        tuple(Component(c["size"], c["site"]) for c in data["components"]),
        data["total"],
        InputFile(input_file["logical_name"], FileDelivery(input_file["delivery"]))
        if input_file
        else None,
        Priority(data["priority"]),
        FlexibleOptions(
            flexible["min_component_size"],
            flexible["max_components"],
            tuple(tuple(split) for split in flexible["splits"]),
        ),
        # a job stored before requests carried resources has none
        JobResources.from_json(data.get("resources")),
    )
