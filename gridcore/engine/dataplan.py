"""Running a storage plan on a live site: batch volumes staged and evicted, pipelines'
jobs submitted at the plan's concurrency, every volume a holder of bytes in THE capacity
ledger, so the site's storage is never exceeded.

Design, equations and the choices where a paper is ambiguous: ``docs/dataplan.md``
(section ``gridcore/engine/dataplan.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sqlalchemy import select

from gridcore.dataplan.format import DepthSpec, PipelineInput, PipelineSpec
from gridcore.engine.runtime import GridRuntime, JobRecord
from gridcore.engine.submission import resources_at
from gridcore.errors import ConfigError, GridError, RequestError, StagingError
from gridcore.model import (
    MB,
    NO_RESOURCES,
    ORIGIN,
    GridSpec,
    JobRequest,
    JobResources,
    JobState,
    JobSubmission,
    Replica,
)
from gridcore.policies.dataplan import DataPlan, Strategy
from gridcore.policies.dataplan_stages import Stage, StageKind, plan_stages
from gridcore.sites.output import JobOutputs, SiteJob, failure_tails
from gridcore.staging import (
    ReplicaCatalog,
    Throttle,
    register_source,
    site_storage_root,
    stage_measured,
)
from gridcore.state import capacity
from gridcore.state.schema import selections

log = logging.getLogger(__name__)

POLL_S = 0.25
ROOM_WAIT_S = 3600.0  # a job whose output never fits fails after this long
RESTARTS_MAX = 3  # a pipeline whose data keeps vanishing fails after this many restarts
STREAM_PREFIX = "dataplan:"
MIN_RUNTIME_SAMPLES = 3  # a depth's runtime is refined from this many completed jobs
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def run_id_from(text: str) -> str:
    """A valid run id made from any text (an Airflow dag id + run id): unsafe characters
    become ``_``, at most 64 characters (a long text keeps its end, where ids differ)."""
    safe = _UNSAFE.sub("_", text).strip("_.-") or "run"
    return safe[-64:].lstrip("_.-") or "run"


@dataclass(frozen=True)
class PipelineRun:
    """One execution of ``spec`` under ``strategy`` at ``site``: its ``stages`` (from
    :func:`~gridcore.policies.dataplan_stages.plan_stages`), where final outputs go, the
    WAN rate emulated (None: none) and ``resources`` every job asks for over what the
    pipeline file asks (an operator's, like sbatch's command line over ``#SBATCH``)."""

    run_id: str
    spec: PipelineSpec
    site: str
    strategy: Strategy
    stages: tuple[Stage, ...]
    home_dir: str
    wan_mbps: float | None = None
    resources: JobResources = NO_RESOURCES

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not _RUN_ID.fullmatch(self.run_id):
            raise ConfigError(
                f"run_id: 1-64 of A-Z a-z 0-9 _ . -, first a letter or digit, got {self.run_id!r}"
            )
        if self.wan_mbps is not None and not (self.wan_mbps > 0):
            raise ConfigError(f"wan_mbps: must be > 0 MB/s or None, got {self.wan_mbps!r}")

    @property
    def stream(self) -> str:
        return STREAM_PREFIX + self.run_id


@dataclass(frozen=True)
class StageTime:
    name: str
    kind: str
    seconds: float


@dataclass(frozen=True)
class RunReport:
    """What one run did: its makespan, each stage's time, jobs run (and re-run after lost
    data), batch volumes staged, and the largest number of bytes the ledger held at the
    site while it ran (sampled at every step)."""

    run_id: str
    site: str
    strategy: Strategy
    makespan_s: float
    stages: tuple[StageTime, ...]
    jobs: int
    restarts: int
    batch_stagings: int
    peak_held_bytes: int

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "site": self.site,
            "strategy": self.strategy.value,
            "makespan_s": round(self.makespan_s, 3),
            "stages": [
                {"name": s.name, "kind": s.kind, "seconds": round(s.seconds, 3)}
                for s in self.stages
            ],
            "jobs": self.jobs,
            "restarts": self.restarts,
            "batch_stagings": self.batch_stagings,
            "peak_held_bytes": self.peak_held_bytes,
        }


