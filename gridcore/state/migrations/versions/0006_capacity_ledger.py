"""One capacity ledger: every holder of processors or storage bytes a row; one health table.

* ``gc_holds``: one row per holder (selection, component, pilot, volume, probe). The live
  selections (``gc_selections.ledger`` not NULL) and the placed, not yet started KOALA
  components (counted on the fly before) become holds; the components' processors are
  added to their sites' ``claimed`` counters so the counters stay the sums of the holds.
* ``gc_selections.ledger`` is dropped (the hold is the one source of truth).
* ``gc_sites`` gains ``storage_total``/``storage_claimed`` and the probe columns, and
  takes over ``gc_coalloc_site_health``: a site is usable only if both said so, its
  error count is the larger of the two, and a running probe is kept; then that table
  is dropped.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gc_holds",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("site", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("holder", sa.String(512), nullable=False),
        sa.Column("processors", sa.Integer, nullable=False),
        sa.Column("storage_bytes", sa.BigInteger, nullable=False),
        sa.Column("ledger", sa.String(8), nullable=True),
        sa.Column("site_job_id", sa.String(64), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("released_at", sa.Float, nullable=True),
        sa.UniqueConstraint("kind", "holder", name="uq_gc_holds_kind_holder"),
    )
    op.create_index("ix_gc_holds_site_ledger", "gc_holds", ["site", "ledger"])
    with op.batch_alter_table("gc_sites") as batch:
        batch.add_column(sa.Column("storage_total", sa.BigInteger, nullable=True))
        batch.add_column(
            sa.Column("storage_claimed", sa.BigInteger, nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("probe_job_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("probe_started_at", sa.Float, nullable=True))
    conn = op.get_bind()
    _selections_to_holds(conn)
    _placed_components_to_holds(conn)
    _merge_site_health(conn)
    op.drop_table("gc_coalloc_site_health")
    op.drop_index("ix_gc_selections_site_ledger", table_name="gc_selections")
    with op.batch_alter_table("gc_selections") as batch:
        batch.drop_column("ledger")
    with op.batch_alter_table("gc_sites") as batch:
        batch.alter_column("storage_claimed", server_default=None)


def _selections_to_holds(conn: sa.Connection) -> None:
    rows = conn.execute(
        sa.text(
            "SELECT id, site, processors, ledger, job_id, selected_at FROM gc_selections"
            " WHERE ledger IS NOT NULL"
        )
    ).all()
    if rows:
        conn.execute(
            sa.text(
                "INSERT INTO gc_holds (site, kind, holder, processors, storage_bytes, ledger,"
                " site_job_id, created_at) VALUES (:site, 'selection', :holder, :processors,"
                " 0, :ledger, :job_id, :created_at)"
            ),
            [
                {
                    "site": r.site,
                    "holder": str(r.id),
                    "processors": r.processors,
                    "ledger": r.ledger,
                    "job_id": r.job_id,
                    "created_at": r.selected_at,
                }
                for r in rows
            ],
        )


def _placed_components_to_holds(conn: sa.Connection) -> None:
    rows = conn.execute(
        sa.text(
            "SELECT c.job_id, c.epoch, c.idx, c.site, c.size FROM gc_coalloc_components c"
            " JOIN gc_sites s ON s.name = c.site WHERE c.state = 'placed'"
        )
    ).all()
    now = time.time()
    for r in rows:
        conn.execute(
            sa.text(
                "INSERT INTO gc_holds (site, kind, holder, processors, storage_bytes, ledger,"
                " created_at) VALUES (:site, 'component', :holder, :size, 0, 'claimed', :now)"
            ),
            {"site": r.site, "holder": f"{r.job_id}:{r.epoch}:{r.idx}", "size": r.size, "now": now},
        )
        conn.execute(
            sa.text("UPDATE gc_sites SET claimed = claimed + :size WHERE name = :site"),
            {"site": r.site, "size": r.size},
        )


def _merge_site_health(conn: sa.Connection) -> None:
    rows = conn.execute(
        sa.text(
            "SELECT site, consecutive_errors, usable, probe_job_id, probe_started_at"
            " FROM gc_coalloc_site_health"
        )
    ).all()
    for r in rows:
        conn.execute(
            sa.text(
                "UPDATE gc_sites SET usable = (usable AND :usable),"
                " consecutive_errors = CASE WHEN consecutive_errors > :errors"
                " THEN consecutive_errors ELSE :errors END,"
                " probe_job_id = :probe, probe_started_at = :started WHERE name = :site"
            ),
            {
                "site": r.site,
                "usable": bool(r.usable),
                "errors": r.consecutive_errors,
                "probe": r.probe_job_id,
                "started": r.probe_started_at,
            },
        )


def downgrade() -> None:
    op.create_table(
        "gc_coalloc_site_health",
        sa.Column("site", sa.String(64), primary_key=True),
        sa.Column("consecutive_errors", sa.Integer, nullable=False),
        sa.Column("usable", sa.Boolean, nullable=False),
        sa.Column("probe_job_id", sa.String(64), nullable=True),
        sa.Column("probe_started_at", sa.Float, nullable=True),
    )
    conn = op.get_bind()
    conn.execute(
        sa.text(
            "INSERT INTO gc_coalloc_site_health (site, consecutive_errors, usable,"
            " probe_job_id, probe_started_at) SELECT name, consecutive_errors, usable,"
            " probe_job_id, probe_started_at FROM gc_sites"
        )
    )
    with op.batch_alter_table("gc_selections") as batch:
        batch.add_column(sa.Column("ledger", sa.String(8), nullable=True))
    conn.execute(
        sa.text(
            "UPDATE gc_selections SET ledger = (SELECT h.ledger FROM gc_holds h"
            " WHERE h.kind = 'selection' AND h.holder = CAST(gc_selections.id AS VARCHAR(32)))"
        )
    )
    op.create_index("ix_gc_selections_site_ledger", "gc_selections", ["site", "ledger"])
    # Holds of other kinds (components, volumes, probes) have no place before 0006:
    # their processors leave the counters with them.
    conn.execute(
        sa.text(
            "UPDATE gc_sites SET claimed = claimed - COALESCE((SELECT SUM(h.processors)"
            " FROM gc_holds h WHERE h.site = gc_sites.name AND h.ledger = 'claimed'"
            " AND h.kind <> 'selection'), 0)"
        )
    )
    with op.batch_alter_table("gc_sites") as batch:
        batch.drop_column("probe_started_at")
        batch.drop_column("probe_job_id")
        batch.drop_column("storage_claimed")
        batch.drop_column("storage_total")
    op.drop_index("ix_gc_holds_site_ledger", table_name="gc_holds")
    op.drop_table("gc_holds")
