"""The batch-pipeline file: a versioned TOML format (and the same thing as Python
dataclasses) for a data-driven batch workload, its padding to the canonical workload of
Bent et al. (DADC 2009, ``shared/seeds/data-driven-batch-scheduling-dadc2009.md``; the
policy is :mod:`gridcore.policies.dataplan`), and the cluster environment a plan is made
for, taken from the grid description.

Format (version 1)::

    version = 1                     # required: the integer 1
    name = "kmer-count"             # required: the workload's name (it becomes a DAG id):
                                    # 1-128 of A-Z a-z 0-9 _ . -, first a letter or digit

    [resources]                     # optional: what every job asks of the site, named
    time_limit = "30m"              # as everywhere in gridcore (and as sbatch): time_limit
    account = "proj42"              # ("90s", "10m", "2h", "1d", Slurm's "MM", "MM:SS",
                                    # "HH:MM:SS", "D-HH[:MM[:SS]]", or integer seconds),
                                    # account, qos, partition, memory or memory_per_cpu
                                    # ("512M", "4G", "1T", integer MiB), gpus, constraint;
                                    # the site's [sites.NAME.defaults] fill what is unset

    [[depths]]                      # one table per depth, in pipeline order: D = how many
    name = "lookup"                 # the job at this depth; a name as above, unique
    command = "kmer-lookup --index {batch} --reads {input} --out {output}"
                                    # a template: {batch} the batch volume's staged path,
                                    # {input} the pipeline's private input (the previous
                                    # depth's output), {output} this job's private output,
                                    # {pipeline} the pipeline's name, {depth} its 0-based
                                    # index, {python} the absolute path of the Python
                                    # that runs gridcore (site jobs get a bare PATH);
                                    # every value is filled shell-quoted; {{ and }} are
                                    # literal braces; the rest is run by /bin/sh as is
    runtime_mean_s = 4.0            # runtime estimate on a reference site (slowness 1), s
    runtime_sd_s = 0.5              # optional (default 0): its standard deviation, s
    processors = 1                  # optional: must be 1 (the paper's jobs use one node)
    output_bytes = 6_000_000        # the private output every pipeline writes here
    batch = { logical_name = "kmer/ref/index-k31.bin", size_bytes = 60_000_000 }
                                    # optional: the batch volume every pipeline reads at
                                    # this depth, by logical name in the replica catalog;
                                    # size_bytes may be left out when the catalog knows the
                                    # file (``gridcore plan`` looks it up). No batch: 0 bytes
    resources = { time_limit = "2h", memory = "8G" }
                                    # optional: this depth's jobs ask for these, over the
                                    # file's [resources] key by key

    [[pipelines]]                   # the W pipelines: EITHER a list of tables ...
    name = "sample-01"              # unique, a name as above
    logical_name = "kmer/reads/sample-01.fq"   # its private input by logical name, or
    # path = "reads/sample-01.fq"   # a path (relative: to this file's directory)
    size_bytes = 8_000_000          # the input's size; may be left out for a logical name
                                    # the catalog knows

    [pipeline_range]                # ... OR one generated range (not both):
    count = 8                       # W: an integer from 1 to 1,000,000
    first = 1                       # optional (default 1): the first index i
    name = "sample-{i:02}"          # {i} is the index, {i:0N} the index zero-padded to N
    logical_name = "kmer/reads/sample-{i:02}.fq"   # or path = "..."; both need an {i}
    size_bytes = 8_000_000          # as in [[pipelines]]

Sizes are integer bytes (0 to 2**63 - 1; never 6.0e6, "6 MB" or true), seconds finite
numbers >= 0. At most 1000 depths and 1,000,000 pipelines (every pipeline is one object
in memory; a bound makes a stray ``count = 1e9`` a refusal, not an exhausted machine).
Resources are parsed by :func:`gridcore.validation.check_resources`
(``kmer.toml: depths[1].resources.time_limit: '10x' is not a duration (...)``); a job asks
for the operator's resources
(``DataPlanPipelineOperator(time_limit=...)``, like sbatch's command line over its
``#SBATCH`` lines) over its depth's over the file's, and its site's defaults fill the rest.
The file must be a regular file of UTF-8 text of at most 32 MiB. Every problem raises
:class:`~gridcore.errors.ConfigError` in one line naming the file and the field:
``kmer.toml: depths[2].batch.size_bytes: must be an integer >= 0 (bytes, at most
9223372036854775807), got -1``. The version is checked first, so a file of a later
version is refused for its version rather than for a key this version does not know.

Python: a DAG author builds the same thing directly, with the same checks (the message
then names the class: ``DepthSpec: output_bytes: ...``)::

    spec = PipelineSpec(
        name="kmer-count",
        depths=(DepthSpec("lookup", "kmer-lookup {batch} {input} {output}", 4.0,
                          output_bytes=6_000_000, runtime_sd_s=0.5,
                          batch=BatchVolume("kmer/ref/index-k31.bin", 60_000_000)),),
        pipelines=tuple(PipelineInput(f"s{i}", 8_000_000, logical_name=f"reads/s{i}.fq")
                        for i in range(8)),
    )

:func:`load_pipeline` reads a file; :func:`dump_pipeline` writes one back (pipelines as
a list), and loading it gives an equal spec.

Canonical padding (:func:`to_canonical`). The paper's models take a canonical workload
(Sec. 1): one batch size ``S_B``, one private size ``S_P``, one runtime distribution.
Its Discussion pads a non-canonical workload "by increasing the size of all batch and
private volumes to their maximum respective sizes", so that the plan's allocation limits
hold at the largest volume and no progress is lost when a pipeline reaches it:

* ``S_B`` = the largest batch volume (a depth without one counts 0 bytes);
* ``S_P`` = the largest private volume: every pipeline's input and every depth's output
  (the paper merges endpoint and pipeline data into "private");
* ``R_bar`` and ``SD_R`` = the MEAN of the depths' means and standard deviations, not the
  largest. Runtimes do not bound any allocation (feasibility, Eq. 1-4, only compares
  sizes), so padding them buys no safety; and every model uses them only as
  ``D * R_bar`` and ``D * SD_R`` (Eq. 10, 20, Remote), which the mean keeps exactly equal
  to the sums over the depths, while the largest would overstate every compute phase.

The :class:`PaddingReport` says what the padding costs: per depth the actual and padded
batch and output bytes, for the inputs their range and total, and in all the bytes the
canonical workload assumes beyond the real ones (``S_TotB + S_TotP`` minus the real
total). Predicted times are of the padded workload: they also include moving the padding.

Environment (:func:`environment_for_site`; the paper's five variables, Sec. 1):

* ``N_CPU`` = the site's ``processors``; ``S`` = its ``storage_gb`` (as bytes). A site
  without ``storage_gb`` is refused (unless ``measured`` gives ``S``): the plans are
  about storage, there is nothing to plan without it.
* ``BW_R`` = the grid's bandwidth from ``origin`` (where inputs live) to the site, MB/s
  as bytes/s; the paper uses one WAN bandwidth both ways (Eq. 8).
* ``BW_L`` = :data:`DEFAULT_BW_L`, 1 Gb/s per node (125 MB/s; the policy's
  ``BandwidthReading.GIGABIT``): the grid file has no bandwidth within a site.
* ``F`` = :data:`DEFAULT_F`, 0 failure events per second (Table 2's).
* ``measured`` overrides any of them by the paper's name (:data:`MEASURED_KEYS`: ``N_CPU``
  processors actually available, ``S`` bytes of storage, ``F`` failure events per second
  in the cluster, ``BW_R`` and ``BW_L`` observed transfer rates in bytes per second).

A plan for a site (:func:`plan_for_site`) also scales the runtimes by the site's
``slowness`` (the grid's runtime multiplier against a reference site) and runs every
chooser of :data:`CHOOSERS` on the result.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import string
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gridcore.config import read_text_file
from gridcore.dataplan_choosers import choose_by_simulation
from gridcore.errors import ConfigError, RequestError
from gridcore.model import MB, NO_RESOURCES, ORIGIN, GridSpec, JobResources
from gridcore.policies.dataplan import (
    BandwidthReading,
    DataPlan,
    Environment,
    Workload,
    choose_bent2009,
    serial_bandwidth,
)
from gridcore.validation import (
    COMMAND_MAX,
    INT64_MAX,
    check_logical_name,
    check_resources,
    resource_keys,
    shown_value,
)

__all__ = [
    "CHOOSERS",
    "DEFAULT_BW_L",
    "DEFAULT_CHOOSER",
    "DEFAULT_F",
    "MEASURED_KEYS",
    "PAPER_CHOOSER",
    "PIPELINE_FORMAT_VERSION",
    "BatchVolume",
    "CanonicalWorkload",
    "Chooser",
    "DepthPadding",
    "DepthSpec",
    "InputPadding",
    "PaddingReport",
    "PipelineFieldError",
    "PipelineInput",
    "PipelineSpec",
    "SitePlan",
    "choose_site",
    "dump_pipeline",
    "environment_for_site",
    "environment_notes",
    "load_pipeline",
    "parse_pipeline",
    "plan_for_site",
    "to_canonical",
]

PIPELINE_FORMAT_VERSION = 1
MAX_PIPELINE_BYTES = 32 * 1024 * 1024
MAX_DEPTHS = 1000
MAX_PIPELINES = 1_000_000
NAME_MAX = 128
PLACEHOLDERS = frozenset({"batch", "input", "output", "pipeline", "depth", "python"})
PYTHON = "<python>"

DEFAULT_BW_L = BandwidthReading.GIGABIT.bytes_per_s
DEFAULT_F = 0.0
MEASURED_KEYS = ("N_CPU", "S", "F", "BW_R", "BW_L")

Chooser = Callable[[Workload, Environment], DataPlan]
CHOOSERS: Mapping[str, Chooser] = MappingProxyType(
    {"bent2009": choose_bent2009, "simulation": choose_by_simulation}
)
"""Every chooser ``gridcore plan`` reports, by name: each returns the policy's DataPlan.
``bent2009``: the paper's models (Eq. 5-24); ``simulation``: every feasible plan run on
the project's simulator over paired seeds (3, or 10 where nodes fail, raced up to 30), the
fastest mean makespan
(:mod:`gridcore.dataplan_choosers`; its predictions are the simulated means)."""
DEFAULT_CHOOSER = "simulation"
"""The chooser whose pick runs by default
(``gridcore_airflow.operators.dataplan.pipeline_dag``) and decides the site when several
are planned: ours, whose regret ``gridcore experiment dataplan`` measures (the paper's is
reported beside it)."""
PAPER_CHOOSER = "bent2009"
"""The paper's chooser, by name."""

