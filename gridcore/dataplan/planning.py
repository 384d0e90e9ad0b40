"""Planning a batch-pipeline file on a grid: its padding to the canonical workload of
Bent et al. (DADC 2009, ``docs/papers.md``; the
policy is :mod:`gridcore.policies.dataplan`), the cluster environment a plan is made for,
taken from the grid description, the choosers, and :func:`plan_sites`: every site's plan,
the one entry ``gridcore plan``, the batch-pipeline DAG
(``gridcore_airflow.operators.dataplan``) and the live experiment
(:mod:`gridcore.dataplan.live`) plan with. The file itself is
:mod:`gridcore.dataplan.format`.

Design, equations and the choices where a paper is ambiguous: ``docs/dataplan.md``
(section ``gridcore/dataplan/planning.py``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gridcore.dataplan.choosers import choose_by_simulation
from gridcore.dataplan.format import PipelineFieldError, PipelineSpec, _bytes, _check_fields
from gridcore.engine.dataplan import stage_parameters
from gridcore.errors import ConfigError
from gridcore.model import MB, ORIGIN, GridSpec
from gridcore.policies.dataplan import (
    BandwidthReading,
    DataPlan,
    Environment,
    Strategy,
    Workload,
    choose_bent2009,
    serial_bandwidth,
)
from gridcore.validation import unknown_key

__all__ = [
    "CHOOSERS",
    "DEFAULT_BW_L",
    "DEFAULT_CHOOSER",
    "DEFAULT_F",
    "MEASURED_KEYS",
    "PAPER_CHOOSER",
    "PLAN_CACHE_VERSION",
    "CanonicalWorkload",
    "Chooser",
    "ChosenPlan",
    "DepthPadding",
    "InputPadding",
    "PaddingReport",
    "SitePlan",
    "cached_plan",
    "choose_plan",
    "choose_site",
    "environment_for_site",
    "environment_notes",
    "plan_for_site",
    "plan_sites",
    "to_canonical",
]

DEFAULT_BW_L = BandwidthReading.GIGABIT.bytes_per_s
DEFAULT_F = 0.0
MEASURED_KEYS = ("N_CPU", "S", "F", "BW_R", "BW_L")
PLAN_CACHE_VERSION = 1
"""Bumped when what a cached plan (:func:`cached_plan`) holds or how it is chosen changes."""

Chooser = Callable[[Workload, Environment], DataPlan]
CHOOSERS: Mapping[str, Chooser] = MappingProxyType(
    {"bent2009": choose_bent2009, "simulation": choose_by_simulation}
)
"""Every chooser ``gridcore plan`` reports, by name: each returns the policy's DataPlan.
``bent2009``: the paper's models (Eq. 5-24); ``simulation``: every feasible plan run on
the project's simulator over paired seeds (3, or 10 where nodes fail, raced up to 30), the
fastest mean makespan
(:mod:`gridcore.dataplan.choosers`; its predictions are the simulated means)."""
DEFAULT_CHOOSER = "simulation"
"""The chooser whose pick runs by default
(``gridcore_airflow.operators.dataplan.pipeline_dag``) and decides the site when several
are planned: ours, whose regret ``gridcore experiment dataplan`` measures (the paper's is
reported beside it)."""
PAPER_CHOOSER = "bent2009"
"""The paper's chooser, by name."""

# -- padding to canonical (the paper's Discussion) ---------------------------------------


@dataclass(frozen=True)
class DepthPadding:
    """One depth before and after padding: its batch volume, and the output each
    pipeline writes there; runtimes as written (the canonical ones are the workload's
    ``R_bar`` and ``SD_R``)."""

    depth: int
    job: str
    batch_logical_name: str | None
    batch_bytes: int
    padded_batch_bytes: int
    output_bytes: int
    padded_output_bytes: int
    runtime_mean_s: float
    runtime_sd_s: float

    def padding_bytes(self, W: int) -> int:
        """Bytes added at this depth: to its batch volume and to each of ``W`` outputs."""
        batch = self.padded_batch_bytes - self.batch_bytes
        return batch + W * (self.padded_output_bytes - self.output_bytes)


@dataclass(frozen=True)
class InputPadding:
    """The pipelines' private inputs: how many, their smallest, largest and total size,
    and the size every one is padded to (``S_P``)."""

    count: int
    min_bytes: int
    max_bytes: int
    total_bytes: int
    padded_size_bytes: int

    @property
    def padded_total_bytes(self) -> int:
        return self.count * self.padded_size_bytes

    @property
    def padding_bytes(self) -> int:
        return self.padded_total_bytes - self.total_bytes


