"""The ``gridcore_slurm`` Airflow connection type and the credential bridge to gridcore.

A grid file names a Slurm site's token by reference, ``token = { airflow_conn = "id" }``;
gridcore (which never imports Airflow) resolves such references through the function
:func:`install_connection_resolver` registers, backed by Airflow's connections (and thus
by every secrets backend Airflow is configured with). The token lives in the password.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from gridcore import credentials
from gridcore.errors import CredentialError


class GridcoreHook(BaseHook):
    """A slurmrestd endpoint of one gridcore site: host = REST URL, login = Slurm user,
    password = JWT token."""

    conn_name_attr = "gridcore_conn_id"
    default_conn_name = "gridcore_slurm_default"
    conn_type = "gridcore_slurm"
    hook_name = "gridcore Slurm site"

    def __init__(self, gridcore_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gridcore_conn_id = gridcore_conn_id

    def get_token(self) -> str:
        """The site's slurmrestd token; raises naming the connection if it has none."""
        return connection_token(self.gridcore_conn_id)

    def get_conn(self) -> dict[str, str | None]:
        conn = self.get_connection(self.gridcore_conn_id)
        return {"url": conn.host, "user": conn.login, "token": self.get_token()}

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["schema", "port", "extra"],
            "relabeling": {
                "host": "slurmrestd URL",
                "login": "Slurm user",
                "password": "slurmrestd JWT token",
            },
            "placeholders": {"host": "http://cluster.example.org:6820", "login": "root"},
        }


def connection_token(conn_id: str) -> str:
    password = BaseHook.get_connection(conn_id).password
    if not password:
        raise CredentialError(f"Airflow connection {conn_id!r} has no password (the token)")
    return str(password)


def install_connection_resolver() -> None:
    """Let gridcore resolve ``{ airflow_conn = ... }`` through Airflow connections.
    Idempotent; called on import of ``operators`` and before triggers open a runtime."""
    credentials.register_connection_resolver(connection_token)
