"""A paper experiment's figures over seeds: ``gridcore experiment NAME --seeds N``.

One seed is one sample of an experiment: its trace, its background load, its random
choices. A claim a paper makes ("naive finishes the ensemble later than either stateful
protocol") holds on a model only as often as it holds over seeds, so an entry that
declares :class:`OverSeeds` is run once per seed ``seed, seed + 1, ..., seed + N - 1``
and :meth:`OverSeeds.aggregate` reports, beside the first seed's full result:

* ``figures``: every number under the entry's declared sections, keyed as in the result,
  as ``{"mean", "ci95": [low, high], "half_width", "min", "max", "values"}``, ``values``
  being the N per-seed figures in seed order. The interval is Student's t over those N
  values, each seed one independent sample (repetitions inside a seed, ``--runs``, are
  pooled by the experiment first)::

      mean +- t(0.975, N - 1) * s / sqrt(N),  s the sample standard deviation

  It bounds the mean over seeds, not the figure of one more seed.
* ``paper_ordering``: on how many seeds each of the paper's claims (:class:`Claim`)
  holds, and on how many all of them hold together.

Nothing here knows an experiment: each entry names its sections and claims.
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gridcore.stats import half_width_95

Result = Mapping[str, Any]

INTERVAL = "95 % Student t over the per-seed values: mean +- t(0.975, N-1) * s / sqrt(N)"

_ESTIMATE_KEYS = frozenset({"mean", "ci95", "half_width", "min", "max", "values"})


@dataclass(frozen=True)
class Claim:
    """An ordering a paper reports, checked on one seed's result."""

    text: str
    holds: Callable[[Result], bool]


def increasing(section: Sequence[str], names: Sequence[str], metric: str) -> Claim:
    """The claim that ``metric`` grows strictly along ``names`` under ``section``:
    ``increasing(("workloads", "W2"), ("FCM", "CM", "WF"), "mean_response_s")`` holds
    when W2's mean response is FCM's < CM's < WF's."""

    def holds(result: Result) -> bool:
        node = _at(result, section)
        values = [node[name][metric] for name in names]
        return all(a < b for a, b in itertools.pairwise(values))

    return Claim(f"{'.'.join(section)}: {' < '.join(names)} in {metric}", holds)


@dataclass(frozen=True)
class OverSeeds:
    """What an entry reports over seeds: the top-level keys of its result that hold its
    figures (every number below them is aggregated) and the paper's claims."""

    sections: tuple[str, ...]
    claims: tuple[Claim, ...]

    def aggregate(self, results: Sequence[tuple[int, Result]]) -> dict[str, Any]:
        """``over_seeds`` of the results ``(seed, result)`` of two or more seeds."""
        if len(results) < 2:
            raise ValueError(f"an interval needs two or more seeds, got {len(results)}")
        values = [result for _, result in results]
        return {
            "seeds": [seed for seed, _ in results],
            "interval": INTERVAL,
            "figures": {s: _figures([v[s] for v in values]) for s in self.sections},
            "paper_ordering": self._ordering(results),
        }

    def _ordering(self, results: Sequence[tuple[int, Result]]) -> dict[str, Any]:
        kept = {
            claim.text: [seed for seed, result in results if claim.holds(result)]
            for claim in self.claims
        }
        every = [seed for seed, _ in results if all(seed in k for k in kept.values())]
        return {
            "seeds": len(results),
            "kept": len(every),
            "kept_seeds": every,
            "claims": {text: {"kept": len(k), "kept_seeds": k} for text, k in kept.items()},
        }


def estimate(values: Sequence[float]) -> dict[str, Any]:
    """Mean, 95 % Student t interval, range and the values themselves (module docstring)."""
    half = half_width_95(values)
    mean = statistics.fmean(values)
    return {
        "mean": mean,
        "ci95": [mean - half, mean + half],
        "half_width": half,
        "min": min(values),
        "max": max(values),
        "values": list(values),
    }


def render_table(table: Callable[[Result], str], result: Result) -> str:
    """``table`` of ``result``; over seeds, of the means (``mean ± half-width``), under a
    line naming the seeds and above the claims kept."""
    over = result.get("over_seeds")
    if over is None:
        return table(result)
    seeds = over["seeds"]
    view = dict(result)
    for section, figures in over["figures"].items():
        view[section] = _mean_view(result[section], figures)
    head = (
        f"over {len(seeds)} seeds {seeds[0]}-{seeds[-1]}: mean ± half-width of the 95 %"
        f" Student t interval (JSON: over_seeds; other keys: seed {seeds[0]})"
    )
    return "\n".join([head, table(view), *_ordering_lines(over["paper_ordering"])])


@dataclass(frozen=True)
class MeanInterval:
    """A figure over seeds as a table shows it: ``format(x, ">10.1f")`` gives
    ``"mean ± half"``, both with the spec's precision and type, aligned in its width."""

    mean: float
    half_width: float

    def __format__(self, spec: str) -> str:
        match = _SPEC.fullmatch(spec)
        if match is None:
            raise ValueError(f"format spec {spec!r}: expected [align][width][.precision][type]")
        align, width, number = match.group("align", "width", "number")
        number = number.replace("d", ".0f") or "g"
        text = f"{self.mean:{number}} ± {self.half_width:{number}}"
        return f"{text:{(align or '>').replace('=', '>')}{width}}"


_SPEC = re.compile(r"(?P<align>[<>^=]?)(?P<width>\d*)(?P<number>(?:\.\d+)?[deEfFgGn%]?)")


def _figures(nodes: Sequence[Any]) -> Any:
    """Every number of ``nodes`` (one per seed, the same shape) estimated across them."""
    first = nodes[0]
    if _is_number(first):
        return estimate(nodes)
    return {
        key: _figures([node[key] for node in nodes])
        for key, value in first.items()
        if _is_number(value) or isinstance(value, Mapping)
    }


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _mean_view(base: Any, figures: Any) -> Any:
    if isinstance(figures, Mapping) and set(figures) >= _ESTIMATE_KEYS:
        return MeanInterval(figures["mean"], figures["half_width"])
    return {
        key: _mean_view(value, figures[key]) if key in figures else value
        for key, value in base.items()
    }


def _ordering_lines(ordering: Mapping[str, Any]) -> list[str]:
    total = ordering["seeds"]
    lines = [f"paper's ordering kept on {ordering['kept']} of {total} seeds: every claim below"]
    lines += [f"  {claim['kept']:>3}/{total}  {text}" for text, claim in ordering["claims"].items()]
    return lines


def _at(result: Result, section: Sequence[str]) -> Any:
    node: Any = result
    for key in section:
        node = node[key]
    return node
