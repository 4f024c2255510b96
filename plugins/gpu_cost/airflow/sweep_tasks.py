"""Task bodies of ``gpu_zombie_sweep``: each returns a small JSON-able value for XCom."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from gpu_cost import sweep
from gpu_cost.airflow import runtime
from gpu_cost.model import Decision, Finding, Snapshot, as_decisions, as_findings
from gpu_cost.policy.engine import Opening, Plan

logger = logging.getLogger(__name__)


def check_policy(params: Mapping[str, Any]) -> dict[str, Any]:
    """Load and validate the policy before anything is collected (a bad file fails the run here)."""
    policy = runtime.policy_from(params)
    source = runtime.source_from(policy, params)
    logger.info("policy %s: mode=%s source=%s", policy.source, policy.mode, source)
    return {"policy": policy.source, "mode": policy.mode, "source": source}


def collect(cfg: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Take the snapshot for the run's data instant and park it in the audit store."""
    policy = runtime.policy_from({"policy": cfg["policy"]})
    now = runtime.data_instant(context, policy)
    run_id = runtime.audit_run_id(context)
    store = runtime.store()
    store.begin_run(run_id, dag_id=run_id.split(":", 1)[0], started_at=time.time(), data_ts=now,
                    source=cfg["source"], mode=policy.mode)
    snap = sweep.collect(policy, now, cfg["source"])
    store.save_snapshot(run_id, now, snap.to_json())
    store.execute("upsert_usage", sweep.usage_rows(snap, policy))
    logger.info("snapshot at %s: %d GPUs, %d running jobs, %d processes, problems=%s", now, len(snap.gpus),
                len(snap.running_jobs()), len(snap.processes), list(snap.problems))
    return {"run_id": run_id, "now": now, "policy": cfg["policy"], "source": snap.source, "gpus": len(snap.gpus),
            "jobs": len(snap.running_jobs()), "degraded": snap.degraded, "problems": list(snap.problems)}


def _load(ref: Mapping[str, Any]) -> tuple[Any, Snapshot, Any]:
    policy = runtime.policy_from({"policy": ref["policy"]})
    store = runtime.store()
    return policy, Snapshot.from_json(store.load_snapshot(ref["run_id"])), store


def detect(ref: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Run the rules on the stored snapshot."""
    policy, snap, _ = _load(ref)
    findings = sweep.detect(snap, policy)
    for f in findings:
        logger.info("finding %s %s (%s, %d GPU) suggested %s", f.rule, f.target, f.user, f.gpus, f.action)
    return [f.to_dict() for f in findings]


def decide(ref: Mapping[str, Any], findings: list[dict[str, Any]]) -> dict[str, Any]:
    """Turn findings into decisions under the policy and the escalation state."""
    policy, snap, store = _load(ref)
    p = sweep.plan(as_findings(findings), snap, policy, store, float(ref["now"]))
    for d in p.decisions:
        logger.info("decision %s %s → %s [%s] %s", d.rule, d.target, d.action, d.mode, d.reason)
    if p.cap_violation:
        logger.error("cap exceeded: %s", p.cap_violation)
    return plan_to_xcom(p)


def record(ref: Mapping[str, Any], plan: Mapping[str, Any]) -> dict[str, Any]:
    """Write decisions and escalation changes; finish the run's audit row. Returns the run summary."""
    p = plan_from_xcom(plan)
    policy, snap, store = _load(ref)
    counts = sweep.record(p, store, ref["run_id"], float(ref["now"]))
    status = sweep.run_status(snap, p)
    store.finish_run(ref["run_id"], status=status, finished_at=time.time(), problems=snap.problems,
                     counts={"findings": len(p.decisions) + len(p.waiting) + len(p.snoozed), **counts})
    return {
        "run_id": ref["run_id"],
        "status": status,
        "mode": policy.mode,
        "decisions": [sweep.decision_summary(d) for d in p.decisions],
        "cap_violation": p.cap_violation,
        **counts,
    }


def plan_to_xcom(p: Plan) -> dict[str, Any]:
    return {
        "decisions": [d.to_dict() for d in p.decisions],
        "openings": [o.__dict__ for o in p.openings],
        "seen": [list(k) for k in p.seen],
        "closing": [list(k) for k in p.closing],
        "waiting": p.waiting,
        "snoozed": p.snoozed,
        "cap_violation": p.cap_violation,
    }


def plan_from_xcom(d: Mapping[str, Any]) -> Plan:
    return Plan(
        decisions=as_decisions(d.get("decisions", [])),
        openings=[Opening(**o) for o in d.get("openings", [])],
        seen=[tuple(k) for k in d.get("seen", [])],  # type: ignore[misc]
        closing=[tuple(k) for k in d.get("closing", [])],  # type: ignore[misc]
        waiting=list(d.get("waiting", [])),
        snoozed=list(d.get("snoozed", [])),
        cap_violation=d.get("cap_violation"),
    )


__all__ = ["Decision", "Finding", "check_policy", "collect", "decide", "detect", "record"]