@dataclass
class _Counts:
    jobs: int = 0
    restarts: int = 0
    batch_stagings: int = 0
    peak_held_bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class PipelineJobFailed(GridError):
    """A pipeline's job failed at its site (or broke its declared output size)."""


class DataPlanRunner:
    """Executes a :class:`PipelineRun` against one state store and grid. Thread-safe:
    a JOBS stage runs its pipelines in threads, each with its own :class:`GridRuntime`."""

    def __init__(
        self,
        grid: GridSpec,
        runtime_factory: Callable[[], GridRuntime],
        run: PipelineRun,
        *,
        poll_s: float = POLL_S,
        room_wait_s: float = ROOM_WAIT_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.grid = grid
        self.run_spec = run
        self.runtime_factory = runtime_factory
        self.poll_s = poll_s
        self.room_wait_s = room_wait_s
        self.sleep = sleep
        self._local = threading.local()
        self._counts = _Counts()
        spec = grid.site(run.site)
        if run.strategy is Strategy.REMOTE:
            raise ConfigError(
                "strategy: Remote is not run on a live site (gridcore.engine.dataplan)"
            )
        if spec.storage_bytes is None:
            raise ConfigError(
                f"site {run.site}: a data plan needs the site's storage_gb in the grid file"
            )
        self.root = Path(site_storage_root(spec))

    # -- plumbing -------------------------------------------------------------------------

    @property
    def runtime(self) -> GridRuntime:
        found: GridRuntime | None = getattr(self._local, "runtime", None)
        if found is None:
            found = self.runtime_factory()
            self._local.runtime = found
        return found

    @property
    def catalog(self) -> ReplicaCatalog:
        return ReplicaCatalog(self.runtime.store)

    def _throttle(self) -> Throttle | None:
        rate = self.run_spec.wan_mbps
        return Throttle(rate) if rate is not None else None

    def _sample_held(self) -> None:
        with self.runtime.store.begin() as conn:
            held = capacity.usage(conn)[self.run_spec.site].storage_claimed
        with self._counts.lock:
            self._counts.peak_held_bytes = max(self._counts.peak_held_bytes, held)

    # -- names ----------------------------------------------------------------------------

    def private_name(self, pipeline: int, volume: int) -> str:
        """The logical name of ``pipeline``'s private volume ``volume`` (0: its input,
        ``d + 1``: the output of its job at depth ``d``)."""
        if volume == 0:
            return self.input_name(pipeline)
        name = self.run_spec.spec.pipelines[pipeline].name
        return f"dataplan/{self.run_spec.run_id}/{name}/v{volume}"

    def input_name(self, pipeline: int) -> str:
        given = self.run_spec.spec.pipelines[pipeline]
        if given.logical_name is not None:
            return given.logical_name
        return f"dataplan/{self.run_spec.spec.name}/inputs/{given.name}"

    def private_path(self, pipeline: int, volume: int) -> Path:
        return (
            self.root / "dataplan" / self.private_name(pipeline, volume).removeprefix("dataplan/")
        )

    def home_path(self, pipeline: int) -> Path:
        spec = self.run_spec.spec
        return Path(self.run_spec.home_dir) / spec.pipelines[pipeline].name / spec.depths[-1].name

    # -- preparation ----------------------------------------------------------------------

    def prepare(self) -> None:
        """Check, before anything is staged or submitted, that every batch volume and
        input is known (registering inputs given by path at the origin); RequestError
        names the first that is not."""
        catalog = self.catalog
        for depth in self.run_spec.spec.depths:
            if depth.batch is not None:
                catalog.require(depth.batch.logical_name)
        for index, given in enumerate(self.run_spec.spec.pipelines):
            self._register_input(catalog, index, given)

    def _register_input(self, catalog: ReplicaCatalog, index: int, given: PipelineInput) -> None:
        if given.logical_name is not None:
            catalog.require(given.logical_name)
            return
        name = self.input_name(index)
        if catalog.replica(name, ORIGIN) is None:
            if not Path(str(given.path)).is_file():
                raise RequestError(f"pipelines[{index}].path: no file {given.path!r}")
            register_source(catalog, name, ORIGIN, str(given.path))

    # -- batch volumes ----------------------------------------------------------------------

    def fetch_batch(self, depth: int) -> None:
        """Stage depth ``depth``'s batch volume to the site (nothing if it is there and
        whole)."""
        batch = self.run_spec.spec.depths[depth].batch
        if batch is None:
            return
        self._ensure_replica(batch.logical_name, batch=True)

    def evict_batch(self, depth: int) -> None:
        """Delete depth ``depth``'s batch volume from the site and release its bytes."""
        batch = self.run_spec.spec.depths[depth].batch
        if batch is not None:
            self._evict(batch.logical_name)

    def batch_path(self, depth: int) -> str:
        batch = self.run_spec.spec.depths[depth].batch
        if batch is None:
            return ""
        return _local_path(self._ensure_replica(batch.logical_name, batch=True).url)

    def _ensure_replica(self, logical_name: str, *, batch: bool = False) -> Replica:
        """The replica at the site, staged (again) when it is missing or its file is gone
        or of another size (an evicted or damaged volume)."""
        catalog, site = self.catalog, self.run_spec.site
        found = catalog.replica(logical_name, site)
        if found is not None and _file_size(found.url) == found.size_bytes:
            return found
        if found is not None:
            log.warning("replica %s at %s is gone or damaged: staging it again", logical_name, site)
            self._delete(found.url)
            catalog.remove(logical_name, site)
        source = catalog.require(logical_name)[0]
        self._claim_volumes(((logical_name, source.size_bytes),), f"staging {logical_name!r}")
        try:
            staged = stage_measured(
                catalog, self.grid, logical_name, site, progress=self._throttle()
            )
        except Exception:
            # every source failed: the room held for the copy goes back (a process that
            # dies here keeps it held, and its resumption stages into it)
            if catalog.replica(logical_name, site) is None:
                catalog.remove(logical_name, site)  # releases the hold
            raise
        with self._counts.lock:
            self._counts.batch_stagings += 1 if batch and not staged.skipped else 0
        self._sample_held()
        return staged.replica

    def _evict(self, logical_name: str) -> None:
        """Delete the volume's file, then forget its replica and release its bytes (the
        catalog does both in one transaction, replica or not)."""
        catalog, site = self.catalog, self.run_spec.site
        found = catalog.replica(logical_name, site)
        if found is not None:
            self._delete(found.url)
        catalog.remove(logical_name, site)

    def _delete(self, url: str) -> None:
        """Delete a volume's file, only inside the site's storage (``self.root``): a file
        that, its symbolic links resolved, lies elsewhere (a replica registered at the
        site outside its storage, a link planted in it) is left alone and logged. The
        plan's own paths are built inside the storage from checked names; this is the
        last check before a deletion, whatever the catalog says (docs/dataplan.md)."""
        path = _local_path(url)
        outside = _outside_storage(path, self.root)
        if outside is not None:
            log.error(
                "not deleting %s: %s, outside the storage of site %s (%s)",
                path,
                outside,
                self.run_spec.site,
                self.root,
            )
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    # -- pipelines ----------------------------------------------------------------------------

    def run_pipeline(self, pipeline: int, depths: Sequence[int]) -> None:
        """Run ``pipeline``'s jobs at ``depths`` in order, resuming at the last one done
        (whose output survives); a pipeline whose private input was lost starts again
        from depth 0, when this stage runs it (``depths`` from 0)."""
        restarts = 0
        depths = list(depths)
        while True:
            done = [d for d in depths if self._done(pipeline, d)]
            # the jobs before the last one done need nothing more: their outputs were
            # consumed (a job's input is evicted once it has completed)
            todo = depths[depths.index(done[-1]) :] if done else depths
            try:
                for depth in todo:
                    self.run_job(pipeline, depth)
                return
            except _LostInput as lost:
                restarts += 1
                with self._counts.lock:
                    self._counts.restarts += 1
                if restarts > RESTARTS_MAX or depths[0] != 0:
                    # a slice (one depth per stage) cannot go back to depth 0 by itself
                    raise PipelineJobFailed(
                        f"pipeline {self._pname(pipeline)}: {lost} (restarted {restarts - 1}"
                        " time(s))"
                    ) from None
                log.warning("pipeline %s: %s: starting it again", self._pname(pipeline), lost)
                self._forget(pipeline)

    def run_job(self, pipeline: int, depth: int) -> None:
        """Run job ``(pipeline, depth)`` once: hold its input's and output's bytes, stage
        its input and batch volume, submit it, wait, check and register its output,
        evict its input (and at the last depth write the output home)."""
        if self._done(pipeline, depth):
            if not (depth == self.run_spec.spec.D - 1 and self.home_path(pipeline).is_file()):
                self._register_output(pipeline, depth)
            self._after_job(pipeline, depth)
            return
        input_path = self._input_path(pipeline, depth) if depth > 0 else None
        self._claim_room(pipeline, depth)
        if input_path is None:
            input_path = self._input_path(pipeline, depth)  # staged into the room held
        record = self._latest(pipeline, depth)
        if record is None or record.finished or record.job_id is None:
            # none yet, or one that ended without a surviving output: a new job; one
            # selected but not yet submitted (a process killed in between): submit it,
            # under its key, so the site returns the job it may have started already
            record = self._submit(pipeline, depth, input_path, record)
        record = self._wait(record)
        if record.state != JobState.COMPLETED.value:
            self._drop_output(pipeline, depth)
            raise PipelineJobFailed(
                f"job {record.name} at {record.site} ended {record.state}"
                f" (exit {record.exit_code}): {record.message}"
            )
        self._register_output(pipeline, depth)
        self._after_job(pipeline, depth)

    def output_files(
        self, pipeline: int, depths: Sequence[int]
    ) -> dict[str, dict[str, str] | None]:
        """Job name -> where the latest job of ``pipeline`` at each of ``depths`` wrote its
        stdout and stderr (None: no job yet, or its site forgot it)."""
        found: dict[str, dict[str, str] | None] = {}
        for depth in depths:
            record = self._latest(pipeline, depth)
            files = None
            if record is not None and record.job_id is not None:
                with contextlib.suppress(GridError):
                    files = self.runtime.output_files(record.site, record.job_id).as_json()
            found[self._job_name(pipeline, depth)] = files
        return found

    def job_resources(self, depth: int) -> JobResources:
        """What a job at ``depth`` asks of the run's site, as submitted: the run's
        resources over the pipeline file's for the depth over the site's defaults."""
        run = self.run_spec
        asked = run.resources.over(run.spec.job_resources(depth))
        return resources_at(asked, self.grid.site(run.site))

    def sent_resources(self, pipeline: int, depths: Sequence[int]) -> dict[str, dict[str, Any]]:
        """Job name -> what ``pipeline``'s job at each of ``depths`` asks of the site
        (:meth:`job_resources` as plain JSON)."""
        return {self._job_name(pipeline, d): self.job_resources(d).as_json() for d in depths}

    def _pname(self, pipeline: int) -> str:
        return self.run_spec.spec.pipelines[pipeline].name

    def _job_name(self, pipeline: int, depth: int) -> str:
        return f"{self._pname(pipeline)}/{self.run_spec.spec.depths[depth].name}"

    def _latest(self, pipeline: int, depth: int) -> JobRecord | None:
        with self.runtime.store.begin() as conn:
            sid = conn.execute(
                select(selections.c.id)
                .where(
                    (selections.c.stream == self.run_spec.stream)
                    & (selections.c.name == self._job_name(pipeline, depth))
                )
                .order_by(selections.c.id.desc())
                .limit(1)
            ).scalar_one_or_none()
        return None if sid is None else self.runtime.record(int(sid))

    def _done(self, pipeline: int, depth: int) -> bool:
        """The job completed and its output survives (at the site, or at home)."""
        record = self._latest(pipeline, depth)
        if record is None or record.state != JobState.COMPLETED.value:
            return False
        if depth == self.run_spec.spec.D - 1 and self.home_path(pipeline).is_file():
            return True
        output = self.private_path(pipeline, depth + 1)
        declared = self.run_spec.spec.depths[depth].output_bytes
        return output.is_file() and output.stat().st_size <= declared

    def _claim_room(self, pipeline: int, depth: int) -> None:
        """Hold the job's output (and, at depth 0, its input) bytes, together."""
        wanted = [
            (self.private_name(pipeline, depth + 1), self.run_spec.spec.depths[depth].output_bytes)
        ]
        if depth == 0:
            name = self.input_name(pipeline)
            if self.catalog.replica(name, self.run_spec.site) is None:
                wanted.append((name, self.catalog.require(name)[0].size_bytes))
        self._claim_volumes(tuple(wanted), f"job {self._job_name(pipeline, depth)}")

    def _claim_volumes(self, wanted: tuple[tuple[str, int], ...], what: str) -> None:
        """Hold every ``(logical name, bytes)`` of ``wanted`` at the site in ONE
        transaction, or none: while they do not fit, wait (others release theirs). Held
        already: kept (a step run again)."""
        site = self.run_spec.site
        deadline = time.monotonic() + self.room_wait_s
        while True:
            try:
                with self.runtime.store.begin() as conn:
                    for name, nbytes in wanted:
                        holder = capacity.volume_holder(name, site)
                        held = capacity.hold(conn, capacity.HolderKind.VOLUME, holder)
                        if held is not None and held.ledger is not None:
                            continue
                        if not capacity.claim(
                            conn, capacity.HolderKind.VOLUME, holder, site, 0, nbytes
                        ):
                            raise _NoRoom  # rolls back the claims made above
                break
            except _NoRoom:
                if time.monotonic() > deadline:
                    total = sum(n for _, n in wanted)
                    raise PipelineJobFailed(
                        f"{what}: {total} bytes did not fit the storage of {site}"
                        f" within {self.room_wait_s} s"
                    ) from None
                self.sleep(self.poll_s)
        self._sample_held()

    def _input_path(self, pipeline: int, depth: int) -> str:
        if depth == 0:
            return _local_path(self._ensure_replica(self.input_name(pipeline)).url)
        path = self.private_path(pipeline, depth)
        if self.catalog.replica(self.private_name(pipeline, depth), self.run_spec.site) is None:
            raise _LostInput(f"the input of {self._job_name(pipeline, depth)} is gone")
        if not path.is_file():
            self._evict(self.private_name(pipeline, depth))
            raise _LostInput(f"the input of {self._job_name(pipeline, depth)} is gone")
        return str(path)

    def _submit(
        self, pipeline: int, depth: int, input_path: str, unsubmitted: JobRecord | None
    ) -> JobRecord:
        spec, run = self.run_spec.spec, self.run_spec
        job = spec.depths[depth]
        output = self.private_path(pipeline, depth + 1)
        output.parent.mkdir(parents=True, exist_ok=True)
        command = job.command_for(
            pipeline=self._pname(pipeline),
            depth=depth,
            input_path=input_path,
            output_path=str(output),
            batch_path=self.batch_path(depth),
        )
        name = self._job_name(pipeline, depth)
        if unsubmitted is not None and not unsubmitted.finished:
            selection_id = unsubmitted.selection_id
        else:
            request = JobRequest(
                name, 1, runtime_s=job.runtime_mean_s, output_bytes=job.output_bytes
            )
            selection_id = self.runtime.select(
                request, stream=run.stream, site=run.site
            ).selection_id
        with self._counts.lock:
            self._counts.jobs += 1
        submission = JobSubmission(
            name, command, 1, workdir=str(output.parent), resources=self.job_resources(depth)
        )
        return self.runtime.submit(selection_id, submission)

    def _wait(self, record: JobRecord) -> JobRecord:
        """Poll the job until it ends. Its new output lines go to this module's log at
        every poll (in an Airflow task: the task's log), prefixed by the job's name and
        site; a job that did not complete has its stderr tail logged after them
        (:mod:`gridcore.sites.output`)."""
        outputs = JobOutputs(self.runtime.output_files)
        while True:
            for line in outputs.read(_output_jobs(record)):
                log.info("%s", line)
            if record.finished:
                break
            self.sleep(self.poll_s)
            record = self.runtime.poll(record.selection_id)
        if record.state != JobState.COMPLETED.value:
            for line in failure_tails(outputs.as_json()):
                log.error("%s", line)
        return record

    def _register_output(self, pipeline: int, depth: int) -> None:
        output = self.private_path(pipeline, depth + 1)
        declared = self.run_spec.spec.depths[depth].output_bytes
        size = output.stat().st_size if output.is_file() else None
        if size is None or size > declared:
            self._drop_output(pipeline, depth)
            what = "wrote no output" if size is None else f"wrote {size} bytes"
            raise PipelineJobFailed(
                f"job {self._job_name(pipeline, depth)} {what}: depths[{depth}].output_bytes"
                f" declares {declared} bytes"
            )
        name = self.private_name(pipeline, depth + 1)
        if self.catalog.replica(name, self.run_spec.site) is None:
            register_source(self.catalog, name, self.run_spec.site, str(output))

    def _after_job(self, pipeline: int, depth: int) -> None:
        """Evict the job's input; at the last depth write the output home and evict it."""
        self._evict(self.private_name(pipeline, depth))
        if depth == self.run_spec.spec.D - 1:
            home = self.home_path(pipeline)
            if not home.is_file():
                _copy_home(self.private_path(pipeline, depth + 1), home, self._throttle())
            self._evict(self.private_name(pipeline, depth + 1))
        self._sample_held()

    def _drop_output(self, pipeline: int, depth: int) -> None:
        output = self.private_path(pipeline, depth + 1)
        self._delete(str(output))
        self._evict(self.private_name(pipeline, depth + 1))

    def _forget(self, pipeline: int) -> None:
        """Drop what is left of ``pipeline``'s outputs (before it starts again); its
        jobs' selections stay as they ended, and :meth:`_done` then finds no output."""
        for volume in range(1, self.run_spec.spec.D + 1):
            self._evict(self.private_name(pipeline, volume))
            self._delete(str(self.private_path(pipeline, volume)))

    # -- stages and runs --------------------------------------------------------------------

    def run_stage(self, stage: Stage) -> None:
        if stage.kind is StageKind.FETCH:
            for depth in stage.depths:
                self.fetch_batch(depth)
        elif stage.kind is StageKind.EVICT:
            for depth in stage.depths:
                self.evict_batch(depth)
        else:
            with ThreadPoolExecutor(max_workers=stage.concurrency) as pool:
                futures = [pool.submit(self.run_pipeline, p, stage.depths) for p in stage.pipelines]
                for future in futures:
                    future.result()

    def first_stage_to_run(self) -> int:
        """Where a run resumes: at the last jobs stage that has begun (one of its jobs
        was selected). Stages run in order, so every stage before it had ended; running
        them again would fetch batch volumes already evicted (crossing the WAN again, and
        possibly waiting for ever for room the later stages' outputs hold)."""
        stages = self.run_spec.stages
        with self.runtime.store.begin() as conn:
            begun = {
                str(name)
                for name in conn.execute(
                    select(selections.c.name).where(selections.c.stream == self.run_spec.stream)
                ).scalars()
            }
        for index in range(len(stages) - 1, -1, -1):
            stage = stages[index]
            if stage.kind is StageKind.JOBS and any(
                self._job_name(p, d) in begun for p in stage.pipelines for d in stage.depths
            ):
                return index
        return 0

    def run(self) -> RunReport:
        """Every stage in order, from where an earlier (killed) run of the same id got;
        a report of the run."""
        self.prepare()
        begun = time.monotonic()
        times = []
        for stage in self.run_spec.stages[self.first_stage_to_run() :]:
            t0 = time.monotonic()
            self.run_stage(stage)
            times.append(StageTime(stage.name, stage.kind.value, time.monotonic() - t0))
        c = self._counts
        return RunReport(
            self.run_spec.run_id,
            self.run_spec.site,
            self.run_spec.strategy,
            time.monotonic() - begun,
            tuple(times),
            c.jobs,
            c.restarts,
            c.batch_stagings,
            c.peak_held_bytes,
        )


class _LostInput(Exception):
    pass


class _NoRoom(Exception):
    pass


def build_run(
    spec: PipelineSpec,
    grid: GridSpec,
    site: str,
    plan: DataPlan,
    *,
    run_id: str,
    home_dir: str,
    strategy: Strategy | None = None,
    wan_mbps: float | None = None,
    resources: JobResources = NO_RESOURCES,
) -> PipelineRun:
    """The run of ``plan`` (its pick, or ``strategy`` at the concurrency the plan
    predicted it with) for ``spec`` at ``site``: its stages
    (:func:`~gridcore.policies.dataplan_stages.plan_stages`). A Minimal pick of a chooser
    that widened its groups (``group_width``) keeps that width."""
    chosen = plan.strategy if strategy is None else strategy
    if chosen not in plan.feasible:
        feasible = ", ".join(s.value for s in plan.feasible)
        raise ConfigError(
            f"strategy: {chosen.value} is not feasible at site {site} (feasible: {feasible})"
        )
    concurrency, width = stage_parameters(plan, chosen)
    stages = stages_at_site(spec, grid, site, chosen, concurrency=concurrency, group_width=width)
    return PipelineRun(run_id, spec, site, chosen, stages, home_dir, wan_mbps, resources)


def stage_parameters(plan: DataPlan, chosen: Strategy) -> tuple[float, int | None]:
    """How ``plan`` runs ``chosen``: the concurrency it was predicted with, and the group
    width a chooser that widened Minimal's groups picked (only for its own pick)."""
    prediction = plan.prediction(chosen)
    concurrency = prediction.concurrency if prediction is not None else plan.concurrency
    width = getattr(plan, "group_width", None) if chosen is plan.strategy else None
    return concurrency, width


def stages_at_site(
    spec: PipelineSpec,
    grid: GridSpec,
    site: str,
    strategy: Strategy,
    *,
    concurrency: float,
    group_width: int | None = None,
) -> tuple[Stage, ...]:
    """The stages of ``strategy`` for ``spec`` on ``site``'s processors
    (:func:`~gridcore.policies.dataplan_stages.plan_stages`): ``concurrency`` the plan's
    ``C``, ``group_width`` Minimal's widened groups (ignored by the other strategies);
    depths without a batch volume fetch nothing."""
    return plan_stages(
        strategy,
        W=spec.W,
        D=spec.D,
        N_CPU=grid.site(site).processors,
        concurrency=concurrency,
        group_width=group_width if strategy is Strategy.MINIMAL else None,
        batch_depths=[d for d, depth in enumerate(spec.depths) if depth.batch is not None],
    )


@dataclass(frozen=True)
class Refinement:
    """What earlier runs measured, to plan with: ``spec`` with each depth's runtime mean
    and sd replaced by the measured ones (normalized to a reference site: divided by the
    slowness of the site each job ran at), ``measured`` per site the environment values
    observed (``BW_R`` from the replica catalog's mean rate from the origin), and
    ``notes`` saying what was refined from how many samples."""

    spec: PipelineSpec
    measured: Mapping[str, Mapping[str, float]]
    notes: tuple[str, ...]


def refine_from_runs(spec: PipelineSpec, grid: GridSpec, store: Any) -> Refinement:
    """Refine ``spec``'s runtimes and each site's ``BW_R`` with what the state database
    measured: the completed jobs of earlier runs of a pipeline with the same depth and
    pipeline names (selections in ``dataplan:*`` streams named ``<pipeline>/<depth>``;
    their site's runtime from start to end) and the transfer rates staging recorded
    from the origin. A depth with fewer than :data:`MIN_RUNTIME_SAMPLES` samples keeps
    its estimate; its sd is refined only with 2 or more."""
    slowness = {site.name: site.slowness for site in grid.sites}
    wanted = {p.name for p in spec.pipelines}
    samples: dict[str, list[float]] = {d.name: [] for d in spec.depths}
    with store.begin() as conn:
        rows = conn.execute(
            select(
                selections.c.name,
                selections.c.site,
                selections.c.started_at,
                selections.c.finished_at,
            ).where(
                selections.c.stream.like(STREAM_PREFIX + "%")
                & (selections.c.state == JobState.COMPLETED.value)
                & selections.c.started_at.is_not(None)
                & selections.c.finished_at.is_not(None)
            )
        ).all()
    for row in rows:
        pipeline, _, depth_name = str(row.name).rpartition("/")
        if pipeline in wanted and depth_name in samples and row.site in slowness:
            elapsed = max(0.0, float(row.finished_at) - float(row.started_at))
            samples[depth_name].append(elapsed / slowness[row.site])
    depths: list[DepthSpec] = []
    notes: list[str] = []
    for depth in spec.depths:
        got = samples[depth.name]
        if len(got) < MIN_RUNTIME_SAMPLES:
            depths.append(depth)
            continue
        mean = statistics.fmean(got)
        sd = statistics.stdev(got) if len(got) > 1 else depth.runtime_sd_s
        depths.append(dataclasses.replace(depth, runtime_mean_s=mean, runtime_sd_s=sd))
        notes.append(
            f"depth {depth.name}: runtime {mean:.3g} s (sd {sd:.3g} s) measured over"
            f" {len(got)} job(s), was {depth.runtime_mean_s:g} s"
        )
    catalog = ReplicaCatalog(store)
    measured: dict[str, dict[str, float]] = {}
    for site in grid.sites:
        rate = catalog.measured_rate(ORIGIN, site.name)
        if rate is not None:
            measured[site.name] = {"BW_R": rate * MB}
            notes.append(f"site {site.name}: BW_R {rate:.3g} MB/s measured by staging")
    refined = dataclasses.replace(spec, depths=tuple(depths))
    return Refinement(refined, MappingProxyType(measured), tuple(notes))


def _output_jobs(record: JobRecord) -> list[SiteJob]:
    if record.job_id is None:
        return []
    failed = record.finished and record.state != JobState.COMPLETED.value
    label = f"{record.name} @ {record.site}"
    return [SiteJob(record.site, record.job_id, label, finished=record.finished, failed=failed)]


def runtime_factory(grid: GridSpec, store: Any) -> Callable[[], GridRuntime]:
    """Builds one :class:`GridRuntime` per thread over ``store``."""

    def build() -> GridRuntime:
        return GridRuntime(grid, store)

    return build


def _local_path(url: str) -> str:
    if "://" in url and not url.startswith("file://"):
        raise StagingError(f"{url}: a data plan's jobs read local files only")
    return url.removeprefix("file://")


def _file_size(url: str) -> int | None:
    try:
        return os.stat(_local_path(url)).st_size
    except OSError:
        return None


def _outside_storage(path: str, root: Path) -> str | None:
    """Where ``path`` really is when that is outside ``root`` (None: inside). Both the
    directory entry a deletion removes (the real parent directory) and the file a
    symbolic link leads to must be inside: unlinking an entry under a linked directory
    removes it where the link points, and a link leading out is not the plan's file."""
    base = os.path.realpath(root)
    entry = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    for where, what in ((entry, "it is"), (os.path.realpath(path), "it leads to")):
        if os.path.commonpath([base, where]) != base or where == base:
            return f"{what} {where}"
    return None


def _copy_home(src: Path, dst: Path, throttle: Throttle | None) -> None:
    """Copy ``src`` to ``dst`` atomically (a hidden part file renamed), paced by
    ``throttle``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    part = dst.with_name(f".{dst.name}.part-{os.getpid()}-{threading.get_ident()}")
    total = src.stat().st_size
    done = 0
    with open(src, "rb") as fin, open(part, "wb") as fout:
        while chunk := fin.read(256 * 1024):
            fout.write(chunk)
            done += len(chunk)
            if throttle is not None:
                throttle(done, total)
        fout.flush()
        os.fsync(fout.fileno())
    os.replace(part, dst)