_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{NAME_MAX - 1}}}")
_INDEX = re.compile(r"\{i(?::0([1-9]))?\}")


class PipelineFieldError(ConfigError):
    """One refused field: ``where`` is the file (or the class checked), ``field`` the
    path inside it (``depths[2].batch.size_bytes``), ``problem`` what is wrong."""

    def __init__(self, where: str, field_path: str, problem: str) -> None:
        super().__init__(f"{where}: {field_path}: {problem}")
        self.where = where
        self.field = field_path
        self.problem = problem


# -- the Python API ----------------------------------------------------------------------


@dataclass(frozen=True)
class BatchVolume:
    """The volume every pipeline reads at one depth, by logical name in the replica
    catalog; ``size_bytes`` None: the catalog's size is used (:func:`to_canonical`)."""

    logical_name: str
    size_bytes: int | None = None

    def __post_init__(self) -> None:
        _check_fields(
            "BatchVolume",
            ("logical_name", lambda: _logical_name(self.logical_name)),
            ("size_bytes", lambda: _optional_bytes(self.size_bytes)),
        )


@dataclass(frozen=True)
class DepthSpec:
    """One depth of the pipeline: its job (name, command template, runtime estimate on a
    reference site, one processor), the private output it writes and the batch volume it
    reads (None: none)."""

    name: str
    command: str
    runtime_mean_s: float
    output_bytes: int
    runtime_sd_s: float = 0.0
    batch: BatchVolume | None = None
    processors: int = 1
    # what this depth's jobs ask of the site, over the pipeline's resources
    resources: JobResources = NO_RESOURCES

    def __post_init__(self) -> None:
        _check_resources_field("DepthSpec", self.resources)
        _check_fields(
            "DepthSpec",
            ("name", lambda: _name(self.name)),
            ("command", lambda: _command(self.command, has_batch=self.batch is not None)),
            ("runtime_mean_s", lambda: _seconds(self.runtime_mean_s)),
            ("runtime_sd_s", lambda: _seconds(self.runtime_sd_s)),
            ("output_bytes", lambda: _bytes(self.output_bytes)),
            ("batch", lambda: _instance(self.batch, BatchVolume, optional=True)),
            ("processors", lambda: _one_processor(self.processors)),
        )
        object.__setattr__(self, "runtime_mean_s", float(self.runtime_mean_s))
        object.__setattr__(self, "runtime_sd_s", float(self.runtime_sd_s))

    def command_for(
        self, *, pipeline: str, depth: int, input_path: str, output_path: str, batch_path: str = ""
    ) -> str:
        """The command one pipeline's job at this depth runs, its placeholders filled with
        shell-quoted values (a path with a space stays one argument)."""
        return self.command.format(
            batch=shlex.quote(batch_path),
            input=shlex.quote(input_path),
            output=shlex.quote(output_path),
            pipeline=shlex.quote(pipeline),
            depth=depth,
            python=shlex.quote(sys.executable),
        )


