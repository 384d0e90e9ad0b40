"""The batch-pipeline file: a versioned TOML format (and the same thing as Python
dataclasses) for a data-driven batch workload of Bent et al. (DADC 2009,
``docs/papers.md``). This module only reads,
checks and writes the file: it imports no policy beyond the model's types and no
simulator; padding it to the paper's canonical workload and planning it on a site are
:mod:`gridcore.dataplan.planning`.

How it works, in full: ``docs/dataplan.md``
(section ``gridcore/dataplan/format.py``).
"""

from __future__ import annotations

import math
import os
import posixpath
import re
import shlex
import string
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridcore.config import parse_toml, read_text_file
from gridcore.errors import ConfigError, RequestError
from gridcore.model import NO_RESOURCES, JobResources
from gridcore.validation import (
    COMMAND_MAX,
    INT64_MAX,
    check_logical_name,
    check_resources,
    resource_keys,
    shown_value,
    unknown_key,
)

__all__ = [
    "PIPELINE_FORMAT_VERSION",
    "BatchVolume",
    "DepthSpec",
    "PipelineFieldError",
    "PipelineInput",
    "PipelineSpec",
    "dump_pipeline",
    "load_pipeline",
    "parse_pipeline",
]

PIPELINE_FORMAT_VERSION = 1
MAX_PIPELINE_BYTES = 32 * 1024 * 1024
MAX_DEPTHS = 1000
MAX_PIPELINES = 1_000_000
NAME_MAX = 128
PLACEHOLDERS = frozenset({"batch", "input", "output", "pipeline", "depth", "python"})
PYTHON = "<python>"

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
    catalog; ``size_bytes`` None: the catalog's size is used
    (:func:`gridcore.dataplan.planning.to_canonical`)."""

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
    needs its size). A pipeline file may give only a path inside its own directory
    (:func:`_in_file_directory`); built in Python, any path."""

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
        return tuple(dict.fromkeys(name for _, name in self.unsized_fields()))

    def unsized_fields(self) -> tuple[tuple[str, str], ...]:
        """``(field, logical name)`` for every size the spec leaves to the replica
        catalog, in order (``depths[0].batch.size_bytes``, ``pipelines[3].size_bytes``):
        what a refusal names when no catalog can be read."""
        fields = [
            (f"depths[{i}].batch.size_bytes", d.batch.logical_name)
            for i, d in enumerate(self.depths)
            if d.batch and d.batch.size_bytes is None
        ]
        fields += [
            (f"pipelines[{i}].size_bytes", p.location)
            for i, p in enumerate(self.pipelines)
            if p.size_bytes is None
        ]
        return tuple(fields)


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
    text = read_text_file(
        file, "pipeline file", MAX_PIPELINE_BYTES, " (use [pipeline_range] for many pipelines)"
    )
    return parse_pipeline(parse_toml(file, text), source=str(file), base_dir=file.parent)


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
    known = (*required, *optional)
    for key in raw:
        if key not in known:
            raise PipelineFieldError(source, _join(at, key), unknown_key(str(key), known))
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
    path = _in_file_directory(table.get("path"), base_dir, source, f"{at}.path")
    found: PipelineInput = _built(
        source,
        at,
        lambda: PipelineInput(
            table["name"], table.get("size_bytes"), table.get("logical_name"), path
        ),
    )
    return found


def _in_file_directory(path: Any, base_dir: Path | None, source: str, at: str) -> Any:
    """An input's ``path`` as the file gives it, normalised and joined to the file's
    directory: a file may name only files inside its own directory (docs/dataplan.md,
    "What a pipeline reads, writes and deletes"), so an absolute path or one whose
    ``..`` leads out is refused here, before anything is read."""
    if not isinstance(path, str) or "\x00" in path or not path.strip():
        return path  # a bad path is refused by PipelineInput, as it is written
    problem = _outside_directory(path)
    if problem is not None:
        hint = "; name a file elsewhere by its logical_name in the replica catalog"
        raise PipelineFieldError(source, at, problem + hint)
    # The normalised path is what is read: no '..' is left for the file system to
    # resolve through a symbolic link.
    normal = posixpath.normpath(path)
    return normal if base_dir is None else str(base_dir / normal)


def _outside_directory(path: str) -> str | None:
    """Why ``path`` does not name a file inside the pipeline file's directory, or None."""
    if posixpath.isabs(path):
        return f"must be relative to the pipeline file's directory, got {shown_value(path)}"
    normal = posixpath.normpath(path)
    if normal == ".":
        return f"names the pipeline file's directory itself, not a file in it: {shown_value(path)}"
    if normal == ".." or normal.startswith("../"):
        return f"leads out of the pipeline file's directory: {shown_value(path)}"
    return None


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
        path = _in_file_directory(filled.get("path"), base_dir, source, f"{at}.path")
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


def dump_pipeline(spec: PipelineSpec, base_dir: str | os.PathLike[str] | None = None) -> str:
    """``spec`` as a version-1 pipeline file (pipelines as a list): loading the text
    from a file in ``base_dir`` gives an equal spec. Input paths are written relative to
    ``base_dir`` (without one, as they are in ``spec``); a path such a file could not
    name (:func:`_in_file_directory`) is refused, naming ``spec.source`` and the field."""
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
    for i, pipeline in enumerate(spec.pipelines):
        lines += ["", "[[pipelines]]"]
        present = _present(pipeline, "name", "logical_name", "path", "size_bytes")
        if pipeline.path is not None:
            present["path"] = _written_path(pipeline.path, base_dir, spec.source, i)
        lines += [f"{key} = {_toml(value)}" for key, value in present.items()]
    return "\n".join(lines) + "\n"


def _written_path(
    path: str, base_dir: str | os.PathLike[str] | None, source: str, index: int
) -> str:
    if base_dir is not None and posixpath.isabs(path):
        path = os.path.relpath(path, base_dir)
    problem = _outside_directory(path)
    if problem is not None:
        hint = " (dump_pipeline's base_dir: the directory the file is written in)"
        raise PipelineFieldError(source, f"pipelines[{index}].path", problem + hint)
    return path


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
