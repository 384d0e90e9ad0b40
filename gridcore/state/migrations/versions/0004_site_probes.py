"""Probe bookkeeping for sites KOALA marked unusable.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gc_coalloc_site_health") as batch:
        batch.add_column(sa.Column("probe_job_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("probe_started_at", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gc_coalloc_site_health") as batch:
        batch.drop_column("probe_started_at")
        batch.drop_column("probe_job_id")
