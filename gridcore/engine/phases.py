"""The phases of a co-allocated job and the states of its components (KOALA 2005 Sec. 3).

Shared by the KOALA engine (:mod:`gridcore.engine.coallocation`), which moves jobs and
components through them, and the start barrier's side of the VJ center
(:mod:`gridcore.engine.barrier_pool`), which lets a component wait only while its job and
component are still live: one definition, so a state the engine writes is a state the
barrier knows.
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


# -- VJM co-reservation (gridcore.engine.coreservation, gridcore.api, gridcore.pilot) ----


class ReservationPhase(enum.StrEnum):
    """A co-reserved job (VJM Sec. 3.1): its pilots co-reserve, then the real program
    is dispatched into all of them at once."""

    RESERVING = "reserving"  # pilots submitted; not all hold their processors yet
    DISPATCHED = "dispatched"  # every pilot held; the real command was handed to all
    COMPLETED = "completed"  # every pilot's command exited 0
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in FINISHED_RESERVATION


class PilotState(enum.StrEnum):
    """A pilot (virtual job): a site job of g processors that registers with the VJ
    center when the site starts it and holds its processors until it is dispatched,
    shifted to another job, or released."""

    SUBMITTING = "submitting"  # row written (key, token hash); site submission under way
    PENDING = "pending"  # the site has it queued
    HELD = "held"  # started and registered: holds its processors for its job
    DISPATCHED = "dispatched"  # its job's real command was handed to it
    COMPLETED = "completed"  # the real command exited 0
    FAILED = "failed"  # the real command failed (or the pilot died while running it)
    LOST = "lost"  # missed heartbeats or its site job ended before dispatch
    RELEASED = "released"  # let go (cancel, reorganization): the pilot exits

    @property
    def finished(self) -> bool:
        return self in FINISHED_PILOT


FINISHED_RESERVATION = frozenset(
    {ReservationPhase.COMPLETED, ReservationPhase.FAILED, ReservationPhase.CANCELLED}
)
FINISHED_PILOT = frozenset(
    {PilotState.COMPLETED, PilotState.FAILED, PilotState.LOST, PilotState.RELEASED}
)
# A pilot that may still register and hold (its site job is or may be queued).
WAITING_PILOT = (PilotState.SUBMITTING, PilotState.PENDING)
# A pilot whose program is alive at its site and talks to the center.
LIVE_PILOT = (PilotState.HELD, PilotState.DISPATCHED)
