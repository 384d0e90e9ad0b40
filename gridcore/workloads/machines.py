"""How many processors a logged machine had when its log does not say.

An SWF header's ``MaxProcs`` (else ``MaxNodes``) sizes the log's whole machine; a
multi-cluster log (field 16) gives no size per partition, and some logs give none at all.
The machine then had at least the largest job it ran, and at least the processors its jobs
held at once. The largest job alone can be far too small (a cluster that ran mostly
serial jobs), and the plain peak of concurrent use too large, since logged times overlap:
the shared logs show up to 592 processors in use on CTC's 338, 202 on SDSC's 128.

Rule: the larger of the largest job and :data:`BUSY_QUANTILE` of the processors in use,
time-weighted over the jobs' logged runs (start = submit + wait, for the run time); a
machine with a queue is full most of the time, and the top 1 % of the time absorbs the
logs' overlapping times. Checked on the shared logs, whose true sizes the header gives
(the quantiles 0.99, 0.999 and 0.9999 and the peak were computed, 0.99 came closest):
CTC 341 for 338, SDSC 135 for 128, KTH 100 for 100. A lightly loaded cluster is sized
below its real size; it then also has almost no queue to forecast.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import numpy as np

from gridcore.workloads.swf import SwfJob

BUSY_QUANTILE = 0.99
"""The share of the logged span during which the jobs held at most the machine's size."""


class MachineUse:
    """The runs of one machine's kept jobs (callers pass only jobs the replay keeps,
    ``skip_reason`` None), in three compact arrays: 24 bytes a job."""

    def __init__(self) -> None:
        self.largest = 0
        self._starts = array("d")
        self._ends = array("d")
        self._sizes = array("d")

    def add(self, job: SwfJob) -> None:
        size = job.size or 0
        self.largest = max(self.largest, size)
        start, end = job.start_s, job.end_s
        if start is not None and end is not None and end > start and size > 0:
            self._starts.append(start)
            self._ends.append(end)
            self._sizes.append(size)

    def extend(self, jobs: Iterable[SwfJob]) -> MachineUse:
        for job in jobs:
            self.add(job)
        return self

    @classmethod
    def merged(cls, uses: Iterable[MachineUse]) -> MachineUse:
        """One machine that ran every job of ``uses``."""
        whole = cls()
        for use in uses:
            whole.largest = max(whole.largest, use.largest)
            whole._starts.extend(use._starts)
            whole._ends.extend(use._ends)
            whole._sizes.extend(use._sizes)
        return whole

    def busy(self, quantile: float = BUSY_QUANTILE) -> int:
        """The processors in use that the jobs' runs stayed at or below for ``quantile``
        of the time from the first start to the last end (0 without a run)."""
        if not self._sizes:
            return 0
        sizes = np.frombuffer(self._sizes, dtype=np.float64)
        times = np.concatenate((np.frombuffer(self._starts), np.frombuffer(self._ends)))
        deltas = np.concatenate((sizes, -sizes))
        order = np.lexsort((deltas, times))  # at one instant, ends before starts
        times, in_use = times[order], np.cumsum(deltas[order])
        held = np.diff(times)  # in_use[i] holds from times[i] to times[i + 1]
        in_use = in_use[:-1]
        by_use = np.argsort(in_use, kind="stable")
        share = np.cumsum(held[by_use]) / held.sum()
        index = int(np.searchsorted(share, quantile, side="left"))
        return int(np.rint(in_use[by_use][min(index, in_use.size - 1)]))

    def size(self) -> tuple[int, str]:
        """The machine's processors by the module's rule, and where they come from."""
        busy = self.busy()
        if busy > self.largest:
            return busy, f"processors in use {BUSY_QUANTILE:g} of the time"
        return self.largest, "largest job"
