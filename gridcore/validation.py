"""Typed validation of what users hand to gridcore: the grid description and requests.

pydantic v2 models check types and limits and convert into the frozen domain types of
:mod:`gridcore.model`, which stay what every other module works with:

* :func:`grid_from_raw` -> :class:`~gridcore.model.GridSpec` (the parsed TOML of a grid
  description file; reading the file itself is :func:`gridcore.config.load_grid`);
* :func:`check_job_request` -> :class:`~gridcore.model.JobRequest` (site selection);
* :func:`check_selection_stream`; :func:`check_job_submission` (what a site runs);
* :func:`check_coallocation_request` -> :class:`~gridcore.model.CoAllocationRequest` and
  :func:`check_coallocation_submission` (request + command + quota; KOALA's
  ``CoAllocationEngine.submit`` checks the placement policy itself);
* :func:`check_logical_name` (the replica catalog's names); :func:`check_choice` (an
  enum option given beside a request: selection protocol, placement policy);
* :func:`check_resources` -> :class:`~gridcore.model.JobResources`: what a job asks of a
  cluster besides processors, under the same names everywhere (operators, the grid
  file's ``[sites.NAME.defaults]``, the pipeline file, :data:`RESOURCE_KEYS`), parsed
  here once: ``time_limit`` (:func:`parse_duration`) and ``memory`` /
  ``memory_per_cpu`` (:func:`parse_memory`).

Each accepts the domain dataclass (re-checked, as its types are not enforced) or a plain
mapping (operators, JSON). Every refusal is ONE line naming the field, raised as
:class:`~gridcore.errors.ConfigError` (grid: ``grid.toml: sites.alpha.processors: must be
a positive integer (at most 2147483647), got 1e+99``) or
:class:`~gridcore.errors.RequestError` (``request.name: must be at most 256 characters,
got a string of 300 characters``), before anything is written or submitted.

Limits match the state database's columns (``gridcore/state/schema.py``; a test compares):
site names 64 characters of ``[A-Za-z0-9_-]``, job names 256, selection streams 128,
logical file names 512; processor counts and sizes strict integers in 1..2**31-1 (never a
bool, float or string); byte counts 0..2**63-1; floats finite.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import fractions
import math
import posixpath
import re
import shlex
from collections.abc import Callable, Collection, Mapping, Sequence
from types import MappingProxyType
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    HttpUrl,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gridcore.errors import ConfigError, RequestError
from gridcore.model import (
    NO_RESOURCES,
    ORIGIN,
    CoAllocationRequest,
    Component,
    CoReservationRequest,
    CredentialRef,
    FileDelivery,
    FlexibleOptions,
    GridSpec,
    InputFile,
    JobRequest,
    JobResources,
    JobSubmission,
    MemoryScope,
    Priority,
    RequestKind,
    SiteKind,
    SiteSpec,
    component_job_name,
)
from gridcore.sites import slurm_api

FORMAT_VERSION = 1
INT32_MAX = 2**31 - 1  # Integer columns (processors, sizes)
INT64_MAX = 2**63 - 1  # BigInteger columns (bytes)
SITE_NAME_MAX = 64  # gc_sites.name, every site column
JOB_NAME_MAX = 256  # gc_selections.name, gc_coalloc_jobs.name, gc_local_jobs.name
STREAM_MAX = 128  # gc_selections.stream
LOGICAL_NAME_MAX = 512  # gc_replicas.logical_name
COMMAND_MAX = 131_072  # Linux MAX_ARG_STRLEN: the command is one argument of ``sh -c``
TEXT_MAX = 255  # partition, user, credential references, env names
STORAGE_DIR_MAX = 4096  # PATH_MAX
# "auto": the newest version the server and gridcore both speak (GET /openapi/v3)
API_VERSIONS = (slurm_api.AUTO, *slurm_api.VERSIONS)

_SITE_NAME = r"^[A-Za-z0-9_-]+$"
# printable (no C0 control character or DEL) and not blank
_NAME = r"^[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]*$"
_COMMAND = r"^[^\x00]*[^\s\x00][^\x00]*$"  # any text but NUL, not blank
_NO_NUL = r"^[^\x00]*$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# a relative POSIX path of non-empty segments not starting with '.' or white space (a
# blank name names nothing), no backslash or NUL
_SEGMENT = r"[^/\\\x00.\s][^/\\\x00]*"
_LOGICAL_NAME = rf"^{_SEGMENT}(?:/{_SEGMENT})*$"
_SLURM_ONLY = frozenset({"url", "partition", "user", "token", "api_version", "timeout_s"})

_M = TypeVar("_M", bound=BaseModel)
_E = TypeVar("_E", bound=enum.Enum)

# -- how a refusal reads --------------------------------------------------------------


def _refused(message: str, *at: str | int) -> PydanticCustomError:
    """A refusal with our own wording; ``at`` locates it below the validated value."""
    return PydanticCustomError("gridcore", "{message}", {"message": message, "at": at})


def unknown_key(key: str, known: Sequence[str], *, listed: bool = False) -> str:
    """The refusal of ``key``, not one of ``known``: with the known key it is closest to
    (a typo: ``unknown key (did you mean "processors"?)``), else with every known key when
    ``listed`` (a short table). Every file format and request says it this way."""
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f'unknown key (did you mean "{close[0]}"?)'
    return f"unknown key (known: {', '.join(known)})" if listed else "unknown key"


def shown_value(value: Any) -> str:
    """``value`` for a one-line message: short, never a secret-sized blob."""
    if isinstance(value, str) and len(value) > 40:
        return f"a string of {len(value)} characters ({value[:20]!r}...)"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)}"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _worded(
    default: str, by_error: Mapping[str, str] | None = None, *, show: bool = True
) -> WrapValidator:
    """Reword pydantic's refusal of one value: the checks stay pydantic's, the message
    says what the value must be (``by_error`` by pydantic's error type, else ``default``)."""
    wording = dict(by_error or {})

    def wrap(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            if first["type"] == "gridcore":
                at = (first.get("ctx") or {}).get("at", ())
                raise _refused(first["msg"], *first["loc"], *at) from None
            message = wording.get(first["type"], default)
            got = f", got {shown_value(value)}" if show else ""
            raise _refused(message + got) from None

    return WrapValidator(wrap)


def _string(max_length: int, pattern: str) -> StringConstraints:
    return StringConstraints(strict=True, min_length=1, max_length=max_length, pattern=pattern)


def _text_worded(max_length: int, pattern_means: str) -> WrapValidator:
    """Wording for a :func:`_string`: empty, too long, not matching, not a string."""
    return _worded(
        "must be a string",
        {
            "string_too_short": "must not be empty",
            "string_too_long": f"must be at most {max_length} characters",
            "string_pattern_mismatch": pattern_means,
        },
    )


def _one_of(kind: type[enum.Enum]) -> WrapValidator:
    return _worded("must be " + " | ".join(str(member.value) for member in kind))


_PRINTABLE = "must not be blank or contain control characters"
SiteName = Annotated[
    str,
    _string(SITE_NAME_MAX, _SITE_NAME),
    _text_worded(SITE_NAME_MAX, "site name must be letters, digits, - or _"),
]
JobName = Annotated[str, _string(JOB_NAME_MAX, _NAME), _text_worded(JOB_NAME_MAX, _PRINTABLE)]
Stream = Annotated[str, _string(STREAM_MAX, _NAME), _text_worded(STREAM_MAX, _PRINTABLE)]
LogicalName = Annotated[
    str,
    _string(LOGICAL_NAME_MAX, _LOGICAL_NAME),
    _text_worded(
        LOGICAL_NAME_MAX,
        "must be a relative path of non-empty segments that do not start with '.' or a"
        " space (no '/x', 'a//b', '..', '.hidden', ' ', backslash or NUL)",
    ),
]
Command = Annotated[
    str,
    _string(COMMAND_MAX, _COMMAND),
    _text_worded(COMMAND_MAX, "must not be blank or contain a NUL byte"),
]
ShortText = Annotated[str, _string(TEXT_MAX, _NAME), _text_worded(TEXT_MAX, _PRINTABLE)]
EnvName = Annotated[
    str,
    _string(TEXT_MAX, _ENV_NAME),
    _text_worded(TEXT_MAX, "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"),
]
EnvValue = Annotated[
    str,
    StringConstraints(strict=True, max_length=COMMAND_MAX, pattern=_NO_NUL),
    _worded(f"must be a string of at most {COMMAND_MAX} characters without a NUL byte"),
]
WorkDir = Annotated[
    str,
    _string(STORAGE_DIR_MAX, _NO_NUL),
    _text_worded(STORAGE_DIR_MAX, "must not contain a NUL byte"),
]
Count = Annotated[
    int,
    Field(strict=True, ge=1, le=INT32_MAX),
    _worded(f"must be a positive integer (at most {INT32_MAX})"),
]
Total = Annotated[
    int,
    Field(strict=True, ge=0, le=INT32_MAX),
    _worded(f"must be an integer between 0 and {INT32_MAX}"),
]
ByteCount = Annotated[
    int,
    Field(strict=True, ge=0, le=INT64_MAX),
    _worded(f"must be a byte count, an integer between 0 and {INT64_MAX}"),
]
Version = Annotated[
    int,
    Field(strict=True, ge=FORMAT_VERSION, le=FORMAT_VERSION),
    _worded(f"must be {FORMAT_VERSION}"),
]
Positive = Annotated[
    float, Field(strict=True, gt=0, allow_inf_nan=False), _worded("must be a finite number > 0")
]
NonNegative = Annotated[
    float, Field(strict=True, ge=0, allow_inf_nan=False), _worded("must be a finite number >= 0")
]
Fraction = Annotated[
    float, Field(strict=True, gt=0, le=1, allow_inf_nan=False), _worded("must be in (0, 1]")
]
_GB_MAX = INT64_MAX // 10**9  # storage_gb becomes a BigInteger byte count
StorageGb = Annotated[
    float,
    Field(strict=True, gt=0, le=_GB_MAX, allow_inf_nan=False),
    _worded(f"must be a finite number of GB > 0 and at most {_GB_MAX}"),
]
SlurmUrl = Annotated[HttpUrl, _worded("slurm sites need an http(s) slurmrestd URL")]
ApiVersion = Annotated[
    str,
    Field(strict=True, pattern=rf"^({'|'.join(re.escape(v) for v in API_VERSIONS)})$"),
    _worded(f"must be one of {' | '.join(API_VERSIONS)}"),
]
SiteKindChoice = Annotated[SiteKind, _one_of(SiteKind)]
RequestKindChoice = Annotated[RequestKind, _one_of(RequestKind)]
PriorityChoice = Annotated[Priority, _one_of(Priority)]
DeliveryChoice = Annotated[FileDelivery, _one_of(FileDelivery)]


def _storage_dir(value: Any, handler: ValidatorFunctionWrapHandler) -> str:
    """A directory on this machine or ``sftp://user@host:port/path``, normalised
    (``a//b/./c/`` -> ``a/b/c``); refused with a NUL byte or a ``..`` segment (a storage
    directory never climbs out of where it is written to be)."""
    if not isinstance(value, str) or not value:
        raise _refused(f"must be a non-empty path, got {shown_value(value)}")
    if "\x00" in value:
        raise _refused("must not contain a NUL byte")
    if len(value) > STORAGE_DIR_MAX:
        raise _refused(f"must be at most {STORAGE_DIR_MAX} characters")
    prefix, path = "", value
    if "://" in value:
        scheme, _, rest = value.partition("://")
        netloc, slash, path = rest.partition("/")
        if scheme != "sftp" or not netloc or not slash:
            raise _refused(
                f"must be a path or sftp://user@host:port/path, got {shown_value(value)}"
            )
        prefix, path = f"sftp://{netloc}", "/" + path
    if ".." in path.split("/"):
        raise _refused(
            f"must not contain '..' (it would escape the directory), got {shown_value(value)}"
        )
    return prefix + posixpath.normpath(re.sub("/{2,}", "/", path))  # normpath keeps "//x"


StorageDir = Annotated[str, WrapValidator(_storage_dir)]


def _one_line(exc: ValidationError, root: tuple[str, ...] = ()) -> tuple[str, str]:
    """(field, message) of the first refusal: the field as dotted keys and [indexes]."""
    first = exc.errors(include_url=False)[0]
    at = (first.get("ctx") or {}).get("at", ())
    field = _field((*root, *first["loc"], *at))
    if first["type"] == "gridcore":
        return field, first["msg"]
    return field, _pydantic_message(first["type"], first["msg"], first.get("input"))


def _pydantic_message(kind: str, text: str, value: Any) -> str:
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "is required"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"must be a table, got {shown_value(value)}"
    if kind in ("tuple_type", "list_type"):
        return f"must be a list, got {shown_value(value)}"
    return f"{text[:1].lower()}{text[1:]}, got {shown_value(value)}"


def _field(parts: tuple[Any, ...]) -> str:
    out = ""
    for part in parts:
        if part == "[key]":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + _key(str(part))
    return out


def _key(name: str) -> str:
    """A key as TOML would write it: bare when it can be, else quoted (and shortened)."""
    if (
        name
        and len(name) <= SITE_NAME_MAX
        and all(c.isascii() and (c.isalnum() or c in "-_") for c in name)
    ):
        return name
    shown = name if len(name) <= 40 else f"{name[:37]}..."
    return '"' + shown.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'


def _validated(
    model: type[_M],
    value: Any,
    error: Callable[[str], Exception],
    *,
    root: tuple[str, ...] = (),
    sites: Collection[str] | None = None,
) -> _M:
    context = {"sites": frozenset(sites)} if sites is not None else {}
    try:
        return model.model_validate(value, from_attributes=True, context=context)
    except ValidationError as exc:
        field, message = _one_line(exc, root)
        raise error(f"{field}: {message}" if field else message) from None


def _known(info: ValidationInfo) -> frozenset[str] | None:
    context = info.context or {}
    sites = context.get("sites")
    return sites if isinstance(sites, frozenset) else None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, from_attributes=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, raw: Any) -> Any:
        """An unknown key is refused before any field is checked: a misspelt
        ``procesors = 4`` must read as that key's mistake, not as "processors: is
        required"."""
        if isinstance(raw, Mapping):
            for key in raw:
                if key not in cls.model_fields:
                    raise cls._unknown(str(key))
        return raw

    @classmethod
    def _unknown(cls, key: str) -> PydanticCustomError:
        return _refused(unknown_key(key, tuple(cls.model_fields)), key)


# -- job resources ----------------------------------------------------------------------
# What a cluster asks of a job besides its processors, named as sbatch names them. Parsed
# here ONCE into JobResources (whole seconds, MiB); every other module reads that.

RESOURCE_KEYS = (
    "time_limit",
    "account",
    "qos",
    "partition",
    "memory",
    "memory_per_cpu",
    "gpus",
    "constraint",
)
DURATION_HINT = "use 90s, 10m, 2h, 1d or D-HH:MM:SS"
MEMORY_HINT = "use 512M, 4G, 1T or an integer of MiB"
CONSTRAINT_MAX = 1024
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_UNIT_MIB = {
    unit: fractions.Fraction(1024**power, 1024) for power, unit in enumerate(("k", "m", "g", "t"))
}
_SUFFIXED = re.compile(r"(\d+)\s*([smhd])", re.IGNORECASE)
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)", re.IGNORECASE)
_NUMBER = re.compile(r"\d+")
# Slurm's feature expressions: names joined by & | , with ( ) [ ] and *N counts
_CONSTRAINT = r"^[A-Za-z0-9_.:+@/&|,()\[\]*!-]+$"


