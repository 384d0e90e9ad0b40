"""Migration 0006 carries the state over to the one ledger and the one health table: live
selections become holds, placed (not started) components become claimed holds counted
in their sites' counters, KOALA's site health merges into gc_sites; the invariant holds
after the upgrade and after a downgrade-upgrade round trip."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text

from gridcore.engine import health
from gridcore.state import capacity
from gridcore.state.capacity import HolderKind, Ledger
from gridcore.state.store import Store, open_store


def migrate(store: Store, revision: str, *, down: bool = False) -> None:
    ini = resources.files("gridcore.state.migrations").joinpath("alembic.ini")
    cfg = Config(str(ini))
    cfg.set_main_option("script_location", str(Path(str(ini)).parent))
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)


SITES = """INSERT INTO gc_sites (name, kind, total_processors, reported_idle, external_pending,
    pending_jobs, observed_at, claimed, queued, usable, consecutive_errors, finished_jobs)
    VALUES (:name, 'local', 8, 8, 0, 0, 1.0, :claimed, :queued, :usable, :errors, 0)"""
SELECTION = """INSERT INTO gc_selections (id, stream, name, site, processors, protocol, mode,
    outcome, ledger, reasons, state, job_id, selected_at)
    VALUES (:id, 's', :name, :site, :procs, 'stateful', 'best', 'fit', :ledger, '[]',
    'pending', :job, 2.0)"""
JOB = """INSERT INTO gc_coalloc_jobs (id, name, request, command, policy, priority, state,
    epoch, placement_tries, claim_tries, "L", submitted_at, retries)
    VALUES (7, 'co', '{}', 'true', 'WF', 'low', 'claiming', 2, 0, 0, 0.75, 1.0, 0)"""
COMPONENT = """INSERT INTO gc_coalloc_components (job_id, idx, epoch, size, site, transfer_s,
    state) VALUES (7, :idx, 2, :size, :site, 0.0, :state)"""
HEALTH = """INSERT INTO gc_coalloc_site_health (site, consecutive_errors, usable, probe_job_id,
    probe_started_at) VALUES (:site, :errors, :usable, :probe, :started)"""


def test_0006_carries_selections_components_and_health_over(tmp_path: Path) -> None:
    check_0006_carries_state_over(open_store(f"sqlite:///{tmp_path}/state.db"))


def check_0006_carries_state_over(store: Store) -> None:
    """Also run on PostgreSQL (tests/postgres/test_capacity_migration_pg.py)."""
    migrate(store, "0005")
    with store.engine.begin() as conn:
        conn.execute(
            text(SITES),
            [
                {"name": "a", "claimed": 3, "queued": 2, "usable": True, "errors": 1},
                {"name": "b", "claimed": 0, "queued": 0, "usable": True, "errors": 0},
            ],
        )
        conn.execute(
            text(SELECTION),
            [
                {"id": 1, "name": "m1", "site": "a", "procs": 3, "ledger": "claimed", "job": "41"},
                {"id": 2, "name": "m2", "site": "a", "procs": 2, "ledger": "queued", "job": None},
                {"id": 3, "name": "m3", "site": "a", "procs": 5, "ledger": None, "job": "43"},
            ],
        )
        conn.execute(text(JOB))
        conn.execute(
            text(COMPONENT),
            [
                {"idx": 0, "size": 4, "site": "b", "state": "placed"},
                {"idx": 1, "size": 2, "site": "a", "state": "submitted"},
            ],
        )
        conn.execute(
            text(HEALTH),
            [
                {"site": "a", "errors": 3, "usable": False, "probe": "99", "started": 5.0},
                {"site": "b", "errors": 1, "usable": True, "probe": None, "started": None},
            ],
        )
    migrate(store, "head")
    with store.begin() as conn:
        assert capacity.check_invariant(conn) == []
        held = {(h.kind, h.holder): (h.site, h.processors, h.ledger, h.site_job_id) for h in
                capacity.live_holds(conn)}  # fmt: skip
        usage = capacity.usage(conn)
        states = health.read_health(conn)
    assert held == {
        (HolderKind.SELECTION, "1"): ("a", 3, Ledger.CLAIMED, "41"),
        (HolderKind.SELECTION, "2"): ("a", 2, Ledger.QUEUED, None),
        (HolderKind.COMPONENT, "7:2:0"): ("b", 4, Ledger.CLAIMED, None),
    }
    assert (usage["a"].claimed, usage["a"].queued, usage["b"].claimed) == (3, 2, 4)
    assert (states["a"].usable, states["a"].consecutive_errors, states["a"].probe_job_id) == (
        False,
        3,
        "99",
    )
    assert (states["b"].usable, states["b"].consecutive_errors) == (True, 1)
    # and back: the selections' ledger column returns, the non-selection holds leave
    migrate(store, "0005", down=True)
    with store.engine.begin() as conn:
        ledgers = dict(conn.execute(text("SELECT id, ledger FROM gc_selections")).all())
        claimed = dict(conn.execute(text("SELECT name, claimed FROM gc_sites")).all())
    assert ledgers == {1: "claimed", 2: "queued", 3: None}
    assert claimed == {"a": 3, "b": 0}
    migrate(store, "head")
    with store.begin() as conn:
        assert capacity.check_invariant(conn) == []
    store.dispose()
