"""DAG params that name files take names under the deployment's roots, never paths or URLs.

The weekly report's ``out_dir`` (a folder under ``GPU_COST_REPORT_DIR``) and the nightly
forecast's ``jobs`` (a trace under ``GPU_COST_TRACE_DIR``), run through the DAGs' own task
callables as a run of each DAG calls them; and the report's later tasks refuse a path from XCom
that leads out of the run's report folder.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pendulum
import pytest
from airflow.sdk.exceptions import AirflowFailException

from gpu_cost.airflow import forecast_tasks, report_tasks
from gpu_cost.core.errors import GpuCostError

pytestmark = pytest.mark.e2e

WHEN = pendulum.datetime(2026, 11, 30, 2, 0, tz="UTC")
ESCAPES = ["{outside}", "../elsewhere", "team/../../elsewhere", "file://{outside}", "s3://bucket/x", "link/x"]


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "a.db")}))
    out = {"reports": tmp_path / "reports", "traces": tmp_path / "traces", "outside": tmp_path / "elsewhere"}
    for p in out.values():
        p.mkdir()
    for name in ("reports", "traces"):
        (out[name] / "link").symlink_to(out["outside"])  # a symlink in the root that leads out of it
    monkeypatch.setenv("GPU_COST_REPORT_DIR", str(out["reports"]))
    monkeypatch.setenv("GPU_COST_TRACE_DIR", str(out["traces"]))
    return out


def _context(dag_id: str, run: str) -> dict[str, object]:
    return {"dag_run": types.SimpleNamespace(dag_id=dag_id, run_id=run, run_after=WHEN), "logical_date": WHEN}


def _jobs_csv(path: Path) -> None:
    rows = ["job_id,user,account,partition,submit_ts,start_ts,end_ts,time_limit_s,gpus"]
    t0 = WHEN.timestamp() - 5 * 86400
    rows += [f"{i},u{i % 3},acct,batch,{t0 + i * 3600},{t0 + i * 3600 + 60},{t0 + i * 3600 + 7200},14400,2"
             for i in range(60)]
    path.write_text("\n".join(rows) + "\n")


# -- gpu_weekly_cost_report: out_dir -----------------------------------------------------------------
@pytest.mark.parametrize("asked", ESCAPES, ids=["absolute", "dotdot", "nested-dotdot", "file-url", "s3-url", "symlink"])
def test_report_out_dir_refuses_paths_urls_and_escapes(roots: dict[str, Path], asked: str) -> None:
    asked = asked.format(outside=roots["outside"])
    with pytest.raises(AirflowFailException, match=r"param 'out_dir' = .* refused"):
        report_tasks.period({"out_dir": asked, "since": "2026-11-23", "until": "2026-11-30"},
                            _context("gpu_weekly_cost_report", "bad-out"))
    assert list(roots["outside"].iterdir()) == []


def test_report_out_dir_names_a_folder_under_the_report_root(roots: dict[str, Path]) -> None:
    params = {"out_dir": "team-a/q4", "since": "2026-11-23", "until": "2026-11-30"}
    ctx = _context("gpu_weekly_cost_report", "good-out")
    cfg = report_tasks.period(params, ctx)
    assert cfg["out"] == str(roots["reports"] / "team-a" / "q4")
    ref = report_tasks.kpis(cfg, params, ctx)
    assert Path(ref["kpis"]).is_file() and roots["reports"] / "team-a" / "q4" in Path(ref["kpis"]).parents
    # a later task given a path out of the report folder through XCom refuses it
    with pytest.raises(GpuCostError, match=r"XCom names .*elsewhere, outside the run's report folder"):
        report_tasks.charts({**ref, "folder": str(roots["outside"])}, params, ctx)
    with pytest.raises(GpuCostError, match="outside the run's report folder"):
        report_tasks.charts({**ref, "kpis": str(roots["reports"] / "link" / "kpis.json")}, params, ctx)
    charted = report_tasks.charts(ref, params, ctx)
    with pytest.raises(GpuCostError, match="outside the run's report folder"):
        report_tasks.files({**charted, "charts": {"main": "/etc/hostname"}}, params, ctx)
    assert list(roots["outside"].iterdir()) == []


# -- gpu_forecast_nightly: jobs ---------------------------------------------------------------------
@pytest.mark.parametrize("asked", [*ESCAPES, "missing.csv"],
                         ids=["absolute", "dotdot", "nested-dotdot", "file-url", "s3-url", "symlink", "missing"])
def test_forecast_jobs_refuses_paths_urls_and_escapes(roots: dict[str, Path], asked: str) -> None:
    _jobs_csv(roots["outside"] / "x")
    asked = asked.format(outside=roots["outside"] / "x")
    with pytest.raises(AirflowFailException, match=r"param 'jobs' = .* refused"):
        forecast_tasks.extract({"source": "trace", "jobs": asked}, _context("gpu_forecast_nightly", "bad-jobs"))


def test_forecast_jobs_names_a_trace_under_the_trace_folder(roots: dict[str, Path]) -> None:
    (roots["traces"] / "2026").mkdir()
    _jobs_csv(roots["traces"] / "2026" / "jobs.csv")
    ref = forecast_tasks.extract({"source": "trace", "jobs": "2026/jobs.csv"}, _context("gpu_forecast_nightly", "ok"))
    assert ref["keys"] and ref["run_id"] == "gpu_forecast_nightly:ok"
