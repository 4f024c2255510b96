"""An index of the parked state not released yet, read at the end of each sweep and power run.

A run parks its snapshot, findings and plan in ``gpu_cost_snapshots`` for its own later tasks: about
1 MB a run per 1,000 GPUs, 300 MB a day at one sweep every 5 minutes. The end of each sweep and power
run now empties what is older than the policy's ``sweep.keep_parked`` (``release_parked``). This
partial index holds only the rows not emptied yet, so that statement reads the few rows it empties,
not every run the store ever parked.

No row changes. Frozen: never edit it; add a revision instead.

Revision ID: 0012_parked_release
Revises: 0011_action_log_by_action
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

revision = "0012_parked_release"
down_revision = "0011_action_log_by_action"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.get_bind().exec_driver_sql(
        "CREATE INDEX IF NOT EXISTS ix_gpu_cost_snapshots_parked ON gpu_cost_snapshots (ts) WHERE payload <> ''")


def downgrade() -> None:
    raise NotImplementedError("the audit store is never migrated down")
