"""An index for the GPU model of a host, read at every saving, so its cost does not grow with the cluster.

A kill's saving is priced by the GPU model of its host, read from the last two days of the usage
record (``gpu_models_of_host``). The usage table's key starts with the instant, so the read went
through every host's rows of those two days — each sweep writes a row per host, model and owner:
on a 1,000-GPU trace the read took 3.5 ms after one day and 7.6 ms after three, and grows with
the hosts. ``gpu_cost_usage (host, ts)`` finds the host's rows alone.

No row changes. Frozen: never edit it; add a revision instead.

Revision ID: 0010_usage_host_index
Revises: 0009_hot_path_indexes
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0010_usage_host_index"
down_revision = "0009_hot_path_indexes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.get_bind().exec_driver_sql("CREATE INDEX IF NOT EXISTS ix_gpu_cost_usage_host ON gpu_cost_usage (host, ts)")


def downgrade() -> None:
    raise NotImplementedError("the audit store is never migrated down")
