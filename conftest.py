"""Repository-wide pytest rule: under CI nothing may skip.

Every tier (Airflow, the Slurm grid, PostgreSQL) must actually run in CI; a fixture
that cannot start its service skips on a developer laptop but FAILS here, and these hooks
turn every other way of not running a test into a failure too, so a missing service or
module can never pass silently:

- a skip while a test runs (``pytest.skip()``, a fixture that skips, a ``skip``/``skipif``
  marker), in :func:`pytest_runtest_makereport`;
- a skip while a module is collected (``pytest.skip(allow_module_level=True)``,
  ``pytest.importorskip``), in :func:`pytest_make_collect_report`: the module is reported
  as a collection error;
- an expected failure (``xfail`` marker or ``pytest.xfail()``), whether it failed as
  expected or passed: a test that is allowed to fail checks nothing.

CI is any truthy ``CI`` variable (``true``, ``1``, ``yes``, ``on``; any case), as CI
services set it.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

CI_TRUE = frozenset({"true", "1", "yes", "on"})


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in CI_TRUE


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if not under_ci():
        return report
    if hasattr(report, "wasxfail"):
        reason = report.wasxfail
        # junitxml and the terminal summary would still count it as xfailed/xpassed.
        del report.wasxfail
        _fail(report, f"xfail under CI (every test must pass): {reason or 'no reason given'}")
    elif report.skipped:
        _fail(report, f"skipped under CI (every tier must run): {_reason(report)}")
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if under_ci() and report.skipped:
        _fail(report, f"{collector.nodeid} skipped at collection under CI: {_reason(report)}")
    return report


def _fail(report: pytest.TestReport | pytest.CollectReport, message: str) -> None:
    report.outcome = "failed"
    report.longrepr = message


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)
