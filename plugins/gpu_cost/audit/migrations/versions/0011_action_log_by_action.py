"""An index for the destructive actions of the last day, read at every destructive start, by action.

The rolling caps count the destructive actions every way in started in the last day, in the same
transaction as each destructive start (:func:`gpu_cost.act.locks.start_effect`). They were read
through every action of the day — the notices outnumber the kills many times over, and a large
cluster sends thousands a day — and filtered afterwards. ``gpu_cost_action_log (action, started_at)``
finds the day's actions of each destructive kind alone.

No row changes. Frozen: never edit it; add a revision instead.

Revision ID: 0011_action_log_by_action
Revises: 0010_usage_host_index
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0011_action_log_by_action"
down_revision = "0010_usage_host_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.get_bind().exec_driver_sql(
        "CREATE INDEX IF NOT EXISTS ix_gpu_cost_action_log_action ON gpu_cost_action_log (action, started_at)")


def downgrade() -> None:
    raise NotImplementedError("the audit store is never migrated down")
