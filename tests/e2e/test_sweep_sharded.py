"""The sweep DAG sharded (``sweep.shards``: mapped collect/detect) decides what the unsharded DAG decides."""

from __future__ import annotations

import json

import pendulum
import pytest

from gpu_cost.audit.store import AuditStore

pytestmark = pytest.mark.e2e

SHARDS = 3
#: both runs look at the same instant: their logical dates differ (one DAG, two runs) but fall in one
#: sample interval, which the run's data instant is floored to (with wall-clock dates, two runs that
#: straddle a minute see a process started a minute apart: another target)
WHEN = pendulum.datetime(2026, 11, 24, 10, 0, 5, tz="UTC")
#: what a decision is, without where and when it was recorded
COLUMNS = ("decision_id", "rule", "target", "job_id", "user_name", "action", "mode", "rung", "episode", "status",
           "requires_approval", "gpus", "reason")


def _run(dag, monkeypatch, tmp_path, name: str, policy: str, when: pendulum.DateTime):  # type: ignore[no-untyped-def]
    """Run the DAG once on its own audit store; return (run, decisions, usage rows, task states)."""
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / f"{name}.db")}))
    dr = dag.test(run_conf={"policy": policy, "source": "sim"}, logical_date=when)
    tis = dr.get_task_instances()
    store = AuditStore()
    run_id = f"gpu_zombie_sweep:{dr.run_id}"
    rows = sorted(tuple(r[c] for c in COLUMNS) for r in store.decisions_of_run(run_id))
    usage = store.query("SELECT COUNT(*) AS n FROM gpu_cost_usage WHERE run_id = :r", {"r": run_id})[0]["n"]
    return dr, store.get_run(run_id), rows, usage, tis


def test_sharded_sweep_dag_decides_what_the_unsharded_one_does(airflow_db, dagbag, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tests.fixtures.core import ROOT

    text = (ROOT / "include" / "scenarios" / "default.yaml").read_text()
    (tmp_path / "scenario.yaml").write_text(text.replace("seed: 7", "seed: 7\nanchor: now", 1))
    monkeypatch.setenv("GPU_COST_SCENARIO", str(tmp_path / "scenario.yaml"))
    policy = (ROOT / "include" / "policy" / "default.yaml").read_text()
    assert "  shards: 1 " in policy
    (tmp_path / "whole.yaml").write_text(policy)
    (tmp_path / "sharded.yaml").write_text(policy.replace("  shards: 1 ", f"  shards: {SHARDS} ", 1))
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(tmp_path))
    dag = dagbag.dags["gpu_zombie_sweep"]

    dr1, run1, rows1, usage1, tis1 = _run(dag, monkeypatch, tmp_path, "whole", "whole", WHEN)
    dr3, run3, rows3, usage3, tis3 = _run(dag, monkeypatch, tmp_path, "sharded", "sharded", WHEN.add(seconds=20))
    assert dr1.state == dr3.state == "success", [(t.task_id, t.map_index, t.state) for t in tis3]
    mapped = {t: sorted(ti.map_index for ti in tis3 if ti.task_id == t) for t in ("collect", "detect")}
    assert mapped == {"collect": list(range(SHARDS)), "detect": list(range(SHARDS))}
    assert [ti.map_index for ti in tis1 if ti.task_id == "collect"] == [0]
    assert {ti.task_id for ti in tis3 if ti.task_id in ("merge", "decide", "record")} == {"merge", "decide", "record"}
    assert [ti.map_index for ti in tis3 if ti.task_id == "decide"] == [-1]  # one decision for every shard
    assert run1["status"] == run3["status"] == "ok"
    assert run1["data_ts"] == run3["data_ts"] == WHEN.int_timestamp // 60 * 60  # the same instant seen
    assert rows1 and rows3 == rows1
    assert usage3 == usage1 > 0
