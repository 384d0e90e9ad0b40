"""A storage plan as stages a live site (and an Airflow DAG) can run: fetch batch
volumes, run pipelines' jobs at a bounded concurrency, evict batch volumes, in order.

Seed: Bent et al., "Data-Driven Batch Scheduling", DADC 2009, Sec. 2 and Fig. 2
(``docs/papers.md``). Each strategy's traversal
is defined here once, as the static sequence of stages that a process pool or a DAG of
tasks executes, one stage after the other (a stage boundary is one of the paper's
barriers); the simulator (:mod:`gridcore.sim.dataplan`) runs the same stages' pipeline
order and groups, so Minimal's group width is this module's alone:

* ``All`` / ``AllBatch``: fetch every batch volume; then every pipeline depth-first
  (its jobs at depths ``0 .. D-1`` one after the other), ``C`` pipelines at a time
  (All: ``min(W, N_CPU)``; AllBatch: Eq. 15's ``C``); then evict every batch volume.
* ``Slice``: per depth (breadth-first): fetch the depth's batch volume, run every
  pipeline's job at that depth (at most ``N_CPU`` at once; storage decides how many of
  them hold a second private volume, through the capacity ledger), evict it.
* ``Minimal``: groups of ``C`` pipelines (Eq. 23's, or the group width a chooser picked),
  each a Slice of its own: per depth fetch, that group's jobs, evict; every group
  refetches every batch volume.
* ``Remote``: every pipeline depth-first, ``min(W, N_CPU)`` at a time, reading batch
  data where it lives: nothing fetched, nothing evicted.

What the stages do not say, the executor's ledger does: a job starts only once its
private output's bytes are held (a job that does not fit waits), so storage is never
exceeded whatever the concurrency, and also if a DAG built from the stages is edited.
Depths without a batch volume get no fetch or evict stage. Pure: no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from gridcore.errors import ConfigError
from gridcore.policies.dataplan import Strategy


class StageKind(enum.StrEnum):
    FETCH = "fetch"  # stage batch volumes to the site
    JOBS = "jobs"  # run pipelines' jobs
    EVICT = "evict"  # delete batch volumes from the site and release their bytes


@dataclass(frozen=True)
class Stage:
    """One step of a plan. FETCH / EVICT: the batch volumes of ``depths``. JOBS: each of
    ``pipelines`` (0-based, in order) runs its jobs at ``depths`` one after the other,
    at most ``concurrency`` pipelines at a time. ``name`` is unique within a plan and a
    valid task id (``fetch_d0``, ``jobs_g1_d2``, ``pipelines``)."""

    kind: StageKind
    name: str
    depths: tuple[int, ...]
    pipelines: tuple[int, ...] = ()
    concurrency: int = 1


def plan_stages(
    strategy: Strategy,
    *,
    W: int,
    D: int,
    N_CPU: int,
    concurrency: float,
    group_width: int | None = None,
    batch_depths: Iterable[int] | None = None,
) -> tuple[Stage, ...]:
    """The stages of ``strategy`` for ``W`` pipelines of ``D`` jobs on ``N_CPU``
    processors (module docstring). ``concurrency`` is the plan's ``C`` (used by AllBatch
    and, when ``group_width`` is None, by Minimal); ``batch_depths`` the depths that
    have a batch volume (None: all)."""
    for name, value in (("W", W), ("D", D), ("N_CPU", N_CPU)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"plan_stages: {name} must be an integer >= 1, got {value!r}")
    if group_width is not None and (isinstance(group_width, bool) or group_width < 1):
        raise ConfigError(f"plan_stages: group_width must be >= 1, got {group_width!r}")
    batched = tuple(sorted(set(range(D) if batch_depths is None else batch_depths)))
    if any(d < 0 or d >= D for d in batched):
        raise ConfigError(f"plan_stages: batch_depths must lie in 0..{D - 1}, got {batched}")
    everyone = tuple(range(W))
    depth_first = tuple(range(D))
    if strategy is Strategy.REMOTE:
        return (Stage(StageKind.JOBS, "pipelines", depth_first, everyone, min(W, N_CPU)),)
    if strategy in (Strategy.ALL, Strategy.ALL_BATCH):
        C = min(W, N_CPU) if strategy is Strategy.ALL else _whole(concurrency, W, N_CPU)
        return (
            *([Stage(StageKind.FETCH, "fetch", batched)] if batched else []),
            Stage(StageKind.JOBS, "pipelines", depth_first, everyone, C),
            *([Stage(StageKind.EVICT, "evict", batched)] if batched else []),
        )
    if strategy is Strategy.SLICE:
        return _slices(((everyone, ""),), D, batched, min(W, N_CPU))
    if strategy is Strategy.MINIMAL:
        width = group_width if group_width is not None else _whole(concurrency, W, N_CPU)
        width = min(width, W)
        groups = tuple(
            (everyone[start : start + width], f"g{start // width}_") for start in range(0, W, width)
        )
        return _slices(groups, D, batched, min(width, N_CPU))
    raise ConfigError(f"plan_stages: unknown strategy {strategy!r}")


def _whole(concurrency: float, W: int, N_CPU: int) -> int:
    # Eq. 15 / 23 are floors already; a fractional C (a chooser's) runs its floor, >= 1
    return max(1, min(W, N_CPU, int(concurrency)))


def _slices(
    groups: tuple[tuple[tuple[int, ...], str], ...],
    D: int,
    batched: tuple[int, ...],
    concurrency: int,
) -> tuple[Stage, ...]:
    stages: list[Stage] = []
    for pipelines, prefix in groups:
        for d in range(D):
            if d in batched:
                stages.append(Stage(StageKind.FETCH, f"fetch_{prefix}d{d}", (d,)))
            stages.append(
                Stage(
                    StageKind.JOBS,
                    f"jobs_{prefix}d{d}",
                    (d,),
                    pipelines,
                    min(concurrency, len(pipelines)),
                )
            )
            if d in batched:
                stages.append(Stage(StageKind.EVICT, f"evict_{prefix}d{d}", (d,)))
    return tuple(stages)
