"""Malformed grid files and requests on PostgreSQL (a throw-away schema each): refused in
one line naming file and field before anything is written, where a name longer than its
column or a processor count beyond INTEGER would otherwise reach the server (the table:
tests/malformed_inputs.py, shared with the SQLite tier)."""

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

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("case", [c.param() for c in GRID_CASES])
def test_malformed_grid_file(case: GridCase, pg_url: str, tmp_path: Path) -> None:
    check_grid_case(case, pg_url, tmp_path)


@pytest.mark.parametrize("case", [c.param() for c in SELECT_CASES])
def test_malformed_selection_request(case: SelectCase, pg_url: str, tmp_path: Path) -> None:
    check_select_case(case, pg_url, tmp_path)


@pytest.mark.parametrize("case", [c.param() for c in SUBMIT_CASES])
def test_malformed_coallocation_request(case: SubmitCase, pg_url: str, tmp_path: Path) -> None:
    check_submit_case(case, pg_url, tmp_path)


@pytest.mark.parametrize("case", [c.param() for c in JOB_CASES])
def test_malformed_job_submission(case: JobCase, pg_url: str, tmp_path: Path) -> None:
    check_job_case(case, pg_url, tmp_path)
