"""Initial schema: sites ledger, selections, local site jobs.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gc_sites",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("total_processors", sa.Integer, nullable=False),
        sa.Column("reported_idle", sa.Integer, nullable=False),
        sa.Column("external_pending", sa.Integer, nullable=False),
        sa.Column("pending_jobs", sa.Integer, nullable=False),
        sa.Column("observed_at", sa.Float, nullable=False),
        sa.Column("claimed", sa.Integer, nullable=False),
        sa.Column("queued", sa.Integer, nullable=False),
        sa.Column("usable", sa.Boolean, nullable=False),
        sa.Column("consecutive_errors", sa.Integer, nullable=False),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("mean_queue_wait_s", sa.Float, nullable=True),
        sa.Column("mean_runtime_s", sa.Float, nullable=True),
        sa.Column("finished_jobs", sa.Integer, nullable=False),
    )
    op.create_table(
        "gc_selections",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("stream", sa.String(128), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("site", sa.String(64), nullable=False),
        sa.Column("processors", sa.Integer, nullable=False),
        sa.Column("protocol", sa.String(16), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(8), nullable=False),
        sa.Column("ledger", sa.String(8), nullable=True),
        sa.Column("reasons", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("message", sa.Text, nullable=True),
        sa.Column("selected_at", sa.Float, nullable=False),
        sa.Column("submitted_at", sa.Float, nullable=True),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
    )
    op.create_index("ix_gc_selections_site_ledger", "gc_selections", ["site", "ledger"])
    op.create_index("ix_gc_selections_state", "gc_selections", ["state"])
    op.create_table(
        "gc_local_jobs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("site", sa.String(64), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("processors", sa.Integer, nullable=False),
        sa.Column("workdir", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("pid", sa.Integer, nullable=True),
        sa.Column("pgid", sa.Integer, nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("message", sa.Text, nullable=True),
        sa.Column("submitted_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
    )
    op.create_index("ix_gc_local_jobs_site_state", "gc_local_jobs", ["site", "state"])


def downgrade() -> None:
    op.drop_table("gc_local_jobs")
    op.drop_table("gc_selections")
    op.drop_table("gc_sites")
