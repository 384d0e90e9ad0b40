"""Exactly-once submission of co-allocation components (issue 7 item 3), on SQLite and
local sites: a KOALA engine process SIGKILLed around a component's submission, then a
new engine scanning the same rows. A component the site accepted is adopted by its key
(no re-placement when every component reached its site); one that never reached the
site re-queues the job as before. Never two site jobs for one key, none left pending."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from gridcore.config import default_grid
from gridcore.engine.barrier_command import TOKEN_ENV
from gridcore.engine.coallocation import CoAllocationEngine, CoAllocationRecord
from gridcore.engine.pilot_pool import token_hash
from gridcore.engine.runtime import GridRuntime
from gridcore.model import CoAllocationRequest, Component, JobSubmission, RequestKind
from gridcore.policies.claiming import CoAllocationParams
from gridcore.policies.placement import PlacementPolicy
from gridcore.sites.keys import component_key
from gridcore.sites.local import LocalSite
from gridcore.state import capacity
from gridcore.state.schema import coalloc_components, coalloc_jobs, local_jobs, sites
from gridcore.state.store import open_store
from tests.barrier_checks import running_center
from tests.capacity_checks import assert_capacity_invariant

# 8 + 4 + 4 on local-a (8), local-b (4), local-c (4): one scan starts all three.
SPREAD = CoAllocationRequest(
    "spread", RequestKind.NON_FIXED, (Component(8), Component(4), Component(4))
)
PARAMS = CoAllocationParams(scan_interval_s=1.0)
LEASE_S = 1.0


def _engine(home: Path, holder: str, center: str) -> CoAllocationEngine:
    store = open_store(f"sqlite:///{home}/state.db", upgrade=True)
    return CoAllocationEngine(
        GridRuntime(default_grid(home), store),
        params=PARAMS,
        holder=holder,
        center_url=center,
        lease_s=LEASE_S,
    )


@pytest.fixture
def center(tmp_path: Path) -> Iterator[str]:
    """The VJ center the components' barriers call (it outlives the killed engine)."""
    with running_center(f"sqlite:///{tmp_path}/state.db") as url:
        yield url


def _scan_and_die(home: str, center: str, nth: int, accepted: bool) -> None:
    """Scan; die at the ``nth`` component submission, after the site accepted it
    (``accepted``) or before it reached the site."""
    koala = _engine(Path(home), "dead", center)
    submit, calls = LocalSite.submit, [0]

    def aimed(self: LocalSite, job: JobSubmission) -> str:
        calls[0] += 1
        if calls[0] == nth and not accepted:
            os.kill(os.getpid(), signal.SIGKILL)
        job_id = submit(self, job)
        if calls[0] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return job_id

    LocalSite.submit = aimed  # type: ignore[method-assign]
    koala.scan()


def _until_done(koala: CoAllocationEngine, job_id: int) -> CoAllocationRecord:
    deadline = time.time() + 90
    while time.time() < deadline:
        koala.scan()
        record = koala.status(job_id)
        if record.finished:
            return record
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not finished: {koala.status(job_id).as_json()}")


def _site_jobs(koala: CoAllocationEngine) -> list[dict[str, object]]:
    with koala.store.begin() as conn:
        rows = conn.execute(select(local_jobs)).mappings().all()
    return [dict(r) for r in rows]


