"""The local site's jobs count their spawn attempts: a job whose spawning worker died is
fenced by its attempt number and started again, never run twice (``gridcore.sites.local``).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gc_local_jobs") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("gc_local_jobs") as batch:
        batch.drop_column("attempt")
