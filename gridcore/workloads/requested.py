"""The requested time (SWF field 9, the job's time limit) a log leaves unknown: one rule
for every consumer of a log (docs/workloads.md, "Unknown requested times").

A job's requested time that is unknown or not above 0 is replaced by the largest
requested time of the jobs the consumer keeps that were submitted before it (the queue's
de-facto limit), else by :data:`~gridcore.model.ASSUMED_RUNTIME_S`. A time of 0 taken
literally would make an EASY queue plan the job as ending at once, and backfill it ahead
of everything (Mu'alem and Feitelson 2001: backfilling trusts requested times).
"""

from __future__ import annotations

from gridcore.model import ASSUMED_RUNTIME_S


class RequestedTimes:
    """Fed the jobs a consumer keeps, in submit order, one :meth:`fill` each; a job it
    leaves out (too large, no run time, outside the window) is not fed, so it neither
    gets a time nor lends one. ``filled`` counts the times it replaced."""

    def __init__(self) -> None:
        self.largest: float | None = None
        self.filled = 0

    def fill(self, requested_s: float | None) -> float:
        """``requested_s`` when it is above 0, else the largest given before."""
        if requested_s is None or requested_s <= 0:
            self.filled += 1
            return ASSUMED_RUNTIME_S if self.largest is None else self.largest
        self.largest = requested_s if self.largest is None else max(self.largest, requested_s)
        return requested_s


__all__ = ["RequestedTimes"]
