"""The VJ center, started on a state database holding two pilots of a co-reservation and
two components of a co-allocation with their tokens, and the hostile bodies every tier
probes it with (tests/unit/test_api_tokens.py on SQLite, tests/postgres/
test_api_hostile_pg.py on PostgreSQL)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import insert, select, update

from gridcore.api.server import RunningCenter, start_in_thread
from gridcore.engine.coallocation_records import request_to_json
from gridcore.engine.phases import ComponentState, JobPhase, PilotState, ReservationPhase
from gridcore.engine.pilot_pool import new_token
from gridcore.model import CoAllocationRequest, Component, RequestKind
from gridcore.state import schema
from gridcore.state.store import Store


def snapshot(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the state database (a refused request changes none)."""
    with store.begin() as conn:
        return {
            t.name: sorted((tuple(r) for r in conn.execute(select(t))), key=repr)
            for t in schema.metadata.sorted_tables
        }


@dataclass
class Center:
    store: Store
    running: RunningCenter
    client: httpx.Client
    pilot_tokens: dict[int, str]  # pilot id -> token
    component_tokens: dict[int, str]  # component index of job `koala_job` (epoch 0)
    koala_job: int

    def call(
        self, method: str, path: str, token: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        headers = kwargs.pop("headers", {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return self.client.request(method, f"/api/v1{path}", headers=headers, **kwargs)

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        return snapshot(self.store)

    def set_pilot(self, pilot_id: int, state: PilotState, **values: Any) -> None:
        with self.store.begin() as conn:
            conn.execute(
                update(schema.pilots)
                .where(schema.pilots.c.id == pilot_id)
                .values(state=state.value, **values)
            )


@contextlib.contextmanager
def started_center(store: Store) -> Iterator[Center]:
    """Two pilots of a co-reservation and two components of a co-allocation in
    ``store``, each with its token (:func:`seed`), and the center serving them (also
    used on PostgreSQL by tests/postgres/test_api_hostile_pg.py)."""
    pilot_tokens, component_tokens, koala_job = seed(store)
    running = start_in_thread(store)
    client = httpx.Client(base_url=running.url, timeout=30.0)
    try:
        yield Center(store, running, client, pilot_tokens, component_tokens, koala_job)
    finally:
        client.close()
        running.stop()
        store.dispose()


def seed(store: Store) -> tuple[dict[int, str], dict[int, str], int]:
    """Two pilots of a co-reservation and two components of a co-allocation (epoch 0)
    in ``store``: (pilot id -> token, component index -> token, the co-allocation's id)."""
    now = time.time()
    pilot_tokens: dict[int, str] = {}
    component_tokens: dict[int, str] = {}
    with store.begin() as conn:
        job = conn.execute(
            insert(schema.reservations).values(
                name="tokens",
                command="true",
                processors=2,
                vj_size=1,
                max_clusters=2,
                lifetime_floor_s=60.0,
                state=ReservationPhase.RESERVING.value,
                submitted_at=now,
            )
        ).inserted_primary_key[0]
        for i in range(2):
            token, digest = new_token()
            pid = conn.execute(
                insert(schema.pilots).values(
                    job_id=job,
                    first_job_id=job,
                    site=f"site-{i}",
                    processors=1,
                    state=PilotState.PENDING.value,
                    key=f"key-{i}",
                    token_hash=digest,
                    submitted_at=now,
                )
            ).inserted_primary_key[0]
            pilot_tokens[int(pid)] = token
        koala_job = conn.execute(
            insert(schema.coalloc_jobs).values(
                name="barrier",
                # as the engine stores it: the Grid page reads it back
                request=request_to_json(
                    CoAllocationRequest(
                        "barrier",
                        RequestKind.FIXED,
                        (Component(1, "site-0"), Component(1, "site-1")),
                    )
                ),
                command="true",
                policy="CM",
                priority="high",
                state=JobPhase.CLAIMING.value,
                epoch=0,
                L=1.0,
                submitted_at=now,
            )
        ).inserted_primary_key[0]
        for idx in range(2):
            token, digest = new_token()
            conn.execute(
                insert(schema.coalloc_components).values(
                    job_id=koala_job,
                    idx=idx,
                    epoch=0,
                    size=1,
                    site=f"site-{idx}",
                    transfer_s=0.0,
                    state=ComponentState.SUBMITTED.value,
                    token_hash=digest,
                )
            )
            component_tokens[idx] = token
    return pilot_tokens, component_tokens, int(koala_job)


# Issue 21 items 7-10: what a hostile client sent, as raw JSON text (NaN and Infinity are
# not JSON, but Python's parser on the server reads them), with a valid token.
HOSTILE_PILOT_BODIES = [
    ("register", '{"host": "h", "port": 1, "processors": NaN}', "processors"),
    ("register", '{"host": "h", "port": 1, "processors": Infinity}', "processors"),
    ("register", '{"host": "h", "port": 1e400, "processors": 1}', "port"),
    ("register", '{"host": "h", "port": true, "processors": 1}', "port"),
    ("register", '{"host": "h", "port": "40001", "processors": 1}', "port"),
    ("register", '{"host": "h", "port": 40001.0, "processors": 1}', "port"),
    ("register", '{"host": "h", "port": 40001, "processors": true}', "processors"),
    ("register", '{"host": "h", "port": 40001, "processors": 18446744073709551616}', "processors"),
    ("register", '{"host": "127.0.0.1\\u0000evil", "port": 40001, "processors": 1}', "host"),
    (
        "register",
        '{"host": "127.0.0.1\\nFORGED-LOG-LINE pilot 1 registered from 6.6.6.6",'
        ' "port": 40001, "processors": 1}',
        "host",
    ),
    ("result", '{"exit_code": NaN}', "exit_code"),
    ("result", '{"exit_code": -Infinity}', "exit_code"),
    ("result", '{"exit_code": true}', "exit_code"),
    ("result", '{"exit_code": 0, "message": "done\\u0000"}', "message"),
]


def check_hostile_pilot_body(
    center: Center, path: str, text: str, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    """422 naming ``field``, the value never echoed, no row changed, no forged log line."""
    target = min(center.pilot_tokens)
    center.set_pilot(target, PilotState.DISPATCHED, component=0, host="h", port=1)
    before = center.snapshot()
    with caplog.at_level(logging.DEBUG):
        answer = center.call(
            "POST",
            f"/pilots/{target}/{path}",
            center.pilot_tokens[target],
            content=text.encode(),
            headers={"Content-Type": "application/json"},
        )
    assert answer.status_code == 422, answer.text
    assert [field] == [e["loc"][-1] for e in answer.json()["detail"]]
    assert "input" not in answer.text  # the value is never echoed back
    assert center.snapshot() == before
    assert not any("FORGED" in r.getMessage() for r in caplog.records)
