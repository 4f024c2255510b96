-- Audit store schema, PostgreSQL dialect. Table names are a contract; columns may grow.
-- Times are TIMESTAMPTZ (the store binds ISO 8601 UTC text).
-- This file describes the head revision of the migrations in plugins/gpu_cost/audit/migrations/: a fresh
-- store is created from it (and stamped at head); an existing one is migrated. Change both together
-- (tests/unit/test_audit_migrations.py compares them).
-- Nothing is ever deleted or rewritten: what was decided and done is in the *_log tables, every later
-- status change, approval and outcome is a new row of an *_events table, and gpu_cost_runs,
-- gpu_cost_decisions and gpu_cost_actions are views of the current state (the latest event of each kind
-- wins, by event_id).
-- Every stored result (usage, job usage, forecasts, savings) names the run and the data instant it
-- came from (run_id, data_ts); an upsert never lets an older data instant replace a newer one.

-- what a run is (written once when it starts); its status changes are gpu_cost_run_events
CREATE TABLE IF NOT EXISTS gpu_cost_run_log (
    run_id          TEXT PRIMARY KEY,
    dag_id          TEXT,
    started_at      TIMESTAMPTZ NOT NULL,
    data_ts         TIMESTAMPTZ,
    source          TEXT,
    mode            TEXT
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_run_log_dag ON gpu_cost_run_log (dag_id, started_at);

-- a status change of a run (awaiting an approval, finished with its problems and counts), appended
CREATE TABLE IF NOT EXISTS gpu_cost_run_events (
    event_id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id          TEXT NOT NULL,
    ts              TIMESTAMPTZ NOT NULL DEFAULT now(), -- when it was written
    status          TEXT NOT NULL,                     -- awaiting_approval | ok | degraded | failed | capped | stale | refused | rejected
    finished_at     TIMESTAMPTZ,
    problems        TEXT,                              -- JSON list
    counts          TEXT                               -- JSON object
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_run_events_run ON gpu_cost_run_events (run_id, event_id);

-- current state of every run (the columns of the former table, in its order; no event yet: running)
CREATE OR REPLACE VIEW gpu_cost_runs AS
SELECT l.run_id, l.dag_id, l.started_at, e.finished_at, l.data_ts, l.source, l.mode,
       COALESCE(e.status, 'running') AS status, e.problems, e.counts
FROM gpu_cost_run_log l
LEFT JOIN gpu_cost_run_events e ON e.event_id = (
    SELECT MAX(x.event_id) FROM gpu_cost_run_events x WHERE x.run_id = l.run_id);

CREATE TABLE IF NOT EXISTS gpu_cost_snapshots (
    run_id          TEXT PRIMARY KEY,
    ts              TIMESTAMPTZ NOT NULL,
    payload         TEXT NOT NULL                      -- Snapshot JSON
);
-- the parked state not released yet (release_parked empties what is older than sweep.keep_parked)
CREATE INDEX IF NOT EXISTS ix_gpu_cost_snapshots_parked ON gpu_cost_snapshots (ts) WHERE payload <> '';

CREATE TABLE IF NOT EXISTS gpu_cost_decision_log (
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
    approval_status TEXT,                              -- as decided: pending (or NULL)
    status          TEXT NOT NULL DEFAULT 'decided',   -- as decided
    gpu_hours_at_risk DOUBLE PRECISION NOT NULL DEFAULT 0,
    gpu_hours_saved DOUBLE PRECISION NOT NULL DEFAULT 0,
    evidence        TEXT                               -- JSON object
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_decision_log_ts ON gpu_cost_decision_log (ts);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_decision_log_target ON gpu_cost_decision_log (target);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_decision_log_run ON gpu_cost_decision_log (run_id);

-- a status change (status set) or an approval answer (approval_status set), appended
CREATE TABLE IF NOT EXISTS gpu_cost_decision_events (
    event_id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    decision_id     TEXT NOT NULL,
    ts              TIMESTAMPTZ NOT NULL DEFAULT now(), -- when it was written
    status          TEXT,                              -- decided | recorded | acted | rejected | capped | failed | expired
    approval_status TEXT,                              -- pending | approved | rejected | timed_out
    approved_by     TEXT,
    approved_at     TIMESTAMPTZ,
    recorded_by     TEXT,
    run_id          TEXT,
    note            TEXT
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_decision_events_decision ON gpu_cost_decision_events (decision_id, event_id);
-- a run's re-proposed decisions (decisions_of_run)
CREATE INDEX IF NOT EXISTS ix_gpu_cost_decision_events_run ON gpu_cost_decision_events (run_id, status);

CREATE TABLE IF NOT EXISTS gpu_cost_action_log (
    action_id       TEXT PRIMARY KEY,                  -- decision_id + ":" + step
    decision_id     TEXT NOT NULL,
    run_id          TEXT,
    action          TEXT NOT NULL,
    target          TEXT NOT NULL,
    executor        TEXT,
    dry_run         INTEGER NOT NULL DEFAULT 0,
    started_at      TIMESTAMPTZ NOT NULL,
    attempt         INTEGER NOT NULL DEFAULT 1,
    command         TEXT
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_action_log_decision ON gpu_cost_action_log (decision_id);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_action_log_target ON gpu_cost_action_log (target);
-- the rolling caps' count of the last day's actions (every destructive start)
CREATE INDEX IF NOT EXISTS ix_gpu_cost_action_log_started ON gpu_cost_action_log (started_at);
-- ... of the destructive kinds alone: the day's notices outnumber them
CREATE INDEX IF NOT EXISTS ix_gpu_cost_action_log_action ON gpu_cost_action_log (action, started_at);

-- the action's whole state after a change (finished, retried, reopened), appended; prev_event_id is
-- the event it follows (0: the started row), so of two concurrent changes of one state only one lands
CREATE TABLE IF NOT EXISTS gpu_cost_action_events (
    event_id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action_id       TEXT NOT NULL,
    prev_event_id   BIGINT NOT NULL DEFAULT 0,
    ts              TIMESTAMPTZ NOT NULL DEFAULT now(), -- when it was written
    status          TEXT NOT NULL,                     -- started | succeeded | failed | skipped
    finished_at     TIMESTAMPTZ,
    output          TEXT,
    error           TEXT,
    attempt         INTEGER NOT NULL DEFAULT 1,
    UNIQUE (action_id, prev_event_id)
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_action_events_action ON gpu_cost_action_events (action_id, event_id);

-- current state of every decision (the columns of the former table, in its order); an approval comes
-- from an approval event only (the approver's role writes them), the log says at most "pending"
CREATE OR REPLACE VIEW gpu_cost_decisions AS
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
    WHERE e.decision_id = l.decision_id AND e.approval_status IS NOT NULL);

-- current state of every action (the columns of the former table, in its order)
CREATE OR REPLACE VIEW gpu_cost_actions AS
SELECT l.action_id, l.decision_id, l.run_id, l.action, l.target, l.executor, l.dry_run,
       COALESCE(e.status, 'started') AS status, l.started_at, e.finished_at, COALESCE(e.attempt, l.attempt) AS attempt,
       l.command, e.output, e.error
FROM gpu_cost_action_log l
LEFT JOIN gpu_cost_action_events e ON e.event_id = (
    SELECT MAX(x.event_id) FROM gpu_cost_action_events x WHERE x.action_id = l.action_id);

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
-- every sweep reads the open episodes of its track; a snooze finds a target's
CREATE INDEX IF NOT EXISTS ix_gpu_cost_escalations_open ON gpu_cost_escalations (track, state);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_escalations_target ON gpu_cost_escalations (target);

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
    run_id          TEXT,                              -- the run that wrote it
    data_ts         TIMESTAMPTZ NOT NULL,          -- the data instant it came from
    PRIMARY KEY (series, horizon_ts)
);

CREATE TABLE IF NOT EXISTS gpu_cost_usage (
    ts              TIMESTAMPTZ NOT NULL,          -- end of the interval
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
    run_id          TEXT,                              -- the run that wrote it
    data_ts         TIMESTAMPTZ NOT NULL,          -- the data instant it came from
    PRIMARY KEY (ts, host, user_name, account, partition_name, gpu_model)
);
-- a saving is priced by its host's GPU model (gpu_models_of_host): the host's rows, not every host's
CREATE INDEX IF NOT EXISTS ix_gpu_cost_usage_host ON gpu_cost_usage (host, ts);

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
    basis           TEXT,                          -- how the saving was computed
    run_id          TEXT,                              -- the run that wrote it
    data_ts         TIMESTAMPTZ NOT NULL           -- the data instant it came from
);

CREATE TABLE IF NOT EXISTS gpu_cost_jobs_usage (
    ts              TIMESTAMPTZ NOT NULL,          -- end of the interval (sweep instant)
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
    run_id          TEXT,                              -- the run that wrote it
    data_ts         TIMESTAMPTZ NOT NULL,          -- the data instant it came from
    gpus_needed     INTEGER,                           -- GPUs it needed: busy (stale counted busy), work, memory
    mem_max_mib     DOUBLE PRECISION,                   -- most framebuffer used on one of its GPUs in the window
    mem_total_mib   DOUBLE PRECISION,                   -- framebuffer of its GPUs (the smallest)
    PRIMARY KEY (ts, job_id)
);

-- The policy each run decided under, pinned when the run starts: every later task of the run, and
-- an approval answered later, reads it from here (an edit of the file mid-run changes nothing).
CREATE TABLE IF NOT EXISTS gpu_cost_run_policies (
    run_id          TEXT PRIMARY KEY,
    name            TEXT NOT NULL,                 -- the policy's name (file in the policy directory)
    sha256          TEXT NOT NULL,                 -- of the content
    content         TEXT NOT NULL,                 -- the YAML as read
    pinned_at       TIMESTAMPTZ NOT NULL
);

-- Class baselines (gpu_cost.analyse.baselines): one row per job the sweeps have seen, with its class and what it
-- did; a class's baseline is computed from its members' rows. Derived, like the usage tables.
CREATE TABLE IF NOT EXISTS gpu_cost_class_members (
    job_id          TEXT PRIMARY KEY,
    class_key       TEXT NOT NULL,                 -- user, account, partition, name stem, GPUs
    coarse_key      TEXT NOT NULL,                 -- account, partition, GPUs
    user_name       TEXT NOT NULL DEFAULT '',
    account         TEXT NOT NULL DEFAULT '',
    partition_name  TEXT NOT NULL DEFAULT '',
    stem            TEXT NOT NULL DEFAULT '',      -- the job name with numbers and hashes stripped
    gpus            INTEGER NOT NULL DEFAULT 0,
    start_ts        DOUBLE PRECISION,                          -- epoch seconds
    first_seen      TIMESTAMPTZ NOT NULL,
    last_seen       TIMESTAMPTZ NOT NULL,
    seen_s          DOUBLE PRECISION NOT NULL DEFAULT 0,     -- wall time observed
    active_s        DOUBLE PRECISION NOT NULL DEFAULT 0,     -- of which some GPU was active
    idle_s          DOUBLE PRECISION NOT NULL DEFAULT 0,     -- every GPU fresh and idle
    idle_mem_s      DOUBLE PRECISION NOT NULL DEFAULT 0,     -- idle with memory resident on every GPU
    wakes           INTEGER NOT NULL DEFAULT 0,    -- activity after a quiet spell of baselines.quiet_gap
    quiet_since     DOUBLE PRECISION,                          -- epoch seconds the current quiet spell began; NULL while active
    longest_quiet_s DOUBLE PRECISION NOT NULL DEFAULT 0,
    cpu_pct_s       DOUBLE PRECISION NOT NULL DEFAULT 0,     -- node CPU % x seconds, while active on a node it has alone
    cpu_active_s    DOUBLE PRECISION NOT NULL DEFAULT 0,     -- the seconds of that
    run_id          TEXT,
    data_ts         TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS gpu_cost_class_members_class ON gpu_cost_class_members (class_key, last_seen);
CREATE INDEX IF NOT EXISTS gpu_cost_class_members_coarse ON gpu_cost_class_members (coarse_key, last_seen);
-- every sweep reads the rows another writer stored since it last looked (class_members_since)
CREATE INDEX IF NOT EXISTS ix_gpu_cost_class_members_data_ts ON gpu_cost_class_members (data_ts);

-- Answers (gpu_cost.decide.answers): what the people a notice reached answered, accepted or refused (with why),
-- and the one-time requests already used (a replayed link or Slack request is refused). History.
CREATE TABLE IF NOT EXISTS gpu_cost_answers (
    answer_id       TEXT PRIMARY KEY,
    ts              TIMESTAMPTZ NOT NULL,
    channel         TEXT NOT NULL,                 -- slack | link
    choice          TEXT NOT NULL,                 -- keep | release | wrong (or what was asked, when refused)
    status          TEXT NOT NULL,                 -- accepted | refused
    refusal         TEXT,                          -- why it was refused
    decision_id     TEXT,                          -- the notice's decision
    rule            TEXT,
    target          TEXT,
    episode         INTEGER,
    job_id          TEXT,
    answered_by     TEXT,                          -- the policy user (a Slack id nobody in people has, as given)
    owner           TEXT,                          -- the target's owner
    role            TEXT,                          -- owner | manager (of the owner) | NULL
    duration_s      DOUBLE PRECISION,                          -- keep: for how long
    reason          TEXT,
    until_ts        TIMESTAMPTZ,                          -- keep: until when
    effect          TEXT,                          -- the snooze id, the release's DAG run id
    nonce           TEXT                           -- the request's one-time id
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_answers_target ON gpu_cost_answers (target, ts);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_answers_decision ON gpu_cost_answers (decision_id);
CREATE TABLE IF NOT EXISTS gpu_cost_answer_nonces (
    nonce           TEXT PRIMARY KEY,
    answer_id       TEXT NOT NULL,
    ts              TIMESTAMPTZ NOT NULL
);

-- Outcomes (gpu_cost.learn.outcomes): what happened after each decision that did something, from later sweeps:
-- active_again | ended | acted | snoozed | wrong | still_idle | pending. Derived, like the usage tables.
-- Verifier models (gpu_cost.learn.verifier): every model trained on those labels, with its backtest. History.
CREATE TABLE IF NOT EXISTS gpu_cost_outcomes (
    decision_id     TEXT PRIMARY KEY,
    ts              TIMESTAMPTZ NOT NULL,
    rule            TEXT NOT NULL,
    target          TEXT NOT NULL,
    episode         INTEGER NOT NULL DEFAULT 1,
    job_id          TEXT,
    user_name       TEXT,
    action          TEXT NOT NULL,
    outcome         TEXT NOT NULL,
    outcome_ts      TIMESTAMPTZ,
    after_s         DOUBLE PRECISION,
    horizon_s       DOUBLE PRECISION NOT NULL,
    run_id          TEXT,
    data_ts         TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_outcomes_user ON gpu_cost_outcomes (user_name, ts);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_jobs_usage_job ON gpu_cost_jobs_usage (job_id, ts);
CREATE TABLE IF NOT EXISTS gpu_cost_verifier_models (
    model_id        TEXT PRIMARY KEY,
    trained_at      TIMESTAMPTZ NOT NULL,
    since_ts        TIMESTAMPTZ,
    until_ts        TIMESTAMPTZ,
    labels          INTEGER NOT NULL DEFAULT 0,
    false_positives INTEGER NOT NULL DEFAULT 0,
    confirmed       INTEGER NOT NULL DEFAULT 0,
    backtest_precision DOUBLE PRECISION,
    backtest_recall DOUBLE PRECISION,
    false_kills_prevented INTEGER,
    gpu_hours_given_up DOUBLE PRECISION,
    status          TEXT NOT NULL,
    note            TEXT,
    model           TEXT,
    run_id          TEXT
);

-- Right-sizing advice (gpu_cost.capacity.rightsize): per user and per job class (user, name stem) with enough finished
-- jobs, as of one data instant; what the nightly wrote to the advice file the Slurm cli_filter reads. Derived,
-- like the usage tables: a re-run of the same instant replaces its rows.
CREATE TABLE IF NOT EXISTS gpu_cost_rightsize (
    data_ts         TIMESTAMPTZ NOT NULL,                -- the history's instant (the nightly's data instant)
    scope           TEXT NOT NULL,                 -- class | user
    user_name       TEXT NOT NULL,
    stem            TEXT NOT NULL DEFAULT '',      -- class: the job name stem; user: ''
    status          TEXT NOT NULL,                 -- advice | fits (enough history, nothing to advise)
    jobs            INTEGER NOT NULL DEFAULT 0,    -- finished jobs the advice rests on
    gpus_asked      INTEGER NOT NULL DEFAULT 0,    -- the most common request
    gpus_need       INTEGER NOT NULL DEFAULT 0,    -- GPUs needed (rightsize.quantile of jobs' quantile of samples)
    gpus_advice     INTEGER NOT NULL DEFAULT 0,    -- 0: no GPU advice
    ask_min         INTEGER NOT NULL DEFAULT 0,    -- requests of at least this many GPUs are shown the advice
    block_above     INTEGER NOT NULL DEFAULT 0,    -- requests above this are refused (0: never)
    mem_peak_mib    DOUBLE PRECISION,                   -- peak framebuffer on one GPU (quantile over jobs)
    mem_total_mib   DOUBLE PRECISION,
    time_jobs       INTEGER NOT NULL DEFAULT 0,    -- jobs that ended on their own (the time advice rests on)
    time_asked_s    DOUBLE PRECISION,                   -- median time limit asked (NULL: none known)
    runtime_s       DOUBLE PRECISION,                   -- run time (quantile)
    time_advice_s   DOUBLE PRECISION NOT NULL DEFAULT 0,      -- 0: no --time advice
    time_ask_min_s  DOUBLE PRECISION NOT NULL DEFAULT 0,      -- limits of at least this are shown the advice
    idle_gpu_hours  DOUBLE PRECISION NOT NULL DEFAULT 0,      -- GPU-hours held beyond the need in the lookback
    text            TEXT,                          -- the advice in words
    advice_file     TEXT,                          -- where it was published (NULL: not written)
    run_id          TEXT,
    PRIMARY KEY (data_ts, scope, user_name, stem)
);
CREATE INDEX IF NOT EXISTS ix_gpu_cost_rightsize_user ON gpu_cost_rightsize (user_name, data_ts);
