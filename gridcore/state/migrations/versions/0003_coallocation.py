"""KOALA co-allocation: jobs, components, per-site component errors, leases.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gc_coalloc_jobs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("request", sa.Text, nullable=False),
        sa.Column("command", sa.Text, nullable=False),
        sa.Column("policy", sa.String(8), nullable=False),
        sa.Column("quota", sa.Float, nullable=True),
        sa.Column("priority", sa.String(8), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("placement_tries", sa.Integer, nullable=False),
        sa.Column("claim_tries", sa.Integer, nullable=False),
        sa.Column("L", sa.Float, nullable=False),
        sa.Column("jpt", sa.Float, nullable=True),
        sa.Column("ftt", sa.Float, nullable=True),
        sa.Column("jst", sa.Float, nullable=True),
        sa.Column("jct", sa.Float, nullable=True),
        sa.Column("placement", sa.Text, nullable=True),
        sa.Column("submitted_at", sa.Float, nullable=False),
        sa.Column("placed_at", sa.Float, nullable=True),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("message", sa.Text, nullable=True),
        sa.Column("retries", sa.Integer, nullable=False),
    )
    op.create_index("ix_gc_coalloc_jobs_state", "gc_coalloc_jobs", ["state"])
    op.create_table(
        "gc_coalloc_components",
        sa.Column("job_id", sa.Integer, nullable=False),
        sa.Column("idx", sa.Integer, nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("site", sa.String(64), nullable=False),
        sa.Column("file_site", sa.String(64), nullable=True),
        sa.Column("transfer_s", sa.Float, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("site_job_id", sa.String(64), nullable=True),
        sa.Column("claimed_at", sa.Float, nullable=True),
        sa.Column("registered_at", sa.Float, nullable=True),
        sa.Column("released_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("host", sa.String(255), nullable=True),
        sa.Column("port", sa.Integer, nullable=True),
        sa.Column("message", sa.Text, nullable=True),
        sa.PrimaryKeyConstraint("job_id", "idx", name="pk_gc_coalloc_components"),
    )
    op.create_table(
        "gc_coalloc_site_health",
        sa.Column("site", sa.String(64), primary_key=True),
        sa.Column("consecutive_errors", sa.Integer, nullable=False),
        sa.Column("usable", sa.Boolean, nullable=False),
    )
    op.create_table(
        "gc_leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(256), nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("scans", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("gc_leases")
    op.drop_table("gc_coalloc_site_health")
    op.drop_table("gc_coalloc_components")
    op.drop_index("ix_gc_coalloc_jobs_state", table_name="gc_coalloc_jobs")
    op.drop_table("gc_coalloc_jobs")
