"""Exactly-once submission: look a key up before submitting, and judge keyed site jobs.

Every site job gridcore submits carries a key naming its holder
(:mod:`gridcore.sites.keys`). Three rules follow, applied by the runtime and the
scanning engines:

* before submitting, ask the site for the key (:func:`submit_once`): a job found was
  submitted by a worker that died before recording it, and is adopted, not doubled;
  a submission whose answer was lost (:class:`~gridcore.errors.AnswerLost`) is looked
  up the same way at once, and while it is not found it stays unknown, never failed;
  a job submitted carries its request's resources over the site's defaults
  (:func:`resources_at`: the one place a request meets its site's grid-file defaults);
* a holder still waiting for its job long after its submission began (its submitter
  died) asks the site for its key (:func:`adopt_stale`): a job found is recorded as the
  holder's; what a holder does when none is found is its own (a selection expires, a
  KOALA component re-places its job, a VJM pilot is submitted anew);
* a site job with our key whose holder is not live is an orphan, cancelled by the next
  refresh (:func:`judge_keyed_jobs`). A live holder is never cancelled: a selection
  still ``selected`` (its submission may be under way in another worker) adopts the job
  instead, and a component ``submitting`` is left to the scan that owns it.

Site I/O happens outside transactions; :func:`judge_keyed_jobs` only reads and adopts
in the caller's transaction and returns the site jobs to cancel.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from sqlalchemy import Connection, and_, insert, select, update
from sqlalchemy.exc import IntegrityError

from gridcore.engine.phases import ComponentState, PilotState
from gridcore.errors import AnswerLost, GridError, RequestError
from gridcore.model import (
    HolderKind,
    JobResources,
    JobState,
    JobSubmission,
    ObservedJob,
    SiteKind,
    SiteSpec,
)
from gridcore.sites.base import SiteAdapter
from gridcore.sites.keys import KeyHolder, install_prefix, parse_key
from gridcore.state import capacity
from gridcore.state.schema import coalloc_components, meta, pilots, selections, sites

log = logging.getLogger(__name__)

INSTALL_ID = "install_id"


class Lookup(enum.Enum):
    """What :func:`adopt_stale` found."""

    ADOPTED = "adopted"  # the site has the key's job: the holder recorded it
    NOT_FOUND = "not found"  # the site has no job with the key
    UNKNOWN = "unknown"  # the site could not be asked: the holder decides later


class Verdict(enum.Enum):
    KEEP = "keep"  # the holder is live and this is (or may become) its job
    ADOPTED = "adopted"  # the holder had no job yet: it has this one now
    ORPHAN = "orphan"  # no live holder: cancel


def install_id(conn: Connection) -> str:
    """This state database's install id (made by migration 0007; made here if a
    database was created otherwise)."""
    found = conn.execute(select(meta.c.value).where(meta.c.name == INSTALL_ID)).scalar()
    if found is not None:
        return str(found)
    try:
        with conn.begin_nested():
            conn.execute(insert(meta).values(name=INSTALL_ID, value=uuid.uuid4().hex[:12]))
    except IntegrityError:
        pass  # another worker made it first
    return str(conn.execute(select(meta.c.value).where(meta.c.name == INSTALL_ID)).scalar_one())


def resources_at(resources: JobResources, site: SiteSpec) -> JobResources:
    """What a job asking ``resources`` asks of ``site``: every field it leaves unset taken
    from the site's defaults (the grid file's ``[sites.NAME.defaults]``). Every engine
    submits through :func:`submit_once`, which applies it; operators and records show
    what was sent with it."""
    return resources.over(site.defaults)


def refuse_gpus_on_local(
    resources: JobResources, sites: Sequence[SiteSpec], *, every: bool, field: str
) -> None:
    """RequestError before anything is written when a job asking for GPUs could only
    land on local sites, which have none: ``every`` of ``sites`` (the candidates a
    policy chooses from) or any one of them (``every=False``: sites the request names)."""
    local = [s.name for s in sites if s.kind is SiteKind.LOCAL and resources_at(resources, s).gpus]
    if local and (not every or len(local) == len(sites)):
        raise RequestError(
            f"{field}: asks for {resources.gpus} GPU(s), but site(s) {', '.join(local)}"
            " are local and have none"
        )


def submit_once(
    adapter: SiteAdapter, job: JobSubmission, since: float | None = None
) -> tuple[str, bool]:
    """The site's job for ``job.key``: the one it has already (adopted: True), else a new
    submission (False) with its resources over the site's defaults (:func:`resources_at`).
    ``since``: when the key's holder was made, so no job with it is older; a site that
    forgets finished jobs looks in its records back to then (``SiteAdapter.find``)."""
    if job.key is not None:
        found = adapter.find(job.key, since)
        if found is not None:
            log.info(
                "site %s: key %s is job %s already: adopted", adapter.spec.name, job.key, found
            )
            return found, True
    sent = resources_at(job.resources, adapter.spec)
    if sent != job.resources:
        job = replace(job, resources=sent)
    try:
        return adapter.submit(job), False
    except AnswerLost as lost:
        if job.key is None:
            raise
        return _look_up_lost(adapter, job.key, since, lost), True


def _look_up_lost(adapter: SiteAdapter, key: str, since: float | None, lost: AnswerLost) -> str:
    """The job of a submission whose answer was lost: the site may have made it, so its
    key is asked for. Found: adopted as any job found by its key. Not found, or the site
    cannot be asked: still unknown (:class:`AnswerLost`), so the holder keeps its claim
    and its key and the next try looks it up again; never taken as not submitted."""
    site = adapter.spec.name
    try:
        found = adapter.find(key, since)
    except GridError as exc:
        raise AnswerLost(
            site, f"{lost.site_message}; looking key {key} up failed too: {exc}"
        ) from exc
    if found is None:
        raise AnswerLost(
            site,
            f"{lost.site_message}; key {key} is not at the site yet: the submission is"
            " looked up again before anything is sent again",
        ) from lost
    log.warning(
        "site %s: the answer to submitting key %s was lost; the site has it as job %s: adopted",
        site,
        key,
        found,
    )
    return found


def adopt_stale(
    adapter: Callable[[str], SiteAdapter],
    site: str,
    key: str,
    record: Callable[[str], object],
    *,
    since: float,
) -> Lookup:
    """A holder left without its site job by a submitter that died: ask ``site`` (its
    adapter from ``adapter``) for the job with ``key`` and, if it has one, ``record``
    its id (in the holder's own transaction). A site that cannot be asked now is logged
    and left to the holder. ``since``: when the holder was made. A stale holder is
    looked up minutes later, when a short job may have ended and left a Slurm
    controller's memory (MinJobAge, 300 s by default): the site's records back to
    ``since`` are asked too (``SiteAdapter.find``)."""
    try:
        found = adapter(site).find(key, since)
    except GridError as exc:
        log.warning("site %s: looking up key %s failed: %s", site, key, exc)
        return Lookup.UNKNOWN
    if found is None:
        return Lookup.NOT_FOUND
    record(found)
    log.info("site %s: key %s is job %s: adopted by its holder", site, key, found)
    return Lookup.ADOPTED


def judge_keyed_jobs(
    conn: Connection, install: str, site: str, jobs: Iterable[ObservedJob], now: float
) -> list[str]:
    """Judge every unfinished job of ``site`` carrying one of our keys; adopt what a
    waiting holder can take and return the ids of the orphans to cancel."""
    prefix = install_prefix(install)
    orphans = []
    for job in jobs:
        if job.key is None or not job.key.startswith(prefix) or job.state.finished:
            continue
        verdict = _judge(conn, parse_key(job.key), site, job.job_id, now)
        if verdict is Verdict.ORPHAN:
            orphans.append(job.job_id)
        elif verdict is Verdict.ADOPTED:
            log.info("site %s: job %s (key %s) adopted by its holder", site, job.job_id, job.key)
    return orphans


def _judge(
    conn: Connection, holder: KeyHolder | None, site: str, job_id: str, now: float
) -> Verdict:
    if holder is None:
        return Verdict.ORPHAN  # our prefix, but no holder we know how to name
    if holder.kind is HolderKind.SELECTION:
        return judge_selection_job(conn, holder.ids[0], site, job_id, now)
    if holder.kind is HolderKind.COMPONENT:
        return judge_component_job(conn, holder.ids, site, job_id)
    if holder.kind is HolderKind.PILOT:
        return judge_pilot_job(conn, holder.ids[0], site, job_id, now)
    return judge_probe_job(conn, holder, site, job_id)


PILOT_EXIT_GRACE_S = 30.0
"""A pilot that reported its command's result exits by itself right after: its site job
is left this long to end on its own (cancelling it would show a finished job as
CANCELLED in the site's accounting)."""


def judge_pilot_job(conn: Connection, pilot_id: int, site: str, job_id: str, now: float) -> Verdict:
    """A pilot's job is ours while the pilot is not finished, or for
    :data:`PILOT_EXIT_GRACE_S` after it reported its result; a pilot whose submission
    was not recorded (its submitter died) adopts it."""
    row = conn.execute(
        select(
            pilots.c.site,
            pilots.c.state,
            pilots.c.site_job_id,
            pilots.c.exit_code,
            pilots.c.finished_at,
        ).where(pilots.c.id == pilot_id)
    ).one_or_none()
    if row is None or row.site != site:
        return Verdict.ORPHAN
    if PilotState(row.state).finished:
        exiting = (
            row.exit_code is not None
            and row.finished_at is not None
            and now - row.finished_at < PILOT_EXIT_GRACE_S
            and row.site_job_id == job_id
        )
        return Verdict.KEEP if exiting else Verdict.ORPHAN
    if row.site_job_id is not None:
        return Verdict.KEEP if row.site_job_id == job_id else Verdict.ORPHAN
    done = conn.execute(
        update(pilots)
        .where(and_(pilots.c.id == pilot_id, pilots.c.site_job_id.is_(None)))
        .values(site_job_id=job_id)
    )
    return Verdict.ADOPTED if done.rowcount == 1 else Verdict.KEEP


def judge_selection_job(
    conn: Connection, selection_id: int, site: str, job_id: str, now: float
) -> Verdict:
    row = conn.execute(
        select(selections.c.site, selections.c.state, selections.c.job_id).where(
            selections.c.id == selection_id
        )
    ).one_or_none()
    if row is None or row.site != site or JobState(row.state).finished:
        return Verdict.ORPHAN
    if row.job_id is not None:
        return Verdict.KEEP if row.job_id == job_id else Verdict.ORPHAN
    if not adopt_selection_job(conn, selection_id, job_id, now):
        return Verdict.KEEP  # it changed under us: the next refresh judges again
    return Verdict.ADOPTED


def adopt_selection_job(conn: Connection, selection_id: int, job_id: str, now: float) -> bool:
    """Record ``job_id`` as the selection's job if it is still selected without one."""
    done = conn.execute(
        update(selections)
        .where(
            and_(
                selections.c.id == selection_id,
                selections.c.state == JobState.SELECTED.value,
                selections.c.job_id.is_(None),
            )
        )
        .values(job_id=job_id, state=JobState.PENDING.value, submitted_at=now)
    )
    if done.rowcount != 1:
        return False
    # the hold ends when an observation shows this job (gridcore.state.capacity)
    capacity.set_site_job(conn, HolderKind.SELECTION, str(selection_id), job_id)
    return True


def judge_component_job(
    conn: Connection, ids: tuple[int, ...], site: str, site_job_id: str
) -> Verdict:
    """A co-allocation component's job: live while its row (same job, epoch and index:
    a re-placed job has a new epoch and new rows) is being submitted, or is submitted
    with this very job. A ``submitting`` row is left to the KOALA scan, which adopts."""
    job, epoch, index = ids
    cc = coalloc_components.c
    row = conn.execute(
        select(cc.site, cc.state, cc.site_job_id).where(
            and_(cc.job_id == job, cc.epoch == epoch, cc.idx == index)
        )
    ).one_or_none()
    if row is None or row.site != site:
        return Verdict.ORPHAN
    if row.state == ComponentState.SUBMITTING.value and row.site_job_id is None:
        return Verdict.KEEP
    if row.state == ComponentState.SUBMITTED.value and row.site_job_id == site_job_id:
        return Verdict.KEEP
    return Verdict.ORPHAN


def judge_probe_job(conn: Connection, holder: KeyHolder, site: str, job_id: str) -> Verdict:
    """A health probe's job: live while it is the site's recorded probe, or while its
    hold (``<site>:<token>``, gridcore.engine.health) is live and has no other job (its
    submission may be under way). A newer probe releases the older one's hold."""
    if holder.site != site or holder.token is None:
        return Verdict.ORPHAN
    recorded = conn.execute(select(sites.c.probe_job_id).where(sites.c.name == site)).scalar()
    if recorded == job_id:
        return Verdict.KEEP
    hold = capacity.hold(conn, HolderKind.PROBE, f"{site}:{holder.token}")
    if hold is not None and hold.ledger is not None and hold.site_job_id in (None, job_id):
        return Verdict.KEEP
    return Verdict.ORPHAN
