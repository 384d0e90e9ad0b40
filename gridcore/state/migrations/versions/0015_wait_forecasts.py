"""The live conformal bound's forecasts (issue 22 item 5): the queue-wait history keeps,
per job seen pending, the forecast a wait model made of its wait at the first
observation that showed it (``forecast_s``, from ``forecast_at``, by the model named in
``forecast_by``), so the error of that forecast, once the job starts, is a residual for
every engine process that later rebuilds the site's model
(``gridcore.engine.wait_models``).

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gc_queue_waits") as batch:
        batch.add_column(sa.Column("forecast_s", sa.Float, nullable=True))
        batch.add_column(sa.Column("forecast_at", sa.Float, nullable=True))
        batch.add_column(sa.Column("forecast_by", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gc_queue_waits") as batch:
        batch.drop_column("forecast_by")
        batch.drop_column("forecast_at")
        batch.drop_column("forecast_s")
