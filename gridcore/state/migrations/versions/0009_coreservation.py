"""VJM co-reservation: reservations, their pilots (virtual jobs), the shifts between
jobs, the queue-wait history of every site (Eq. 1), and a token hash per co-allocation
component (its start barrier moves onto the HTTP API).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gc_coalloc_components") as batch:
        batch.add_column(sa.Column("token_hash", sa.String(128), nullable=True))
    op.create_table(
        "gc_reservations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("command", sa.Text, nullable=False),
        sa.Column("processors", sa.Integer, nullable=False),
        sa.Column("vj_size", sa.Integer, nullable=False),
        sa.Column("max_clusters", sa.Integer, nullable=False),
        sa.Column("lifetime_floor_s", sa.Float, nullable=False),
        sa.Column("workdir", sa.Text, nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("submitted_at", sa.Float, nullable=False),
        sa.Column("lifetime_s", sa.Float, nullable=True),
        sa.Column("deadline_at", sa.Float, nullable=True),
        sa.Column("selection", sa.Text, nullable=True),
        sa.Column("held_at", sa.Float, nullable=True),
        sa.Column("dispatched_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("message", sa.Text, nullable=True),
        sa.Column("reorganizations", sa.Integer, nullable=False, default=0, server_default="0"),
        sa.Column("substitutes", sa.Integer, nullable=False, default=0, server_default="0"),
        sa.Column("handling_errors", sa.Integer, nullable=False, default=0, server_default="0"),
    )
    op.create_table(
        "gc_pilots",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer, nullable=False),
        sa.Column("first_job_id", sa.Integer, nullable=False),
        sa.Column("site", sa.String(64), nullable=False),
        sa.Column("processors", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("token_hash", sa.String(128), nullable=False),
        sa.Column("site_job_id", sa.String(64), nullable=True),
        sa.Column("t_avail", sa.Float, nullable=True),
        sa.Column("submitted_at", sa.Float, nullable=False),
        sa.Column("registered_at", sa.Float, nullable=True),
        sa.Column("heartbeat_at", sa.Float, nullable=True),
        sa.Column("host", sa.String(255), nullable=True),
        sa.Column("port", sa.Integer, nullable=True),
        sa.Column("component", sa.Integer, nullable=True),
        sa.Column("dispatched_at", sa.Float, nullable=True),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("message", sa.Text, nullable=True),
        sa.UniqueConstraint("key", name="uq_gc_pilots_key"),
    )
    op.create_table(
        "gc_reservation_shifts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("step", sa.String(32), nullable=False),
        sa.Column("from_job", sa.Integer, nullable=False),
        sa.Column("to_job", sa.Integer, nullable=True),
        sa.Column("site", sa.String(64), nullable=False),
        sa.Column("pilot_id", sa.Integer, nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
    )
    op.create_table(
        "gc_queue_waits",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("site", sa.String(64), nullable=False),
        sa.Column("site_job_id", sa.String(64), nullable=False),
        sa.Column("external", sa.Boolean, nullable=False),
        sa.Column("submitted_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("seen_at", sa.Float, nullable=False),
        sa.UniqueConstraint("site", "site_job_id", name="uq_gc_queue_waits_site_job"),
    )
    op.create_index("ix_gc_reservations_state", "gc_reservations", ["state"])
    op.create_index("ix_gc_pilots_job_state", "gc_pilots", ["job_id", "state"])
    op.create_index("ix_gc_queue_waits_site_started", "gc_queue_waits", ["site", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_gc_reservations_state", table_name="gc_reservations")
    op.drop_index("ix_gc_pilots_job_state", table_name="gc_pilots")
    op.drop_index("ix_gc_queue_waits_site_started", table_name="gc_queue_waits")
    op.drop_table("gc_queue_waits")
    op.drop_table("gc_reservation_shifts")
    op.drop_table("gc_pilots")
    op.drop_table("gc_reservations")
    with op.batch_alter_table("gc_coalloc_components") as batch:
        batch.drop_column("token_hash")
