"""
### gpu_manual_reclaim — an operator reclaims GPUs by hand, under the same policy as the sweep

**What it does.** Triggered from the Airflow UI form (no schedule). The form asks for the target
kind (job / node / user / process), the target ids (one per line: job ids such as `1234` or
`1234_5`, node names, user names, or `node:pid` for a process), the action (notify / demote /
cancel / kill process / power down), a reason, dry-run (on by default) and an explicit protection
override with its justification. A malformed form is refused before the run starts.

The run then goes through the same policy checks as `gpu_zombie_sweep`: `prepare` resolves the
targets in a fresh snapshot and applies protections (a protected target is recorded and left alone
unless overridden; an override is recorded and always needs a second person's approval), inference
services, the cost of being wrong and the per-run caps. Then two branches, like the sweep's:
`act` runs at once the decisions that need no human; `approve` asks a human (Required Actions)
for the others and skips itself when there are none, and `act_approved` runs them on *Approve*
(*Reject*, or no answer within the policy's `approval.timeout`, skips it: only the decisions listed
in the approval request are held back). Both run the same executors with the same audit rows as
the sweep; `finish` records the approval and the outcome in `gpu_cost_runs` /
`gpu_cost_decisions` / `gpu_cost_actions`.

**Owner / triage.** GPU platform team. A failed `prepare` names every bad field or unknown target
(nothing was done; the run is recorded as `refused`). A failed `finish` means an action failed:
see `gpu_cost_actions.error` for the decision ids in its log. Re-running a run never acts twice
(decision ids come from the run and its params).
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import Param, dag, task

from gpu_cost.airflow import reclaim_tasks, runtime
from gpu_cost.airflow.approval import RecordingApprovalOperator
from gpu_cost.loop.reclaim import FORM_ACTIONS, ID_PATTERN, MAX_TARGETS, MIN_REASON, TARGET_KINDS

DEFAULT_ARGS = {"owner": "gpu-platform", "retries": 1, "retry_delay": dt.timedelta(seconds=30)}

PARAMS = {
    "target_kind": Param("job", type="string", enum=list(TARGET_KINDS), title="Target kind",
                         description="What the ids below name.",
                         values_display={"job": "Slurm job", "node": "Node", "user": "User (all their jobs)",
                                         "process": "GPU process (node:pid)"}),
    "target_ids": Param([], type="array", minItems=1, maxItems=MAX_TARGETS, title="Target ids",
                        items={"type": "string", "pattern": ID_PATTERN, "maxLength": 253},
                        description="One per line: job ids (1234, 1234_5), node names (gpu01), user names, "
                                    "or node:pid for a process (gpu01:4242)."),
    "action": Param("notify", type="string", enum=list(FORM_ACTIONS), title="Action",
                    values_display={"notify": "Notify the owner", "demote": "Demote (lower priority / preemptible)",
                                    "cancel": "Cancel the job(s)", "kill_process": "Kill the GPU process",
                                    "power_down": "Power the node down"}),
    "reason": Param(type="string", minLength=MIN_REASON, maxLength=500, title="Reason",
                    description="Why: recorded in the audit table and shown to the owner."),
    "dry_run": Param(True, type="boolean", title="Dry run",
                     description="On: record what would be done and act on nothing."),
    "override_protections": Param(False, type="boolean", title="Override protections",
                                  description="Act on protected targets too. Recorded, and needs a second "
                                              "person's approval."),
    # nullable: an empty required-looking string field would keep the UI's Trigger button disabled
    "override_justification": Param(None, type=["null", "string"], maxLength=500, title="Override justification",
                                    description=f"Required (at least {MIN_REASON} characters) when overriding."),
    "policy": runtime.policy_param(),
    "source": runtime.source_param(["sim", "prometheus"]),
}


@dag(
    dag_id="gpu_manual_reclaim",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    default_args=DEFAULT_ARGS,
    tags=["gpu-cost", "manual"],
    doc_md=__doc__,
    params=PARAMS,
)
def gpu_manual_reclaim() -> None:
    @task
    def prepare(params=None, **context):  # type: ignore[no-untyped-def]
        from airflow.sdk.exceptions import AirflowFailException

        from gpu_cost.loop.reclaim import ReclaimRequestError

        try:
            return reclaim_tasks.prepare(params or {}, context)
        except ReclaimRequestError as exc:  # a bad request never gets better by retrying
            raise AirflowFailException(str(exc)) from exc

    # the act steps read what to do from the audit store by the run's id, never from XCom
    @task
    def act(prep, **context):  # type: ignore[no-untyped-def]
        return reclaim_tasks.act(prep, "automatic", context)

    # skips itself when no decision of the run needs a human; Reject (or the timeout) skips `act_approved`
    approve = RecordingApprovalOperator(task_id="approve")

    @task
    def act_approved(prep, **context):  # type: ignore[no-untyped-def]
        return reclaim_tasks.act(prep, "approved", context)

    @task(trigger_rule="all_done")
    def finish(ti=None):  # type: ignore[no-untyped-def]
        return reclaim_tasks.finish(ti.xcom_pull(task_ids="prepare"), ti.xcom_pull(task_ids="approve", key="decision"),
                                    ti.xcom_pull(task_ids="act"), ti.xcom_pull(task_ids="act_approved"))

    prep = prepare()
    automatic = act(prep)
    prep >> approve
    approved = act_approved(prep)
    approve >> approved
    [automatic, approved] >> finish()


dag_object = gpu_manual_reclaim()

if __name__ == "__main__":
    dag_object.test()
