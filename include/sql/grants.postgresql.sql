-- Privileges on the audit store, PostgreSQL. Run by the tables' owner after the schema is at head
-- (`gpu-cost db upgrade` runs this file after migrating), in the audit database (never Airflow's
-- metadata database). Idempotent: safe to run again.
--
-- Roles (created here without a password if missing, which needs CREATEROLE; deploy/postgres/ creates
-- them first with LOGIN and a password, so the owner alone can run this file):
--   gpu_cost_agent     the agent, connection `gpu_cost_db`: reads everything; appends to the run, decision
--                      and action history (no UPDATE, DELETE or TRUNCATE at all there: a status change
--                      or an outcome is a new event row, the current state is a view), but writes no
--                      approval; updates only the state and result columns that the named statements of
--                      queries.sql update.
--   gpu_cost_approver  the approval operator, connection `gpu_cost_db_approver`: reads everything; appends
--                      approval events (who answered, when, what) and nothing else.
--   gpu_cost_reader    dashboards and reports (Grafana): read only.
--
-- When a statement in queries.sql starts to UPDATE another column (or an upsert another column),
-- grant that column here: tests/integration/test_grants.py checks the two files agree. A table a
-- later migration adds gets its INSERT grant here (SELECT comes by default).

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'gpu_cost_agent') THEN
        CREATE ROLE gpu_cost_agent NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'gpu_cost_reader') THEN
        CREATE ROLE gpu_cost_reader NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'gpu_cost_approver') THEN
        -- a store set up before the approver's role existed: deploy/postgres/initdb.d/00-roles.sh (run again
        -- by the server's superuser) creates it with LOGIN and its password; an owner with CREATEROLE may here
        BEGIN
            CREATE ROLE gpu_cost_approver NOLOGIN;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION USING MESSAGE = 'role gpu_cost_approver (approvals) is missing and ' || current_user
                || ' may not create it: run deploy/postgres/initdb.d/00-roles.sh as the server''s superuser '
                || '(GPU_COST_APPROVER_PASSWORD set), then this again';
        END;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA public TO gpu_cost_agent, gpu_cost_approver, gpu_cost_reader;

-- Nothing beyond what is granted below: no DELETE, TRUNCATE, REFERENCES or TRIGGER for anyone but the owner.
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC, gpu_cost_agent, gpu_cost_approver, gpu_cost_reader;
-- tables, views and the schema version: everyone reads
GRANT SELECT ON ALL TABLES IN SCHEMA public TO gpu_cost_agent, gpu_cost_approver, gpu_cost_reader;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO gpu_cost_agent, gpu_cost_approver, gpu_cost_reader;
-- INSERT is granted table by table (below), never by default: not on the views, not on the schema version
ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE INSERT ON TABLES FROM gpu_cost_agent, gpu_cost_approver;

-- History: SELECT and INSERT only. What was decided and started (the logs), every later status change
-- and outcome (the events), snoozes, the savings ledger and the policy each run pinned are never updated
-- nor deleted. What a run is and each of its status changes too: the current state is the view gpu_cost_runs.
GRANT INSERT ON gpu_cost_run_log, gpu_cost_run_events, gpu_cost_decision_log, gpu_cost_action_log,
    gpu_cost_action_events, gpu_cost_snoozes, gpu_cost_savings, gpu_cost_run_policies, gpu_cost_answers,
    gpu_cost_answer_nonces, gpu_cost_verifier_models TO gpu_cost_agent;
-- A decision's events: the agent appends status changes (set_decision_status), never an approval: the
-- approval columns take their defaults (NULL) in every row it writes. Only the approver's role writes an
-- approval (set_approval), and no status. The view gpu_cost_decisions takes a decision's approval from
-- those events only (the log says at most "pending").
GRANT INSERT (decision_id, status, recorded_by, run_id, note) ON gpu_cost_decision_events TO gpu_cost_agent;
GRANT INSERT (decision_id, approval_status, approved_by, approved_at, recorded_by, run_id, note)
    ON gpu_cost_decision_events TO gpu_cost_approver;

-- State, not history: a run's snapshot and the escalation ladders are the agent's working state (how far
-- a target's ladder went); their history is in the decisions and actions above. The agent updates only
-- the columns its statements update.
GRANT INSERT ON gpu_cost_snapshots, gpu_cost_escalations TO gpu_cost_agent;
-- save_snapshot (a retried collect replaces the run's snapshot)
GRANT UPDATE (ts, payload) ON gpu_cost_snapshots TO gpu_cost_agent;
-- insert_escalation (re-opened episode), touch_escalation, advance_escalation, close_escalation, snooze_escalations
GRANT UPDATE (episode, rung, state, first_seen, last_seen, last_action_at, closed_at, job_id, user_name,
    snoozed_until, snooze_reason, snoozed_by) ON gpu_cost_escalations TO gpu_cost_agent;

-- Results derived from the data (usage summaries, forecasts): a re-run of the same data instant
-- replaces its rows; the statements never let an older data instant replace a newer one.
GRANT INSERT ON gpu_cost_usage, gpu_cost_jobs_usage, gpu_cost_forecasts, gpu_cost_class_members, gpu_cost_outcomes,
    gpu_cost_rightsize TO gpu_cost_agent;
-- upsert_usage
GRANT UPDATE (interval_s, gpus, total_gpu_s, allocated_gpu_s, busy_gpu_s, idle_alloc_gpu_s, zombie_gpu_s, util_sum,
    run_id, data_ts) ON gpu_cost_usage TO gpu_cost_agent;
-- upsert_job_usage
GRANT UPDATE (interval_s, user_name, account, partition_name, gpu_model, job_name, gpus, gpus_requested, gpus_busy,
    gpus_active, gpus_stale, work_gpus, time_limit_s, start_ts, run_id, data_ts, gpus_needed, mem_max_mib, mem_total_mib)
    ON gpu_cost_jobs_usage TO gpu_cost_agent;
-- upsert_class_members
GRANT UPDATE (class_key, coarse_key, user_name, account, partition_name, stem, gpus, start_ts, last_seen, seen_s,
    active_s, idle_s, idle_mem_s, wakes, quiet_since, longest_quiet_s, cpu_pct_s, cpu_active_s, run_id, data_ts)
    ON gpu_cost_class_members TO gpu_cost_agent;
-- upsert_outcome
GRANT UPDATE (ts, rule, target, episode, job_id, user_name, action, outcome, outcome_ts, after_s, horizon_s, run_id,
    data_ts) ON gpu_cost_outcomes TO gpu_cost_agent;
-- upsert_forecast
GRANT UPDATE (kind, yhat, yhat_lower, yhat_upper, model, created_at, extra, run_id, data_ts)
    ON gpu_cost_forecasts TO gpu_cost_agent;
-- upsert_rightsize
GRANT UPDATE (status, jobs, gpus_asked, gpus_need, gpus_advice, ask_min, block_above, mem_peak_mib, mem_total_mib,
    time_jobs, time_asked_s, runtime_s, time_advice_s, time_ask_min_s, idle_gpu_hours, text, advice_file, run_id)
    ON gpu_cost_rightsize TO gpu_cost_agent;
