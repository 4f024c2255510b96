"""The policy each run decided under: ``gpu_cost_run_policies`` (INSERT only, one row per run).

Frozen: never edit it; add a revision instead.

Revision ID: 0003_run_policies
Revises: 0002_event_history
Create Date: 2026-05-01
"""

from __future__ import annotations

from alembic import op

revision = "0003_run_policies"
down_revision = "0002_event_history"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    conn.exec_driver_sql(DDL.format(ts="TEXT" if conn.dialect.name == "sqlite" else "TIMESTAMPTZ"))


def downgrade() -> None:
    raise NotImplementedError("the audit store is never migrated down")


DDL = """
CREATE TABLE IF NOT EXISTS gpu_cost_run_policies (
    run_id          TEXT PRIMARY KEY,
    name            TEXT NOT NULL,
    sha256          TEXT NOT NULL,
    content         TEXT NOT NULL,
    pinned_at       {ts} NOT NULL
)"""
