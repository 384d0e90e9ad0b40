"""The VJ center's OpenAPI document says what the app answers, on PostgreSQL (where a
NUL byte or an integer past a column's range is a server error, not a stored value):
every route probed from its table and schemathesis against the document with valid,
other, junk and no tokens (tests/api_fuzz.py): no 5xx, every answer documented, every
refusal changes no row."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gridcore.state.store import open_store
from tests.api_fuzz import InProcess, fuzz, in_process, probe_every_route

pytestmark = pytest.mark.postgres

MAX_EXAMPLES = 10  # per operation, token variant and mode (as the SQLite tier)


@pytest.fixture
def center(pg_url: str) -> Iterator[InProcess]:
    with in_process(open_store(pg_url, upgrade=True)) as app:
        yield app


def test_every_route_lists_what_it_answers_on_postgresql(center: InProcess) -> None:
    probe_every_route(center)


def test_schemathesis_finds_nothing_on_postgresql(center: InProcess) -> None:
    problems = fuzz(center, MAX_EXAMPLES)
    assert not problems, "\n".join(problems[:20])
