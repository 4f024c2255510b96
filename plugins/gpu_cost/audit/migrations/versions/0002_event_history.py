"""Decisions and actions become append-only history; stored results name their run and data instant.

* ``gpu_cost_decisions`` → ``gpu_cost_decision_log`` (what was decided, never rewritten) +
  ``gpu_cost_decision_events`` (status changes and approval answers, appended); the same for
  actions (``gpu_cost_action_log`` + ``gpu_cost_action_events``: outcomes, retries, reopenings).
  ``gpu_cost_decisions`` and ``gpu_cost_actions`` become views of the current state, with the
  columns the tables had. Every existing row is kept: its columns go to the log, its current
  status / approval / outcome becomes one first event (``recorded_by`` = this revision).
* ``gpu_cost_forecasts``, ``gpu_cost_usage``, ``gpu_cost_jobs_usage`` and ``gpu_cost_savings`` get
  ``run_id`` (NULL for rows written before: their run is not known) and ``data_ts`` (the row's own
  instant for rows written before: ``created_at`` of a forecast, ``ts`` of the others).

The DDL below is a frozen copy of the head at this revision (``include/sql/schema.*.sql`` describe
the current head). Frozen: never edit it; add a revision instead.

Revision ID: 0002_event_history
Revises: 0001_baseline
Create Date: 2026-05-01
"""

from __future__ import annotations

from alembic import op

revision = "0002_event_history"
down_revision = "0001_baseline"
branch_labels = None
depends_on = None

BY = "migration 0002_event_history"

_DECISION_COLS = ("decision_id, run_id, ts, rule, target_kind, target, action, mode, rung, episode, job_id, user_name, "
                  "account, partition_name, host, gpus, reason, protection, requires_approval, approval_status, status, "
                  "gpu_hours_at_risk, gpu_hours_saved, evidence")
_ACTION_COLS = "action_id, decision_id, run_id, action, target, executor, dry_run, started_at, attempt, command"

#: the columns each result table had, and the column its data instant is taken from
_RESULTS = {
    "gpu_cost_forecasts": ("series, horizon_ts, kind, yhat, yhat_lower, yhat_upper, model, created_at, extra",
                           "created_at"),
    "gpu_cost_usage": ("ts, interval_s, host, gpu_model, user_name, account, partition_name, gpus, total_gpu_s, "
                       "allocated_gpu_s, busy_gpu_s, idle_alloc_gpu_s, zombie_gpu_s, util_sum", "ts"),
    "gpu_cost_savings": ("saving_id, decision_id, ts, kind, target, user_name, account, gpu_model, gpus, gpu_hours, kwh, "
                         "usd, basis", "ts"),
    "gpu_cost_jobs_usage": ("ts, job_id, interval_s, user_name, account, partition_name, gpu_model, job_name, gpus, "
                            "gpus_requested, gpus_busy, gpus_active, gpus_stale, work_gpus, time_limit_s, start_ts", "ts"),
}


