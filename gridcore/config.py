"""The grid description file: a versioned TOML format users write by hand.

How it works, in full: ``docs/grid-file.md``
(section ``gridcore/config.py``).
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

__all__ = [
    "FORMAT_VERSION",
    "GRID_ENV",
    "default_grid",
    "load_grid",
    "parse_grid",
    "parse_toml",
    "read_text_file",
]

GRID_ENV = "GRIDCORE_GRID"
# A grid description is a few KB per hundred sites; anything this big is not one.
MAX_GRID_BYTES = 4 * 1024 * 1024


def load_grid(path: str | os.PathLike[str]) -> GridSpec:
    """Read and validate a grid description file: a regular file of UTF-8 TOML text."""
    file = Path(path)
    return parse_grid(parse_toml(file, read_text_file(file)), source=str(file))


def parse_toml(file: Path, text: str) -> dict[str, Any]:
    """``text`` (read from ``file``) as TOML; one ConfigError naming the file for text
    that is not TOML or is nested too deeply to parse (a 100,000-deep array recursed
    past Python's limit, issue 21 item 12)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{file}: not valid TOML: nested too deeply") from exc


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
