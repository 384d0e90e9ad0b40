"""The integration tier: Airflow's real ``dag.test()`` (and real services) on local sites.

``tests/conftest.py`` has already pointed ``AIRFLOW_HOME`` at a private temporary
directory and ``AIRFLOW__CORE__DAGS_FOLDER`` at this repository's ``dags/`` before
anything imported Airflow. Here, once per session: gridcore's own state (SQLite, local
site storage, the forcing inbox) goes to a temporary directory, and ``airflow db
migrate`` creates the metadata DB (a subprocess, as an operator would run it). This is
the preparation ``make demo`` does too (``gridcore_airflow.demo``): the same
functions, so the demo runs what these tests check.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gridcore.demo import UNSET_FOR_DEFAULT
from gridcore.demo import GridcoreEnv as IntegrationEnv

DAGS = Path(__file__).resolve().parents[2] / "dags"
# The Airflow layer (gridcore_airflow.demo) is imported inside the fixtures:
# importing it imports Airflow, whose home tests/conftest.py sets in pytest_configure,
# after this file may have been imported.


@pytest.fixture(scope="session")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IntegrationEnv]:
    from gridcore_airflow.demo.harness import migrate_metadata_db

    env = IntegrationEnv.under(tmp_path_factory.mktemp("integration"))
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.variables().items():
            mp.setenv(name, value)
        for name in UNSET_FOR_DEFAULT:  # the embedded local sites, no VJ center
            mp.delenv(name, raising=False)
        migrate_metadata_db()
        yield env


@pytest.fixture(scope="session")
def dagbag(airflow_env: IntegrationEnv) -> Any:
    # Parsed after airflow_env: the DAG reads GRIDCORE_FORCING_DIR at parse time.
    from gridcore_airflow.demo.harness import dag_bag

    return dag_bag(DAGS)
