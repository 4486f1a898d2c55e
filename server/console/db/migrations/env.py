"""Alembic's environment: always called from `database.migrate`, which hands over a connection."""
from __future__ import annotations

from alembic import context

from ..schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