@pytest.mark.parametrize(
    ("nth", "accepted"),
    [(1, False), (1, True), (2, True), (3, True)],
    ids=["before-the-first", "after-the-first", "after-the-second", "after-the-last"],
)
def test_an_engine_killed_mid_submission_doubles_no_component(
    tmp_path: Path, center: str, nth: int, accepted: bool
) -> None:
    job_id = _engine(tmp_path, "client", center).submit(SPREAD, PlacementPolicy.WF, "sleep 0.3")
    ctx = multiprocessing.get_context("spawn")
    dead = ctx.Process(target=_scan_and_die, args=(str(tmp_path), center, nth, accepted))
    dead.start()
    dead.join(60)
    assert dead.exitcode == -signal.SIGKILL

    koala = _engine(tmp_path, "new", center)
    done = _until_done(koala, job_id)

    assert done.state == "completed", done.as_json()
    jobs = _site_jobs(koala)
    per_key = Counter(j["key"] for j in jobs)
    assert all(n == 1 for n in per_key.values()) and None not in per_key, per_key
    assert not [j for j in jobs if j["state"] in ("pending", "running")], jobs
    if nth == len(SPREAD.components) and accepted:
        # Every component reached its site: all adopted or recorded, nothing re-placed.
        assert done.retries == 0 and len(jobs) == 3, (done.as_json(), jobs)
    else:
        # A component that never reached its site failed: the job was re-placed once.
        assert done.retries == 1 and len(jobs) == 3 + nth - (0 if accepted else 1), jobs
    koala.runtime.refresh()
    with koala.store.begin() as conn:
        totals = capacity.totals(conn)
        site_errors = dict(conn.execute(select(sites.c.name, sites.c.last_error)).all())
    assert all(v == (0, 0, 0, 0) for v in totals.values()), totals
    # A component its engine lost before the site had it is not the site's error.
    assert not any(site_errors.values()), site_errors
    # Each component that ran holds the token its row keeps the hash of: an adopted job
    # the dead engine's token (the stored hash kept), a re-placed one a fresh token.
    held = {str(j["id"]): _token_of(Path(str(j["workdir"]))) for j in jobs}
    for c in done.components:
        assert token_hash(held[str(c.site_job_id)]) == _token_hash_of(koala, job_id, c.index)
    assert len(set(held.values())) == len(jobs)
    assert_capacity_invariant(koala.store, no_live_holds=True)


def _token_of(workdir: Path) -> str:
    """The barrier token a local site job was given (its environment file)."""
    return str(json.loads((workdir / "env.json").read_text())[TOKEN_ENV])


def _token_hash_of(koala: CoAllocationEngine, job_id: int, index: int) -> str:
    cc = coalloc_components.c
    with koala.store.begin() as conn:
        query = select(cc.token_hash).where(cc.job_id == job_id, cc.idx == index)
        return str(conn.execute(query).scalar_one())


def test_refresh_cancels_component_jobs_without_a_live_component(
    tmp_path: Path, center: str
) -> None:
    """A site job keyed for a component of another epoch (the job was re-placed) is an
    orphan; the component's own job is not (and the local site gives a second submission
    of its key the same job)."""
    koala = _engine(tmp_path, "only", center)
    job_id = koala.submit(SPREAD, PlacementPolicy.WF, "sleep 30")
    deadline = time.time() + 60
    while koala.status(job_id).state != "running" and time.time() < deadline:
        koala.scan()
        time.sleep(0.1)
    record = koala.status(job_id)
    assert record.state == "running", record.as_json()
    part = record.components[0]
    site = koala.runtime.adapter(part.site)
    install = koala.runtime.install_id
    with koala.store.begin() as conn:
        epoch = conn.execute(
            select(coalloc_jobs.c.epoch).where(coalloc_jobs.c.id == job_id)
        ).scalar_one()
    old_epoch = site.submit(
        JobSubmission("old", "sleep 30", 1, key=component_key(install, job_id, epoch + 99, 0))
    )
    twin = site.submit(
        JobSubmission("twin", "sleep 30", 1, key=component_key(install, job_id, epoch, part.index))
    )
    koala.runtime.refresh()
    assert twin == part.site_job_id
    assert site.status(old_epoch).state.value == "cancelled"
    assert site.status(str(part.site_job_id)).state.value in ("pending", "running")
    assert_capacity_invariant(koala.store)
    koala.cancel(job_id)
    assert_capacity_invariant(koala.store, no_live_holds=True)
