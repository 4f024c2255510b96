"""Runs become append-only history; approvals count only from approval events.

* ``gpu_cost_runs`` → ``gpu_cost_run_log`` (what a run is: its DAG, start, data instant, source,
  mode; written once) + ``gpu_cost_run_events`` (every later status change: awaiting an approval,
  finished with its problems and counts; appended). ``gpu_cost_runs`` becomes a view of the current
  state with the columns the table had (the latest event wins, by ``event_id``; none yet: ``running``).
  Every existing run is kept: its columns go to the log, its status, end, problems and counts
  become one first event.
* ``gpu_cost_decisions``: a decision's approval comes from its approval events only; the log's
  ``approval_status`` counts only as ``pending`` (what the agent decided). On PostgreSQL the agent's
  role may insert status events but no approval event (``include/sql/grants.postgresql.sql``): an
  approval is written by the approver's role (connection ``gpu_cost_db_approver``), so a log row
  written "approved" by the agent is not an approval either.

The DDL below is a frozen copy of the head at this revision (``include/sql/schema.*.sql`` describe
the current head). Frozen: never edit it; add a revision instead.

Revision ID: 0008_run_history_approvals
Revises: 0007_rightsize
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0008_run_history_approvals"
down_revision = "0007_rightsize"
branch_labels = None
depends_on = None

_LOG_COLS = "run_id, dag_id, started_at, data_ts, source, mode"


def upgrade() -> None:
    conn = op.get_bind()
    sqlite = conn.dialect.name == "sqlite"
    run = conn.exec_driver_sql
    ts, event_id, now = (("TEXT", "INTEGER PRIMARY KEY AUTOINCREMENT", "(strftime('%Y-%m-%dT%H:%M:%SZ', 'now'))")
                         if sqlite else ("TIMESTAMPTZ", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "now()"))
    for stmt in RUN_TABLES.format(ts=ts, event_id=event_id, now=now).split(";"):
        if stmt.strip():
            run(stmt)
    run(f"INSERT INTO gpu_cost_run_log ({_LOG_COLS}) SELECT {_LOG_COLS} FROM gpu_cost_runs")
    run("INSERT INTO gpu_cost_run_events (run_id, status, finished_at, problems, counts) "
        "SELECT run_id, status, finished_at, problems, counts FROM gpu_cost_runs ORDER BY started_at, run_id")
    run("DROP TABLE gpu_cost_runs")
    run(RUNS_VIEW)
    if sqlite:
        run("DROP VIEW gpu_cost_decisions")
        run(DECISIONS_VIEW.format(create="CREATE VIEW"))
    else:
        run(DECISIONS_VIEW.format(create="CREATE OR REPLACE VIEW"))


def downgrade() -> None:
    raise NotImplementedError("the audit store is never migrated down")


RUN_TABLES = """
CREATE TABLE IF NOT EXISTS gpu_cost_run_log (
    run_id          TEXT PRIMARY KEY,
    dag_id          TEXT,
    started_at      {ts} NOT NULL,
    data_ts         {ts},
    source          TEXT,
    mode            TEXT
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_run_log_dag ON gpu_cost_run_log (dag_id, started_at);
CREATE TABLE IF NOT EXISTS gpu_cost_run_events (
    event_id        {event_id},
    run_id          TEXT NOT NULL,
    ts              {ts} NOT NULL DEFAULT {now},
    status          TEXT NOT NULL,
    finished_at     {ts},
    problems        TEXT,
    counts          TEXT
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_run_events_run ON gpu_cost_run_events (run_id, event_id)
"""

RUNS_VIEW = """
CREATE VIEW gpu_cost_runs AS
SELECT l.run_id, l.dag_id, l.started_at, e.finished_at, l.data_ts, l.source, l.mode,
       COALESCE(e.status, 'running') AS status, e.problems, e.counts
FROM gpu_cost_run_log l
LEFT JOIN gpu_cost_run_events e ON e.event_id = (
    SELECT MAX(x.event_id) FROM gpu_cost_run_events x WHERE x.run_id = l.run_id)"""

DECISIONS_VIEW = """
{create} gpu_cost_decisions AS
SELECT l.decision_id, l.run_id, l.ts, l.rule, l.target_kind, l.target, l.action, l.mode, l.rung, l.episode,
       l.job_id, l.user_name, l.account, l.partition_name, l.host, l.gpus, l.reason, l.protection,
       l.requires_approval,
       COALESCE(a.approval_status, CASE WHEN l.approval_status = 'pending' THEN l.approval_status END)
           AS approval_status,
       a.approved_by, a.approved_at,
       COALESCE(s.status, l.status) AS status,
       l.gpu_hours_at_risk, l.gpu_hours_saved, l.evidence
FROM gpu_cost_decision_log l
LEFT JOIN gpu_cost_decision_events s ON s.event_id = (
    SELECT MAX(e.event_id) FROM gpu_cost_decision_events e WHERE e.decision_id = l.decision_id AND e.status IS NOT NULL)
LEFT JOIN gpu_cost_decision_events a ON a.event_id = (
    SELECT MAX(e.event_id) FROM gpu_cost_decision_events e
    WHERE e.decision_id = l.decision_id AND e.approval_status IS NOT NULL)"""
