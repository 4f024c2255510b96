"""The main job on the embedded default: a throwaway Airflow home, one simulated cluster, SQLite.

``gpu-cost demo`` builds one simulated cluster — two weeks of a generated cluster ending at the
demo's instant (:func:`gpu_cost.sim.week.demo_instant`: the latest Sunday 03:00 UTC, a night
inside the off-hours windows) and the shipped default cluster running then
(:func:`gpu_cost.sim.week.demo_scenario`) — writes it to a scenario file that every DAG reads
(``GPU_COST_SCENARIO``), replays the two weeks' hourly sweeps into the demo's audit store in the
policy's mode (without the shipped cluster's jobs: the DAGs' sweep is the agent's first look at
them), then runs the DAGs below through Airflow (``airflow dags test`` with the demo's instant as
the logical date) one after the other on the same cluster, and writes the report of the last 7
days of data (:func:`gpu_cost.report.kpis.recent_period`, as ``gpu-cost report --since 7d``).
The same figures on every run: no wall clock, no unseeded random draw decides anything.
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

from gpu_cost.audit.store import AuditStore
from gpu_cost.core import paths
from gpu_cost.core.errors import GpuCostError

logger = logging.getLogger(__name__)

#: DAGs the demo runs, in order, with the run conf each gets: the sweep first (its job rows end the
#: history), the nightly forecast from the agent's own job rows in the store (the demo's cluster and
#: nothing else: its running jobs get ETAs, the power plan its demand), then the power plan.
DEMO_DAGS: list[tuple[str, dict[str, Any]]] = [
    ("gpu_zombie_sweep", {}),
    ("gpu_forecast_nightly", {"source": "store"}),
    ("gpu_offhours_power", {}),
]
#: days of history the demo replays: two weeks, so the forecast has a week to learn from and one to
#: be scored on, and the report a week before its own to compare with
DEMO_DAYS = 14.0


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
             now: float | None = None, days: float = DEMO_DAYS) -> dict[str, Any]:
    """Run the demo in a fresh home: the simulated week, the DAGs on the same cluster, the report.

    Deterministic: the week ends at :func:`gpu_cost.sim.week.demo_instant` of ``now`` (default:
    the clock), every DAG runs with that instant as its logical date, and the simulator, the seeded
    week and the forecasts are seeded; two runs in the same week print the same summary.

    :param days: the length of the replayed history (:data:`DEMO_DAYS`; fewer run quicker).
    """
    if home.exists():
        shutil.rmtree(home)
    (home / "airflow").mkdir(parents=True)
    env = demo_env(home)
    log = home / "demo.log"
    with _logging_to(log):
        return _run(home, env, log, dags, now, days)


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
         now: float | None, days: float) -> dict[str, Any]:
    from gpu_cost.config.loader import load_policy
    from gpu_cost.core.timeutil import iso
    from gpu_cost.sim.cluster import scenario_to_dict
    from gpu_cost.sim.week import demo_instant, demo_scenario, seed_week, without_shipped_jobs

    started = time.time()
    end = demo_instant(now if now is not None else started)
    cluster = demo_scenario(end, days=days)
    (home / "cluster.yaml").write_text(
        "# The demo's simulated cluster (gpu-cost demo): every DAG of the demo reads it (GPU_COST_SCENARIO).\n"
        + yaml.safe_dump(scenario_to_dict(cluster), sort_keys=False), encoding="utf-8")
    store = AuditStore(f"sqlite:///{home / 'audit.db'}").ensure_schema()
    policy = load_policy(None)
    # hourly sweeps over [end - days, end - 1 h], without the shipped cluster's jobs; the DAGs run at
    # ``end`` (their logical date), where the sweep sees those jobs for the first time
    seeded = seed_week(store, policy, end - 3600.0, mode=policy.mode, scenario=without_shipped_jobs(cluster),
                       days=days)
    _call([_airflow(), "db", "migrate"], env, "airflow db migrate", log)
    runs = []
    for dag_id, conf in dags or DEMO_DAGS:
        t0 = time.time()
        cmd = [_airflow(), "dags", "test", dag_id, iso(end)]
        if conf:
            cmd += ["--conf", json.dumps(conf)]
        _call(cmd, env, f"airflow dags test {dag_id}", log)
        runs.append({"dag_id": dag_id, "seconds": round(time.time() - t0, 1)})
    result = collect_result(store)
    result.update({"airflow_home": str(home / "airflow"), "audit_db": str(home / "audit.db"), "dag_runs": runs,
                   "log": str(log), "cluster": {"file": str(home / "cluster.yaml"),
                                                        "nodes": len(cluster.nodes), "gpus": cluster.gpu_count},
                   "week_end": end, "days": days, "week_seed": seeded, "policy_mode": policy.mode})
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
from gpu_cost.sim.week import demo_report  # noqa: E402 - the weekly report, written after the DAG runs

DEMO_RESULTS.append(demo_report)
from gpu_cost.airflow.power_tasks import demo_result as _power_result  # noqa: E402 - the power DAG's summary

DEMO_RESULTS.append(_power_result)
from gpu_cost.capacity.forecast.nightly import demo_forecast  # noqa: E402 - what the nightly forecast stored

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
