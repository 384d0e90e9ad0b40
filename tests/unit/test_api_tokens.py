"""Bearer tokens on every endpoint of the VJ center (issue 9 item 5): the real app on
uvicorn in a thread, against a SQLite state DB whose rows the tests write themselves.

For EVERY pilot and component endpoint: no token, a wrong token, a header that is not
a bearer token -> 401; another pilot's or component's token -> 403; and after each
refusal every row of the database is exactly as before. The same call with the right
token changes the row (so the "unchanged" check can fail). Malformed bodies -> 422
naming the field. No token ever reaches a log record (uvicorn's access log included).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gridcore.engine.phases import PilotState
from gridcore.engine.pilot_pool import new_token, token_hash, tokens_match
from gridcore.state.store import open_store
from tests.api_checks import (
    HOSTILE_PILOT_BODIES,
    Center,
    check_hostile_pilot_body,
    started_center,
)


@pytest.fixture
def center(tmp_path: Path) -> Iterator[Center]:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}", upgrade=True)
    with started_center(store) as running:
        yield running


# (method, path, json body, the target's state in which an accepted call writes)
PILOT_ENDPOINTS = {
    "register": ("POST", "register", {"host": "10.0.0.1", "port": 4000, "processors": 1}),
    "heartbeat": ("POST", "heartbeat", None),
    "work": ("GET", "work?wait=0", None),
    "started": ("POST", "started", None),
    "result": ("POST", "result", {"exit_code": 0, "message": "done"}),
}
WRITES_IN = {
    "register": PilotState.PENDING,
    "heartbeat": PilotState.HELD,
    "work": PilotState.DISPATCHED,
    "started": PilotState.DISPATCHED,
    "result": PilotState.DISPATCHED,
}
COMPONENT_ENDPOINTS = {
    "register": ("POST", "register", {"host": "10.0.0.2", "port": 4001}),
    "peers": ("GET", "peers?wait=0", None),
    "released": ("POST", "released", None),
}


def _refusals(own: str, others: list[str]) -> list[tuple[str, dict[str, str], int]]:
    """(what, headers, expected status) for every way of being refused."""
    cases = [
        ("no token", {}, 401),
        ("wrong token", {"Authorization": f"Bearer {own[::-1]}x"}, 401),
        ("bearer without a token", {"Authorization": "Bearer"}, 401),
        ("not a bearer token", {"Authorization": f"Basic {own}"}, 401),
        ("the token's hash as the token", {"Authorization": f"Bearer {token_hash(own)}"}, 401),
    ]
    cases += [
        (f"another's token #{i}", {"Authorization": f"Bearer {t}"}, 403)
        for i, t in enumerate(others)
    ]
    return cases


@pytest.mark.parametrize("endpoint", sorted(PILOT_ENDPOINTS))
def test_every_pilot_endpoint_refuses_and_changes_nothing(center: Center, endpoint: str) -> None:
    method, tail, body = PILOT_ENDPOINTS[endpoint]
    target, other = sorted(center.pilot_tokens)
    center.set_pilot(target, WRITES_IN[endpoint], component=0, host="h", port=1)
    own = center.pilot_tokens[target]
    others = [center.pilot_tokens[other], *center.component_tokens.values()]
    before = center.snapshot()
    for what, headers, status in _refusals(own, others):
        answer = center.client.request(
            method, f"/api/v1/pilots/{target}/{tail}", headers=headers, json=body
        )
        assert answer.status_code == status, (what, answer.text)
        assert own not in answer.text
        if status == 401:
            assert answer.headers["www-authenticate"] == "Bearer"
        assert center.snapshot() == before, f"{endpoint} refused ({what}) changed a row"
    # A pilot id that does not exist: its token cannot match; a real token is another's.
    missing = max(center.pilot_tokens) + 100
    assert center.call(method, f"/pilots/{missing}/{tail}", own, json=body).status_code == 403
    assert center.call(method, f"/pilots/{missing}/{tail}", "nope", json=body).status_code == 401
    assert center.snapshot() == before
    # The right token is accepted, and (for a writing call) changes the row.
    accepted = center.call(method, f"/pilots/{target}/{tail}", own, json=body)
    assert accepted.status_code == 200, accepted.text
    if endpoint != "work":
        assert center.snapshot() != before


@pytest.mark.parametrize("endpoint", sorted(COMPONENT_ENDPOINTS))
def test_every_component_endpoint_refuses_and_changes_nothing(
    center: Center, endpoint: str
) -> None:
    method, tail, body = COMPONENT_ENDPOINTS[endpoint]
    own = center.component_tokens[0]
    others = [center.component_tokens[1], *center.pilot_tokens.values()]
    path = f"/components/{center.koala_job}/0/0/{tail}"
    before = center.snapshot()
    for what, headers, status in _refusals(own, others):
        answer = center.client.request(method, f"/api/v1{path}", headers=headers, json=body)
        assert answer.status_code == status, (what, answer.text)
        assert own not in answer.text
        assert center.snapshot() == before, f"{endpoint} refused ({what}) changed a row"
    # Component 0's token opens neither component 1 nor another job's component 0.
    for elsewhere in (f"/components/{center.koala_job}/0/1/{tail}", f"/components/999/0/0/{tail}"):
        assert center.call(method, elsewhere, own, json=body).status_code == 403
    assert center.snapshot() == before
    accepted = center.call(method, path, own, json=body)
    assert accepted.status_code == 200, accepted.text
    if endpoint != "peers":
        assert center.snapshot() != before


def test_a_token_in_the_url_opens_nothing(center: Center) -> None:
    target = min(center.pilot_tokens)
    own = center.pilot_tokens[target]
    answer = center.client.get(f"/api/v1/pilots/{target}/work", params={"wait": 0, "token": own})
    assert answer.status_code == 401
    answer = center.client.get(
        f"/api/v1/pilots/{target}/work", params={"wait": 0, "access_token": own}
    )
    assert answer.status_code == 401


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("register", {"port": 4000, "processors": 1}, "host"),
        ("register", {"host": "", "port": 4000, "processors": 1}, "host"),
        ("register", {"host": "h", "port": 0, "processors": 1}, "port"),
        ("register", {"host": "h", "port": 70000, "processors": 1}, "port"),
        ("register", {"host": "h", "port": "four", "processors": 1}, "port"),
        ("register", {"host": "h", "port": 4000, "processors": 0}, "processors"),
        ("register", {"host": "h", "port": 4000}, "processors"),
        ("register", {"host": "h", "port": 4000, "processors": 1, "token": "x"}, "token"),
        ("result", {"message": "no code"}, "exit_code"),
        ("result", {"exit_code": "zero"}, "exit_code"),
        ("result", {"exit_code": 0, "message": "x" * 5000}, "message"),
    ],
)
def test_malformed_pilot_bodies_get_422_naming_the_field(
    center: Center, path: str, body: dict[str, Any], field: str
) -> None:
    target = min(center.pilot_tokens)
    center.set_pilot(target, PilotState.DISPATCHED, component=0, host="h", port=1)
    before = center.snapshot()
    answer = center.call("POST", f"/pilots/{target}/{path}", center.pilot_tokens[target], json=body)
    assert answer.status_code == 422, answer.text
    assert [field] == [e["loc"][-1] for e in answer.json()["detail"]]
    assert center.snapshot() == before


@pytest.mark.parametrize(
    ("body", "field"),
    [({"port": 4000}, "host"), ({"host": "h", "port": -1}, "port"), ({"host": "h"}, "port")],
)
def test_malformed_component_bodies_get_422_naming_the_field(
    center: Center, body: dict[str, Any], field: str
) -> None:
    before = center.snapshot()
    path = f"/components/{center.koala_job}/0/0/register"
    answer = center.call("POST", path, center.component_tokens[0], json=body)
    assert answer.status_code == 422, answer.text
    assert [field] == [e["loc"][-1] for e in answer.json()["detail"]]
    assert center.snapshot() == before


def test_a_body_that_is_not_json_gets_422(center: Center) -> None:
    target = min(center.pilot_tokens)
    answer = center.call(
        "POST",
        f"/pilots/{target}/register",
        center.pilot_tokens[target],
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 422


def test_bad_path_ids_and_wait_get_422(center: Center) -> None:
    target = min(center.pilot_tokens)
    token = center.pilot_tokens[target]
    assert center.call("POST", "/pilots/abc/heartbeat", token).status_code == 422
    assert center.call("GET", f"/pilots/{target}/work?wait=-1", token).status_code == 422


def test_no_token_reaches_a_log_record(center: Center, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    tokens = [*center.pilot_tokens.values(), *center.component_tokens.values()]
    first, second = sorted(center.pilot_tokens)
    for pid in (first, second):
        body = {"host": "127.0.0.1", "port": 4000 + pid, "processors": 1}
        assert center.call("POST", f"/pilots/{pid}/register", center.pilot_tokens[pid], json=body)
    token = center.pilot_tokens[first]
    assert center.call("GET", f"/pilots/{first}/work?wait=0", token).json()["action"] == "run"
    center.call("POST", f"/pilots/{first}/heartbeat", center.pilot_tokens[second])  # 403
    center.call("POST", f"/pilots/{first}/heartbeat", token + "x")  # 401
    center.call("POST", f"/pilots/{first}/result", token, json={"exit_code": "bad"})  # 422
    center.call("POST", f"/pilots/{first}/result", token, json={"exit_code": 0})
    path = f"/components/{center.koala_job}/0/0/register"
    center.call("POST", path, center.component_tokens[0], json={"host": "h", "port": 9})
    center.call("POST", path, center.component_tokens[1], json={"host": "h", "port": 9})  # 403
    records = [r for r in caplog.records if r.name.startswith(("uvicorn", "gridcore"))]
    access = [r.getMessage() for r in records if r.name == "uvicorn.access"]
    assert any("/heartbeat" in line and "403" in line for line in access), access
    assert any("registered" in r.getMessage() for r in records)
    for record in caplog.records:
        text = record.getMessage() + repr(record.args) + (record.exc_text or "")
        for t in tokens:
            assert t not in text, f"a token in a log record of {record.name}"
            assert token_hash(t) not in text


def test_tokens_are_stored_hashed_and_compared_in_constant_time() -> None:
    token, digest = new_token()
    assert len(token) >= 43 and digest == token_hash(token) and token not in digest
    assert tokens_match(token, digest)
    assert not tokens_match(token + "x", digest)
    assert not tokens_match(token, None)
    assert new_token()[0] != token


def test_health_needs_no_token(center: Center) -> None:
    assert center.client.get("/api/v1/health").json() == {"status": "ok"}


@pytest.mark.parametrize(("path", "text", "field"), HOSTILE_PILOT_BODIES)
def test_hostile_pilot_bodies_get_422_naming_the_field_and_change_nothing(
    center: Center, path: str, text: str, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    check_hostile_pilot_body(center, path, text, field, caplog)


@pytest.mark.parametrize(
    "text",
    [
        '{"host": "h", "port": NaN}',
        '{"host": "h", "port": true}',
        '{"host": "h\\u0000", "port": 4000}',
        '{"host": "h h", "port": 4000}',
    ],
)
def test_hostile_component_bodies_get_422_and_change_nothing(center: Center, text: str) -> None:
    before = center.snapshot()
    answer = center.call(
        "POST",
        f"/components/{center.koala_job}/0/0/register",
        center.component_tokens[0],
        content=text.encode(),
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 422, answer.text
    assert center.snapshot() == before


@pytest.mark.parametrize("shape", ["{id}.0", "%20{id}", "{id}%20", "+{id}", "0{id}", "{id}e0"])
def test_a_path_id_is_plain_digits_only(center: Center, shape: str) -> None:
    target = min(center.pilot_tokens)
    token = center.pilot_tokens[target]
    before = center.snapshot()
    path_id = shape.format(id=target)
    assert center.call("POST", f"/pilots/{path_id}/heartbeat", token).status_code == 422
    component = shape.format(id=center.koala_job)
    answer = center.call(
        "POST", f"/components/{component}/0/0/released", center.component_tokens[0]
    )
    assert answer.status_code == 422
    assert center.snapshot() == before


def test_a_path_id_up_to_the_columns_range_is_read(center: Center) -> None:
    token = center.pilot_tokens[min(center.pilot_tokens)]
    # a pilot the database does not have: refused by its token, not by its id's form
    assert center.call("POST", f"/pilots/{2**31 - 1}/heartbeat", token).status_code == 403
    assert center.call("POST", f"/pilots/{2**31}/heartbeat", token).status_code == 422


def test_an_ipv6_host_and_a_multi_line_message_are_still_accepted(center: Center) -> None:
    target = min(center.pilot_tokens)
    token = center.pilot_tokens[target]
    body = {"host": "[fe80::1%eth0]", "port": 40001, "processors": 1}
    assert center.call("POST", f"/pilots/{target}/register", token, json=body).status_code == 200
    center.set_pilot(target, PilotState.DISPATCHED, component=0, host="h", port=1)
    result = {"exit_code": 0, "message": "line one\nline two\ttab"}
    assert center.call("POST", f"/pilots/{target}/result", token, json=result).status_code == 200
