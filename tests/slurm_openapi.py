"""Slurm's own OpenAPI specs for slurmrestd, and a strict check of request bodies against them.

The specs under tests/data/openapi/ are SchedMD's, one per REST API version v0.0.38 to
v0.0.45 (tests/data/openapi/README.md names the repository, path and commit of each).
``request_body_errors`` validates a request body against the ``requestBody`` schema of one
operation, and treats every property the spec does not define as an error: Slurm's specs do
not set ``additionalProperties: false``, yet newer servers drop an unknown field with only
a warning ("Ignoring unknown field"), so a misspelt or retired field must fail here.

The same function takes a spec dumped from a live server (``GET /openapi/v3``, see
``fetch_live_spec``): such a spec holds every version the server serves, and the
operation is picked by the version in the path (``/slurm/v0.0.42/job/submit``).

Schemas are checked as JSON Schema draft 4, which OpenAPI 3.0 schema objects follow;
``format`` is not checked. An object schema without ``properties`` (v0.0.38's
``environment`` dictionary) stays open.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jsonschema
import referencing
from jsonschema.exceptions import ValidationError
from referencing.jsonschema import DRAFT4

SPEC_DIR = Path(__file__).parent / "data" / "openapi"
VERSIONS = tuple(f"v0.0.{n}" for n in range(38, 46))
# What slurmrestd 23.11.11 answered to GET /openapi/v3 (v0.0.39 and v0.0.40, ctld and dbd)
LIVE_23_11 = SPEC_DIR / "slurmrestd-23.11.11-openapi-v3.json.gz"
_SPEC_URI = "urn:gridcore-tests:slurmrestd-openapi"
_VERSION = re.compile(r"^/slurm(?:db)?/(v\d+\.\d+\.\d+)/")


def _version(version: str | int) -> str:
    """'v0.0.42', '0.0.42', 42 and '42' all name v0.0.42."""
    text = str(version).strip()
    if text.isdigit():
        text = f"v0.0.{text}"
    if not text.startswith("v"):
        text = f"v{text}"
    if text not in VERSIONS:
        raise ValueError(f"no stored slurmrestd spec for {version!r} (have {', '.join(VERSIONS)})")
    return text


def spec_path(version: str | int) -> Path:
    """The stored (gzipped) spec file of one REST API version."""
    return SPEC_DIR / f"slurmrestd-{_version(version)}.json.gz"


def load_spec(version: str | int) -> dict[str, Any]:
    """SchedMD's OpenAPI spec of one version (a fresh dict: callers may change it)."""
    return load_spec_file(spec_path(version))


def load_spec_file(path: Path) -> dict[str, Any]:
    """A stored spec, gzipped or not (e.g. ``LIVE_23_11``, a real ``GET /openapi/v3``)."""
    data = path.read_bytes()
    spec: dict[str, Any] = json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)
    return spec


def fetch_live_spec(
    base_url: str, headers: Mapping[str, str] | None = None, timeout: float = 30.0
) -> dict[str, Any]:
    """The spec a running slurmrestd serves at ``GET /openapi/v3`` (all its versions).

    ``base_url`` is the server root (``http://host:6820``), not a version's prefix.
    """
    import requests

    reply = requests.get(
        f"{base_url.rstrip('/')}/openapi/v3", headers=dict(headers or {}), timeout=timeout
    )
    reply.raise_for_status()
    spec: dict[str, Any] = reply.json()
    return spec


def _server_prefix(spec: Mapping[str, Any]) -> str:
    """v0.0.38's spec lists paths relative to its server URL (/slurm/v0.0.38/)."""
    servers = spec.get("servers") or [{}]
    return str(servers[0].get("url", "/")).rstrip("/")


def full_paths(spec: Mapping[str, Any]) -> dict[str, str]:
    """Each path as a client requests it -> the key under the spec's ``paths``."""
    prefix = _server_prefix(spec)
    out: dict[str, str] = {}
    for key in spec.get("paths", {}):
        full = key if _VERSION.match(key) or not prefix else prefix + key
        out[full] = key
    return out


def spec_versions(spec: Mapping[str, Any]) -> list[str]:
    """The REST API versions a spec has paths for (several for a live server's spec)."""
    found = {m.group(1) for p in full_paths(spec) if (m := _VERSION.match(p))}
    return sorted(found, key=lambda v: tuple(int(n) for n in v[1:].split(".")))


def _segments(path: str) -> list[str]:
    return [s for s in path.split("?", 1)[0].strip("/").split("/") if s]


