"""
### gpu_forecast_nightly — job end times and GPU demand, every night at 02:00 UTC

**What it does.** Reads the job history (`policy.forecast.history`, default 60 days) from the
simulator, Slurm accounting or the agent's own job rows; builds hourly demand series (GPUs running
+ pending per account / partition, and the cluster total); fits a demand forecast per series in
mapped tasks (`fit_demand`, batches of `policy.forecast.series_per_task`) and the job end-time
model; writes everything to `gpu_cost_forecasts` in the audit store (`gpu_cost_db`):

* `demand:<key>` — expected GPUs per hour for `policy.forecast.horizon` (default 48 h) with an
  80 % interval; read by the off-hours power DAG;
* `runtime:class:<class>` and `runtime:job:<id>` — p50 / p90 end of running jobs; read by the
  sweep (idle past its p90 end ⇒ higher confidence) and by `gpu-cost forecast eta --job ID`;
* `backtest:demand` / `backtest:runtime` — tonight's figures against the baselines (also in XCom).

Beside the fits, `train_verifier` labels the decisions of `policy.verifier.history` with what happened
next (`gpu_cost_outcomes`) and trains the verifier on them (`gpu_cost_verifier_models`, with its
backtest; fewer than `verifier.min_labels` labels: stored as `too_few_labels`, not used). The sweep
scores findings with the newest model; `gpu-cost verifier show` prints its figures.
`rightsize` computes the right-sizing advice (per user and job class: the GPUs their finished jobs
needed and how long they ran, over `policy.rightsize.lookback`), stores it in `gpu_cost_rightsize`
and writes `policy.rightsize.advice_file`, which `include/slurm/cli_filter.lua` shows at `sbatch`
time (docs/rightsizing.md); `gpu-cost rightsize show` prints it.

**Knobs.** Params `policy` (a policy of `GPU_COST_POLICY_DIR`, by name), `source` (`sim` / `slurm` / `store` / `trace`) and `jobs`
(for `trace`: a jobs trace file of the trace folder `GPU_COST_TRACE_DIR`, default `$GPU_COST_HOME/traces`,
by name; a path, a URL, `..` or a symlink out of the folder fails `extract`, naming the param); `source`
`configured` (the default) reads `GPU_COST_FORECAST_SOURCE`, else `GPU_COST_SOURCE`, else the policy's.
`GPU_COST_FORECAST_SCHEDULE` (cron, default `0 2 * * *`; `none`: manual triggers only).

**Owner / triage.** GPU platform team. `extract` failing: the history source is unreachable (see
its log). `train_verifier` failing: the sweep keeps using the previous model (or none). A `fit_demand` map index failing: that batch's series keep yesterday's forecasts
and `finish` does not run (no backtest row tonight); a Prophet failure alone does not fail the task
(the level / seasonal-naive candidates are used). `rightsize` failing (most often: the advice file's
folder is not writable): sbatch keeps showing yesterday's advice. Every run is
idempotent (upserts keyed by series and horizon time): clear and re-run freely.
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import Param, dag, task

from gpu_cost.airflow import forecast_tasks, runtime

DEFAULT_ARGS = {"owner": "gpu-platform", "retries": 2, "retry_delay": dt.timedelta(minutes=2)}


@dag(
    dag_id="gpu_forecast_nightly",
    schedule=runtime.schedule("GPU_COST_FORECAST_SCHEDULE", "0 2 * * *"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["gpu-cost", "forecast"],
    doc_md=__doc__,
    params={
        "policy": runtime.policy_param(),
        "source": runtime.source_param(["sim", "slurm", "store", "trace"], env=forecast_tasks.SOURCE_ENV,
                                       what="Where the run reads the job history from"),
        "jobs": Param(None, type=["null", "string"], pattern=runtime.NESTED_NAME.pattern, title="Jobs trace",
                      description="Source trace: a jobs trace file of the deployment's trace folder "
                                  "(GPU_COST_TRACE_DIR), by name (jobs.csv, 2026/jobs.parquet), never a path or URL"),
    },
)
def gpu_forecast_nightly() -> None:
    @task
    def extract(params=None, **context):  # type: ignore[no-untyped-def]
        return forecast_tasks.extract(params or {}, context)

    @task
    def batches(ref):  # type: ignore[no-untyped-def]
        return forecast_tasks.batches(ref)

    @task(max_active_tis_per_dagrun=4)
    def fit_demand(batch):  # type: ignore[no-untyped-def]
        return forecast_tasks.fit_batch(batch)

    @task
    def fit_runtime(ref):  # type: ignore[no-untyped-def]
        return forecast_tasks.fit_runtime(ref)

    @task
    def finish(ref, results, runtime_out):  # type: ignore[no-untyped-def]
        return forecast_tasks.finish(ref, results, runtime_out)

    @task
    def train_verifier(ref):  # type: ignore[no-untyped-def]
        return forecast_tasks.train_verifier(ref)

    @task
    def rightsize(ref):  # type: ignore[no-untyped-def]
        return forecast_tasks.rightsize(ref)

    ref = extract()
    fits = fit_demand.expand(batch=batches(ref))
    finish(ref, fits, fit_runtime(ref))
    train_verifier(ref)
    rightsize(ref)


dag_object = gpu_forecast_nightly()

if __name__ == "__main__":
    dag_object.test()
