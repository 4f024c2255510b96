"""Task bodies of ``gpu_offhours_power``: plan → (approval) → act → record; small JSON values for XCom.

The plan step writes the run's decisions and its snapshot to the audit store; XCom carries the
run id and a summary (counts, what held the run, why nodes stayed up). The act steps read the
decisions back from the store by the run id and act only on the ones the store allows (live,
not yet done, approved where approval is required): nothing in XCom can add a node to power down.

Also the functions ``gpu-cost power plan`` calls (:func:`snapshot_for`, :func:`make_plan`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: the power DAG imports this module at parse time
    from gpu_cost.config.schema import Policy
    from gpu_cost.core.model import Decision, Snapshot

logger = logging.getLogger(__name__)

RULE = "offhours"
#: the rules of this DAG's decisions: power, and the reservations for forecast peaks
RULES = (RULE, "forecast_peak")
DAG_ID = "gpu_offhours_power"


def snapshot_for(policy: Policy, now: float, source: str) -> Snapshot:
    """Return the snapshot the power plan reads: the simulator's, or Slurm's nodes and jobs.

    ``slurm``: nodes and jobs from Slurm only (no GPU metrics). ``prometheus``: the live snapshot
    (GPU metrics), with nodes and jobs from Slurm.
    """
    import dataclasses

    from gpu_cost.loop import sweep

    if source == "sim":
        return sweep.collect(policy, now, "sim")
    from gpu_cost.core.model import Snapshot, empty_gpu_frame
    from gpu_cost.perceive.slurm import read_reservations
    from gpu_cost.perceive.slurmrestd import default_source

    src = default_source()
    nodes, jobs = tuple(src.nodes()), tuple(src.jobs())
    resv = tuple(read_reservations(src)) if policy.reservations.enabled else ()
    if source == "slurm":
        return Snapshot(ts=now, window_s=policy.offhours.window, lookback_s=policy.sweep.lookback, source="slurm",
                        gpus=empty_gpu_frame(), jobs=jobs, nodes=nodes, reservations=resv)
    try:
        snap = sweep.collect(policy, now, source)
    except Exception as exc:
        logger.warning("%s source unavailable (%s): planning from Slurm alone, nothing powered down", source, exc)
        return Snapshot(ts=now, window_s=policy.offhours.window, lookback_s=policy.sweep.lookback, source=source,
                        gpus=empty_gpu_frame(), jobs=jobs, nodes=nodes, problems=(f"{source}: {exc}"[:200],),
                        reservations=resv)
    return dataclasses.replace(snap, nodes=nodes, jobs=jobs, reservations=resv or snap.reservations)



def forecast_demand(store: Any, now: float, horizon_s: float, quantile: float | None = None) -> float | None:
    """Return the peak of the forecast's upper bound within ``horizon_s``; None when no forecast exists.

    Capacity is kept for the band, not the median: the median is short half the time. With
    ``quantile`` (``offhours.forecast_quantile``) the bound is the forecast plus that quantile of
    its own errors at the same hour of the day over the last week (its 80 % band until then).
    """
    try:
        from gpu_cost.capacity.forecast.demand import expected_demand
    except ImportError:
        return None
    try:
        return expected_demand(store, now, horizon_s, bound="upper", quantile=quantile)
    except Exception as exc:
        logger.warning("demand forecast unavailable: %s", exc)
        return None


def effective_mode(policy: Policy, dry_run: bool) -> str:
    from gpu_cost.config.schema import milder

    mode = milder(policy.mode, policy.offhours.mode) if policy.offhours.mode else policy.mode
    return "dry-run" if dry_run or mode != "enforce" else "enforce"


def make_plan(policy: Policy, now: float, source: str, store: Any | None = None) -> tuple[Any, Snapshot]:
    from gpu_cost.capacity.offhours import lull_horizon, plan_power, wake_horizon

    snap = snapshot_for(policy, now, source)
    cfg = policy.offhours
    forecast = forecast_demand(store, now, wake_horizon(cfg), cfg.forecast_quantile) if store is not None else None
    lull = (forecast_demand(store, now, lull_horizon(cfg), cfg.forecast_quantile)
            if store is not None and cfg.forecast_lulls else None)
    failed = recent_failures(store, now, cfg.failed_hold) if store is not None else {}
    return plan_power(snap, policy, now, forecast_gpus=forecast, lull_gpus=lull, failed=failed), snap


def recent_failures(store: Any, now: float, hold_s: float) -> dict[str, str]:
    """Return the nodes earlier runs saw fail to come back from power saving within ``hold_s`` before
    ``now`` (their ``none`` decisions with ``resume_failure`` evidence), with why."""
    from gpu_cost.core.timeutil import iso

    out: dict[str, str] = {}
    if hold_s <= 0:
        return out
    try:
        rows = store.fetch("decisions_between", {"since": now - hold_s, "until": now})
    except Exception as exc:
        logger.warning("earlier power-saving failures unavailable: %s", exc)
        return out
    for r in rows:
        if r.get("rule") != RULE or r.get("action") != "none":
            continue
        ev = r.get("evidence")
        try:
            ev = json.loads(ev) if isinstance(ev, str) else dict(ev or {})
        except (TypeError, ValueError):
            continue
        why = ev.get("resume_failure")
        if why and r.get("host"):
            out[str(r["host"])] = f"{why}, seen {iso(float(r['ts']))}"
    return out


def reservation_decisions(snap: Snapshot, policy: Policy, now: float, mode: str,
                          store: Any | None) -> tuple[list[Decision], list[str]]:
    """Return the ``reserve`` decisions for the forecast peaks (``reservations:``) and notes on the others."""
    from gpu_cost.capacity.reservations import decisions_for, plan_reservations

    if not policy.reservations.enabled:
        return [], []
    if store is None:
        return [], ["reservations: no forecast store"]
    try:
        from gpu_cost.capacity.forecast.demand import demand_rows
    except ImportError:
        return [], ["reservations: forecasts are not available in this build"]
    demand = demand_rows(store, now, policy.reservations.horizon + 3600.0)
    proposals, notes = plan_reservations(snap, policy, now, demand)
    return decisions_for(proposals, policy, now, mode, degraded=snap.degraded, problems=snap.problems), notes


def decisions_of(plan: Any, policy: Policy, now: float, mode: str, *, degraded: bool = False,
                 problems: Sequence[str] = ()) -> list[Decision]:
    """Return one decision per node of the plan, each through the engine's guards (ids deterministic
    per node and hour): ``power_down`` / ``power_up`` for the nodes it moves, and a ``none``
    (recorded only) for each node that did not come back from power saving, which later runs
    read back to leave it alone (:func:`recent_failures`)."""
    from gpu_cost.core.model import Decision, Finding, decision_id
    from gpu_cost.decide.engine import Ask, guard

    episode = int(now // 3600)
    big = (f"{len(plan.down)} nodes, over offhours.approval_over_nodes {policy.offhours.approval_over_nodes}",)
    items = [("power_down", c.node, c) for c in plan.down] + [("power_up", c.node, c) for c in plan.up]
    items += [("none", name, None) for name in sorted(plan.failed)]
    out = []
    for action, node, c in items:
        target = f"node:{node}"
        evidence: dict[str, Any] = {"cluster_util": plan.cluster_util, "local_time": plan.local_time}
        if c is not None:
            evidence.update({"power_w": c.power_w, "power_basis": c.power_basis, "partitions": list(c.partitions)})
        else:
            evidence["resume_failure"] = plan.failed[node]
        f = Finding(rule=RULE, target_kind="node", target=target, action=action, gpus=c.gpus if c else 0,
                    host=node, nodes=(node,), partition=(c.partitions[0] if c is not None and c.partitions else None),
                    evidence=evidence)
        # a human approves a power-down when the plan is larger than the policy lets it act alone, or a
        # protection of level approval covers the node or a job on it (a manual request lets it through)
        approve = (big if action == "power_down" and plan.needs_approval else ()) + (
            (f"protection {c.protection}",) if c is not None and c.protection is not None else ())
        v = guard(f, action, policy, now=now, ask=Ask(entry="power", mode=mode, approve=approve), degraded=degraded,
                  problems=problems)
        reason = c.reason if c is not None else f"did not come back from power saving: {plan.failed[node]}"
        out.append(Decision(
            decision_id=decision_id(RULE, f"{target}:{action if c is not None else 'failed'}", episode, 0, v.track),
            ts=now, rule=RULE, target_kind="node", target=target, action=v.action, mode=v.mode, host=node,
            gpus=f.gpus, reason="; ".join([reason, *v.reasons]),
            protection=(c.protection if c is not None else None) or v.protection, requires_approval=v.requires_approval,
            evidence={**evidence, **v.evidence, "track": v.track},
        ))
    return out


# -- tasks --------------------------------------------------------------------------------------
def plan_task(params: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Take the snapshot, plan, record the decisions and the snapshot; return the run id and a summary."""
    from gpu_cost.airflow import runtime

    run_id = runtime.audit_run_id(context)
    store = runtime.store()
    policy = runtime.pin_policy(store, run_id, params)  # every later task, and the approval, read this one
    source = runtime.source_from(policy, params)
    if source == "trace":
        source = "sim"
    now = float(runtime.data_instant(context, policy))
    dry_run = bool(params.get("dry_run", True))
    mode = effective_mode(policy, dry_run)
    store.begin_run(run_id, dag_id=DAG_ID, started_at=time.time(), data_ts=now, source=source, mode=mode)
    plan, snap = make_plan(policy, now, source, store)
    resv, resv_notes = reservation_decisions(snap, policy, now, mode, store)
    decisions = decisions_of(plan, policy, now, mode, degraded=snap.degraded, problems=snap.problems) + resv
    store.record_decisions(decisions, run_id, status="decided" if mode != "dry-run" else "recorded")
    store.save_snapshot(run_id, now, snap.to_json())  # the record step's nodes and power come from here
    full = plan.to_dict()
    summary = {"run_id": run_id, "policy": policy.source, "source": source, "mode": mode, "now": now,
               "in_window": plan.in_window, "local_time": plan.local_time, "held": list(plan.held),
               "needs_approval": any(d.requires_approval for d in decisions),
               "idle_kw": full["idle_kw"], "skipped": dict(plan.skipped), "reservation_notes": resv_notes,
               "problems": plan.problems,
               "counts": {"down": len(plan.down), "up": len(plan.up), "reserve": len(plan.reserve),
                          "reservations": len(resv), "capped": plan.capped, "decisions": len(decisions),
                          "failed_to_resume": len(plan.failed)}}
    for line in plan.problems:
        logger.warning("power run %s: %s", run_id, line)
    logger.info("power plan at %s (%s, in window: %s): down %s, up %s, held %s, kept up %s; reservations %s %s",
                plan.local_time, mode, plan.in_window, [c.node for c in plan.down], [c.node for c in plan.up], plan.held,
                plan.skipped, [d.target for d in resv], resv_notes)
    return summary


