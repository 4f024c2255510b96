"""Outcomes and the verifier: ``gpu_cost_outcomes``, what happened after each decision that did
something (the target active again, ended, acted on, snoozed, answered wrong, still idle, or too
recent to say), and ``gpu_cost_verifier_models``, every model trained on those labels, with its
backtest figures and the fitted coefficients as JSON.

Outcomes are a derived result (like the usage tables): a re-run of the same data instant changes
nothing, an older instant never replaces a newer one. Models are history: written once, never
updated nor deleted. Frozen: never edit it; add a revision instead.

Revision ID: 0006_outcomes_verifier
Revises: 0005_answers
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0006_outcomes_verifier"
down_revision = "0005_answers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    pg = conn.dialect.name != "sqlite"
    ts, real = ("TIMESTAMPTZ", "DOUBLE PRECISION") if pg else ("TEXT", "REAL")
    for stmt in DDL.format(ts=ts, real=real).split(";"):
        if stmt.strip():
            conn.exec_driver_sql(stmt)


def downgrade() -> None:
    raise NotImplementedError("the audit store is never migrated down")


DDL = """
CREATE TABLE IF NOT EXISTS gpu_cost_outcomes (
    decision_id     TEXT PRIMARY KEY,
    ts              {ts} NOT NULL,
    rule            TEXT NOT NULL,
    target          TEXT NOT NULL,
    episode         INTEGER NOT NULL DEFAULT 1,
    job_id          TEXT,
    user_name       TEXT,
    action          TEXT NOT NULL,
    outcome         TEXT NOT NULL,
    outcome_ts      {ts},
    after_s         {real},
    horizon_s       {real} NOT NULL,
    run_id          TEXT,
    data_ts         {ts} NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_outcomes_user ON gpu_cost_outcomes (user_name, ts);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_jobs_usage_job ON gpu_cost_jobs_usage (job_id, ts);
CREATE TABLE IF NOT EXISTS gpu_cost_verifier_models (
    model_id        TEXT PRIMARY KEY,
    trained_at      {ts} NOT NULL,
    since_ts        {ts},
    until_ts        {ts},
    labels          INTEGER NOT NULL DEFAULT 0,
    false_positives INTEGER NOT NULL DEFAULT 0,
    confirmed       INTEGER NOT NULL DEFAULT 0,
    backtest_precision {real},
    backtest_recall {real},
    false_kills_prevented INTEGER,
    gpu_hours_given_up {real},
    status          TEXT NOT NULL,
    note            TEXT,
    model           TEXT,
    run_id          TEXT
)
"""
