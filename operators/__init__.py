"""gridcore's Airflow layer: operators, the connection hook and the provider info.

Importing the package installs the Airflow-connection credential resolver, so grid files
may reference tokens as ``{ airflow_conn = "..." }`` in any process that uses gridcore
operators. The resolver lives with the connections, in :mod:`gridcore_airflow.operators.hooks`,
which also installs it whenever a hook opens the runtime or an engine (workers and the
triggerer alike).
"""

from __future__ import annotations

from gridcore_airflow.operators.hooks import install_connection_resolver

install_connection_resolver()
