"""Exactly once through a site that does not deduplicate (issue 23 item 6): a submitter
that died after the site accepted its job but before recording the id is retried or
adopted, and the site has ONE job for the key.

The local site looks a key up itself, and so would hide a retry that no longer does:
these tests run on :class:`tests.fakes.FakeSite`, which makes two jobs of two
submissions with one key (as Slurm does), so only the engines' own look-ups keep the
count at one: the selection runtime's retry and its adoption at the submission deadline,
KOALA's scan adopting a component left ``submitting``, and VJM's scan adopting a stale
pilot.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from gridcore.engine import coreservation
from gridcore.engine.coallocation import CoAllocationEngine, ComponentState, JobPhase
from gridcore.engine.coreservation import CoReservationEngine, CoReservationParams
from gridcore.engine.phases import PilotState
from gridcore.engine.pilot_pool import token_hash
from gridcore.engine.runtime import SUBMIT_DEADLINE_S, GridRuntime
from gridcore.model import (
    CoAllocationRequest,
    Component,
    CoReservationRequest,
    JobRequest,
    JobState,
    JobSubmission,
    RequestKind,
)
from gridcore.policies.claiming import CoAllocationParams
from gridcore.policies.placement import PlacementPolicy
from gridcore.sites.keys import component_key, selection_key
from gridcore.state.schema import pilots
from tests.fakes import FakeClock, FakeJob, FakeSite, fake_site_runtime

CENTER = "http://127.0.0.1:9"  # nothing runs on the fake sites: no barrier calls it


class _Died(BaseException):
    """The submitter dies here (nothing on the way out catches a BaseException)."""


Clock = FakeClock


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def runtime(tmp_path: Path, clock: Clock) -> Iterator[GridRuntime]:
    runtime = fake_site_runtime(tmp_path, clock)
    yield runtime
    runtime.store.dispose()


def _fake(runtime: GridRuntime, site: str) -> FakeSite:
    adapter = runtime.adapter(site)
    assert isinstance(adapter, FakeSite)
    return adapter


def _die_after_accepting(site: FakeSite, nth: int = 1) -> None:
    """The ``nth`` submission to ``site`` is accepted, then its submitter dies."""
    seen = [0]

    def died(job: FakeJob) -> None:
        seen[0] += 1
        if seen[0] == nth:
            site.after_accept = None
            raise _Died

    site.after_accept = died


JOB = JobSubmission("victim", "true", 2)


def test_a_retried_selection_submission_adopts_the_job_the_site_accepted(
    runtime: GridRuntime,
) -> None:
    site = _fake(runtime, "local-a")
    rec = runtime.select(JobRequest(JOB.name, JOB.processors, 1.0), site="local-a")
    _die_after_accepting(site)
    with pytest.raises(_Died):
        runtime.submit(rec.selection_id, JOB)
    assert runtime.record(rec.selection_id).job_id is None  # the id was never recorded

    retried = runtime.submit(rec.selection_id, JOB)  # the retried Airflow task

    key = selection_key(runtime.install_id, rec.selection_id)
    (only,) = site.keyed(key)
    assert retried.job_id == only.job_id and retried.state == JobState.PENDING.value
    assert len(site.jobs) == 1


def test_a_selection_past_its_deadline_adopts_the_job_the_site_accepted(
    runtime: GridRuntime, clock: Clock
) -> None:
    site = _fake(runtime, "local-a")
    rec = runtime.select(JobRequest(JOB.name, JOB.processors, 1.0), site="local-a")
    _die_after_accepting(site)
    with pytest.raises(_Died):
        runtime.submit(rec.selection_id, JOB)

    clock.now += SUBMIT_DEADLINE_S + 1  # the worker never came back
    runtime.refresh()

    key = selection_key(runtime.install_id, rec.selection_id)
    (only,) = site.keyed(key)
    adopted = runtime.record(rec.selection_id)
    assert adopted.job_id == only.job_id and adopted.state == JobState.PENDING.value
    assert only.state is JobState.PENDING and site.cancelled == []


def test_a_selection_past_its_deadline_adopts_a_job_that_already_ended(
    runtime: GridRuntime, clock: Clock
) -> None:
    """Ten minutes on, a short job has ended and left a Slurm controller's memory: the
    deadline's look-up asks the site's records back to the selection's time."""
    site = _fake(runtime, "local-a")
    site.forgets_finished = True
    rec = runtime.select(JobRequest(JOB.name, JOB.processors, 1.0), site="local-a")
    _die_after_accepting(site)
    with pytest.raises(_Died):
        runtime.submit(rec.selection_id, JOB)
    key = selection_key(runtime.install_id, rec.selection_id)
    (only,) = site.keyed(key)
    site.finish(only.job_id)

    clock.now += SUBMIT_DEADLINE_S + 1
    runtime.refresh()

    assert runtime.record(rec.selection_id).job_id == only.job_id
    assert site.keyed(key) == [only]


