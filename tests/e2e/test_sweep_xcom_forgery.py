"""A decision forged in XCom through Airflow's REST API is refused (real api-server, scheduler, dag-processor).

Its own Airflow deployment runs ``gpu_zombie_sweep`` alone with an enforce-mode policy on the
simulated cluster, where grace's job 1007 is protected (label ``no-interrupt``: decision ``none``).
A run goes through; then, as anyone allowed to edit XCom could, the test PATCHes the ``decide``
task's XCom entry to add ``terminate job:1007`` (no approval) and clears ``record`` and everything
after it, so they run again on the forged entry. The audit store, not XCom, holds what was decided:
the forged decision is never recorded nor acted on, the run records a tampering alert and fails,
and the engine's own decisions stay as they were (acted once, not repeated). On the simulator the
agent never sends ``scancel``; the audit store shows what it did.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from gpu_cost.audit.store import AuditStore
from tests.fixtures.airflow_server import AirflowServer, deployment
from tests.fixtures.core import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

DAG_ID = "gpu_zombie_sweep"
#: nothing needs a human (the run acts at once); job 1007 stays protected by the shipped protections
POLICY = """
mode: enforce
approval: {gpu_hours_at_risk: 100000}
caps: {max_actions_per_run: 20, max_gpu_share: 0.9}
rules:
  idle_allocation: {ladder: [{action: notify}]}
  zombie: {ladder: [{action: notify}]}
  low_efficiency: {ladder: [{action: advise}]}
protections:
  - {name: no-interrupt label, level: never, match: {labels: [no-interrupt]}}
"""
FORGED_ID = "f0f0f0f0f0f0f0f0f0f0"


@pytest.fixture(scope="module")
def server(session_tmp: Path, _slack_server: Any) -> Iterator[AirflowServer]:
    home = session_tmp / "forgery-airflow"
    home.mkdir(parents=True, exist_ok=True)
    policy = home / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    # the default scenario anchored at the run's own instant: the same picture at any time of day
    scenario = home / "scenario.yaml"
    scenario.write_text((ROOT / "include" / "scenarios" / "default.yaml").read_text()
                        .replace("seed: 7", "seed: 7\nanchor: now", 1), encoding="utf-8")
    with deployment(home, (f"{DAG_ID}.py",), _slack_server.webhook_url("/services/T0/B0/FORGERY"),
                    {"GPU_COST_POLICY": str(policy), "GPU_COST_SCENARIO": str(scenario),
                     "GPU_COST_APPROVAL_NOTIFY": "0", "GPU_COST_SWEEP_SCHEDULE": "none"}) as s:
        yield s


def _ti(server: AirflowServer, run: str, task: str) -> dict[str, Any]:
    return server.api(f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run, safe='')}/taskInstances/{task}")  # type: ignore[no-any-return]


def _ended(server: AirflowServer, run: str, after_try: int = 0) -> str | None:
    state = server.dag_run(DAG_ID, run)["state"]
    finish = _ti(server, run, "finish")
    if state in ("success", "failed") and finish.get("state") in ("success", "failed") and \
            int(finish.get("try_number") or 0) > after_try:
        return str(state)
    return None


def test_a_decision_forged_in_xcom_is_refused_and_recorded_as_tampering(server: AirflowServer) -> None:
    store = AuditStore(server.audit_url)
    run = str(server.api(f"/api/v2/dags/{DAG_ID}/dagRuns", "POST", {"logical_date": None, "conf": {}})["dag_run_id"])
    assert server.wait_for(lambda: _ended(server, run), "the sweep run to finish", timeout=300) == "success", \
        server.logs_tail()
    audit_run = f"{DAG_ID}:{run}"
    before = {r["decision_id"]: r for r in store.decisions_of_run(audit_run)}
    protected = next(r for r in before.values() if r["job_id"] == "1007")
    assert protected["action"] == "none" and protected["protection"], protected
    acted = {did for did, r in before.items() if r["status"] == "acted"}
    assert acted, before  # the engine's notices went out
    actions_before = store.query("SELECT action_id, decision_id, status FROM gpu_cost_actions WHERE run_id = :r",
                                 {"r": audit_run})

    # forge: the decide task's XCom gains "terminate job:1007", no approval needed
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run, safe='')}/taskInstances/decide/xcomEntries/return_value"
    value = server.api(path)["value"]
    value = json.loads(value) if isinstance(value, str) else value
    forged = {k: protected.get(k) for k in ("ts", "rule", "target_kind", "target", "job_id", "rung", "episode",
                                            "gpus", "host")}
    forged.update(decision_id=FORGED_ID, action="terminate", mode="enforce", requires_approval=False,
                  protection=None, reason="forged", user=protected["user_name"], evidence={})
    value.setdefault("decisions", []).append(forged)
    if isinstance(value.get("decision_ids"), list):
        value["decision_ids"].append(FORGED_ID)
    server.api(path, "PATCH", {"value": value})
    finish_try = int(_ti(server, run, "finish")["try_number"])
    server.api(f"/api/v2/dags/{DAG_ID}/clearTaskInstances", "POST", {
        "dry_run": False, "dag_run_id": run, "task_ids": ["record"], "include_downstream": True,
        "only_failed": False, "reset_dag_runs": True})
    state = server.wait_for(lambda: _ended(server, run, finish_try), "the cleared tasks to run again", timeout=300)

    # refused: never recorded, never acted on; nothing at all done to job 1007
    assert store.get_decision(FORGED_ID) is None
    assert store.query("SELECT * FROM gpu_cost_actions WHERE decision_id = :d OR target = 'job:1007'",
                       {"d": FORGED_ID}) == []
    # recorded as tampering: one alert row in the run naming the forged decision, the run failed
    alerts = [r for r in store.decisions_of_run(audit_run) if r["rule"] == "xcom_tampering"]
    assert len(alerts) == 1 and alerts[0]["action"] == "none" and alerts[0]["status"] == "recorded", alerts
    assert f"terminate job:1007 ({FORGED_ID})" in alerts[0]["reason"], alerts[0]["reason"]
    row = store.get_run(audit_run)
    assert row is not None and row["status"] == "failed" and "XCom tampering" in row["problems"], row
    assert state == "failed"
    # everything else as the engine decided it: the same decisions, each acted once, not repeated
    after = {r["decision_id"]: r for r in store.decisions_of_run(audit_run) if r["rule"] != "xcom_tampering"}
    assert set(after) == set(before)
    assert {did for did, r in after.items() if r["status"] == "acted"} == acted
    assert store.query("SELECT action_id, decision_id, status FROM gpu_cost_actions WHERE run_id = :r",
                       {"r": audit_run}) == actions_before