class _NotADuration(ValueError):
    """Why a text is not a duration (the caller words the refusal)."""


def parse_duration(value: str) -> int:
    """Whole seconds of a duration: ``90s``, ``10m``, ``2h``, ``1d`` (case-insensitive), or
    Slurm's ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS`` (so a
    bare ``"90"`` is 90 minutes, as ``sbatch --time=90``). Only the leading field may
    exceed its clock range (``90:00`` is 90 minutes; ``1:75:00`` is refused). ValueError
    saying why otherwise (the number may still be 0: the caller bounds it)."""
    text = value.strip()
    suffixed = _SUFFIXED.fullmatch(text)
    if suffixed:
        return int(suffixed.group(1)) * _UNIT_S[suffixed.group(2).lower()]
    days, dash, clock = text.rpartition("-")
    fields = clock.split(":")
    if (dash and not _NUMBER.fullmatch(days)) or not all(_NUMBER.fullmatch(f) for f in fields):
        raise _NotADuration("")
    numbers = [int(f) for f in fields]
    if dash:
        # D-HH, D-HH:MM, D-HH:MM:SS: hours, minutes and seconds stay in their range
        if len(numbers) > 3:
            raise _NotADuration("")
        _in_clock_range(numbers, ("hours", "minutes", "seconds")[: len(numbers)], leading=False)
        h, m, sec = (*numbers, 0, 0)[:3]
        return int(days) * 86400 + h * 3600 + m * 60 + sec
    names = {1: ("minutes",), 2: ("minutes", "seconds"), 3: ("hours", "minutes", "seconds")}
    if len(numbers) not in names:
        raise _NotADuration("")
    _in_clock_range(numbers, names[len(numbers)], leading=True)
    weights = {1: (60,), 2: (60, 1), 3: (3600, 60, 1)}[len(numbers)]
    return sum(n * w for n, w in zip(numbers, weights, strict=True))


