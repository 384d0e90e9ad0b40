"""The capacity ledger checked at the end of a concurrency or fault test (issue 7, Tests).

:func:`assert_capacity_invariant` asserts :func:`gridcore.state.capacity.check_invariant`
(every site's counters equal the sums of its live holds, nothing negative, storage
within its limit) and, when the test ended with every job finished, that no hold is left
live: a finished job, a cancelled one or a failed one gives all its capacity back. (A
staged volume's hold is not a job's: it lasts while its replica is registered.)
"""

from __future__ import annotations

from gridcore.model import HolderKind
from gridcore.state import capacity
from gridcore.state.store import Store, open_store


def assert_capacity_invariant(db: Store | str, *, no_live_holds: bool = False) -> None:
    """``db``: a store or its URL (a store a subprocess or an Airflow task wrote to).
    ``no_live_holds``: every job has finished, so no hold but a staged volume's may
    still be live."""
    store = open_store(db) if isinstance(db, str) else db
    try:
        with store.begin() as conn:
            violations = capacity.check_invariant(conn)
            live = [
                h
                for h in (capacity.live_holds(conn) if no_live_holds else [])
                if h.kind != HolderKind.VOLUME
            ]
    finally:
        if isinstance(db, str):
            store.dispose()
    assert violations == [], f"capacity invariant violated: {violations}"
    assert live == [], f"holds left live after every job finished: {live}"
