"""Site selection and VJM's co-allocation on clusters that carry real logs' load
(issue 22 item 6): the default selection against naive and an ``sbatch -M`` peer, and
VJM's cluster selection with each wait model against Eq. 1 alone.

The rules, fixed before any run on the logs it is reported on: ``docs/experiments.md``
(section ``gridcore/experiments/selection_traces.py``, "selection-traces: fixed before
results").
"""

from __future__ import annotations

import bisect
import copy
import functools
import heapq
import math
import random
import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from gridcore.errors import ConfigError
from gridcore.experiments.registry import Experiment, RunOptions, text_table
from gridcore.experiments.selection import canonical_trace
from gridcore.policies.selection import DEFAULT_PROTOCOL, InsufficientMode, SelectionProtocol
from gridcore.policies.wait_prediction import (
    DEFAULT_WAIT_MODEL,
    WAIT_MODELS,
    PastJob,
    WaitModel,
    history_events,
    learn_event,
)
from gridcore.progress import progress
from gridcore.sim.coreservation import ParallelJob, VjmCluster, VjmParams, simulate_vjm
from gridcore.sim.log_load import LoggedRunning
from gridcore.sim.selection import StreamConfig, View, simulate_selection
from gridcore.sim.workload import LocalJob, SimSite
from gridcore.stats import half_width_95
from gridcore.workloads.machines import MachineUse
from gridcore.workloads.requested import RequestedTimes
from gridcore.workloads.swf import JobLabels, SwfJob, iter_jobs, read_header, skip_reason

WINDOWS = 30
WARM_UP = 0.10
VJM_SUBMIT_S = 240.0
VJM_PROCESSORS = (20, 28)
VJM_RUNTIME_S = (120.0, 600.0)
VJM_MAX_CLUSTERS = 2
VJM_HORIZON_S = 7 * 86_400.0
NAIVE, DEFAULT, PEER = "naive", "default", "sbatch-m"
PROTOCOLS: Mapping[str, StreamConfig] = MappingProxyType(
    {
        NAIVE: StreamConfig(SelectionProtocol.NAIVE, InsufficientMode.RANDOM),
        DEFAULT: StreamConfig(DEFAULT_PROTOCOL, wait_model=DEFAULT_WAIT_MODEL),
        # Slowness is 1 everywhere: the earliest completion is the earliest start.
        PEER: StreamConfig(
            SelectionProtocol.EARLIEST_COMPLETION, wait_model="backfill", view=View.SCHEDULERS
        ),
    }
)


@dataclass(frozen=True, slots=True)
class LoggedJob:
    """One log job a cluster replays: logged times (log seconds), size, requested time
    (an unknown one filled: docs), user."""

    name: str
    submit_s: float
    start_s: float
    run_s: float
    processors: int
    requested_s: float
    user: int | None

    @property
    def end_s(self) -> float:
        return self.start_s + self.run_s

    def local(self, site: str) -> LocalJob:
        return LocalJob(
            self.name,
            site,
            self.submit_s,
            self.run_s,
            self.processors,
            self.requested_s,
            self.user,
        )


@dataclass
class LoggedCluster:
    """A cluster and its log's jobs in submit order (:meth:`add`), with their submit
    times beside, kept once for every window's cut (:class:`LogAt`)."""

    site: SimSite
    jobs: list[LoggedJob] = field(default_factory=list)
    submits: list[float] = field(default_factory=list)
    left_out: int = 0

    def add(self, job: LoggedJob) -> None:
        self.jobs.append(job)
        self.submits.append(job.submit_s)


def load_grid(paths: Sequence[str]) -> list[LoggedCluster]:
    """One cluster per log (its MaxProcs, else MaxNodes, else sized from its jobs), or per
    partition of one multi-cluster log (its jobs carry more than one partition number
    in field 16, whatever its header says), each sized from its jobs
    (:class:`~gridcore.workloads.machines.MachineUse`)."""
    if not paths:
        raise ConfigError("--traces: give at least one workload log")
    read: dict[str, dict[int | None, MachineUse]] = {}
    if len(paths) == 1:
        machines = read[paths[0]] = _machines_by_partition(paths[0])
        if len([n for n in machines if n is not None]) > 1:
            return _partitions(paths[0], machines)
    clusters: list[LoggedCluster] = []
    for path in paths:
        processors = read_header(path).max_procs
        if processors is None:
            # as wait-prediction does (docs/wait-prediction.md, "The replay")
            machines = read.get(path) or _machines_by_partition(path)
            processors = MachineUse.merged(machines.values()).size()[0]
        if processors <= 0:
            raise ConfigError(f"--traces {path}: no MaxProcs or MaxNodes and no job size")
        name = _label(path)
        if any(c.site.name == name for c in clusters):
            name = f"{name}-{len(clusters)}"
        cluster = LoggedCluster(SimSite(name, processors))
        _fill(cluster, iter_jobs(path))
        clusters.append(cluster)
    return clusters