def _in_clock_range(numbers: list[int], names: tuple[str, ...], *, leading: bool) -> None:
    for i, (number, name) in enumerate(zip(numbers, names, strict=True)):
        if i == 0 and leading:
            continue  # MM:SS may say 90:00, HH:MM:SS 36:00:00
        top = 23 if name == "hours" else 59
        if number > top:
            raise _NotADuration(f"{name} must be 0-{top}")


def parse_memory(value: str) -> int:
    """MiB of a memory size: ``512M``, ``4G``, ``1T``, ``1024K`` (binary units, as Slurm's;
    case-insensitive; ``1.5G`` is 1536), a bare number being MiB; rounded up to a whole
    MiB. ValueError otherwise."""
    found = _SIZE.fullmatch(value.strip())
    if not found:
        raise ValueError(value)
    mib = fractions.Fraction(found.group(1)) * _UNIT_MIB[(found.group(2) or "m").lower()]
    return math.ceil(mib)


def _time_limit(value: Any, handler: ValidatorFunctionWrapHandler) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _refused(
            f"must be a duration ({DURATION_HINT}) or an integer of seconds,"
            f" got {shown_value(value)}"
        )
    if isinstance(value, str):
        try:
            seconds = parse_duration(value)
        except _NotADuration as exc:
            why = f"{exc}; " if str(exc) else ""
            shown = shown_value(value)
            raise _refused(f"{shown} is not a duration ({why}{DURATION_HINT})") from None
    else:
        seconds = value
    if not 1 <= seconds <= INT32_MAX:
        raise _refused(f"must be from 1 second to {INT32_MAX} seconds, got {shown_value(value)}")
    return seconds


