"""What the live wait models read (issue 22 item 5): each site row keeps its latest
stored observation's queue (``queue``, JSON: running and pending jobs with processors,
submit and start times, time limits, users and Slurm's start estimates), and the
queue-wait history keeps per job its size, user, time limit and, once seen finished, its
end, so a site's wait model can be rebuilt from the history
(``gridcore.engine.wait_models``).

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gc_sites") as batch:
        batch.add_column(sa.Column("queue", sa.Text, nullable=True))
    with op.batch_alter_table("gc_queue_waits") as batch:
        batch.add_column(sa.Column("processors", sa.Integer, nullable=True))
        batch.add_column(sa.Column("owner", sa.String(128), nullable=True))
        batch.add_column(sa.Column("time_limit_s", sa.Float, nullable=True))
        batch.add_column(sa.Column("ended_at", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gc_queue_waits") as batch:
        batch.drop_column("ended_at")
        batch.drop_column("time_limit_s")
        batch.drop_column("owner")
        batch.drop_column("processors")
    with op.batch_alter_table("gc_sites") as batch:
        batch.drop_column("queue")
