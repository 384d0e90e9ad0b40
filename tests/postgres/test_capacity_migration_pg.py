"""Migration 0006 carries selections, placed components and KOALA's site health over to
the one capacity ledger and the one health table on PostgreSQL too."""

from __future__ import annotations

import pytest

from gridcore.state.store import open_store
from tests.unit.test_capacity_migration import check_0006_carries_state_over

pytestmark = pytest.mark.postgres


def test_0006_carries_selections_components_and_health_over_on_postgresql(pg_url: str) -> None:
    check_0006_carries_state_over(open_store(pg_url))