def _memory(value: Any, handler: ValidatorFunctionWrapHandler) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _refused(f"must be a memory size ({MEMORY_HINT}), got {shown_value(value)}")
    if isinstance(value, str):
        try:
            mib = parse_memory(value)
        except ValueError:
            raise _refused(f"{shown_value(value)} is not a memory size ({MEMORY_HINT})") from None
    else:
        mib = value
    if not 1 <= mib <= INT32_MAX:
        raise _refused(f"must be from 1 MiB to {INT32_MAX} MiB, got {shown_value(value)}")
    return mib


TimeLimit = Annotated[int, WrapValidator(_time_limit)]
Memory = Annotated[int, WrapValidator(_memory)]
Gpus = Annotated[
    int,
    Field(strict=True, ge=0, le=INT32_MAX),
    _worded(f"must be an integer of GPUs >= 0 (at most {INT32_MAX})"),
]
Constraint = Annotated[
    str,
    _string(CONSTRAINT_MAX, _CONSTRAINT),
    _text_worded(
        CONSTRAINT_MAX,
        "must be a Slurm feature expression: feature names (letters, digits, _ . : + @ / -)"
        " joined by & | , with ( ) [ ] and *N counts, no spaces",
    ),
]


class _Resources(_Model):
    time_limit: TimeLimit | None = None
    account: ShortText | None = None
    qos: ShortText | None = None
    partition: ShortText | None = None
    memory: Memory | None = None
    memory_per_cpu: Memory | None = None
    gpus: Gpus | None = None
    constraint: Constraint | None = None

    @classmethod
    def _unknown(cls, key: str) -> PydanticCustomError:
        return _refused(unknown_key(key, RESOURCE_KEYS, listed=True), key)

    @model_validator(mode="after")
    def _one_memory(self) -> _Resources:
        if self.memory is not None and self.memory_per_cpu is not None:
            raise _refused("give memory (per node) or memory_per_cpu, not both", "memory_per_cpu")
        return self

    def resources(self) -> JobResources:
        per_cpu = self.memory_per_cpu is not None
        return JobResources(
            time_limit_s=self.time_limit,
            account=self.account,
            qos=self.qos,
            partition=self.partition,
            memory_mib=self.memory_per_cpu if per_cpu else self.memory,
            memory_per=MemoryScope.CPU if per_cpu else MemoryScope.NODE,
            gpus=self.gpus,
            constraint=self.constraint,
        )


