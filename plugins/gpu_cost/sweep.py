"""One sweep, step by step: collect → detect → decide → record (→ act, in ``gpu_cost.actions``).

The DAG tasks and the ``gpu-cost sweep`` command call these same functions. Bulk data (the
snapshot) goes to the audit store; what flows between steps is small.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpu_cost.audit.store import AuditStore
from gpu_cost.errors import GpuCostError
from gpu_cost.model import Decision, Finding, Snapshot
from gpu_cost.policy.engine import Plan, decide, track_of
from gpu_cost.policy.schema import Policy
from gpu_cost.rules import run_rules

logger = logging.getLogger(__name__)


def collect(policy: Policy, now: float, source: str | None = None, **kwargs: Any) -> Snapshot:
    """Return the snapshot of the cluster at ``now`` from the configured source."""
    src = source or policy.sweep.source
    if src == "sim":
        from gpu_cost.sources import sim

        scenario = kwargs.get("scenario")
        if scenario is None or isinstance(scenario, str):
            scenario = sim.load_scenario(scenario)
        return sim.snapshot(policy, now, scenario)
    if src == "prometheus":
        try:
            from gpu_cost.sources import live
        except ImportError as exc:
            raise GpuCostError("the prometheus source is not available in this build") from exc
        return live.snapshot(policy, now, **kwargs)  # type: ignore[no-any-return]
    if src == "trace":
        from gpu_cost.sources import trace

        return trace.snapshot(policy, now, kwargs["samples"], kwargs["jobs"])
    raise GpuCostError(f"unknown source {src!r} (use sim, prometheus or trace)")


def detect(snapshot: Snapshot, policy: Policy) -> list[Finding]:
    """Return the findings of every enabled rule."""
    return run_rules(snapshot, policy)


def plan(findings: Sequence[Finding], snapshot: Snapshot, policy: Policy, store: AuditStore, now: float,
         predicted_end: dict[str, float] | None = None) -> Plan:
    """Return the decisions for ``findings``, reading escalation state and snoozes from the store."""
    tracks = {track_of(policy.rule_mode(f.rule)) for f in findings} | {track_of(policy.mode)}
    escalations: dict[tuple[str, str, str], dict[str, Any]] = {}
    for track in tracks:
        for row in store.open_escalations(track):
            escalations[(row["rule"], row["target"], track)] = row
    for f in findings:
        key = (f.rule, f.target, track_of(policy.rule_mode(f.rule)))
        if key not in escalations:
            row = store.escalation(*key)
            if row is not None:
                escalations[key] = row
    snoozes: dict[str, float] = {}
    for s in store.active_snoozes(now):
        snoozes[s["target"]] = max(snoozes.get(s["target"], 0.0), float(s["until_ts"]))
    rejected = [
        r["decision_id"] for r in store.query(
            "SELECT decision_id FROM gpu_cost_decisions WHERE approval_status IN ('rejected', 'timed_out')"
        )
    ]
    return decide(
        findings, policy, now=now, escalations=escalations, snoozed_targets=snoozes, degraded=snapshot.degraded,
        total_gpus=len(snapshot.gpus), predicted_end=predicted_end, rejected=rejected,
    )


def record(p: Plan, store: AuditStore, run_id: str, now: float) -> dict[str, Any]:
    """Write the plan: decisions (idempotent), new episodes, episodes that ended.

    Dry-run decisions are complete once recorded, so their ladder advances here; live decisions
    advance when their action succeeds (``gpu_cost.actions``).
    """
    for o in p.openings:
        store.execute("insert_escalation", {"rule": o.rule, "target": o.target, "track": o.track, "episode": o.episode,
                                            "now": now, "job_id": o.job_id, "user_name": o.user})
    if p.seen:
        store.execute("touch_escalation", [{"rule": r, "target": t, "track": k, "now": now} for r, t, k in p.seen])
    if p.closing:
        store.execute("close_escalation", [{"rule": r, "target": t, "track": k, "now": now} for r, t, k in p.closing])
    status = "capped" if p.cap_violation else "decided"
    dry = [d for d in p.decisions if not d.acts]
    live = [d for d in p.decisions if d.acts]
    inserted = store.record_decisions(dry, run_id, status="recorded" if not p.cap_violation else status)
    inserted += store.record_decisions(live, run_id, status=status)
    advance_dry_run(dry, store, now)
    return {"inserted": inserted, "decisions": len(p.decisions), "acting": len(live), "recorded_only": len(dry)}


def advance_dry_run(decisions: Sequence[Decision], store: AuditStore, now: float) -> None:
    """Move the ladder of recorded-only decisions: dry-run pretends the rung was carried out."""
    rows = [
        {"rule": d.rule, "target": d.target, "track": "dry-run", "episode": d.episode, "rung": d.rung, "now": now}
        for d in decisions if d.mode == "dry-run" and "would " not in d.reason
    ]
    if rows:
        store.execute("advance_escalation", rows)


def usage_rows(snapshot: Snapshot, policy: Policy, interval_s: float | None = None) -> list[dict[str, Any]]:
    """Return the per-sweep usage summary rows (one per node × owner) for ``gpu_cost_usage``."""
    g = snapshot.gpus
    if g.empty:
        return []
    interval = float(interval_s or policy.sweep.interval)
    idle_max = policy.rules.idle_allocation.util_max
    zmem = policy.rules.zombie.mem_min_mib
    jobs = {j.job_id: j for j in snapshot.running_jobs()}
    fresh = ~g["stale"].to_numpy(dtype=bool)
    util = np.nan_to_num(g["util_mean"].to_numpy(dtype=float), nan=0.0)
    umax = np.nan_to_num(g["util_max"].to_numpy(dtype=float), nan=100.0)
    memmin = np.nan_to_num(g["mem_min_mib"].to_numpy(dtype=float), nan=0.0)
    job_ids = g["job_id"].to_numpy(dtype=object)
    hosts = g["host"].to_numpy(dtype=object)
    models = g["model"].fillna("").to_numpy(dtype=object)
    acc: dict[tuple[str, str, str, str, str], dict[str, float]] = {}
    for i in range(len(g)):
        job = jobs.get(job_ids[i]) if job_ids[i] else None
        key = (hosts[i], models[i] or "", job.user if job else "", job.account if job else "", job.partition if job else "")
        a = acc.setdefault(key, {"gpus": 0, "total": 0.0, "alloc": 0.0, "busy": 0.0, "idle_alloc": 0.0, "zombie": 0.0, "util": 0.0})
        a["gpus"] += 1
        a["total"] += interval
        idle = fresh[i] and umax[i] < idle_max
        if job is not None:
            a["alloc"] += interval
            if idle:
                a["idle_alloc"] += interval
        elif idle and memmin[i] > zmem:
            a["zombie"] += interval
        if not idle:
            a["busy"] += interval
        a["util"] += interval * util[i] / 100.0
    return [
        {"ts": snapshot.ts, "interval_s": interval, "host": k[0], "gpu_model": k[1], "user_name": k[2], "account": k[3],
         "partition_name": k[4], "gpus": int(v["gpus"]), "total_gpu_s": v["total"], "allocated_gpu_s": v["alloc"],
         "busy_gpu_s": v["busy"], "idle_alloc_gpu_s": v["idle_alloc"], "zombie_gpu_s": v["zombie"], "util_sum": v["util"]}
        for k, v in acc.items()
    ]


def run_once(policy: Policy, now: float, store: AuditStore, run_id: str | None = None, source: str | None = None,
             dag_id: str = "gpu-cost-cli", **kwargs: Any) -> dict[str, Any]:
    """Run collect → detect → decide → record in-process and return the summary (CLI, replays)."""
    run_id = run_id or f"cli__{int(now)}"
    started = time.time()
    snap = collect(policy, now, source, **kwargs)
    store.begin_run(run_id, dag_id=dag_id, started_at=started, data_ts=now, source=snap.source, mode=policy.mode)
    store.execute("upsert_usage", usage_rows(snap, policy))
    findings = detect(snap, policy)
    p = plan(findings, snap, policy, store, now)
    counts = record(p, store, run_id, now)
    store.finish_run(run_id, status=run_status(snap, p), finished_at=time.time(), problems=snap.problems,
                     counts={"findings": len(findings), **counts})
    return {
        "run_id": run_id,
        "ts": now,
        "source": snap.source,
        "mode": policy.mode,
        "gpus": len(snap.gpus),
        "jobs": len(snap.running_jobs()),
        "degraded": snap.degraded,
        "problems": list(snap.problems),
        "findings": [finding_summary(f) for f in findings],
        "decisions": [decision_summary(d) for d in p.decisions],
        "waiting": p.waiting,
        "cap_violation": p.cap_violation,
    }


def run_status(snapshot: Snapshot, p: Plan) -> str:
    if p.cap_violation:
        return "capped"
    return "degraded" if snapshot.degraded else "ok"


def finding_summary(f: Finding) -> dict[str, Any]:
    return {"rule": f.rule, "target": f.target, "job_id": f.job_id, "user": f.user, "gpus": f.gpus,
            "suggested": f.action, "inference": f.inference}


def decision_summary(d: Decision) -> dict[str, Any]:
    return {"decision_id": d.decision_id, "rule": d.rule, "target": d.target, "job_id": d.job_id, "user": d.user,
            "action": d.action, "mode": d.mode, "rung": d.rung, "requires_approval": d.requires_approval,
            "gpus": d.gpus, "reason": d.reason}


def check_fresh(policy: Policy, now: float, source: str | None = None) -> tuple[bool, str]:
    """Return (fresh, why): whether the source answers and its newest samples are recent enough.

    The sweep's sensor calls this; a stale or silent source fails the run cleanly, before any
    decision. The simulator is always fresh.
    """
    src = source or policy.sweep.source
    if src == "sim":
        return True, "simulator"
    if src == "prometheus":
        from gpu_cost.sources import live

        return live.check_fresh(policy, now)  # type: ignore[no-any-return]
    return True, f"source {src} has no freshness check"
