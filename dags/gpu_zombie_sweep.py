"""
### gpu_zombie_sweep — find and reclaim wasted GPUs, every 5 minutes

**What it does.** Collects a snapshot of the cluster (GPU metrics, jobs, GPU processes), runs the
rules (`zombie`, `idle_allocation`, `low_efficiency`), decides under the policy (protections,
escalation ladder, mode, caps) and records every decision in the audit store (`gpu_cost_db`).

**Modes.** The policy's `mode` decides what happens: `dry-run` records only (the shipped default),
`notify` tells people, `enforce` acts.

**Knobs.** Params `policy` (path of the policy file) and `source` (`sim` / `prometheus`), or the
environment variables `GPU_COST_POLICY` and `GPU_COST_SOURCE`.

**Owner / triage.** GPU platform team. A failed `check_policy` means the policy file is invalid
(the log names file, path and reason). A degraded run (missing or stale data) acts on nothing; see
`gpu_cost_runs.problems`.
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import Param, dag, task

from gpu_cost.airflow import sweep_tasks

DEFAULT_ARGS = {"owner": "gpu-platform", "retries": 2, "retry_delay": dt.timedelta(seconds=30)}


@dag(
    dag_id="gpu_zombie_sweep",
    schedule="*/5 * * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["gpu-cost", "sweep"],
    doc_md=__doc__,
    params={
        "policy": Param(None, type=["null", "string"], description="Policy file; empty: GPU_COST_POLICY or the default"),
        "source": Param(None, type=["null", "string"], enum=[None, "sim", "prometheus"],
                        description="Data source; empty: GPU_COST_SOURCE or the policy's"),
    },
)
def gpu_zombie_sweep() -> None:
    @task
    def check_policy(params=None):  # type: ignore[no-untyped-def]
        return sweep_tasks.check_policy(params or {})

    @task
    def collect(cfg, **context):  # type: ignore[no-untyped-def]
        return sweep_tasks.collect(cfg, context)

    @task
    def detect(ref):  # type: ignore[no-untyped-def]
        return sweep_tasks.detect(ref)

    @task
    def decide(ref, findings):  # type: ignore[no-untyped-def]
        return sweep_tasks.decide(ref, findings)

    @task
    def record(ref, plan):  # type: ignore[no-untyped-def]
        return sweep_tasks.record(ref, plan)

    ref = collect(check_policy())
    record(ref, decide(ref, detect(ref)))


dag_object = gpu_zombie_sweep()

if __name__ == "__main__":
    dag_object.test()
