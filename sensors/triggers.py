"""Every trigger gridcore runs in Airflow's triggerer: waiting on site jobs and on data.

Triggers live in this installed package (the triggerer never loads DAG bundles, and
stores each trigger by its classpath here). The ones that wait on gridcore's work
subclass :class:`gridcore_airflow.sensors.base.GridcoreTrigger` (one wait loop, one event
contract): :class:`SiteJobTrigger` for a selection's site job, :class:`EngineTrigger`
for a job of any engine of :class:`~operators.hooks.EngineKind` (one line per engine in
:data:`ENGINE_WAITS`). :class:`ForcingFileTrigger` watches a directory for an asset.
Synchronous calls run in a worker thread via ``asyncio.to_thread``, so the triggerer's
event loop is never blocked.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from gridcore.engine.coallocation_records import CoAllocationRecord
from gridcore.engine.coreservation_records import ReservationRecord
from gridcore.engine.phases import ComponentState, JobPhase, PilotState, ReservationPhase
from gridcore.engine.runtime import GridRuntime, JobRecord
from gridcore.model import JobState
from gridcore.sites.output import OutputFiles, SiteJob
from gridcore_airflow.operators.hooks import EngineKind, GridcoreHook, ScanEngine
from gridcore_airflow.sensors.base import EventContract, GridcoreTrigger, Outcome

CLAIMED_DIR = "claimed"
CONSUMED_DIR = "consumed"


class SiteJobTrigger(GridcoreTrigger[GridRuntime, JobRecord]):
    """Wait for the job of selection ``selection_id`` to finish; yield exactly one event.

    ``SiteJobTrigger(selection_id, grid_file=None, db_url=None, poll_interval=2.0,
    max_retries=5, gridcore_conn_id=None)`` polls ``GridRuntime.poll`` every
    ``poll_interval`` seconds and copies the job's new stdout and stderr lines into the
    task log (see :class:`~sensors.base.GridcoreTrigger` for retries, errors, output,
    on_kill and cleanup).
    """

    id_field = "selection_id"
    selection_id: int

    def _connect(self) -> GridRuntime:
        # The selection exists, so its database is migrated; skipping Alembic keeps
        # CPU-bound work (and the GIL) away from the triggerer's event loop.
        return self.hook().open_runtime(upgrade=False)

    def _poll(self, handle: GridRuntime) -> JobRecord:
        return handle.poll(self.selection_id)

    def _progress_note(self, record: JobRecord) -> str:
        # a requeued or held job is pending again: the record's message says why
        if JobState(record.state) is JobState.PENDING and record.message:
            return f"job {record.job_id} on site {record.site}: {record.message}"
        return ""

    def _output_jobs(self, record: JobRecord) -> list[SiteJob]:
        if record.job_id is None:
            return []
        failed = record.finished and JobState(record.state) is not JobState.COMPLETED
        return [SiteJob(record.site, record.job_id, finished=record.finished, failed=failed)]

    def _output_files(self, handle: GridRuntime, site: str, job_id: str) -> OutputFiles:
        return handle.output_files(site, job_id)

    def _cancel(self, handle: GridRuntime) -> str:
        record = handle.cancel(self.selection_id)
        return f"job {record.job_id} is {record.state}"

    def _close(self, handle: GridRuntime) -> None:
        handle.store.dispose()


def _selection_outcome(record: JobRecord) -> Outcome:
    where = f"job {record.job_id} on site {record.site}"
    if JobState(record.state) is JobState.COMPLETED:
        return Outcome(record.selection_id, True, f"{where} completed")
    code = "" if record.exit_code is None else f", exit code {record.exit_code}"
    detail = f": {record.message}" if record.message else ""
    return Outcome(record.selection_id, False, f"{where} {record.state}{code}{detail}")


SiteJobTrigger.contract = EventContract("selection", "SiteJobTrigger", _selection_outcome)


class EngineTrigger(GridcoreTrigger[ScanEngine, Any]):
    """Scan the ``engine`` until its job ``job_id`` ends; yield exactly one event.

    ``EngineTrigger(job_id, engine, grid_file=None, db_url=None, poll_interval=1.0,
    max_retries=5, gridcore_conn_id=None)``. The engines have no daemon: whoever waits on
    a job runs the engine's ``scan`` (KOALA: placement, claiming, the start barrier, fault
    tolerance; VJM: pilots followed, dispatch, reorganization after the lifetime), and the
    engine's fenced scan lease lets one scan run at a time; each poll is one ``scan``
    (skipped while another holder has the lease) and one ``status``. The job's site jobs
    call the VJ center (``gridcore serve``, or the app mounted in Airflow's api-server)
    that the connection or ``$GRIDCORE_CENTER_URL`` names. ``on_kill`` cancels the job
    (its started site jobs with it); the lease is given up as soon as the wait ends.

    What differs between engines is one :class:`EngineWait` in :data:`ENGINE_WAITS`:
    what is waited on, how a finished job reads, and which site jobs' output goes into
    the task log, prefixed ``[component i @ site]``.
    """

    id_field = "job_id"
    job_id: int
    default_poll_interval = 1.0
    poll_noun = "scans"

    def __init__(self, job_id: int, engine: EngineKind | str, *args: Any, **kwargs: Any) -> None:
        """Where gridcore is and how to wait follow as :class:`GridcoreTrigger` takes them."""
        self.engine = EngineKind(engine)
        self.contract = self.wait = ENGINE_WAITS[self.engine]
        super().__init__(job_id, *args, **kwargs)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        classpath, kwargs = super().serialize()
        return classpath, {**kwargs, "engine": self.engine.value}

    def _connect(self) -> ScanEngine:
        return self.hook().open_engine(self.engine, self.poll_interval, upgrade=False)

    def _poll(self, handle: ScanEngine) -> Any:
        handle.scan()
        return handle.status(self.job_id)

    def _output_jobs(self, record: Any) -> list[SiteJob]:
        return self.wait.output_jobs(record)

    def _output_files(self, handle: ScanEngine, site: str, job_id: str) -> OutputFiles:
        return handle.runtime.output_files(site, job_id)

    def _finished(self, handle: ScanEngine) -> None:
        # Give the scan lease up now: other waiters should not sit out its expiry, and
        # cleanup() is not called everywhere (dag.test() skips it).
        handle.release_lease()

    def _cancel(self, handle: ScanEngine) -> str:
        return f"{handle.cancel(self.job_id).state}"

    def _close(self, handle: ScanEngine) -> None:
        GridcoreHook.close_engine(handle)


@dataclass(frozen=True)
class EngineWait(EventContract[Any]):
    """How :class:`EngineTrigger` waits on one engine's jobs: its event contract and
    the site jobs of a record whose output goes into the task log."""

    output_jobs: Callable[[Any], list[SiteJob]]


def _coallocation_outcome(record: CoAllocationRecord) -> Outcome:
    where = f"co-allocated job {record.job_id} ({record.name})"
    if JobPhase(record.state) is JobPhase.COMPLETED:
        sites = ", ".join(c.site for c in record.components)
        return Outcome(record.job_id, True, f"{where} completed on {sites}")
    detail = f": {record.message}" if record.message else ""
    return Outcome(record.job_id, False, f"{where} {record.state}{detail}")


def _coallocation_output(record: CoAllocationRecord) -> list[SiteJob]:
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


def _coreservation_outcome(record: ReservationRecord) -> Outcome:
    where = f"co-reserved job {record.job_id} ({record.name})"
    if record.state is ReservationPhase.COMPLETED:
        sites = ", ".join(f"{site} x{n}" for site, n in record.clusters.items())
        return Outcome(record.job_id, True, f"{where} completed through pilots on {sites}")
    detail = f": {record.message}" if record.message else ""
    return Outcome(record.job_id, False, f"{where} {record.state}{detail}")


def _coreservation_output(record: ReservationRecord) -> list[SiteJob]:
    """The pilots given a rank: the command runs inside them and writes to their site
    job's files (with the pilot's own few ``gridcore pilot N: ...`` lines on stderr).
    Pilots that only held (released, shifted or lost) ran nothing and are not shown."""
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


# A component in these states writes nothing more.
_COMPONENT_ENDED = frozenset(
    {ComponentState.COMPLETED, ComponentState.FAILED, ComponentState.ABORTED}
)

# One line per engine of EngineKind.
ENGINE_WAITS: dict[EngineKind, EngineWait] = {
    EngineKind.COALLOCATION: EngineWait(
        "co-allocated job", "EngineTrigger", _coallocation_outcome, _coallocation_output
    ),
    EngineKind.CORESERVATION: EngineWait(
        "co-reserved job", "EngineTrigger", _coreservation_outcome, _coreservation_output
    ),
}


class ForcingFileEvent(TypedDict):
    path: str
    name: str
    size: int


# A claimed file no run has taken within this time is announced again: its first event
# may have been lost with a triggerer stopped between firing and persisting it.
REEMIT_AFTER_S = 600.0


class ForcingFileTrigger(BaseEventTrigger):
    """Fire once per new file in ``directory`` whose name matches ``pattern``, and again
    for a file whose event may have been lost; exactly one run uses each file.

    Three steps, each an atomic ``os.rename``, so a file is used exactly once whatever
    dies when:

    1. *claim* (this trigger): the file moves into ``directory/claimed/`` before the
       event is yielded. The rename succeeds for exactly one of several triggerers
       racing for the same file, and a claimed file never fires as new again (an asset
       watcher whose condition stayed true would re-trigger the DAG forever).
    2. *take* (the run, :func:`take_forcing_file`): the run's first task moves the
       claimed file into ``directory/consumed/`` under its run id. One run takes it;
       another run with the same file (a duplicate event) finds it gone and skips.
    3. *re-emit* (this trigger): a triggerer stopped between firing and persisting the
       event loses that event. A claimed file that no run has taken ``reemit_after_s``
       after its claim is claimed again under a new name and announced again (so at
       least one event reaches the scheduler, and step 2 keeps it to one run).

    The event's ``path`` is the claimed location. Producers should write under a name
    that does not match ``pattern`` (or outside the directory) and rename into place,
    so a half-written file is never claimed.
    """

    def __init__(
        self,
        directory: str,
        pattern: str = "*",
        poll_interval: float = 5.0,
        reemit_after_s: float = REEMIT_AFTER_S,
    ) -> None:
        super().__init__()
        self.directory = directory
        self.pattern = pattern
        self.poll_interval = poll_interval
        self.reemit_after_s = reemit_after_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "directory": self.directory,
                "pattern": self.pattern,
                "poll_interval": self.poll_interval,
                "reemit_after_s": self.reemit_after_s,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            event = await asyncio.to_thread(
                claim_stale_file, self.directory, self.reemit_after_s
            ) or await asyncio.to_thread(consume_next_file, self.directory, self.pattern)
            if event is not None:
                self.log.info("claimed forcing file %s", event["path"])
                yield TriggerEvent(dict(event))
                return
            await asyncio.sleep(self.poll_interval)


def consume_next_file(directory: str, pattern: str) -> ForcingFileEvent | None:
    """Claim the oldest matching file (move it into ``claimed/``) and describe it; None
    if there is none (or every candidate was taken by a concurrent consumer first)."""
    root = Path(directory)
    candidates = _oldest_first(root, pattern)
    if not candidates:
        return None
    return _claim(root, candidates, lambda name: root / name, lambda name: name)


def claim_stale_file(directory: str, reemit_after_s: float) -> ForcingFileEvent | None:
    """Claim again the oldest file claimed more than ``reemit_after_s`` ago and never
    taken by a run (its event was probably lost); None if there is none."""
    claimed = Path(directory) / CLAIMED_DIR
    now = time.time()
    stale = [n for n in _oldest_first(claimed, "*") if _age(claimed / n, now) > reemit_after_s]
    return _claim(Path(directory), stale, lambda name: claimed / name, _original_name)


def take_forcing_file(path: str, run_id: str) -> Path | None:
    """The run's own copy of the claimed file ``path`` (moved into ``consumed/`` under
    its run id), or None if another run took it first (this run is a duplicate). A
    retry of the same run finds the copy it took."""
    claimed = Path(path)
    consumed = claimed.parent.parent / CONSUMED_DIR
    consumed.mkdir(exist_ok=True)
    target = consumed / f"{_safe(run_id)}--{claimed.name}"
    if target.exists():
        return target
    try:
        os.rename(claimed, target)
    except FileNotFoundError:
        return None
    return target


def _claim(
    root: Path,
    names: list[str],
    source: Callable[[str], Path],
    original: Callable[[str], str],
) -> ForcingFileEvent | None:
    if not names:
        return None
    target_dir = root / CLAIMED_DIR
    target_dir.mkdir(exist_ok=True)
    for name in names:
        # Unique per claim (rename silently replaces an existing target), time-prefixed
        # so claimed/ lists in arrival order; the name as dropped stays at the end.
        target = target_dir / f"{time.time_ns()}-{uuid.uuid4().hex[:12]}-{original(name)}"
        try:
            os.rename(source(name), target)
        except FileNotFoundError:
            continue  # another consumer (or a run) took this one
        os.utime(target)  # its age counts from this claim
        return ForcingFileEvent(path=str(target), name=original(name), size=target.stat().st_size)
    return None


def _original_name(claimed_name: str) -> str:
    return claimed_name.split("-", 2)[2]


def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _safe(run_id: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in run_id)


def _oldest_first(root: Path, pattern: str) -> list[str]:
    found: list[tuple[int, str]] = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []  # the directory may be created after the DAG is deployed
    for entry in entries:
        if entry.name.startswith(".") or not fnmatch.fnmatch(entry.name, pattern):
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                found.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.name))
        except FileNotFoundError:
            continue  # consumed by someone else between the listing and the stat
    return [name for _, name in sorted(found)]
