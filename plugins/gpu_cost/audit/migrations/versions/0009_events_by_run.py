"""A run's decisions found by index: ``gpu_cost_decision_log (run_id)`` and
``gpu_cost_decision_events (run_id, status)``.

A run's decisions (the ``decisions_of_run`` query) include those it proposed again after a
rolling cap held them back: decisions with a ``decided`` event of the run. Without these
indexes that read scanned every decision and every event once per act step, a cost that grows
with the store's age; with them it is two lookups. No row changes. Frozen: never edit it; add a revision instead.

Revision ID: 0009_events_by_run
Revises: 0008_run_history_approvals
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0009_events_by_run"
down_revision = "0008_run_history_approvals"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    conn.exec_driver_sql("CREATE INDEX IF NOT EXISTS ix_gpu_cost_decision_log_run ON gpu_cost_decision_log (run_id)")
    conn.exec_driver_sql("CREATE INDEX IF NOT EXISTS ix_gpu_cost_decision_events_run "
                         "ON gpu_cost_decision_events (run_id, status)")


def downgrade() -> None:
    raise NotImplementedError("the audit store is never migrated down")