@dataclass(frozen=True)
class PipelineInput:
    """One pipeline: its name and its private input, by logical name in the replica
    catalog or by path (exactly one), of ``size_bytes`` (None: the catalog's size; a path
    needs its size)."""

    name: str
    size_bytes: int | None = None
    logical_name: str | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        _check_fields(
            "PipelineInput",
            ("name", lambda: _name(self.name)),
            ("logical_name", lambda: _optional(self.logical_name, _logical_name)),
            ("path", lambda: _optional(self.path, _path)),
            ("size_bytes", lambda: _optional_bytes(self.size_bytes)),
        )
        if (self.logical_name is None) == (self.path is None):
            raise PipelineFieldError(
                "PipelineInput", "logical_name", "give exactly one of logical_name and path"
            )
        if self.path is not None and self.size_bytes is None:
            raise PipelineFieldError(
                "PipelineInput", "size_bytes", "is required for an input given by path"
            )

    @property
    def location(self) -> str:
        """The logical name, else the path."""
        return self.logical_name if self.logical_name is not None else str(self.path)


@dataclass(frozen=True)
class PipelineSpec:
    """A batch-pipeline workload as a DAG author writes it: ``D = len(depths)`` jobs per
    pipeline, ``W = len(pipelines)`` pipelines. ``source`` names the file it came from
    (not compared)."""

    name: str
    depths: tuple[DepthSpec, ...]
    pipelines: tuple[PipelineInput, ...]
    source: str = field(default=PYTHON, compare=False)
    # what every job asks of the site (a depth's own resources go over it)
    resources: JobResources = NO_RESOURCES

    def __post_init__(self) -> None:
        _check_resources_field(self.source, self.resources)
        object.__setattr__(self, "depths", _as_tuple(self.depths, self.source, "depths"))
        object.__setattr__(self, "pipelines", _as_tuple(self.pipelines, self.source, "pipelines"))
        _check_fields(self.source, ("name", lambda: _name(self.name)))
        _check_items(self.source, "depths", self.depths, DepthSpec, MAX_DEPTHS, "depth")
        _check_items(
            self.source, "pipelines", self.pipelines, PipelineInput, MAX_PIPELINES, "pipeline"
        )

    @property
    def D(self) -> int:
        return len(self.depths)

    @property
    def W(self) -> int:
        return len(self.pipelines)

    def job_resources(self, depth: int) -> JobResources:
        """What a job at ``depth`` asks of the site: its depth's resources over the
        pipeline's (the site's defaults fill the rest when it is submitted)."""
        return self.depths[depth].resources.over(self.resources)

    def unsized_logical_names(self) -> tuple[str, ...]:
        """Logical names whose size the spec leaves to the replica catalog, in order."""
        names = [
            d.batch.logical_name for d in self.depths if d.batch and d.batch.size_bytes is None
        ]
        names += [p.location for p in self.pipelines if p.size_bytes is None]
        return tuple(dict.fromkeys(names))


