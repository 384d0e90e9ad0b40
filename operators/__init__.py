"""gridcore's Airflow layer: operators, the connection hook and the provider info.

Importing the package installs the Airflow-connection credential resolver, so grid files
may reference tokens as ``{ airflow_conn = "..." }`` in any process that uses gridcore
operators. The resolver lives in :mod:`gridcore_airflow.sensors.connections` (the
lowest Airflow layer), which also installs it whenever a hook or a trigger opens an engine.
"""

from __future__ import annotations

from gridcore_airflow.sensors.connections import install_connection_resolver

install_connection_resolver()