@dataclass(frozen=True)
class PaddingReport:
    """What padding to canonical costs. ``actual_bytes``: every volume of the spec once
    (batch per depth, every input, every output); ``padded_bytes``: the canonical
    workload's ``S_TotB + S_TotP``; ``canonical``: nothing was padded and every depth has
    the same runtime mean and sd (the spec already was canonical)."""

    depths: tuple[DepthPadding, ...]
    inputs: InputPadding
    actual_bytes: int
    padded_bytes: int
    canonical: bool
    notes: tuple[str, ...]

    @property
    def padding_bytes(self) -> int:
        return self.padded_bytes - self.actual_bytes

    def as_json(self) -> dict[str, Any]:
        """Totals; per depth its batch volume and EACH pipeline's output (actual and
        padded bytes) and the bytes added there in all; the inputs in all."""
        return {
            "canonical": self.canonical,
            "actual_bytes": self.actual_bytes,
            "padded_bytes": self.padded_bytes,
            "padding_bytes": self.padding_bytes,
            "depths": [self._depth_json(d) for d in self.depths],
            "inputs": {
                "count": self.inputs.count,
                "min_bytes": self.inputs.min_bytes,
                "max_bytes": self.inputs.max_bytes,
                "padded_size_bytes": self.inputs.padded_size_bytes,
                "actual_bytes": self.inputs.total_bytes,
                "padded_bytes": self.inputs.padded_total_bytes,
                "padding_bytes": self.inputs.padding_bytes,
            },
            "notes": list(self.notes),
        }

    def _depth_json(self, d: DepthPadding) -> dict[str, Any]:
        return {
            "depth": d.depth,
            "job": d.job,
            "batch": {
                "logical_name": d.batch_logical_name,
                "actual_bytes": d.batch_bytes,
                "padded_bytes": d.padded_batch_bytes,
            },
            "output": {"actual_bytes": d.output_bytes, "padded_bytes": d.padded_output_bytes},
            "padding_bytes": d.padding_bytes(self.inputs.count),
            "runtime_mean_s": d.runtime_mean_s,
            "runtime_sd_s": d.runtime_sd_s,
        }


@dataclass(frozen=True)
class CanonicalWorkload:
    """The policy's canonical :class:`Workload` for a spec and what padding cost."""

    workload: Workload
    padding: PaddingReport


def to_canonical(
    spec: PipelineSpec, known_sizes: Mapping[str, int] | None = None
) -> CanonicalWorkload:
    """Pad ``spec`` to the paper's canonical workload (docs/dataplan.md): ``S_B`` the
    largest batch volume, ``S_P`` the largest private volume, runtimes the mean of the
    depths'. ``known_sizes``: logical name -> bytes (the replica catalog's) for volumes
    the spec gives no size; a size neither gives is a ConfigError naming the field."""
    sizes = MappingProxyType(dict(known_sizes or {}))
    batch = [_batch_size(spec, i, sizes) for i in range(spec.D)]
    inputs = [_input_size(spec, i, sizes) for i in range(spec.W)]
    outputs = [d.output_bytes for d in spec.depths]
    S_B, S_P = max(batch), max([*inputs, *outputs])
    means = [d.runtime_mean_s for d in spec.depths]
    sds = [d.runtime_sd_s for d in spec.depths]
    workload = Workload(
        spec.W, spec.D, S_B, S_P, math.fsum(means) / spec.D, math.fsum(sds) / spec.D
    )
    depths = tuple(
        DepthPadding(
            i,
            d.name,
            None if d.batch is None else d.batch.logical_name,
            batch[i],
            S_B,
            d.output_bytes,
            S_P,
            d.runtime_mean_s,
            d.runtime_sd_s,
        )
        for i, d in enumerate(spec.depths)
    )
    input_padding = InputPadding(len(inputs), min(inputs), max(inputs), sum(inputs), S_P)
    actual = sum(batch) + sum(inputs) + spec.W * sum(outputs)
    padded = spec.D * S_B + (spec.D + 1) * spec.W * S_P  # S_TotB + S_TotP, as ints
    same_runtimes = len(set(means)) == 1 and len(set(sds)) == 1
    report = PaddingReport(
        depths,
        input_padding,
        actual,
        padded,
        padded == actual and same_runtimes,
        _padding_notes(depths, input_padding, workload, same_runtimes),
    )
    return CanonicalWorkload(workload, report)


def _batch_size(spec: PipelineSpec, i: int, sizes: Mapping[str, int]) -> int:
    batch = spec.depths[i].batch
    if batch is None:
        return 0
    if batch.size_bytes is not None:
        return batch.size_bytes
    return _known(spec, f"depths[{i}].batch.size_bytes", batch.logical_name, sizes)


