"""The sweep acts on what the audit store holds, never on XCom: a forged entry is refused and recorded.

The sweep's task callables run in this process, one after the other, with their XCom values handed
on by hand (as Airflow would), on the simulated cluster and an enforce-mode policy. Then the
values are forged between two tasks, as anyone with XCom write access could through Airflow's
REST API (the real API is exercised in ``tests/e2e/test_sweep_xcom_forgery.py``).
"""

from __future__ import annotations

import json
import re
import types
from pathlib import Path
from typing import Any

import pendulum
import pytest

from gpu_cost.airflow import runtime, sweep_tasks
from gpu_cost.audit.store import AuditStore
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.model import Decision
from gpu_cost.decide.engine import Plan

#: the default scenario's anchor: the simulated cluster is the shipped picture at this instant
WHEN = pendulum.datetime(2026, 11, 30, tz="UTC")
POLICY = """
mode: enforce
approval: {gpu_hours_at_risk: 100000}
caps: {max_actions_per_run: 20, max_gpu_share: 0.9}
rules:
  idle_allocation: {ladder: [{action: notify}]}
  zombie: {ladder: [{action: notify}]}
protections:
  - {name: no-interrupt label, level: never, match: {labels: [no-interrupt]}}
"""


def _decision(did: str, action: str = "notify", target: str = "job:1003") -> Decision:
    return Decision(decision_id=did, ts=0.0, rule="idle_allocation", target_kind="job", target=target, action=action,
                    mode="enforce")


# -- the check itself ------------------------------------------------------------------------------
def test_the_plans_own_reference_is_no_tampering() -> None:
    p = Plan(decisions=[_decision("a"), _decision("b")])
    assert sweep_tasks.plan_ref(p) == {"decision_ids": ["a", "b"], "snoozed_ids": [], "capped": False}
    assert sweep_tasks.plan_tampering(sweep_tasks.plan_ref(p), p) == []


@pytest.mark.parametrize(
    ("forge", "expected"),
    [(lambda ref: {**ref, "decision_ids": [*ref["decision_ids"], "x"]}, r"decision x named in decide's XCom was "
                                                                       r"not decided by the engine: refused"),
     (lambda ref: {**ref, "decisions": [_decision("x", "terminate", "job:1007").to_dict()]},
      r"decision terminate job:1007 \(x\) named .* refused, not recorded, not acted on"),
     (lambda ref: {**ref, "snoozed_ids": ["x"]}, r"decision x named .* refused"),
     (lambda ref: {**ref, "decision_ids": ["a"]}, r"1 decision\(s\) of the engine missing from decide's XCom \(b\): "
                                                  r"carried out from the store"),
     (lambda ref: {**ref, "capped": True}, r"differs from the stored plan in capped"),
     (lambda ref: ["x"], r"not the plan's reference \(got list\)")],
    ids=["extra-id", "forged-decision", "forged-snooze", "dropped-id", "changed-flag", "not-a-mapping"])
def test_every_change_of_decides_xcom_is_named(forge: Any, expected: str) -> None:
    p = Plan(decisions=[_decision("a"), _decision("b")])
    problems = sweep_tasks.plan_tampering(forge(sweep_tasks.plan_ref(p)), p)
    assert problems and any(re.search(expected, t) for t in problems), problems


# -- the tasks, forged between them ------------------------------------------------------------------
@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run the sweep's tasks up to ``detect``; return the context and the XCom values so far."""
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB",
                       json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "audit.db")}))
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(tmp_path))
    monkeypatch.delenv("GPU_COST_SCENARIO", raising=False)
    (tmp_path / "enforce.yaml").write_text(POLICY)
    params = {"policy": "enforce", "source": "sim"}
    ctx = {"dag_run": types.SimpleNamespace(dag_id="gpu_zombie_sweep", run_id="forgery", run_after=WHEN),
           "logical_date": WHEN, "params": params}
    cfg = sweep_tasks.check_policy(params, ctx)
    parts = [sweep_tasks.collect(cfg, part, ctx) for part in sweep_tasks.shards(cfg, ctx)]
    ref = sweep_tasks.merge(cfg, parts, ctx)
    found = [sweep_tasks.detect(ref, part, ctx) for part in parts]
    return {"ctx": ctx, "ref": ref, "found": found, "run_id": "gpu_zombie_sweep:forgery", "store": AuditStore()}


def _alerts(store: AuditStore, run_id: str) -> list[dict[str, Any]]:
    return [r for r in store.decisions_of_run(run_id) if r["rule"] == runtime.TAMPERING_RULE]