def _power(snap: Snapshot, node: Any, policy: Policy) -> tuple[float, str]:
    from gpu_cost.capacity.offhours import node_power

    return node_power(snap, node, policy.offhours)


def needs_approval(plan: Mapping[str, Any]) -> bool:
    counts = plan.get("counts", {})
    return (bool(plan.get("needs_approval")) and plan.get("mode") != "dry-run"
            and bool(counts.get("down") or counts.get("reservations")))


def act_task(plan: Mapping[str, Any], action: str, context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Carry out this run's ``action`` decisions through the one act step (audit rows around each).

    The run is the task's own (``context``) or, without a context, the one XCom names; the
    decisions, their mode and their approvals come from the store, never from XCom
    (:func:`gpu_cost.act.step.act_run`). Approved power-downs are planned again at the answer's
    time: a node that is no longer idle (or no longer in the plan) is not powered down. A cap
    exceeded fails the task, nothing acted.
    """
    from airflow.sdk.exceptions import AirflowFailException

    from gpu_cost.act.step import act_run
    from gpu_cost.airflow import runtime
    from gpu_cost.airflow.sweep_tasks import action_context
    from gpu_cost.core.errors import AuditError, GpuCostError

    run_id = runtime.audit_run_id(context) if context is not None else str(plan["run_id"])
    if plan.get("run_id") not in (None, run_id):
        logger.warning("XCom names run %s, this task belongs to %s: acting on %s", plan.get("run_id"), run_id, run_id)
    store = runtime.store()
    run = store.get_run(run_id)
    if run is None:
        raise AuditError(f"no audit row for run {run_id}: nothing planned, nothing to act on")
    if run["mode"] == "dry-run":
        logger.info("%s: run %s is a dry run, nothing acts", action, run_id)
        return {"action": action, "acted": 0, "results": [], "dry_run": True}
    policy = runtime.run_policy(store, run_id)

    def ctx(now: float, total: int, row: Mapping[str, Any]) -> Any:
        return action_context(policy, now, run_id, store=store, source=row.get("source"), cluster_gpus=total)

    def again(decisions: list[Any], row: Mapping[str, Any], now: float) -> tuple[list[Any], dict[str, str]]:
        return replan_approved(decisions, policy, store, row, now)

    try:
        out = act_run(store, run_id, policy, "all", context=ctx, reverify=again, one_run_at_a_time=True,
                      select=lambda r: r["rule"] in RULES and r["action"] == action)
    except GpuCostError as exc:  # a cap, another run acting, no data instant: nothing acted
        raise AirflowFailException(f"{action}: {exc}") from exc
    logger.info("%s on %s: %s", action, [d.target for d in out.chosen], out.by_status())
    return {"action": action, "acted": out.by_status().get("succeeded", 0), "results": out.results,
            "dry_run": False, "expired": out.expired}


def replan_approved(decisions: Sequence[Any], policy: Policy, store: Any, run: Mapping[str, Any],
                    now: float) -> tuple[list[Any], dict[str, str]]:
    """Return the approved decisions that still hold when the answer came, and why the others expired.

    A power-down is planned again at the run's data instant plus the time the answer took (floored
    to the sample interval): its node must still be one the plan powers down (idle, no job started
    on it meanwhile, not held). Power-ups and reservations stand as approved. The others are marked
    ``expired`` and not carried out.
    """
    started = float(run.get("started_at") or time.time())
    step = policy.sweep.sample_interval
    at = float((now + max(0.0, time.time() - started)) // step * step)
    downs = [d for d in decisions if d.action == "power_down"]
    if not downs:
        return list(decisions), {}
    try:
        plan, _ = make_plan(policy, at, str(run.get("source") or policy.sweep.source), store)
        still = {c.node for c in plan.down}
        why = "no longer in the power plan at the answer's time (busy, held or kept up)"
    except Exception as exc:  # no data at the answer's time: nothing destructive
        logger.warning("power: re-planning at the answer's time failed: %s", exc)
        still, why = set(), f"could not plan again at the answer's time: {exc}"
    expired = {d.decision_id: f"{d.target}: {why}" for d in downs if (d.host or d.target.split(":", 1)[-1]) not in still}
    for did, reason in expired.items():
        store.set_decision_status(did, "expired")
        logger.warning("approved power decision %s not carried out: %s", did, reason)
    return [d for d in decisions if d.decision_id not in expired], expired


def record_task(plan: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Write the hour's power savings and finish the run's audit row; return the run summary."""
    from gpu_cost.airflow import runtime
    from gpu_cost.capacity.offhours import savings_rows
    from gpu_cost.core.model import Snapshot

    run_id = runtime.audit_run_id(context) if context.get("dag_run") is not None else str(plan["run_id"])
    store = runtime.store()
    policy = runtime.run_policy(store, run_id)
    run = store.get_run(run_id) or {}
    mode = run.get("mode") or plan.get("mode")
    now = float(run.get("data_ts") or plan["now"])
    rows: list[dict[str, Any]] = []
    if mode != "dry-run":
        snap = Snapshot.from_json(store.load_snapshot(run_id))
        power = {n.name: _power(snap, n, policy) for n in snap.nodes}
        rows = [{**r, "run_id": run_id, "data_ts": now}
                for r in savings_rows(snap.nodes, power, policy.offhours, policy.cost.kwh_usd, now - 3600.0)]
    saved = store.execute("insert_saving", rows) if rows else 0
    ti = context.get("ti")
    answer = ti.xcom_pull(task_ids="approve", key="decision") if ti is not None else None
    rows_now = store.decisions_of_run(run_id)
    acted = [r for r in rows_now if r["status"] == "acted"]
    planned = plan.get("counts") or {}
    counts = {"down": planned.get("down", 0), "up": planned.get("up", 0), "acted": len(acted),
              "savings_rows": saved, "kwh": round(sum(r["kwh"] for r in rows), 3),
              "approval": (answer or {}).get("status"), "in_window": plan.get("in_window"),
              "held": plan.get("held", []), "idle_kw": plan.get("idle_kw"), "reserve": planned.get("reserve", 0),
              "skipped": plan.get("skipped", {}), "failed_to_resume": planned.get("failed_to_resume", 0),
              "problems": plan.get("problems", [])}
    store.finish_run(run_id, status="ok", finished_at=time.time(), problems=plan.get("problems") or [], counts=counts)
    runtime.release_parked(store, policy, now)
    logger.info("power run %s: %s", run_id, json.dumps(counts, default=str))
    return {"run_id": run_id, "mode": mode, **counts}