def _input_size(spec: PipelineSpec, i: int, sizes: Mapping[str, int]) -> int:
    pipeline = spec.pipelines[i]
    if pipeline.size_bytes is not None:
        return pipeline.size_bytes
    return _known(spec, f"pipelines[{i}].size_bytes", pipeline.location, sizes)


def _known(spec: PipelineSpec, at: str, logical_name: str, sizes: Mapping[str, int]) -> int:
    size = sizes.get(logical_name)
    if size is None:
        problem = f"not given, and the replica catalog has no size for {logical_name!r}"
        raise PipelineFieldError(spec.source, at, problem)
    _check_fields(f"{spec.source}: replica catalog", (logical_name, lambda: _bytes(size)))
    return size


def _padding_notes(
    depths: Sequence[DepthPadding], inputs: InputPadding, workload: Workload, same: bool
) -> tuple[str, ...]:
    W = workload.W
    notes = [
        f"depth {d.depth} ({d.job}): +{_size(d.padding_bytes(W))}"
        f" (batch {_size(d.batch_bytes)} -> {_size(d.padded_batch_bytes)},"
        f" outputs {W} x {_size(d.output_bytes)} -> {_size(d.padded_output_bytes)})"
        for d in depths
        if d.padding_bytes(W)
    ]
    if inputs.padding_bytes:
        notes.append(
            f"inputs: +{_size(inputs.padding_bytes)} ({inputs.count} of"
            f" {_size(inputs.min_bytes)}..{_size(inputs.max_bytes)}"
            f" -> {_size(inputs.padded_size_bytes)})"
        )
    if not same:
        notes.append(
            f"runtimes: R_bar = {workload.R_bar:g} s, SD_R = {workload.SD_R:g} s, the mean of the"
            " depths' (the models use only D x R_bar and D x SD_R, which the mean keeps exact)"
        )
    return tuple(notes) or ("already canonical: nothing padded",)


def _size(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n:g} B"


# -- the environment from the grid ---------------------------------------------------------


def environment_for_site(
    grid: GridSpec, site_name: str, measured: Mapping[str, float] | None = None
) -> Environment:
    """The paper's environment (``N_CPU, S, F, BW_R, BW_L``) of ``site_name`` from the grid
    description, with ``measured`` values (keys :data:`MEASURED_KEYS`) overriding it
    (docs/dataplan.md). ConfigError for an unknown site or key, or a site whose storage
    neither the grid nor ``measured`` gives."""
    site = grid.site(site_name)
    observed = dict(measured or {})
    for key in observed:
        if key not in MEASURED_KEYS:
            raise ConfigError(f"measured.{key}: {unknown_key(key, MEASURED_KEYS, listed=True)}")
    if site.storage_bytes is None and "S" not in observed:
        raise PipelineFieldError(
            grid.source,
            f"sites.{site.name}.storage_gb",
            "not set: a data-driven plan needs the site's storage capacity S"
            f" (set storage_gb in [sites.{site.name}], or measure S)",
        )
    values: dict[str, Any] = {
        "N_CPU": site.processors,
        "S": site.storage_bytes,
        "F": DEFAULT_F,
        "BW_R": grid.bandwidth(ORIGIN, site.name) * MB,
        "BW_L": DEFAULT_BW_L,
    }
    values.update(observed)
    try:
        return Environment(**values)
    except ConfigError as exc:
        given = f" (measured: {', '.join(sorted(observed))})" if observed else ""
        raise ConfigError(f"{grid.source}: sites.{site.name}: {exc}{given}") from None


def environment_notes(measured: Iterable[str] = ()) -> tuple[str, ...]:
    """Where the values not measured come from, when not from the grid file."""
    given = set(measured)
    notes = []
    if "BW_L" not in given:
        notes.append(
            f"BW_L = {DEFAULT_BW_L / MB:g} MB/s: the grid has no bandwidth within a site;"
            " 1 Gb/s per node (the policy's BandwidthReading.GIGABIT)"
        )
    if "F" not in given:
        notes.append("F = 0 failure events/s: nothing measured (Table 2's)")
    return tuple(notes)


# -- one site's plan -----------------------------------------------------------------------