def upgrade() -> None:
    conn = op.get_bind()
    sqlite = conn.dialect.name == "sqlite"
    ddl = SQLITE_DDL if sqlite else POSTGRESQL_DDL
    run = conn.exec_driver_sql
    ts_type = "TEXT" if sqlite else "TIMESTAMPTZ"

    # decisions: the log keeps what was decided (status and approval as they are now), one event the state
    run(ddl["gpu_cost_decision_log"])
    run(f"INSERT INTO gpu_cost_decision_log ({_DECISION_COLS}) SELECT {_DECISION_COLS} FROM gpu_cost_decisions")
    run(ddl["gpu_cost_decision_events"])
    run("INSERT INTO gpu_cost_decision_events (decision_id, status, approval_status, approved_by, approved_at, "
        "recorded_by, run_id, note) "
        f"SELECT decision_id, status, approval_status, approved_by, approved_at, '{BY}', run_id, "
        "'state when the history began' FROM gpu_cost_decisions ORDER BY ts, decision_id")
    run("DROP TABLE gpu_cost_decisions")
    for name in ("ix_gpu_cost_decision_log_ts", "ix_gpu_cost_decision_log_target",
                 "ix_gpu_cost_decision_events_decision"):
        run(ddl[name])

    # actions: the log keeps what was started, one event the outcome so far
    run(ddl["gpu_cost_action_log"])
    run(f"INSERT INTO gpu_cost_action_log ({_ACTION_COLS}) SELECT {_ACTION_COLS} FROM gpu_cost_actions")
    run(ddl["gpu_cost_action_events"])
    run("INSERT INTO gpu_cost_action_events (action_id, prev_event_id, status, finished_at, output, error, attempt) "
        "SELECT action_id, 0, status, finished_at, output, error, attempt FROM gpu_cost_actions "
        "ORDER BY started_at, action_id")
    run("DROP TABLE gpu_cost_actions")
    for name in ("ix_gpu_cost_action_log_decision", "ix_gpu_cost_action_log_target", "ix_gpu_cost_action_events_action"):
        run(ddl[name])

    run(ddl["gpu_cost_decisions"])
    run(ddl["gpu_cost_actions"])

    # results: run_id and data_ts
    for table, (cols, instant) in _RESULTS.items():
        if sqlite:  # no ALTER COLUMN: rebuild with the head's definition
            run(f"ALTER TABLE {table} RENAME TO {table}_0001")
            run(ddl[table])
            run(f"INSERT INTO {table} ({cols}, run_id, data_ts) SELECT {cols}, NULL, {instant} FROM {table}_0001")
            run(f"DROP TABLE {table}_0001")
        else:
            run(f"ALTER TABLE {table} ADD COLUMN run_id TEXT, ADD COLUMN data_ts {ts_type}")
            run(f"UPDATE {table} SET data_ts = {instant}")
            run(f"ALTER TABLE {table} ALTER COLUMN data_ts SET NOT NULL")


def downgrade() -> None:
    raise NotImplementedError("the audit store is never migrated down")


