"""Repository-wide pytest rule: under CI=true nothing may skip.

Every tier (Airflow, the Slurm grid, PostgreSQL) must actually run in CI; a fixture
that cannot start its service skips on a developer laptop but FAILS here, and this hook
turns any other skip into a failure too, so a missing service can never pass silently.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if os.environ.get("CI") == "true" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true (every tier must run): {reason}"
    return report
