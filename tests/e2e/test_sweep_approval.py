"""The sweep DAG's acting half through Airflow (``dag.test()``): approve, reject, caps, stale metrics.

Each test gets its own audit store and an enforce-mode policy. The executors of other modules
(Slurm, SSH, Slack) are replaced by a test executor registered in-process (``dag.test()`` runs
tasks in this process), so these tests cover routing, approval and the audit trail; the real
executors are tested by their own suites.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pendulum
import pytest

from gpu_cost.audit.store import AuditStore
from tests.fixtures.airflow_db import fresh_dag
from tests.fixtures.airflow_db import respond_when_waiting as _respond
from tests.unit.policy.helpers import Effects, install

pytestmark = pytest.mark.e2e

#: the runs' data instant, fixed: at the default scenario's anchor (the start of a UTC day) the
#: simulated cluster is exactly the shipped picture, whatever the wall clock says
WHEN = pendulum.datetime(2026, 11, 30, tz="UTC")

POLICY = """
mode: enforce
approval: {gpu_hours_at_risk: 1}
caps: {max_actions_per_run: 20, max_gpu_share: 0.5}
rules:
  idle_allocation: {ladder: [{action: demote}]}
  zombie: {ladder: [{action: notify}]}
"""


def respond_when_waiting(dag_id: str, task_id: str, chosen: list[str], timeout: float = 500) -> bool:
    """Answer the HITL request as 'pytest' (see ``tests.fixtures.airflow_db.respond_when_waiting``)."""
    return _respond(dag_id, task_id, chosen, timeout=timeout, by='pytest')


@pytest.fixture(scope="module")
def sweep_dag():  # type: ignore[no-untyped-def]
    """Our own DAG object: the session's shared dagbag must not see our enforce-mode policies."""
    return fresh_dag("gpu_zombie_sweep")


@pytest.fixture
def env(tmp_path: Path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "audit.db")}))
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(tmp_path))  # the deployment's policies: runs name one
    monkeypatch.setenv("GPU_COST_APPROVAL_NOTIFY", "0")
    effects = Effects()
    install(monkeypatch, effects)
    return tmp_path, effects


def _run(dag, policy_file: Path, answer: list[str] | None = None):  # type: ignore[no-untyped-def]
    if answer is not None:
        threading.Thread(target=respond_when_waiting, args=(dag.dag_id, "approve", answer), daemon=True).start()
    dr = dag.test(run_conf={"policy": policy_file.stem, "source": "sim"}, logical_date=WHEN)
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    store = AuditStore()
    run = store.get_run(f"gpu_zombie_sweep:{dr.run_id}")
    return dr, states, store, run


def _policy(tmp: Path, text: str = POLICY) -> Path:
    f = tmp / "policy.yaml"
    f.write_text(text)
    return f


def test_approve_acts_and_records_who(airflow_db, sweep_dag, env) -> None:  # type: ignore[no-untyped-def]
    tmp, effects = env
    dr, states, store, run = _run(sweep_dag, _policy(tmp), ["Approve"])
    assert dr.state == "success", states
    assert states["approve"] == "success" and states["act"] == "success" and states["act_approved"] == "success"
    rows = {r["job_id"] or r["user_name"]: r for r in store.decisions_of_run(run["run_id"])}
    demote = rows["1003"]  # carol's idle job: 2 GPUs x 3 h at risk > 1 GPU-h
    assert demote["action"] == "demote" and demote["requires_approval"] == 1
    assert demote["approval_status"] == "approved" and demote["approved_by"] == "pytest"
    assert demote["approved_at"] is not None and demote["status"] == "acted"
    assert ("demote", "job:1003") in effects.calls
    assert ("notify", rows["bob"]["target"]) in effects.calls  # the zombie's notice needed no approval
    assert ("demote", "job:1007") not in effects.calls  # protected by its label
    assert run["status"] == "ok"
    acts = store.actions_of_decision(demote["decision_id"])
    assert len(acts) == 1 and acts[0]["status"] == "succeeded"


def test_reject_skips_acting_records_it_and_is_not_asked_again(airflow_db, sweep_dag, env) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.config.loader import load_policy
    from gpu_cost.core.model import Snapshot
    from gpu_cost.loop import sweep

    tmp, effects = env
    policy_file = _policy(tmp)
    dr, states, store, run = _run(sweep_dag, policy_file, ["Reject"])
    assert dr.state == "success", states
    assert states["approve"] == "success" and states["act_approved"] == "skipped" and states["act"] == "success"
    row = next(r for r in store.decisions_of_run(run["run_id"]) if r["job_id"] == "1003")
    assert row["approval_status"] == "rejected" and row["approved_by"] == "pytest" and row["status"] == "rejected"
    assert ("demote", "job:1003") not in effects.calls and effects.calls  # the automatic notice still went out
    # the next sweep on the same data does not ask again
    policy = load_policy(policy_file)
    snap = Snapshot.from_json(store.load_snapshot(run["run_id"]))
    p = sweep.plan(sweep.detect(snap, policy), snap, policy, store, snap.ts + 300, predicted_end={})
    assert not [d for d in p.decisions if d.job_id == "1003"]
    assert any("rejected by a human" in w.get("why", "") for w in p.waiting)


def test_cap_exceeded_aborts_acting_and_says_why(airflow_db, sweep_dag, env) -> None:  # type: ignore[no-untyped-def]
    tmp, effects = env
    dr, states, store, run = _run(sweep_dag, _policy(tmp, POLICY.replace("max_actions_per_run: 20", "max_actions_per_run: 1")))
    assert dr.state == "failed" and states["act"] == "failed" and states["approve"] == "skipped", states
    assert run["status"] == "capped" and "caps.max_actions_per_run=1" in run["problems"]
    acting = [r for r in store.decisions_of_run(run["run_id"]) if r["mode"] == "enforce" and r["action"] != "none"]
    assert acting and all(r["status"] == "capped" for r in acting)
    assert effects.calls == [] and store.table_counts()["gpu_cost_actions"] == 0


def test_stale_metrics_fail_the_run_with_no_decisions(airflow_db, sweep_dag, env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.loop import sweep

    tmp, effects = env
    monkeypatch.setattr(sweep, "check_fresh", lambda policy, now, source=None: (False, "newest sample is 20 min old"))
    sensor = sweep_dag.task_dict["metrics_fresh"]
    monkeypatch.setattr(sensor, "timeout", 1.0)
    monkeypatch.setattr(sensor, "poke_interval", 0.5)
    dr, states, store, run = _run(sweep_dag, _policy(tmp))
    assert dr.state == "failed" and states["metrics_fresh"] == "failed" and states["collect"] == "upstream_failed"
    assert run["status"] == "stale" and "newest sample is 20 min old" in run["problems"]
    assert store.table_counts()["gpu_cost_decisions"] == 0 and effects.calls == []
