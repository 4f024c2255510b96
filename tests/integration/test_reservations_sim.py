"""Issue 34, done when: the shipped policy, in enforce, on the simulated cluster (``--source sim``) never
deletes an administrator's idle reservation, however long it stays idle; it reports it.

Each sweep is ``gpu-cost sweep --source sim --mode enforce``; its notices are then carried out as the
sweep DAG's act step does (the one execute step, the Slack webhook pointing at the loopback sink), so the
ladder moves on as it would in production.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_cost.act import dispatch
from gpu_cost.act.base import ActionContext
from gpu_cost.airflow.sweep_tasks import stored_decisions
from gpu_cost.audit.store import AuditStore
from gpu_cost.config.loader import load_policy
from gpu_cost.decide.engine import may_act
from tests.fixtures.core import ROOT
from tests.unit.test_cli import one_json, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHIPPED = ROOT / "include" / "policy" / "default.yaml"
SCENARIO = """
seed: 3
anchor: 2026-11-30T00:00:00Z
nodes:
  - {name: gpu01, gpus: 4}
  - {name: gpu02, gpus: 4}
  - {name: gpu03, gpus: 4}
jobs:
  - {job_id: "101", user: alice, behaviour: training, node: gpu01, gpus: [0, 1, 2, 3], start: -3h, account: vision}
reservations:
  - {name: admin-weekly-train, nodes: [gpu03], start: -1d, end: 6d, users: [admin], flags: [WEEKLY]}
  - {name: gpu-cost-vision-2026113008, nodes: [gpu02], start: 8h, end: 2d, users: [root], flags: [OVERLAP]}
"""
THEIRS = {"reservation:admin-weekly-train", "reservation:gpu-cost-vision-2026113008"}  # the second: a squatted prefix


def test_the_shipped_policy_in_enforce_on_the_simulator_never_deletes_an_administrators_reservation(
        tmp_path: Path, slack_sink, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    conn = json.dumps({"conn_type": "slackwebhook", "password": slack_sink.webhook_url()})
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLACK", conn)
    (tmp_path / "cluster.yaml").write_text(SCENARIO)
    db = str(tmp_path / "audit.db")
    store = AuditStore(f"sqlite:///{db}")
    policy = load_policy(SHIPPED)
    assert policy.mode == "dry-run"
    sent: list[str] = []
    for at in ("2026-11-30T12:00:00Z", "2026-11-30T14:05:00Z", "2026-11-30T16:10:00Z", "2026-12-01T12:00:00Z"):
        r = run_cli("sweep", "--source", "sim", "--mode", "enforce", "--policy", str(SHIPPED),
                    "--scenario", str(tmp_path / "cluster.yaml"), "--at", at, "--db", db, "--json",
                    env_extra={"AIRFLOW_CONN_GPU_COST_SLACK": conn})
        assert r.returncode == 0, r.stderr[-2000:]
        out = one_json(r.stdout)
        assert out["mode"] == "enforce"
        found = {f["target"] for f in out["findings"] if f["rule"] == "idle_reservation"}
        assert found == THEIRS, at  # seen idle every time ...
        decided = [(d["target"], d["action"], d["mode"]) for d in out["decisions"] if d["rule"] == "idle_reservation"]
        # ... reported once (a notice each, in enforce), never released
        assert decided == ([(t, "notify", "enforce") for t in sorted(THEIRS)] if not sent else []), (at, decided)
        # the DAG's act step: the run's acting decisions, through the one execute step
        run_id = out["run_id"]
        acting = [d for d, row in stored_decisions(store, run_id) if may_act(row)]
        ctx = ActionContext(policy=policy, dry_run=False, now=float(out["ts"]), run_id=run_id, source="sim",
                            extra={"store": store})
        results = dispatch.execute(acting, ctx, store)
        sent += [d.target for d, res in zip(acting, results, strict=True)
                 if d.rule == "idle_reservation" and res["status"] == "succeeded"]
    assert sorted(sent) == sorted(THEIRS), "each notice went out once"
    rows = store.query("SELECT target, action, reason FROM gpu_cost_decisions WHERE rule = 'idle_reservation'")
    assert {(r["target"], r["action"]) for r in rows} == {(t, "notify") for t in THEIRS}
    assert all("reported to the administrators, never released" in r["reason"] for r in rows)
    assert store.query("SELECT * FROM gpu_cost_actions WHERE action = 'release_reservation'") == []
