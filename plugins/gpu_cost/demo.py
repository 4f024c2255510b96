"""The main job on the embedded default: a throwaway Airflow home, one simulated cluster, SQLite.

``gpu-cost demo`` builds one simulated cluster — the week before now and the shipped default
cluster running now (:func:`gpu_cost.report.seed.demo_scenario`) — writes it to a scenario file
that every DAG reads (``GPU_COST_SCENARIO``), replays the week's hourly sweeps into the demo's
audit store in the policy's mode, then runs the DAGs below through Airflow (``airflow dags test``,
i.e. ``dag.test()``) one after the other on the same cluster, and writes the week's report.
Airflow's output and the package's own log go to ``demo.log`` in the demo's home (the terminal
shows warnings only); the summary names the file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

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


#: how many lines of Airflow's log a failed step shows
LOG_TAIL = 30


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
            "GPU_COST_SCENARIO": str(home / "cluster.yaml"),
        }
    )
    env.pop("AIRFLOW__CORE__UNIT_TEST_MODE", None)
    return env


def _airflow() -> str:
    exe = Path(sys.executable).with_name("airflow")
    return str(exe) if exe.exists() else "airflow"


def run_demo(home: Path, dags: list[tuple[str, dict[str, Any]]] | None = None,
             now: float | None = None) -> dict[str, Any]:
    """Run the demo in a fresh home: the simulated week, the DAGs on the same cluster, the report."""
    if home.exists():
        shutil.rmtree(home)
    (home / "airflow").mkdir(parents=True)
    env = demo_env(home)
    log = home / "demo.log"
    with _logging_to(log):
        return _run(home, env, log, dags, now)


@contextlib.contextmanager
def _logging_to(log: Path) -> Iterator[None]:
    """Send this process's log records to ``log``; the terminal's handlers show warnings only meanwhile."""
    root = logging.getLogger()
    handler = logging.FileHandler(log, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    quiet = [(h, h.level) for h in root.handlers]
    for h, _ in quiet:
        h.setLevel(max(h.level, logging.WARNING))
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
        for h, level in quiet:
            h.setLevel(level)


def _run(home: Path, env: dict[str, str], log: Path, dags: list[tuple[str, dict[str, Any]]] | None,
         now: float | None) -> dict[str, Any]:
    from gpu_cost.policy import load_policy
    from gpu_cost.report.seed import demo_scenario, seed_week
    from gpu_cost.sources.sim import scenario_to_dict

    started = time.time()
    end = float(((now if now is not None else started) // 3600) * 3600)
    cluster = demo_scenario(end)
    (home / "cluster.yaml").write_text(
        "# The demo's simulated cluster (gpu-cost demo): every DAG of the demo reads it (GPU_COST_SCENARIO).\n"
        + yaml.safe_dump(scenario_to_dict(cluster), sort_keys=False), encoding="utf-8")
    store = AuditStore(f"sqlite:///{home / 'audit.db'}").ensure_schema()
    policy = load_policy(None)
    # hourly sweeps over [end - 7 d, end - 1 h]; the DAGs' sweep follows an hour or so after the last
    seeded = seed_week(store, policy, end - 3600.0, mode=policy.mode, scenario=cluster)
    _call([_airflow(), "db", "migrate"], env, "airflow db migrate", log)
    runs = []
    for dag_id, conf in dags or DEMO_DAGS:
        t0 = time.time()
        cmd = [_airflow(), "dags", "test", dag_id]
        if conf:
            cmd += ["--conf", json.dumps(conf)]
        _call(cmd, env, f"airflow dags test {dag_id}", log)
        runs.append({"dag_id": dag_id, "seconds": round(time.time() - t0, 1)})
    result = collect_result(store)
    result.update({"airflow_home": str(home / "airflow"), "audit_db": str(home / "audit.db"), "dag_runs": runs,
                   "log": str(log), "cluster": {"file": str(home / "cluster.yaml"),
                                                        "nodes": len(cluster.nodes), "gpus": cluster.gpu_count},
                   "week_end": end, "week_seed": seeded, "policy_mode": policy.mode})
    flagged = store.query("SELECT job_id FROM gpu_cost_decisions WHERE rule = 'idle_allocation' AND job_id IS NOT NULL "
                          "AND action NOT IN ('none', 'advise') ORDER BY ts DESC LIMIT 1")
    result["audit_job"] = flagged[0]["job_id"] if flagged else None
    for step in DEMO_RESULTS:
        step(store, home, result)
    result["seconds"] = round(time.time() - started, 1)
    return result


def collect_result(store: AuditStore) -> dict[str, Any]:
    """Return the latest sweep run and its decisions, as the demo prints them."""
    runs = store.query("SELECT * FROM gpu_cost_runs WHERE dag_id = 'gpu_zombie_sweep' ORDER BY started_at DESC")
    if not runs:
        raise GpuCostError("the sweep DAG recorded no run: see the demo's demo.log")
    run = runs[0]
    if run["status"] not in ("ok", "degraded", "capped"):
        raise GpuCostError(f"the sweep run ended with status {run['status']!r}: see the demo's demo.log")
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


def _call(cmd: list[str], env: dict[str, str], what: str, log: Path) -> None:
    """Run ``cmd`` with its output appended to ``log``; on failure, raise with the log's last lines."""
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n===== {what} =====\n")
        out.flush()
        proc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL:]
        raise GpuCostError(f"{what} failed with exit code {proc.returncode}; the end of {log}:\n" + "\n".join(tail))
