"""Fenced scan lease (a token every scan transition checks) and per-job handling errors.

``gc_leases.token`` grows each time the lease changes hands (or is taken again after it
expired); a scan's transitions commit only while the token it took is still the row's.
``gc_coalloc_jobs.handling_errors`` counts unexpected errors while handling one job, so a
job that keeps failing is failed instead of stopping every scan.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gc_leases") as batch:
        batch.add_column(sa.Column("token", sa.Integer, nullable=False, server_default="0"))
    with op.batch_alter_table("gc_coalloc_jobs") as batch:
        batch.add_column(
            sa.Column("handling_errors", sa.Integer, nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("gc_coalloc_jobs") as batch:
        batch.drop_column("handling_errors")
    with op.batch_alter_table("gc_leases") as batch:
        batch.drop_column("token")
