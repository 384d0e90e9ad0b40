"""Alembic environment: the connection is handed over by gridcore.state.store.upgrade_db
(or built from GRIDCORE_DB_URL when alembic is run by hand)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from gridcore.state.schema import metadata
from gridcore.state.store import default_db_url

config = context.config
connection = config.attributes.get("connection")

if connection is not None:
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(default_db_url())
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=metadata)
        with context.begin_transaction():
            context.run_migrations()
