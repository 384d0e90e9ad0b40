"""The Airflow plugin mounts the VJ center in the api-server: Airflow finds it by its
entry point, and the mounted app is the center (its health route answers; pilot routes
refuse a request without a token)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

pytestmark = pytest.mark.airflow


def test_airflow_loads_the_plugin_with_the_center_app() -> None:
    from airflow import plugins_manager

    from gridcore_airflow.operators.plugin import URL_PREFIX, GridcorePlugin

    mounted = [a for a in plugins_manager.get_fastapi_plugins()[0] if a["url_prefix"] == URL_PREFIX]
    assert len(mounted) == 1, plugins_manager.get_import_errors()
    assert mounted[0]["name"] == GridcorePlugin.fastapi_apps[0]["name"] == "gridcore VJ center"


def test_the_mounted_app_is_the_center(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gridcore.state.store import open_store
    from gridcore_airflow.operators.plugin import center_app

    url = f"sqlite:///{tmp_path}/state.db"
    open_store(url, upgrade=True).dispose()
    monkeypatch.setenv("GRIDCORE_DB_URL", url)
    with TestClient(center_app()) as client:
        assert client.get("/api/v1/health").status_code == 200
        refused = client.post("/api/v1/pilots/1/heartbeat")
        assert refused.status_code == 401