def _match(template: str, path: str) -> int | None:
    """How many literal segments of ``template`` match ``path``; None if it does not."""
    want, have = _segments(template), _segments(path)
    if len(want) != len(have):
        return None
    literal = 0
    for w, h in zip(want, have, strict=True):
        if w.startswith("{") and w.endswith("}"):
            continue
        if w != h:
            return None
        literal += 1
    return literal


def find_operation(spec: Mapping[str, Any], method: str, path: str) -> tuple[str, str]:
    """The spec's path key and method of the operation a request would reach.

    ``path`` is the full path with the version (``/slurm/v0.0.42/job/submit``); either the
    spec's template (``/slurm/v0.0.42/job/{job_id}``) or a concrete path (``.../job/17``).
    A trailing slash does not matter; a literal segment beats a ``{parameter}``.
    """
    verb = method.lower()
    best: tuple[int, str] | None = None
    for full, key in full_paths(spec).items():
        if verb not in spec["paths"][key]:
            continue
        score = _match(full, path)
        if score is not None and (best is None or score > best[0]):
            best = (score, key)
    if best is None:
        versions = ", ".join(spec_versions(spec)) or "none"
        raise KeyError(f"no {method.upper()} {path} in this spec (versions: {versions})")
    return best[1], verb


def _strict(reject_deprecated: bool) -> Any:
    """A draft 4 validator class where a field the schema does not list is an error."""
    draft4_properties = jsonschema.Draft4Validator.VALIDATORS["properties"]

    def properties(
        validator: Any, props: Mapping[str, Any], instance: Any, schema: Mapping[str, Any]
    ) -> Iterator[ValidationError]:
        yield from draft4_properties(validator, props, instance, schema)
        if not validator.is_type(instance, "object"):
            return
        for name in instance:
            if name not in props:
                yield ValidationError(
                    f"unknown field {name!r}: the spec does not define it", path=[name]
                )
            elif reject_deprecated and "$ref" in props[name] and props[name].get("deprecated"):
                # draft 4 ignores the siblings of a $ref: their "deprecated" is seen here
                yield ValidationError(f"field {name!r} is deprecated", path=[name])

    def deprecated(
        validator: Any, value: Any, instance: Any, schema: Mapping[str, Any]
    ) -> Iterator[ValidationError]:
        if value and reject_deprecated:
            yield ValidationError("deprecated by the spec")

    return jsonschema.validators.extend(
        jsonschema.Draft4Validator, {"properties": properties, "deprecated": deprecated}
    )


_STRICT = {False: _strict(False), True: _strict(True)}


def _where(error: ValidationError) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(body)"


def _request_body(spec: Mapping[str, Any], method: str, path: str) -> tuple[str, str, str]:
    """The path key, method and media type of an operation's JSON request body."""
    key, verb = find_operation(spec, method, path)
    body = spec["paths"][key][verb].get("requestBody")
    if not body:
        raise KeyError(f"{method.upper()} {path} takes no request body in this spec")
    content = body["content"]
    media = "application/json" if "application/json" in content else next(iter(content))
    return key, verb, media


def request_body_schema(spec: Mapping[str, Any], method: str, path: str) -> dict[str, Any]:
    """The JSON ``requestBody`` schema of an operation (usually a ``$ref``)."""
    key, verb, media = _request_body(spec, method, path)
    schema: dict[str, Any] = spec["paths"][key][verb]["requestBody"]["content"][media]["schema"]
    return schema


def request_body_errors(
    spec: Mapping[str, Any],
    method: str,
    path_template: str,
    body: object,
    *,
    allow_deprecated: bool = True,
) -> list[str]:
    """What is wrong with ``body`` as the request body of ``method path_template``.

    Empty when it conforms. Each line says where (``job.environment``) and what. A field the
    spec does not define is an error; so is a deprecated one when ``allow_deprecated`` is
    false. ``spec`` is ``load_spec(version)`` or a live server's ``GET /openapi/v3``.
    """
    key, verb, media_type = _request_body(spec, method, path_template)
    pointer = "/".join(
        p.replace("~", "~0").replace("/", "~1")
        for p in ("", "paths", key, verb, "requestBody", "content", media_type, "schema")
    )
    resource = referencing.Resource.from_contents(dict(spec), default_specification=DRAFT4)
    registry: referencing.Registry[Any] = referencing.Registry().with_resource(_SPEC_URI, resource)
    cls = _STRICT[not allow_deprecated]
    validator = cls({"$ref": f"{_SPEC_URI}#{quote(pointer, safe='/~')}"}, registry=registry)
    errors = sorted(validator.iter_errors(body), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{_where(e)}: {e.message}" for e in errors]
