"""``gridcore experiment wait-prediction --trace LOG.swf [--cluster N]``: every wait model
of :data:`gridcore.policies.wait_prediction.WAIT_MODELS` asked, at each job's submission
in a real log, for that job's wait, knowing only the past; compared with the logged wait.

The replay's rules and the metrics were fixed before any result on the shared logs:
``docs/wait-prediction.md`` (section "Fixed before results").
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gridcore.engine.wait_models import REQUEST_ID
from gridcore.errors import ConfigError
from gridcore.experiments.registry import Experiment, RunOptions, text_table
from gridcore.policies.wait_prediction import (
    DEFAULT_WAIT_MODEL,
    QUANTILE,
    WAIT_MODELS,
    PredictedBackfillModel,
    QueuedJob,
    QueueView,
    RunningJob,
    WaitForecast,
    WaitModel,
    forecast_bin,
)
from gridcore.progress import progress
from gridcore.workloads.machines import MachineUse
from gridcore.workloads.requested import RequestedTimes
from gridcore.workloads.swf import SwfJob, iter_jobs, read_header, skip_reason

WAITED_S = 60.0
"""A job "waited" when its logged wait is above this: a forecast of 0 is within 60 s of
any shorter one."""
NEAR_S = (60.0, 600.0)
REFERENCE = "eq1"
"""The model whose CPU time the others' is divided by (measured in the same run)."""
POLLED = f"{DEFAULT_WAIT_MODEL}_polled"
"""The default model as the live engine runs it (``--poll``, :class:`PolledModel`)."""


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """One job of the replay: its identity in submit order, what a predictor may see of
    it, and its logged times."""

    order: int
    number: int
    processors: int
    submit_s: float
    start_s: float
    end_s: float
    requested_s: float
    user: int | None

    @property
    def wait_s(self) -> float:
        return self.start_s - self.submit_s

    def queued(self) -> QueuedJob:
        return QueuedJob(self.order, self.processors, self.submit_s, self.requested_s, self.user)

    def running(self) -> RunningJob:
        return RunningJob(self.order, self.processors, self.start_s, self.requested_s, self.user)


@dataclass(frozen=True)
class Workload:
    """The jobs to replay (submit order) on a machine of ``processors``, and what was
    skipped and filled in (docs/wait-prediction.md)."""

    jobs: tuple[ReplayJob, ...]
    processors: int
    processors_from: str
    skipped: Mapping[str, int]
    requested_time_filled: int


def load_workload(path: str, cluster: int | None = None) -> Workload:
    """Read ``path`` (partition ``cluster`` only, if given) into a :class:`Workload`."""
    header = read_header(path)
    return _workload(list(iter_jobs(path, partition=cluster)), header.max_procs, cluster)


def _workload(logged: Sequence[SwfJob], max_procs: int | None, cluster: int | None) -> Workload:
    """The :class:`Workload` of ``logged`` (the log's jobs, or partition ``cluster``'s, in
    file order) under the skip rules of docs/wait-prediction.md."""
    skipped = dict.fromkeys(("part_line", "unknown_wait", "unknown_run_time", "unknown_size"), 0)
    kept: list[SwfJob] = []
    for job in logged:
        reason = skip_reason(job)
        if reason is None:
            kept.append(job)
        else:
            skipped[reason] += 1
    if cluster is None and max_procs is not None:
        processors, source = max_procs, "MaxProcs"
    else:
        processors, source = MachineUse().extend(kept).size()
        source += "" if cluster is None else f" of partition {cluster}"
    fitting = [job for job in kept if (job.size or 0) <= processors]
    skipped["larger_than_machine"] = len(kept) - len(fitting)
    fitting.sort(key=lambda job: (job.submit_s, job.number))
    jobs, filled = _replay_jobs(fitting)
    return Workload(tuple(jobs), processors, source, skipped, filled)


def kept_partitions(logged: Sequence[SwfJob]) -> list[int]:
    """The partition numbers (field 16) of the jobs the skip rules keep, in order: more
    than one is a multi-cluster log, replayed one partition at a time."""
    return sorted(
        {job.partition for job in logged if job.partition is not None and skip_reason(job) is None}
    )


