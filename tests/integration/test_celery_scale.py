"""Scale-out on Airflow's own engine: the nightly forecast's mapped fits and the sweep's shards on two Celery workers.

The ``celery_cluster`` fixture starts Redis, PostgreSQL, the API server, the scheduler, the DAG
processor and two ``airflow celery worker`` processes (each with its own home and host name; the
audit store is a PostgreSQL database). The test unpauses and triggers ``gpu_forecast_nightly``
through the REST API for a fixed logical date, with a policy that puts one demand series in each
mapped ``fit_demand`` task, and lets the scheduler run it. Through the REST API it checks that the
mapped task instances ran on both workers; then it runs the same DAG for the same date under
LocalExecutor (``airflow dags test``, i.e. ``dag.test()``, SQLite) and checks that the results are
the same: every task's XCom result and every forecast row written to the audit store.

The sweep is run sharded the same way (``sweep_sharded``: six node groups): its mapped ``collect``
and ``detect`` ran on both workers, ONE ``decide`` took every group's findings, and the decisions
recorded are those of the unsharded sweep of the same instant, computed here in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.fixtures.celery_cluster import WORKERS
from tests.fixtures.core import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAG_ID = "gpu_forecast_nightly"
MAPPED = "fit_demand"
LOGICAL_DATE = "2026-11-29T02:00:00+00:00"
#: the deployment's policy directory of this test: the run names its policy
POLICY_DIR = ROOT / "tests" / "dags_scale"
CONF = {"policy": "forecast_policy", "source": "sim"}
#: columns of gpu_cost_forecasts that are results (created_at is the wall clock of the write)
FORECAST_COLUMNS = "series, horizon_ts, kind, yhat, yhat_lower, yhat_upper, model, extra"


def _results(value: Any) -> Any:
    """Drop what measures or names the run rather than the result (durations in seconds, the run's id), and
    keep only the name of a file the run wrote (each deployment writes under its own home)."""
    if isinstance(value, dict):
        return {k: (Path(v).name if k == "file" and isinstance(v, str) else _results(v))
                for k, v in value.items() if k not in ("seconds", "run_id")}
    if isinstance(value, list):
        return [_results(v) for v in value]
    if isinstance(value, float):
        return round(value, 9)
    return value


def _forecasts(url: str, run_id: str) -> list[tuple[Any, ...]]:
    """Return the forecast rows the DAG run ``run_id`` wrote (each row names the run that wrote it)."""
    from gpu_cost.audit.store import AuditStore

    store = AuditStore(url)
    rows = store.query(f"SELECT {FORECAST_COLUMNS} FROM gpu_cost_forecasts WHERE run_id = :run "
                       "ORDER BY series, horizon_ts", {"run": f"{DAG_ID}:{run_id}"})
    store.engine.dispose()
    return [tuple(_results(json.loads(v) if k == "extra" and v else v) for k, v in r.items()) for r in rows]


def _xcom(cluster: Any, run_id: str, task_id: str, map_index: int = -1) -> Any:
    entry = cluster.api(
        "GET", f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/{task_id}/xcomEntries/return_value"
               f"?map_index={map_index}&deserialize=true")
    return entry["value"]


def _local_run(workdir: Path) -> tuple[dict[tuple[str, int], Any], list[tuple[Any, ...]]]:
    """Run the DAG with ``airflow dags test`` (LocalExecutor, SQLite, own home); return XComs and forecasts."""
    import sqlalchemy as sa

    home = workdir / "local"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GPU_COST"))}
    env.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW_CONN_GPU_COST_DB": json.dumps({"conn_type": "sqlite", "host": str(home / "audit.db")}),
        "GPU_COST_HOME": str(home / "gpu_cost"), "PYTHONPATH": str(ROOT), "GPU_COST_POLICY_DIR": str(POLICY_DIR),
    })
    airflow = str(Path(sys.executable).parent / "airflow")
    for argv in ([airflow, "db", "migrate"], [airflow, "dags", "test", DAG_ID, LOGICAL_DATE, "-c", json.dumps(CONF)]):
        r = subprocess.run(argv, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{argv[1:3]} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    engine = sa.create_engine(f"sqlite:///{home / 'airflow.db'}")
    try:
        with engine.connect() as conn:
            state, run_id = conn.execute(sa.text("SELECT state, run_id FROM dag_run WHERE dag_id = :d"),
                                         {"d": DAG_ID}).one()
            rows = conn.execute(sa.text("SELECT task_id, map_index, value FROM xcom WHERE dag_id = :d "
                                        "AND key = 'return_value'"), {"d": DAG_ID}).all()
    finally:
        engine.dispose()
    assert state == "success", state
    xcoms = {(t, m): json.loads(v) if isinstance(v, str) else v for t, m, v in rows}
    return xcoms, _forecasts(f"sqlite:///{home / 'audit.db'}", run_id)


def test_forecast_fits_spread_over_two_celery_workers_with_local_results(celery_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = celery_cluster
    c.wait(f"{DAG_ID} parsed by the DAG processor", lambda: c.api("GET", f"/dags/{DAG_ID}")["dag_id"] == DAG_ID,
           timeout=120)
    c.api("PATCH", f"/dags/{DAG_ID}", {"is_paused": False})
    run = c.api("POST", f"/dags/{DAG_ID}/dagRuns", {"logical_date": LOGICAL_DATE, "conf": CONF})
    run_id = run["dag_run_id"]

    def finished() -> str | None:
        state = c.api("GET", f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}")["state"]
        return state if state in ("success", "failed") else None

    state = c.wait("DAG run finished", finished, timeout=240)
    runs = c.api("GET", f"/dags/{DAG_ID}/dagRuns?limit=100")["dag_runs"]
    assert [r["dag_run_id"] for r in runs] == [run_id], "only the triggered run may write to the audit store"
    tis = c.api("GET", f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances?limit=100")["task_instances"]
    assert state == "success", (
        f"run {run_id} {state}: " + str(sorted((t["task_id"], t["map_index"], t["state"], t["hostname"]) for t in tis))
        + "\n" + c.logs())

    # The mapped fits were spread over both workers; every task ran on a worker.
    mapped = [t for t in tis if t["task_id"] == MAPPED]
    batches = _xcom(c, run_id, "batches")
    assert len(batches) >= 2, "the policy should give one series per batch"
    assert sorted(t["map_index"] for t in mapped) == list(range(len(batches)))
    assert {t["state"] for t in tis} == {"success"}
    per_worker = {w: sorted(t["map_index"] for t in mapped if t["hostname"] == w) for w in WORKERS}
    assert {t["hostname"] for t in mapped} == set(WORKERS), per_worker
    assert {t["hostname"] for t in tis} <= set(WORKERS)

    # Same results as LocalExecutor: each task's XCom, and the forecasts in the audit store.
    local_xcoms, local_forecasts = _local_run(tmp_path)
    for (task_id, map_index), local_value in sorted(local_xcoms.items()):
        assert _results(_xcom(c, run_id, task_id, map_index)) == _results(local_value), (task_id, map_index)
    assert {k for k in local_xcoms if k[0] == MAPPED} == {(MAPPED, i) for i in range(len(batches))}
    celery_forecasts = _forecasts(c.audit_url, run_id)
    assert len(celery_forecasts) == len(local_forecasts) > 0
    assert {r[2] for r in celery_forecasts} >= {"demand", "runtime", "backtest"}
    assert celery_forecasts == local_forecasts


SWEEP_DAG_ID = "gpu_zombie_sweep"
SWEEP_LOGICAL_DATE = "2026-11-30T12:00:00+00:00"
SWEEP_CONF = {"policy": "sweep_sharded", "source": "sim"}
#: what a decision is, without where and when it was recorded
DECISION_COLUMNS = ("decision_id", "rule", "target", "job_id", "user_name", "action", "mode", "rung", "episode",
                    "status", "requires_approval", "gpus")


def test_sharded_sweep_spreads_over_two_celery_workers_and_decides_once(celery_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from gpu_cost.audit.store import AuditStore
    from gpu_cost.config.loader import load_policy
    from gpu_cost.loop import sweep

    c = celery_cluster
    policy = load_policy(POLICY_DIR / f"{SWEEP_CONF['policy']}.yaml")
    shards = policy.sweep.shards
    assert shards > 1
    c.wait(f"{SWEEP_DAG_ID} parsed by the DAG processor",
           lambda: c.api("GET", f"/dags/{SWEEP_DAG_ID}")["dag_id"] == SWEEP_DAG_ID, timeout=120)
    c.api("PATCH", f"/dags/{SWEEP_DAG_ID}", {"is_paused": False})
    run_id = c.api("POST", f"/dags/{SWEEP_DAG_ID}/dagRuns",
                   {"logical_date": SWEEP_LOGICAL_DATE, "conf": SWEEP_CONF})["dag_run_id"]

    def finished() -> str | None:
        state = c.api("GET", f"/dags/{SWEEP_DAG_ID}/dagRuns/{quote(run_id)}")["state"]
        return state if state in ("success", "failed") else None

    state = c.wait("sweep run finished", finished, timeout=300)
    tis = c.api("GET", f"/dags/{SWEEP_DAG_ID}/dagRuns/{quote(run_id)}/taskInstances?limit=100")["task_instances"]
    assert state == "success", (
        f"run {run_id} {state}: " + str(sorted((t["task_id"], t["map_index"], t["state"], t["hostname"]) for t in tis))
        + "\n" + c.logs())

    # collect and detect ran once per node group, spread over both workers; decide ran once
    for task_id in ("collect", "detect"):
        mapped = [t for t in tis if t["task_id"] == task_id]
        assert sorted(t["map_index"] for t in mapped) == list(range(shards)), task_id
        per_worker = {w: sorted(t["map_index"] for t in mapped if t["hostname"] == w) for w in WORKERS}
        assert {t["hostname"] for t in mapped} <= set(WORKERS), per_worker
    groups = [t for t in tis if t["task_id"] in ("collect", "detect")]
    assert {t["hostname"] for t in groups} == set(WORKERS), sorted((t["task_id"], t["map_index"], t["hostname"])
                                                                  for t in groups)
    assert [t["map_index"] for t in tis if t["task_id"] == "decide"] == [-1]

    # the decisions are those of one unsharded sweep of the same instant
    store = AuditStore(c.audit_url)
    audit_run = f"{SWEEP_DAG_ID}:{run_id}"
    run = store.get_run(audit_run)
    assert run is not None and run["status"] == "ok", run
    got = sorted(tuple(r[k] for k in DECISION_COLUMNS) for r in store.decisions_of_run(audit_run))
    store.engine.dispose()
    local = AuditStore(f"sqlite:///{tmp_path / 'whole.db'}").ensure_schema()
    whole = dataclasses.replace(policy, sweep=dataclasses.replace(policy.sweep, shards=1))
    sweep.run_once(whole, float(run["data_ts"]), local, run_id="whole", source="sim")
    want = sorted(tuple(r[k] for k in DECISION_COLUMNS) for r in local.decisions_of_run("whole"))
    assert want, "the shipped simulated cluster has waste to decide on"
    assert got == want
