"""The Grid page's login sessions (``gc_dashboard_sessions``): the cookie of
``gridcore serve``'s login holds a session id whose hash is kept here with its expiry,
not the operator's token (issue 21 item 11).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gc_dashboard_sessions",
        sa.Column("id_hash", sa.String(64), primary_key=True),
        sa.Column("operator", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("gc_dashboard_sessions")
