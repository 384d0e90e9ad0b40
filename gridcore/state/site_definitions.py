"""Several grid files, one state database: which files define each site, and the rule
that keeps them from rewriting each other's site (docs/grid-file.md).

A site NAME is one site per state database: one row of ``gc_sites``, one capacity
ledger, one health. Every grid file that opens the database keeps its definition of each
of its sites in ``gc_site_definitions`` (what it says the site is, and when it last
opened the database: ``used_at``), so that

* files that describe one site differently (kind, processors, Slurm URL or partition)
  are never both in use: while one is in use (it opened the database within
  :data:`IN_USE_S`), a second is refused with an error naming both. The same file,
  edited, replaces its own definition;
* files may give gridcore different amounts of a site's storage: the ledger enforces
  the smallest limit of the files in use, so no file's limit is exceeded and none flips
  the limit back to its own (one ledger per site, whatever the files say);
* a site that no file in use defines, and that no live hold keeps, is *retired*: the
  Grid page greys it out (its row and history stay; a file that defines it again brings
  it back).

Two files that define a site differently and open a fresh database at the same instant
(on PostgreSQL) may both get in; the next time either opens it, it is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, and_, func, select

from gridcore.errors import ConfigError
from gridcore.model import GridSpec, SiteSpec
from gridcore.state.schema import site_definitions

IN_USE_S = 24 * 3600.0
"""A definition is in use while its file opened the database within this time. Every
runtime opens it (each task an operator runs, each trigger, each ``gridcore`` command),
so a day without one means nothing runs that file; a day also lets a file used once a
day (a nightly pipeline) keep its sites and its storage limit."""


@dataclass(frozen=True)
class Definition:
    """What one grid file says one site is (a row of ``gc_site_definitions``)."""

    site: str
    source: str
    kind: str
    processors: int
    url: str | None
    partition: str | None
    storage_total: int | None
    used_at: float

    @property
    def identity(self) -> tuple[str, int, str | None, str | None]:
        """What files in use must agree on: which site it is and how big."""
        return (self.kind, self.processors, self.url, self.partition)

    def describe(self) -> str:
        where = f" at {self.url} partition {self.partition}" if self.url else ""
        return f"{self.kind}, {self.processors} processors{where}"

    def in_use(self, now: float) -> bool:
        return self.used_at >= now - IN_USE_S


def record(conn: Connection, grid: GridSpec, now: float) -> None:
    """Record that ``grid`` opens the database now, in the caller's transaction.
    ConfigError (nothing written) when another file in use defines one of its sites
    differently."""
    source = grid_source(grid)
    known = definitions(conn, grid.site_names)
    mine = {spec.name: _definition(spec, source, now) for spec in grid.sites}
    for name, definition in mine.items():
        for other in known.get(name, ()):
            if other.source != source and other.in_use(now):
                _refuse_if_different(definition, other, now)
    for name, definition in mine.items():
        values = {
            "kind": definition.kind,
            "processors": definition.processors,
            "url": definition.url,
            "partition": definition.partition,
            "storage_total": definition.storage_total,
            "used_at": now,
        }
        # One statement: workers starting together on a fresh database each insert it
        # (an UPDATE-then-INSERT let two of them insert the same key).
        conn.execute(_upsert(conn).values(site=name, source=source, **values))


def _upsert(conn: Connection) -> Any:
    """INSERT of a definition that updates the (site, source) row already there."""
    keys = [site_definitions.c.site, site_definitions.c.source]
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        pg = pg_insert(site_definitions)
        return pg.on_conflict_do_update(index_elements=keys, set_=_excluded(pg.excluded))
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    lite = sqlite_insert(site_definitions)
    return lite.on_conflict_do_update(index_elements=keys, set_=_excluded(lite.excluded))


def _excluded(excluded: Any) -> dict[str, Any]:
    return {
        column: getattr(excluded, column)
        for column in ("kind", "processors", "url", "partition", "storage_total", "used_at")
    }


def grid_source(grid: GridSpec) -> str:
    """Which file ``grid`` is: its absolute path (a file opened as ``grid.toml`` here and
    as ``/srv/grid.toml`` there is one file), or its name when it has no file
    (``<embedded default>``)."""
    if grid.source.startswith("<"):
        return grid.source
    return str(Path(grid.source).resolve())


def storage_limits(conn: Connection, names: Sequence[str], now: float) -> dict[str, int | None]:
    """The storage limit in force per site of ``names``: the smallest of the files in
    use (None = unlimited: no file in use limits it)."""
    sd = site_definitions.c
    rows = conn.execute(
        select(sd.site, func.min(sd.storage_total))
        .where(and_(sd.site.in_(names), sd.used_at >= now - IN_USE_S))
        .group_by(sd.site)
    ).all()
    found: dict[str, int | None] = {name: None for name in names}
    found.update({site: limit for site, limit in rows})
    return found


def definitions(
    conn: Connection, names: Sequence[str] | None = None
) -> dict[str, list[Definition]]:
    """Every file's definition of each site (of ``names``, or all), latest used first."""
    query = select(site_definitions).order_by(
        site_definitions.c.site, site_definitions.c.used_at.desc(), site_definitions.c.source
    )
    if names is not None:
        query = query.where(site_definitions.c.site.in_(names))
    found: dict[str, list[Definition]] = {}
    for row in conn.execute(query).mappings():
        found.setdefault(row["site"], []).append(Definition(**row))
    return found


def _definition(spec: SiteSpec, source: str, now: float) -> Definition:
    return Definition(
        spec.name,
        source,
        spec.kind.value,
        spec.processors,
        spec.url,
        spec.partition,
        spec.storage_bytes,
        now,
    )


def _refuse_if_different(mine: Definition, other: Definition, now: float) -> None:
    if mine.identity == other.identity:
        return
    raise ConfigError(
        f"{mine.source}: sites.{mine.site}: defined as {mine.describe()}, but"
        f" {other.source} (in use: it opened this state database"
        f" {_ago(now - other.used_at)} ago) defines {mine.site} as {other.describe()}."
        " A site name is one site per state database (one capacity ledger): make the two"
        " definitions agree, give one of the sites another name, or use another state"
        f" database; {other.source}'s definition ends"
        f" {_ago(IN_USE_S)} after its last use"
    )


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


__all__: Sequence[str] = (
    "IN_USE_S",
    "Definition",
    "definitions",
    "grid_source",
    "record",
    "storage_limits",
)