@dataclass(frozen=True)
class SitePlan:
    """Every chooser's plan for the canonical workload at one site: the workload with
    runtimes scaled by the site's ``slowness``, the site's environment, the plans by
    chooser name (in :data:`CHOOSERS` order)."""

    site: str
    slowness: float
    workload: Workload
    environment: Environment
    plans: Mapping[str, DataPlan]
    notes: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        """``feasible``, ``predicted`` ({chooser: {strategy: seconds, null if infinite}}),
        ``picks``, ``reasons`` ({chooser: [lines]}), ``site``, ``workload``,
        ``environment``."""
        first = next(iter(self.plans.values()))
        return {
            # Eq. 1-4 (or Remote when none holds) do not depend on the chooser.
            "feasible": [s.value for s in first.feasible],
            "predicted": {
                name: {p.strategy.value: _finite_or_none(p.time_s) for p in plan.predictions}
                for name, plan in self.plans.items()
            },
            "picks": {name: plan.strategy.value for name, plan in self.plans.items()},
            "reasons": {name: _reasons(plan) for name, plan in self.plans.items()},
            "site": self.site,
            "workload": _workload_json(self.workload) | {"slowness": self.slowness},
            "environment": _environment_json(self.environment) | {"notes": list(self.notes)},
        }


def plan_for_site(
    canonical: CanonicalWorkload,
    grid: GridSpec,
    site_name: str,
    *,
    choosers: Mapping[str, Chooser] = CHOOSERS,
    measured: Mapping[str, float] | None = None,
) -> SitePlan:
    """Run every chooser on ``canonical`` at ``site_name`` (runtimes x its slowness)."""
    if not choosers:
        raise ConfigError("plan_for_site: at least one chooser is required")
    env = environment_for_site(grid, site_name, measured)
    slowness = grid.site(site_name).slowness
    base = canonical.workload
    workload = replace(base, R_bar=base.R_bar * slowness, SD_R=base.SD_R * slowness)
    plans = MappingProxyType({name: choose(workload, env) for name, choose in choosers.items()})
    notes = environment_notes(measured or {})
    return SitePlan(site_name, slowness, workload, env, plans, notes)


def plan_sites(
    canonical: CanonicalWorkload,
    grid: GridSpec,
    *,
    site: str | None = None,
    measured: Mapping[str, Mapping[str, float]] | None = None,
    choosers: Mapping[str, Chooser] = CHOOSERS,
) -> tuple[list[SitePlan], dict[str, str]]:
    """Every chooser's plan at every site of ``grid`` (or at ``site`` only), with the
    environment values ``measured`` per site, and the sites skipped with why: a site
    that cannot be planned (no storage) is skipped unless it was asked for, which raises.
    None left is a ConfigError naming why each was skipped."""
    names = [site] if site is not None else list(grid.site_names)
    per_site = measured or {}
    plans, skipped = [], {}
    for name in names:
        try:
            plans.append(
                plan_for_site(canonical, grid, name, choosers=choosers, measured=per_site.get(name))
            )
        except ConfigError as exc:
            if site is not None:
                raise
            skipped[name] = str(exc)
    if not plans:
        raise ConfigError(
            f"no site of grid {grid.source} can be planned: {'; '.join(skipped.values())}"
            " (give a grid whose sites set storage_gb, e.g. examples/pipelines/grid.toml)"
        )
    return plans, skipped


def choose_site(plans: Sequence[SitePlan], chooser: str = DEFAULT_CHOOSER) -> tuple[SitePlan, str]:
    """The site whose ``chooser`` pick is predicted fastest (ties: the first given), and
    why, naming every other site's pick and prediction."""
    if not plans:
        raise ConfigError("choose_site: no site was planned")

    def predicted(plan: SitePlan) -> float:
        return plan.plans[chooser].predicted_s

    best = min(plans, key=predicted)  # min keeps the first of equal keys
    others = "; ".join(
        f"{p.site} {p.plans[chooser].strategy.value} {_time(predicted(p))}"
        for p in plans
        if p is not best
    )
    reason = (
        f"{best.site}: {chooser}'s pick {best.plans[chooser].strategy.value} is predicted"
        f" {_time(predicted(best))}, the fastest of {len(plans)} site(s)"
        + (f" ({others})" if others else "")
    )
    return best, reason


