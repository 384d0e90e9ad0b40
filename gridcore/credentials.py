"""Resolve credential references (``{ env = ... }`` / ``{ airflow_conn = ... }``).

gridcore never imports Airflow. Airflow connection ids are resolved by a resolver that
the Airflow layer registers (``operators`` registers one backed by ``BaseHook``); without
it, the standard ``AIRFLOW_CONN_<ID>`` environment variable is read (URI or JSON form),
which is also how Airflow itself supplies connections from the environment.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

from gridcore.errors import CredentialError
from gridcore.model import CredentialRef

ConnResolver = Callable[[str], str]
_conn_resolver: ConnResolver | None = None


def register_connection_resolver(resolver: ConnResolver | None) -> None:
    """Install the function that turns an Airflow connection id into a secret."""
    global _conn_resolver
    _conn_resolver = resolver


def resolve(ref: CredentialRef) -> str:
    """The secret a reference names. Raises CredentialError saying which reference failed
    (never the secret)."""
    if ref.env is not None:
        value = os.environ.get(ref.env)
        if not value:
            raise CredentialError(f"credential env:{ref.env} is not set")
        return value
    conn_id = ref.airflow_conn or ""
    if _conn_resolver is not None:
        try:
            return _conn_resolver(conn_id)
        except CredentialError:
            raise
        except Exception as exc:  # the resolver is foreign code: name it, keep the cause
            raise CredentialError(f"credential airflow_conn:{conn_id}: {exc}") from exc
    return _from_env_connection(conn_id)


def _from_env_connection(conn_id: str) -> str:
    raw = os.environ.get(f"AIRFLOW_CONN_{conn_id.upper()}")
    if not raw:
        raise CredentialError(
            f"credential airflow_conn:{conn_id} cannot be resolved: no Airflow resolver is "
            f"registered and AIRFLOW_CONN_{conn_id.upper()} is not set"
        )
    if raw.lstrip().startswith("{"):
        try:
            password = json.loads(raw).get("password")
        except json.JSONDecodeError as exc:
            raise CredentialError(f"credential airflow_conn:{conn_id}: bad JSON") from exc
    else:
        password = urlsplit(raw).password
        password = unquote(password) if password else None
    if not password:
        raise CredentialError(f"credential airflow_conn:{conn_id} has no password field")
    return str(password)
