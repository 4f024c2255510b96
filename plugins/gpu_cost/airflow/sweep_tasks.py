"""Task bodies of ``gpu_zombie_sweep``: each returns a small JSON-able value for XCom.

The executors' context (:func:`action_context`) is shared with the manual reclaim and the power
DAGs; all three act through the one act step, :func:`gpu_cost.act.step.act_run`.

What the run found and decided travels through the audit store, never XCom: each group's
findings and the engine's plan are parked beside the run's snapshot (``gpu_cost_snapshots``,
keys :func:`findings_key` and :func:`plan_key`), and each task reads its run id from its own
context and the data instant from the run's row. XCom carries counts and decision ids, which the
next task compares with the store: a difference is someone editing XCom (Airflow's REST API
allows it to anyone with XCom write access), recorded as an alert row in the run
(:func:`gpu_cost.airflow.runtime.record_tampering`) and never acted on.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpu_cost.airflow import runtime
from gpu_cost.core.errors import AuditError, GpuCostError

if TYPE_CHECKING:  # the model, the engine, the policy, the sweep (numpy) and the store are imported where
    # used: DAG files import this module at parse time
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.config.schema import Policy
    from gpu_cost.core.model import Decision, Finding
    from gpu_cost.decide.engine import Plan

logger = logging.getLogger(__name__)

SWEEP_DAG_ID = "gpu_zombie_sweep"
#: task ids the ``route`` branch may choose
ACT_TASK, APPROVE_TASK = "act", "approve"
#: SSH connection of the GPU nodes (node-side actions)
NODE_SSH_CONN = "gpu_cost_node_ssh"


def check_policy(params: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Load, validate and pin the run's policy before anything is collected (a bad file fails the run here)."""
    from airflow.sdk.exceptions import AirflowFailException

    from gpu_cost.core.errors import PolicyError

    try:
        policy = runtime.pin_policy(runtime.store(), runtime.audit_run_id(context), params)
    except PolicyError as exc:
        # a bad file does not fix itself in a retry delay: fail now, before anything is collected
        raise AirflowFailException(str(exc)) from exc
    source = runtime.source_from(policy, params)
    logger.info("policy %s: mode=%s source=%s", policy.source, policy.mode, source)
    return {"policy": policy.source, "mode": policy.mode, "source": source}


def metrics_fresh(cfg: Mapping[str, Any], context: Mapping[str, Any]) -> tuple[bool, str]:
    """Return (fresh, why) for the run's data instant: the sensor's poke."""
    from gpu_cost.loop import sweep

    policy = runtime.run_policy(runtime.store(), runtime.audit_run_id(context))
    now = runtime.data_instant(context, policy)
    fresh, why = sweep.check_fresh(policy, now, _source(policy, context))
    (logger.info if fresh else logger.warning)("metrics %s at %s: %s", "fresh" if fresh else "stale", now, why)
    return fresh, why