def resource_keys(resources: JobResources) -> dict[str, Any]:
    """``resources`` under the names users write (:data:`RESOURCE_KEYS`), the set ones
    only: whole seconds and MiB as integers, which :func:`check_resources` reads back to
    equal resources (the pipeline file's writer, re-checks)."""
    keys: dict[str, Any] = {
        "time_limit": resources.time_limit_s,
        "account": resources.account,
        "qos": resources.qos,
        "partition": resources.partition,
    }
    memory = "memory_per_cpu" if resources.memory_per is MemoryScope.CPU else "memory"
    keys[memory] = resources.memory_mib
    keys["gpus"] = resources.gpus
    keys["constraint"] = resources.constraint
    return {key: value for key, value in keys.items() if value is not None}


def _resource_mapping(value: Any) -> Any:
    """A :class:`JobResources` (a dataclass field re-checked) as the keys users write."""
    if value is None:
        return {}
    if isinstance(value, JobResources):
        return resource_keys(value)
    return value


Resources = Annotated[_Resources, BeforeValidator(_resource_mapping)]


def check_resources(
    value: object,
    *,
    root: tuple[str, ...] = (),
    error: Callable[[str, str], Exception] | None = None,
) -> JobResources:
    """What a job asks of a cluster besides processors, from the keys users write
    (:data:`RESOURCE_KEYS`; None values are unset) or a :class:`JobResources` re-checked.
    A refusal is one line naming the field (``time_limit: '10x' is not a duration (use
    90s, 10m, 2h, 1d or D-HH:MM:SS)``), raised as RequestError, or as ``error(field,
    problem)`` (the pipeline file names its own place); ``root`` prefixes the field."""
    if value is not None and not isinstance(value, JobResources | Mapping):
        field, problem = _field(root), f"must be a table of resources, got {shown_value(value)}"
    else:
        raw = _resource_mapping(value)
        if isinstance(raw, Mapping):
            raw = {key: item for key, item in raw.items() if item is not None}
        try:
            return _Resources.model_validate(raw).resources()
        except ValidationError as exc:
            field, problem = _one_line(exc, root)
    if error is not None:
        raise error(field, problem)
    raise RequestError(f"{field}: {problem}" if field else problem)


# -- the grid description -------------------------------------------------------------


_REFERENCES = ("env", "airflow_conn", "file", "command")
# Words a shell would act on; the command is run without one (gridcore.credentials).
_SHELL_WORDS = frozenset({"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1", "&>"})
TokenFile = Annotated[
    str,
    _string(STORAGE_DIR_MAX, r"^/[^\x00]*$"),
    # not shown: a token pasted here by mistake stays out of the message
    _worded(
        "must be an absolute path (starting with /; ~ is not expanded)",
        {"string_too_long": f"must be at most {STORAGE_DIR_MAX} characters"},
        show=False,
    ),
]


class _Credential(_Model):
    env: EnvName | None = None
    airflow_conn: ShortText | None = None
    file: TokenFile | None = None
    command: Command | None = None

    @classmethod
    def _unknown(cls, key: str) -> PydanticCustomError:
        if difflib.get_close_matches(key, _REFERENCES, n=1):  # a typo: name the key
            return _refused(unknown_key(key, _REFERENCES), key)
        return _refused("unknown credential reference: use env, airflow_conn, file or command")

    @model_validator(mode="after")
    def _exactly_one(self) -> _Credential:
        given = [key for key in _REFERENCES if getattr(self, key) is not None]
        if not given:
            raise ValueError("no reference")
        if len(given) > 1:
            named = ", ".join(given[:-1]) + " and " + given[-1]
            raise _refused(f"must be exactly one reference, got {named}")
        if self.command is not None:
            _check_token_command(self.command)
        return self