def _machines_by_partition(path: str) -> dict[int | None, MachineUse]:
    """The runs of the jobs the replay keeps (``skip_reason``, as wait-prediction's) per
    partition number (``None``: no partition given); a partition none of whose jobs is
    kept is absent, so it makes no empty cluster."""
    machines: dict[int | None, MachineUse] = {}
    for job in iter_jobs(path):
        if skip_reason(job) is None:
            machines.setdefault(job.partition, MachineUse()).add(job)
    return machines


def _partitions(path: str, machines: Mapping[int | None, MachineUse]) -> list[LoggedCluster]:
    """One cluster per partition, all filled in one pass over the log."""
    fillers = {
        number: _Filler(
            LoggedCluster(SimSite(f"{_label(path)}-p{number}", machines[number].size()[0]))
        )
        for number in sorted(n for n in machines if n is not None)
    }
    for job in iter_jobs(path):
        filler = fillers.get(job.partition) if job.partition is not None else None
        if filler is not None:
            filler.add(job)
    return [filler.cluster for filler in fillers.values()]


def _fill(cluster: LoggedCluster, jobs: Iterator[SwfJob]) -> None:
    filler = _Filler(cluster)
    for job in jobs:
        filler.add(job)


class _Filler:
    """Adds a log's jobs to ``cluster`` one at a time: its requested-time filler is fed
    the kept jobs only (docs/workloads.md), its names are unique (``JobLabels``)."""

    def __init__(self, cluster: LoggedCluster) -> None:
        self.cluster = cluster
        self._requested_times = RequestedTimes()
        self._labels = JobLabels()

    def add(self, job: SwfJob) -> None:
        cluster = self.cluster
        label = self._labels(job)
        size, run, wait = job.size, job.run_s, job.wait_s
        if (
            skip_reason(job) is not None
            or size is None
            or run is None
            or wait is None
            or size > cluster.site.processors
        ):
            cluster.left_out += 1
            return
        requested = self._requested_times.fill(job.requested_s)
        name = f"{cluster.site.name}#{label}"
        cluster.add(
            LoggedJob(name, job.submit_s, job.submit_s + wait, run, size, requested, job.user)
        )


