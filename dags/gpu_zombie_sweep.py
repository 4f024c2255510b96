"""
### gpu_zombie_sweep — find and reclaim wasted GPUs, every 5 minutes

**What it does.** Checks the policy, waits for fresh metrics, collects a snapshot of the cluster
(GPU metrics, jobs, GPU processes), runs the rules (`zombie`, `idle_allocation`,
`low_efficiency`), decides under the policy (protections, escalation ladder, snoozes, mode, cost
of being wrong, caps) and records every decision in the audit store (`gpu_cost_db`). Then it
branches: recorded-only decisions stop there; decisions that need a human go to `approve` (a
*Required action* in the UI, default **Reject** after the policy's `approval.timeout`);
automatic ones go straight to `act`. A run waiting for an answer does not hold up the sweep:
later runs go on deciding and acting (they do not ask about the waiting decisions again, and the
ladder of those targets waits for the answer); the approved decisions are re-checked on fresh
data before `act_approved` carries them out. `finish` closes the run's audit row and pushes the summary
to XCom (`summary`).

**Very large clusters.** `collect` and `detect` run once per node group (`shards`: the policy's
`sweep.shards`, default 1), as mapped tasks spread over the workers; `merge` puts the groups'
snapshots together and ONE `decide` takes every group's findings (one engine, caps counted once).

**Modes.** The policy's `mode` decides what happens: `dry-run` records only (the shipped default),
`notify` tells people and does nothing destructive, `enforce` acts.

**Knobs.** Params `policy` (a policy of the deployment's directory `GPU_COST_POLICY_DIR`, by
name, never a path; the form suggests the shipped names, a typed name the directory lacks fails
`check_policy`) and `source` (`configured`, the default: `GPU_COST_SOURCE`, else the policy's; or
`sim` / `prometheus`), or the environment variables `GPU_COST_POLICY` and `GPU_COST_SOURCE`;
`GPU_COST_SWEEP_SCHEDULE` (cron, default every 5 minutes; `none`: manual triggers only); `GPU_COST_SLURM=local|ssh` says
where Slurm commands run.

**Owner / triage.** GPU platform team. `gpu-cost audit --job ID` shows what the agent decided
about a job and did to it, and why.
- `check_policy` failed: the policy file is invalid (the log names file, path and reason).
- `metrics_fresh` timed out: the metrics source is silent or stale; nothing was decided
  (`gpu_cost_runs.status = stale`).
- `act` failed with "cap exceeded": the run wanted to act on more than the policy's `caps` allow;
  nothing acted, the decisions are `capped` — check the policy and the data before raising a cap.
- `finish` failed: read its message (stale, capped, failed actions in `gpu_cost_actions`).
  "XCom tampering before <task>": someone changed a task's XCom (REST API) and re-ran the tasks
  after it; only what the audit store holds was carried out, nothing the XCom added (alert row:
  rule `xcom_tampering` in `gpu_cost_decisions`). Find who in Airflow's audit log.
- A degraded run (missing or stale GPUs) acts on nothing destructive; see `gpu_cost_runs.problems`.
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import PokeReturnValue, dag, task

from gpu_cost.airflow import runtime, sweep_tasks
from gpu_cost.airflow.approval import RecordingApprovalOperator

DEFAULT_ARGS = {"owner": "gpu-platform", "retries": 2, "retry_delay": dt.timedelta(seconds=30)}
#: how long the sensor waits for fresh metrics: under the 5-minute schedule, so runs never pile up
METRICS_WAIT = dt.timedelta(minutes=4)
#: runs at once. A run that has asked a human marks itself ``awaiting_approval`` and waits (up to the
#: policy's approval.timeout, 1 h = 12 sweeps by default) while the next sweeps decide and act; they
#: do not ask about its decisions again. Two runs deciding at once are still kept from both acting by
#: the run guard in ``act`` (gpu_cost.act.locks).
MAX_ACTIVE_RUNS = 16
#: cron schedule; ``GPU_COST_SWEEP_SCHEDULE`` overrides it (keep it equal to the policy's
#: sweep.interval), ``none`` leaves only manual triggers
SCHEDULE = runtime.schedule("GPU_COST_SWEEP_SCHEDULE", "*/5 * * * *")


@dag(
    dag_id="gpu_zombie_sweep",
    schedule=SCHEDULE,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=MAX_ACTIVE_RUNS,
    default_args=DEFAULT_ARGS,
    tags=["gpu-cost", "sweep"],
    doc_md=__doc__,
    params={
        "policy": runtime.policy_param(),
        "source": runtime.source_param(["sim", "prometheus"]),
    },
)
def gpu_zombie_sweep() -> None:
    @task
    def check_policy(params=None, **context):  # type: ignore[no-untyped-def]
        return sweep_tasks.check_policy(params or {}, context)

    @task.sensor(mode="reschedule", poke_interval=30, timeout=METRICS_WAIT.total_seconds())
    def metrics_fresh(cfg, **context):  # type: ignore[no-untyped-def]
        fresh, why = sweep_tasks.metrics_fresh(cfg, context)
        return PokeReturnValue(is_done=fresh, xcom_value=why)

    # collect and detect run once per node group (the policy's sweep.shards), spread over the
    # workers; the groups' snapshots and findings meet in ONE merge and ONE decide
    @task
    def shards(cfg, **context):  # type: ignore[no-untyped-def]
        return sweep_tasks.shards(cfg, context)

    @task
    def collect(cfg, part, **context):  # type: ignore[no-untyped-def]
        return sweep_tasks.collect(cfg, part, context)

    @task
    def merge(cfg, parts, **context):  # type: ignore[no-untyped-def]
        return sweep_tasks.merge(cfg, parts, context)

    # findings and the plan go through the audit store; XCom carries counts and decision ids, which
    # the next task compares with the store (a difference is recorded as tampering, never acted on)
    @task
    def detect(ref, part, **context):  # type: ignore[no-untyped-def]
        return sweep_tasks.detect(ref, part, context)

    @task
    def decide(ref, found, **context):  # type: ignore[no-untyped-def]
        return sweep_tasks.decide(ref, found, context)

    @task
    def record(ref, plan, **context):  # type: ignore[no-untyped-def]
        return sweep_tasks.record(ref, plan, context)

    @task.branch
    def route(summary):  # type: ignore[no-untyped-def]
        return sweep_tasks.route(summary)

    # the act steps read what to do from the audit store by the run's id, never from XCom
    @task
    def act(ref, **context):  # type: ignore[no-untyped-def]
        return sweep_tasks.act(ref, "automatic", context)

    @task
    def act_approved(ref, **context):  # type: ignore[no-untyped-def]
        return sweep_tasks.act(ref, "approved", context)

    @task(trigger_rule="all_done")
    def finish(**context):  # type: ignore[no-untyped-def]
        return sweep_tasks.finish(context)

    approve = RecordingApprovalOperator(task_id="approve")

    cfg = check_policy()
    groups = shards(cfg)
    metrics_fresh(cfg) >> groups
    parts = collect.partial(cfg=cfg).expand(part=groups)
    ref = merge(cfg, parts)
    plan = decide(ref, detect.partial(ref=ref).expand(part=parts))
    summary = record(ref, plan)
    branch = route(summary)
    automatic = act(ref)
    approved = act_approved(ref)
    branch >> [automatic, approve]
    approve >> approved
    [automatic, approved] >> finish()


dag_object = gpu_zombie_sweep()

if __name__ == "__main__":
    dag_object.test()
