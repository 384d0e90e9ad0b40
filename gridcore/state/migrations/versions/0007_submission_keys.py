"""Exactly-once submission: a unique key per site job (selection, component, probe).

The local site's jobs get a unique ``key`` column; ``gc_meta`` holds this database's
install id, part of every key (``gridcore.sites.keys``).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gc_local_jobs") as batch:
        batch.add_column(sa.Column("key", sa.String(128), nullable=True))
        batch.create_unique_constraint("uq_gc_local_jobs_key", ["key"])
    meta = op.create_table(
        "gc_meta",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.bulk_insert(meta, [{"name": "install_id", "value": uuid.uuid4().hex[:12]}])
    # Jobs a killed worker left half-made (a pending row whose files were never written)
    # would never start and count as queued work for ever: they end here.
    jobs = sa.table(
        "gc_local_jobs",
        sa.column("state", sa.String),
        sa.column("workdir", sa.Text),
        sa.column("message", sa.Text),
    )
    op.execute(
        jobs.update()
        .where(sa.and_(jobs.c.state == "pending", jobs.c.workdir == ""))
        .values(state="failed", message="its worker died before writing the job's files")
    )


def downgrade() -> None:
    op.drop_table("gc_meta")
    with op.batch_alter_table("gc_local_jobs") as batch:
        batch.drop_constraint("uq_gc_local_jobs_key", type_="unique")
        batch.drop_column("key")
