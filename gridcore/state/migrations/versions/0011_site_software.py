"""Each site row says what software answers for it: a Slurm site's release
(``meta.slurm.release``) and the REST API version the adapter uses (found by asking the
server), shown by ``gridcore sites`` and the Grid page. A finished selection keeps what
its job used, from the site's accounting (``usage``, JSON).

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gc_sites") as batch:
        batch.add_column(sa.Column("release", sa.String(64), nullable=True))
        batch.add_column(sa.Column("api_version", sa.String(16), nullable=True))
    with op.batch_alter_table("gc_selections") as batch:
        batch.add_column(sa.Column("usage", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gc_selections") as batch:
        batch.drop_column("usage")
    with op.batch_alter_table("gc_sites") as batch:
        batch.drop_column("api_version")
        batch.drop_column("release")