def _replay_jobs(logged: Sequence[SwfJob]) -> tuple[list[ReplayJob], int]:
    """The kept jobs with their requested times, an unknown one filled in by the
    workloads' rule (:class:`~gridcore.workloads.requested.RequestedTimes`)."""
    jobs: list[ReplayJob] = []
    requested_times = RequestedTimes()
    for order, job in enumerate(logged):
        requested = requested_times.fill(job.requested_s)
        start = job.submit_s + (job.wait_s or 0.0)
        user = job.user
        jobs.append(
            ReplayJob(
                order,
                job.number,
                job.size or 0,
                job.submit_s,
                start,
                start + (job.run_s or 0.0),
                requested,
                user,
            )
        )
    return jobs, requested_times.filled


@dataclass
class _Timed:
    """A model and the CPU seconds spent in it."""

    model: WaitModel
    cpu_s: float = 0.0


_END, _START = 0, 1


class PolledModel(PredictedBackfillModel):
    """:class:`~gridcore.policies.wait_prediction.PredictedBackfillModel` as the live
    engine runs it (``--poll S``, docs/wait-prediction.md "The live bound, replayed"):
    it sees the queue only at polls, at the first submission at least ``poll_s`` after
    the last poll (the replay shows the queue only at submissions), and forecasts there
    each queued job it has not forecast yet (``observe_queue``, as a decision reading a
    newer observation does live); the job asked about is asked under the live engine's
    request id, which never starts. So its point forecasts are the default's, and its
    bound's residuals come from the polls alone: jobs that start between polls are never
    forecast."""

    name = POLLED

    def __init__(self, poll_s: float) -> None:
        super().__init__()
        self.poll_s = poll_s
        self._polled = -math.inf

    def forecast(self, job: QueuedJob, view: QueueView) -> WaitForecast:
        if view.now >= self._polled + self.poll_s:
            self.observe_queue(view)
            self._polled = view.now
        asked = QueuedJob(REQUEST_ID, job.processors, job.submitted_at, job.requested_s, job.user)
        return super().forecast(asked, view)


def replay(
    workload: Workload, models: Mapping[str, WaitModel]
) -> tuple[dict[str, list[WaitForecast]], dict[str, float]]:
    """Ask every model for every job's wait at its submission, showing only the past
    (docs/wait-prediction.md): the forecasts per model in job order, and the CPU seconds
    each model spent in its own calls."""
    timed = {name: _Timed(model) for name, model in models.items()}
    forecasts: dict[str, list[WaitForecast]] = {name: [] for name in models}
    _run_replay(workload, timed, forecasts)
    return forecasts, {name: entry.cpu_s for name, entry in timed.items()}


def _run_replay(
    workload: Workload,
    timed: Mapping[str, _Timed],
    forecasts: Mapping[str, list[WaitForecast]],
) -> None:
    events: list[tuple[float, int, int]] = []  # (time, _END before _START, order)
    queued: dict[int, QueuedJob] = {}
    running: dict[int, RunningJob] = {}
    jobs = workload.jobs
    clock = time.process_time
    for job in progress(jobs, "jobs", unit="job"):
        now = job.submit_s
        while events and events[0][0] <= now:
            at, kind, order = heapq.heappop(events)
            past = jobs[order]
            if kind == _START:
                shown = queued.pop(order)
                running[order] = past.running()
                heapq.heappush(events, (past.end_s, _END, order))
                for entry in timed.values():
                    began = clock()
                    entry.model.observe_start(shown, past.submit_s, at)
                    entry.cpu_s += clock() - began
            else:
                ended = running.pop(order)
                for entry in timed.values():
                    began = clock()
                    entry.model.observe_end(ended, past.start_s, at)
                    entry.cpu_s += clock() - began
        view = QueueView(now, workload.processors, tuple(running.values()), tuple(queued.values()))
        shown = job.queued()
        for name, entry in timed.items():
            began = clock()
            answer = entry.model.forecast(shown, view)
            entry.cpu_s += clock() - began
            forecasts[name].append(answer)
        queued[job.order] = shown
        heapq.heappush(events, (job.start_s, _START, job.order))


