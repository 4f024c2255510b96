"""
### gpu_policy_tune — which policy would have freed the most GPU-hours here, with no false kill?

**What it does.** Triggered by hand (no schedule). It rebuilds a trace of the last `days` days from
the audit store's own usage rows (what every `gpu_zombie_sweep` recorded: per job, GPUs held,
active, work done; per host, zombie GPUs), then replays the run's policy and candidates from a
search space over it, each as if enforced with approvals approved, and compares them on GPU-hours
freed (the savings ledger), false kills, notices per user per week and GPU-hours left idle. The
candidates whose figures no other beats are the Pareto set; the *chosen* one frees the most with
no false kill and no more notices than the policy in use. `plan` pins the policy and checks the
params; `tune` replays and writes the report. The last task returns where the report is (XCom
`return_value`).

**It never changes the running policy.** The chosen candidate is written as `proposed.yaml` in the
report folder, with its figures and a diff against the base in a header comment: review it, then
install it the way policies are installed.

**Where.** Under the weekly report's root (`GPU_COST_REPORT_DIR`, else the policy's
`report.out_dir`), in `tune/<date>_<space>_<days>d/`: `index.html` (table and Pareto plot),
`summary.md`, `pareto.png`, `tune.json`, `proposed.yaml`.

**Knobs.** Params `days` (history replayed, 1-90), `space` (a search space of the tune folder
`GPU_COST_TUNE_DIR`, default `include/tune`, by name: the form suggests the shipped ones, a typed name the
folder lacks fails `plan`, naming the ones it holds), `policy`, `max_candidates` (a larger grid is
sampled at random), `seed`. See docs/tune.md for the space format and how the trace is rebuilt.

**Owner / triage.** GPU platform team. "no usage rows" means no sweep recorded usage in the window
(check `gpu_zombie_sweep`). A bad space fails `tune` naming its file and key. A month of 128 GPUs
takes minutes per candidate: lower `max_candidates` or `days` when the run is too long.
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import Param, dag, task

from gpu_cost.airflow import runtime, tune_tasks

DEFAULT_ARGS = {"owner": "gpu-platform", "retries": 1, "retry_delay": dt.timedelta(minutes=2)}


@dag(
    dag_id="gpu_policy_tune",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["gpu-cost", "tune"],
    doc_md=__doc__,
    params={
        "days": Param(tune_tasks.DEFAULT_DAYS, type="integer", minimum=tune_tasks.MIN_DAYS,
                      maximum=tune_tasks.MAX_DAYS, title="Days of history",
                      description="Replay the audit store's usage rows of this many days before the run."),
        "space": tune_tasks.space_param(),
        "policy": runtime.policy_param(),
        "max_candidates": Param(48, type="integer", minimum=1, maximum=500, title="Most candidates",
                                description="The whole grid when it has at most this many, else this many drawn "
                                            "at random."),
        "seed": Param(0, type="integer", minimum=0, title="Seed", description="Seed of the random search."),
    },
)
def gpu_policy_tune() -> None:
    @task
    def plan(params=None, **context):  # type: ignore[no-untyped-def]
        return tune_tasks.plan(params or {}, context)

    @task(execution_timeout=dt.timedelta(hours=12))
    def tune(cfg, params=None, **context):  # type: ignore[no-untyped-def]
        return tune_tasks.run_tune(params or {}, context)

    tune(plan())


dag_object = gpu_policy_tune()

if __name__ == "__main__":
    dag_object.test()
