"""Session setup every test tier shares: a private Airflow home.

Airflow reads ``AIRFLOW_HOME`` (and writes ``airflow.cfg`` there) the first time it is
imported, which can happen while collecting any test module (the operator and trigger
unit tests import it). So the environment is set in ``pytest_configure``, before any
test module is imported, and points at a temporary directory: tests never touch the
developer's ``~/airflow``. The Airflow metadata database is created only by the tiers
that need it (``tests/integration/conftest.py`` runs ``airflow db migrate``).

``make test`` runs the tiers side by side on pytest-xdist workers (``-n``, with
``--dist loadgroup`` from pyproject.toml): a tier whose tests share one service started
per session (the Slurm grid, the deployment) runs whole on one worker
(``tests/tier_scheduling.py``).

Keep this file minimal: tier-specific setup belongs in the tier's own conftest.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

REPO = Path(__file__).resolve().parent.parent
_HOME = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    home = Path(tempfile.mkdtemp(prefix="gridcore-airflow-"))
    config.stash[_HOME] = home
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    # A DAG the tests run must not wait for someone to unpause it.
    os.environ["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] = "False"
    # One Fernet key for this session's every Airflow process, not whatever each found in
    # airflow.cfg: a process that read the file while another was still writing it got no
    # key, and its dag.test() could not decrypt the trigger rows the dag-processor had
    # encrypted (CI: JSONDecodeError in Trigger._decrypt_kwargs, Airflow's null Fernet).
    os.environ["AIRFLOW__CORE__FERNET_KEY"] = Fernet.generate_key().decode()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist loadgroup`` (pyproject.toml), a worker takes a whole tier that
    shares one service (``tests.tier_scheduling.SERIAL_TIERS``)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.tier_scheduling import TierScheduling

    return TierScheduling(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(_HOME, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)