def wait_prediction_experiment(
    path: str, cluster: int | None = None, poll_s: float | None = None
) -> dict[str, Any]:
    """The figures of ``gridcore experiment wait-prediction`` (module docstring). Without
    ``cluster``, a log whose kept jobs carry several partition numbers is replayed one
    partition at a time and pooled (:func:`_partitions_experiment`). With ``poll_s``, one
    more predictor, :data:`POLLED` (:class:`PolledModel`)."""
    header = read_header(path)
    logged = list(iter_jobs(path, partition=cluster))
    if cluster is None:
        numbers = kept_partitions(logged)
        if len(numbers) > 1:
            return _partitions_experiment(path, logged, header.max_procs, poll_s)
    workload = _workload(logged, header.max_procs, cluster)
    if not workload.jobs:
        raise ConfigError(f"{path}: no job to replay (skipped: {dict(workload.skipped)})")
    forecasts, cpu_s = _replay_fresh(workload, poll_s)
    actual = np.array([job.wait_s for job in workload.jobs])
    waited = actual > WAITED_S
    predictors = _predictor_figures(forecasts, actual, cpu_s)
    return {
        "jobs": len(workload.jobs),
        "default": DEFAULT_WAIT_MODEL,
        "skipped": dict(workload.skipped),
        "predictors": predictors,
        "trace": {
            "path": path,
            "cluster": cluster,
            "processors": workload.processors,
            "processors_from": workload.processors_from,
            "requested_time_filled": workload.requested_time_filled,
            "waited": int(waited.sum()),
            "poll_s": poll_s,
        },
        "done_when": done_when(predictors),
    }


def _replay_fresh(
    workload: Workload, poll_s: float | None
) -> tuple[dict[str, list[WaitForecast]], dict[str, float]]:
    """:func:`replay` with a fresh model of every :data:`WAIT_MODELS` entry (and, with
    ``poll_s``, a :class:`PolledModel`)."""
    models: dict[str, WaitModel] = {name: factory() for name, factory in WAIT_MODELS.items()}
    if poll_s is not None:
        models[POLLED] = PolledModel(poll_s)
    return replay(workload, models)


def _predictor_figures(
    forecasts: Mapping[str, Sequence[WaitForecast]],
    actual: np.ndarray,
    cpu_s: Mapping[str, float] | None,
) -> dict[str, Any]:
    """Per model, :func:`metrics` of all and of the waited jobs; with ``cpu_s``, its CPU
    seconds per 1,000 forecasts and their ratio to :data:`REFERENCE`'s."""
    waited = actual > WAITED_S
    predictors: dict[str, Any] = {}
    for name, answers in forecasts.items():
        point = np.array([a.wait_s for a in answers])
        bound = np.array([math.inf if a.bound_s is None else a.bound_s for a in answers])
        has_bound = any(a.confidence is not None for a in answers)
        predictors[name] = {
            "all": metrics(point, actual, bound if has_bound else None),
            "waited": metrics(point[waited], actual[waited], bound[waited] if has_bound else None),
        }
        if cpu_s is not None:
            predictors[name]["s_per_1000"] = cpu_s[name] / actual.size * 1000.0
    if cpu_s is not None:
        reference = predictors[REFERENCE]["s_per_1000"]
        for figures in predictors.values():
            figures[f"s_per_1000_over_{REFERENCE}"] = (
                figures["s_per_1000"] / reference if reference > 0 else None
            )
    return predictors