def _check_token_command(command: str) -> None:
    """The command splits into words (shlex) and names a program; no shell operator, as
    no shell runs it."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise _refused(f"cannot be split into words as a shell would: {exc}", "command") from None
    if not words or not words[0]:
        raise _refused("names no program", "command")
    operators = sorted(_SHELL_WORDS.intersection(words))
    if operators:
        raise _refused(
            f"is run without a shell, so {' '.join(operators)} would reach the program as"
            " arguments: write sh -c '...' for pipes or redirections",
            "command",
        )


Credential = Annotated[
    _Credential,
    _worded(
        'must be a reference { env = "VAR" }, { airflow_conn = "conn_id" },'
        ' { file = "/path" } or { command = "..." }, never the token itself',
        show=False,
    ),
]


class _Site(_Model):
    kind: SiteKindChoice
    processors: Count
    slowness: Positive = 1.0
    storage_dir: StorageDir | None = None
    storage_gb: StorageGb | None = None
    url: SlurmUrl | None = None
    partition: ShortText = "debug"
    user: ShortText = "root"
    token: Credential | None = None
    api_version: ApiVersion = slurm_api.AUTO
    timeout_s: Positive = 10.0
    # what every job at the site asks for unless its request says otherwise
    defaults: Resources | None = None

    @model_validator(mode="after")
    def _fields_of_kind(self) -> _Site:
        if self.kind is SiteKind.LOCAL:
            slurm_only = sorted(self.model_fields_set & _SLURM_ONLY)
            if slurm_only:
                raise _refused(f"key(s) {slurm_only} only apply to slurm")
            if self.defaults is not None and self.defaults.gpus:
                raise _refused("a local site has no GPUs", "defaults", "gpus")
        elif self.url is None:
            raise _refused("slurm sites need an http(s) slurmrestd URL, got None", "url")
        return self

    def spec(self, name: str) -> SiteSpec:
        slurm = self.kind is SiteKind.SLURM
        return SiteSpec(
            name=name,
            kind=SiteKind(self.kind),
            processors=self.processors,
            slowness=self.slowness,
            storage_dir=self.storage_dir,
            storage_bytes=None if self.storage_gb is None else int(self.storage_gb * 1e9),
            url=str(self.url).rstrip("/") if slurm else None,
            partition=self.partition if slurm else None,
            user=self.user if slurm else None,
            token=None if self.token is None else CredentialRef(**self.token.model_dump()),
            api_version=self.api_version,
            timeout_s=self.timeout_s,
            defaults=NO_RESOURCES if self.defaults is None else self.defaults.resources(),
        )


class _Grid(_Model):
    version: Version
    default_bandwidth_mbps: Positive = 100.0
    sites: dict[SiteName, _Site] = Field(default_factory=dict, validate_default=True)
    bandwidth: dict[SiteName, dict[SiteName, Positive]] = Field(default_factory=dict)

    @field_validator("sites", mode="after")
    @classmethod
    def _some_sites(cls, sites: dict[str, _Site]) -> dict[str, _Site]:
        if not sites:
            raise _refused("at least one [sites.NAME] table is required")
        if ORIGIN in sites:
            raise _refused(f"site name {ORIGIN!r} is reserved for where inputs live", ORIGIN)
        return sites

    @model_validator(mode="after")
    def _bandwidth_between_known_sites(self) -> _Grid:
        known = {*self.sites, ORIGIN}
        for src, row in self.bandwidth.items():
            if src not in known:
                raise _refused(
                    f"unknown site (known: {', '.join(sorted(known))})", "bandwidth", src
                )
            for dst in row:
                if dst not in known:
                    raise _refused(
                        f"unknown site (known: {', '.join(sorted(known))})", "bandwidth", src, dst
                    )
                if dst == src:
                    raise _refused("a site to itself needs no bandwidth", "bandwidth", src, dst)
        return self

    def spec(self, source: str) -> GridSpec:
        matrix = {
            (src, dst): mbps for src, row in self.bandwidth.items() for dst, mbps in row.items()
        }
        return GridSpec(
            tuple(site.spec(name) for name, site in self.sites.items()),
            MappingProxyType(matrix),
            self.default_bandwidth_mbps,
            source,
        )


def grid_from_raw(raw: Any, source: str = "<memory>") -> GridSpec:
    """Validate an already-parsed grid description (a dict shaped like the TOML)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: must be a table of keys, got {shown_value(raw)}")
    grid = _validated(_Grid, raw, lambda m: ConfigError(f"{source}: {m}"))
    return grid.spec(source)


# -- requests ---------------------------------------------------------------------------


class _JobRequest(_Model):
    name: JobName
    processors: Count
    runtime_s: NonNegative | None = None  # None: unknown (gridcore.model.JobRequest)
    input_bytes: ByteCount = 0
    output_bytes: ByteCount = 0
    origin: SiteName = ORIGIN

    @field_validator("origin", mode="after")
    @classmethod
    def _origin_known(cls, origin: str, info: ValidationInfo) -> str:
        known = _known(info)
        if known is not None and origin != ORIGIN and origin not in known:
            names = ", ".join(sorted({*known, ORIGIN}))
            raise _refused(f"unknown site {origin!r} (known: {names})")
        return origin

    def request(self) -> JobRequest:
        return JobRequest(
            self.name,
            self.processors,
            self.runtime_s,
            self.input_bytes,
            self.output_bytes,
            self.origin,
        )


