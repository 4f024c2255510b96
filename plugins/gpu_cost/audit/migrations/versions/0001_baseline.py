"""Baseline: the audit store's schema as it shipped before migrations (tables created if missing).

A store created by an earlier version already has these tables: this revision then changes nothing
and only records that the store is at the baseline. Frozen: never edit it; add a revision instead.

Revision ID: 0001_baseline
Revises:
Create Date: 2026-05-01
"""

from __future__ import annotations

from alembic import op

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    ddl = SQLITE if conn.dialect.name == "sqlite" else POSTGRESQL
    text = "\n".join(line.split("--", 1)[0] for line in ddl.splitlines())
    for stmt in (s.strip() for s in text.split(";")):
        if stmt:
            conn.exec_driver_sql(stmt)


def downgrade() -> None:
    raise NotImplementedError("the audit store is never migrated down")


SQLITE = """
-- Audit store schema, SQLite dialect. Table names are a contract; columns may grow.
-- Times are ISO 8601 UTC text ("2026-11-29T15:00:00Z"), so they sort and compare as text.
-- Nothing is ever deleted: decisions and actions are appended, actions updated once on completion.

CREATE TABLE IF NOT EXISTS gpu_cost_runs (
    run_id          TEXT PRIMARY KEY,
    dag_id          TEXT,
    started_at      TEXT NOT NULL,
    finished_at     TEXT,
    data_ts         TEXT,
    source          TEXT,
    mode            TEXT,
    status          TEXT NOT NULL DEFAULT 'running',   -- running | awaiting_approval | ok | degraded | failed | capped
    problems        TEXT,                              -- JSON list
    counts          TEXT                               -- JSON object
);

CREATE TABLE IF NOT EXISTS gpu_cost_snapshots (
    run_id          TEXT PRIMARY KEY,
    ts              TEXT NOT NULL,
    payload         TEXT NOT NULL                      -- Snapshot JSON
);

CREATE TABLE IF NOT EXISTS gpu_cost_decisions (
    decision_id     TEXT PRIMARY KEY,                  -- hash of (rule, target, episode, rung)
    run_id          TEXT,
    ts              TEXT NOT NULL,
    rule            TEXT NOT NULL,
    target_kind     TEXT NOT NULL,
    target          TEXT NOT NULL,
    action          TEXT NOT NULL,
    mode            TEXT NOT NULL,
    rung            INTEGER NOT NULL DEFAULT 0,
    episode         INTEGER NOT NULL DEFAULT 1,
    job_id          TEXT,
    user_name       TEXT,
    account         TEXT,
    partition_name  TEXT,
    host            TEXT,
    gpus            INTEGER NOT NULL DEFAULT 0,
    reason          TEXT,
    protection      TEXT,
    requires_approval INTEGER NOT NULL DEFAULT 0,
    approval_status TEXT,                              -- pending | approved | rejected | timed_out
    approved_by     TEXT,
    approved_at     TEXT,
    status          TEXT NOT NULL DEFAULT 'decided',   -- decided | recorded | acted | rejected | capped | failed | expired
    gpu_hours_at_risk REAL NOT NULL DEFAULT 0,
    gpu_hours_saved REAL NOT NULL DEFAULT 0,
    evidence        TEXT                               -- JSON object
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_decisions_ts ON gpu_cost_decisions (ts);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_decisions_target ON gpu_cost_decisions (target);

CREATE TABLE IF NOT EXISTS gpu_cost_actions (
    action_id       TEXT PRIMARY KEY,                  -- decision_id + ":" + step
    decision_id     TEXT NOT NULL,
    run_id          TEXT,
    action          TEXT NOT NULL,
    target          TEXT NOT NULL,
    executor        TEXT,
    dry_run         INTEGER NOT NULL DEFAULT 0,
    status          TEXT NOT NULL,                     -- started | succeeded | failed | skipped
    started_at      TEXT NOT NULL,
    finished_at     TEXT,
    attempt         INTEGER NOT NULL DEFAULT 1,
    command         TEXT,
    output          TEXT,
    error           TEXT
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_actions_decision ON gpu_cost_actions (decision_id);

CREATE TABLE IF NOT EXISTS gpu_cost_escalations (
    rule            TEXT NOT NULL,
    target          TEXT NOT NULL,
    track           TEXT NOT NULL,                     -- dry-run | live
    episode         INTEGER NOT NULL DEFAULT 1,
    rung            INTEGER NOT NULL DEFAULT -1,       -- last rung carried out (-1: none yet)
    state           TEXT NOT NULL DEFAULT 'open',      -- open | closed
    first_seen      TEXT NOT NULL,
    last_seen       TEXT NOT NULL,
    last_action_at  TEXT,
    closed_at       TEXT,
    snoozed_until   TEXT,
    snooze_reason   TEXT,
    snoozed_by      TEXT,
    job_id          TEXT,
    user_name       TEXT,
    PRIMARY KEY (rule, target, track)
);

CREATE TABLE IF NOT EXISTS gpu_cost_snoozes (
    snooze_id       TEXT PRIMARY KEY,
    target          TEXT NOT NULL,
    until_ts        TEXT NOT NULL,
    reason          TEXT NOT NULL,
    created_by      TEXT,
    created_at      TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS gpu_cost_forecasts (
    series          TEXT NOT NULL,                     -- e.g. demand:account:nlp, runtime:class:...
    horizon_ts      TEXT NOT NULL,
    kind            TEXT NOT NULL,                     -- demand | runtime | backtest
    yhat            REAL,
    yhat_lower      REAL,
    yhat_upper      REAL,
    model           TEXT,
    created_at      TEXT NOT NULL,
    extra           TEXT,                              -- JSON
    PRIMARY KEY (series, horizon_ts)
);

CREATE TABLE IF NOT EXISTS gpu_cost_usage (
    ts              TEXT NOT NULL,                     -- end of the interval
    interval_s      REAL NOT NULL,
    host            TEXT NOT NULL,
    gpu_model       TEXT NOT NULL DEFAULT '',
    user_name       TEXT NOT NULL DEFAULT '',
    account         TEXT NOT NULL DEFAULT '',
    partition_name  TEXT NOT NULL DEFAULT '',
    gpus            INTEGER NOT NULL DEFAULT 0,
    total_gpu_s     REAL NOT NULL DEFAULT 0,
    allocated_gpu_s REAL NOT NULL DEFAULT 0,
    busy_gpu_s      REAL NOT NULL DEFAULT 0,
    idle_alloc_gpu_s REAL NOT NULL DEFAULT 0,
    zombie_gpu_s    REAL NOT NULL DEFAULT 0,
    util_sum        REAL NOT NULL DEFAULT 0,           -- Σ utilisation % × GPU-seconds / 100
    PRIMARY KEY (ts, host, user_name, account, partition_name, gpu_model)
);

CREATE TABLE IF NOT EXISTS gpu_cost_savings (
    saving_id       TEXT PRIMARY KEY,
    decision_id     TEXT,
    ts              TEXT NOT NULL,
    kind            TEXT NOT NULL,                     -- gpu | power
    target          TEXT,
    user_name       TEXT,
    account         TEXT,
    gpu_model       TEXT,
    gpus            INTEGER NOT NULL DEFAULT 0,
    gpu_hours       REAL NOT NULL DEFAULT 0,
    kwh             REAL NOT NULL DEFAULT 0,
    usd             REAL NOT NULL DEFAULT 0,
    basis           TEXT                               -- how the saving was computed
);

CREATE TABLE IF NOT EXISTS gpu_cost_jobs_usage (
    ts              TEXT NOT NULL,                     -- end of the interval (sweep instant)
    job_id          TEXT NOT NULL,
    interval_s      REAL NOT NULL,
    user_name       TEXT NOT NULL DEFAULT '',
    account         TEXT NOT NULL DEFAULT '',
    partition_name  TEXT NOT NULL DEFAULT '',
    gpu_model       TEXT NOT NULL DEFAULT '',
    job_name        TEXT,
    gpus            INTEGER NOT NULL DEFAULT 0,        -- GPUs the job holds
    gpus_requested  INTEGER NOT NULL DEFAULT 0,
    gpus_busy       INTEGER NOT NULL DEFAULT 0,        -- mean utilisation >= sweep.busy_util in the window
    gpus_active     INTEGER NOT NULL DEFAULT 0,        -- above the idle threshold
    gpus_stale      INTEGER NOT NULL DEFAULT 0,
    work_gpus       REAL NOT NULL DEFAULT 0,           -- sum of utilisation / 100
    time_limit_s    REAL,
    start_ts        REAL,                              -- epoch seconds
    PRIMARY KEY (ts, job_id)
);
"""

