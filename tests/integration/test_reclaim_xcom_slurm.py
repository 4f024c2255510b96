"""The manual reclaim's act step takes nothing that acts from XCom: a forged cluster size lifts no cap.

On the real Slurm test cluster (2 nodes, 8 GPUs): a manual ``cancel`` of a running 2-GPU job is
decided as ``prepare`` decides it, the rolling caps allowing 10 % of the GPUs an hour. ``prepare``'s
XCom is then forged to say the cluster has a million GPUs (2 GPUs: 0.0002 %), as anyone with XCom
write access could through Airflow's REST API. The act step reads the size from the run's snapshot
in the audit store: the cap holds, ``scancel`` is never sent, the job keeps running.
"""

from __future__ import annotations

import json
import time
import types
from pathlib import Path

import pytest

from gpu_cost.airflow import power_tasks, reclaim_tasks, runtime
from gpu_cost.loop import reclaim

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUN = "forged-size"
POLICY = """
mode: enforce
manual: {operators: [alice]}
approval: {gpu_hours_at_risk: 100000}
caps: {max_gpu_share: 1.0, rolling: {max_gpu_share_per_hour: 0.1}}
"""


def test_a_forged_cluster_size_does_not_lift_the_rolling_caps(slurm_cluster, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    c = slurm_cluster
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "a.db")}))
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    monkeypatch.setenv("GPU_COST_SLURM", "local")
    jid = c.submit("sleep 300", "--job-name=busy-training", "--gres=gpu:2")
    try:
        c.wait_state(jid, "RUNNING", 30)
        run_id = f"{reclaim_tasks.DAG_ID}:{RUN}"
        store = runtime.store()
        store.execute("pin_policy", {"run_id": run_id, "name": "t", "sha256": runtime._sha256(POLICY),
                                     "content": POLICY, "pinned_at": time.time()})
        policy = runtime.run_policy(store, run_id)
        now = float(int(time.time()))
        # what prepare stores for a live source: the run, its snapshot (Slurm's nodes and jobs), the decisions
        snap = power_tasks.snapshot_for(policy, now, "slurm")
        assert snap.gpu_count() == 8
        store.begin_run(run_id, dag_id=reclaim_tasks.DAG_ID, started_at=now, data_ts=now, source="prometheus",
                        mode="enforce")
        store.save_snapshot(run_id, now, snap.to_json())
        request = reclaim.parse_request({"target_kind": "job", "target_ids": [jid], "action": "cancel",
                                         "reason": "forged-size test: idle for hours", "dry_run": False}, "alice")
        p = reclaim.plan(request, policy, snap, now=now, run_key=run_id)
        (d,) = p.decisions
        assert d.action == "cancel" and d.gpus == 2 and d.acts and not d.requires_approval, d
        store.record_decisions(p.decisions, run_id, status="decided")

        forged = {"run_id": run_id, "now": now, "cluster_gpus": 1_000_000, "decision_ids": [d.decision_id]}
        context = {"dag_run": types.SimpleNamespace(dag_id=reclaim_tasks.DAG_ID, run_id=RUN)}
        out = reclaim_tasks.act(forged, "automatic", context)

        (result,) = out["results"]
        assert result["status"] == "skipped" and "max_gpu_share_per_hour" in (result.get("error") or ""), result
        assert c.job_state(jid) == "RUNNING"  # no scancel was sent
        (row,) = store.actions_of_decision(d.decision_id)
        assert row["status"] == "skipped" and row["command"] is None, row
    finally:
        c.cancel_all()
