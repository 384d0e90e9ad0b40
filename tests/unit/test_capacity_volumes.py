"""Staged replicas are volume holds of the one capacity ledger (issue 7 item 1): staging
claims the replica's bytes at the destination before copying, refuses when they do not
fit the site's storage, gives them back when the copy fails, and keeps them while the
replica is registered. Every test ends with the capacity invariant."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from gridcore.config import parse_grid
from gridcore.errors import StagingError
from gridcore.model import MB, ORIGIN, GridSpec
from gridcore.staging import ReplicaCatalog, register_source, stage
from gridcore.state import capacity
from gridcore.state.capacity import HolderKind, Ledger
from gridcore.state.store import Store, open_store

SIZE = 2 * MB


def grid(base: Path, beta_bytes: int | None) -> GridSpec:
    raw = {
        "version": 1,
        "sites": {
            "alpha": {"kind": "local", "processors": 2, "storage_dir": str(base / "alpha")},
            "beta": {"kind": "local", "processors": 2, "storage_dir": str(base / "beta")},
        },
        "bandwidth": {"origin": {"alpha": 400.0, "beta": 50.0}},
    }
    parsed = parse_grid(raw, source="test-grid")
    sites = tuple(
        dataclasses.replace(s, storage_bytes=beta_bytes) if s.name == "beta" else s
        for s in parsed.sites
    )
    return dataclasses.replace(parsed, sites=sites)


def setup(tmp_path: Path) -> tuple[Store, ReplicaCatalog, Path]:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}", upgrade=True)
    source = tmp_path / "origin" / "input.dat"
    source.parent.mkdir(parents=True)
    source.write_bytes(random.Random(1).randbytes(SIZE))
    catalog = ReplicaCatalog(store)
    register_source(catalog, "input.dat", ORIGIN, str(source))
    return store, catalog, source


def volumes(store: Store) -> dict[str, int]:
    with store.begin() as conn:
        assert capacity.check_invariant(conn) == []
        return {h.holder: h.storage_bytes for h in capacity.live_holds(conn, HolderKind.VOLUME)}


def test_a_staged_replica_holds_its_bytes_while_registered(tmp_path: Path) -> None:
    store, catalog, _ = setup(tmp_path)
    stage(catalog, grid(tmp_path, 5 * MB), "input.dat", "beta")
    assert volumes(store) == {"input.dat@beta": SIZE}
    with store.begin() as conn:
        assert capacity.usage(conn)["beta"].storage_claimed == SIZE
    # staged again: already there, nothing claimed twice
    stage(catalog, grid(tmp_path, 5 * MB), "input.dat", "beta")
    assert volumes(store) == {"input.dat@beta": SIZE}
    assert catalog.remove("input.dat", "beta")
    assert volumes(store) == {}
    with store.begin() as conn:
        assert capacity.usage(conn)["beta"].storage_claimed == 0
    store.dispose()


def test_a_replica_that_does_not_fit_is_refused_before_any_byte_moves(tmp_path: Path) -> None:
    store, catalog, _ = setup(tmp_path)
    with store.begin() as conn:  # another volume already takes most of beta's storage
        capacity.register_sites(conn, grid(tmp_path, 3 * MB))
        got = capacity.claim(conn, HolderKind.VOLUME, "other@beta", "beta", 0, 2 * MB)
        assert got is Ledger.CLAIMED
    with pytest.raises(StagingError, match=r"to site beta: 2000000 bytes do not fit its storage"):
        stage(catalog, grid(tmp_path, 3 * MB), "input.dat", "beta")
    assert catalog.replica("input.dat", "beta") is None
    assert not (tmp_path / "beta").exists() or not any((tmp_path / "beta").rglob("*input*"))
    assert volumes(store) == {"other@beta": 2 * MB}
    # unlimited storage elsewhere: alpha takes it
    stage(catalog, grid(tmp_path, 3 * MB), "input.dat", "alpha")
    assert volumes(store) == {"other@beta": 2 * MB, "input.dat@alpha": SIZE}
    store.dispose()


def test_a_failed_transfer_gives_its_bytes_back(tmp_path: Path) -> None:
    store, catalog, source = setup(tmp_path)
    source.write_bytes(random.Random(2).randbytes(SIZE))  # same size, other bytes
    with pytest.raises(StagingError, match=r"checksum|sha256"):
        stage(catalog, grid(tmp_path, 5 * MB), "input.dat", "beta")
    assert catalog.replica("input.dat", "beta") is None
    assert volumes(store) == {}
    store.dispose()


def test_a_volume_claim_needs_no_processors_while_the_site_is_over_claimed(
    tmp_path: Path,
) -> None:
    """Found by the deployment tier: a burst's selections claimed every processor of a
    site and queued one more (free processors < 0), and a data plan's volume claim of a
    few bytes, which needs no processor, was refused for as long as that lasted."""
    from gridcore.config import default_grid
    from gridcore.engine.runtime import GridRuntime
    from gridcore.model import JobRequest

    rt = GridRuntime(default_grid(tmp_path), open_store(f"sqlite:///{tmp_path}/s.db", upgrade=True))
    total = rt.grid.site("local-a").processors
    rt.select(JobRequest("all", total, 60.0), site="local-a")
    more = rt.select(JobRequest("one-more", 1, 60.0), site="local-a")
    with rt.store.begin() as conn:
        assert capacity.hold(conn, HolderKind.SELECTION, str(more.selection_id)).ledger is (
            Ledger.QUEUED
        )
        assert capacity.claim(conn, HolderKind.VOLUME, "v@local-a", "local-a", 0, 1000) is (
            Ledger.CLAIMED
        )
        assert capacity.claim(conn, HolderKind.VOLUME, "p@local-a", "local-a", 1, 0) is None
        assert capacity.check_invariant(conn) == []
    rt.store.dispose()