# 4 + 2 + 2 on local-a (8), local-b (4), local-c (4): one scan starts all three.
SPREAD = CoAllocationRequest(
    "spread",
    RequestKind.FIXED,
    (Component(4, "local-a"), Component(2, "local-b"), Component(2, "local-c")),
)


def _koala(runtime: GridRuntime, holder: str) -> CoAllocationEngine:
    return CoAllocationEngine(
        runtime,
        params=CoAllocationParams(scan_interval_s=1.0),
        holder=holder,
        center_url=CENTER,
        lease_s=5.0,
        renew_lease=False,
    )


def test_a_koala_scan_adopts_the_component_a_dead_engine_submitted(
    runtime: GridRuntime, clock: Clock
) -> None:
    dead = _koala(runtime, "dead")
    job_id = dead.submit(SPREAD, PlacementPolicy.WF, "true")
    _die_after_accepting(_fake(runtime, "local-c"))  # the last of the three
    with pytest.raises(_Died):
        dead.scan()
    parts = dead.status(job_id).components
    assert parts[2].state == ComponentState.SUBMITTING.value and parts[2].site_job_id is None

    clock.now += 10.0  # the dead engine's lease expired
    alive = _koala(runtime, "alive")
    alive.scan()

    record = alive.status(job_id)
    assert record.state == JobPhase.RUNNING.value and record.epoch == 0  # not re-placed
    for part in record.components:
        key = component_key(runtime.install_id, job_id, 0, part.index)
        (only,) = _fake(runtime, part.site).keyed(key)
        assert part.state == ComponentState.SUBMITTED.value and part.site_job_id == only.job_id
    assert sum(len(_fake(runtime, s).jobs) for s in runtime.grid.site_names) == 3


def test_a_vjm_scan_adopts_the_pilot_a_dead_submitter_sent(
    runtime: GridRuntime, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = CoReservationEngine(runtime, CENTER, CoReservationParams(lease_s=5.0))
    site = _fake(runtime, "local-b")
    site.forgets_finished = True  # a Slurm controller past MinJobAge
    _die_after_accepting(site)
    with pytest.raises(_Died):
        engine.submit(CoReservationRequest("again", "true", 1, sites=("local-b",)))
    with engine.store.begin() as conn:
        (pilot_id, key, state) = conn.execute(
            select(pilots.c.id, pilots.c.key, pilots.c.state)
        ).one()
    assert state == PilotState.SUBMITTING.value
    # The pilot's job ended before any observation listed it (a pilot that failed at
    # once): only a look-up by its key finds it.
    (accepted,) = site.keyed(key)
    site.finish(accepted.job_id, JobState.FAILED)

    monkeypatch.setattr(coreservation, "SUBMIT_DEADLINE_S", 1.0)
    clock.now += 2.0
    engine.scan()

    assert site.keyed(key) == [accepted]  # adopted, not submitted again
    with engine.store.begin() as conn:
        row = conn.execute(select(pilots).where(pilots.c.id == pilot_id)).mappings().one()
    assert row["site_job_id"] == accepted.job_id
    # adopted as it was sent: its job's token still opens the pilot's row (a resubmission
    # would have given the row a fresh token that job does not hold)
    assert row["token_hash"] == token_hash(accepted.submission.env[coreservation.TOKEN_ENV])
