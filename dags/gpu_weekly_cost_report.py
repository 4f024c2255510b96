"""
### gpu_weekly_cost_report — what the GPUs cost last week, what was wasted, what the agent saved

**What it does.** Every Monday at 08:00 (time zone `GPU_COST_REPORT_TZ`, default UTC; keep it
equal to the policy's `report.timezone`, which defines the week) it reports on the previous
Monday-to-Monday week, from the audit store alone: KPIs (utilisation of all and of allocated GPUs,
waste ratio, idle GPU-hours by team and user, zombie time, automated events, savings (GPU-hours
freed by actions, the part other jobs re-used, which is the headline, kWh and money), change against the previous weeks, right-sizing suggestions) → charts
(PNG) → an HTML report with the charts embedded and a Markdown summary → Slack (summary and main
chart). The last task returns the report's location (XCom `return_value` of `files`).

**Where.** Under the report root: `GPU_COST_REPORT_DIR`, else `policy.report.out_dir` (a folder, or
an object-storage URL `s3://...` written through `ObjectStoragePath`). The `out_dir` param names a
folder under that root (`team-a`, `team-a/q4`); a path, a URL, `..` or a symlink leading out of the
root fails the run at `period`, naming the param.

**Knobs.** Params `since` / `until` (ISO 8601; both or neither), `policy`, `out_dir`, `slack`.
`GPU_COST_REPORT_SCHEDULE` (cron in `GPU_COST_REPORT_TZ`, default `0 8 * * 1`; `none`: manual
triggers only).

**Owner / triage.** GPU platform team. An empty report means no sweep wrote usage that week
(check `gpu_zombie_sweep`). `slack` logs "not configured" when connection `gpu_cost_slack` is
missing: the report is still written. Figures are explained in the report's footer.
"""

from __future__ import annotations

import datetime as dt
import os

import pendulum
from airflow.sdk import CronTriggerTimetable, Param, dag, task

from gpu_cost.airflow import report_tasks, runtime

DEFAULT_ARGS = {"owner": "gpu-platform", "retries": 2, "retry_delay": dt.timedelta(minutes=2)}
REPORT_TZ = os.environ.get("GPU_COST_REPORT_TZ", "UTC")
#: cron in REPORT_TZ; ``GPU_COST_REPORT_SCHEDULE=none`` leaves only manual triggers
REPORT_CRON = runtime.schedule("GPU_COST_REPORT_SCHEDULE", "0 8 * * 1")


@dag(
    dag_id="gpu_weekly_cost_report",
    schedule=CronTriggerTimetable(REPORT_CRON, timezone=REPORT_TZ) if REPORT_CRON else None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["gpu-cost", "report"],
    doc_md=__doc__,
    params={
        "since": Param(None, type=["null", "string"], description="Start (ISO 8601); empty: the previous week"),
        "until": Param(None, type=["null", "string"], description="End, exclusive (ISO 8601); empty: the previous week"),
        "policy": runtime.policy_param(),
        "out_dir": Param(None, type=["null", "string"], pattern=runtime.NESTED_NAME.pattern, title="Report folder",
                         description="A folder under the report root (GPU_COST_REPORT_DIR, else the policy's "
                                     "report.out_dir), by name: team-a or team-a/q4, never a path or URL; "
                                     "empty: the root itself"),
        "slack": Param(True, type="boolean", description="Post the summary and the main chart to Slack"),
    },
)
def gpu_weekly_cost_report() -> None:
    @task
    def period(params=None, **context):  # type: ignore[no-untyped-def]
        return report_tasks.period(params or {}, context)

    # each task works the report folder out again from the params: a path in XCom outside it is refused
    @task
    def kpis(cfg, params=None, **context):  # type: ignore[no-untyped-def]
        return report_tasks.kpis(cfg, params or {}, context)

    @task
    def charts(ref, params=None, **context):  # type: ignore[no-untyped-def]
        return report_tasks.charts(ref, params or {}, context)

    @task
    def files(ref, params=None, **context):  # type: ignore[no-untyped-def]
        return report_tasks.files(ref, params or {}, context)

    @task
    def slack(result, params=None, **context):  # type: ignore[no-untyped-def]
        return report_tasks.slack(result, params or {}, context)

    slack(files(charts(kpis(period()))))


dag_object = gpu_weekly_cost_report()

if __name__ == "__main__":
    dag_object.test()
