"""Right-sizing at submission: what each sweep's job row needs, and the advice computed from them.

``gpu_cost_jobs_usage`` gets three columns, written by every sweep from then on:

* ``gpus_needed``: how many GPUs the job needed in that sample (its busy GPUs, GPUs with no fresh
  data counted as busy, at least its work in GPU-equivalents and the GPUs its memory fills);
  backfilled here for the rows already stored from their busy, stale and work columns (memory was
  not recorded then);
* ``mem_max_mib``: the most framebuffer used on one of its GPUs in the window;
* ``mem_total_mib``: the framebuffer of its GPUs (the smallest).

``gpu_cost_rightsize`` holds the advice (``gpu_cost.capacity.rightsize``): one row per user and per job
class (user and name stem) with enough finished jobs, as of one data instant. A derived result:
a re-run of the same instant replaces its rows. Frozen: never edit it; add a revision instead.

Revision ID: 0007_rightsize
Revises: 0006_outcomes_verifier
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0007_rightsize"
down_revision = "0006_outcomes_verifier"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    pg = conn.dialect.name != "sqlite"
    ts, real = ("TIMESTAMPTZ", "DOUBLE PRECISION") if pg else ("TEXT", "REAL")
    if pg:
        conn.exec_driver_sql(f"ALTER TABLE gpu_cost_jobs_usage ADD COLUMN gpus_needed INTEGER, "
                             f"ADD COLUMN mem_max_mib {real}, ADD COLUMN mem_total_mib {real}")
        conn.exec_driver_sql("UPDATE gpu_cost_jobs_usage SET gpus_needed = LEAST(gpus, GREATEST(gpus_busy + gpus_stale, "
                             "CAST(CEIL(work_gpus - 1e-9) AS INTEGER)))")
    else:
        for col, kind in (("gpus_needed", "INTEGER"), ("mem_max_mib", real), ("mem_total_mib", real)):
            conn.exec_driver_sql(f"ALTER TABLE gpu_cost_jobs_usage ADD COLUMN {col} {kind}")
        # CEIL is not in every SQLite build: truncate, plus one when something was cut off
        conn.exec_driver_sql(
            "UPDATE gpu_cost_jobs_usage SET gpus_needed = MIN(gpus, MAX(gpus_busy + gpus_stale, "
            "CAST(work_gpus - 1e-9 AS INTEGER) + (work_gpus - 1e-9 > CAST(work_gpus - 1e-9 AS INTEGER))))")
    for stmt in DDL.format(ts=ts, real=real).split(";"):
        if stmt.strip():
            conn.exec_driver_sql(stmt)


def downgrade() -> None:
    raise NotImplementedError("the audit store is never migrated down")


DDL = """
CREATE TABLE IF NOT EXISTS gpu_cost_rightsize (
    data_ts         {ts} NOT NULL,
    scope           TEXT NOT NULL,
    user_name       TEXT NOT NULL,
    stem            TEXT NOT NULL DEFAULT '',
    status          TEXT NOT NULL,
    jobs            INTEGER NOT NULL DEFAULT 0,
    gpus_asked      INTEGER NOT NULL DEFAULT 0,
    gpus_need       INTEGER NOT NULL DEFAULT 0,
    gpus_advice     INTEGER NOT NULL DEFAULT 0,
    ask_min         INTEGER NOT NULL DEFAULT 0,
    block_above     INTEGER NOT NULL DEFAULT 0,
    mem_peak_mib    {real},
    mem_total_mib   {real},
    time_jobs       INTEGER NOT NULL DEFAULT 0,
    time_asked_s    {real},
    runtime_s       {real},
    time_advice_s   {real} NOT NULL DEFAULT 0,
    time_ask_min_s  {real} NOT NULL DEFAULT 0,
    idle_gpu_hours  {real} NOT NULL DEFAULT 0,
    text            TEXT,
    advice_file     TEXT,
    run_id          TEXT,
    PRIMARY KEY (data_ts, scope, user_name, stem)
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_rightsize_user ON gpu_cost_rightsize (user_name, data_ts)
"""
