"""Class baselines: ``gpu_cost_class_members``, one row per job the sweeps have seen, with its class.

A derived result (like the usage tables): a re-run of the same data instant changes nothing, an
older instant never replaces a newer one. Frozen: never edit it; add a revision instead.

Revision ID: 0004_class_baselines
Revises: 0003_run_policies
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0004_class_baselines"
down_revision = "0003_run_policies"
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
CREATE TABLE IF NOT EXISTS gpu_cost_class_members (
    job_id          TEXT PRIMARY KEY,
    class_key       TEXT NOT NULL,
    coarse_key      TEXT NOT NULL,
    user_name       TEXT NOT NULL DEFAULT '',
    account         TEXT NOT NULL DEFAULT '',
    partition_name  TEXT NOT NULL DEFAULT '',
    stem            TEXT NOT NULL DEFAULT '',
    gpus            INTEGER NOT NULL DEFAULT 0,
    start_ts        {real},
    first_seen      {ts} NOT NULL,
    last_seen       {ts} NOT NULL,
    seen_s          {real} NOT NULL DEFAULT 0,
    active_s        {real} NOT NULL DEFAULT 0,
    idle_s          {real} NOT NULL DEFAULT 0,
    idle_mem_s      {real} NOT NULL DEFAULT 0,
    wakes           INTEGER NOT NULL DEFAULT 0,
    quiet_since     {real},
    longest_quiet_s {real} NOT NULL DEFAULT 0,
    cpu_pct_s       {real} NOT NULL DEFAULT 0,
    cpu_active_s    {real} NOT NULL DEFAULT 0,
    run_id          TEXT,
    data_ts         {ts} NOT NULL
);
CREATE INDEX IF NOT EXISTS gpu_cost_class_members_class ON gpu_cost_class_members (class_key, last_seen);
CREATE INDEX IF NOT EXISTS gpu_cost_class_members_coarse ON gpu_cost_class_members (coarse_key, last_seen)
"""
