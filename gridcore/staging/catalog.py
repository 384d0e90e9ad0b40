"""The replica catalog: logical file name -> its complete copies (site, URL, size,
checksum), and the measured transfer rates between sites.

KOALA's replica manager (KOALA 2005 Sec. 2.3) maps the logical file names jobs name onto
their physical locations; a placement picks, per execution site, the file site with the
smallest estimated transfer time (Close-to-Files). The estimate starts from the grid's
bandwidth matrix and is refined by the rates staging actually measured (an exponentially
weighted mean per directed site pair).

A row in ``gc_replicas`` exists only for a complete, checksum-verified copy: staging
(:mod:`gridcore.staging.transfer`) publishes the file under its final name first and
calls :meth:`ReplicaCatalog.register` afterwards.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from sqlalchemy import Connection, delete, select
from sqlalchemy.dialects import postgresql, sqlite

from gridcore import validation
from gridcore.errors import RequestError, StagingError, StateError
from gridcore.model import GridSpec, Replica
from gridcore.policies.transfer import transfer_seconds
from gridcore.state import capacity
from gridcore.state.schema import replicas, transfer_rates
from gridcore.state.store import Store

# Weight of the newest measurement in a pair's mean rate (as for queue waits in
# gridcore.engine.selection): recent enough to follow a changed link, smooth enough to
# ignore one slow transfer.
RATE_EWMA_WEIGHT = 0.3
CHECKSUM = re.compile(r"^sha256:[0-9a-f]{64}$")


class ReplicaCatalog:
    """Replicas and measured rates in the state database; every method is one
    transaction, safe under concurrent workers on SQLite and PostgreSQL."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        dialect = store.engine.dialect.name
        if dialect not in ("sqlite", "postgresql"):
            raise StateError(f"the replica catalog needs SQLite or PostgreSQL, not {dialect}")
        self.store = store
        self.clock = clock
        self._insert: Any = sqlite.insert if store.is_sqlite else postgresql.insert

    # -- replicas --------------------------------------------------------------------

    def register(self, replica: Replica, *, rate: tuple[str, float] | None = None) -> None:
        """Record ``replica`` (replacing an earlier one of the same file at the same site).
        Call only once the copy is complete and verified. ``rate`` = (source site, MB/s)
        records the transfer that made it in the same transaction."""
        _check_replica(replica)
        stmt = self._insert(replicas).values(
            logical_name=replica.logical_name,
            site=replica.site,
            url=replica.url,
            size_bytes=replica.size_bytes,
            checksum=replica.checksum,
            registered_at=self.clock(),
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[replicas.c.logical_name, replicas.c.site],
            set_={
                "url": stmt.excluded.url,
                "size_bytes": stmt.excluded.size_bytes,
                "checksum": stmt.excluded.checksum,
                "registered_at": stmt.excluded.registered_at,
            },
        )
        with self.store.begin() as conn:
            conn.execute(stmt)
            if rate is not None:
                self._record_rate(conn, rate[0], replica.site, rate[1])

    def replicas(self, logical_name: str) -> tuple[Replica, ...]:
        """Every registered replica of ``logical_name``, by site name; () if none."""
        with self.store.begin() as conn:
            rows = conn.execute(
                select(replicas)
                .where(replicas.c.logical_name == logical_name)
                .order_by(replicas.c.site)
            ).all()
        return tuple(_replica(row) for row in rows)

    def replica(self, logical_name: str, site: str) -> Replica | None:
        return next((r for r in self.replicas(logical_name) if r.site == site), None)

    def require(self, logical_name: str) -> tuple[Replica, ...]:
        """The replicas of ``logical_name``; RequestError if it is malformed or has none,
        so a job naming it is refused before anything is submitted."""
        check_logical_name(logical_name)
        found = self.replicas(logical_name)
        if not found:
            raise RequestError(
                f"no replica of {logical_name!r} is registered: register its source first"
                " (gridcore.staging.register_source)"
            )
        return found

    def remove(self, logical_name: str, site: str) -> bool:
        """Forget the replica (the file itself is left alone) and give its bytes back to
        the capacity ledger; False if there was none."""
        with self.store.begin() as conn:
            result = conn.execute(
                delete(replicas).where(
                    (replicas.c.logical_name == logical_name) & (replicas.c.site == site)
                )
            )
            holder = capacity.volume_holder(logical_name, site)
            capacity.release(conn, capacity.HolderKind.VOLUME, holder)
        return bool(result.rowcount)

    # -- transfer rates and estimates ----------------------------------------------------

    def record_rate(self, src: str, dst: str, mbps: float) -> float:
        """Fold a measured transfer rate into the pair's mean; returns the new mean."""
        with self.store.begin() as conn:
            return self._record_rate(conn, src, dst, mbps)

    def measured_rates(self) -> Mapping[tuple[str, str], float]:
        """Every measured mean rate (MB/s) by (src, dst): a snapshot for policies."""
        with self.store.begin() as conn:
            rows = conn.execute(
                select(transfer_rates.c.src, transfer_rates.c.dst, transfer_rates.c.mean_mbps)
            ).all()
        return MappingProxyType({(r.src, r.dst): float(r.mean_mbps) for r in rows})

    def measured_rate(self, src: str, dst: str) -> float | None:
        with self.store.begin() as conn:
            found = conn.execute(
                select(transfer_rates.c.mean_mbps).where(
                    (transfer_rates.c.src == src) & (transfer_rates.c.dst == dst)
                )
            ).scalar_one_or_none()
        return None if found is None else float(found)

    def estimate_seconds(self, grid: GridSpec, src: str, dst: str, size_bytes: int) -> float:
        """Seconds to move ``size_bytes`` from ``src`` to ``dst``: at the measured mean
        rate once the pair has been sampled, else at the grid's bandwidth."""
        return transfer_seconds(size_bytes, self.rate_mbps(grid, src, dst))

    def rate_mbps(self, grid: GridSpec, src: str, dst: str) -> float:
        if src == dst:
            return math.inf
        measured = self.measured_rate(src, dst)
        return measured if measured is not None else grid.bandwidth(src, dst)

    def rank_sources(
        self, grid: GridSpec, candidates: Iterable[Replica], dst: str
    ) -> list[tuple[float, Replica]]:
        """(estimated seconds, replica) for each candidate source, fastest first (ties
        by site name, so the choice is deterministic)."""
        measured = self.measured_rates()
        ranked = []
        for replica in candidates:
            rate = (
                math.inf
                if replica.site == dst
                else measured.get((replica.site, dst), grid.bandwidth(replica.site, dst))
            )
            ranked.append((transfer_seconds(replica.size_bytes, rate), replica))
        return sorted(ranked, key=lambda pair: (pair[0], pair[1].site))

    def _record_rate(self, conn: Connection, src: str, dst: str, mbps: float) -> float:
        if isinstance(mbps, bool) or not isinstance(mbps, int | float) or not 0 < mbps < math.inf:
            raise StagingError(
                f"transfer rate {src} -> {dst}: must be a positive number, got {mbps!r}"
            )
        stmt = self._insert(transfer_rates).values(
            src=src, dst=dst, mean_mbps=float(mbps), samples=1, updated_at=self.clock()
        )
        table = transfer_rates.c
        stmt = stmt.on_conflict_do_update(
            index_elements=[table.src, table.dst],
            set_={
                "mean_mbps": (1 - RATE_EWMA_WEIGHT) * table.mean_mbps
                + RATE_EWMA_WEIGHT * stmt.excluded.mean_mbps,
                "samples": table.samples + 1,
                "updated_at": stmt.excluded.updated_at,
            },
        )
        conn.execute(stmt)
        mean = conn.execute(
            select(table.mean_mbps).where((table.src == src) & (table.dst == dst))
        ).scalar_one()
        return float(mean)


def check_logical_name(name: object) -> str:
    """A logical name is a relative POSIX path (it becomes one under a site's storage):
    no empty, ``.``/``..`` or hidden segments (hidden names are where transfers write
    their partial files), no backslash or NUL, at most 512 characters. The rule is the
    request model's (:func:`gridcore.validation.check_logical_name`)."""
    return validation.check_logical_name(name)


def _check_replica(replica: Replica) -> None:
    check_logical_name(replica.logical_name)
    if not replica.site or not replica.url:
        raise StagingError(f"replica of {replica.logical_name!r}: site and url are required")
    if replica.size_bytes < 0:
        raise StagingError(f"replica of {replica.logical_name!r}: negative size")
    if not CHECKSUM.match(replica.checksum):
        raise StagingError(
            f"replica of {replica.logical_name!r}: checksum must be 'sha256:<64 hex digits>',"
            f" got {replica.checksum!r}"
        )


def _replica(row: Any) -> Replica:
    return Replica(row.logical_name, row.site, row.url, int(row.size_bytes), row.checksum)
