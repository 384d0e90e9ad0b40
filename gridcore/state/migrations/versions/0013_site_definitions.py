"""Which grid files define each site (``gc_site_definitions``): a site name is one site
per state database, so grid files that describe it differently are refused instead of
rewriting each other's row, the storage limit in force is the smallest of the files in
use, and a site no file uses any more is shown as retired (issue 21 item 4). A site row
keeps when its last error happened (``last_error_at``), so "marked unusable" can say
when and why (item 5).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gc_sites") as batch:
        batch.add_column(sa.Column("last_error_at", sa.Float, nullable=True))
    op.create_table(
        "gc_site_definitions",
        sa.Column("site", sa.String(64), nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("processors", sa.Integer, nullable=False),
        sa.Column("url", sa.Text, nullable=True),
        sa.Column("partition", sa.String(256), nullable=True),
        sa.Column("storage_total", sa.BigInteger, nullable=True),
        sa.Column("used_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("site", "source", name="pk_gc_site_definitions"),
    )


def downgrade() -> None:
    op.drop_table("gc_site_definitions")
    with op.batch_alter_table("gc_sites") as batch:
        batch.drop_column("last_error_at")
