"""Alembic's environment: always called from `database.migrate`, which hands over a connection."""
from __future__ import annotations

from alembic import context

# Alembic runs this file on its own, outside the package: database.migrate hands over the
# connection and the schema's metadata (whatever name the package runs under).
connection = context.config.attributes["connection"]
metadata = context.config.attributes["metadata"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
