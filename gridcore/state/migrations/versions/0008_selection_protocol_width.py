"""gc_selections.protocol holds every protocol's name: ``earliest-completion`` (19
characters, the operators' default) did not fit VARCHAR(16) on PostgreSQL.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gc_selections") as batch:
        batch.alter_column(
            "protocol", existing_type=sa.String(16), type_=sa.String(32), existing_nullable=False
        )


def downgrade() -> None:
    with op.batch_alter_table("gc_selections") as batch:
        batch.alter_column(
            "protocol", existing_type=sa.String(32), type_=sa.String(16), existing_nullable=False
        )
