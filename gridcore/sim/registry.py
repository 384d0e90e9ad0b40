"""Experiments and benchmarks by name: what ``gridcore experiment NAME`` and
``gridcore bench NAME`` run.

An entry is an :class:`Experiment`: how to run it (options in, one JSON-able dict out),
the text table a person reads, and optionally the plot. The module that implements it
defines that object; the tables below name it by ``"module:attribute"`` and import it
only when it runs, so the CLI starts without the simulator or the database drivers.
Adding an experiment is one module and one line here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from gridcore.errors import ConfigError

Result = dict[str, Any]


@dataclass(frozen=True)
class RunOptions:
    """What the command line passes to every entry; each reads the options it has."""

    seed: int = 0
    runs: int | None = None
    pg_url: str | None = None
    decisions: int = 2000
    per_process: int = 250


@dataclass(frozen=True)
class Experiment:
    """One registered experiment or benchmark.

    ``run`` makes the figures; ``table`` renders them for a person (from the result only,
    never typed by hand); ``plot(result, path)`` writes a PNG (needs matplotlib, the
    ``plot`` extra); ``ok`` says whether the run passed (the exit status);
    ``default_runs`` is ``None`` when the entry takes no ``--runs``.
    """

    summary: str
    run: Callable[[RunOptions], Result]
    table: Callable[[Mapping[str, Any]], str]
    plot: Callable[[Mapping[str, Any], str], None] | None = None
    ok: Callable[[Mapping[str, Any]], bool] = lambda result: True
    default_runs: int | None = None

    def execute(self, options: RunOptions) -> Result:
        """Run with ``options``, ``runs`` resolved (:meth:`runs`)."""
        return self.run(replace(options, runs=self.runs(options)))

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


def text_table(columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[object]]) -> str:
    """Columns ``(title, format spec)`` over rows of values taken from a result: the
    titles aligned to each spec's width, then one line per row."""
    # A title takes its column's alignment and width, not its precision or type.
    widths = [spec.split(".")[0].rstrip("bcdeEfFgGnosxX%") for _, spec in columns]
    titles = zip(columns, widths, strict=True)
    lines = [" ".join(f"{title:{width}}" for (title, _), width in titles)]
    for row in rows:
        values = zip(row, columns, strict=True)
        lines.append(" ".join(f"{value:{spec}}" for value, (_, spec) in values))
    return "\n".join(lines)


EXPERIMENTS: Mapping[str, str] = MappingProxyType(
    {
        "stateful-selection": "gridcore.sim.experiments:STATEFUL_SELECTION",
        "koala-placement": "gridcore.sim.coalloc_experiments:KOALA_PLACEMENT",
        "koala-claiming": "gridcore.sim.koala_experiments:KOALA_CLAIMING",
    }
)
"""``gridcore experiment NAME``: the seed papers' experiments on the simulator."""

BENCHMARKS: Mapping[str, str] = MappingProxyType(
    {
        "selection": "gridcore.bench:SELECTION",
        "placement": "gridcore.bench:PLACEMENT",
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
