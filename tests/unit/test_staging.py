"""Replica catalog and staging on local sites (SQLite state): checksummed, atomic
publish, registration only when complete, measured rates, and a transfer SIGKILLed
midway leaving no replica and no visible partial file."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from gridcore.config import parse_grid
from gridcore.errors import ConfigError, RequestError, StagingError
from gridcore.model import MB, ORIGIN, GridSpec, Replica
from gridcore.staging import (
    ReplicaCatalog,
    check_logical_name,
    register_source,
    stage,
    stage_measured,
    sweep_partials,
)
from gridcore.state.schema import metadata
from gridcore.state.store import HEAD_REVISION, Store, open_store

SIZE = 3 * MB


def grid_raw(base: Path) -> dict[str, Any]:
    return {
        "version": 1,
        "sites": {
            "alpha": {"kind": "local", "processors": 2, "storage_dir": str(base / "alpha")},
            "beta": {"kind": "local", "processors": 2, "storage_dir": str(base / "beta")},
        },
        "bandwidth": {"origin": {"alpha": 400.0, "beta": 50.0}, "alpha": {"beta": 200.0}},
    }


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'state.db'}", upgrade=True)
    try:
        yield opened
    finally:
        opened.dispose()


@pytest.fixture
def catalog(store: Store) -> ReplicaCatalog:
    return ReplicaCatalog(store)


@pytest.fixture
def grid(tmp_path: Path) -> GridSpec:
    return parse_grid(grid_raw(tmp_path), source="test-grid")


def make_file(path: Path, size: int, seed: int = 1) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(random.Random(seed).randbytes(size))
    return path


def sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def listing(directory: Path) -> list[str]:
    """Every file under ``directory``, hidden ones included, relative."""
    if not directory.exists():
        return []
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


# -- schema ------------------------------------------------------------------------------


def test_migrated_sqlite_schema_matches_the_metadata(store: Store) -> None:
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn)
        assert context.get_current_revision() == HEAD_REVISION == "0015"
        assert compare_metadata(context, metadata) == []


# -- catalog -----------------------------------------------------------------------------


def test_register_is_an_upsert_and_remove_forgets(catalog: ReplicaCatalog) -> None:
    first = Replica("in/mesh.dat", "alpha", "/a/mesh.dat", 10, "sha256:" + "a" * 64)
    moved = Replica("in/mesh.dat", "alpha", "/b/mesh.dat", 10, "sha256:" + "a" * 64)
    other = Replica("in/mesh.dat", "beta", "/c/mesh.dat", 10, "sha256:" + "a" * 64)

    catalog.register(first)
    catalog.register(moved)
    catalog.register(other)

    assert catalog.replicas("in/mesh.dat") == (moved, other)
    assert catalog.remove("in/mesh.dat", "alpha") is True
    assert catalog.remove("in/mesh.dat", "alpha") is False
    assert catalog.replicas("in/mesh.dat") == (other,)


def test_require_names_an_unregistered_file(catalog: ReplicaCatalog) -> None:
    with pytest.raises(RequestError, match=re.escape("no replica of 'ghost.dat' is registered")):
        catalog.require("ghost.dat")


@pytest.mark.parametrize(
    "name", ["", " ", "a/ b", "/abs", "a//b", "../up", "a/./b", ".hidden", "a\\b", "x\0"]
)
def test_malformed_logical_names_are_request_errors(name: str) -> None:
    with pytest.raises(RequestError, match="logical file name"):
        check_logical_name(name)


def test_a_malformed_checksum_is_never_registered(catalog: ReplicaCatalog) -> None:
    with pytest.raises(StagingError, match="checksum must be 'sha256:"):
        catalog.register(Replica("f", "alpha", "/f", 1, "md5:abc"))
    assert catalog.replicas("f") == ()


def test_rates_are_an_exponentially_weighted_mean(catalog: ReplicaCatalog) -> None:
    assert catalog.record_rate("alpha", "beta", 100.0) == pytest.approx(100.0)
    assert catalog.record_rate("alpha", "beta", 200.0) == pytest.approx(130.0)  # 0.7*100+0.3*200
    assert catalog.measured_rates() == {("alpha", "beta"): pytest.approx(130.0)}
    with pytest.raises(StagingError, match="positive"):
        catalog.record_rate("alpha", "beta", 0.0)


def test_estimates_use_the_bandwidth_matrix_until_a_rate_is_measured(
    catalog: ReplicaCatalog, grid: GridSpec
) -> None:
    assert catalog.estimate_seconds(grid, ORIGIN, "beta", 100 * MB) == pytest.approx(2.0)
    assert catalog.estimate_seconds(grid, "beta", "alpha", 100 * MB) == pytest.approx(0.5)
    assert catalog.estimate_seconds(grid, "alpha", "alpha", 100 * MB) == 0.0

    catalog.record_rate(ORIGIN, "beta", 25.0)

    assert catalog.estimate_seconds(grid, ORIGIN, "beta", 100 * MB) == pytest.approx(4.0)


# -- staging -----------------------------------------------------------------------------


def test_a_file_is_staged_to_two_sites_from_the_fastest_source(
    tmp_path: Path, catalog: ReplicaCatalog, grid: GridSpec
) -> None:
    src = make_file(tmp_path / "inputs" / "mesh.dat", SIZE)
    origin = register_source(catalog, "in/mesh.dat", ORIGIN, str(src))

    to_alpha = stage_measured(catalog, grid, "in/mesh.dat", "alpha")
    # origin -> beta is 50 MB/s, alpha -> beta 200 MB/s (and now measured): from alpha
    to_beta = stage_measured(catalog, grid, "in/mesh.dat", "beta")

    assert to_alpha.source == origin
    assert to_beta.source is not None and to_beta.source.site == "alpha"
    for staged, site in ((to_alpha, "alpha"), (to_beta, "beta")):
        final = tmp_path / site / "replicas" / "in" / "mesh.dat"
        assert staged.replica == Replica("in/mesh.dat", site, str(final), SIZE, origin.checksum)
        assert sha256(final) == origin.checksum
        assert listing(tmp_path / site) == ["replicas/in/mesh.dat"]  # no .part left
        assert staged.mbps is not None and staged.mbps > 0
        assert staged.seconds > 0
    assert [r.site for r in catalog.replicas("in/mesh.dat")] == ["alpha", "beta", ORIGIN]


def test_staging_a_file_already_at_the_site_is_skipped(
    tmp_path: Path, catalog: ReplicaCatalog, grid: GridSpec
) -> None:
    register_source(catalog, "f.dat", ORIGIN, str(make_file(tmp_path / "f.dat", 1000)))
    first = stage(catalog, grid, "f.dat", "alpha")
    final = Path(first.url)
    mtime = final.stat().st_mtime_ns

    again = stage_measured(catalog, grid, "f.dat", "alpha")

    assert again.skipped and again.replica == first
    assert final.stat().st_mtime_ns == mtime


def test_a_corrupted_source_registers_nothing_and_leaves_no_file(
    tmp_path: Path, catalog: ReplicaCatalog, grid: GridSpec
) -> None:
    src = make_file(tmp_path / "inputs" / "mesh.dat", SIZE)
    register_source(catalog, "mesh.dat", ORIGIN, str(src))
    data = bytearray(src.read_bytes())
    data[SIZE // 2] ^= 0xFF  # same size, one bit flipped
    src.write_bytes(bytes(data))

    with pytest.raises(StagingError) as failure:
        stage(catalog, grid, "mesh.dat", "alpha")

    message = str(failure.value)
    assert "checksum mismatch" in message
    assert f"site {ORIGIN} ({src})" in message
    assert f"site alpha ({tmp_path / 'alpha' / 'replicas' / 'mesh.dat'})" in message
    assert [r.site for r in catalog.replicas("mesh.dat")] == [ORIGIN]
    assert listing(tmp_path / "alpha") == []
    assert catalog.measured_rates() == {}


def flip_byte(path: Path, offset: int) -> None:
    """Corrupt ``path`` in place, keeping its length: only a checksum can tell."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("offset", [0, SIZE // 2, SIZE - 1], ids=["first", "middle", "last"])