def test_xcom_carries_ids_and_counts_not_decisions(run: dict[str, Any]) -> None:
    assert run["found"] == [{"shard": 0, "of": 1, "findings": run["found"][0]["findings"]}]
    plan = sweep_tasks.decide(run["ref"], run["found"], run["ctx"])
    assert set(plan) == {"decision_ids", "snoozed_ids", "capped"} and plan["decision_ids"]
    summary = sweep_tasks.record(run["ref"], plan, run["ctx"])
    assert summary["tampering"] == 0 and summary["decisions"]
    store, run_id = run["store"], run["run_id"]
    assert sorted(r["decision_id"] for r in store.decisions_of_run(run_id)) == sorted(plan["decision_ids"])
    assert _alerts(store, run_id) == [] and runtime.tampering_problems(store, run_id) == []


def test_xcom_given_back_with_its_keys_reordered_is_no_tampering(run: dict[str, Any]) -> None:
    # PostgreSQL keeps XCom as JSONB, which hands a dict back with its keys in another order
    found = [dict(reversed(list(f.items()))) for f in run["found"]]
    plan = sweep_tasks.decide(run["ref"], found, run["ctx"])
    sweep_tasks.record(run["ref"], dict(reversed(list(plan.items()))), run["ctx"])
    assert _alerts(run["store"], run["run_id"]) == []


def test_a_decision_forged_into_decides_xcom_is_refused_and_recorded(run: dict[str, Any]) -> None:
    store, run_id = run["store"], run["run_id"]
    plan = sweep_tasks.decide(run["ref"], run["found"], run["ctx"])
    forged = _decision("f" * 20, "terminate", "job:1007")
    summary = sweep_tasks.record(run["ref"], {**plan, "decision_ids": [*plan["decision_ids"], forged.decision_id],
                                              "decisions": [forged.to_dict()]}, run["ctx"])
    assert store.get_decision(forged.decision_id) is None  # never recorded: no act step can find it
    assert [d for d, _ in sweep_tasks.stored_decisions(store, run_id) if d.target == "job:1007"] == []
    kept = {r["decision_id"] for r in store.decisions_of_run(run_id)} - {a["decision_id"] for a in _alerts(store, run_id)}
    assert kept == set(plan["decision_ids"])  # everything the engine decided goes on
    assert summary["tampering"] > 0 and summary["automatic"] == len(plan["decision_ids"]) - summary["recorded_only"]
    (alert,) = _alerts(store, run_id)
    assert alert["action"] == "none" and alert["status"] == "recorded" and alert["target"] == "agent:gpu_zombie_sweep"
    problems = runtime.tampering_problems(store, run_id)
    assert problems and f"terminate job:1007 ({forged.decision_id})" in problems[0]
    # a retried record records the alert once
    sweep_tasks.record(run["ref"], {**plan, "decision_ids": [*plan["decision_ids"], forged.decision_id]}, run["ctx"])
    assert len(_alerts(store, run_id)) == 1


def test_findings_forged_into_detects_xcom_are_not_decided_on(run: dict[str, Any]) -> None:
    store, run_id = run["store"], run["run_id"]
    honest = sweep_tasks.decide(run["ref"], run["found"], run["ctx"])
    fake = {"rule": "idle_allocation", "target": "job:1004", "job_id": "1004", "user": "dan", "gpus": 8,
            "action": "terminate", "evidence": {}}
    forged = sweep_tasks.decide(run["ref"], [{**run["found"][0], "findings": 99, "extra": [fake]}], run["ctx"])
    assert forged == honest  # decided on the stored findings
    (alert,) = _alerts(store, run_id)
    assert "detect's XCom" in alert["reason"] and "deciding on the stored findings" in alert["reason"]


def test_a_task_reads_its_run_and_instant_from_the_store_not_xcom(run: dict[str, Any]) -> None:
    plan = sweep_tasks.decide({**run["ref"], "run_id": "gpu_zombie_sweep:other", "now": 4e9}, run["found"], run["ctx"])
    store = run["store"]
    parked = sweep_tasks.plan_from_json(json.loads(store.load_snapshot(sweep_tasks.plan_key(run["run_id"]))))
    assert [d.decision_id for d in parked.decisions] == plan["decision_ids"]
    assert {d.ts for d in parked.decisions} == {WHEN.timestamp()}
    with pytest.raises(GpuCostError, match=r"sweep\.shards=1; XCom was changed"):
        sweep_tasks.detect(run["ref"], {"shard": 0, "of": 2}, run["ctx"])
