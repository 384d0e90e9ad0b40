"""StageFilesOperator against a real replica catalog: temp SQLite + the embedded local
sites (local-a, local-b, local-c under $GRIDCORE_HOME/sites)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from gridcore.model import MB, ORIGIN
from gridcore.staging import ReplicaCatalog, register_source
from gridcore.state.store import open_store
from gridcore_airflow.operators.stage_files import StageFilesOperator

RESULT_KEYS = {
    "logical_name",
    "url",
    "size_bytes",
    "checksum",
    "seconds",
    "mbps",
    "source",
    "skipped",
}


@pytest.fixture
def catalog(db_url: str) -> Iterator[ReplicaCatalog]:
    store = open_store(db_url, upgrade=True)
    try:
        yield ReplicaCatalog(store)
    finally:
        store.dispose()


@pytest.fixture
def sources(tmp_path: Path, catalog: ReplicaCatalog) -> dict[str, Path]:
    files = {"mesh.dat": 2 * MB, "params/run.json": 300}
    paths = {}
    for name, size in files.items():
        path = tmp_path / "inputs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        register_source(catalog, name, ORIGIN, str(path))
        paths[name] = path
    return paths


def operator(**kwargs: Any) -> StageFilesOperator:
    return StageFilesOperator(**{"task_id": "stage", **kwargs})


def site_dir(tmp_path: Path, site: str) -> Path:
    return tmp_path / "home" / "sites" / site / "replicas"


def test_files_are_staged_and_the_result_is_plain_json(
    tmp_path: Path, catalog: ReplicaCatalog, sources: dict[str, Path]
) -> None:
    result = operator(logical_names=["mesh.dat", "params/run.json"], site="local-b").execute({})

    assert json.loads(json.dumps(result)) == result
    assert result["site"] == "local-b"
    mesh, params = result["replicas"]
    assert set(mesh) == RESULT_KEYS
    assert mesh["logical_name"] == "mesh.dat"
    assert mesh["url"] == str(site_dir(tmp_path, "local-b") / "mesh.dat")
    assert mesh["size_bytes"] == 2 * MB
    assert mesh["source"] == ORIGIN and mesh["skipped"] is False
    assert mesh["seconds"] > 0 and mesh["mbps"] > 0
    assert params["url"] == str(site_dir(tmp_path, "local-b") / "params" / "run.json")
    assert Path(params["url"]).read_bytes() == sources["params/run.json"].read_bytes()
    for staged in (mesh, params):
        assert catalog.replica(staged["logical_name"], "local-b") is not None
        assert staged["checksum"] == catalog.require(staged["logical_name"])[0].checksum


def test_files_already_at_the_site_are_skipped(
    catalog: ReplicaCatalog, sources: dict[str, Path]
) -> None:
    operator(logical_names=["mesh.dat"], site="local-a").execute({})

    result = operator(logical_names=["mesh.dat", "params/run.json"], site="local-a").execute({})

    mesh, params = result["replicas"]
    assert mesh["skipped"] is True and mesh["source"] is None and mesh["mbps"] is None
    assert params["skipped"] is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"logical_names": ["mesh.dat"], "site": "nowhere"}, "unknown site 'nowhere'"),
        ({"logical_names": ["mesh.dat", "ghost.dat"], "site": "local-a"}, "no replica of 'ghost"),
        ({"logical_names": ["mesh.dat", "../etc"], "site": "local-a"}, "logical file name"),
        ({"logical_names": [], "site": "local-a"}, "non-empty list"),
        ({"logical_names": ["mesh.dat", "mesh.dat"], "site": "local-a"}, "more than once"),
    ],
)
def test_bad_input_fails_before_any_transfer(
    tmp_path: Path,
    catalog: ReplicaCatalog,
    sources: dict[str, Path],
    kwargs: dict[str, Any],
    message: str,
) -> None:
    with pytest.raises(AirflowFailException, match=message):
        operator(**kwargs).execute({})

    assert [r.site for r in catalog.replicas("mesh.dat")] == [ORIGIN]
    assert not (tmp_path / "home" / "sites").exists()


def test_a_failed_transfer_is_retryable_and_registers_nothing(
    tmp_path: Path, catalog: ReplicaCatalog, sources: dict[str, Path]
) -> None:
    sources["mesh.dat"].write_bytes(b"not the registered content")

    with pytest.raises(AirflowException, match="checksum mismatch") as failure:
        operator(logical_names=["mesh.dat"], site="local-c").execute({})

    assert not isinstance(failure.value, AirflowFailException)
    assert catalog.replica("mesh.dat", "local-c") is None
    assert list(site_dir(tmp_path, "local-c").iterdir()) == []


def test_a_same_size_corrupted_source_is_refused(
    tmp_path: Path, catalog: ReplicaCatalog, sources: dict[str, Path]
) -> None:
    # Same length, one byte changed: only the checksum can tell.
    data = bytearray(sources["mesh.dat"].read_bytes())
    data[len(data) // 2] ^= 0xFF
    sources["mesh.dat"].write_bytes(bytes(data))
    assert sources["mesh.dat"].stat().st_size == catalog.require("mesh.dat")[0].size_bytes

    with pytest.raises(AirflowException, match="checksum mismatch") as failure:
        operator(logical_names=["mesh.dat"], site="local-c").execute({})

    assert not isinstance(failure.value, AirflowFailException)
    assert catalog.replica("mesh.dat", "local-c") is None
    assert list(site_dir(tmp_path, "local-c").iterdir()) == []


def test_logical_names_and_site_are_templated() -> None:
    assert set(StageFilesOperator.template_fields) == {"logical_names", "site"}
