"""Replica catalog and measured transfer rates (gridcore.staging).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gc_replicas",
        sa.Column("logical_name", sa.String(512), nullable=False),
        sa.Column("site", sa.String(64), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("checksum", sa.String(80), nullable=False),
        sa.Column("registered_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("logical_name", "site", name="pk_gc_replicas"),
    )
    op.create_table(
        "gc_transfer_rates",
        sa.Column("src", sa.String(64), nullable=False),
        sa.Column("dst", sa.String(64), nullable=False),
        sa.Column("mean_mbps", sa.Float, nullable=False),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("src", "dst", name="pk_gc_transfer_rates"),
    )


def downgrade() -> None:
    op.drop_table("gc_transfer_rates")
    op.drop_table("gc_replicas")
