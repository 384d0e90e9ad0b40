"""Several grid files, one state database (issue 21 item 4): a site name is one site
(one ledger row), so files that describe it differently are refused naming both, files
that give it different storage limits leave the smallest in force whichever opened last,
and a site no file in use defines is retired on the Grid page."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from gridcore import cli
from gridcore.api.dashboard import read_grid
from gridcore.config import load_grid
from gridcore.engine.runtime import GridRuntime
from gridcore.errors import ConfigError
from gridcore.model import GridSpec, HolderKind
from gridcore.state import capacity, site_definitions
from gridcore.state.schema import site_definitions as definitions_table
from gridcore.state.schema import sites
from gridcore.state.store import Store, open_store

T0 = 1_700_000_000.0
DAY = site_definitions.IN_USE_S


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path}/state.db", upgrade=True)
    yield opened
    opened.dispose()


def grid_file(path: Path, **sites_: str) -> Path:
    """A grid file of local sites: name -> the rest of its table (TOML lines)."""
    tables = "".join(f'[sites.{name}]\nkind = "local"\n{body}\n' for name, body in sites_.items())
    path.write_text(f"version = 1\n{tables}")
    return path


def open_at(store: Store, grid: GridSpec | Path, now: float) -> GridRuntime:
    spec = load_grid(grid) if isinstance(grid, Path) else grid
    return GridRuntime(spec, store, clock=lambda: now)


def storage_total(store: Store, site: str) -> int | None:
    with store.begin() as conn:
        limit: int | None = conn.execute(
            select(sites.c.storage_total).where(sites.c.name == site)
        ).scalar_one()
    return limit


def test_storage_limits_of_two_files_in_use_keep_the_smallest_whichever_opened_last(
    store: Store, tmp_path: Path
) -> None:
    small = grid_file(
        tmp_path / "pipelines.toml", **{"local-a": "processors = 8\nstorage_gb = 0.035"}
    )
    unlimited = grid_file(tmp_path / "demo.toml", **{"local-a": "processors = 8"})
    for i, path in enumerate([small, unlimited, small, unlimited]):
        open_at(store, path, T0 + i)
        assert storage_total(store, "local-a") == 35_000_000, path.name
    with store.begin() as conn:
        # one ledger: a claim the smaller file's limit refuses is refused, for every file
        assert (
            capacity.claim(conn, HolderKind.VOLUME, "v@local-a", "local-a", 0, 36_000_000) is None
        )

    site = next(s for s in read_grid(store, T0 + 4)["sites"] if s["name"] == "local-a")
    assert site["storage_limit"] == 35_000_000
    shown = {d["source"]: d["storage_limit"] for d in site["definitions"]}
    assert shown == {str(small.resolve()): 35_000_000, str(unlimited.resolve()): None}
    assert all(d["in_use"] for d in site["definitions"]) and site["retired"] is False

    # a day after the small file's last use, its limit is no longer in force
    open_at(store, unlimited, T0 + 3 + DAY + 1)
    assert storage_total(store, "local-a") is None


def test_a_file_describing_a_site_otherwise_is_refused_naming_both_while_the_other_is_in_use(
    store: Store, tmp_path: Path
) -> None:
    first = grid_file(tmp_path / "a.toml", **{"local-a": "processors = 8"})
    second = grid_file(
        tmp_path / "b.toml", **{"local-a": "processors = 4", "local-z": "processors = 2"}
    )
    open_at(store, first, T0)
    with pytest.raises(ConfigError) as refused:
        open_at(store, second, T0 + 180)
    message = str(refused.value)
    assert message.startswith(f"{second.resolve()}: sites.local-a: defined as local, 4 processors")
    assert f"but {first.resolve()} (in use: it opened this state database 3 min ago)" in message
    assert "defines local-a as local, 8 processors" in message
    with store.begin() as conn:  # nothing of the refused file is written
        assert conn.execute(select(sites.c.name)).scalars().all() == ["local-a"]
        sources = set(conn.execute(select(definitions_table.c.source)).scalars())
    assert sources == {str(first.resolve())}

    # the first file no longer in use: the second one's definition is taken
    open_at(store, second, T0 + DAY + 1)
    with store.begin() as conn:
        shown = site_definitions.definitions(conn)["local-a"]
    latest = shown[0]  # latest used first
    assert (latest.source, latest.processors) == (str(second.resolve()), 4)


def test_the_same_file_edited_replaces_its_own_definition(store: Store, tmp_path: Path) -> None:
    path = grid_file(tmp_path / "grid.toml", **{"local-a": "processors = 8\nstorage_gb = 1"})
    open_at(store, path, T0)
    grid_file(path, **{"local-a": "processors = 4\nstorage_gb = 2"})
    open_at(store, path, T0 + 60)
    with store.begin() as conn:
        [only] = site_definitions.definitions(conn)["local-a"]
    assert (only.processors, only.storage_total, only.used_at) == (4, 2 * 10**9, T0 + 60)
    assert storage_total(store, "local-a") == 2 * 10**9


def test_gridcore_sites_refuses_a_conflicting_file_with_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path}/state.db"
    first = grid_file(tmp_path / "a.toml", **{"local-a": "processors = 8"})
    second = grid_file(tmp_path / "b.toml", **{"local-a": "processors = 2"})
    assert cli.main(["sites", "--no-refresh", "--grid", str(first), "--db", db]) == 0
    capsys.readouterr()
    assert cli.main(["sites", "--no-refresh", "--grid", str(second), "--db", db]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(second.resolve()) in err and str(first.resolve()) in err


def test_a_site_no_file_in_use_defines_and_nothing_holds_is_retired(
    store: Store, tmp_path: Path
) -> None:
    old = grid_file(tmp_path / "old.toml", **{"old-a": "processors = 2", "old-b": "processors = 2"})
    new = grid_file(tmp_path / "new.toml", **{"new-a": "processors = 2"})
    open_at(store, old, T0)
    with store.begin() as conn:  # something of ours still holds old-b
        capacity.claim(conn, HolderKind.VOLUME, "v@old-b", "old-b", 0, 10)
    open_at(store, new, T0 + DAY + 1)

    shown = {s["name"]: s for s in read_grid(store, T0 + DAY + 2)["sites"]}
    assert shown["old-a"]["retired"] is True
    assert shown["old-a"]["definitions"][0]["in_use"] is False
    assert shown["old-b"]["retired"] is False, "a site something holds is not retired"
    assert shown["new-a"]["retired"] is False
    # the old file, used again, brings its sites back
    open_at(store, old, T0 + DAY + 3)
    assert not any(s["retired"] for s in read_grid(store, T0 + DAY + 4)["sites"])