POSTGRESQL = """
-- Audit store schema, PostgreSQL dialect. Table names are a contract; columns may grow.
-- Times are TIMESTAMPTZ (the store binds ISO 8601 UTC text).
-- Nothing is ever deleted: decisions and actions are appended, actions updated once on completion.

CREATE TABLE IF NOT EXISTS gpu_cost_runs (
    run_id          TEXT PRIMARY KEY,
    dag_id          TEXT,
    started_at      TIMESTAMPTZ NOT NULL,
    finished_at     TIMESTAMPTZ,
    data_ts         TIMESTAMPTZ,
    source          TEXT,
    mode            TEXT,
    status          TEXT NOT NULL DEFAULT 'running',   -- running | awaiting_approval | ok | degraded | failed | capped
    problems        TEXT,                              -- JSON list
    counts          TEXT                                      -- JSON object
);

CREATE TABLE IF NOT EXISTS gpu_cost_snapshots (
    run_id          TEXT PRIMARY KEY,
    ts              TIMESTAMPTZ NOT NULL,
    payload         TEXT NOT NULL                      -- Snapshot JSON
);

CREATE TABLE IF NOT EXISTS gpu_cost_decisions (
    decision_id     TEXT PRIMARY KEY,                  -- hash of (rule, target, episode, rung)
    run_id          TEXT,
    ts              TIMESTAMPTZ NOT NULL,
    rule            TEXT NOT NULL,
    target_kind     TEXT NOT NULL,
    target          TEXT NOT NULL,
    action          TEXT NOT NULL,
    mode            TEXT NOT NULL,
    rung            INTEGER NOT NULL DEFAULT 0,
    episode         INTEGER NOT NULL DEFAULT 1,
    job_id          TEXT,
    user_name       TEXT,
    account         TEXT,
    partition_name  TEXT,
    host            TEXT,
    gpus            INTEGER NOT NULL DEFAULT 0,
    reason          TEXT,
    protection      TEXT,
    requires_approval INTEGER NOT NULL DEFAULT 0,
    approval_status TEXT,                              -- pending | approved | rejected | timed_out
    approved_by     TEXT,
    approved_at     TIMESTAMPTZ,
    status          TEXT NOT NULL DEFAULT 'decided',   -- decided | recorded | acted | rejected | capped | failed | expired
    gpu_hours_at_risk DOUBLE PRECISION NOT NULL DEFAULT 0,
    gpu_hours_saved DOUBLE PRECISION NOT NULL DEFAULT 0,
    evidence        TEXT                               -- JSON object
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_decisions_ts ON gpu_cost_decisions (ts);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_decisions_target ON gpu_cost_decisions (target);

CREATE TABLE IF NOT EXISTS gpu_cost_actions (
    action_id       TEXT PRIMARY KEY,                  -- decision_id + ":" + step
    decision_id     TEXT NOT NULL,
    run_id          TEXT,
    action          TEXT NOT NULL,
    target          TEXT NOT NULL,
    executor        TEXT,
    dry_run         INTEGER NOT NULL DEFAULT 0,
    status          TEXT NOT NULL,                     -- started | succeeded | failed | skipped
    started_at      TIMESTAMPTZ NOT NULL,
    finished_at     TIMESTAMPTZ,
    attempt         INTEGER NOT NULL DEFAULT 1,
    command         TEXT,
    output          TEXT,
    error           TEXT
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_actions_decision ON gpu_cost_actions (decision_id);

CREATE TABLE IF NOT EXISTS gpu_cost_escalations (
    rule            TEXT NOT NULL,
    target          TEXT NOT NULL,
    track           TEXT NOT NULL,                     -- dry-run | live
    episode         INTEGER NOT NULL DEFAULT 1,
    rung            INTEGER NOT NULL DEFAULT -1,       -- last rung carried out (-1: none yet)
    state           TEXT NOT NULL DEFAULT 'open',      -- open | closed
    first_seen      TIMESTAMPTZ NOT NULL,
    last_seen       TIMESTAMPTZ NOT NULL,
    last_action_at  TIMESTAMPTZ,
    closed_at       TIMESTAMPTZ,
    snoozed_until   TIMESTAMPTZ,
    snooze_reason   TEXT,
    snoozed_by      TEXT,
    job_id          TEXT,
    user_name       TEXT,
    PRIMARY KEY (rule, target, track)
);

CREATE TABLE IF NOT EXISTS gpu_cost_snoozes (
    snooze_id       TEXT PRIMARY KEY,
    target          TEXT NOT NULL,
    until_ts        TIMESTAMPTZ NOT NULL,
    reason          TEXT NOT NULL,
    created_by      TEXT,
    created_at      TIMESTAMPTZ NOT NULL
);

CREATE TABLE IF NOT EXISTS gpu_cost_forecasts (
    series          TEXT NOT NULL,                     -- e.g. demand:account:nlp, runtime:class:...
    horizon_ts      TIMESTAMPTZ NOT NULL,
    kind            TEXT NOT NULL,                     -- demand | runtime | backtest
    yhat            DOUBLE PRECISION,
    yhat_lower      DOUBLE PRECISION,
    yhat_upper      DOUBLE PRECISION,
    model           TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    extra           TEXT,                              -- JSON
    PRIMARY KEY (series, horizon_ts)
);

CREATE TABLE IF NOT EXISTS gpu_cost_usage (
    ts              TIMESTAMPTZ NOT NULL,                     -- end of the interval
    interval_s      DOUBLE PRECISION NOT NULL,
    host            TEXT NOT NULL,
    gpu_model       TEXT NOT NULL DEFAULT '',
    user_name       TEXT NOT NULL DEFAULT '',
    account         TEXT NOT NULL DEFAULT '',
    partition_name  TEXT NOT NULL DEFAULT '',
    gpus            INTEGER NOT NULL DEFAULT 0,
    total_gpu_s     DOUBLE PRECISION NOT NULL DEFAULT 0,
    allocated_gpu_s DOUBLE PRECISION NOT NULL DEFAULT 0,
    busy_gpu_s      DOUBLE PRECISION NOT NULL DEFAULT 0,
    idle_alloc_gpu_s DOUBLE PRECISION NOT NULL DEFAULT 0,
    zombie_gpu_s    DOUBLE PRECISION NOT NULL DEFAULT 0,
    util_sum        DOUBLE PRECISION NOT NULL DEFAULT 0,           -- Σ utilisation % × GPU-seconds / 100
    PRIMARY KEY (ts, host, user_name, account, partition_name, gpu_model)
);

CREATE TABLE IF NOT EXISTS gpu_cost_savings (
    saving_id       TEXT PRIMARY KEY,
    decision_id     TEXT,
    ts              TIMESTAMPTZ NOT NULL,
    kind            TEXT NOT NULL,                     -- gpu | power
    target          TEXT,
    user_name       TEXT,
    account         TEXT,
    gpu_model       TEXT,
    gpus            INTEGER NOT NULL DEFAULT 0,
    gpu_hours       DOUBLE PRECISION NOT NULL DEFAULT 0,
    kwh             DOUBLE PRECISION NOT NULL DEFAULT 0,
    usd             DOUBLE PRECISION NOT NULL DEFAULT 0,
    basis           TEXT                               -- how the saving was computed
);

CREATE TABLE IF NOT EXISTS gpu_cost_jobs_usage (
    ts              TIMESTAMPTZ NOT NULL,                     -- end of the interval (sweep instant)
    job_id          TEXT NOT NULL,
    interval_s      DOUBLE PRECISION NOT NULL,
    user_name       TEXT NOT NULL DEFAULT '',
    account         TEXT NOT NULL DEFAULT '',
    partition_name  TEXT NOT NULL DEFAULT '',
    gpu_model       TEXT NOT NULL DEFAULT '',
    job_name        TEXT,
    gpus            INTEGER NOT NULL DEFAULT 0,        -- GPUs the job holds
    gpus_requested  INTEGER NOT NULL DEFAULT 0,
    gpus_busy       INTEGER NOT NULL DEFAULT 0,        -- mean utilisation >= sweep.busy_util in the window
    gpus_active     INTEGER NOT NULL DEFAULT 0,        -- above the idle threshold
    gpus_stale      INTEGER NOT NULL DEFAULT 0,
    work_gpus       DOUBLE PRECISION NOT NULL DEFAULT 0,           -- sum of utilisation / 100
    time_limit_s    DOUBLE PRECISION,
    start_ts        DOUBLE PRECISION,                              -- epoch seconds
    PRIMARY KEY (ts, job_id)
);
"""