@pytest.mark.parametrize("chunk_bytes", [64 * 1024, 4 * MB], ids=["64KiB-chunks", "one-chunk"])
def test_a_same_size_corrupted_source_is_refused_wherever_the_change_lies(
    tmp_path: Path, catalog: ReplicaCatalog, grid: GridSpec, offset: int, chunk_bytes: int
) -> None:
    src = make_file(tmp_path / "inputs" / "mesh.dat", SIZE)
    registered = register_source(catalog, "mesh.dat", ORIGIN, str(src))
    flip_byte(src, offset)
    assert src.stat().st_size == registered.size_bytes

    with pytest.raises(StagingError, match="checksum mismatch"):
        stage_measured(catalog, grid, "mesh.dat", "alpha", chunk_bytes=chunk_bytes)
    with pytest.raises(StagingError, match="checksum mismatch"):
        stage(catalog, grid, "mesh.dat", "beta", dst_url=str(tmp_path / "elsewhere" / "m.dat"))

    assert [r.site for r in catalog.replicas("mesh.dat")] == [ORIGIN]
    assert listing(tmp_path / "alpha") == [] and listing(tmp_path / "elsewhere") == []


def test_a_same_size_corrupted_site_replica_is_passed_over_for_a_sound_one(
    tmp_path: Path, catalog: ReplicaCatalog, grid: GridSpec
) -> None:
    src = make_file(tmp_path / "inputs" / "mesh.dat", SIZE)
    origin = register_source(catalog, "mesh.dat", ORIGIN, str(src))
    at_alpha = stage(catalog, grid, "mesh.dat", "alpha")
    flip_byte(Path(at_alpha.url), SIZE - 1)  # the fastest source for beta (200 MB/s)

    staged = stage_measured(catalog, grid, "mesh.dat", "beta")

    assert staged.source == origin  # alpha's copy refused, the next source used
    assert Path(staged.replica.url).read_bytes() == src.read_bytes()
    assert staged.replica.checksum == origin.checksum
    assert listing(tmp_path / "beta") == ["replicas/mesh.dat"]


