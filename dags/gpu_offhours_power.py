"""
### gpu_offhours_power — power idle nodes down at night and on weekends, bring them back before demand

**What it does.** Every hour: reads nodes and jobs (Slurm, or the simulator) and GPU metrics,
plans under the policy's `offhours` section (windows in its time zone, utilisation threshold,
warm reserve, exclusions, cap per run, forecast demand), then powers nodes down with
`scontrol update nodename=<n> state=POWER_DOWN reason="gpu-cost: off-hours"` and back up with
`state=POWER_UP` (outside the windows, for pending jobs that do not fit, or for forecast demand
before the next run plus `wake_lead`; the forecast's 80 % upper bound). With
`offhours.forecast_lulls` the forecast sizes the nodes kept up at every hour, predicted lulls
included (`gpu-cost power replay` compares it with Slurm's own power saving first). Slurm runs the site's `SuspendProgram` / `ResumeProgram` and wakes nodes by
itself when a job needs one. Each powered-down node-hour goes to the savings ledger (kWh, money).
With `reservations.enabled`, it also reserves nodes for an account whose forecast peak would not
fit (`scontrol create reservation`, the `reserve` step); more than
`reservations.approval_over_nodes` nodes need the same approval.

**Safety.** Dry-run by default (param `dry_run`, and the policy's mode must be `enforce`). More
than `offhours.approval_over_nodes` nodes in one run need a human (Approve / Reject; no answer
within `approval.timeout` = Reject). Waking never waits for approval. Every action has an audit
row before and after (`gpu_cost_actions`). The act steps read what to do from the audit store by
the run id (XCom carries only the run id and a summary). Nodes a protection names
(`match: {nodes: [...]}`) or that run a protected job are never powered down.

**Knobs.** `GPU_COST_POWER_SCHEDULE` (cron, default `@hourly`; `none`: manual triggers only).

**Owner / triage.** GPU platform team. A node that stays `idle~` during the day: check
`gpu_cost_actions` for a failed `power_up` and Slurm's `ResumeProgram` log. A node that never goes
down: the run's `gpu_cost_runs.counts.held` says why (busy cluster, pending high-priority work,
no fresh GPU metrics, reserve).
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import Param, dag, task

from gpu_cost.airflow import power_tasks, runtime
from gpu_cost.airflow.approval import RecordingApprovalOperator

DEFAULT_ARGS = {"owner": "gpu-platform", "retries": 1, "retry_delay": dt.timedelta(minutes=2)}


@dag(
    dag_id="gpu_offhours_power",
    schedule=runtime.schedule("GPU_COST_POWER_SCHEDULE", "@hourly"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["gpu-cost", "power"],
    doc_md=__doc__,
    params={
        "dry_run": Param(True, type="boolean", description="Record what would be done; power nothing"),
        "policy": runtime.policy_param(),
        "source": runtime.source_param(["sim", "slurm", "prometheus"]),
    },
)
def gpu_offhours_power() -> None:
    @task
    def plan(params=None, **context):  # type: ignore[no-untyped-def]
        return power_tasks.plan_task(params or {}, context)

    approve = RecordingApprovalOperator(task_id="approve")

    @task
    def power_up(p, **context):  # type: ignore[no-untyped-def]
        return power_tasks.act_task(p, "power_up", context)

    @task(trigger_rule="none_failed_min_one_success")
    def power_down(p, **context):  # type: ignore[no-untyped-def]
        return power_tasks.act_task(p, "power_down", context)

    @task(trigger_rule="none_failed_min_one_success")
    def reserve(p, **context):  # type: ignore[no-untyped-def]
        return power_tasks.act_task(p, "reserve", context)

    @task(trigger_rule="all_done")
    def record(p, **context):  # type: ignore[no-untyped-def]
        return power_tasks.record_task(p, context)

    p = plan()
    up = power_up(p)
    down = power_down(p)
    held = reserve(p)
    p >> approve >> [down, held]
    [up, down, held] >> record(p)


dag_object = gpu_offhours_power()

if __name__ == "__main__":
    dag_object.test()
