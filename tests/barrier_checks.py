"""The start barrier synchronises, asserted by order rather than by wall clock.

A barrier works when no component passes it (``released_at``) before the last component
of the job's current epoch has registered (``registered_at``): both times are written to
the state DB by the VJ center, on the requests of the barrier processes themselves
(:mod:`gridcore.barrier`). A spread threshold on the release times
(``barrier_skew_s <= 1.0``) cannot tell a barrier that waited from one that did not on a
fast machine, and fails a correct one on a slow one; the skew stays a reported figure
(XCom, benchmarks).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import select

from gridcore.api.server import start_in_thread
from gridcore.state.schema import coalloc_components, coalloc_jobs
from gridcore.state.store import Store, open_store


@contextmanager
def running_center(db: Store | str, host: str = "127.0.0.1") -> Iterator[str]:
    """The VJ center the components' barriers call, on ``db``'s database (a store of its
    own, on the same URL, migrated), serving from a thread of this process on ``host``;
    yields its URL and stops it (and closes its store) on exit."""
    url = db if isinstance(db, str) else db.engine.url.render_as_string(hide_password=False)
    store = open_store(url, upgrade=True)
    center = start_in_thread(store, host)
    try:
        yield center.url
    finally:
        center.stop()
        store.dispose()


def assert_released_after_every_registration(db: Store | str, job_id: int) -> None:
    """Every component of job ``job_id``'s current epoch registered and was released,
    and every release came after the last registration. ``db``: a store or its URL."""
    store = open_store(db) if isinstance(db, str) else db
    try:
        rows = _components(store, job_id)
    finally:
        if isinstance(db, str):
            store.dispose()
    assert rows, f"job {job_id} has no components in its current epoch"
    missing = [idx for idx, registered, released in rows if registered is None or released is None]
    assert not missing, f"job {job_id}: components {missing} never registered or never released"
    last_idx, last = max(((idx, reg) for idx, reg, _ in rows), key=lambda pair: pair[1])
    early = {idx: released for idx, _, released in rows if not released > last}
    assert not early, (
        f"job {job_id}: components {sorted(early)} passed the barrier at {early}, not after"
        f" component {last_idx} registered at {last}"
    )


def _components(store: Store, job_id: int) -> list[tuple[int, float | None, float | None]]:
    c = coalloc_components.c
    with store.begin() as conn:
        epoch = conn.execute(
            select(coalloc_jobs.c.epoch).where(coalloc_jobs.c.id == job_id)
        ).scalar_one()
        rows = conn.execute(
            select(c.idx, c.registered_at, c.released_at)
            .where(c.job_id == job_id, c.epoch == epoch)
            .order_by(c.idx)
        ).all()
    return [(row.idx, row.registered_at, row.released_at) for row in rows]
