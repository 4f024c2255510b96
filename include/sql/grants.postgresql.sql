-- Privileges on the audit store, PostgreSQL. Run by the tables' owner, after schema.postgresql.sql,
-- in the audit database (never Airflow's metadata database). Idempotent: safe to run again.
--
-- Roles (created here without a password if missing, which needs CREATEROLE; deploy/postgres/ creates
-- them first with LOGIN and a password, so the owner alone can run this file):
--   gpu_cost_agent   the agent, connection `gpu_cost_db`: appends and reads; updates only the columns
--                    that the named statements of queries.sql update; never deletes, truncates or
--                    changes what was decided or done.
--   gpu_cost_reader  dashboards and reports (Grafana): read only.
--
-- When a statement in queries.sql starts to UPDATE another column (or an upsert another column),
-- grant that column here: tests/integration/test_grants.py checks the two files agree.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'gpu_cost_agent') THEN
        CREATE ROLE gpu_cost_agent NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'gpu_cost_reader') THEN
        CREATE ROLE gpu_cost_reader NOLOGIN;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA public TO gpu_cost_agent, gpu_cost_reader;

-- Nothing beyond what is granted below: no DELETE, TRUNCATE, REFERENCES or TRIGGER for anyone but the owner.
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC, gpu_cost_agent, gpu_cost_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO gpu_cost_agent, gpu_cost_reader;
GRANT INSERT ON ALL TABLES IN SCHEMA public TO gpu_cost_agent;
-- tables the owner adds later get the same (UPDATE stays column by column, below)
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO gpu_cost_agent, gpu_cost_reader;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT INSERT ON TABLES TO gpu_cost_agent;

-- finish_run
GRANT UPDATE (finished_at, status, problems, counts) ON gpu_cost_runs TO gpu_cost_agent;
-- save_snapshot (a retried collect replaces the run's snapshot)
GRANT UPDATE (ts, payload) ON gpu_cost_snapshots TO gpu_cost_agent;
-- set_decision_status, set_approval: what was decided (rule, target, action, reason, evidence) is never rewritten
GRANT UPDATE (status, approval_status, approved_by, approved_at) ON gpu_cost_decisions TO gpu_cost_agent;
-- action_finished, action_retry: what was run (action, target, command, started_at) is never rewritten
GRANT UPDATE (status, finished_at, output, error, attempt) ON gpu_cost_actions TO gpu_cost_agent;
-- insert_escalation (re-opened episode), touch_escalation, advance_escalation, close_escalation, snooze_escalations
GRANT UPDATE (episode, rung, state, first_seen, last_seen, last_action_at, closed_at, job_id, user_name,
    snoozed_until, snooze_reason, snoozed_by) ON gpu_cost_escalations TO gpu_cost_agent;
-- upsert_usage (a re-run sweep rewrites its own interval's summary)
GRANT UPDATE (interval_s, gpus, total_gpu_s, allocated_gpu_s, busy_gpu_s, idle_alloc_gpu_s, zombie_gpu_s, util_sum)
    ON gpu_cost_usage TO gpu_cost_agent;
-- upsert_job_usage (the same, per job)
GRANT UPDATE (interval_s, user_name, account, partition_name, gpu_model, job_name, gpus, gpus_requested, gpus_busy,
    gpus_active, gpus_stale, work_gpus, time_limit_s, start_ts) ON gpu_cost_jobs_usage TO gpu_cost_agent;
-- upsert_forecast (a re-run forecast replaces its own horizon)
GRANT UPDATE (kind, yhat, yhat_lower, yhat_upper, model, created_at, extra) ON gpu_cost_forecasts TO gpu_cost_agent;
-- gpu_cost_snoozes and gpu_cost_savings: append-only, no UPDATE at all.