def _label(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    for suffix in (".gz", ".swf"):
        name = name.removesuffix(suffix)
    return name


def common_span(clusters: Sequence[LoggedCluster]) -> tuple[float, float]:
    """From the latest first submit to the earliest last submit."""
    if any(not c.jobs for c in clusters):
        raise ConfigError("--traces: a log has no job to replay")
    start = max(c.jobs[0].submit_s for c in clusters)
    end = min(c.jobs[-1].submit_s for c in clusters)
    if not end > start:
        raise ConfigError("--traces: the logs share no span of time (aligned at their starts)")
    return start, end


def window_starts(span: tuple[float, float], windows: int, seed: int) -> list[float]:
    """The fixed rule: uniform over the span after its first :data:`WARM_UP`."""
    rng = random.Random(f"gridcore.experiments.selection_traces:{seed}")
    low = span[0] + WARM_UP * (span[1] - span[0])
    return [rng.uniform(low, span[1]) for _ in range(windows)]


@dataclass
class LogAt:
    """The logs' clusters from instant ``t0`` on (an ``OtherUsersLog``): what runs
    then, what is queued, and every later arrival."""

    t0: float
    clusters: Sequence[LoggedCluster]

    @property
    def start_s(self) -> float:
        return self.t0

    def running(self, sites: Sequence[SimSite]) -> Sequence[LoggedRunning]:
        return [
            LoggedRunning(job.local(c.site.name), job.start_s)
            for c in self.clusters
            for job in self._splits[c.site.name][0]
        ]

    def jobs(self, sites: Sequence[SimSite]) -> Iterator[LocalJob]:
        queued = sorted(
            (job.local(c.site.name) for c in self.clusters for job in self._splits[c.site.name][1]),
            key=lambda job: job.submit_s,
        )
        later = [self._after(c) for c in self.clusters]
        yield from queued
        yield from heapq.merge(*later, key=lambda job: job.submit_s)

    @property
    def over_capacity(self) -> int:
        """Jobs the logs show running at ``t0`` that their cluster had no room for
        (queued instead: :meth:`_split`)."""
        return sum(len(self._splits[c.site.name][2]) for c in self.clusters)

    @functools.cached_property
    def _splits(self) -> dict[str, tuple[list[LoggedJob], list[LoggedJob], list[LoggedJob]]]:
        """:meth:`_split` per cluster, made once (every run of a window reads it)."""
        return {c.site.name: self._split(c) for c in self.clusters}

    def _split(
        self, cluster: LoggedCluster
    ) -> tuple[list[LoggedJob], list[LoggedJob], list[LoggedJob]]:
        """What runs at ``t0`` and what is queued then. Logs can show more processors in
        use at once than the machine has (CTC SP2's cleaned log: up to 592 of 338, by the
        logged starts and run times); the jobs running at ``t0`` take their processors in
        start order while they fit, and one that does not is queued at ``t0`` instead,
        in its submit order with the others (its whole run ahead of it): the cluster's
        size is never exceeded. Returns (running, queued, the queued that were running)."""
        before = self._before(cluster)
        logged_running = sorted(
            (job for job in before if job.start_s <= self.t0 < job.end_s),
            key=lambda job: (job.start_s, job.submit_s),
        )
        running: list[LoggedJob] = []
        over: list[LoggedJob] = []
        free = cluster.site.processors
        for job in logged_running:
            if job.processors <= free:
                running.append(job)
                free -= job.processors
            else:
                over.append(job)
        queued = [job for job in before if job.start_s > self.t0] + over
        return running, queued, over

    def _before(self, cluster: LoggedCluster) -> list[LoggedJob]:
        cut = bisect.bisect_right(cluster.submits, self.t0)
        return cluster.jobs[:cut]

    def _after(self, cluster: LoggedCluster) -> Iterator[LocalJob]:
        cut = bisect.bisect_right(cluster.submits, self.t0)
        for job in cluster.jobs[cut:]:
            yield job.local(cluster.site.name)


class WarmModels:
    """Every wait model of every cluster, fed the logs' starts and ends in time order up
    to an instant; :meth:`at` gives copies as they stand then (instants in order)."""

    def __init__(self, clusters: Sequence[LoggedCluster]) -> None:
        self._models = {
            c.site.name: {name: factory() for name, factory in WAIT_MODELS.items()}
            for c in clusters
        }
        self._events = {
            c.site.name: history_events(
                PastJob(job.name, job.processors, job.submit_s, job.start_s, job.requested_s,
                        job.user, job.end_s)
                for job in c.jobs
            )
            for c in clusters
        }  # fmt: skip
        self._next = dict.fromkeys(self._events, 0)

    @property
    def fed(self) -> int:
        """Events told to the models so far (each cluster's starts and ends before the
        latest instant asked)."""
        return sum(self._next.values())

    def at(self, t0: float) -> dict[str, dict[str, WaitModel]]:
        """model name -> cluster -> a copy of the model knowing the past of ``t0``."""
        for site, events in self._events.items():
            models = self._models[site].values()
            while self._next[site] < len(events) and events[self._next[site]][0] < t0:
                _, is_start, job = events[self._next[site]]
                self._next[site] += 1
                learn_event(models, is_start, job)
        return {
            name: {site: copy.deepcopy(models[name]) for site, models in self._models.items()}
            for name in WAIT_MODELS
        }


def selection_traces(paths: Sequence[str], windows: int = WINDOWS, seed: int = 0) -> dict[str, Any]:
    """Every window of the fixed rules: the three protocols and VJM with each model."""
    if windows < 2:
        raise ConfigError(f"--windows must be >= 2, got {windows}")
    clusters = load_grid(paths)
    room = sum(sorted((c.site.processors for c in clusters), reverse=True)[:VJM_MAX_CLUSTERS])
    if room < VJM_PROCESSORS[1]:
        raise ConfigError(
            f"--traces: the {VJM_MAX_CLUSTERS} largest clusters have {room} processors, fewer"
            f" than the co-reserved job's up to {VJM_PROCESSORS[1]} (the fixed rules'"
            " VJM job: docs/experiments.md)"
        )
    span = common_span(clusters)
    starts = window_starts(span, windows, seed)
    warm = WarmModels(clusters)
    rows: list[dict[str, Any]] = [{} for _ in starts]
    order = sorted(range(windows), key=lambda k: starts[k])
    for k in progress(order, "windows", unit="window"):
        rows[k] = _window(clusters, starts[k], k, seed, warm.at(starts[k]))
    return {
        "default": {
            "protocol": DEFAULT,
            "selection": DEFAULT_PROTOCOL.value,
            "wait_model": DEFAULT_WAIT_MODEL,
        },
        "windows": windows,
        "protocols": _protocol_figures(rows),
        "references": _reference_figures(rows),
        "vjm": _vjm_figures(rows),
        "done_when": {},
        "grid": {
            "clusters": [
                {
                    "name": c.site.name,
                    "processors": c.site.processors,
                    "jobs": len(c.jobs),
                    "left_out": c.left_out,
                }
                for c in clusters
            ],
            "span_s": list(span),
            "warm_up": WARM_UP,
            "seed": seed,
        },
        "per_window": rows,
    } | _done(rows)


def _window(
    clusters: Sequence[LoggedCluster],
    t0: float,
    k: int,
    seed: int,
    models: Mapping[str, Mapping[str, WaitModel]],
) -> dict[str, Any]:
    sites = [c.site for c in clusters]
    trace = canonical_trace(seed * 1000 + k)
    members = tuple(replace(j, arrival_s=t0 + j.arrival_s, stream=0) for j in trace.jobs)
    log = LogAt(t0, clusters)  # read-only: every run of the window replays it
    row: dict[str, Any] = {
        "window": k,
        "t0_s": t0,
        "logged_running_queued": log.over_capacity,
        "completion_s": {},
        "coallocation_s": {},
        # the floor no protocol can beat: each member reaching a queue after its
        # hysteresis and starting there at once, on the fastest cluster
        "no_wait_s": statistics.median(
            j.hysteresis_s + j.runtime_s * min(site.slowness for site in sites) for j in members
        ),
    }
    for name, config in PROTOCOLS.items():
        # A copy per run: the run feeds its model every start and end, which VJM's run
        # below (and the next protocol's) must not know.
        mine = {m: copy.deepcopy(dict(by)) for m, by in models.items() if m == config.wait_model}
        run = simulate_selection(
            sites,
            members,
            {0: config},
            log=log,
            wait_models=mine,
            seed=seed * 1000 + k,
        )
        row["completion_s"][name] = statistics.median(j.response_s for j in run.jobs)
    rng = random.Random(f"gridcore.experiments.selection_traces:vjm:{seed}:{k}")
    job = ParallelJob(
        "J", t0 + VJM_SUBMIT_S, rng.randint(*VJM_PROCESSORS), rng.uniform(*VJM_RUNTIME_S)
    )
    for name in WAIT_MODELS:
        params = VjmParams(max_clusters=VJM_MAX_CLUSTERS, wait_model=name)
        vjm = simulate_vjm(
            [VjmCluster(site) for site in sites],
            [job],
            params,
            log=log,
            wait_models=copy.deepcopy(dict(models[name])),
            seed=seed,
            horizon_s=t0 + VJM_HORIZON_S,
        )
        row["coallocation_s"][name] = vjm.jobs[0].coallocation_s
    return row


def _stats(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "p90": _quantile(ordered, 0.9),
        "mean": statistics.fmean(ordered),
        "halfwidth_95": half_width_95(ordered) if len(ordered) > 1 else 0.0,
    }


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default); infinite when
    it reaches an infinite one (a job that never started)."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    if position == low:
        return ordered[low]
    if math.isinf(ordered[high]):
        return math.inf
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _protocol_figures(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for name in PROTOCOLS:
        completion = [row["completion_s"] for row in rows]
        figures[name] = {
            "completion_s": _stats([c[name] for c in completion]),
            "ratio_to_naive": _stats([c[name] / c[NAIVE] for c in completion]),
            "ratio_to_peer": _stats([c[name] / c[PEER] for c in completion]),
        }
    return figures


def _reference_figures(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``no_wait``: per window the median member completion if every member started the
    moment it reached a queue (its hysteresis plus its run on the fastest cluster), and
    its ratio to naive's: how far below naive any protocol could go in that window."""
    return {
        "no_wait": {
            "completion_s": _stats([row["no_wait_s"] for row in rows]),
            "ratio_to_naive": _stats(
                [row["no_wait_s"] / row["completion_s"][NAIVE] for row in rows]
            ),
        }
    }


def _vjm_figures(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per wait model, VJM's co-allocation times over every window, a job that never
    started counted as infinite (so the hard windows are not dropped); an infinite
    figure is ``None`` (JSON null), and so are the mean and its interval when any job
    never started."""
    figures: dict[str, Any] = {}
    for name in WAIT_MODELS:
        times = [row["coallocation_s"][name] for row in rows]
        never = sum(1 for t in times if t is None)
        figures[name] = {
            "coallocation_s": _stats(times) if not never else _with_infinite(times),
            "never_started": never,
        }
    return figures


def _with_infinite(times: Sequence[float | None]) -> dict[str, float | None]:
    ordered = sorted(math.inf if t is None else t for t in times)
    median, p90 = statistics.median(ordered), _quantile(ordered, 0.9)
    return {
        "median": None if math.isinf(median) else median,
        "p90": None if math.isinf(p90) else p90,
        "mean": None,
        "halfwidth_95": None,
    }


def _done(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    protocols = _protocol_figures(rows)
    vjm = _vjm_figures(rows)
    default_vjm = vjm[DEFAULT_WAIT_MODEL]["coallocation_s"]["median"]  # None: infinite
    eq1_vjm = vjm["eq1"]["coallocation_s"]["median"]
    return {
        "done_when": {
            "default_over_naive_median_le_0_7": protocols[DEFAULT]["ratio_to_naive"]["median"]
            <= 0.7,
            "default_over_peer_median_le_1": protocols[DEFAULT]["ratio_to_peer"]["median"] <= 1.0,
            "vjm_default_model_median_le_eq1": default_vjm is not None
            and (eq1_vjm is None or default_vjm <= eq1_vjm),
        }
    }


def selection_traces_table(result: Mapping[str, Any]) -> str:
    protocols = text_table(
        [("protocol", "<10"), ("/naive median", ">13.3f"), ("p90", ">7.3f"),
         ("/peer median", ">12.3f"), ("p90", ">7.3f"), ("completion s", ">12.0f")],
        [
            (name, f["ratio_to_naive"]["median"], f["ratio_to_naive"]["p90"],
             f["ratio_to_peer"]["median"], f["ratio_to_peer"]["p90"],
             f["completion_s"]["median"])
            for name, f in result["protocols"].items()
        ],
    )  # fmt: skip
    floor = result["references"]["no_wait"]
    protocols += (
        f"\nno wait (every member starting on reaching a queue, the floor): /naive median"
        f" {floor['ratio_to_naive']['median']:.3f}, p90 {floor['ratio_to_naive']['p90']:.3f}"
    )
    vjm = text_table(
        [("VJM wait model", "<20"), ("co-alloc median s", ">17.0f"), ("p90 s", ">9.0f"),
         ("never started", ">13d")],
        [
            (name, _or_inf(f["coallocation_s"]["median"]), _or_inf(f["coallocation_s"]["p90"]),
             f["never_started"])
            for name, f in result["vjm"].items()
        ],
    )  # fmt: skip
    return f"{protocols}\n\n{vjm}"


def _or_inf(figure: float | None) -> float:
    return math.inf if figure is None else figure


def plot_selection_traces(result: Mapping[str, Any], path: str) -> None:
    """Box plots: per protocol its per-window ratios to naive and to the peer; per wait
    model VJM's co-allocation times."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = result["per_window"]
    names = list(result["protocols"])
    figure = Figure(figsize=(13, 4.5))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 3)
    for ax, base, title in ((axes[0], NAIVE, "completion / naive's"),
                            (axes[1], PEER, "completion / sbatch-m's")):  # fmt: skip
        data = [[r["completion_s"][n] / r["completion_s"][base] for r in rows] for n in names]
        ax.boxplot(data)
        ax.set_xticks(range(1, len(names) + 1), names)
        ax.axhline(1.0, color="grey", linestyle=":")
        ax.set_title(f"median member {title} (per window)", fontsize=9)
    models = list(result["vjm"])
    data = [[r["coallocation_s"][m] for r in rows if r["coallocation_s"][m] is not None]
            for m in models]  # fmt: skip
    axes[2].boxplot(data)
    axes[2].set_xticks(range(1, len(models) + 1), models, rotation=30, ha="right", fontsize=8)
    axes[2].set_yscale("symlog")
    axes[2].set_title("VJM co-allocation time (s) by wait model", fontsize=9)
    grid = ", ".join(f"{c['name']} ({c['processors']})" for c in result["grid"]["clusters"])
    figure.suptitle(f"selection-traces: {result['windows']} windows on {grid}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)


def _run(options: RunOptions) -> dict[str, Any]:
    if not options.traces:
        raise ConfigError("--traces: give the workload logs (one per cluster)")
    windows = WINDOWS if options.windows is None else options.windows
    return selection_traces(options.traces, windows, options.seed)


def _ok(result: Mapping[str, Any]) -> bool:
    return all(result["done_when"].values())


SELECTION_TRACES = Experiment(
    "issue 22: default vs naive vs sbatch -M, and VJM per wait model, on real logs' load",
    _run,
    selection_traces_table,
    plot_selection_traces,
    ok=_ok,
    takes=frozenset({"traces", "windows"}),
)
