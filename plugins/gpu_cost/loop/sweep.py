"""One sweep, step by step: collect → detect → decide → record (→ act, in ``gpu_cost.act``).

The DAG tasks and the ``gpu-cost sweep`` command call these same functions. Bulk data (the
snapshot) goes to the audit store; what flows between steps is small.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_cost.analyse import baselines, replicas
from gpu_cost.analyse.rules import run_rules
from gpu_cost.audit.store import AuditStore
from gpu_cost.capacity import reservations
from gpu_cost.config.schema import Policy
from gpu_cost.core import registry
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.model import Decision, Finding, Snapshot
from gpu_cost.decide import answers
from gpu_cost.decide.engine import Plan, decide, track_of
from gpu_cost.learn import verifier
from gpu_cost.perceive import shards
from gpu_cost.perceive.snapshot import disagreement_warning, memory_warning, unseen_gpu_warning
from gpu_cost.report.usage import record_usage

logger = logging.getLogger(__name__)


def collect(policy: Policy, now: float, source: str | None = None, **kwargs: Any) -> Snapshot:
    """Return the snapshot of the cluster at ``now`` from the configured source."""
    src = source or policy.sweep.source
    if src == "sim":
        sim = registry.source("sim")
        scenario = kwargs.get("scenario")
        if scenario is None or isinstance(scenario, str):
            scenario = sim.load_scenario(scenario)
        return sim.snapshot(policy, now, scenario, shard=kwargs.get("shard"))
    if src == "prometheus":
        try:
            from gpu_cost.perceive import live
        except ImportError as exc:
            raise GpuCostError("the prometheus source is not available in this build") from exc
        return live.snapshot(policy, now, **kwargs)  # type: ignore[no-any-return]
    if src == "trace":
        from gpu_cost.perceive import trace

        return trace.snapshot(policy, now, kwargs["samples"], kwargs["jobs"])
    raise GpuCostError(f"unknown source {src!r} (use sim, prometheus or trace)")


def detect(snapshot: Snapshot, policy: Policy) -> list[Finding]:
    """Return the findings of every enabled rule."""
    return run_rules(snapshot, policy)


# -- shards: very large clusters, swept in node groups (gpu_cost.perceive.shards) ----------------------------
def collect_shard(policy: Policy, now: float, shard: int, of: int, source: str | None = None,
                  **kwargs: Any) -> Snapshot:
    """Return what node group ``shard`` of ``of`` sees at ``now`` (the whole snapshot when ``of`` is 1).

    The simulator simulates only the group's view; the other sources read the cluster and keep
    the view (Prometheus aggregates in its own queries; Slurm answers for the cluster at once).
    """
    shards.check(shard, of)
    if of == 1:
        return collect(policy, now, source, **kwargs)
    if (source or policy.sweep.source) == "sim":
        return collect(policy, now, source, shard=(shard, of), **kwargs)
    snap = collect(policy, now, source, **kwargs)
    return shards.restrict(snap, shards.select_in(snap, shard, of))


def merge_shards(views: Sequence[Snapshot], policy: Policy, store: AuditStore | None = None) -> Snapshot:
    """Return the run's snapshot from the views of its ``len(views)`` node groups (in shard order).

    Each GPU, process and node comes from its own group; the job logs kept are those of the
    cluster's first ``evidence.job_log.max_jobs_per_sweep`` candidates, as one sweep reads them.
    With ``store``, the class baselines are read back for every job (each group has recorded its
    own), as one sweep would have set them.
    """
    from gpu_cost.perceive.live import log_candidates

    of = len(views)
    if of == 1:
        return views[0]
    merged = shards.merge([(shards.of_view(v, i, of), v) for i, v in enumerate(views)])
    keep = {j.job_id for j in log_candidates(merged, policy)}
    merged.job_logs = {k: v for k, v in merged.job_logs.items() if k in keep}
    if store is not None:
        baselines.observe(store, merged, policy, learn=False)
    return merged


def detect_shard(view: Snapshot, policy: Policy, shard: int, of: int, store: AuditStore, *,
                 log_jobs: Sequence[str] | None = None,
                 replica_sets: Mapping[str, replicas.ReplicaSet] | None = None) -> list[Finding]:
    """Return the findings node group ``shard`` of ``of`` answers for, from its view.

    :param log_jobs: the jobs whose logs the run keeps (:func:`merge_shards`); None keeps the view's.
    :param replica_sets: the whole cluster's replica sets (:func:`gpu_cost.analyse.replicas.replica_sets` of the
        merged snapshot): a set spans node groups, and a view alone would see it smaller or not at all.
    The class baselines are read back for the group's jobs: every group has recorded its own by now.
    """
    if of == 1:
        return detect(view, policy)
    sel = shards.of_view(view, shard, of)
    if log_jobs is not None:
        keep = set(log_jobs)
        view.job_logs = {k: v for k, v in view.job_logs.items() if k in keep}
    if replica_sets is not None:
        replicas.use(view, replica_sets)
    baselines.observe(store, view, policy, learn=False, only=sel.owned_jobs)
    return shards.owned(detect(view, policy), sel)


def predicted_ends(store: AuditStore, snapshot: Snapshot, now: float) -> dict[str, float]:
    """Return job id → forecast p90 end from the runtime forecasts, or {} when there are none.

    A missing or failing forecast never blocks a sweep: stakes then fall back to the time limit.
    """
    try:
        from gpu_cost.capacity.forecast.runtime import predicted_ends as forecast_ends
    except ImportError:
        return {}
    try:
        return {str(k): float(v) for k, v in (forecast_ends(store, snapshot.running_jobs(), now) or {}).items()
                if v is not None}
    except Exception:
        logger.warning("runtime forecasts unavailable; stakes use time limits", exc_info=True)
        return {}


def plan(findings: Sequence[Finding], snapshot: Snapshot, policy: Policy, store: AuditStore, now: float,
         predicted_end: dict[str, float] | None = None) -> Plan:
    """Return the decisions for ``findings``, reading escalation state and snoozes from the store.

    :param predicted_end: job id → forecast p90 end; None reads the runtime forecasts.

    Each job finding is scored by the active verifier model first (``evidence["verifier"]``), so
    the engine can hold a destructive rung back for a human when it doubts the waste; a refused
    model is in the plan's ``problems``.
    """
    problems: list[str] = []
    findings = verifier.annotate(findings, policy, store, now, problems=problems)
    tracks = {track_of(policy.rule_mode(f.rule)) for f in findings} | {track_of(policy.mode)}
    escalations: dict[tuple[str, str, str], dict[str, Any]] = {}
    for track in tracks:
        for row in store.open_escalations(track):
            escalations[(row["rule"], row["target"], track)] = row
    for f in findings:
        key = (f.rule, f.target, track_of(policy.rule_mode(f.rule)))
        if key not in escalations:
            found = store.escalation(*key)
            if found is not None:
                escalations[key] = found
    snoozes: dict[str, float | Mapping[str, Any]] = {}
    for s in store.active_snoozes(now):
        old = snoozes.get(s["target"])
        if not isinstance(old, Mapping) or float(s["until_ts"]) > float(old["until_ts"]):
            snoozes[s["target"]] = s
    ends = predicted_end if predicted_end is not None else (predicted_ends(store, snapshot, now) if findings else {})
    targets = sorted({f.target for f in findings})  # a rejection is of a decision on one of them, or matters not
    rejected = [r["decision_id"] for r in store.fetch("rejected_of_targets", {"targets": targets})] if targets else []
    p = decide(
        findings, policy, now=now, escalations=escalations, snoozed_targets=snoozes, degraded=snapshot.degraded,
        total_gpus=snapshot.gpu_count(), predicted_end=ends, rejected=rejected,
        awaiting=awaiting_approval(store, policy, now),
        disputed=answers.disputed(store, [f.target for f in findings]),
    )
    p.problems.extend(problems)
    return p


def awaiting_approval(store: AuditStore, policy: Policy, now: float) -> dict[str, str]:
    """Return decision id → run id for the decisions that wait for a human's answer right now.

    A request is answered or times out within ``approval.timeout``; a pending row older than that
    plus one sweep interval belongs to a run that died before asking, and no longer holds anything.
    """
    since = now - policy.approval.timeout - policy.sweep.interval
    return {str(r["decision_id"]): str(r["run_id"]) for r in store.fetch("awaiting_approval", {"since": since})}


def record(p: Plan, store: AuditStore, run_id: str, now: float) -> dict[str, Any]:
    """Write the plan: decisions (idempotent), new episodes, episodes that ended.

    Dry-run decisions are complete once recorded, so their ladder advances here; live decisions
    advance when their action succeeds (``gpu_cost.act``). A live decision a cap held back (status
    ``capped``) that this plan proposes again, under no cap of its own, becomes this run's to act on.
    """
    for o in p.openings:
        store.execute("insert_escalation", {"rule": o.rule, "target": o.target, "track": o.track, "episode": o.episode,
                                            "now": now, "job_id": o.job_id, "user_name": o.user})
    if p.seen:
        store.execute("touch_escalation", [{"rule": r, "target": t, "track": k, "now": now} for r, t, k in p.seen])
    if p.closing:
        store.execute("close_escalation", [{"rule": r, "target": t, "track": k, "now": now} for r, t, k in p.closing])
    dry = [d for d in p.decisions if not d.acts]
    live = [d for d in p.decisions if d.acts]
    inserted = store.record_decisions(dry, run_id, status="recorded")
    new_live = store.record_decisions(live, run_id, status="capped" if p.cap_violation else "decided")
    inserted += new_live
    if new_live < len(live) and not p.cap_violation:  # some were decided before: one read, only then
        again = [r["decision_id"] for r in store.decisions_by_ids(d.decision_id for d in live)
                 if r["status"] == "capped" and r["run_id"] != run_id]
        for decision_id in again:
            # a cap is a rate, not a verdict: a rung a cap held back, proposed again on this run's data,
            # is this run's to carry out (gpu_cost.act.dispatch tries its action again, caps checked anew)
            store.set_decision_status(decision_id, "decided", run_id=run_id, note=f"proposed again by {run_id}")
    if p.snooze_records:
        inserted += store.record_decisions(p.snooze_records, run_id, status="snoozed")
    advance_dry_run(dry, store, now)
    return {"inserted": inserted, "decisions": len(p.decisions), "acting": len(live), "recorded_only": len(dry),
            "needs_approval": sum(1 for d in live if d.requires_approval),
            "automatic": sum(1 for d in live if not d.requires_approval), "snoozed": len(p.snooze_records)}


def advance_dry_run(decisions: Sequence[Decision], store: AuditStore, now: float) -> None:
    """Move the ladder of recorded-only decisions: they are complete once recorded.

    Dry-run pretends the rung was carried out; a ``none`` decision (target protected with level
    ``never``) is recorded once per episode on its own track. Rungs held back by the mode or by
    degraded data (track ``shadow``) do not move: they stay due until they may really happen.
    """
    rows = []
    for d in decisions:
        track = d.evidence.get("track") or ("dry-run" if d.mode == "dry-run" else "live")
        if track == "shadow" or (track == "dry-run" and "would " in d.reason):
            continue
        rows.append({"rule": d.rule, "target": d.target, "track": track, "episode": d.episode, "rung": d.rung,
                     "now": now})
    if rows:
        store.execute("advance_escalation", rows)


def run_warnings(snap: Snapshot, usage: Mapping[str, Any]) -> list[str]:
    """Return the run's problems that do not degrade it: the usage's cadence warnings (:func:`record_usage`), the
    framebuffer not measured (:func:`gpu_cost.perceive.snapshot.memory_warning`), jobs' GPUs no series shows
    (:func:`gpu_cost.perceive.snapshot.unseen_gpu_warning`) and the GPUs the sources disagree on
    (:func:`gpu_cost.perceive.snapshot.disagreement_warning`)."""
    return [*usage["warnings"], *memory_warning(snap), *unseen_gpu_warning(snap), *disagreement_warning(snap)]


def run_once(policy: Policy, now: float, store: AuditStore, run_id: str | None = None, source: str | None = None,
             dag_id: str = "gpu-cost-cli", **kwargs: Any) -> dict[str, Any]:
    """Run collect → detect → decide → record in-process and return the summary (CLI, replays)."""
    run_id = run_id or f"cli__{int(now)}"
    started = time.time()
    snap = collect(policy, now, source, **kwargs)
    store.begin_run(run_id, dag_id=dag_id, started_at=started, data_ts=now, source=snap.source, mode=policy.mode)
    reservations.mark_own(store, snap, policy)  # the rules tell the agent's reservations from anyone else's
    baselines.observe(store, snap, policy, run_id=run_id)
    usage = record_usage(store, snap, policy, run_id=run_id)
    findings = detect(snap, policy)
    p = plan(findings, snap, policy, store, now)
    counts = record(p, store, run_id, now)
    status = run_status(snap, p)
    # a schedule that disagrees with sweep.interval is a warning, not missing data: the status stays
    problems = [*snap.problems, *p.problems, *run_warnings(snap, usage)]
    store.finish_run(run_id, status=status, finished_at=time.time(), problems=problems,
                     counts={"findings": len(findings), **counts})
    from gpu_cost.loop import health

    health.degraded_alert(store, policy, run_id=run_id, dag_id=dag_id, status=status, problems=problems, now=now)
    return {
        "run_id": run_id,
        "ts": now,
        "source": snap.source,
        "mode": policy.mode,
        **gpu_figures(snap),
        "jobs": len(snap.running_jobs()),
        "degraded": snap.degraded,
        "problems": problems,
        "findings": [finding_summary(f) for f in findings],
        "decisions": [decision_summary(d) for d in p.decisions],
        "waiting": p.waiting,
        #: findings a snooze held back this sweep (their ``none`` decision is recorded once per snooze)
        "snoozed": [{"rule": d.rule, "target": d.target, "reason": d.reason} for d in p.snooze_records],
        "cap_violation": p.cap_violation,
    }


def gpu_figures(snap: Snapshot) -> dict[str, int]:
    """Return a run's GPU figures: ``gpus``, the cluster's GPU series, and ``outside_gpus`` when the same
    Prometheus scrapes hosts outside the scheduler (read, judged by nothing, counted apart)."""
    outside = snap.outside_count()
    return {"gpus": len(snap.gpus) - outside, **({"outside_gpus": outside} if outside else {})}


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


def reverify(decisions: Sequence[Decision], policy: Policy, decided_at: float, at: float,
             source: str | None = None, **kwargs: Any) -> tuple[list[Decision], dict[str, str]]:
    """Re-check decisions that waited for a human against the cluster as it is at ``at``.

    An approval can come an hour after the data it was asked on; the job idle then may be
    training again now. Each decision still goes ahead only if its rule still finds its target in
    a fresh snapshot at ``at``. Returns ``(still_valid, expired)`` with ``expired`` mapping
    decision id to why. When ``at`` is not past ``decided_at`` (no newer data) nothing is re-read;
    when the fresh look fails or its data is stale, every decision expires: nothing is done on
    data that could not be re-checked.
    """
    decisions = list(decisions)
    if not decisions or at <= decided_at:
        return decisions, {}
    from gpu_cost.core.timeutil import iso

    try:
        fresh, why = check_fresh(policy, at, source)
        snap = collect(policy, at, source, **kwargs) if fresh else None
    except GpuCostError as exc:
        fresh, why, snap = False, str(exc), None
    if snap is None:
        reason = f"not re-checked at {iso(at)} ({why}): nothing done on unverified data"
        return [], {d.decision_id: reason for d in decisions}
    found = {(f.rule, f.target) for f in detect(snap, policy)}
    still = [d for d in decisions if (d.rule, d.target) in found]
    expired = {d.decision_id: f"{d.rule} no longer finds {d.target} at {iso(at)}: it changed while awaiting approval"
               for d in decisions if (d.rule, d.target) not in found}
    return still, expired


def check_fresh(policy: Policy, now: float, source: str | None = None) -> tuple[bool, str]:
    """Return (fresh, why): whether the source answers and its newest samples are recent enough.

    The sweep's sensor calls this; a stale or silent source fails the run cleanly, before any
    decision. The simulator is always fresh.
    """
    src = source or policy.sweep.source
    if src == "sim":
        return True, "simulator"
    if src == "prometheus":
        from gpu_cost.perceive import live

        return live.check_fresh(policy, now)  # type: ignore[no-any-return]
    return True, f"source {src} has no freshness check"
