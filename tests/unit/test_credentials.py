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


def test_registered_resolver_errors_name_the_reference_and_keep_the_cause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def boom(conn_id: str) -> str:
        raise KeyError(conn_id)

    monkeypatch.setattr(credentials, "_conn_resolver", boom)
    with pytest.raises(CredentialError, match="airflow_conn:missing") as err:
        credentials.resolve(CredentialRef(airflow_conn="missing"))
    assert isinstance(err.value.__cause__, KeyError)


SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param('{"conn_type": "http", "password": "' + SECRET + '"', "bad JSON", id="json"),
        pytest.param('{"conn_type": "http", "extra": "' + SECRET + '"}', "no password", id="nopw"),
        pytest.param(f"http://{SECRET}@host:6820", "no password", id="uri-user-only"),
    ],
)
def test_unusable_connections_name_the_reference_not_the_secret(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    # The variable holds the secret, but in a form that yields no password.
    monkeypatch.setattr(credentials, "_conn_resolver", None)
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_A", value)
    with pytest.raises(CredentialError, match=message) as err:
        credentials.resolve(CredentialRef(airflow_conn="slurm_a"))
    assert "airflow_conn:slurm_a" in str(err.value)
    assert SECRET not in str(err.value) and SECRET not in repr(err.value)
