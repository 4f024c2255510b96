"""Answers: ``gpu_cost_answers``, what the people a notice reached answered (keep, release, wrong),
accepted or refused, and ``gpu_cost_answer_nonces``, the one-time requests already used.

History, like the decisions: written once, never updated nor deleted. Frozen: never edit it; add a
revision instead.

Revision ID: 0005_answers
Revises: 0004_class_baselines
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0005_answers"
down_revision = "0004_class_baselines"
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
CREATE TABLE IF NOT EXISTS gpu_cost_answers (
    answer_id       TEXT PRIMARY KEY,
    ts              {ts} NOT NULL,
    channel         TEXT NOT NULL,
    choice          TEXT NOT NULL,
    status          TEXT NOT NULL,
    refusal         TEXT,
    decision_id     TEXT,
    rule            TEXT,
    target          TEXT,
    episode         INTEGER,
    job_id          TEXT,
    answered_by     TEXT,
    owner           TEXT,
    role            TEXT,
    duration_s      {real},
    reason          TEXT,
    until_ts        {ts},
    effect          TEXT,
    nonce           TEXT
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_answers_target ON gpu_cost_answers (target, ts);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_answers_decision ON gpu_cost_answers (decision_id);
CREATE TABLE IF NOT EXISTS gpu_cost_answer_nonces (
    nonce           TEXT PRIMARY KEY,
    answer_id       TEXT NOT NULL,
    ts              {ts} NOT NULL
)
"""