# -- checks shared by the dataclasses and the file ----------------------------------------


def _check_fields(where: str, *checks: tuple[str, Callable[[], None]]) -> None:
    for name, check in checks:
        try:
            check()
        except _Problem as problem:
            raise PipelineFieldError(where, name, str(problem)) from None


class _Problem(Exception):
    """What is wrong with one value (the caller knows which field it is)."""


def _check_resources_field(where: str, resources: object) -> None:
    if not isinstance(resources, JobResources):
        problem = f"must be a JobResources, got {shown_value(resources)}"
        raise PipelineFieldError(where, "resources", problem)
    _resources(resources, where, "resources")


def _resources(raw: object, source: str, at: str) -> JobResources:
    """Resources checked by gridcore.validation, a refusal named at ``at`` in ``source``."""

    def refused(field_path: str, problem: str) -> PipelineFieldError:
        return PipelineFieldError(source, f"{at}.{field_path}" if field_path else at, problem)

    if not isinstance(raw, JobResources | Mapping):
        raise PipelineFieldError(source, at, f"must be a table, got {shown_value(raw)}")
    return check_resources(raw, error=refused)


def _name(value: object) -> None:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise _Problem(
            f"must be 1-{NAME_MAX} of A-Z a-z 0-9 _ . -, first a letter or digit,"
            f" got {shown_value(value)}"
        )


