"""The grid description file: a versioned TOML format users write by hand.

Format (version 1)::

    version = 1                      # required
    default_bandwidth_mbps = 100     # optional; MB/s for pairs missing from [bandwidth]

    [sites.alpha]                    # one table per site; the key is the site name
    kind = "slurm"                   # "local" | "slurm"
    processors = 16                  # total processors the site offers (> 0)
    slowness = 1.0                   # runtime multiplier vs. a reference site (> 0)
    storage_dir = "/srv/alpha"       # job working directories / staged files; a path on
                                     # this machine, or sftp://user@host:port/path for
                                     # storage reached over SFTP (file staging)
    storage_gb = 100                 # optional storage capacity in GB
    url = "http://host:6820"         # slurm: slurmrestd base URL
    partition = "debug"              # slurm: partition (default "debug")
    user = "root"                    # slurm: X-SLURM-USER-NAME
    token = { env = "ALPHA_TOKEN" }  # slurm: credential BY REFERENCE:
                                     #   { env = "VAR" } or { airflow_conn = "conn_id" }
    api_version = "v0.0.38"          # slurm: slurmrestd OpenAPI version (v0.0.36-38)
    timeout_s = 10                   # slurm: HTTP timeout

    [sites.laptop]
    kind = "local"
    processors = 4
    storage_dir = "/tmp/gridcore/laptop"   # optional; default under the state dir

    [bandwidth]                      # directed MB/s; a missing reverse pair is symmetric
    origin = { alpha = 200.0, laptop = 1000.0 }   # "origin" = where inputs live
    alpha = { laptop = 50.0 }

Every problem raises :class:`ConfigError` naming the file and the field
(``grid.toml: sites.alpha.processors: must be a positive integer, got 0``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gridcore.errors import ConfigError
from gridcore.model import ORIGIN, CredentialRef, GridSpec, SiteKind, SiteSpec

FORMAT_VERSION = 1
GRID_ENV = "GRIDCORE_GRID"
_SITE_KEYS = {
    "kind",
    "processors",
    "slowness",
    "storage_dir",
    "storage_gb",
    "url",
    "partition",
    "user",
    "token",
    "api_version",
    "timeout_s",
}
_SLURM_ONLY = {"url", "partition", "user", "token", "api_version", "timeout_s"}
_API_VERSIONS = {"v0.0.36", "v0.0.37", "v0.0.38"}


def load_grid(path: str | os.PathLike[str]) -> GridSpec:
    """Read and validate a grid description file."""
    file = Path(path)
    try:
        raw = tomllib.loads(file.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"grid description {file} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
    return parse_grid(raw, source=str(file))


def parse_grid(raw: Mapping[str, Any], source: str = "<memory>") -> GridSpec:
    """Validate an already-parsed grid description (a dict shaped like the TOML)."""
    where = _Where(source)
    unknown = set(raw) - {"version", "default_bandwidth_mbps", "sites", "bandwidth"}
    if unknown:
        raise where.error("", f"unknown top-level key(s) {sorted(unknown)}")
    version = raw.get("version")
    if version != FORMAT_VERSION:
        raise where.error("version", f"must be {FORMAT_VERSION}, got {version!r}")
    default_bw = _positive_float(
        where, "default_bandwidth_mbps", raw.get("default_bandwidth_mbps", 100.0)
    )
    sites_raw = raw.get("sites")
    if not isinstance(sites_raw, Mapping) or not sites_raw:
        raise where.error("sites", "at least one [sites.NAME] table is required")
    sites = tuple(_parse_site(where, name, body) for name, body in sites_raw.items())
    bandwidth = _parse_bandwidth(where, raw.get("bandwidth", {}), {s.name for s in sites})
    return GridSpec(sites, MappingProxyType(bandwidth), default_bw, source)


def default_grid(state_dir: str | os.PathLike[str]) -> GridSpec:
    """The embedded default: three local sites of different size and speed on this
    machine, so the demo shows selection without any service."""
    base = Path(state_dir)
    sites = (
        SiteSpec("local-a", SiteKind.LOCAL, 8, 1.0, str(base / "sites" / "local-a")),
        SiteSpec("local-b", SiteKind.LOCAL, 4, 1.2, str(base / "sites" / "local-b")),
        SiteSpec("local-c", SiteKind.LOCAL, 4, 1.5, str(base / "sites" / "local-c")),
    )
    bandwidth = {(ORIGIN, "local-a"): 400.0, (ORIGIN, "local-b"): 200.0, (ORIGIN, "local-c"): 100.0}
    return GridSpec(sites, MappingProxyType(bandwidth), 100.0, "<embedded default>")


class _Where:
    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, field: str, message: str) -> ConfigError:
        prefix = f"{self.source}: {field}: " if field else f"{self.source}: "
        return ConfigError(prefix + message)


def _parse_site(where: _Where, name: str, body: Any) -> SiteSpec:
    field = f"sites.{name}"
    if not name or name == ORIGIN or not all(c.isalnum() or c in "-_" for c in name):
        raise where.error(field, f"site name must be letters, digits, - or _ and not {ORIGIN!r}")
    if not isinstance(body, Mapping):
        raise where.error(field, "must be a table")
    unknown = set(body) - _SITE_KEYS
    if unknown:
        raise where.error(field, f"unknown key(s) {sorted(unknown)}")
    kind = _parse_kind(where, field, body.get("kind"))
    if kind is SiteKind.LOCAL and set(body) & _SLURM_ONLY:
        raise where.error(field, f"key(s) {sorted(set(body) & _SLURM_ONLY)} only apply to slurm")
    processors = body.get("processors")
    if not isinstance(processors, int) or isinstance(processors, bool) or processors <= 0:
        raise where.error(f"{field}.processors", f"must be a positive integer, got {processors!r}")
    storage_gb = body.get("storage_gb")
    storage_bytes = None
    if storage_gb is not None:
        storage_bytes = int(_positive_float(where, f"{field}.storage_gb", storage_gb) * 1e9)
    spec = SiteSpec(
        name=name,
        kind=kind,
        processors=processors,
        slowness=_positive_float(where, f"{field}.slowness", body.get("slowness", 1.0)),
        storage_dir=_optional_str(where, f"{field}.storage_dir", body.get("storage_dir")),
        storage_bytes=storage_bytes,
    )
    if kind is SiteKind.SLURM:
        spec = _with_slurm_fields(where, field, spec, body)
    return spec


def _parse_kind(where: _Where, field: str, kind: Any) -> SiteKind:
    try:
        return SiteKind(kind)
    except ValueError:
        allowed = " | ".join(k.value for k in SiteKind)
        raise where.error(f"{field}.kind", f"must be {allowed}, got {kind!r}") from None


def _with_slurm_fields(
    where: _Where, field: str, spec: SiteSpec, body: Mapping[str, Any]
) -> SiteSpec:
    url = body.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise where.error(
            f"{field}.url", f"slurm sites need an http(s) slurmrestd URL, got {url!r}"
        )
    api_version = body.get("api_version", "v0.0.38")
    if api_version not in _API_VERSIONS:
        raise where.error(
            f"{field}.api_version", f"must be one of {sorted(_API_VERSIONS)}, got {api_version!r}"
        )
    return SiteSpec(
        name=spec.name,
        kind=spec.kind,
        processors=spec.processors,
        slowness=spec.slowness,
        storage_dir=spec.storage_dir,
        storage_bytes=spec.storage_bytes,
        url=url.rstrip("/"),
        partition=_optional_str(where, f"{field}.partition", body.get("partition")) or "debug",
        user=_optional_str(where, f"{field}.user", body.get("user")) or "root",
        token=_parse_credential(where, f"{field}.token", body.get("token")),
        api_version=api_version,
        timeout_s=_positive_float(where, f"{field}.timeout_s", body.get("timeout_s", 10.0)),
    )


def _parse_credential(where: _Where, field: str, raw: Any) -> CredentialRef:
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise where.error(
            field,
            'must be a reference { env = "VAR" } or { airflow_conn = "conn_id" },'
            " never the token itself",
        )
    ((key, value),) = raw.items()
    if key not in ("env", "airflow_conn") or not isinstance(value, str) or not value:
        raise where.error(
            field, f"unknown credential reference {{ {key} = ... }}: use env or airflow_conn"
        )
    return CredentialRef(env=value) if key == "env" else CredentialRef(airflow_conn=value)


def _parse_bandwidth(where: _Where, raw: Any, sites: set[str]) -> dict[tuple[str, str], float]:
    if not isinstance(raw, Mapping):
        raise where.error("bandwidth", "must be a table of tables: src = { dst = MB/s }")
    known = sites | {ORIGIN}
    matrix: dict[tuple[str, str], float] = {}
    for src, row in raw.items():
        if src not in known:
            raise where.error(f"bandwidth.{src}", f"unknown site (known: {sorted(known)})")
        if not isinstance(row, Mapping):
            raise where.error(f"bandwidth.{src}", "must be a table { dst = MB/s }")
        for dst, value in row.items():
            if dst not in known:
                raise where.error(
                    f"bandwidth.{src}.{dst}", f"unknown site (known: {sorted(known)})"
                )
            if dst == src:
                raise where.error(f"bandwidth.{src}.{dst}", "a site to itself needs no bandwidth")
            matrix[(src, dst)] = _positive_float(where, f"bandwidth.{src}.{dst}", value)
    return matrix


def _positive_float(where: _Where, field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise where.error(field, f"must be a positive number, got {value!r}")
    return float(value)


def _optional_str(where: _Where, field: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise where.error(field, f"must be a non-empty string, got {value!r}")
    return value
