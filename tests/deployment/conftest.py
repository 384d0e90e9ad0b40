"""Deployment tier: the deployment of docker/compose.yaml started natively (see
``tests.deployment.deployment``). It needs PostgreSQL on 127.0.0.1:5432, Redis on
127.0.0.1:6379 and the Celery and FAB providers (the dev extra); under CI=true a tier
that cannot start FAILS, elsewhere it is skipped with the reason."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.deployment.deployment import Deployment, reachable, running


@pytest.fixture(scope="package")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    problem = reachable()
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    with running(tmp_path_factory.mktemp("deployment")) as started:
        yield started
