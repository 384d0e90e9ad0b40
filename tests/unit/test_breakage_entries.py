"""The deliberate breakages of ``python -m tests.breakages`` stay aimed at live code: each
entry's text stands exactly once in its file and its guarding tests exist, so a rename or
a refactor cannot quietly turn the check into one that breaks nothing."""

from __future__ import annotations

import pytest

from tests.breakages import BREAKAGES, ROOT, Breakage


@pytest.mark.parametrize("breakage", BREAKAGES, ids=lambda b: b.name)
def test_each_breakage_hits_one_place_and_names_existing_tests(breakage: Breakage) -> None:
    assert (ROOT / breakage.path).read_text().count(breakage.old) == 1
    assert breakage.old != breakage.new
    assert all((ROOT / test).is_file() for test in breakage.tests)
