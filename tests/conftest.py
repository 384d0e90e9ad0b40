"""Session setup every test tier shares: a private Airflow home.

Airflow reads ``AIRFLOW_HOME`` (and writes ``airflow.cfg`` there) the first time it is
imported, which can happen while collecting any test module (the operator and trigger
unit tests import it). So the environment is set in ``pytest_configure``, before any
test module is imported, and points at a temporary directory: tests never touch the
developer's ``~/airflow``. The Airflow metadata database is created only by the tiers
that need it (``tests/integration/conftest.py`` runs ``airflow db migrate``).

``make test`` runs the tiers side by side on pytest-xdist workers (``-n``, with
``--dist loadgroup`` from pyproject.toml). A tier whose tests share one service started
per session (the Slurm grid, the deployment) is pinned to one worker as an xdist group
(:data:`SERIAL_TIERS`): started once, never twice side by side. Everything else a test
touches is its own (``tmp_path``, a free port, a database or schema with a random name,
this process's Airflow home), so it may run beside anything.

Keep this file minimal: tier-specific setup belongs in the tier's own conftest.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_HOME = pytest.StashKey[Path]()

SERIAL_TIERS = {"slurm": "slurm", "deployment": "deployment"}
"""Tier folder under tests/ (or the marker of a test elsewhere that uses that tier's
service) -> the xdist group all its tests run in, on one worker."""


def pytest_configure(config: pytest.Config) -> None:
    home = Path(tempfile.mkdtemp(prefix="gridcore-airflow-"))
    config.stash[_HOME] = home
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    # A DAG the tests run must not wait for someone to unpause it.
    os.environ["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] = "False"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = _serial_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def _serial_group(item: pytest.Item) -> str | None:
    if item.path.is_relative_to(REPO / "tests"):
        tier = item.path.relative_to(REPO / "tests").parts[0]
        if tier in SERIAL_TIERS:
            return SERIAL_TIERS[tier]
    for marker, group in SERIAL_TIERS.items():
        if item.get_closest_marker(marker) is not None:
            return group
    return None


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(_HOME, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)
