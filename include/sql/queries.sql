-- Named, parameterised statements of the audit store (SQLite and PostgreSQL alike).
-- Each block starts with "-- name: <name>"; parameters are :named (a list value binds an IN list).
-- Runs, decisions and actions are history: their statements only INSERT (into the *_log and *_events
-- tables) and read the views gpu_cost_runs / gpu_cost_decisions / gpu_cost_actions for the current state.
-- Every upsert, and every UPDATE a run makes of an escalation ladder, refuses to go back in time: a write
-- of an older data instant (an older run, cleared or retried late) never replaces what a newer one wrote
-- (tests/unit/test_results_never_go_back.py has a case for each).

-- name: insert_run
-- runs are history too: the log row is written once, every status change is a new event, and the view
-- gpu_cost_runs is the current state (running until the first event)
INSERT INTO gpu_cost_run_log (run_id, dag_id, started_at, data_ts, source, mode)
VALUES (:run_id, :dag_id, :started_at, :data_ts, :source, :mode)
ON CONFLICT (run_id) DO NOTHING;

-- name: finish_run
INSERT INTO gpu_cost_run_events (run_id, status, finished_at, problems, counts)
SELECT l.run_id, :status, :finished_at, :problems, :counts FROM gpu_cost_run_log l WHERE l.run_id = :run_id;

-- name: get_run
SELECT * FROM gpu_cost_runs WHERE run_id = :run_id;

-- name: mark_run_awaiting
INSERT INTO gpu_cost_run_events (run_id, status)
SELECT r.run_id, 'awaiting_approval' FROM gpu_cost_runs r WHERE r.run_id = :run_id AND r.status = 'running';

-- name: awaiting_approval
SELECT decision_id, run_id FROM gpu_cost_decisions
WHERE requires_approval = 1 AND approval_status = 'pending' AND status = 'decided' AND ts >= :since;

-- name: running_runs
SELECT * FROM gpu_cost_runs WHERE dag_id = :dag_id AND status = 'running' AND run_id <> :run_id AND started_at >= :since;

-- name: save_snapshot
-- a retried collect replaces the run's snapshot; an older instant never replaces a newer one
INSERT INTO gpu_cost_snapshots (run_id, ts, payload) VALUES (:run_id, :ts, :payload)
ON CONFLICT (run_id) DO UPDATE SET ts = excluded.ts, payload = excluded.payload
WHERE excluded.ts >= gpu_cost_snapshots.ts;

-- name: load_snapshot
SELECT payload FROM gpu_cost_snapshots WHERE run_id = :run_id;

