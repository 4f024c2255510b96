"""The main job on the embedded default: a throwaway Airflow home, the simulated cluster, SQLite.

``gpu-cost demo`` migrates a fresh Airflow metadata DB, runs the DAGs below through Airflow
(``airflow dags test``, i.e. ``dag.test()``) one after the other, then reads what they recorded
from the audit store. Airflow's own output goes to stderr; the result is printed at the end.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpu_cost import paths
from gpu_cost.audit.store import AuditStore
from gpu_cost.errors import GpuCostError

logger = logging.getLogger(__name__)

#: DAGs the demo runs, in order, with the run conf each gets.
DEMO_DAGS: list[tuple[str, dict[str, Any]]] = [
    ("gpu_forecast_nightly", {}),
    ("gpu_zombie_sweep", {}),
    ("gpu_offhours_power", {}),
]


def demo_env(home: Path) -> dict[str, str]:
    """Return the environment of the throwaway Airflow installation under ``home``."""
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(home / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(paths.dags_dir()),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW_CONN_GPU_COST_DB": json.dumps({"conn_type": "sqlite", "host": str(home / "audit.db")}),
            "GPU_COST_HOME": str(home),
            "GPU_COST_SOURCE": "sim",
            "GPU_COST_REPORT_DIR": str(home / "reports"),
        }
    )
    env.pop("AIRFLOW__CORE__UNIT_TEST_MODE", None)
    return env


def _airflow() -> str:
    exe = Path(sys.executable).with_name("airflow")
    return str(exe) if exe.exists() else "airflow"


def run_demo(home: Path, dags: list[tuple[str, dict[str, Any]]] | None = None) -> dict[str, Any]:
    """Run the demo DAGs in a fresh Airflow home; return what they recorded."""
    if home.exists():
        shutil.rmtree(home)
    (home / "airflow").mkdir(parents=True)
    env = demo_env(home)
    started = time.time()
    _call([_airflow(), "db", "migrate"], env, "airflow db migrate")
    runs = []
    for dag_id, conf in dags or DEMO_DAGS:
        t0 = time.time()
        cmd = [_airflow(), "dags", "test", dag_id]
        if conf:
            cmd += ["--conf", json.dumps(conf)]
        _call(cmd, env, f"airflow dags test {dag_id}")
        runs.append({"dag_id": dag_id, "seconds": round(time.time() - t0, 1)})
    store = AuditStore(f"sqlite:///{home / 'audit.db'}")
    result = collect_result(store)
    result.update({"airflow_home": str(home / "airflow"), "audit_db": str(home / "audit.db"), "dag_runs": runs,
                   "seconds": round(time.time() - started, 1)})
    for step in DEMO_RESULTS:
        step(store, home, result)
    return result


def collect_result(store: AuditStore) -> dict[str, Any]:
    """Return the latest sweep run and its decisions, as the demo prints them."""
    runs = store.query("SELECT * FROM gpu_cost_runs WHERE dag_id = 'gpu_zombie_sweep' ORDER BY started_at DESC")
    if not runs:
        raise GpuCostError("the sweep DAG recorded no run: see the Airflow output above")
    run = runs[0]
    if run["status"] not in ("ok", "degraded", "capped"):
        raise GpuCostError(f"the sweep run ended with status {run['status']!r}: see the Airflow output above")
    decisions = store.decisions_of_run(run["run_id"])
    return {
        "run_id": run["run_id"],
        "status": run["status"],
        "mode": run["mode"],
        "decisions": [
            {"rule": d["rule"], "target": d["target"], "job_id": d["job_id"], "user": d["user_name"], "action": d["action"],
             "mode": d["mode"], "reason": d["reason"], "gpus": d["gpus"]}
            for d in decisions
        ],
    }


#: hooks that add to the demo's result after the DAG runs (report path, forecasts, ...)
DEMO_RESULTS: list[Any] = []
from gpu_cost.report.seed import demo_report  # noqa: E402 - the weekly report, written after the DAG runs

DEMO_RESULTS.append(demo_report)
from gpu_cost.airflow.power_tasks import demo_result as _power_result  # noqa: E402 - the power DAG's summary

DEMO_RESULTS.append(_power_result)
from gpu_cost.forecast.nightly import demo_forecast  # noqa: E402 - what the nightly forecast stored

DEMO_RESULTS.append(demo_forecast)


def _call(cmd: list[str], env: dict[str, str], what: str) -> None:
    proc = subprocess.run(cmd, env=env, stdout=sys.stderr, stderr=sys.stderr, check=False)
    if proc.returncode != 0:
        raise GpuCostError(f"{what} failed with exit code {proc.returncode}")