def _command(value: object, *, has_batch: bool) -> None:
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise _Problem(f"must be a non-blank string without a NUL byte, got {shown_value(value)}")
    if len(value) > COMMAND_MAX:
        raise _Problem(f"must be at most {COMMAND_MAX} characters")
    try:
        parsed = list(string.Formatter().parse(value))
    except ValueError:
        raise _Problem("unbalanced '{' or '}' (write {{ and }} for literal braces)") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in PLACEHOLDERS or spec or conversion:
            known = ", ".join("{" + p + "}" for p in sorted(PLACEHOLDERS))
            raise _Problem(f"unknown placeholder {{{name}}} (known: {known}; {{{{ for '{{')")
        if name == "batch" and not has_batch:
            raise _Problem("uses {batch} but the depth has no batch volume")


def _seconds(value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value >= 0)
    ):
        raise _Problem(f"must be a finite number of seconds >= 0, got {shown_value(value)}")


def _bytes(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT64_MAX:
        raise _Problem(
            f"must be an integer >= 0 (bytes, at most {INT64_MAX}), got {shown_value(value)}"
        )


def _optional_bytes(value: object) -> None:
    if value is not None:
        _bytes(value)


def _optional(value: object, check: Callable[[object], None]) -> None:
    if value is not None:
        check(value)


def _logical_name(value: object) -> None:
    try:
        check_logical_name(value)
    except RequestError as exc:
        raise _Problem(str(exc).removeprefix("logical file name: ")) from None


def _path(value: object) -> None:
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise _Problem(f"must be a non-blank path without a NUL byte, got {shown_value(value)}")


def _one_processor(value: object) -> None:
    if type(value) is not int or value != 1:  # not True, not 1.0
        raise _Problem(
            f"must be 1 (the paper's model runs each job on one node), got {shown_value(value)}"
        )


def _instance(value: object, kind: type, *, optional: bool = False) -> None:
    if not (isinstance(value, kind) or (optional and value is None)):
        raise _Problem(f"must be a {kind.__name__}, got {shown_value(value)}")


def _as_tuple(value: object, where: str, name: str) -> tuple[Any, ...]:
    if isinstance(value, tuple):
        return value
    if isinstance(value, list):
        return tuple(value)
    raise PipelineFieldError(where, name, f"must be a list or tuple, got {shown_value(value)}")


def _check_items(
    where: str,
    name: str,
    items: tuple[Any, ...],
    kind: type[DepthSpec] | type[PipelineInput],
    most: int,
    what: str,
) -> None:
    if not items:
        raise PipelineFieldError(where, name, f"at least one {what} is required")
    if len(items) > most:
        raise PipelineFieldError(where, name, f"at most {most:,} {what}s, got {len(items):,}")
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            problem = f"must be a {kind.__name__}, got {shown_value(item)}"
            raise PipelineFieldError(where, f"{name}[{i}]", problem)
        first = seen.setdefault(item.name, i)
        if first != i:
            problem = f"duplicate name {item.name!r} (also {name}[{first}])"
            raise PipelineFieldError(where, f"{name}[{i}].name", problem)


# -- the file ----------------------------------------------------------------------------

_TOP = frozenset({"version", "name", "depths", "pipelines", "pipeline_range", "resources"})
_DEPTH_REQUIRED = ("name", "command", "runtime_mean_s", "output_bytes")
_DEPTH_OPTIONAL = ("runtime_sd_s", "processors", "batch", "resources")
_BATCH = (("logical_name",), ("size_bytes",))
_INPUT_OPTIONAL = ("size_bytes", "logical_name", "path")
_RANGE_OPTIONAL = ("first", "size_bytes", "logical_name", "path")


def load_pipeline(path: str | os.PathLike[str]) -> PipelineSpec:
    """Read and validate a pipeline file: a regular file of UTF-8 TOML text. Relative
    input paths are taken relative to the file's directory."""
    file = Path(path)
    try:
        raw = tomllib.loads(
            read_text_file(
                file,
                "pipeline file",
                MAX_PIPELINE_BYTES,
                " (use [pipeline_range] for many pipelines)",
            )
        )
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
    return parse_pipeline(raw, source=str(file), base_dir=file.parent)


def parse_pipeline(
    raw: Mapping[str, Any], source: str = "<memory>", base_dir: str | os.PathLike[str] | None = None
) -> PipelineSpec:
    """Validate an already-parsed pipeline file (a dict shaped like the TOML)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: must be a table of keys, got {shown_value(raw)}")
    _check_version(raw, source)
    _table(raw, source, "", required=("name", "depths"), optional=tuple(_TOP))
    depths = _list_of_tables(raw["depths"], source, "depths")
    resources = _resources(raw["resources"], source, "resources") if "resources" in raw else None
    return PipelineSpec(
        name=raw["name"],
        depths=tuple(_depth(d, source, f"depths[{i}]") for i, d in enumerate(depths)),
        pipelines=_pipelines(raw, source, None if base_dir is None else Path(base_dir)),
        source=source,
        resources=resources or NO_RESOURCES,
    )


def _check_version(raw: Mapping[str, Any], source: str) -> None:
    if "version" not in raw:
        problem = f"is required (this format is version {PIPELINE_FORMAT_VERSION})"
        raise PipelineFieldError(source, "version", problem)
    version = raw["version"]
    if type(version) is not int or version != PIPELINE_FORMAT_VERSION:  # not True, not 1.0
        problem = f"must be {PIPELINE_FORMAT_VERSION}, got {shown_value(version)}"
        raise PipelineFieldError(source, "version", problem)


def _table(
    raw: object, source: str, at: str, *, required: Sequence[str], optional: Sequence[str] = ()
) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise PipelineFieldError(source, at, f"must be a table, got {shown_value(raw)}")
    known = {*required, *optional}
    for key in raw:
        if key not in known:
            raise PipelineFieldError(source, _join(at, key), "unknown key")
    for key in required:
        if key not in raw:
            raise PipelineFieldError(source, _join(at, key), "is required")
    return raw


def _join(at: str, key: str) -> str:
    shown = key if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", key) else repr(key[:40])
    return f"{at}.{shown}" if at else shown


def _list_of_tables(raw: object, source: str, at: str) -> list[Any]:
    if not isinstance(raw, list):
        problem = f"must be a list of tables ([[{at}]]), got {shown_value(raw)}"
        raise PipelineFieldError(source, at, problem)
    return raw


def _built(source: str, at: str, build: Callable[[], Any]) -> Any:
    """``build()``; a field it refuses is renamed to its place in the file."""
    try:
        return build()
    except PipelineFieldError as exc:
        raise PipelineFieldError(source, _join(at, exc.field), exc.problem) from None


def _depth(raw: object, source: str, at: str) -> DepthSpec:
    table = _table(raw, source, at, required=_DEPTH_REQUIRED, optional=_DEPTH_OPTIONAL)
    batch = None
    if "batch" in table:
        b = _table(table["batch"], source, f"{at}.batch", required=_BATCH[0], optional=_BATCH[1])
        batch = _built(
            source,
            f"{at}.batch",
            lambda: BatchVolume(b["logical_name"], b.get("size_bytes")),
        )
    values = {k: table[k] for k in (*_DEPTH_REQUIRED, *_DEPTH_OPTIONAL) if k in table}
    values["batch"] = batch
    if "resources" in table:
        values["resources"] = _resources(table["resources"], source, f"{at}.resources")
    depth: DepthSpec = _built(source, at, lambda: DepthSpec(**values))
    return depth


def _pipelines(
    raw: Mapping[str, Any], source: str, base_dir: Path | None
) -> tuple[PipelineInput, ...]:
    if ("pipelines" in raw) == ("pipeline_range" in raw):
        problem = "give the pipelines as [[pipelines]] tables or one [pipeline_range], " + (
            "not both" if "pipelines" in raw else "got neither"
        )
        raise PipelineFieldError(source, "pipelines", problem)
    if "pipeline_range" in raw:
        return _pipeline_range(raw["pipeline_range"], source, base_dir)
    items = _list_of_tables(raw["pipelines"], source, "pipelines")
    # An empty list is PipelineSpec's to refuse, as for one built in Python.
    return tuple(
        _pipeline(item, source, f"pipelines[{i}]", base_dir) for i, item in enumerate(items)
    )


def _pipeline(raw: object, source: str, at: str, base_dir: Path | None) -> PipelineInput:
    table = _table(raw, source, at, required=("name",), optional=_INPUT_OPTIONAL)
    path = _relative_to(table.get("path"), base_dir)
    found: PipelineInput = _built(
        source,
        at,
        lambda: PipelineInput(
            table["name"], table.get("size_bytes"), table.get("logical_name"), path
        ),
    )
    return found


def _relative_to(path: Any, base_dir: Path | None) -> Any:
    if base_dir is None or not isinstance(path, str) or "\x00" in path or not path.strip():
        return path  # a bad path is refused by PipelineInput, as it is written
    return str(base_dir / path) if not os.path.isabs(path) else path


def _pipeline_range(raw: object, source: str, base_dir: Path | None) -> tuple[PipelineInput, ...]:
    at = "pipeline_range"
    table = _table(raw, source, at, required=("count", "name"), optional=_RANGE_OPTIONAL)
    count, first = table["count"], table.get("first", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_PIPELINES:
        problem = f"must be an integer from 1 to {MAX_PIPELINES:,}, got {shown_value(count)}"
        raise PipelineFieldError(source, f"{at}.count", problem)
    if isinstance(first, bool) or not isinstance(first, int) or not 0 <= first <= INT64_MAX:
        problem = f"must be an integer >= 0, got {shown_value(first)}"
        raise PipelineFieldError(source, f"{at}.first", problem)
    templates = {k: table[k] for k in ("name", "logical_name", "path") if k in table}
    for key, template in templates.items():
        _check_template(template, source, f"{at}.{key}")
    items = []
    for index in range(first, first + count):
        filled = {k: _fill(t, index) for k, t in templates.items()}
        path = _relative_to(filled.get("path"), base_dir)
        build = _range_item(filled, table.get("size_bytes"), path)
        items.append(_built(source, at, build))
    return tuple(items)


def _range_item(filled: Mapping[str, str], size: Any, path: Any) -> Callable[[], Any]:
    return lambda: PipelineInput(filled["name"], size, filled.get("logical_name"), path)


def _check_template(template: object, source: str, at: str) -> None:
    if not isinstance(template, str):
        raise PipelineFieldError(source, at, f"must be a string, got {shown_value(template)}")
    if not _INDEX.search(template):
        problem = "must contain {i} (or {i:0N}) so that every pipeline gets its own"
        raise PipelineFieldError(source, at, problem)
    if "{" in _INDEX.sub("", template) or "}" in _INDEX.sub("", template):
        problem = "only {i} and {i:0N} (N from 1 to 9) may stand in braces"
        raise PipelineFieldError(source, at, problem)


def _fill(template: str, index: int) -> str:
    return _INDEX.sub(lambda m: str(index).zfill(int(m.group(1) or 0)), template)


def dump_pipeline(spec: PipelineSpec) -> str:
    """``spec`` as a version-1 pipeline file (pipelines as a list): loading the text gives
    an equal spec (paths are written as they are in ``spec``)."""
    lines = [f"version = {PIPELINE_FORMAT_VERSION}", f"name = {_toml(spec.name)}"]
    if not spec.resources.is_empty:
        lines += ["", "[resources]"]
        lines += [f"{k} = {_toml(v)}" for k, v in resource_keys(spec.resources).items()]
    for depth in spec.depths:
        lines += ["", "[[depths]]"]
        lines += [
            f"{key} = {_toml(value)}"
            for key, value in (
                ("name", depth.name),
                ("command", depth.command),
                ("runtime_mean_s", depth.runtime_mean_s),
                ("runtime_sd_s", depth.runtime_sd_s),
                ("processors", depth.processors),
                ("output_bytes", depth.output_bytes),
            )
        ]
        if depth.batch is not None:
            lines.append(f"batch = {_inline(_present(depth.batch, 'logical_name', 'size_bytes'))}")
        if not depth.resources.is_empty:
            lines.append(f"resources = {_inline(resource_keys(depth.resources))}")
    for pipeline in spec.pipelines:
        lines += ["", "[[pipelines]]"]
        present = _present(pipeline, "name", "logical_name", "path", "size_bytes")
        lines += [f"{key} = {_toml(value)}" for key, value in present.items()]
    return "\n".join(lines) + "\n"


def _present(obj: object, *names: str) -> dict[str, Any]:
    return {n: getattr(obj, n) for n in names if getattr(obj, n) is not None}


def _inline(values: Mapping[str, Any]) -> str:
    return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in values.items()) + " }"


def _toml(value: object) -> str:
    if isinstance(value, str):
        # TOML basic string: escape backslash, quote and every control character.
        return '"' + "".join(_toml_char(c) for c in value) + '"'
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _toml_char(c: str) -> str:
    if c in '"\\':
        return "\\" + c
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\u{ord(c):04x}"
    return c


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
    """Pad ``spec`` to the paper's canonical workload (module docstring): ``S_B`` the
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
    (module docstring). ConfigError for an unknown site or key, or a site whose storage
    neither the grid nor ``measured`` gives."""
    site = grid.site(site_name)
    observed = dict(measured or {})
    for key in observed:
        if key not in MEASURED_KEYS:
            known = ", ".join(MEASURED_KEYS)
            raise ConfigError(f"measured.{key}: unknown key (known: {known})")
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
