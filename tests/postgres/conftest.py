"""PostgreSQL tier: the server on 127.0.0.1:5432 (trust auth). Each test gets its own
throw-away schema in database ``test``. Under CI=true an unreachable server FAILS."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from gridcore.experiments.bench_selection import pg_schema

PG_URL = os.environ.get("GRIDCORE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _reachable() -> str | None:
    try:
        engine = create_engine(PG_URL)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:  # any driver/connection failure means the tier cannot run
        return f"PostgreSQL at {PG_URL} unreachable: {exc}"
    return None


@pytest.fixture
def pg_url() -> Iterator[str]:
    problem = _reachable()
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    with pg_schema(PG_URL) as scoped:
        yield scoped