SQLITE_DDL = {
    "gpu_cost_decision_log": """
CREATE TABLE gpu_cost_decision_log (
    decision_id     TEXT PRIMARY KEY,
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
    approval_status TEXT,
    status          TEXT NOT NULL DEFAULT 'decided',
    gpu_hours_at_risk REAL NOT NULL DEFAULT 0,
    gpu_hours_saved REAL NOT NULL DEFAULT 0,
    evidence        TEXT
)""",
    "ix_gpu_cost_decision_log_ts": """
CREATE INDEX ix_gpu_cost_decision_log_ts ON gpu_cost_decision_log (ts)""",
    "ix_gpu_cost_decision_log_target": """
CREATE INDEX ix_gpu_cost_decision_log_target ON gpu_cost_decision_log (target)""",
    "gpu_cost_decision_events": """
CREATE TABLE gpu_cost_decision_events (
    event_id        INTEGER PRIMARY KEY AUTOINCREMENT,
    decision_id     TEXT NOT NULL,
    ts              TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ', 'now')),
    status          TEXT,
    approval_status TEXT,
    approved_by     TEXT,
    approved_at     TEXT,
    recorded_by     TEXT,
    run_id          TEXT,
    note            TEXT
)""",
    "ix_gpu_cost_decision_events_decision": """
CREATE INDEX ix_gpu_cost_decision_events_decision ON gpu_cost_decision_events (decision_id, event_id)""",
    "gpu_cost_action_log": """
CREATE TABLE gpu_cost_action_log (
    action_id       TEXT PRIMARY KEY,
    decision_id     TEXT NOT NULL,
    run_id          TEXT,
    action          TEXT NOT NULL,
    target          TEXT NOT NULL,
    executor        TEXT,
    dry_run         INTEGER NOT NULL DEFAULT 0,
    started_at      TEXT NOT NULL,
    attempt         INTEGER NOT NULL DEFAULT 1,
    command         TEXT
)""",
    "ix_gpu_cost_action_log_decision": """
CREATE INDEX ix_gpu_cost_action_log_decision ON gpu_cost_action_log (decision_id)""",
    "ix_gpu_cost_action_log_target": """
CREATE INDEX ix_gpu_cost_action_log_target ON gpu_cost_action_log (target)""",
    "gpu_cost_action_events": """
CREATE TABLE gpu_cost_action_events (
    event_id        INTEGER PRIMARY KEY AUTOINCREMENT,
    action_id       TEXT NOT NULL,
    prev_event_id   BIGINT NOT NULL DEFAULT 0,
    ts              TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ', 'now')),
    status          TEXT NOT NULL,
    finished_at     TEXT,
    output          TEXT,
    error           TEXT,
    attempt         INTEGER NOT NULL DEFAULT 1,
    UNIQUE (action_id, prev_event_id)
)""",
    "ix_gpu_cost_action_events_action": """
CREATE INDEX ix_gpu_cost_action_events_action ON gpu_cost_action_events (action_id, event_id)""",
    "gpu_cost_decisions": """
CREATE VIEW gpu_cost_decisions AS
SELECT l.decision_id, l.run_id, l.ts, l.rule, l.target_kind, l.target, l.action, l.mode, l.rung, l.episode,
       l.job_id, l.user_name, l.account, l.partition_name, l.host, l.gpus, l.reason, l.protection,
       l.requires_approval,
       CASE WHEN a.event_id IS NULL THEN l.approval_status ELSE a.approval_status END AS approval_status,
       a.approved_by, a.approved_at,
       COALESCE(s.status, l.status) AS status,
       l.gpu_hours_at_risk, l.gpu_hours_saved, l.evidence
FROM gpu_cost_decision_log l
LEFT JOIN gpu_cost_decision_events s ON s.event_id = (
    SELECT MAX(e.event_id) FROM gpu_cost_decision_events e WHERE e.decision_id = l.decision_id AND e.status IS NOT NULL)
LEFT JOIN gpu_cost_decision_events a ON a.event_id = (
    SELECT MAX(e.event_id) FROM gpu_cost_decision_events e
    WHERE e.decision_id = l.decision_id AND e.approval_status IS NOT NULL)""",
    "gpu_cost_actions": """
CREATE VIEW gpu_cost_actions AS
SELECT l.action_id, l.decision_id, l.run_id, l.action, l.target, l.executor, l.dry_run,
       COALESCE(e.status, 'started') AS status, l.started_at, e.finished_at, COALESCE(e.attempt, l.attempt) AS attempt,
       l.command, e.output, e.error
FROM gpu_cost_action_log l
LEFT JOIN gpu_cost_action_events e ON e.event_id = (
    SELECT MAX(x.event_id) FROM gpu_cost_action_events x WHERE x.action_id = l.action_id)""",
    "gpu_cost_forecasts": """
CREATE TABLE gpu_cost_forecasts (
    series          TEXT NOT NULL,
    horizon_ts      TEXT NOT NULL,
    kind            TEXT NOT NULL,
    yhat            REAL,
    yhat_lower      REAL,
    yhat_upper      REAL,
    model           TEXT,
    created_at      TEXT NOT NULL,
    extra           TEXT,
    run_id          TEXT,
    data_ts         TEXT NOT NULL,
    PRIMARY KEY (series, horizon_ts)
)""",
    "gpu_cost_usage": """
CREATE TABLE gpu_cost_usage (
    ts              TEXT NOT NULL,
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
    util_sum        REAL NOT NULL DEFAULT 0,
    run_id          TEXT,
    data_ts         TEXT NOT NULL,
    PRIMARY KEY (ts, host, user_name, account, partition_name, gpu_model)
)""",
    "gpu_cost_savings": """
CREATE TABLE gpu_cost_savings (
    saving_id       TEXT PRIMARY KEY,
    decision_id     TEXT,
    ts              TEXT NOT NULL,
    kind            TEXT NOT NULL,
    target          TEXT,
    user_name       TEXT,
    account         TEXT,
    gpu_model       TEXT,
    gpus            INTEGER NOT NULL DEFAULT 0,
    gpu_hours       REAL NOT NULL DEFAULT 0,
    kwh             REAL NOT NULL DEFAULT 0,
    usd             REAL NOT NULL DEFAULT 0,
    basis           TEXT,
    run_id          TEXT,
    data_ts         TEXT NOT NULL
)""",
    "gpu_cost_jobs_usage": """
CREATE TABLE gpu_cost_jobs_usage (
    ts              TEXT NOT NULL,
    job_id          TEXT NOT NULL,
    interval_s      REAL NOT NULL,
    user_name       TEXT NOT NULL DEFAULT '',
    account         TEXT NOT NULL DEFAULT '',
    partition_name  TEXT NOT NULL DEFAULT '',
    gpu_model       TEXT NOT NULL DEFAULT '',
    job_name        TEXT,
    gpus            INTEGER NOT NULL DEFAULT 0,
    gpus_requested  INTEGER NOT NULL DEFAULT 0,
    gpus_busy       INTEGER NOT NULL DEFAULT 0,
    gpus_active     INTEGER NOT NULL DEFAULT 0,
    gpus_stale      INTEGER NOT NULL DEFAULT 0,
    work_gpus       REAL NOT NULL DEFAULT 0,
    time_limit_s    REAL,
    start_ts        REAL,
    run_id          TEXT,
    data_ts         TEXT NOT NULL,
    PRIMARY KEY (ts, job_id)
)""",
}

