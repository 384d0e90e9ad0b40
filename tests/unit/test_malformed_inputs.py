"""Malformed grid files and requests on SQLite: refused in one line naming file and
field (the CLI exits 2), nothing written, nothing claimed (table: tests/malformed_inputs.py;
the same table runs on PostgreSQL in tests/postgres/test_malformed_inputs_pg.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.malformed_inputs import (
    GRID_CASES,
    JOB_CASES,
    SELECT_CASES,
    SUBMIT_CASES,
    GridCase,
    JobCase,
    SelectCase,
    SubmitCase,
    check_grid_case,
    check_job_case,
    check_select_case,
    check_submit_case,
)


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


@pytest.mark.parametrize("case", [c.param() for c in GRID_CASES])
def test_malformed_grid_file(case: GridCase, tmp_path: Path) -> None:
    check_grid_case(case, sqlite_url(tmp_path), tmp_path)


@pytest.mark.parametrize("case", [c.param() for c in SELECT_CASES])
def test_malformed_selection_request(case: SelectCase, tmp_path: Path) -> None:
    check_select_case(case, sqlite_url(tmp_path), tmp_path)


@pytest.mark.parametrize("case", [c.param() for c in SUBMIT_CASES])
def test_malformed_coallocation_request(case: SubmitCase, tmp_path: Path) -> None:
    check_submit_case(case, sqlite_url(tmp_path), tmp_path)


@pytest.mark.parametrize("case", [c.param() for c in JOB_CASES])
def test_malformed_job_submission(case: JobCase, tmp_path: Path) -> None:
    check_job_case(case, sqlite_url(tmp_path), tmp_path)