def test_a_failing_source_falls_back_to_the_next_fastest(
    tmp_path: Path, catalog: ReplicaCatalog, grid: GridSpec
) -> None:
    src = make_file(tmp_path / "inputs" / "mesh.dat", SIZE)
    register_source(catalog, "mesh.dat", ORIGIN, str(src))
    at_alpha = stage(catalog, grid, "mesh.dat", "alpha")
    Path(at_alpha.url).unlink()  # the fastest source for beta is gone

    staged = stage_measured(catalog, grid, "mesh.dat", "beta")

    assert staged.source is not None and staged.source.site == ORIGIN
    assert sha256(Path(staged.replica.url)) == at_alpha.checksum


def test_every_source_failing_names_each_one(
    tmp_path: Path, catalog: ReplicaCatalog, grid: GridSpec
) -> None:
    src = make_file(tmp_path / "inputs" / "mesh.dat", 1000)
    register_source(catalog, "mesh.dat", ORIGIN, str(src))
    at_alpha = stage(catalog, grid, "mesh.dat", "alpha")
    Path(at_alpha.url).unlink()
    src.unlink()

    with pytest.raises(StagingError, match="failed from every source") as failure:
        stage(catalog, grid, "mesh.dat", "beta")

    assert "FileNotFoundError" in str(failure.value)
    assert f"from site alpha ({at_alpha.url})" in str(failure.value)
    assert f"from site {ORIGIN} ({src})" in str(failure.value)
    assert listing(tmp_path / "beta") == []


def test_unknown_sites_and_files_fail_before_any_transfer(
    tmp_path: Path, catalog: ReplicaCatalog, grid: GridSpec
) -> None:
    register_source(catalog, "f.dat", ORIGIN, str(make_file(tmp_path / "f.dat", 10)))

    with pytest.raises(ConfigError, match="unknown site 'gamma'"):
        stage(catalog, grid, "f.dat", "gamma")
    with pytest.raises(RequestError, match=re.escape("no replica of 'g.dat'")):
        stage(catalog, grid, "g.dat", "alpha")
    assert not (tmp_path / "alpha").exists()


