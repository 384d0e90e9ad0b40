"""The phases of a co-allocated job and the states of its components (seed 000 Sec. 3).

Shared by the KOALA engine (:mod:`gridcore.engine.koala`), which moves jobs and
components through them, and the start barrier (:mod:`gridcore.barrier`), which only
waits while its job and component are still live: one definition, so a state the engine
writes is a state the barrier knows.
"""

from __future__ import annotations

import enum


class JobPhase(enum.StrEnum):
    """Where a co-allocated job is in KOALA's queues (Sec. 3.1-3.3)."""

    QUEUED = "queued"  # in its placement queue
    PLACED = "placed"  # placed, input files being staged
    CLAIMING = "claiming"  # in the claiming queue
    RUNNING = "running"  # every component started (at the barrier or past it)
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in FINISHED_JOB


class ComponentState(enum.StrEnum):
    """A component's state (one row per component of the job's current epoch)."""

    PLACED = "placed"  # has a site, not started
    SUBMITTING = "submitting"  # claimed; its submission is under way
    SUBMITTED = "submitted"  # the site has it (pending, at the barrier or running)
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"  # cancelled by KOALA (abort, cancel)


FINISHED_JOB = frozenset({JobPhase.COMPLETED, JobPhase.FAILED, JobPhase.CANCELLED})
# A job the engine still works on.
LIVE_JOB = (JobPhase.QUEUED, JobPhase.PLACED, JobPhase.CLAIMING, JobPhase.RUNNING)
# A job whose components may wait at (or pass) the start barrier: claimed, not finished.
BARRIER_JOB = (JobPhase.CLAIMING, JobPhase.RUNNING)
# A component a site may have (its submission started): the barrier waits only for these.
STARTED_COMPONENT = (ComponentState.SUBMITTING, ComponentState.SUBMITTED)
