"""The VJ center's OpenAPI document says what the app answers (issue 21 item 10 and its
"done when"), on SQLite: every route probed from a table (tests/api_fuzz.py) and
schemathesis against the document with valid, other, junk and no tokens; no 5xx, every
answer documented and valid against its schema, every refusal changes no row."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gridcore.state.store import open_store
from tests.api_fuzz import InProcess, check_documented, fuzz, in_process, probe_every_route

MAX_EXAMPLES = 10  # per operation, token variant and mode: about 20 s of CPU in all


@pytest.fixture
def center(tmp_path: Path) -> Iterator[InProcess]:
    with in_process(open_store(f"sqlite:///{tmp_path / 'state.db'}", upgrade=True)) as app:
        yield app


def test_every_route_lists_what_it_answers(center: InProcess) -> None:
    probe_every_route(center)


def test_every_token_protected_route_documents_401_and_403(center: InProcess) -> None:
    for template, operations in center.doc["paths"].items():
        for method, operation in operations.items():
            if template.startswith(("/api/v1/pilots/", "/api/v1/components/")):
                assert {"401", "403"} <= set(operation["responses"]), (method, template)
                assert operation["security"] == [{"bearer": []}]
            elif template.startswith(("/api/v1/grid", "/grid/ti", "/grid/static")):
                assert "401" in operation["responses"], (method, template)


def test_a_bad_map_index_is_a_422_shaped_as_documented(center: InProcess) -> None:
    answer = center.client.get(
        "/api/v1/grid/task",
        params={"dag_id": "d", "task_id": "t", "map_index": "99999999999999999999"},
        headers={"Authorization": "Bearer operator-token-0123456789"},
    )
    assert answer.status_code == 422
    assert [e["loc"] for e in answer.json()["detail"]] == [["query", "map_index"]]
    check_documented(center.doc, "GET", "/api/v1/grid/task", answer)


def test_schemathesis_finds_nothing(center: InProcess) -> None:
    problems = fuzz(center, MAX_EXAMPLES)
    assert not problems, "\n".join(problems[:20])
