"""The VJ center's hostile-input probes (issue 21 items 7-10) on PostgreSQL, where a NUL
byte in a text column is a server error rather than a stored character: every probe is
a 422 naming its field, and no row changes (the table: tests/api_checks.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gridcore.state.store import open_store
from tests.api_checks import (
    HOSTILE_PILOT_BODIES,
    Center,
    check_hostile_pilot_body,
    started_center,
)

pytestmark = pytest.mark.postgres


@pytest.fixture
def center(pg_url: str) -> Iterator[Center]:
    with started_center(open_store(pg_url, upgrade=True)) as running:
        yield running


@pytest.mark.parametrize(("path", "text", "field"), HOSTILE_PILOT_BODIES)
def test_hostile_pilot_bodies_get_422_on_postgresql(
    center: Center, path: str, text: str, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    check_hostile_pilot_body(center, path, text, field, caplog)
