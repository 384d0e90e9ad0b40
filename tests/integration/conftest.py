"""The integration tier: Airflow's real ``dag.test()`` (and real services) on local sites.

``tests/conftest.py`` has already pointed ``AIRFLOW_HOME`` at a private temporary
directory and ``AIRFLOW__CORE__DAGS_FOLDER`` at this repository's ``dags/`` before
anything imported Airflow. Here, once per session: gridcore's own state (SQLite, local
site storage, the forcing inbox) goes to a temporary directory, and ``airflow db
migrate`` creates the metadata DB (a subprocess, as an operator would run it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.airflow_services import migrate_metadata_db

DAGS = Path(__file__).resolve().parents[2] / "dags"


@dataclass(frozen=True)
class IntegrationEnv:
    base: Path
    gridcore_home: Path
    db_url: str
    forcing_dir: Path


@pytest.fixture(scope="session")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IntegrationEnv]:
    base = tmp_path_factory.mktemp("integration")
    env = IntegrationEnv(
        base=base,
        gridcore_home=base / "gridcore",
        db_url=f"sqlite:///{base / 'gridcore-state.db'}",
        forcing_dir=base / "forcing",
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRIDCORE_HOME", str(env.gridcore_home))
        mp.setenv("GRIDCORE_DB_URL", env.db_url)
        mp.setenv("GRIDCORE_FORCING_DIR", str(env.forcing_dir))
        mp.delenv("GRIDCORE_GRID", raising=False)  # the embedded local sites
        migrate_metadata_db()
        yield env


@pytest.fixture(scope="session")
def dagbag(airflow_env: IntegrationEnv) -> Any:
    # Parsed after airflow_env: the DAG reads GRIDCORE_FORCING_DIR at parse time.
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))
