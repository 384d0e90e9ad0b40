"""GridcoreHook opens gridcore's engines from a ``gridcore`` Airflow connection (grid file,
state DB) or the environment, and triggers resolve the same connection in the triggerer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException

from gridcore.errors import CredentialError
from gridcore.model import JobRequest, JobSubmission
from gridcore.sites.slurm import SlurmSite
from gridcore_airflow.operators.hooks import EngineKind, GridcoreHook, GridLocation
from gridcore_airflow.operators.site_job import SiteJobOperator
from gridcore_airflow.sensors.triggers import ENGINE_WAITS, SiteJobTrigger

GRID = """\
version = 1

[sites.lab]
kind = "local"
processors = 2
storage_dir = "{storage}"

[sites.alpha]
kind = "slurm"
processors = 16
url = "http://alpha.invalid:6820"
token = {{ airflow_conn = "{token_conn}" }}
"""


def set_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A ``gridcore`` connection naming a grid file (local site ``lab``, Slurm site
    ``alpha`` whose token is another connection) and a SQLite state DB; the environment
    points elsewhere, so only the connection can lead to them."""
    grid = tmp_path / "lab-grid.toml"
    grid.write_text(GRID.format(storage=tmp_path / "lab", token_conn="alpha_slurm"))
    db_url = f"sqlite:///{tmp_path / 'lab-state.db'}"
    set_connection(
        monkeypatch,
        "gridcore_lab",
        conn_type="gridcore",
        extra={"grid_file": str(grid), "db_url": db_url},
    )
    set_connection(monkeypatch, "alpha_slurm", conn_type="gridcore_slurm", password="t0k")
    monkeypatch.setenv("GRIDCORE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GRIDCORE_DB_URL", f"sqlite:///{tmp_path / 'env-state.db'}")
    monkeypatch.delenv("GRIDCORE_GRID", raising=False)
    return {"grid_file": str(grid), "db_url": db_url, "db_path": str(tmp_path / "lab-state.db")}


def test_the_hook_opens_the_runtime_the_connection_names(lab: dict[str, str]) -> None:
    hook = GridcoreHook("gridcore_lab")

    assert hook.get_conn() == GridLocation(lab["grid_file"], lab["db_url"])
    with hook.runtime() as runtime:
        assert set(runtime.grid.site_names) == {"lab", "alpha"}
        assert str(runtime.store.engine.url) == lab["db_url"]
        # The grid file's token reference resolves through the Airflow connection.
        assert isinstance(runtime.adapter("alpha"), SlurmSite)
    assert Path(lab["db_path"]).is_file()
    assert not Path(lab["db_path"]).with_name("env-state.db").exists()


def test_explicit_arguments_win_over_the_connection(lab: dict[str, str], tmp_path: Path) -> None:
    other = f"sqlite:///{tmp_path / 'explicit.db'}"

    location = GridcoreHook("gridcore_lab", db_url=other).get_conn()

    assert location == GridLocation(lab["grid_file"], other)


def test_without_a_connection_the_environment_decides(lab: dict[str, str]) -> None:
    with GridcoreHook().runtime() as runtime:
        assert set(runtime.grid.site_names) == {"local-a", "local-b", "local-c"}
        assert str(runtime.store.engine.url).endswith("env-state.db")


