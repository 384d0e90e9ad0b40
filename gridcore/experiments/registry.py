"""Experiments and benchmarks by name: what ``gridcore experiment NAME`` and
``gridcore bench NAME`` run.

An entry is an :class:`Experiment`: how to run it (options in, one JSON-able dict out),
the text table a person reads, and optionally the plot. The module that implements it
defines that object; the tables below name it by ``"module:attribute"`` and import it
only when it runs, so the CLI starts without the simulator or the database drivers.
Adding an experiment is one module and one line here.

A paper experiment that declares :class:`gridcore.experiments.seeds.OverSeeds` also runs over
several seeds (``--seeds N``): the first seed's full result plus ``over_seeds``, the mean
and 95 % interval of every figure and how many seeds keep the paper's ordering, computed
once for every such entry by :mod:`gridcore.experiments.seeds`.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gridcore.errors import ConfigError
from gridcore.experiments.seeds import OverSeeds, render_table
from gridcore.progress import progress, run_stages

if TYPE_CHECKING:
    from gridcore.sim.log_load import LogReplay

Result = dict[str, Any]


@dataclass(frozen=True)
class RunOptions:
    """What the command line passes to every entry; each reads the options it has.

    ``seeds`` is how many seeds (``seed`` onwards) to run, 1 being one run as without the
    option. ``None`` means "not given" for the options only some entries take (their
    :attr:`Experiment.takes`): ``comm_factor`` and ``growth_table`` (the execution-time
    growth table as JSON text, parsed by the entry) for koala-placement,
    ``monitor_interval_s``, ``case`` (a selection-robustness case's seed, replayed) and
    ``all_orderings`` (True when given) for stateful-selection, ``cases`` for
    selection-robustness, ``live`` (True when given) for dataplan, ``trace`` (a workload
    log's path), ``cluster`` (its partition) and ``poll_s`` (the live bound replayed with
    polls this far apart) for wait-prediction. Errors name
    the command-line option. ``background`` (the ``--background LOG.swf[@SITE]`` given),
    with its window, offset and scale, for every entry whose models have other users
    (:data:`BACKGROUND`, read by :func:`log_replay`); ``traces`` and ``windows`` for
    selection-traces.
    """

    seed: int = 0
    runs: int | None = None
    pg_url: str | None = None
    decisions: int = 2000
    per_process: int = 250
    seeds: int = 1
    comm_factor: float | None = None
    growth_table: str | None = None
    monitor_interval_s: float | None = None
    cases: int | None = None
    case: int | None = None
    all_orderings: bool | None = None
    live: bool | None = None
    grid: str | None = None
    site: str | None = None
    background: tuple[str, ...] | None = None
    background_window: str | None = None
    background_offset: str | None = None
    background_scale: float | None = None
    traces: tuple[str, ...] | None = None
    windows: int | None = None
    trace: str | None = None
    cluster: int | None = None
    poll_s: float | None = None

    def __post_init__(self) -> None:
        if self.cases is not None and self.cases < 1:
            raise ConfigError(f"--cases must be >= 1, got {self.cases}")
        if self.seeds < 1:
            raise ConfigError(f"--seeds must be >= 1, got {self.seeds}")
        # 0 is a question worth asking: co-allocation without a wide-area penalty.
        if self.comm_factor is not None and not (
            math.isfinite(self.comm_factor) and self.comm_factor >= 0
        ):
            raise ConfigError(f"--comm-factor must be finite and >= 0, got {self.comm_factor}")
        if self.monitor_interval_s is not None and not (
            math.isfinite(self.monitor_interval_s) and self.monitor_interval_s > 0
        ):
            raise ConfigError(
                f"--monitor-interval must be finite and > 0 seconds, got {self.monitor_interval_s}"
            )
        if self.poll_s is not None and not (math.isfinite(self.poll_s) and self.poll_s > 0):
            raise ConfigError(f"--poll must be finite and > 0 seconds, got {self.poll_s}")


BACKGROUND = frozenset({"background", "background_window", "background_offset", "background_scale"})
"""The options of an entry whose models have other users: a real log as their load."""


def log_replay(options: RunOptions) -> LogReplay | None:
    """The ``--background`` logs of ``options`` as one replay, ``None`` without any
    (refused with an error naming the option when malformed)."""
    from gridcore.sim.log_load import LogReplay, parse_log_loads

    loads = parse_log_loads(
        options.background or (),
        options.background_window,
        options.background_offset,
        options.background_scale,
    )
    return LogReplay(loads) if loads else None


def background_figures(log: LogReplay | None) -> Result:
    """What an entry reports of its ``--background`` logs: per log its window, offset,
    scale and the jobs replayed and left out (summed over the entry's runs)."""
    return {} if log is None else {"background": log.describe()}


OPTIONAL_OPTIONS: Mapping[str, str] = MappingProxyType(
    {
        "comm_factor": "--comm-factor",
        "growth_table": "--growth-table",
        "monitor_interval_s": "--monitor-interval",
        "cases": "--cases",
        "case": "--case",
        "all_orderings": "--all-orderings",
        "live": "--live",
        "grid": "--grid",
        "site": "--site",
        "background": "--background",
        "background_window": "--background-window",
        "background_offset": "--background-offset",
        "background_scale": "--background-scale",
        "traces": "--traces",
        "windows": "--windows",
        "trace": "--trace",
        "cluster": "--cluster",
        "poll_s": "--poll",
    }
)
"""The :class:`RunOptions` only some entries take, by the command-line option that sets them."""


@dataclass(frozen=True)
class Experiment:
    """One registered experiment or benchmark.

    ``run`` makes the figures; ``table`` renders them for a person (from the result only,
    never typed by hand); ``plot(result, path)`` writes a PNG (needs matplotlib, the
    ``plot`` extra); ``ok`` says whether the run passed (the exit status);
    ``default_runs`` is ``None`` when the entry takes no ``--runs``; ``takes`` names the
    :data:`OPTIONAL_OPTIONS` it reads (any other given is refused); ``over_seeds`` says
    what to report over ``--seeds`` (``None``: the entry takes no ``--seeds``), unless
    ``own_seeds``: the entry reads ``--seeds`` itself, in one run (koala-idle-soon runs
    both of its arms on every seed and compares them over the seeds);
    ``across_seeds(options)`` makes figures from all the seeds at once (once per run,
    merged into the result, e.g. stateful-selection's ``orderings``).
    """

    summary: str
    run: Callable[[RunOptions], Result]
    table: Callable[[Mapping[str, Any]], str]
    plot: Callable[[Mapping[str, Any], str], None] | None = None
    ok: Callable[[Mapping[str, Any]], bool] = lambda result: True
    default_runs: int | None = None
    takes: frozenset[str] = frozenset()
    over_seeds: OverSeeds | None = None
    across_seeds: Callable[[RunOptions], Result] | None = None
    own_seeds: bool = False
    default_seeds: int = 1
    """The seeds the command line runs without ``--seeds`` (``gridcore.cli`` resolves
    it); a caller building :class:`RunOptions` itself gives ``seeds``."""

    def execute(self, options: RunOptions) -> Result:
        """Run with ``options``, ``runs`` resolved (:meth:`runs`). Over N > 1 seeds: the
        result of the first seed with ``over_seeds`` added (:mod:`gridcore.experiments.seeds`);
        the plot, if any, is then the first seed's."""
        self._refuse_unread(options)
        if "background" in self.takes:
            log_replay(options)  # a bad --background is refused before anything runs
        options = replace(options, runs=self.runs(options))
        across = {} if self.across_seeds is None else self.across_seeds(options)
        if options.seeds == 1 or self.own_seeds:
            return self.run(options) | across
        if self.over_seeds is None:
            raise ConfigError(f"--seeds: this one reports no figures over seeds ({self.summary})")
        seeds = range(options.seed, options.seed + options.seeds)
        results = [
            (seed, self.run(replace(options, seed=seed)))
            for seed in progress(seeds, "seeds", unit="seed")
        ]
        return results[0][1] | {"over_seeds": self.over_seeds.aggregate(results)} | across

    def render(self, result: Mapping[str, Any]) -> str:
        """The text table of ``result``, of the means over seeds when it has them."""
        return render_table(self.table, result)

    def runs(self, options: RunOptions) -> int:
        """The repetitions ``options`` ask for, or this entry's default."""
        if self.default_runs is None:
            if options.runs is not None:
                raise ConfigError(f"--runs: this one takes no repetitions ({self.summary})")
            return 1
        runs = self.default_runs if options.runs is None else options.runs
        if runs < 1:
            raise ConfigError(f"--runs must be >= 1, got {runs}")
        return runs

    def _refuse_unread(self, options: RunOptions) -> None:
        for field, flag in OPTIONAL_OPTIONS.items():
            if field not in self.takes and getattr(options, field) is not None:
                raise ConfigError(f"{flag}: this one does not take it ({self.summary})")


def text_table(columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[object]]) -> str:
    """Columns ``(title, format spec)`` over rows of values taken from a result: the
    titles aligned to each spec's width, then one line per row. A column whose values
    come out wider than its spec (a mean over seeds with its interval) widens to them."""
    cells = [
        [_cell(value, spec) for value, (_, spec) in zip(row, columns, strict=True)] for row in rows
    ]
    # A title takes its column's alignment and width, not its precision or type.
    heads = [_SPEC_HEAD.match(spec) for _, spec in columns]
    aligns = [head.group("align").replace("=", ">") if head else "" for head in heads]
    widths = [
        max([int(head.group("width") or 0) if head else 0, *(len(line[i][0]) for line in cells)])
        for i, head in enumerate(heads)
    ]
    titles = zip(columns, aligns, widths, strict=True)
    lines = [" ".join(f"{title:{align}{width}}" for (title, _), align, width in titles)]
    for line in cells:
        padded = zip(line, aligns, widths, strict=True)
        lines.append(
            " ".join(f"{text:{align or own}{width}}" for (text, own), align, width in padded)
        )
    return "\n".join(lines)


def figures_line(result: Mapping[str, Any]) -> str:
    """A benchmark's table: ``key=value`` in the result's order, floats to 4 significant
    digits."""
    return " ".join(
        f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"
        for key, value in result.items()
    )


def run_bench_stages(desc: str, stages: Mapping[str, Callable[[], Result]]) -> Result:
    """A benchmark's timed stages run in order under one progress bar
    (:func:`gridcore.progress.run_stages`), their figures merged into one result."""
    results = run_stages(desc, stages)
    return {key: value for result in results.values() for key, value in result.items()}


_SPEC_HEAD = re.compile(r"(?P<align>(?:.?[<>^=])?)[-+ ]?z?#?0?(?P<width>\d*)")


def _cell(value: object, spec: str) -> tuple[str, str]:
    # The text, and the alignment its type takes where the spec names none.
    return f"{value:{spec}}", "<" if isinstance(value, str) else ">"


EXPERIMENTS: Mapping[str, str] = MappingProxyType(
    {
        "stateful-selection": "gridcore.experiments.selection:STATEFUL_SELECTION",
        "koala-placement": "gridcore.experiments.coallocation_placement:KOALA_PLACEMENT",
        "koala-claiming": "gridcore.experiments.coallocation_claiming:KOALA_CLAIMING",
        "koala-idle-soon": "gridcore.experiments.coallocation_idle_soon:KOALA_IDLE_SOON",
        "selection-robustness": "gridcore.experiments.selection_robustness:SELECTION_ROBUSTNESS",
        "vjm-coallocation": "gridcore.experiments.coreservation:VJM_COALLOCATION",
        "vjm-deadlock": "gridcore.experiments.coreservation:VJM_DEADLOCK",
        "dataplan": "gridcore.experiments.dataplan:DATAPLAN",
        "dataplan-robustness": "gridcore.experiments.dataplan_robustness:DATAPLAN_ROBUSTNESS",
        "selection-traces": "gridcore.experiments.selection_traces:SELECTION_TRACES",
        "wait-prediction": "gridcore.experiments.wait_prediction:WAIT_PREDICTION",
    }
)
"""``gridcore experiment NAME``: the seed papers' experiments on the simulator."""

BENCHMARKS: Mapping[str, str] = MappingProxyType(
    {
        "selection": "gridcore.experiments.bench_selection:SELECTION",
        "placement": "gridcore.experiments.bench_coallocation:PLACEMENT",
        "coreservation": "gridcore.experiments.bench_coreservation:CORESERVATION",
        "dataplan": "gridcore.experiments.bench_dataplan:DATAPLAN",
        "slurm-polling": "gridcore.experiments.bench_slurm:SLURM_POLLING",
    }
)
"""``gridcore bench NAME``: decision throughput and latency."""


def load(table: Mapping[str, str], name: str) -> Experiment:
    """The registered entry ``name`` of ``table`` (:data:`EXPERIMENTS` or
    :data:`BENCHMARKS`)."""
    target = table.get(name)
    if target is None:
        raise ConfigError(f"unknown name {name!r}; registered: {', '.join(sorted(table))}")
    module, _, attribute = target.partition(":")
    entry = getattr(importlib.import_module(module), attribute)
    if not isinstance(entry, Experiment):
        raise TypeError(f"{target} is a {type(entry).__name__}, not an Experiment")
    return entry
