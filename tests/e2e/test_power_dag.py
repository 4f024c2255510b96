"""``gpu_offhours_power`` through Airflow (``dag.test()``): dry-run on the simulator; approval both ways on real
Slurm; the act step trusts the audit store, not XCom."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pendulum
import pytest

from gpu_cost.audit.store import AuditStore
from tests.fixtures.airflow_db import fresh_dag
from tests.fixtures.airflow_db import respond_when_waiting as _respond

pytestmark = pytest.mark.e2e

DAG_ID = "gpu_offhours_power"
NIGHT = pendulum.datetime(2026, 11, 24, 23, 0, tz="UTC")  # a Tuesday night

SCENARIO = """
seed: 3
anchor: now
nodes:
  - {name: n01, gpus: 4, model: a100, idle_power_w: 60}
  - {name: n02, gpus: 4, model: a100, idle_power_w: 70}
  - {name: n03, gpus: 4, model: h100, idle_power_w: 90}
  - {name: n04, gpus: 4, model: a100, idle_power_w: 60}
jobs:
  - {job_id: "2001", user: alice, account: nlp, name: train, behaviour: dataloader, node: n01, gpus: [0], start: -3h}
"""


def respond_when_waiting(dag_id: str, task_id: str, chosen: list[str], timeout: float = 120) -> bool:
    """Answer the HITL request as 'pytest' (see ``tests.fixtures.airflow_db.respond_when_waiting``)."""
    return _respond(dag_id, task_id, chosen, timeout=timeout, by='pytest')


@pytest.fixture
def dag(airflow_db):  # type: ignore[no-untyped-def]
    return fresh_dag(DAG_ID)


@pytest.fixture
def audit(tmp_path: Path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "audit.db")}))
    monkeypatch.setenv("GPU_COST_APPROVAL_NOTIFY", "0")
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(tmp_path))  # the deployment's policies: runs name one
    return tmp_path


def _run(dag, conf, answer=None, when=NIGHT):  # type: ignore[no-untyped-def]
    if answer is not None:
        threading.Thread(target=respond_when_waiting, args=(DAG_ID, "approve", answer), daemon=True).start()
    dr = dag.test(run_conf=conf, logical_date=when)
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    store = AuditStore()
    run = store.get_run(f"{DAG_ID}:{dr.run_id}")  # this run's row (not "the latest": two runs can start within a tick)
    assert run is not None, f"no audit row for {dr.run_id}"
    return dr, states, store, run


def test_dry_run_on_the_simulator_records_and_powers_nothing(dag, audit, monkeypatch) -> None:
    scenario = audit / "scenario.yaml"
    scenario.write_text(SCENARIO)
    monkeypatch.setenv("GPU_COST_SCENARIO", str(scenario))
    policy = audit / "policy.yaml"
    policy.write_text("offhours: {warm_reserve_nodes: 1, util_max: 50}\n")
    # state parked by earlier runs: one past the default sweep.keep_parked (2 days) before this run's instant
    parked = AuditStore().ensure_schema()
    parked.save_snapshot(f"{DAG_ID}:before", NIGHT.timestamp() - 3 * 86400, "{}")
    parked.save_snapshot(f"{DAG_ID}:within", NIGHT.timestamp() - 3600, "{}")
    dr, states, store, run = _run(dag, {"policy": policy.stem, "source": "sim"})
    assert dr.state == "success", states
    assert [store.fetch("load_snapshot", {"run_id": f"{DAG_ID}:{k}"})[0]["payload"] for k in ("before", "within")] \
        == ["", "{}"]  # the power run's end released the state past sweep.keep_parked
    assert states["approve"] == "skipped" and states["record"] == "success"
    rows = store.decisions_of_run(run["run_id"])
    down = sorted(r["target"] for r in rows if r["action"] == "power_down")
    # n01 runs a job; of n02-n04 the frugal n04 (4 x 60 W) is the reserve, the hungrier two would go down
    assert down == ["node:n02", "node:n03"]
    assert all(r["mode"] == "dry-run" for r in rows)
    assert store.table_counts()["gpu_cost_actions"] == 0 and store.table_counts()["gpu_cost_savings"] == 0
    counts = json.loads(run["counts"])
    assert counts["in_window"] is True and counts["down"] == 2 and counts["acted"] == 0


ENFORCE = """
mode: enforce
approval: {timeout: 10m}
offhours: {warm_reserve_nodes: 0, min_up: 0, approval_over_nodes: 1, require_gpu_metrics: false}
"""


def test_approval_reject_then_approve_on_real_slurm(dag, audit, slurm_cluster, monkeypatch) -> None:
    c = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    policy = audit / "policy.yaml"
    policy.write_text(ENFORCE)
    conf = {"policy": policy.stem, "source": "slurm", "dry_run": False}
    before = c.suspend_log()
    dr, states, store, run = _run(dag, conf, ["Reject"])
    assert dr.state == "success", states
    assert states["approve"] == "success" and states["power_down"] == "skipped" and states["record"] == "success"
    rows = [r for r in store.decisions_of_run(run["run_id"]) if r["action"] == "power_down"]
    assert len(rows) == 2 and {r["approval_status"] for r in rows} == {"rejected"}
    assert c.suspend_log() == before and all(c.node_state(n) == "IDLE" for n in c.nodes)
    try:
        # the next hour: decisions are per node and hour, and a rejected one is not asked again
        dr, states, store, run = _run(dag, conf, ["Approve"], NIGHT.add(hours=1))
        assert dr.state == "success", states
        assert states["power_down"] == "success", states
        rows = [r for r in store.decisions_of_run(run["run_id"]) if r["action"] == "power_down"]
        assert {r["approval_status"] for r in rows} == {"approved"} and {r["status"] for r in rows} == {"acted"}
        for n in c.nodes:
            c.wait_node(n, lambda s: "POWERED_DOWN" in s, 45)
        new = c.suspend_log()[len(before):].split()
        assert sorted(new) in (["gpu01", "gpu02"], ["gpu[01-02]"])  # the SuspendProgram got the names
        acts = store.query("SELECT status, output FROM gpu_cost_actions")
        assert {a["status"] for a in acts} == {"succeeded"} and len(acts) == 2
    finally:
        c.resume_all()


def test_act_step_acts_on_the_store_not_on_a_tampered_xcom(dag, audit, slurm_cluster, monkeypatch) -> None:
    from gpu_cost.airflow import power_tasks

    c = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    policy = audit / "policy.yaml"
    policy.write_text("mode: enforce\noffhours: {warm_reserve_nodes: 1, require_gpu_metrics: false}\n")
    monkeypatch.setenv("GPU_COST_POLICY", str(policy))  # the deployment's default: no param names a file
    plan_task = power_tasks.plan_task

    def tampered(params, context):  # type: ignore[no-untyped-def]
        out = plan_task(params, context)
        rows = [r for r in AuditStore().decisions_of_run(out["run_id"]) if r["action"] == "power_down"]
        assert len(rows) == 1, rows  # one of the two idle nodes goes, the other is the warm reserve
        spare = next(n for n in c.nodes if f"node:{n}" != rows[0]["target"])
        # what a bug or a hand on the XCom table could pass on: the reserve node put first under the
        # recorded (live, unapproved-free) decision's id, and an extra decision of its own
        forged = {**rows[0], "target": f"node:{spare}", "host": spare, "mode": "enforce", "evidence": {}}
        extra = {**forged, "decision_id": "forged-extra"}
        out["decisions"] = [forged, extra, *out.get("decisions", [])]
        out["down"] = [{"node": spare}]
        return out

    monkeypatch.setattr(power_tasks, "plan_task", tampered)
    before = c.suspend_log()
    try:
        dr, states, store, run = _run(dag, {"source": "slurm", "dry_run": False})
        assert dr.state == "success", states
        assert states["approve"] == "skipped" and states["power_down"] == "success", states
        (row,) = [r for r in store.decisions_of_run(run["run_id"]) if r["action"] == "power_down"]
        chosen = row["target"].removeprefix("node:")
        spare = next(n for n in c.nodes if n != chosen)
        assert row["status"] == "acted"
        acts = store.query("SELECT target, status FROM gpu_cost_actions")
        assert acts == [{"target": row["target"], "status": "succeeded"}]
        c.wait_node(chosen, lambda s: "POWERED_DOWN" in s, 45)
        assert c.suspend_log()[len(before):].split() == [chosen]
        assert c.node_state(spare) == "IDLE"
    finally:
        c.resume_all()