-- name: release_parked
-- parked state (a run's snapshot, findings, plan) is read by the run's own tasks alone: older than the
-- policy's sweep.keep_parked it is emptied (its history is in the decisions, actions and usage rows);
-- found by the partial index of the rows not emptied yet
UPDATE gpu_cost_snapshots SET payload = '' WHERE payload <> '' AND ts < :until;

-- name: insert_decision
INSERT INTO gpu_cost_decision_log (
    decision_id, run_id, ts, rule, target_kind, target, action, mode, rung, episode, job_id, user_name,
    account, partition_name, host, gpus, reason, protection, requires_approval, approval_status, status,
    gpu_hours_at_risk, gpu_hours_saved, evidence)
VALUES (
    :decision_id, :run_id, :ts, :rule, :target_kind, :target, :action, :mode, :rung, :episode, :job_id, :user_name,
    :account, :partition_name, :host, :gpus, :reason, :protection, :requires_approval, :approval_status, :status,
    :gpu_hours_at_risk, :gpu_hours_saved, :evidence)
ON CONFLICT (decision_id) DO NOTHING;

-- name: get_decision
SELECT * FROM gpu_cost_decisions WHERE decision_id = :decision_id;

-- name: decisions_of_run
-- the run's own decisions, and those it proposed again after a cap held them back (a 'decided' event of the run)
-- (each arm by its index: the decisions' run_id, the events' run_id and status)
SELECT * FROM gpu_cost_decisions WHERE decision_id IN (
    SELECT l.decision_id FROM gpu_cost_decision_log l WHERE l.run_id = :run_id
    UNION
    SELECT e.decision_id FROM gpu_cost_decision_events e WHERE e.run_id = :run_id AND e.status = 'decided')
ORDER BY ts, decision_id;

-- name: decisions_between
SELECT * FROM gpu_cost_decisions WHERE ts >= :since AND ts < :until ORDER BY ts, decision_id;

-- name: decisions_by_ids
SELECT * FROM gpu_cost_decisions WHERE decision_id IN :ids ORDER BY ts, decision_id;

-- name: decision_events
SELECT * FROM gpu_cost_decision_events WHERE decision_id = :decision_id ORDER BY event_id;

-- name: set_decision_status
-- a new event, only when the status changes
INSERT INTO gpu_cost_decision_events (decision_id, status, recorded_by, run_id, note)
SELECT d.decision_id, :status, :recorded_by, :run_id, :note FROM gpu_cost_decisions d
WHERE d.decision_id = :decision_id AND d.status <> :status;

-- name: set_approval
INSERT INTO gpu_cost_decision_events (decision_id, approval_status, approved_by, approved_at, recorded_by, run_id, note)
SELECT l.decision_id, :approval_status, :approved_by, :approved_at, :approved_by, :run_id, :note
FROM gpu_cost_decision_log l WHERE l.decision_id = :decision_id;

-- name: action_started
INSERT INTO gpu_cost_action_log (action_id, decision_id, run_id, action, target, executor, dry_run, started_at, attempt, command)
VALUES (:action_id, :decision_id, :run_id, :action, :target, :executor, :dry_run, :started_at, :attempt, :command)
ON CONFLICT (action_id) DO NOTHING;

-- name: action_finished
-- the outcome of an action still started; the unique (action_id, prev_event_id) lets one of two
-- concurrent writers land, as a row lock did for an UPDATE
INSERT INTO gpu_cost_action_events (action_id, prev_event_id, status, finished_at, output, error, attempt)
SELECT a.action_id, COALESCE((SELECT MAX(e.event_id) FROM gpu_cost_action_events e WHERE e.action_id = a.action_id), 0),
       :status, :finished_at, :output, :error, a.attempt
FROM gpu_cost_actions a WHERE a.action_id = :action_id AND a.status = 'started'
ON CONFLICT (action_id, prev_event_id) DO NOTHING;

-- name: action_retry
INSERT INTO gpu_cost_action_events (action_id, prev_event_id, status, finished_at, output, error, attempt)
SELECT a.action_id, COALESCE((SELECT MAX(e.event_id) FROM gpu_cost_action_events e WHERE e.action_id = a.action_id), 0),
       a.status, a.finished_at, a.output, a.error, a.attempt + 1
FROM gpu_cost_actions a WHERE a.action_id = :action_id
ON CONFLICT (action_id, prev_event_id) DO NOTHING;

-- name: get_action
SELECT * FROM gpu_cost_actions WHERE action_id = :action_id;

-- name: actions_of_decision
SELECT * FROM gpu_cost_actions WHERE decision_id = :decision_id ORDER BY started_at, action_id;

-- name: actions_between
SELECT * FROM gpu_cost_actions WHERE started_at >= :since AND started_at < :until ORDER BY started_at, action_id;

-- name: get_escalation
SELECT * FROM gpu_cost_escalations WHERE rule = :rule AND target = :target AND track = :track;

-- name: open_escalations
SELECT * FROM gpu_cost_escalations WHERE track = :track AND state = 'open';

-- name: insert_escalation
-- a new episode replaces the ladder only when it is the next one and no older than what the ladder
-- last saw (its last sighting, its close): a run on older data, or a second run that read the same
-- closed ladder, never restarts a ladder at rung -1
INSERT INTO gpu_cost_escalations (rule, target, track, episode, rung, state, first_seen, last_seen, job_id, user_name)
VALUES (:rule, :target, :track, :episode, -1, 'open', :now, :now, :job_id, :user_name)
ON CONFLICT (rule, target, track) DO UPDATE SET
    episode = excluded.episode, rung = -1, state = 'open', first_seen = excluded.first_seen,
    last_seen = excluded.last_seen, last_action_at = NULL, closed_at = NULL,
    job_id = excluded.job_id, user_name = excluded.user_name
WHERE excluded.episode > gpu_cost_escalations.episode AND excluded.last_seen >= gpu_cost_escalations.last_seen
  AND (gpu_cost_escalations.closed_at IS NULL OR excluded.last_seen >= gpu_cost_escalations.closed_at);

-- name: touch_escalation
-- an older sweep never moves the last sighting back
UPDATE gpu_cost_escalations SET last_seen = :now
WHERE rule = :rule AND target = :target AND track = :track AND last_seen <= :now;

-- name: advance_escalation
-- the rung only climbs; the time of the last action never moves back (an older run that waited for an
-- approval acts later on its own instant)
UPDATE gpu_cost_escalations SET rung = :rung,
    last_action_at = CASE WHEN last_action_at IS NULL OR last_action_at < :now THEN :now ELSE last_action_at END
WHERE rule = :rule AND target = :target AND track = :track AND episode = :episode AND rung < :rung;

-- name: close_escalation
-- only a sweep at least as new as the last sighting closes the ladder (an older one did not see what a newer saw)
UPDATE gpu_cost_escalations SET state = 'closed', closed_at = :now
WHERE rule = :rule AND target = :target AND track = :track AND state = 'open' AND last_seen <= :now;

-- name: snooze_escalations
UPDATE gpu_cost_escalations SET snoozed_until = :until_ts, snooze_reason = :reason, snoozed_by = :created_by
WHERE target = :target;

-- name: insert_snooze
INSERT INTO gpu_cost_snoozes (snooze_id, target, until_ts, reason, created_by, created_at)
VALUES (:snooze_id, :target, :until_ts, :reason, :created_by, :created_at)
ON CONFLICT (snooze_id) DO NOTHING;

-- name: active_snoozes
SELECT * FROM gpu_cost_snoozes WHERE until_ts > :now ORDER BY until_ts DESC;

-- name: upsert_usage
-- a re-run of the same data instant replaces its rows; an older data instant never replaces a newer one
INSERT INTO gpu_cost_usage (ts, interval_s, host, gpu_model, user_name, account, partition_name, gpus, total_gpu_s,
    allocated_gpu_s, busy_gpu_s, idle_alloc_gpu_s, zombie_gpu_s, util_sum, run_id, data_ts)
VALUES (:ts, :interval_s, :host, :gpu_model, :user_name, :account, :partition_name, :gpus, :total_gpu_s,
    :allocated_gpu_s, :busy_gpu_s, :idle_alloc_gpu_s, :zombie_gpu_s, :util_sum, :run_id, :data_ts)
ON CONFLICT (ts, host, user_name, account, partition_name, gpu_model) DO UPDATE SET
    interval_s = excluded.interval_s, gpus = excluded.gpus, total_gpu_s = excluded.total_gpu_s,
    allocated_gpu_s = excluded.allocated_gpu_s, busy_gpu_s = excluded.busy_gpu_s,
    idle_alloc_gpu_s = excluded.idle_alloc_gpu_s, zombie_gpu_s = excluded.zombie_gpu_s, util_sum = excluded.util_sum,
    run_id = excluded.run_id, data_ts = excluded.data_ts
WHERE excluded.data_ts >= gpu_cost_usage.data_ts;

-- name: usage_between
SELECT * FROM gpu_cost_usage WHERE ts > :since AND ts <= :until;

-- name: gpu_models_of_host
-- the GPU models one host's usage rows name in (since, until]
SELECT DISTINCT gpu_model FROM gpu_cost_usage WHERE host = :host AND ts > :since AND ts <= :until AND gpu_model <> '';

-- name: usage_instants_before
-- the data instants of the last sweeps before :ts: a sweep's usage covers the time since the first
SELECT DISTINCT ts FROM gpu_cost_usage WHERE ts < :ts ORDER BY ts DESC LIMIT :limit;

-- name: usage_instant_after
SELECT MIN(ts) AS ts FROM gpu_cost_usage WHERE ts > :ts;

-- name: latest_usage_instant
-- the newest sweep the store has usage for, at or before :until (a report's period ends at its data)
SELECT MAX(ts) AS ts FROM gpu_cost_usage WHERE ts <= :until;

-- name: rescale_usage
-- a sweep recorded late takes its share of time back from the next one (only ever less): every GPU-second
-- column scales with the interval (the right-hand sides read the row as it was)
UPDATE gpu_cost_usage SET interval_s = :interval_s, total_gpu_s = total_gpu_s * :interval_s / interval_s,
    allocated_gpu_s = allocated_gpu_s * :interval_s / interval_s, busy_gpu_s = busy_gpu_s * :interval_s / interval_s,
    idle_alloc_gpu_s = idle_alloc_gpu_s * :interval_s / interval_s,
    zombie_gpu_s = zombie_gpu_s * :interval_s / interval_s, util_sum = util_sum * :interval_s / interval_s
WHERE ts = :ts AND interval_s > :interval_s;

-- name: rescale_job_usage
UPDATE gpu_cost_jobs_usage SET interval_s = :interval_s WHERE ts = :ts AND interval_s > :interval_s;

-- name: upsert_job_usage
INSERT INTO gpu_cost_jobs_usage (ts, job_id, interval_s, user_name, account, partition_name, gpu_model, job_name, gpus,
    gpus_requested, gpus_busy, gpus_active, gpus_stale, work_gpus, time_limit_s, start_ts, run_id, data_ts,
    gpus_needed, mem_max_mib, mem_total_mib)
VALUES (:ts, :job_id, :interval_s, :user_name, :account, :partition_name, :gpu_model, :job_name, :gpus,
    :gpus_requested, :gpus_busy, :gpus_active, :gpus_stale, :work_gpus, :time_limit_s, :start_ts, :run_id, :data_ts,
    :gpus_needed, :mem_max_mib, :mem_total_mib)
ON CONFLICT (ts, job_id) DO UPDATE SET
    interval_s = excluded.interval_s, user_name = excluded.user_name, account = excluded.account,
    partition_name = excluded.partition_name, gpu_model = excluded.gpu_model, job_name = excluded.job_name,
    gpus = excluded.gpus, gpus_requested = excluded.gpus_requested, gpus_busy = excluded.gpus_busy,
    gpus_active = excluded.gpus_active, gpus_stale = excluded.gpus_stale, work_gpus = excluded.work_gpus,
    time_limit_s = excluded.time_limit_s, start_ts = excluded.start_ts, run_id = excluded.run_id, data_ts = excluded.data_ts,
    gpus_needed = excluded.gpus_needed, mem_max_mib = excluded.mem_max_mib, mem_total_mib = excluded.mem_total_mib
WHERE excluded.data_ts >= gpu_cost_jobs_usage.data_ts;

-- name: job_usage_between
SELECT * FROM gpu_cost_jobs_usage WHERE ts > :since AND ts <= :until AND gpus >= :min_gpus ORDER BY ts, job_id;

-- name: job_usage_of
SELECT * FROM gpu_cost_jobs_usage WHERE job_id = :job_id AND ts <= :until ORDER BY ts DESC LIMIT 1;

-- name: job_rows_after
SELECT 1 AS later FROM gpu_cost_jobs_usage WHERE ts > :since AND ts <= :until LIMIT 1;

-- name: jobs_seen
-- how many jobs the sweeps recorded up to an instant, and over which span (forecast eta's "not among them")
SELECT COUNT(DISTINCT job_id) AS jobs, MIN(ts) AS first_ts, MAX(ts) AS last_ts FROM gpu_cost_jobs_usage
WHERE ts <= :until;

-- name: insert_saving
INSERT INTO gpu_cost_savings (saving_id, decision_id, ts, kind, target, user_name, account, gpu_model, gpus, gpu_hours, kwh, usd,
    basis, run_id, data_ts)
VALUES (:saving_id, :decision_id, :ts, :kind, :target, :user_name, :account, :gpu_model, :gpus, :gpu_hours, :kwh, :usd,
    :basis, :run_id, :data_ts)
ON CONFLICT (saving_id) DO NOTHING;

-- name: savings_between
SELECT * FROM gpu_cost_savings WHERE ts >= :since AND ts < :until ORDER BY ts;

-- name: upsert_forecast
-- a re-run of the same data instant replaces its rows; an older data instant (the 02:00 nightly after a
-- manual run on newer data) never replaces a newer one
INSERT INTO gpu_cost_forecasts (series, horizon_ts, kind, yhat, yhat_lower, yhat_upper, model, created_at, extra,
    run_id, data_ts)
VALUES (:series, :horizon_ts, :kind, :yhat, :yhat_lower, :yhat_upper, :model, :created_at, :extra, :run_id, :data_ts)
ON CONFLICT (series, horizon_ts) DO UPDATE SET
    kind = excluded.kind, yhat = excluded.yhat, yhat_lower = excluded.yhat_lower, yhat_upper = excluded.yhat_upper,
    model = excluded.model, created_at = excluded.created_at, extra = excluded.extra,
    run_id = excluded.run_id, data_ts = excluded.data_ts
WHERE excluded.data_ts >= gpu_cost_forecasts.data_ts;

-- name: forecasts_of
-- of each series, the rows of its newest data instant only (an older run's other horizons are not mixed in)
SELECT * FROM gpu_cost_forecasts f
WHERE f.series LIKE :pattern AND f.horizon_ts >= :since
  AND f.data_ts = (SELECT MAX(n.data_ts) FROM gpu_cost_forecasts n WHERE n.series = f.series)
ORDER BY f.series, f.horizon_ts;

-- name: forecasts_of_series
-- the same, for named series (a sweep's running jobs and their classes): found by each series' key, not by reading
-- every series the store keeps (one per job ever forecast)
SELECT * FROM gpu_cost_forecasts f
WHERE f.series IN :series AND f.horizon_ts >= :since
  AND f.data_ts = (SELECT MAX(n.data_ts) FROM gpu_cost_forecasts n WHERE n.series = f.series)
ORDER BY f.series, f.horizon_ts;

-- name: forecast_at
-- one stored row as its run wrote it (the nightly's steps read their own run's history rows)
SELECT * FROM gpu_cost_forecasts WHERE series = :series AND horizon_ts = :horizon_ts;

-- name: forecast_hours_between
-- the forecast each past hour had (a newer run replaces an hour's row, so it is the one in force then)
SELECT series, horizon_ts, yhat FROM gpu_cost_forecasts
WHERE series LIKE :pattern AND kind = 'demand' AND horizon_ts >= :since AND horizon_ts < :until
ORDER BY series, horizon_ts;

-- name: newest_history
-- the newest demand series the nightly stored for a key (what actually happened, hour by hour)
SELECT * FROM gpu_cost_forecasts WHERE series = :series AND kind = 'history' AND horizon_ts <= :until
ORDER BY horizon_ts DESC LIMIT 1;

-- name: action_reopen
-- tried again by a later sweep: a notice held back by the per-user rate limit, or an action that
-- failed (controller down, node unreachable) fewer than max_attempts times
INSERT INTO gpu_cost_action_events (action_id, prev_event_id, status, finished_at, output, error, attempt)
SELECT a.action_id, COALESCE((SELECT MAX(e.event_id) FROM gpu_cost_action_events e WHERE e.action_id = a.action_id), 0),
       'started', NULL, a.output, NULL, a.attempt
FROM gpu_cost_actions a
WHERE a.action_id = :action_id
  AND ((a.status = 'skipped' AND a.error LIKE 'rate limit:%') OR (a.status = 'failed' AND a.attempt < :max_attempts))
ON CONFLICT (action_id, prev_event_id) DO NOTHING;

-- ---------------------------------------------------------------------------------------------
-- Pinned policies (one per run; INSERT only)

-- name: pin_policy
INSERT INTO gpu_cost_run_policies (run_id, name, sha256, content, pinned_at)
VALUES (:run_id, :name, :sha256, :content, :pinned_at)
ON CONFLICT (run_id) DO NOTHING;

-- name: pinned_policy
SELECT run_id, name, sha256, content, pinned_at FROM gpu_cost_run_policies WHERE run_id = :run_id;

-- name: upsert_class_members
INSERT INTO gpu_cost_class_members (job_id, class_key, coarse_key, user_name, account, partition_name, stem, gpus,
    start_ts, first_seen, last_seen, seen_s, active_s, idle_s, idle_mem_s, wakes, quiet_since, longest_quiet_s,
    cpu_pct_s, cpu_active_s, run_id, data_ts)
VALUES (:job_id, :class_key, :coarse_key, :user_name, :account, :partition_name, :stem, :gpus, :start_ts, :first_seen,
    :last_seen, :seen_s, :active_s, :idle_s, :idle_mem_s, :wakes, :quiet_since, :longest_quiet_s, :cpu_pct_s,
    :cpu_active_s, :run_id, :data_ts)
ON CONFLICT (job_id) DO UPDATE SET
    class_key = excluded.class_key, coarse_key = excluded.coarse_key, user_name = excluded.user_name,
    account = excluded.account, partition_name = excluded.partition_name, stem = excluded.stem, gpus = excluded.gpus,
    start_ts = excluded.start_ts, last_seen = excluded.last_seen, seen_s = excluded.seen_s,
    active_s = excluded.active_s, idle_s = excluded.idle_s, idle_mem_s = excluded.idle_mem_s, wakes = excluded.wakes,
    quiet_since = excluded.quiet_since, longest_quiet_s = excluded.longest_quiet_s, cpu_pct_s = excluded.cpu_pct_s,
    cpu_active_s = excluded.cpu_active_s, run_id = excluded.run_id, data_ts = excluded.data_ts
WHERE excluded.data_ts > gpu_cost_class_members.data_ts;

-- name: class_members_of_jobs
SELECT * FROM gpu_cost_class_members WHERE job_id IN :job_ids;

-- name: class_members_since
-- rows written for a later instant than a process has seen (another writer's)
SELECT * FROM gpu_cost_class_members WHERE data_ts > :since;

-- name: class_members_of_classes
SELECT * FROM gpu_cost_class_members
WHERE (class_key IN :class_keys OR coarse_key IN :coarse_keys) AND last_seen > :since;

-- name: answer_nonce_used
SELECT answer_id FROM gpu_cost_answer_nonces WHERE nonce = :nonce;

-- name: claim_answer_nonce
-- a one-time request id: the first use inserts a row, a replay inserts nothing
INSERT INTO gpu_cost_answer_nonces (nonce, answer_id, ts) VALUES (:nonce, :answer_id, :ts)
ON CONFLICT (nonce) DO NOTHING;

-- name: insert_answer
INSERT INTO gpu_cost_answers (answer_id, ts, channel, choice, status, refusal, decision_id, rule, target, episode,
    job_id, answered_by, owner, role, duration_s, reason, until_ts, effect, nonce)
VALUES (:answer_id, :ts, :channel, :choice, :status, :refusal, :decision_id, :rule, :target, :episode, :job_id,
    :answered_by, :owner, :role, :duration_s, :reason, :until_ts, :effect, :nonce)
ON CONFLICT (answer_id) DO NOTHING;

-- name: answers_since
SELECT * FROM gpu_cost_answers WHERE ts >= :since ORDER BY ts, answer_id;

-- name: answers_of_decision
SELECT * FROM gpu_cost_answers WHERE decision_id = :decision_id ORDER BY ts, answer_id;

-- name: owner_releases
-- "release it now", accepted from the owner, for these targets (the replay's --approvals owner)
SELECT target, ts, answered_by FROM gpu_cost_answers
WHERE choice = 'release' AND status = 'accepted' AND role = 'owner' AND target IN :targets;

-- name: rejected_of_targets
-- the decisions on these targets a human rejected or let time out: the engine does not ask again (a sweep's
-- findings' targets only, not every decision the store ever kept)
SELECT decision_id FROM gpu_cost_decisions
WHERE target IN :targets AND approval_status IN ('rejected', 'timed_out');

-- name: disputed_episodes
-- "this is wrong", accepted, for these targets: each holds its target until it expires (until_ts)
SELECT rule, target, episode, answered_by, ts, until_ts, reason FROM gpu_cost_answers
WHERE choice = 'wrong' AND status = 'accepted' AND target IN :targets;


-- ---------------------------------------------------------------------------------------------
-- Outcomes (gpu_cost.learn.outcomes) and verifier models (gpu_cost.learn.verifier)

-- name: decisions_to_label
-- decisions that did something (or, in dry-run, would have): every action but none
SELECT decision_id, ts, rule, target_kind, target, episode, action, mode, job_id, user_name, gpus,
    gpu_hours_saved, evidence FROM gpu_cost_decisions
WHERE ts >= :since AND ts <= :until AND action <> 'none' ORDER BY ts, decision_id;

-- name: job_usage_of_jobs
SELECT ts, job_id, gpus, gpus_active FROM gpu_cost_jobs_usage
WHERE job_id IN :job_ids AND ts > :since AND ts <= :until ORDER BY job_id, ts;

-- name: last_job_usage_ts
SELECT MAX(ts) AS ts FROM gpu_cost_jobs_usage WHERE ts <= :until;

-- name: succeeded_actions_on
-- destructive effects that really happened (not dry-run) on these targets
SELECT target, action, finished_at FROM gpu_cost_actions
WHERE target IN :targets AND status = 'succeeded' AND dry_run = 0 AND action IN :actions AND finished_at >= :since;

-- name: snoozes_created_since
SELECT target, created_at, until_ts FROM gpu_cost_snoozes WHERE created_at >= :since AND created_at <= :until;

-- name: wrong_answers_since
SELECT decision_id, rule, target, episode, ts FROM gpu_cost_answers
WHERE choice = 'wrong' AND status = 'accepted' AND ts >= :since AND ts <= :until;

-- name: upsert_outcome
-- a re-run on the same data instant changes nothing; an older data instant never replaces a newer one
INSERT INTO gpu_cost_outcomes (decision_id, ts, rule, target, episode, job_id, user_name, action, outcome, outcome_ts,
    after_s, horizon_s, run_id, data_ts)
VALUES (:decision_id, :ts, :rule, :target, :episode, :job_id, :user_name, :action, :outcome, :outcome_ts, :after_s,
    :horizon_s, :run_id, :data_ts)
ON CONFLICT (decision_id) DO UPDATE SET
    ts = excluded.ts, rule = excluded.rule, target = excluded.target, episode = excluded.episode,
    job_id = excluded.job_id, user_name = excluded.user_name, action = excluded.action, outcome = excluded.outcome,
    outcome_ts = excluded.outcome_ts, after_s = excluded.after_s, horizon_s = excluded.horizon_s,
    run_id = excluded.run_id, data_ts = excluded.data_ts
WHERE excluded.data_ts > gpu_cost_outcomes.data_ts;

-- name: outcomes_between
SELECT * FROM gpu_cost_outcomes WHERE ts >= :since AND ts <= :until ORDER BY ts, decision_id;

-- name: outcomes_of_users
-- the owners' earlier labelled decisions (their history is a feature of the verifier)
SELECT user_name, outcome, outcome_ts FROM gpu_cost_outcomes
WHERE user_name IN :users AND rule IN :rules AND outcome_ts IS NOT NULL AND outcome_ts <= :until
  AND outcome IN ('active_again', 'wrong', 'ended', 'still_idle');

-- name: insert_verifier_model
INSERT INTO gpu_cost_verifier_models (model_id, trained_at, since_ts, until_ts, labels, false_positives, confirmed,
    backtest_precision, backtest_recall, false_kills_prevented, gpu_hours_given_up, status, note, model, run_id)
VALUES (:model_id, :trained_at, :since_ts, :until_ts, :labels, :false_positives, :confirmed, :backtest_precision,
    :backtest_recall, :false_kills_prevented, :gpu_hours_given_up, :status, :note, :model, :run_id)
ON CONFLICT (model_id) DO NOTHING;

-- name: latest_verifier_model
SELECT * FROM gpu_cost_verifier_models WHERE trained_at <= :until ORDER BY trained_at DESC, model_id DESC LIMIT 1;

-- name: recent_verifier_models
-- the newest models trained by :until, newest first (the sweep skips malformed ones to the last good one)
SELECT * FROM gpu_cost_verifier_models WHERE trained_at <= :until ORDER BY trained_at DESC, model_id DESC
LIMIT :limit;

-- name: verifier_models
SELECT model_id, trained_at, since_ts, until_ts, labels, false_positives, confirmed, backtest_precision,
    backtest_recall, false_kills_prevented, gpu_hours_given_up, status, note FROM gpu_cost_verifier_models
ORDER BY trained_at DESC, model_id DESC LIMIT :limit;


-- ---------------------------------------------------------------------------------------------
-- Right-sizing at submission (gpu_cost.capacity.rightsize)

-- name: rightsize_jobs
-- one row per GPU job the sweeps saw in the window: what it held and asked, when it was seen, its memory,
-- and the GPU-seconds it held beyond what each sample needed
SELECT job_id, MAX(user_name) AS user_name, MAX(account) AS account, MAX(job_name) AS job_name, MAX(gpus) AS gpus,
    MAX(gpus_requested) AS gpus_requested, MIN(start_ts) AS start_ts, MIN(ts) AS first_seen, MAX(ts) AS last_seen,
    MAX(interval_s) AS interval_s, MAX(time_limit_s) AS time_limit_s, MAX(mem_max_mib) AS mem_max_mib,
    MIN(mem_total_mib) AS mem_total_mib, COUNT(*) AS samples, COUNT(gpus_needed) AS needed_samples,
    SUM(CASE WHEN gpus_needed IS NULL THEN 0 ELSE (gpus - gpus_needed) * interval_s END) AS spare_gpu_s
FROM gpu_cost_jobs_usage WHERE ts > :since AND ts <= :until AND gpus >= 1 GROUP BY job_id;

-- name: rightsize_needs
-- per job, how many of its samples needed each number of GPUs (a histogram: quantiles without the samples)
SELECT job_id, gpus_needed, COUNT(*) AS n FROM gpu_cost_jobs_usage
WHERE ts > :since AND ts <= :until AND gpus >= 1 AND gpus_needed IS NOT NULL GROUP BY job_id, gpus_needed;

-- name: upsert_rightsize
-- a re-run of the same data instant replaces its rows
INSERT INTO gpu_cost_rightsize (data_ts, scope, user_name, stem, status, jobs, gpus_asked, gpus_need, gpus_advice,
    ask_min, block_above, mem_peak_mib, mem_total_mib, time_jobs, time_asked_s, runtime_s, time_advice_s,
    time_ask_min_s, idle_gpu_hours, text, advice_file, run_id)
VALUES (:data_ts, :scope, :user_name, :stem, :status, :jobs, :gpus_asked, :gpus_need, :gpus_advice, :ask_min,
    :block_above, :mem_peak_mib, :mem_total_mib, :time_jobs, :time_asked_s, :runtime_s, :time_advice_s,
    :time_ask_min_s, :idle_gpu_hours, :text, :advice_file, :run_id)
ON CONFLICT (data_ts, scope, user_name, stem) DO UPDATE SET
    status = excluded.status, jobs = excluded.jobs, gpus_asked = excluded.gpus_asked, gpus_need = excluded.gpus_need,
    gpus_advice = excluded.gpus_advice, ask_min = excluded.ask_min, block_above = excluded.block_above,
    mem_peak_mib = excluded.mem_peak_mib, mem_total_mib = excluded.mem_total_mib, time_jobs = excluded.time_jobs,
    time_asked_s = excluded.time_asked_s, runtime_s = excluded.runtime_s, time_advice_s = excluded.time_advice_s,
    time_ask_min_s = excluded.time_ask_min_s, idle_gpu_hours = excluded.idle_gpu_hours, text = excluded.text,
    advice_file = excluded.advice_file, run_id = excluded.run_id;

-- name: rightsize_instants
-- the instants advice was computed at, up to :until, newest first
SELECT DISTINCT data_ts FROM gpu_cost_rightsize WHERE data_ts <= :until ORDER BY data_ts DESC LIMIT :limit;

-- name: rightsize_between
SELECT * FROM gpu_cost_rightsize WHERE data_ts >= :since AND data_ts <= :until ORDER BY data_ts, scope, user_name, stem;

-- name: rightsize_jobs_started
-- the GPU jobs that started in the period, as the sweeps saw them (what they asked)
SELECT job_id, MAX(user_name) AS user_name, MAX(job_name) AS job_name, MAX(gpus_requested) AS gpus_requested,
    MAX(gpus) AS gpus, MIN(start_ts) AS start_ts, MAX(time_limit_s) AS time_limit_s
FROM gpu_cost_jobs_usage WHERE ts > :since AND ts <= :until AND gpus >= 1
GROUP BY job_id HAVING MIN(start_ts) >= :start_since AND MIN(start_ts) < :start_until;

-- name: reservations_made
-- the reservations the agent itself made: its reserve that really ran and created one (a reservation of
-- that name already there is skipped, never counted), with the decision's planned start and end
SELECT a.target, a.started_at, a.finished_at, d.evidence
FROM gpu_cost_actions a JOIN gpu_cost_decisions d ON d.decision_id = a.decision_id
WHERE a.action = 'reserve' AND a.status = 'succeeded' AND a.dry_run = 0 AND a.target IN :targets;
