"""The replica catalog on PostgreSQL: the migrated schema matches the metadata, staging
works against it, and processes registering the same replica and recording rates at
once leave one row and lose no rate sample."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, select

from gridcore.config import parse_grid
from gridcore.model import MB, ORIGIN, Replica
from gridcore.staging import ReplicaCatalog, register_source, stage_measured
from gridcore.state.schema import metadata, replicas, transfer_rates
from gridcore.state.store import HEAD_REVISION, Store, open_store

pytestmark = pytest.mark.postgres

PROCESSES = 4
ROUNDS = 25
CHECKSUM = "sha256:" + "c" * 64


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    opened = open_store(pg_url, upgrade=True)
    try:
        yield opened
    finally:
        opened.dispose()


def test_migrated_postgres_schema_matches_the_metadata(store: Store) -> None:
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn)
        assert context.get_current_revision() == HEAD_REVISION == "0015"
        assert compare_metadata(context, metadata) == []


def test_staging_with_the_catalog_on_postgres(tmp_path: Path, store: Store) -> None:
    catalog = ReplicaCatalog(store)
    grid = parse_grid(
        {
            "version": 1,
            "sites": {"alpha": {"kind": "local", "processors": 1, "storage_dir": str(tmp_path)}},
        }
    )
    src = tmp_path / "mesh.dat"
    src.write_bytes(b"\x07" * (2 * MB))
    origin = register_source(catalog, "mesh.dat", ORIGIN, str(src))

    staged = stage_measured(catalog, grid, "mesh.dat", "alpha")

    assert staged.replica.checksum == origin.checksum
    assert Path(staged.replica.url).read_bytes() == src.read_bytes()
    assert staged.mbps is not None
    assert catalog.measured_rate(ORIGIN, "alpha") == pytest.approx(staged.mbps)
    assert [r.site for r in catalog.require("mesh.dat")] == ["alpha", ORIGIN]


def _register_repeatedly(url: str, index: int, barrier: Any) -> None:
    store = open_store(url)
    catalog = ReplicaCatalog(store)
    barrier.wait()
    for i in range(ROUNDS):
        replica = Replica("shared.dat", "alpha", f"/p{index}/shared.dat", 1000, CHECKSUM)
        catalog.register(replica, rate=("beta", 100.0 + index))
        catalog.record_rate("gamma", "alpha", 50.0 + i)
    store.dispose()


def test_concurrent_registrations_of_one_replica_leave_one_row(pg_url: str, store: Store) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    procs = [
        ctx.Process(target=_register_repeatedly, args=(pg_url, i, barrier))
        for i in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    exitcodes = [proc.exitcode for proc in procs]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
        proc.close()

    assert exitcodes == [0] * PROCESSES
    with store.begin() as conn:
        rows = conn.execute(select(replicas)).all()
        samples = dict(
            conn.execute(
                select(transfer_rates.c.src, transfer_rates.c.samples).order_by(
                    transfer_rates.c.src
                )
            ).all()
        )
        count = conn.execute(select(func.count()).select_from(transfer_rates)).scalar_one()
    assert len(rows) == 1
    (row,) = rows
    assert (row.logical_name, row.site, row.checksum) == ("shared.dat", "alpha", CHECKSUM)
    assert row.url in {f"/p{i}/shared.dat" for i in range(PROCESSES)}
    # every rate update applied exactly once (read-modify-write would lose some)
    assert samples == {"beta": PROCESSES * ROUNDS, "gamma": PROCESSES * ROUNDS}
    assert count == 2
    rates = ReplicaCatalog(store).measured_rates()
    assert 100.0 <= rates[("beta", "alpha")] <= 100.0 + PROCESSES - 1
    assert 50.0 < rates[("gamma", "alpha")] < 50.0 + ROUNDS
