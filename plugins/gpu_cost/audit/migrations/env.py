"""Alembic environment of the audit store: runs on the connection :mod:`gpu_cost.audit.migrations` hands it."""

from __future__ import annotations

from alembic import context

from gpu_cost.audit.migrations import VERSION_TABLE

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - the package always passes its connection
    raise RuntimeError("the audit store's migrations run through `gpu-cost db upgrade`, not the alembic command")

context.configure(connection=connection, version_table=VERSION_TABLE, transaction_per_migration=False)
with context.begin_transaction():
    context.run_migrations()
