"""Fixtures shared by the unit tests of the Airflow layer."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def db_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """gridcore on the embedded local sites, with all state under ``tmp_path``."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    monkeypatch.setenv("GRIDCORE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GRIDCORE_DB_URL", url)
    monkeypatch.delenv("GRIDCORE_GRID", raising=False)
    return url
