"""Indexes for what every sweep and every action reads, so their cost does not grow with the store's age.

Without them each of these read a whole history table, once per sweep or once per action:

* a run's decisions (``decisions_of_run``, every act step), with those it proposed again after a
  rolling cap held them back: ``gpu_cost_decision_log (run_id)``, ``gpu_cost_decision_events
  (run_id, status)``;
* the last day's actions the rolling caps count (every destructive start):
  ``gpu_cost_action_log (started_at)``;
* the open episodes of a track (every sweep): ``gpu_cost_escalations (track, state)``, and a
  target's (a snooze): ``gpu_cost_escalations (target)``;
* the class members another writer stored since a process last looked (every sweep):
  ``gpu_cost_class_members (data_ts)``.

No row changes. Frozen: never edit it; add a revision instead.

Revision ID: 0009_hot_path_indexes
Revises: 0008_run_history_approvals
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0009_hot_path_indexes"
down_revision = "0008_run_history_approvals"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    for name, table, cols in INDEXES:
        conn.exec_driver_sql(f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({cols})")


INDEXES = (
    ("ix_gpu_cost_decision_log_run", "gpu_cost_decision_log", "run_id"),
    ("ix_gpu_cost_decision_events_run", "gpu_cost_decision_events", "run_id, status"),
    ("ix_gpu_cost_action_log_started", "gpu_cost_action_log", "started_at"),
    ("ix_gpu_cost_escalations_open", "gpu_cost_escalations", "track, state"),
    ("ix_gpu_cost_escalations_target", "gpu_cost_escalations", "target"),
    ("ix_gpu_cost_class_members_data_ts", "gpu_cost_class_members", "data_ts"),
)


def downgrade() -> None:
    raise NotImplementedError("the audit store is never migrated down")