def shards(cfg: Mapping[str, Any], context: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Open the run's audit row and return its node groups, one mapped ``collect``/``detect`` each.

    As many as the run's pinned policy says (``sweep.shards``; 1: the whole cluster in one task).
    """
    run_id = runtime.audit_run_id(context)
    store = runtime.store()
    policy = runtime.run_policy(store, run_id)
    now = runtime.data_instant(context, policy)
    store.begin_run(run_id, dag_id=run_id.split(":", 1)[0], started_at=time.time(), data_ts=now,
                    source=_source(policy, context), mode=policy.mode)
    of = policy.sweep.shards
    return [{"shard": i, "of": of} for i in range(of)]


def collect(cfg: Mapping[str, Any], part: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Take node group ``part``'s snapshot for the run's data instant and park it in the audit store.

    The group records the class baselines of the jobs it judges; unsharded it also records the
    run's usage (sharded, :func:`merge` does, once, on the whole snapshot).
    """
    from gpu_cost.analyse import baselines
    from gpu_cost.capacity import reservations
    from gpu_cost.loop import sweep
    from gpu_cost.perceive import shards

    run_id = runtime.audit_run_id(context)
    store = runtime.store()
    policy = runtime.run_policy(store, run_id)
    now = runtime.data_instant(context, policy)
    shard, of = _part(part, policy)
    snap = sweep.collect_shard(policy, now, shard, of, _source(policy, context))
    reservations.mark_own(store, snap, policy)  # the rules tell the agent's reservations from anyone else's
    only = None if of == 1 else shards.of_view(snap, shard, of).owned_jobs
    baselines.observe(store, snap, policy, run_id=run_id, only=only)  # the rules read snapshot.classes
    store.save_snapshot(shards.snapshot_key(run_id, shard, of), now, snap.to_json())
    warnings: list[str] = []
    if of == 1:
        from gpu_cost.report.usage import record_usage

        warnings = sweep.run_warnings(snap, record_usage(store, snap, policy, run_id=run_id, **_cadence(context, now)))
    logger.info("snapshot %d/%d at %s: %d GPUs, %d running jobs, %d processes, problems=%s", shard + 1, of, now,
                len(snap.gpus), len(snap.running_jobs()), len(snap.processes), list(snap.problems))
    return {"run_id": run_id, "now": now, "policy": cfg["policy"], "source": snap.source, "shard": shard, "of": of,
            **sweep.gpu_figures(snap), "jobs": len(snap.running_jobs()), "degraded": snap.degraded,
            "problems": [*snap.problems, *warnings]}


def merge(cfg: Mapping[str, Any], parts: Sequence[Mapping[str, Any]], context: Mapping[str, Any]) -> dict[str, Any]:
    """Put the node groups' snapshots together into the run's snapshot; return the run's reference.

    Unsharded the group's snapshot is the run's already. ``log_jobs`` names the jobs whose logs the
    run keeps (the cluster's first candidates), for the groups' ``detect``.
    """
    parts = sorted((dict(p) for p in runtime.mapped_values(parts)), key=lambda p: int(p["shard"]))
    if not parts:
        raise GpuCostError("no shard of the sweep reported a snapshot")
    if len(parts) == 1:
        one = parts[0]
        return {**{k: one[k] for k in ("run_id", "now", "policy", "source", "gpus", "outside_gpus", "jobs", "degraded",
                                        "problems") if k in one}, "shards": 1, "log_jobs": None}
    from gpu_cost.analyse import replicas
    from gpu_cost.core.model import Snapshot
    from gpu_cost.loop import sweep
    from gpu_cost.perceive import shards
    from gpu_cost.report.usage import record_usage

    run_id, store, policy, now = _run(context)
    of = policy.sweep.shards
    views = [Snapshot.from_json(store.load_snapshot(shards.snapshot_key(run_id, i, of))) for i in range(of)]
    snap = sweep.merge_shards(views, policy, store)
    store.save_snapshot(run_id, now, snap.to_json())
    # replica sets span node groups: the groups' detect judge their jobs by the cluster's sets
    store.save_snapshot(replicas_key(run_id), now, _dumps(replicas.to_json(replicas.replica_sets(snap, policy))))
    warnings = sweep.run_warnings(snap, record_usage(store, snap, policy, run_id=run_id, **_cadence(context, now)))
    logger.info("snapshot of %d shards at %s: %d GPUs, %d running jobs, %d processes, problems=%s", of, now,
                len(snap.gpus), len(snap.running_jobs()), len(snap.processes), list(snap.problems))
    return {"run_id": run_id, "now": now, "policy": cfg["policy"], "source": snap.source, **sweep.gpu_figures(snap),
            "jobs": len(snap.running_jobs()), "degraded": snap.degraded, "problems": [*snap.problems, *warnings],
            "shards": of, "log_jobs": sorted(snap.job_logs)}


def _cadence(context: Mapping[str, Any], now: float) -> dict[str, Any]:
    """Return how the run's usage checks its schedule: the DAG's period; measured gaps unless manual only.

    A schedule that disagrees with ``sweep.interval`` is a warning in the run's problems, not a
    degradation (:func:`gpu_cost.report.usage.coverage`).
    """
    period = runtime.schedule_period(context, now)
    return {"schedule_s": period, "measured": period is not None}


def _source(policy: Policy, context: Mapping[str, Any]) -> str:
    """Return the run's data source from its params and pinned policy (never from XCom)."""
    return runtime.source_from(policy, context.get("params") or {})


def _part(part: Mapping[str, Any], policy: Policy) -> tuple[int, int]:
    """Return (shard, of) of a mapped task's node group, checked against the run's pinned policy."""
    from gpu_cost.perceive import shards

    shard, of = int(part["shard"]), int(part["of"])
    shards.check(shard, of)
    if of != policy.sweep.shards:
        raise GpuCostError(f"node group {shard} of {of}: the run's pinned policy has sweep.shards="
                           f"{policy.sweep.shards}; XCom was changed")
    return shard, of


def _run(context: Mapping[str, Any]) -> tuple[str, AuditStore, Policy, float]:
    """Return the run's audit id, the store, the pinned policy and the data instant: from the store, never XCom."""
    run_id = runtime.audit_run_id(context)
    store = runtime.store()
    policy = runtime.run_policy(store, run_id)
    run = store.get_run(run_id) or {}
    if run.get("data_ts") is None:
        raise GpuCostError(f"run {run_id} has no data instant in the audit store (its shards task did not run)")
    return run_id, store, policy, float(run["data_ts"])


def findings_key(run_id: str, shard: int, of: int) -> str:
    """Return the key node group ``shard``'s findings are parked under in ``gpu_cost_snapshots``."""
    return f"{run_id}#findings-{shard}-of-{of}"


def replicas_key(run_id: str) -> str:
    """Return the key a sharded run's replica sets (the whole cluster's) are parked under in ``gpu_cost_snapshots``."""
    return f"{run_id}#replicas"


def plan_key(run_id: str) -> str:
    """Return the key the run's plan (the engine's decisions) is parked under in ``gpu_cost_snapshots``."""
    return f"{run_id}#plan"


def _dumps(value: Any) -> str:
    from gpu_cost.core import jsontext

    # keys sorted: XCom on PostgreSQL (JSONB) gives a dict back with its keys in another order
    return jsontext.dumps(value, sort_keys=True)


def detect(ref: Mapping[str, Any], part: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Run the rules on node group ``part``'s stored snapshot; park the findings it answers for.

    Returns the group and its number of findings (XCom); ``decide`` reads the findings from the store.
    """
    from gpu_cost.core.model import Snapshot
    from gpu_cost.loop import sweep
    from gpu_cost.perceive import shards

    run_id, store, policy, now = _run(context)
    shard, of = _part(part, policy)
    view = Snapshot.from_json(store.load_snapshot(shards.snapshot_key(run_id, shard, of)))
    sets = None
    if of > 1:
        from gpu_cost.analyse import replicas
        from gpu_cost.core import jsontext

        sets = replicas.from_json(jsontext.loads(store.load_snapshot(replicas_key(run_id))))
    findings = sweep.detect_shard(view, policy, shard, of, store, log_jobs=ref.get("log_jobs"), replica_sets=sets)
    for f in findings:
        logger.info("finding %s %s (%s, %d GPU) suggested %s", f.rule, f.target, f.user, f.gpus, f.action)
    store.save_snapshot(findings_key(run_id, shard, of), now, findings_text(findings))
    return {"shard": shard, "of": of, "findings": len(findings)}


def decide(ref: Mapping[str, Any], found: Sequence[Mapping[str, Any]], context: Mapping[str, Any]) -> dict[str, Any]:
    """Turn every node group's stored findings into decisions under the policy and the escalation state (caps once).

    The plan is parked in the audit store (:func:`plan_key`) for ``record``; XCom carries the
    decision ids. ``found`` (the groups' XCom) is only compared with what the groups stored.
    """
    from gpu_cost.core.model import Snapshot
    from gpu_cost.loop import sweep
    from gpu_cost.perceive import shards

    run_id, store, policy, now = _run(context)
    of = policy.sweep.shards
    parked = [findings_of(store.load_snapshot(findings_key(run_id, i, of))) for i in range(of)]
    stored = [{"shard": i, "of": of, "findings": len(part)} for i, part in enumerate(parked)]
    claimed = [dict(f) if isinstance(f, Mapping) else {"entry": f} for f in runtime.mapped_values(found)]
    if sorted(map(_dumps, claimed)) != sorted(map(_dumps, stored)):
        runtime.record_tampering(store, run_id, task="decide", now=now, problems=[
            f"detect's XCom ({_dumps(claimed)[:300]}) differs from what the node groups stored "
            f"({sum(len(part) for part in parked)} finding(s) in {of} group(s)): deciding on the stored findings"])
    snap = Snapshot.from_json(store.load_snapshot(run_id))
    p = sweep.plan(shards.merge_findings(parked), snap, policy, store, now)
    for d in p.decisions:
        logger.info("decision %s %s → %s [%s]%s %s", d.rule, d.target, d.action, d.mode,
                    " (needs approval)" if d.requires_approval and d.acts else "", d.reason)
    if p.cap_violation:
        logger.error("cap exceeded: %s", p.cap_violation)
    store.save_snapshot(plan_key(run_id), now, plan_text(p))
    return plan_ref(p)


def plan_ref(p: Plan) -> dict[str, Any]:
    """Return what XCom carries of a plan: its decision ids (the plan itself is in the audit store)."""
    return {"decision_ids": [d.decision_id for d in p.decisions],
            "snoozed_ids": [d.decision_id for d in p.snooze_records], "capped": bool(p.cap_violation)}


def plan_tampering(claimed: Any, p: Plan) -> list[str]:
    """Return how decide's XCom ``claimed`` differs from the plan the engine stored (empty: it does not).

    A decision XCom names that the engine did not make is refused (never recorded, never acted
    on); one the engine made that XCom leaves out is carried out all the same: the store is the truth.
    """
    expected = plan_ref(p)
    if claimed == expected:
        return []
    if not isinstance(claimed, Mapping):
        return [f"decide's XCom is not the plan's reference (got {type(claimed).__name__}): "
                f"carrying out the {len(p.decisions)} stored decision(s) only"]
    decided = {d.decision_id for d in [*p.decisions, *p.snooze_records]}
    named: dict[str, str] = {}
    for value in claimed.values():
        for item in value if isinstance(value, list) else []:
            if isinstance(item, Mapping):
                did = str(item.get("decision_id") or "?")
                named[did] = f"{item.get('action')} {item.get('target')} ({did})"
            elif isinstance(item, str):
                named.setdefault(item, item)
    out = [f"decision {what} named in decide's XCom was not decided by the engine: refused, not recorded, "
           f"not acted on" for did, what in named.items() if did not in decided]
    missing = sorted(set(expected["decision_ids"]) - set(claimed.get("decision_ids") or []))
    if missing:
        out.append(f"{len(missing)} decision(s) of the engine missing from decide's XCom ({', '.join(missing)}): "
                   "carried out from the store")
    other = sorted(k for k in set(claimed) | set(expected) if k != "decision_ids" and claimed.get(k) != expected.get(k))
    if other and not out:
        out.append(f"decide's XCom differs from the stored plan in {', '.join(map(str, other))}: the stored plan holds")
    elif other:
        out.append(f"decide's XCom also differs in {', '.join(map(str, other))}")
    return out


def record(ref: Mapping[str, Any], plan: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Write the plan the engine stored: decisions and escalation changes. Returns what the branch needs.

    The plan comes from the audit store; decide's XCom ``plan`` (decision ids) is only compared
    with it, and a difference is recorded as tampering (:func:`plan_tampering`).
    """
    from gpu_cost.core.model import Snapshot
    from gpu_cost.loop import sweep

    run_id, store, policy, now = _run(context)
    try:
        p = plan_of(store.load_snapshot(plan_key(run_id)))
    except AuditError as exc:
        raise GpuCostError(f"run {run_id}: decide stored no plan; nothing is recorded from XCom ({exc})") from exc
    tampered = plan_tampering(plan, p)
    if tampered:
        runtime.record_tampering(store, run_id, task="record", problems=tampered, now=now)
    snap = Snapshot.from_json(store.load_snapshot(run_id))
    counts = sweep.record(p, store, run_id, now)
    return {
        "run_id": run_id,
        "status": sweep.run_status(snap, p),
        "mode": policy.mode,
        "decisions": [sweep.decision_summary(d) for d in p.decisions],
        "cap_violation": p.cap_violation,
        "tampering": len(tampered),
        "problems": list(p.problems),
        **counts,
    }


def route(summary: Mapping[str, Any]) -> list[str]:
    """Return the task ids to follow: ``act`` for automatic decisions, ``approve`` for the others.

    Recorded-only decisions (dry-run, protected ``never``, held back by mode or degraded data)
    follow neither. A cap violation goes to ``act`` alone, which records the abort and fails.
    """
    if summary.get("cap_violation"):
        return [ACT_TASK]
    out = []
    if summary.get("automatic"):
        out.append(ACT_TASK)
    if summary.get("needs_approval"):
        out.append(APPROVE_TASK)
    logger.info("route: %s", out or "record only")
    return out


# -- acting ----------------------------------------------------------------------------------
def slurm_runner() -> Any:
    """Return the runner for Slurm commands: ``GPU_COST_SLURM=local`` (this host) or ``ssh``.

    ``ssh`` runs them on a login node over the SSH connection ``gpu_cost_slurm_ssh``. Unset:
    None, and the executors take :func:`gpu_cost.perceive.slurm.default_runner` (SSH when that
    connection is configured, else this host), as the Slurm source does.
    """
    mode = os.environ.get("GPU_COST_SLURM", "").strip().lower()
    if not mode:
        return None
    if mode not in ("local", "ssh"):
        raise GpuCostError(f"GPU_COST_SLURM={mode!r}: use local or ssh")
    from gpu_cost.perceive.slurm import default_runner

    return default_runner(ssh=mode == "ssh")


def node_runner(host: str) -> Any:
    """Return the runner for node-side commands on ``host`` (SSH through the node wrapper)."""
    from gpu_cost.perceive.runner import SSHRunner

    return SSHRunner(NODE_SSH_CONN, host=host)


def action_context(policy: Policy, now: float, run_id: str | None, *, dry_run: bool = False,
                   store: AuditStore | None = None, sleep: Callable[[float], None] | None = None,
                   source: str | None = None, cluster_gpus: int = 0) -> Any:
    """Return the :class:`~gpu_cost.act.base.ActionContext` the executors get (every way in)."""
    from gpu_cost.act.base import ActionContext

    return ActionContext(policy=policy, dry_run=dry_run, now=now, run_id=run_id, slurm=slurm_runner(),
                         node_runner=node_runner, sleep=sleep or time.sleep,
                         extra={"store": store} if store is not None else {}, source=source,
                         cluster_gpus=cluster_gpus)



def stored_decisions(store: AuditStore, run_id: str) -> list[tuple[Decision, dict[str, Any]]]:
    """Return the run's live decisions as the audit store holds them (never XCom), with their rows."""
    from gpu_cost.act.step import live_rows
    from gpu_cost.core.model import Decision

    return [(Decision.from_row(r), r) for r in live_rows(store, run_id)]


def act(ref: Mapping[str, Any], which: str, context: Mapping[str, Any]) -> dict[str, Any]:
    """Carry out the run's ``automatic`` or ``approved`` decisions through the one act step.

    What acts is read from the audit store by the run's id (:func:`gpu_cost.act.step.act_run`): the
    run's decisions, their approval answers and the policy pinned when the run started. XCom only
    names the run. Raises AirflowFailException (no retry) when a cap is exceeded — after marking the
    decisions ``capped`` and the run ``capped`` with the reason — and when another run of the sweep
    is acting on the same data. Approved decisions are judged again on data as recent as the answer.
    """
    from airflow.sdk.exceptions import AirflowFailException

    from gpu_cost.act.step import CapExceeded, RunConflict, act_run

    run_id = runtime.audit_run_id(context)
    store = runtime.store()
    policy = runtime.run_policy(store, run_id)

    def again(decisions: list[Decision], run: Mapping[str, Any], now: float) -> tuple[list[Decision], dict[str, str]]:
        return reverify_approved(decisions, policy, store, {"run_id": run_id, "now": now, "source": run.get("source")})

    def ctx(now: float, total: int, run: Mapping[str, Any]) -> Any:
        return action_context(policy, now, run_id, store=store, source=run.get("source"), cluster_gpus=total)

    try:
        out = act_run(store, run_id, policy, "approved" if which == "approved" else "automatic", context=ctx,
                      reverify=again, one_run_at_a_time=True,
                      same_data_window_s=policy.sweep.interval / 2)
    except CapExceeded as exc:
        n = len(store.decisions_of_run(run_id))
        store.finish_run(run_id, status="capped", finished_at=time.time(), problems=[str(exc)],
                         counts={"decisions": n, "capped": sum(1 for r in store.decisions_of_run(run_id)
                                                               if r["status"] == "capped")})
        raise AirflowFailException(str(exc)) from exc
    except (RunConflict, GpuCostError) as exc:
        raise AirflowFailException(str(exc)) from exc
    return {"which": which, "decisions": len(out.chosen), "by_status": out.by_status(), "expired": out.expired,
            "failed": out.failed()}


def reverify_approved(decisions: Sequence[Decision], policy: Policy, store: AuditStore,
                      ref: Mapping[str, Any]) -> tuple[list[Decision], dict[str, str]]:
    """Re-check approved decisions on data as recent as the time spent waiting for the answer.

    The instant looked at is the run's data instant plus the wall time since the run began
    (floored to the sample interval): the approval's wait, carried over to the data. Later sweeps
    go on while a run waits, so a decision whose escalation episode they closed (the target
    recovered, even if it is wasteful again now, in a new episode that starts its ladder over) no
    longer holds either. Decisions that no longer hold are marked ``expired`` in
    ``gpu_cost_decisions`` and not acted on.
    """
    from gpu_cost.loop import sweep

    decisions, ended = _episode_ended(decisions, store)
    run_id, now = str(ref["run_id"]), float(ref["now"])
    run = store.get_run(run_id) or {}
    try:
        waited = max(0.0, time.time() - float(run.get("started_at") or time.time()))
    except (TypeError, ValueError):
        waited = 0.0
    step = policy.sweep.sample_interval
    at = float((now + waited) // step * step)
    still, expired = sweep.reverify(decisions, policy, now, at, ref.get("source"))
    expired = {**ended, **expired}
    for did, why in expired.items():
        store.set_decision_status(did, "expired")
        logger.warning("approved decision %s not carried out: %s", did, why)
    return still, expired


def _episode_ended(decisions: Sequence[Decision], store: AuditStore) -> tuple[list[Decision], dict[str, str]]:
    """Split off the decisions whose escalation episode is no longer the open one (id → why)."""
    keep: list[Decision] = []
    ended: dict[str, str] = {}
    for d in decisions:
        row = store.escalation(d.rule, d.target, str(d.evidence.get("track") or "live"))
        if row is None or (row.get("state") == "open" and int(row["episode"]) == d.episode):
            keep.append(d)  # no ladder behind it (a manual decision), or its episode still runs
        else:
            ended[d.decision_id] = (f"{d.rule} episode {d.episode} of {d.target} ended while awaiting approval "
                                    f"(now: episode {row['episode']}, {row.get('state')}): the ladder starts over")
    return keep, ended


def finish(context: Mapping[str, Any]) -> dict[str, Any]:
    """Close the run's audit row (``ok`` / ``degraded`` / ``capped`` / ``stale`` / ``failed``).

    Runs whatever happened upstream. Returns the run summary (XCom ``summary`` too); raises
    AirflowFailException when the run did not complete, so a failed sweep shows as failed.
    """
    from airflow.sdk.exceptions import AirflowFailException

    ti = context["ti"]
    run_id = runtime.audit_run_id(context)
    store = runtime.store()
    cfg = ti.xcom_pull(task_ids="check_policy")
    ref = ti.xcom_pull(task_ids="merge")
    summary = ti.xcom_pull(task_ids="record")
    acted = [a for a in (ti.xcom_pull(task_ids=t) for t in (ACT_TASK, "act_approved")) if a]
    decision = ti.xcom_pull(task_ids=APPROVE_TASK, key="decision")
    problems: list[str] = []
    run = store.get_run(run_id)
    if ref is None:
        if cfg is None:
            status, problems = "failed", ["the policy could not be loaded: see the check_policy task log"]
        else:
            status = "stale"
            try:
                fresh, why = metrics_fresh(cfg, context)
                problems = [f"metrics not fresh: {why}"] if not fresh else ["collect failed: see its task log"]
                status = "stale" if not fresh else "failed"
            except GpuCostError as exc:
                problems = [f"freshness check failed: {exc}"]
        if run is None:
            store.execute("insert_run", {"run_id": run_id, "dag_id": run_id.split(":", 1)[0], "started_at": time.time(),
                                         "data_ts": None, "source": (cfg or {}).get("source"),
                                         "mode": (cfg or {}).get("mode")})
    elif run is not None and run["status"] == "capped":
        status = "capped"
        problems = _json_list(run.get("problems"))
    elif summary is None:
        status, problems = "failed", ["detect/decide/record did not complete: see their task logs"]
    else:
        failed = [f for a in acted for f in a.get("failed", [])]
        status = summary["status"]
        problems = [*ref.get("problems", []), *summary.get("problems", [])]
        problems += [f"approved decision {did} expired: {why}" for a in acted for did, why in
                     (a.get("expired") or {}).items()]
        if failed:
            status = "failed"
            problems.append(f"{len(failed)} action(s) failed: see gpu_cost_actions")
    tampered = runtime.tampering_problems(store, run_id)
    if tampered:
        # someone changed XCom: nothing it added was done; the run fails, so Airflow's alerting tells someone
        problems += [t for t in tampered if t not in problems]
        status = "capped" if status == "capped" else "failed"
    from gpu_cost.core.redact import redact_all

    problems = redact_all(problems)  # stored, alerted on, returned to XCom, raised: no credentials
    counts = {k: v for k, v in (summary or {}).items() if isinstance(v, int | float) and not isinstance(v, bool)}
    counts["acted"] = sum(a.get("decisions", 0) for a in acted)
    counts["expired"] = sum(len(a.get("expired") or {}) for a in acted)
    if decision:
        counts["approval"] = decision.get("status")
    if status == "capped":
        import json

        # keep the row act wrote (problems = the cap's reason, and any tampering); only the end time moves
        store.execute("finish_run", {"run_id": run_id, "status": status, "finished_at": time.time(),
                                     "problems": json.dumps(problems),
                                     "counts": run.get("counts") if run else "{}"})
    else:
        store.finish_run(run_id, status=status, finished_at=time.time(), problems=problems, counts=counts)
    if cfg is not None:
        from gpu_cost.loop import health

        now = float((ref or {}).get("now") or time.time())
        try:
            policy = runtime.run_policy(store, run_id)
        except GpuCostError:
            logger.exception("the run's policy could not be read: no agent-health alert, nothing released")
        else:
            try:
                health.degraded_alert(store, policy, run_id=run_id, dag_id=run_id.split(":", 1)[0], status=status,
                                      problems=problems, now=now)
            except GpuCostError:
                logger.exception("the agent-health alert could not be raised")
            runtime.release_parked(store, policy, now)
    out = {"run_id": run_id, "status": status, "problems": problems, "counts": counts,
           "decisions": (summary or {}).get("decisions", []), "approval": decision}
    ti.xcom_push(key="summary", value=out)
    if status in ("failed", "stale", "capped"):
        raise AirflowFailException(f"sweep run {status}: {'; '.join(problems) or 'see the task logs'}")
    return out


def _json_list(raw: Any) -> list[str]:
    import json

    if not raw:
        return []
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return [str(raw)]
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


# -- what the tasks park in the audit store: 45 MB of findings and 60 MB of plan at 100k GPUs, the
# collector paused while their hundreds of thousands of dicts are made (most of the time otherwise);
# imported in each, as everything here that a DAG file's parse does not need
def findings_text(findings: Sequence[Finding]) -> str:
    """Return a node group's findings as ``detect`` parks them (read back by :func:`findings_of`)."""
    from gpu_cost.core.perf import gc_paused

    with gc_paused():
        return _dumps([f.to_dict() for f in findings])


def findings_of(text: str) -> list[Finding]:
    """Return the findings :func:`findings_text` parked."""
    from gpu_cost.core import jsontext
    from gpu_cost.core.model import as_findings
    from gpu_cost.core.perf import gc_paused

    with gc_paused():
        return as_findings(jsontext.loads(text))


def plan_text(p: Plan) -> str:
    """Return the plan as ``decide`` parks it (read back by :func:`plan_of`)."""
    from gpu_cost.core.perf import gc_paused

    with gc_paused():
        return _dumps(plan_to_json(p))


def plan_of(text: str) -> Plan:
    """Return the plan :func:`plan_text` parked."""
    from gpu_cost.core import jsontext
    from gpu_cost.core.perf import gc_paused

    with gc_paused():
        return plan_from_json(jsontext.loads(text))


def plan_to_json(p: Plan) -> dict[str, Any]:
    """Return the plan as JSON-able data (parked in the audit store by ``decide``)."""
    return {
        "decisions": [d.to_dict() for d in p.decisions],
        "openings": [o.__dict__ for o in p.openings],
        "seen": [list(k) for k in p.seen],
        "closing": [list(k) for k in p.closing],
        "waiting": p.waiting,
        "snoozed": p.snoozed,
        "snooze_records": [d.to_dict() for d in p.snooze_records],
        "cap_violation": p.cap_violation,
        "problems": p.problems,
    }


def plan_from_json(d: Mapping[str, Any]) -> Plan:
    """Return the plan :func:`plan_to_json` gave."""
    from gpu_cost.core.model import as_decisions
    from gpu_cost.decide.engine import Opening, Plan

    return Plan(
        decisions=as_decisions(d.get("decisions", [])),
        openings=[Opening(**o) for o in d.get("openings", [])],
        seen=[tuple(k) for k in d.get("seen", [])],  # type: ignore[misc]
        closing=[tuple(k) for k in d.get("closing", [])],  # type: ignore[misc]
        waiting=list(d.get("waiting", [])),
        snoozed=list(d.get("snoozed", [])),
        snooze_records=as_decisions(d.get("snooze_records", [])),
        cap_violation=d.get("cap_violation"),
        problems=list(d.get("problems", [])),
    )


def __getattr__(name: str) -> Any:
    """Return the model's records re-exported here, imported on first use (not when a DAG file is parsed)."""
    if name in ("Decision", "Finding"):
        from gpu_cost.core import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Decision", "Finding", "act", "action_context", "check_policy", "collect", "decide", "detect",
           "finish", "merge", "metrics_fresh", "record", "route", "shards"]