def test_without_a_named_connection_gridcore_default_decides(
    lab: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21 item 3: as Airflow providers do, a connection ``gridcore_default``
    (``AIRFLOW_CONN_GRIDCORE_DEFAULT`` or any secrets backend) is used when an operator
    or a trigger names none, over the environment."""
    set_connection(
        monkeypatch,
        "gridcore_default",
        conn_type="gridcore",
        extra={"grid_file": lab["grid_file"], "db_url": lab["db_url"]},
    )

    for hook in (GridcoreHook(), GridcoreHook(None), GridcoreHook("gridcore_default")):
        assert hook.get_conn() == GridLocation(lab["grid_file"], lab["db_url"])
    with GridcoreHook().runtime() as runtime:
        assert set(runtime.grid.site_names) == {"lab", "alpha"}
    # explicit arguments still go over it, and a named connection replaces it
    other = GridcoreHook(grid_file="/elsewhere.toml").get_conn()
    assert other == GridLocation("/elsewhere.toml", lab["db_url"])
    named = GridcoreHook("gridcore_lab").get_conn()
    assert named == GridLocation(lab["grid_file"], lab["db_url"])


def test_a_missing_gridcore_default_leaves_the_grid_to_gridcore_grid(
    lab: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_GRIDCORE_DEFAULT", raising=False)
    monkeypatch.setenv("GRIDCORE_GRID", lab["grid_file"])

    # named or not, the default connection's absence is no error (as before it existed)
    for hook in (GridcoreHook(), GridcoreHook("gridcore_default")):
        assert hook.get_conn() == GridLocation()
        with hook.runtime() as runtime:
            assert set(runtime.grid.site_names) == {"lab", "alpha"}
            assert str(runtime.store.engine.url).endswith("env-state.db")


def test_a_host_connection_is_a_postgresql_url_with_its_password_escaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_connection(
        monkeypatch,
        "gridcore_pg",
        conn_type="gridcore",
        host="db.example.org",
        port=5433,
        login="gc",
        password="p@ss:/word",
        schema="gridstate",
        extra={"grid_file": "/etc/gridcore/grid.toml"},
    )

    location = GridcoreHook("gridcore_pg").get_conn()

    assert location == GridLocation(
        "/etc/gridcore/grid.toml",
        "postgresql+psycopg://gc:p%40ss%3A%2Fword@db.example.org:5433/gridstate",
    )


def test_the_engine_and_catalog_share_the_connections_state_db(lab: dict[str, str]) -> None:
    hook = GridcoreHook("gridcore_lab")

    with hook.engine(EngineKind.COALLOCATION, 0.5, upgrade=True) as engine:
        assert engine.catalog is not None
        assert str(engine.store.engine.url) == lab["db_url"]
        assert not engine.scan().skipped
    with hook.catalog() as (runtime, catalog):
        assert catalog.replicas("nothing.dat") == ()
        assert str(runtime.store.engine.url) == lab["db_url"]
    # The first engine gave its scan lease up on exit: a second one scans at once.
    with hook.engine(EngineKind.COALLOCATION, 0.5) as engine:
        assert not engine.scan().skipped


@pytest.mark.parametrize("kind", list(EngineKind))
def test_every_engine_kind_is_opened_once_and_closed_once_by_the_hook(
    lab: dict[str, str], kind: EngineKind
) -> None:
    """One open and one close for every kind: on the connection's state DB, and a closed
    engine's scan lease is free at once for the next waiter (not after its expiry)."""
    hook = GridcoreHook("gridcore_lab")
    with hook.runtime():  # a fresh state DB, migrated as the operator's first job does
        pass
    holder = hook.open_engine(kind, 0.5, upgrade=False)
    waiter = hook.open_engine(kind, 0.5, upgrade=False)
    try:
        assert str(holder.store.engine.url) == lab["db_url"]
        assert not holder.scan().skipped
        assert waiter.scan().skipped  # the holder's lease outlives its scan
        GridcoreHook.close_engine(holder)
        assert not waiter.scan().skipped
    finally:
        GridcoreHook.close_engine(waiter)
    assert set(EngineKind) == set(ENGINE_WAITS)  # and the trigger waits on every kind


def test_an_undefined_connection_is_a_credential_error_naming_it() -> None:
    with pytest.raises(CredentialError, match="Airflow connection 'nowhere' is not defined"):
        GridcoreHook("nowhere").get_conn()


def test_a_grid_token_naming_an_undefined_connection_fails_through_airflow(
    lab: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_ALPHA_SLURM")

    with (
        GridcoreHook("gridcore_lab").runtime() as runtime,
        pytest.raises(CredentialError, match="Airflow connection 'alpha_slurm' is not defined"),
    ):
        runtime.adapter("alpha")


def test_an_operator_on_an_undefined_connection_fails_the_try() -> None:
    op = SiteJobOperator(task_id="member", command="true", gridcore_conn_id="nowhere")

    with pytest.raises(AirflowException, match="'nowhere' is not defined"):
        op.execute(context={})


def test_a_trigger_finds_the_job_through_the_connection_alone(lab: dict[str, str]) -> None:
    with GridcoreHook("gridcore_lab").runtime() as runtime:
        record = runtime.select(JobRequest("lab.job.0", 1, runtime_s=1), site="lab")
        runtime.submit(record.selection_id, JobSubmission("lab.job.0", "true", 1))
    trigger = SiteJobTrigger(
        record.selection_id, poll_interval=0.05, gridcore_conn_id="gridcore_lab"
    )

    async def one() -> list[Any]:
        try:
            return [event async for event in trigger.run()]
        finally:
            await trigger.cleanup()

    (event,) = asyncio.run(asyncio.wait_for(one(), 30.0))
    assert event.payload["status"] == "success", event.payload
    assert event.payload["record"]["site"] == "lab"
    assert "gridcore_lab" in json.dumps(trigger.serialize()[1])
    assert "lab-state.db" not in json.dumps(trigger.serialize()[1])  # resolved, not stored


def test_a_trigger_naming_no_connection_finds_the_job_through_gridcore_default(
    lab: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    set_connection(
        monkeypatch,
        "gridcore_default",
        conn_type="gridcore",
        extra={"grid_file": lab["grid_file"], "db_url": lab["db_url"]},
    )
    with GridcoreHook().runtime() as runtime:
        record = runtime.select(JobRequest("lab.job.1", 1, runtime_s=1), site="lab")
        runtime.submit(record.selection_id, JobSubmission("lab.job.1", "true", 1))
    trigger = SiteJobTrigger(record.selection_id, poll_interval=0.05)

    async def one() -> list[Any]:
        try:
            return await _all(trigger)
        finally:
            await trigger.cleanup()

    (event,) = asyncio.run(asyncio.wait_for(one(), 30.0))

    assert event.payload["status"] == "success", event.payload
    assert event.payload["record"]["site"] == "lab"
    assert trigger.serialize()[1]["gridcore_conn_id"] is None  # resolved in the triggerer


def test_a_trigger_on_an_undefined_connection_yields_one_error_event() -> None:
    trigger = SiteJobTrigger(3, poll_interval=0.05, gridcore_conn_id="nowhere")

    events = asyncio.run(asyncio.wait_for(_all(trigger), 30.0))

    assert [e.payload["status"] for e in events] == ["error"]
    assert "Airflow connection 'nowhere' is not defined" in events[0].payload["message"]


async def _all(trigger: SiteJobTrigger) -> list[Any]:
    return [event async for event in trigger.run()]