def summary_text(counts: Mapping[str, Any], mode: str | None, nodes: list[str] | None = None) -> str:
    """One line for the demo / CLI: what the power run did or would do (``nodes``: the ones it powers down)."""
    failed = counts.get("failed_to_resume") or 0
    lost = f"; {failed} node(s) did not come back from power saving" if failed else ""
    if not counts.get("in_window"):
        held = "; ".join(counts.get("held") or []) or "outside the window"
        return f"{mode}: {held}; {counts.get('up', 0)} node(s) to power up{lost}"
    verb = "would power down" if mode == "dry-run" else "powered down"
    extra = f"; held: {'; '.join(counts['held'])}" if counts.get("held") else ""
    named = f"{', '.join(nodes)}; " if nodes else ""
    return (f"{mode}: {verb} {counts.get('down', 0)} node(s) ({named}{counts.get('idle_kw') or 0:g} kW idle), "
            f"{counts.get('up', 0)} to power up{extra}{lost}")


def demo_result(store: Any, home: Any, result: dict[str, Any]) -> None:
    """DEMO_RESULTS hook: add ``power`` (what the power DAG decided) to the demo's result."""
    runs = store.query("SELECT * FROM gpu_cost_runs WHERE dag_id = :d ORDER BY started_at DESC", {"d": DAG_ID})
    if not runs:
        result["power"] = "gpu_offhours_power recorded no run"
        return
    counts = runs[0].get("counts")
    counts = json.loads(counts) if isinstance(counts, str) and counts else (counts or {})
    down = sorted(str(d["host"]) for d in store.decisions_of_run(runs[0]["run_id"])
                  if d["action"] == "power_down" and d.get("host"))
    result["power"] = summary_text(counts, runs[0].get("mode"), down)


