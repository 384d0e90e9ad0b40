"""Fixtures shared by the unit tests of the Airflow layer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _no_cached_credentials() -> Iterator[None]:
    """Each test resolves its tokens anew: a token source (process-wide, one per site and
    reference) or a Slurm adapter's shared listing cached by an earlier test with another
    environment must not answer for this one."""
    from gridcore.credentials import forget_token_sources
    from gridcore.sites.slurm import forget_shared

    forget_token_sources()
    forget_shared()
    yield
    forget_token_sources()
    forget_shared()


@pytest.fixture
def db_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """gridcore on the embedded local sites, with all state under ``tmp_path``."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    monkeypatch.setenv("GRIDCORE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GRIDCORE_DB_URL", url)
    monkeypatch.delenv("GRIDCORE_GRID", raising=False)
    return url


SITE_DEFAULTS = {
    "local-a": {"account": "proj42", "memory": "1G", "time_limit": "1h"},
    "local-b": {"qos": "short"},
    "local-c": {},
}
"""What :func:`grid_with_defaults`'s sites ask for unless a request says otherwise."""


@pytest.fixture
def grid_with_defaults(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The embedded default's three local sites as a grid file (``$GRIDCORE_GRID``) whose
    sites have :data:`SITE_DEFAULTS` in ``[sites.NAME.defaults]``."""
    lines = ["version = 1"]
    for name, processors, slowness in (("local-a", 8, 1.0), ("local-b", 4, 1.2),
                                       ("local-c", 4, 1.5)):  # fmt: skip
        lines += [
            "",
            f"[sites.{name}]",
            'kind = "local"',
            f"processors = {processors}",
            f"slowness = {slowness}",
            f'storage_dir = "{tmp_path / "sites" / name}"',
            f"[sites.{name}.defaults]",
            *(f'{key} = "{value}"' for key, value in SITE_DEFAULTS[name].items()),
        ]
    lines += ["", "[bandwidth]", "origin = { local-a = 400.0, local-b = 200.0, local-c = 100.0 }"]
    path = tmp_path / "grid.toml"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("GRIDCORE_GRID", str(path))
    return path
