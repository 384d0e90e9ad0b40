"""The provider entry point, the gridcore and gridcore_slurm connection types and the
credential bridge."""

from __future__ import annotations

import json
from pathlib import Path

import airflow
import jsonschema
import pytest

from gridcore import credentials
from gridcore.errors import CredentialError
from gridcore.model import CredentialRef
from gridcore_airflow.operators.hooks import GridcoreSlurmHook, install_connection_resolver
from gridcore_airflow.operators.provider import get_provider_info


def test_provider_info_matches_airflows_runtime_schema() -> None:
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()

    jsonschema.validate(info, schema)
    assert info["package-name"] == "gridcore"  # must equal the canonical distribution name


def test_providers_manager_discovers_gridcore_and_its_connection_type() -> None:
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    assert "gridcore" in manager.providers
    hooks = {
        m.connection_type: (m.hook_class_name, m.hook_name)
        for m in manager.iter_connection_type_hook_ui_metadata()
        if m.connection_type.startswith("gridcore")
    }
    assert hooks == {
        "gridcore": ("gridcore_airflow.operators.hooks.GridcoreHook", "gridcore grid"),
        "gridcore_slurm": (
            "gridcore_airflow.operators.hooks.GridcoreSlurmHook",
            "gridcore Slurm site",
        ),
    }
    triggers = {(t.package_name, t.trigger_class_name) for t in manager.trigger}
    # every trigger in one module: SiteJobTrigger, EngineTrigger (each engine), ForcingFileTrigger
    assert {name for package, name in triggers if package == "gridcore"} == {
        "gridcore_airflow.sensors.triggers"
    }


def test_an_airflow_connection_supplies_a_sites_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_ALPHA_SLURM",
        json.dumps({"conn_type": "gridcore_slurm", "host": "http://alpha:6820", "password": "t0k"}),
    )
    install_connection_resolver()

    assert credentials.resolve(CredentialRef(airflow_conn="alpha_slurm")) == "t0k"
    assert GridcoreSlurmHook("alpha_slurm").get_conn() == {
        "url": "http://alpha:6820",
        "user": None,
        "token": "t0k",
    }


def test_a_connection_without_a_token_is_a_credential_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_BETA_SLURM", json.dumps({"conn_type": "gridcore_slurm"}))
    install_connection_resolver()

    with pytest.raises(CredentialError, match="'beta_slurm' has no password"):
        credentials.resolve(CredentialRef(airflow_conn="beta_slurm"))