def test_the_measured_rate_refines_the_estimate(
    tmp_path: Path, catalog: ReplicaCatalog, grid: GridSpec
) -> None:
    register_source(catalog, "f.dat", ORIGIN, str(make_file(tmp_path / "f.dat", SIZE)))
    from_matrix = catalog.estimate_seconds(grid, ORIGIN, "alpha", SIZE)

    staged = stage_measured(catalog, grid, "f.dat", "alpha")

    assert staged.estimated_s == pytest.approx(from_matrix) == pytest.approx(SIZE / (400 * MB))
    assert staged.mbps is not None
    assert catalog.measured_rate(ORIGIN, "alpha") == pytest.approx(staged.mbps)
    refined = catalog.estimate_seconds(grid, ORIGIN, "alpha", SIZE)
    assert refined == pytest.approx(SIZE / (staged.mbps * MB))
    assert refined != pytest.approx(from_matrix)


def test_small_transfers_are_not_rate_samples(
    tmp_path: Path, catalog: ReplicaCatalog, grid: GridSpec
) -> None:
    register_source(catalog, "f.dat", ORIGIN, str(make_file(tmp_path / "f.dat", 1000)))
    stage(catalog, grid, "f.dat", "alpha")
    assert catalog.measured_rates() == {}


def test_register_source_of_a_missing_file_is_a_staging_error(
    tmp_path: Path, catalog: ReplicaCatalog
) -> None:
    with pytest.raises(StagingError, match=r"cannot register .*FileNotFoundError"):
        register_source(catalog, "f.dat", ORIGIN, str(tmp_path / "nope"))
    assert catalog.replicas("f.dat") == ()


def test_sweep_partials_removes_only_old_partial_files(tmp_path: Path) -> None:
    root = tmp_path / "alpha" / "replicas"
    old = make_file(root / "in" / f".mesh.dat.part-{'0' * 32}", 10)
    fresh = make_file(root / f".x.part-{'1' * 32}", 10)
    keep = make_file(root / "in" / "mesh.dat", 10)
    os.utime(old, (time.time() - 3600, time.time() - 3600))

    removed = sweep_partials(str(root), older_than_s=600)

    assert removed == (str(old),)
    assert not old.exists() and fresh.exists() and keep.exists()
    assert sweep_partials(str(tmp_path / "missing"), 0) == ()


# -- a transfer killed midway ------------------------------------------------------------

KILL_SIZE = 16 * MB
KILL_CHUNK = 64 * 1024


def _stage_slowly(db_url: str, raw: dict[str, Any], name: str, site: str) -> None:
    """Runs in a spawned process: stage with a throttled copy until SIGKILLed."""
    store = open_store(db_url)
    catalog = ReplicaCatalog(store)

    def crawl(done: int, total: int) -> None:
        time.sleep(0.01)

    stage(catalog, parse_grid(raw), name, site, chunk_bytes=KILL_CHUNK, progress=crawl)
    store.dispose()


def _wait_for_growing_part(directory: Path, at_least: int, timeout_s: float) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        parts = list(directory.glob(".mesh.dat.part-*")) if directory.exists() else []
        if parts and parts[0].stat().st_size >= at_least:
            return parts[0]
        time.sleep(0.01)
    raise AssertionError(f"no .part file of {at_least} bytes in {directory} in {timeout_s} s")


def test_a_transfer_killed_midway_registers_nothing_and_shows_no_partial_file(
    tmp_path: Path, catalog: ReplicaCatalog, store: Store
) -> None:
    src = make_file(tmp_path / "inputs" / "mesh.dat", KILL_SIZE)
    register_source(catalog, "mesh.dat", ORIGIN, str(src))
    dst_dir = tmp_path / "alpha" / "replicas"
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(
        target=_stage_slowly,
        args=(str(store.engine.url), grid_raw(tmp_path), "mesh.dat", "alpha"),
    )
    proc.start()
    try:
        part = _wait_for_growing_part(dst_dir, at_least=MB, timeout_s=20.0)
        # still copying: this is midway
        _wait_for_growing_part(dst_dir, at_least=part.stat().st_size + 1, timeout_s=5.0)
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=10)
        exitcode = proc.exitcode
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        proc.close()

    assert exitcode == -signal.SIGKILL
    assert 0 < part.stat().st_size < KILL_SIZE
    assert [r.site for r in catalog.replicas("mesh.dat")] == [ORIGIN]
    assert not (dst_dir / "mesh.dat").exists()
    assert [p.name for p in dst_dir.iterdir()] == [part.name]  # hidden, never final
    assert part.name.startswith(".")
    assert sweep_partials(str(dst_dir), older_than_s=0.0) == (str(part),)
    assert list(dst_dir.iterdir()) == []
