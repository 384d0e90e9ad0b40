"""gridcore's Airflow layer: operators, the connection hook and the provider info.

Importing the package installs the Airflow-connection credential resolver, so grid files
may reference tokens as ``{ airflow_conn = "..." }`` in any process that uses gridcore
operators (workers; triggers install it themselves).
"""

from __future__ import annotations

from operators.hooks import install_connection_resolver

install_connection_resolver()