def simulate_week(policy: Policy, *, nodes: int = 16, days: float = 7.0, seed: int = 0, jobs_per_node: float = 2.0,
                  end: float = 1795996800.0, diurnal: bool = True) -> dict[str, Any]:
    """Replay the hourly power run over a simulated trace; return node-hours and kWh saved.

    The trace is ``generate_scenario(nodes=, days=)`` ending at ``end`` (default: Monday
    2026-11-30 00:00 UTC, so the week runs Monday to Sunday). Each hour the plan sees the simulator
    with the nodes it powered down shown as ``idle~``; a node the trace later needs for a job counts
    as woken by Slurm at that hour. Saved node-hours count whole hours a node stayed down.
    """
    import dataclasses

    from gpu_cost.capacity.offhours import plan_power
    from gpu_cost.perceive.snapshot import from_matrix
    from gpu_cost.sim.cluster import SimCluster, generate_scenario

    # a working-hours cluster: busy weekdays, quiet nights and weekends (what off-hours power is for)
    sc = generate_scenario(nodes=nodes, days=days, seed=seed, jobs_per_node=jobs_per_node, diurnal=diurnal, anchor=end)
    cluster = SimCluster(sc, anchor=end)
    cfg = policy.offhours
    down: dict[str, float] = {}  # node -> idle watts when powered down
    node_hours = kwh = 0.0
    wakes = downs = 0
    t = end - days * 86400.0
    while t < end:
        m = cluster.matrix(t - max(cfg.window, policy.rules.idle_allocation.window), t)
        sim_nodes = cluster.nodes_at(t)
        shown = []
        for n in sim_nodes:
            if n.name in down and n.gpus_alloc:  # a job needs it: Slurm resumed it
                down.pop(n.name)
                wakes += 1
            if n.name in down:
                shown.append(dataclasses.replace(n, state="idle~", reason=cfg.reason))
            else:
                shown.append(n)
        snap = from_matrix(policy=policy, now=t, source="sim", hosts=m.hosts, gpus=m.gpus, uuids=m.uuids,
                           models=m.models, mem_total=m.mem_total, times=m.times, util=m.util, mem=m.mem,
                           power=m.power, job=m.job, jobs=cluster.jobs_at(t), processes=cluster.processes_at(t),
                           nodes=shown)
        plan = plan_power(snap, policy, t)
        for c in plan.up:
            down.pop(c.node, None)
        for c in plan.down:
            down[c.node] = c.power_w
            downs += 1
        # the hour counts for nodes still idle at its end (a job starting within it woke the node)
        later = {n.name: n for n in cluster.nodes_at(t + 3599.0)}
        for name, watts in down.items():
            if not later[name].gpus_alloc:
                node_hours += 1.0
                kwh += watts / 1000.0
        t += 3600.0
    return {"nodes": nodes, "gpus_per_node": 8, "days": days, "seed": seed, "jobs_per_node": jobs_per_node,
            "diurnal": diurnal,
            "node_hours": node_hours,
            "node_hours_share": round(node_hours / (nodes * days * 24.0), 4), "kwh": round(kwh, 2),
            "usd": round(kwh * policy.cost.kwh_usd, 2), "power_downs": downs, "wakes_by_demand": wakes,
            "currency": policy.cost.currency}
