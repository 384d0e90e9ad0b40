"""The grid description file: a versioned TOML format users write by hand.

Format (version 1)::

    version = 1                      # required: the integer 1
    default_bandwidth_mbps = 100     # optional; MB/s for pairs missing from [bandwidth]

    [sites.alpha]                    # one table per site; the key is the site name:
                                     # 1-64 of A-Z a-z 0-9 - _ (not "origin")
    kind = "slurm"                   # "local" | "slurm"
    processors = 16                  # total processors the site offers: an integer
                                     # from 1 to 2147483647 (not 16.0, "16" or true)
    slowness = 1.0                   # runtime multiplier vs. a reference site (> 0)
    storage_dir = "/srv/alpha"       # job working directories / staged files; a path on
                                     # this machine, or sftp://user@host:port/path for
                                     # storage reached over SFTP (file staging);
                                     # normalised, and never with a '..' segment
    storage_gb = 100                 # optional storage capacity in GB
    url = "http://host:6820"         # slurm: slurmrestd base URL
    partition = "debug"              # slurm: partition (default "debug")
    user = "root"                    # slurm: X-SLURM-USER-NAME
    token = { env = "ALPHA_TOKEN" }  # slurm: credential BY REFERENCE, exactly one of
                                     #   { env = "VAR" }, { airflow_conn = "conn_id" }
                                     #   (its password), { file = "/abs/path" } (read
                                     #   again when it changes) or { command = "scontrol
                                     #   token lifespan=3600" } (run again before the JWT
                                     #   expires; no shell): see gridcore.credentials
    api_version = "auto"             # slurm: REST version; "auto" (default): the newest
                                     #   the server lists (GET /openapi/v3) and gridcore
                                     #   speaks, asked again after a 404 (an upgrade);
                                     #   or pinned: v0.0.38 (22.05) ... v0.0.45 (26.05)
    timeout_s = 10                   # slurm: HTTP timeout

    [sites.alpha.defaults]           # optional: what every job at the site asks for
    time_limit = "1h"                # unless its request says otherwise (key by key);
    account = "proj42"               # the same keys as every request (operators, the
    qos = "normal"                   # pipeline file), named as sbatch names them:
    partition = "batch"              #   time_limit: "90s" "10m" "2h" "1d", Slurm's "MM"
    memory = "4G"                    #     "MM:SS" "HH:MM:SS" "D-HH" "D-HH:MM" "D-HH:MM:SS"
    gpus = 0                         #     (a bare "90" is 90 minutes) or integer seconds
    constraint = "intel&ib"          #   account, qos, partition (over the site's own)
                                     #   memory (per node) or memory_per_cpu, not both:
                                     #     "512M" "4G" "1T" (binary units) or integer MiB
                                     #   gpus: integer >= 0; constraint: Slurm features
                                     # (or inline: defaults = { time_limit = "1h" });
                                     # unset everywhere: the cluster's own defaults

    [sites.laptop]
    kind = "local"
    processors = 4
    storage_dir = "/tmp/gridcore/laptop"   # optional; default under the state dir
    defaults = { time_limit = "30m" }      # a local site enforces time_limit, has no
                                           # GPUs, ignores memory/account/qos/partition/
                                           # constraint (gridcore/sites/local.py)

    [bandwidth]                      # directed MB/s; a missing reverse pair is symmetric
    origin = { alpha = 200.0, laptop = 1000.0 }   # "origin" = where inputs live
    alpha = { laptop = 50.0 }

Resources are parsed once, by :func:`gridcore.validation.check_resources`: an unknown
key in a ``defaults`` table is refused naming it
(``grid.toml: sites.alpha.defaults.time: unknown key (known: time_limit, ...)``), a bad
value naming its field (``grid.toml: sites.alpha.defaults.time_limit: '10x' is not a
duration (use 90s, 10m, 2h, 1d or D-HH:MM:SS)``). A job's own resources go over its
site's defaults where it is submitted (:func:`gridcore.engine.submission.resources_at`).

Numbers are finite (no inf or nan) and, unless said otherwise, > 0. The file must be a
regular file of UTF-8 text. Every problem raises :class:`ConfigError` in one line naming
the file and the field
(``grid.toml: sites.alpha.processors: must be a positive integer (at most 2147483647),
got 1e+99``): see :mod:`gridcore.validation` for the types and limits.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gridcore.errors import ConfigError
from gridcore.model import ORIGIN, GridSpec, SiteKind, SiteSpec
from gridcore.validation import FORMAT_VERSION, grid_from_raw

__all__ = ["FORMAT_VERSION", "GRID_ENV", "default_grid", "load_grid", "parse_grid"]

GRID_ENV = "GRIDCORE_GRID"
# A grid description is a few KB per hundred sites; anything this big is not one.
MAX_GRID_BYTES = 4 * 1024 * 1024


def load_grid(path: str | os.PathLike[str]) -> GridSpec:
    """Read and validate a grid description file: a regular file of UTF-8 TOML text."""
    file = Path(path)
    try:
        raw = tomllib.loads(read_text_file(file))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
    return parse_grid(raw, source=str(file))


def parse_grid(raw: Mapping[str, Any], source: str = "<memory>") -> GridSpec:
    """Validate an already-parsed grid description (a dict shaped like the TOML)."""
    return grid_from_raw(raw, source)


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


def read_text_file(
    file: Path, kind: str = "grid description", limit: int = MAX_GRID_BYTES, hint: str = ""
) -> str:
    """The text of ``file``, a TOML ``kind`` of at most ``limit`` bytes; ConfigError
    unless it is a regular file of UTF-8 text (a directory, a device or a FIFO is
    refused before it is opened). ``hint`` follows the size error."""
    try:
        info = file.stat()
    except FileNotFoundError:
        raise ConfigError(f"{kind} {file} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot be read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        noun = kind if kind.endswith(" file") else f"{kind} file"
        raise ConfigError(f"{file}: is a directory, not a {noun}")
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{file}: not a regular file")
    if info.st_size > limit:
        raise ConfigError(
            f"{file}: {info.st_size} bytes, more than a {kind}'s limit of {limit}{hint}"
        )
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{file}: cannot be read: {exc.strerror or exc}") from None
    if b"\x00" in data:
        raise ConfigError(f"{file}: a binary file (NUL bytes), not a TOML {kind}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{file}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