POSTGRESQL_DDL = {
    "gpu_cost_decision_log": """
CREATE TABLE gpu_cost_decision_log (
    decision_id     TEXT PRIMARY KEY,
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
    approval_status TEXT,
    status          TEXT NOT NULL DEFAULT 'decided',
    gpu_hours_at_risk DOUBLE PRECISION NOT NULL DEFAULT 0,
    gpu_hours_saved DOUBLE PRECISION NOT NULL DEFAULT 0,
    evidence        TEXT
)""",
    "ix_gpu_cost_decision_log_ts": """
CREATE INDEX ix_gpu_cost_decision_log_ts ON gpu_cost_decision_log (ts)""",
    "ix_gpu_cost_decision_log_target": """
CREATE INDEX ix_gpu_cost_decision_log_target ON gpu_cost_decision_log (target)""",
    "gpu_cost_decision_events": """
CREATE TABLE gpu_cost_decision_events (
    event_id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    decision_id     TEXT NOT NULL,
    ts              TIMESTAMPTZ NOT NULL DEFAULT now(),
    status          TEXT,
    approval_status TEXT,
    approved_by     TEXT,
    approved_at     TIMESTAMPTZ,
    recorded_by     TEXT,
    run_id          TEXT,
    note            TEXT
)""",
    "ix_gpu_cost_decision_events_decision": """
CREATE INDEX ix_gpu_cost_decision_events_decision ON gpu_cost_decision_events (decision_id, event_id)""",
    "gpu_cost_action_log": """
CREATE TABLE gpu_cost_action_log (
    action_id       TEXT PRIMARY KEY,
    decision_id     TEXT NOT NULL,
    run_id          TEXT,
    action          TEXT NOT NULL,
    target          TEXT NOT NULL,
    executor        TEXT,
    dry_run         INTEGER NOT NULL DEFAULT 0,
    started_at      TIMESTAMPTZ NOT NULL,
    attempt         INTEGER NOT NULL DEFAULT 1,
    command         TEXT
)""",
    "ix_gpu_cost_action_log_decision": """
CREATE INDEX ix_gpu_cost_action_log_decision ON gpu_cost_action_log (decision_id)""",
    "ix_gpu_cost_action_log_target": """
CREATE INDEX ix_gpu_cost_action_log_target ON gpu_cost_action_log (target)""",
    "gpu_cost_action_events": """
CREATE TABLE gpu_cost_action_events (
    event_id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action_id       TEXT NOT NULL,
    prev_event_id   BIGINT NOT NULL DEFAULT 0,
    ts              TIMESTAMPTZ NOT NULL DEFAULT now(),
    status          TEXT NOT NULL,
    finished_at     TIMESTAMPTZ,
    output          TEXT,
    error           TEXT,
    attempt         INTEGER NOT NULL DEFAULT 1,
    UNIQUE (action_id, prev_event_id)
)""",
    "ix_gpu_cost_action_events_action": """
CREATE INDEX ix_gpu_cost_action_events_action ON gpu_cost_action_events (action_id, event_id)""",
    "gpu_cost_decisions": """
CREATE VIEW gpu_cost_decisions AS
SELECT l.decision_id, l.run_id, l.ts, l.rule, l.target_kind, l.target, l.action, l.mode, l.rung, l.episode,
       l.job_id, l.user_name, l.account, l.partition_name, l.host, l.gpus, l.reason, l.protection,
       l.requires_approval,
       CASE WHEN a.event_id IS NULL THEN l.approval_status ELSE a.approval_status END AS approval_status,
       a.approved_by, a.approved_at,
       COALESCE(s.status, l.status) AS status,
       l.gpu_hours_at_risk, l.gpu_hours_saved, l.evidence
FROM gpu_cost_decision_log l
LEFT JOIN gpu_cost_decision_events s ON s.event_id = (
    SELECT MAX(e.event_id) FROM gpu_cost_decision_events e WHERE e.decision_id = l.decision_id AND e.status IS NOT NULL)
LEFT JOIN gpu_cost_decision_events a ON a.event_id = (
    SELECT MAX(e.event_id) FROM gpu_cost_decision_events e
    WHERE e.decision_id = l.decision_id AND e.approval_status IS NOT NULL)""",
    "gpu_cost_actions": """
CREATE VIEW gpu_cost_actions AS
SELECT l.action_id, l.decision_id, l.run_id, l.action, l.target, l.executor, l.dry_run,
       COALESCE(e.status, 'started') AS status, l.started_at, e.finished_at, COALESCE(e.attempt, l.attempt) AS attempt,
       l.command, e.output, e.error
FROM gpu_cost_action_log l
LEFT JOIN gpu_cost_action_events e ON e.event_id = (
    SELECT MAX(x.event_id) FROM gpu_cost_action_events x WHERE x.action_id = l.action_id)""",
    "gpu_cost_forecasts": """
CREATE TABLE gpu_cost_forecasts (
    series          TEXT NOT NULL,
    horizon_ts      TIMESTAMPTZ NOT NULL,
    kind            TEXT NOT NULL,
    yhat            DOUBLE PRECISION,
    yhat_lower      DOUBLE PRECISION,
    yhat_upper      DOUBLE PRECISION,
    model           TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    extra           TEXT,
    run_id          TEXT,
    data_ts         TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (series, horizon_ts)
)""",
    "gpu_cost_usage": """
CREATE TABLE gpu_cost_usage (
    ts              TIMESTAMPTZ NOT NULL,
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
    util_sum        DOUBLE PRECISION NOT NULL DEFAULT 0,
    run_id          TEXT,
    data_ts         TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (ts, host, user_name, account, partition_name, gpu_model)
)""",
    "gpu_cost_savings": """
CREATE TABLE gpu_cost_savings (
    saving_id       TEXT PRIMARY KEY,
    decision_id     TEXT,
    ts              TIMESTAMPTZ NOT NULL,
    kind            TEXT NOT NULL,
    target          TEXT,
    user_name       TEXT,
    account         TEXT,
    gpu_model       TEXT,
    gpus            INTEGER NOT NULL DEFAULT 0,
    gpu_hours       DOUBLE PRECISION NOT NULL DEFAULT 0,
    kwh             DOUBLE PRECISION NOT NULL DEFAULT 0,
    usd             DOUBLE PRECISION NOT NULL DEFAULT 0,
    basis           TEXT,
    run_id          TEXT,
    data_ts         TIMESTAMPTZ NOT NULL
)""",
    "gpu_cost_jobs_usage": """
CREATE TABLE gpu_cost_jobs_usage (
    ts              TIMESTAMPTZ NOT NULL,
    job_id          TEXT NOT NULL,
    interval_s      DOUBLE PRECISION NOT NULL,
    user_name       TEXT NOT NULL DEFAULT '',
    account         TEXT NOT NULL DEFAULT '',
    partition_name  TEXT NOT NULL DEFAULT '',
    gpu_model       TEXT NOT NULL DEFAULT '',
    job_name        TEXT,
    gpus            INTEGER NOT NULL DEFAULT 0,
    gpus_requested  INTEGER NOT NULL DEFAULT 0,
    gpus_busy       INTEGER NOT NULL DEFAULT 0,
    gpus_active     INTEGER NOT NULL DEFAULT 0,
    gpus_stale      INTEGER NOT NULL DEFAULT 0,
    work_gpus       DOUBLE PRECISION NOT NULL DEFAULT 0,
    time_limit_s    DOUBLE PRECISION,
    start_ts        DOUBLE PRECISION,
    run_id          TEXT,
    data_ts         TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (ts, job_id)
)""",
}
