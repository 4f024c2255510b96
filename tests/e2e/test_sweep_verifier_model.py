"""The sweep DAG (``dag.test()``) with a malformed verifier model stored: it refuses the model, says so
in the run's problems, scores with the last good one, and the run succeeds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pendulum
import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.learn import verifier
from tests.fixtures.airflow_db import fresh_dag
from tests.unit.test_verifier_malformed import GOOD_P, N, model, store_model

pytestmark = pytest.mark.e2e

#: the default scenario's anchor: the simulated cluster is the shipped picture (job 1003 idle)
WHEN = pendulum.datetime(2026, 11, 30, tz="UTC")


@pytest.fixture(scope="module")
def sweep_dag():  # type: ignore[no-untyped-def]
    return fresh_dag("gpu_zombie_sweep")


@pytest.mark.parametrize(("bad", "why"), [
    (model(coef=[math.nan] * N), "coef[0] is nan"),
    (model(scale=[1.0] * (N - 2)), f"scale has {N - 2} numbers, features has {N}"),
], ids=["nan", "mismatched-lengths"])
def test_the_sweep_dag_refuses_a_malformed_model_and_scores_with_the_last_good_one(
        airflow_db, sweep_dag, tmp_path: Path, monkeypatch, bad, why) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "audit.db")}))
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(tmp_path))
    (tmp_path / "policy.yaml").write_text("mode: dry-run\nverifier: {min_labels: 20}\n")
    store = AuditStore().ensure_schema()
    t = WHEN.timestamp()
    store_model(store, "verifier-good", t - 86400, model())
    store_model(store, "verifier-bad", t - 3600, bad)
    dr = sweep_dag.test(run_conf={"policy": "policy", "source": "sim"}, logical_date=WHEN)
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert dr.state == "success", states
    run = AuditStore().get_run(f"gpu_zombie_sweep:{dr.run_id}")
    assert run is not None and run["status"] == "ok"
    (problem,) = json.loads(run["problems"])
    assert problem == f"verifier: model verifier-bad refused ({why}); scoring with verifier-good, the last good model"
    scored = [r for r in store.decisions_of_run(run["run_id"]) if r["rule"] in verifier.RULES and r["job_id"] == "1003"]
    assert scored
    for r in scored:
        ev = json.loads(r["evidence"]) if isinstance(r["evidence"], str) else r["evidence"]
        assert ev["verifier"] == {"p_waste": GOOD_P, "model": "verifier-good", "min_probability": 0.5}
