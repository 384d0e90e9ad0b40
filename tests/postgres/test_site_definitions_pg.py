"""Several grid files on one PostgreSQL state database (issue 21 item 4): the smallest
storage limit of the files in use holds whichever opened last, and a file describing a
site otherwise is refused naming both, with nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from gridcore.config import load_grid
from gridcore.engine.runtime import GridRuntime
from gridcore.errors import ConfigError
from gridcore.state.schema import site_definitions, sites
from gridcore.state.store import open_store

pytestmark = pytest.mark.postgres


def test_grid_files_sharing_a_postgres_database_keep_one_site(pg_url: str, tmp_path: Path) -> None:
    small, unlimited, other = (tmp_path / n for n in ("small.toml", "unlimited.toml", "other.toml"))
    local = 'version = 1\n[sites.local-a]\nkind = "local"\nprocessors = {n}\n{extra}'
    small.write_text(local.format(n=8, extra="storage_gb = 0.035\n"))
    unlimited.write_text(local.format(n=8, extra=""))
    other.write_text(local.format(n=2, extra=""))
    store = open_store(pg_url, upgrade=True)
    try:
        for path in (small, unlimited, small, unlimited):
            GridRuntime(load_grid(path), store)
            with store.begin() as conn:
                limit = conn.execute(
                    select(sites.c.storage_total).where(sites.c.name == "local-a")
                ).scalar_one()
            assert limit == 35_000_000, path.name
        with pytest.raises(ConfigError, match=f"{other.resolve()}: sites.local-a: .* but"):
            GridRuntime(load_grid(other), store)
        with store.begin() as conn:
            sources = set(conn.execute(select(site_definitions.c.source)).scalars())
        assert sources == {str(small.resolve()), str(unlimited.resolve())}
    finally:
        store.dispose()
