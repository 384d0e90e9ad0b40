"""Credential references resolve without ever echoing the secret."""

from __future__ import annotations

import pytest

from gridcore import credentials
from gridcore.errors import CredentialError
from gridcore.model import CredentialRef


def test_env_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GC_TEST_TOKEN", "tok")
    assert credentials.resolve(CredentialRef(env="GC_TEST_TOKEN")) == "tok"
    monkeypatch.delenv("GC_TEST_TOKEN")
    with pytest.raises(CredentialError, match="env:GC_TEST_TOKEN is not set"):
        credentials.resolve(CredentialRef(env="GC_TEST_TOKEN"))


def test_airflow_conn_from_environment_uri_and_json(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another test module may have imported operators/, which registers Airflow's resolver.
    monkeypatch.setattr(credentials, "_conn_resolver", None)
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_A", "http://root:p%40ss@host:6820")
    assert credentials.resolve(CredentialRef(airflow_conn="slurm_a")) == "p@ss"
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_A", '{"conn_type": "http", "password": "jt"}')
    assert credentials.resolve(CredentialRef(airflow_conn="slurm_a")) == "jt"
    monkeypatch.delenv("AIRFLOW_CONN_SLURM_A")
    with pytest.raises(CredentialError, match="AIRFLOW_CONN_SLURM_A is not set"):
        credentials.resolve(CredentialRef(airflow_conn="slurm_a"))


def test_registered_resolver_errors_name_the_reference_not_the_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def boom(conn_id: str) -> str:
        raise KeyError(conn_id)

    monkeypatch.setattr(credentials, "_conn_resolver", boom)
    with pytest.raises(CredentialError, match="airflow_conn:missing"):
        credentials.resolve(CredentialRef(airflow_conn="missing"))