def _partitions_experiment(
    path: str, logged: Sequence[SwfJob], max_procs: int | None, poll_s: float | None
) -> dict[str, Any]:
    """A multi-cluster log without ``--cluster``: each partition replayed on its own, as
    ``--cluster N`` does (its own machine and queue, fresh models), the figures pooled
    over all partitions' jobs and given per partition under ``partitions``; jobs with no
    partition are skipped (docs/wait-prediction.md, "Running it")."""
    skipped: dict[str, int] = {}
    names = [*WAIT_MODELS, *([POLLED] if poll_s is not None else [])]
    forecasts: dict[str, list[WaitForecast]] = {name: [] for name in names}
    cpu_s = dict.fromkeys(names, 0.0)
    actual: list[np.ndarray] = []
    partitions: dict[str, Any] = {}
    processors = filled = 0
    numbers = sorted({job.partition for job in logged if job.partition is not None})
    for number in numbers:
        workload = _workload([job for job in logged if job.partition == number], max_procs, number)
        for reason, count in workload.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + count
        if not workload.jobs:  # every job of it skipped: counted, nothing to replay
            continue
        own, own_cpu_s = _replay_fresh(workload, poll_s)
        waits = np.array([job.wait_s for job in workload.jobs])
        for name, answers in own.items():
            forecasts[name].extend(answers)
            cpu_s[name] += own_cpu_s[name]
        actual.append(waits)
        processors += workload.processors
        filled += workload.requested_time_filled
        partitions[str(number)] = {
            "jobs": len(workload.jobs),
            "waited": int((waits > WAITED_S).sum()),
            "processors": workload.processors,
            "processors_from": workload.processors_from,
            "skipped": dict(workload.skipped),
            "requested_time_filled": workload.requested_time_filled,
            "predictors": _predictor_figures(own, waits, None),
        }
    skipped["no_partition"] = sum(1 for job in logged if job.partition is None)
    pooled = np.concatenate(actual)
    predictors = _predictor_figures(forecasts, pooled, cpu_s)
    return {
        "jobs": int(pooled.size),
        "default": DEFAULT_WAIT_MODEL,
        "skipped": skipped,
        "predictors": predictors,
        "trace": {
            "path": path,
            "cluster": None,
            "processors": processors,
            "processors_from": "sum over partitions (each sized from its jobs)",
            "requested_time_filled": filled,
            "waited": int((pooled > WAITED_S).sum()),
            "partitions_replayed": [int(number) for number in partitions],
            "poll_s": poll_s,
        },
        "partitions": partitions,
        "done_when": done_when(predictors),
    }


def metrics(forecast: np.ndarray, actual: np.ndarray, bound: np.ndarray | None) -> dict[str, Any]:
    """The figures of one predictor on one set of jobs (docs/wait-prediction.md)."""
    jobs = int(actual.size)
    if jobs == 0:
        return {"jobs": 0}
    error = np.abs(forecast - actual)
    figures: dict[str, Any] = {"jobs": jobs}
    for near in NEAR_S:
        figures[f"within_{near:.0f}s"] = float(np.mean(error <= near))
    figures["median_abs_error_s"] = float(np.median(error))
    figures["rank_correlation"] = spearman(forecast, actual)
    figures["hindsight_bin_bound"] = hindsight_bin_bound(forecast, actual)
    if bound is not None:
        # an infinite bound is no bound (the model gave none): not covered
        figures["coverage"] = float(np.mean(np.isfinite(bound) & (actual <= bound)))
        ratio = float(np.median(bound / np.maximum(actual, WAITED_S)))
        figures["bound_over_actual_median"] = ratio if math.isfinite(ratio) else None
        figures["bounded"] = float(np.mean(np.isfinite(bound)))
    return figures


