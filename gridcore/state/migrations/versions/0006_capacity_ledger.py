"""One capacity ledger: every holder of processors or storage bytes a row; one health table.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