@dataclass(frozen=True)
class ChosenPlan:
    """A chooser's pick at the site chosen for it, as the plain values a DAG is rendered
    from (its stages: :func:`gridcore.engine.dataplan.stages_at_site`) and a cache
    keeps: the strategy, the concurrency ``C`` its prediction was made with, Minimal's
    group width when the chooser widened it, the plan's reasons and why this site."""

    site: str
    chooser: str
    strategy: Strategy
    concurrency: float
    group_width: int | None
    reasons: tuple[str, ...]
    why: str

    def as_json(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "chooser": self.chooser,
            "strategy": self.strategy.value,
            "concurrency": self.concurrency,
            "group_width": self.group_width,
            "reasons": list(self.reasons),
            "why": self.why,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChosenPlan:
        width = data["group_width"]
        return cls(
            str(data["site"]),
            str(data["chooser"]),
            Strategy(data["strategy"]),
            float(data["concurrency"]),
            None if width is None else int(width),
            tuple(str(r) for r in data["reasons"]),
            str(data["why"]),
        )


def choose_plan(
    spec: PipelineSpec, grid: GridSpec, *, site: str | None = None, chooser: str = DEFAULT_CHOOSER
) -> ChosenPlan:
    """Every chooser's plan at every site (:func:`plan_sites`; or at ``site``), and
    ``chooser``'s pick at the site where it is predicted fastest. Sizes are the file's:
    the replica catalog is not read."""
    if chooser not in CHOOSERS:
        raise ConfigError(f"chooser: one of {', '.join(CHOOSERS)}, got {chooser!r}")
    plans, _ = plan_sites(to_canonical(spec), grid, site=site)
    best, why = choose_site(plans, chooser)
    plan = best.plans[chooser]
    concurrency, width = stage_parameters(plan, plan.strategy)
    return ChosenPlan(best.site, chooser, plan.strategy, concurrency, width, plan.reasons, why)


def cached_plan(
    spec: PipelineSpec,
    grid: GridSpec,
    cache_dir: str | os.PathLike[str],
    *,
    site: str | None = None,
    chooser: str = DEFAULT_CHOOSER,
) -> ChosenPlan:
    """:func:`choose_plan`, made once per content: kept in ``cache_dir`` under a hash of
    the parsed pipeline file and grid, the site, the chooser and the source of the code
    that plans (:func:`_planner_digest`), so an unchanged file is never planned twice (a
    DAG parsed every few seconds does not simulate), and any change to either file or
    to the planner plans again. The choice is deterministic (fixed seeds), so a cached
    plan is the one planning would make. A cache that cannot be read is planned again;
    one that cannot be written is not kept."""
    path = Path(cache_dir) / f"{_plan_key(spec, grid, site, chooser)}.json"
    try:
        return ChosenPlan.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    chosen = choose_plan(spec, grid, site=site, chooser=chooser)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".plan-", suffix=".json")
    except OSError:
        return chosen
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(chosen.as_json(), out)
        os.replace(tmp, path)  # whole or not at all, for a parse running beside this one
    except OSError:
        pass
    finally:
        Path(tmp).unlink(missing_ok=True)  # left only when the replace did not happen
    return chosen


def _plan_key(spec: PipelineSpec, grid: GridSpec, site: str | None, chooser: str) -> str:
    text = repr((PLAN_CACHE_VERSION, _planner_digest(), spec, grid, site, chooser))
    return hashlib.sha256(text.encode()).hexdigest()


@functools.cache
def _planner_digest() -> str:
    """A hash of the source of every module that decides a plan (the policy, the
    stages, the choosers, this module, the simulator they run): a gridcore whose planner
    changed does not render a plan the old one made (the version string alone does not
    move with every change)."""
    from gridcore.dataplan import choosers
    from gridcore.policies import dataplan, dataplan_stages, transfer
    from gridcore.sim import cluster, core
    from gridcore.sim import dataplan as sim_dataplan

    digest = hashlib.sha256()
    for module in (dataplan, dataplan_stages, transfer, choosers, sim_dataplan, cluster, core):
        digest.update(Path(str(module.__file__)).read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()


def _time(seconds: float) -> str:
    return f"{seconds:,.1f} s" if math.isfinite(seconds) else "inf s (diverges)"


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _reasons(plan: DataPlan) -> list[str]:
    lines = list(plan.reasons)
    lines += [
        f"{p.strategy.value}: predicted time is infinite, reported as null ({p.reason})"
        for p in plan.predictions
        if not p.finite
    ]
    return lines


def _workload_json(w: Workload) -> dict[str, Any]:
    return {
        "W": w.W,
        "D": w.D,
        "S_B": w.S_B,
        "S_P": w.S_P,
        "R_bar": w.R_bar,
        "SD_R": w.SD_R,
        "J": w.J,
        "S_TotB": w.S_TotB,
        "S_TotP": w.S_TotP,
    }


def _environment_json(env: Environment) -> dict[str, Any]:
    return {
        "N_CPU": env.N_CPU,
        "S": env.S,
        "F": env.F,
        "BW_R": env.BW_R,
        "BW_L": env.BW_L,
        "BW": serial_bandwidth(env),
    }