def hindsight_bin_bound(forecast: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    """The default's bound rule (forecast + a margin per forecast bin,
    :data:`FORECAST_BINS_S`, never below the forecast) with each bin's margin known in
    hindsight: the smallest residual (wait - forecast) of the bin's jobs with at least
    :data:`QUANTILE` of them at or below it. A reference, not a predictor: how low
    ``bound_over_actual_median`` can go at that coverage on this log for any bound of
    that form over these point forecasts (docs/wait-prediction.md, "What they say")."""
    bins = np.array([forecast_bin(wait) for wait in forecast.tolist()], dtype=int)
    residual = actual - forecast
    bound = np.empty_like(actual, dtype=float)
    for index in np.unique(bins):
        members = bins == index
        margin = np.quantile(residual[members], QUANTILE, method="inverted_cdf")
        bound[members] = forecast[members] + max(0.0, float(margin))
    return {
        "coverage": float(np.mean(actual <= bound)),
        "bound_over_actual_median": float(np.median(bound / np.maximum(actual, WAITED_S))),
    }


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman's rank correlation, average ranks for ties; ``None`` when either side
    is constant (no ranking to correlate)."""
    rx, ry = _ranks(x), _ranks(y)
    sx, sy = rx.std(), ry.std()
    if sx == 0 or sy == 0:
        return None
    return float(np.mean((rx - rx.mean()) * (ry - ry.mean())) / (sx * sy))


def _ranks(values: np.ndarray) -> np.ndarray:
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    before = np.cumsum(counts) - counts
    return (before + (counts + 1) / 2.0)[inverse]


def done_when(predictors: Mapping[str, Any]) -> dict[str, Any]:
    """Issue 22's criteria for the default model on this log (docs/wait-prediction.md)."""
    default = predictors[DEFAULT_WAIT_MODEL]
    ratio = default["all"].get("bound_over_actual_median")
    return {
        "within_600s_waited_above_backfill": default["waited"].get("within_600s", 0.0)
        > predictors["backfill"]["waited"].get("within_600s", 0.0),
        "coverage_at_least_0.95": default["all"].get("coverage", 0.0) >= 0.95,
        "bound_over_actual_median_at_most_5": ratio is not None and ratio <= 5.0,
    }


def wait_prediction_table(result: Mapping[str, Any]) -> str:
    """One line per model: waited jobs' accuracy, every job's bound, CPU time."""
    columns = [
        ("predictor", "<18"),
        ("waited", ">6d"),
        ("w<=60s", ">6.3f"),
        ("w<=600s", ">7.3f"),
        ("w_med_err_s", ">11.0f"),
        ("w_rank", ">6s"),
        ("all<=600s", ">9.3f"),
        ("coverage", ">8s"),
        ("bound/act", ">9s"),
        ("hindsight", ">9.2f"),
        ("s/1000", ">7.3f"),
    ]
    rows = []
    for name, figures in result["predictors"].items():
        waited, every = figures["waited"], figures["all"]
        rows.append(
            [
                name + (" *" if name == result["default"] else ""),
                waited["jobs"],
                waited.get("within_60s", 0.0),
                waited.get("within_600s", 0.0),
                waited.get("median_abs_error_s", 0.0),
                _optional(waited.get("rank_correlation"), ".3f"),
                every["within_600s"],
                _optional(every.get("coverage"), ".3f"),
                _optional(every.get("bound_over_actual_median"), ".2f"),
                every["hindsight_bin_bound"]["bound_over_actual_median"],
                figures["s_per_1000"],
            ]
        )
    table = text_table(columns, rows)
    replayed = result["trace"].get("partitions_replayed")
    if replayed is None:
        return table
    return (
        f"{table}\n{len(replayed)} partitions replayed separately (each its own machine and"
        f" queue: {', '.join(map(str, replayed))}), figures pooled over their"
        f" {result['jobs']} jobs; per partition: JSON key partitions"
    )


def _optional(value: float | None, spec: str) -> str:
    return "-" if value is None else f"{value:{spec}}"


def plot_wait_prediction(result: Mapping[str, Any], path: str) -> None:
    """Write a PNG: per model, the share of waited jobs within 60 s and 600 s, and the
    bound's coverage where it has one."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    predictors: Mapping[str, Mapping[str, Any]] = result["predictors"]
    names = list(predictors)
    figure = Figure(figsize=(10, 4))
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2)
    positions = np.arange(len(names))
    for offset, key in ((-0.2, "within_60s"), (0.2, "within_600s")):
        shares = [predictors[n]["waited"].get(key, 0.0) for n in names]
        left.bar(positions + offset, shares, width=0.4, label=key)
    left.set_title(f"waited jobs (> {WAITED_S:.0f} s): |forecast - actual| within", fontsize=9)
    left.legend(fontsize=8)
    coverage = [predictors[n]["all"].get("coverage") or 0.0 for n in names]
    right.bar(positions, coverage)
    right.axhline(0.95, color="black", linewidth=0.8)
    right.set_title("0.95 bound's coverage (all jobs)", fontsize=9)
    for ax in (left, right):
        ax.set_xticks(positions, names, rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, 1)
    replayed = result["trace"].get("partitions_replayed")
    pooled = "" if replayed is None else f" of {len(replayed)} partitions replayed separately"
    figure.suptitle(f"{result['trace']['path']}: {result['jobs']} jobs{pooled}", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)


def _run(options: RunOptions) -> dict[str, Any]:
    if options.trace is None:
        raise ConfigError("--trace: wait-prediction replays a workload log (SWF); give its path")
    return wait_prediction_experiment(options.trace, options.cluster, options.poll_s)


WAIT_PREDICTION = Experiment(
    "Issue 22: wait models asked at each job's submission in a real log (SWF), vs its wait",
    _run,
    wait_prediction_table,
    plot_wait_prediction,
    takes=frozenset({"trace", "cluster", "poll_s"}),
)
