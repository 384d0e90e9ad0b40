"""A simulated cluster as a wait model sees it (:mod:`gridcore.policies.wait_prediction`):
its true queue and running work now, and the history of what started and ended there.

The simulator knows every cluster exactly, so the views built here are the "perfect
knowledge" ones: the jobs running (with their requested end, never their actual run
time) and queued, in queue order. Work whose requested time is unknown (a pilot without a
limit, a claim) is shown asking for :data:`~gridcore.model.ASSUMED_RUNTIME_S`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gridcore.model import ASSUMED_RUNTIME_S
from gridcore.policies.wait_prediction import QueuedJob, QueueView, RunningJob, WaitModel
from gridcore.sim.cluster import Cluster, Queued


def queue_view(cluster: Cluster, now: float, ahead: Sequence[QueuedJob] = ()) -> QueueView:
    """``cluster`` at ``now``, with ``ahead`` (work about to reach its queue) queued
    behind what is there."""
    started = {work.name: work for work, _, _ in cluster.started_work()}
    running = []
    for holder in cluster.running():
        work = started.get(holder.holder)
        end = holder.requested_end_s
        requested = ASSUMED_RUNTIME_S if end is None else end - holder.started_s
        user = None if work is None else work.user
        running.append(
            RunningJob(holder.holder, holder.processors, holder.started_s, requested, user)
        )
    queued = [queued_job(work, cluster.submitted_at(work)) for work in cluster.waiting()]
    return QueueView(now, cluster.processors, tuple(running), (*queued, *ahead))


def queued_job(work: Queued, submitted_s: float) -> QueuedJob:
    """``work`` as a wait model's queued job."""
    requested = ASSUMED_RUNTIME_S if work.requested_s is None else work.requested_s
    return QueuedJob(work.name, work.processors, submitted_s, requested, work.user)


class ModelWatcher:
    """Feeds one cluster's starts and ends to its wait models (a
    :class:`~gridcore.sim.cluster.Watcher`)."""

    def __init__(self, models: Sequence[WaitModel]) -> None:
        self._models = tuple(models)

    def started(self, work: Queued, submitted_s: float, started_s: float) -> None:
        job = queued_job(work, submitted_s)
        for model in self._models:
            model.observe_start(job, submitted_s, started_s)

    def ended(self, work: Queued, started_s: float, ended_s: float) -> None:
        requested = ASSUMED_RUNTIME_S if work.requested_s is None else work.requested_s
        job = RunningJob(work.name, work.processors, started_s, requested, work.user)
        for model in self._models:
            model.observe_end(job, started_s, ended_s)


def watch_models(
    clusters: Mapping[str, Cluster], models: Mapping[str, Mapping[str, WaitModel]]
) -> None:
    """Each cluster's models (``models``: model name -> cluster -> model) hear of its
    starts and ends."""
    for name, cluster in clusters.items():
        mine = [by_cluster[name] for by_cluster in models.values() if name in by_cluster]
        if mine:
            cluster.watch(ModelWatcher(mine))