class _JobSubmission(_Model):
    name: JobName
    command: Command
    processors: Count
    workdir: WorkDir | None = None
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    resources: Resources | None = None


def _resources_of(checked: _Resources | None) -> JobResources:
    return NO_RESOURCES if checked is None else checked.resources()


class _Component(_Model):
    size: Count
    site: SiteName | None = None


class _Flexible(_Model):
    min_component_size: Count = 1
    max_components: Count | None = None
    splits: tuple[tuple[Count, ...], ...] = ()


class _InputFile(_Model):
    logical_name: LogicalName
    delivery: DeliveryChoice = FileDelivery.WHOLE


class _CoAllocationRequest(_Model):
    name: JobName
    kind: RequestKindChoice
    components: tuple[_Component, ...] = ()
    total: Total = 0
    input_file: _InputFile | None = None
    priority: PriorityChoice = Priority.LOW
    flexible: _Flexible = Field(default_factory=_Flexible)
    resources: Resources | None = None

    @model_validator(mode="after")
    def _shape_of_kind(self, info: ValidationInfo) -> _CoAllocationRequest:
        if self.kind is RequestKind.FLEXIBLE:
            self._check_flexible()
        else:
            self._check_components(_known(info))
        self._check_component_names()
        return self

    def _check_component_names(self) -> None:
        # Each component's site job is named NAME#i in a JOB_NAME_MAX column (issue 21
        # item 18); a flexible request has at most total / min_component_size components
        # and no more than its max_components.
        if self.kind is RequestKind.FLEXIBLE:
            count = self.total // self.flexible.min_component_size
            count = min(count, self.flexible.max_components or count)
        else:
            count = len(self.components)
        last = max(count - 1, 0)
        room = JOB_NAME_MAX - (len(component_job_name(self.name, last)) - len(self.name))
        if len(self.name) > room:
            raise _refused(
                f"must be at most {room} characters: each component's site job is named"
                f" NAME#i (up to #{last}), got {len(self.name)}",
                "name",
            )

    def _check_components(self, sites: frozenset[str] | None) -> None:
        kind = self.kind
        if self.total:
            raise _refused(
                f"only a flexible request gives a total, not a {kind.value} one", "total"
            )
        if not self.components:
            raise _refused(f"a {kind.value} request needs at least one", "components")
        for i, component in enumerate(self.components):
            if kind is RequestKind.NON_FIXED and component.site is not None:
                raise _refused(
                    f"a non-fixed request leaves sites to the scheduler, got {component.site!r}",
                    "components",
                    i,
                    "site",
                )
            if kind is RequestKind.FIXED and component.site is None:
                raise _refused(
                    "a fixed request names every component's site", "components", i, "site"
                )
            if kind is RequestKind.FIXED and sites is not None and component.site not in sites:
                raise _refused(
                    f"unknown site {component.site!r} (known: {', '.join(sorted(sites))})",
                    "components",
                    i,
                    "site",
                )

    def _check_flexible(self) -> None:
        total = self.total
        if total <= 0:
            raise _refused(f"a flexible request needs a total > 0, got {total}", "total")
        if self.components:
            raise _refused("a flexible request gives only a total", "components")
        options = self.flexible
        if not options.min_component_size <= total:
            raise _refused(
                f"must be in [1, {total}], got {options.min_component_size}",
                "flexible",
                "min_component_size",
            )
        for k, split in enumerate(options.splits):
            if sum(split) != total:
                raise _refused(
                    f"parts sum to {sum(split)}, not the total {total}", "flexible", "splits", k
                )

    def request(self) -> CoAllocationRequest:
        flexible = self.flexible
        return CoAllocationRequest(
            self.name,
            RequestKind(self.kind),
            tuple(Component(c.size, c.site) for c in self.components),
            self.total,
            None
            if self.input_file is None
            else InputFile(self.input_file.logical_name, FileDelivery(self.input_file.delivery)),
            Priority(self.priority),
            FlexibleOptions(flexible.min_component_size, flexible.max_components, flexible.splits),
            _resources_of(self.resources),
        )


class _CoAllocationSubmission(_Model):
    request: _CoAllocationRequest
    command: Command
    quota: Fraction | None = None


def check_job_request(
    request: JobRequest | Mapping[str, Any], sites: Collection[str] | None = None
) -> JobRequest:
    """``request`` checked field by field (a new :class:`JobRequest`); with ``sites``,
    its origin must be one of them or ``origin``. RequestError naming the field."""
    return _validated(_JobRequest, request, RequestError, root=("request",), sites=sites).request()


def check_selection_stream(stream: Any) -> str:
    """A selection stream name (``gc_selections.stream``)."""
    return _validated(_Stream, {"stream": stream}, RequestError).stream


