"""A small, policy-agnostic, deterministic discrete-event core (SimPy style).

Events live in a heap of ``(time, priority, counter, callback)``. At equal times the lower
``priority`` runs first; at equal time and priority the event scheduled first runs first
(``counter`` grows with every ``schedule``), so a run never depends on callback identity,
hashing or heap internals: the same schedule calls always give the same event order.

Callbacks take no arguments and may schedule further events (at ``now`` or later). What an
event means is entirely up to the model built on top (see ``gridcore.sim.selection``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gridcore.errors import GridError

# The return value is ignored; accepting any lets `lambda: sim.schedule(...)` be a callback.
Callback = Callable[[], object]


class SimulationError(GridError):
    """The event core was misused: an event in the past, a non-finite time, a bad horizon."""


@dataclass(frozen=True, order=True)
class _Event:
    at: float
    priority: int
    counter: int
    # Never compared: the counter already makes every key unique.
    callback: Callback = field(compare=False)


class Simulator:
    """A virtual clock and the heap of events still to run."""

    def __init__(self, start: float = 0.0) -> None:
        if not math.isfinite(start):
            raise SimulationError(f"start time must be finite, got {start!r}")
        self._now = float(start)
        self._heap: list[_Event] = []
        self._counter = itertools.count()
        self._processed = 0

    @property
    def now(self) -> float:
        """The virtual time of the event being run, or of the last one run."""
        return self._now

    @property
    def pending(self) -> int:
        """Events scheduled and not yet run."""
        return len(self._heap)

    @property
    def processed(self) -> int:
        """Events run so far."""
        return self._processed

    def peek(self) -> float:
        """Time of the next event, ``inf`` when none is left."""
        return self._heap[0].at if self._heap else math.inf

    def schedule(self, at: float, fn: Callback, priority: int = 0) -> int:
        """Run ``fn`` at time ``at``; returns the event's counter (its tie-break rank)."""
        if not math.isfinite(at):
            raise SimulationError(f"event time must be finite, got {at!r}")
        if at < self._now:
            raise SimulationError(f"cannot schedule at {at} before now ({self._now})")
        counter = next(self._counter)
        heapq.heappush(self._heap, _Event(float(at), priority, counter, fn))
        return counter

    def schedule_in(self, delay: float, fn: Callback, priority: int = 0) -> int:
        """Run ``fn`` ``delay`` seconds from now."""
        return self.schedule(self._now + delay, fn, priority)

    def step(self) -> None:
        """Run the next event; the clock jumps to its time."""
        if not self._heap:
            raise SimulationError("no event left to run")
        event = heapq.heappop(self._heap)
        self._now = event.at
        self._processed += 1
        event.callback()

    def run(self, until: float | None = None) -> None:
        """Run events until none is left, or until the clock would reach ``until``.

        As in SimPy, ``until`` is exclusive: events at exactly ``until`` stay queued (a
        later ``run`` picks them up) and the clock is left at ``until``.
        """
        if until is None:
            while self._heap:
                self.step()
            return
        if not math.isfinite(until) or until < self._now:
            raise SimulationError(f"until={until!r} must be finite and not before {self._now}")
        while self._heap and self._heap[0].at < until:
            self.step()
        self._now = float(until)
