"""The sweep DAG runs through Airflow (``dag.test()``) on the simulator and fills the audit table."""

from __future__ import annotations

import pytest

from gpu_cost.audit.store import AuditStore

pytestmark = pytest.mark.e2e


def test_sweep_dag_records_expected_decisions(airflow_db, dagbag, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tests.fixtures.core import ROOT

    # the default scenario anchored at the run's own instant: the same picture at any time of day
    text = (ROOT / "include" / "scenarios" / "default.yaml").read_text()
    (tmp_path / "scenario.yaml").write_text(text.replace("seed: 7", "seed: 7\nanchor: now", 1))
    monkeypatch.setenv("GPU_COST_SCENARIO", str(tmp_path / "scenario.yaml"))
    import time

    from gpu_cost.core.errors import AuditError

    # runs of earlier days parked their state here: one past the default sweep.keep_parked (2 days), one not
    parked = AuditStore().ensure_schema()
    parked.save_snapshot("gpu_zombie_sweep:three-days-ago#plan", time.time() - 3 * 86400, '{"decisions": []}')
    parked.save_snapshot("gpu_zombie_sweep:yesterday#plan", time.time() - 86400, '{"decisions": []}')
    dag = dagbag.dags["gpu_zombie_sweep"]
    # explicit conf: dag.test(run_conf=...) by another test leaves its conf in the shared DAG's params
    dr = dag.test(run_conf={"policy": "default", "source": "sim"})
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert dr.state == "success", states
    store = AuditStore()
    runs = store.query("SELECT * FROM gpu_cost_runs WHERE run_id = :r", {"r": f"gpu_zombie_sweep:{dr.run_id}"})
    assert runs and runs[0]["status"] == "ok" and runs[0]["mode"] == "dry-run"
    rows = store.decisions_of_run(runs[0]["run_id"])
    got = {(r["rule"], r["job_id"] or r["user_name"], r["action"]) for r in rows}
    assert ("zombie", "bob", "notify") in got
    assert ("idle_allocation", "1003", "notify") in got
    assert ("low_efficiency", "1004", "advise") in got
    assert ("idle_allocation", "1007", "none") in got  # protected by its no-interrupt label
    assert all(r["mode"] == "dry-run" for r in rows)
    assert not any(r["rule"] == "zombie" and r["job_id"] == "1005" for r in rows)
    inference = [r for r in rows if r["job_id"] == "1005"]
    assert inference and all(r["action"] == "advise" for r in inference)
    acted = store.query("SELECT COUNT(*) AS n FROM gpu_cost_actions WHERE run_id = :r", {"r": runs[0]["run_id"]})
    assert acted[0]["n"] == 0  # dry-run touches nothing
    assert store.query("SELECT COUNT(*) AS n FROM gpu_cost_usage")[0]["n"] > 0
    # the run's end released what is past sweep.keep_parked, and only that: its own state and yesterday's stay
    with pytest.raises(AuditError, match="was released"):
        store.load_snapshot("gpu_zombie_sweep:three-days-ago#plan")
    assert store.load_snapshot("gpu_zombie_sweep:yesterday#plan") == '{"decisions": []}'
    assert store.load_snapshot(runs[0]["run_id"]).startswith("{")