def check_job_submission(job: JobSubmission | Mapping[str, Any]) -> JobSubmission:
    """What a site will run: its name, command, processors, workdir, environment and
    resources (:func:`check_resources`)."""
    checked = _validated(_JobSubmission, job, RequestError, root=("job",))
    if isinstance(job, JobSubmission):
        return job  # its fields are as checked; fields the check does not cover stay
    env = MappingProxyType(dict(checked.env))
    return JobSubmission(
        checked.name,
        checked.command,
        checked.processors,
        checked.workdir,
        env,
        resources=_resources_of(checked.resources),
    )


def check_coallocation_request(
    request: CoAllocationRequest | Mapping[str, Any], sites: Collection[str] | None = None
) -> CoAllocationRequest:
    """``request`` checked field by field and against its kind's shape (KOALA 2006 Sec.
    2.2); with ``sites``, a fixed request may only name those sites."""
    return _validated(
        _CoAllocationRequest, request, RequestError, root=("request",), sites=sites
    ).request()


def check_coallocation_submission(
    request: CoAllocationRequest | Mapping[str, Any],
    command: Any,
    quota: Any = None,
    sites: Collection[str] | None = None,
) -> tuple[CoAllocationRequest, str, float | None]:
    """A KOALA submission: the request, the command every component runs, the quota."""
    checked = _validated(
        _CoAllocationSubmission,
        {"request": request, "command": command, "quota": quota},
        RequestError,
        sites=sites,
    )
    return checked.request.request(), checked.command, checked.quota


class _CoReservationRequest(_Model):
    name: JobName
    command: Command
    processors: Count
    vj_size: Count = 1
    max_clusters: Count = 4
    lifetime_floor_s: NonNegative = 60.0
    workdir: WorkDir | None = None
    sites: tuple[SiteName, ...] | None = None
    machine_file: dict[SiteName, Count] | None = None
    resources: Resources | None = None

    @model_validator(mode="after")
    def _shape(self, info: ValidationInfo) -> _CoReservationRequest:
        if self.processors % self.vj_size:
            raise _refused(
                f"processors {self.processors} is not a multiple of vj_size {self.vj_size}",
                "processors",
            )
        known = _known(info)
        for i, site in enumerate(self.sites or ()):
            if known is not None and site not in known:
                raise _refused(
                    f"unknown site {site!r} (known: {', '.join(sorted(known))})", "sites", i
                )
        if self.sites is not None and not self.sites:
            raise _refused("must name at least one site (or be left out)", "sites")
        self._check_machine_file(known)
        return self

    def _check_machine_file(self, known: frozenset[str] | None) -> None:
        pinned = self.machine_file
        if pinned is None:
            return
        wanted = self.processors // self.vj_size
        if sum(pinned.values()) != wanted:
            raise _refused(
                f"virtual jobs sum to {sum(pinned.values())}, not processors / vj_size = {wanted}",
                "machine_file",
            )
        for site in pinned:
            if known is not None and site not in known:
                raise _refused(
                    f"unknown site {site!r} (known: {', '.join(sorted(known))})",
                    "machine_file",
                    site,
                )

    def request(self) -> CoReservationRequest:
        return CoReservationRequest(
            self.name,
            self.command,
            self.processors,
            self.vj_size,
            self.max_clusters,
            float(self.lifetime_floor_s),
            self.workdir,
            self.sites,
            None if self.machine_file is None else tuple(self.machine_file.items()),
            _resources_of(self.resources),
        )


def check_coreservation_request(
    request: CoReservationRequest | Mapping[str, Any], sites: Collection[str] | None = None
) -> CoReservationRequest:
    """A VJM co-reservation request (``gridcore.engine.coreservation``)."""
    if isinstance(request, CoReservationRequest):
        pinned = request.machine_file
        request = {
            **{f.name: getattr(request, f.name) for f in dataclasses.fields(request)},
            "machine_file": None if pinned is None else dict(pinned),
        }
    return _validated(_CoReservationRequest, request, RequestError, sites=sites).request()


def check_choice(kind: type[_E], value: Any, field: str) -> _E:
    """A member of ``kind`` from its value (an option the request models do not carry:
    a selection protocol, a placement policy), refused in the models' wording."""
    # A type built at run time, which mypy cannot follow.
    choice: TypeAdapter[_E] = TypeAdapter(Annotated[kind, _one_of(kind)])  # type: ignore[arg-type]
    try:
        return choice.validate_python(value)
    except ValidationError as exc:
        raise RequestError(f"{field}: {_one_line(exc)[1]}") from None


def check_logical_name(name: Any) -> str:
    """A logical file name (``gc_replicas.logical_name``): a relative POSIX path of at
    most 512 characters whose segments are non-empty and do not start with '.' (hidden
    names are where transfers write partial files) or white space, without backslash or
    NUL."""
    try:
        return _LOGICAL_NAMES.validate_python(name)
    except ValidationError as exc:
        raise RequestError(f"logical file name: {_one_line(exc)[1]}") from None


class _Stream(_Model):
    stream: Stream


_LOGICAL_NAMES: TypeAdapter[str] = TypeAdapter(LogicalName)
