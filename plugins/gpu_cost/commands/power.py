"""``gpu-cost power plan``: what the off-hours power run would do now (nothing is powered)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from gpu_cost.cli import add_json, add_policy, instant_arg
from gpu_cost.timeutil import iso


def register(sub: Any) -> None:
    p = sub.add_parser("power", help="off-hours node power management")
    psub = p.add_subparsers(dest="power_command", required=True, metavar="SUBCOMMAND")
    plan = psub.add_parser("plan", help="show which nodes the off-hours run would power down / up now")
    plan.add_argument("--source", choices=["sim", "slurm", "prometheus"], default=None,
                      help="sim (default with the shipped policy), slurm (nodes and jobs), prometheus (with GPU metrics)")
    add_policy(plan)
    plan.add_argument("--at", help="instant to plan for (ISO 8601 or epoch; default: now)")
    add_json(plan)
    plan.set_defaults(handler=_plan)
    week = psub.add_parser("week", help="what the default policy would save over a simulated week")
    add_policy(week)
    week.add_argument("--nodes", type=int, default=16, help="simulated nodes (8 GPUs each)")
    week.add_argument("--days", type=float, default=7.0)
    week.add_argument("--seed", type=int, default=0)
    week.add_argument("--jobs-per-node", type=float, default=2.0, help="job arrival rate of the trace (per node-hour)")
    add_json(week)
    week.set_defaults(handler=_week)


def _week(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.airflow.power_tasks import simulate_week
    from gpu_cost.policy import load_policy

    policy = load_policy(args.policy)
    out = simulate_week(policy, nodes=args.nodes, days=args.days, seed=args.seed, jobs_per_node=args.jobs_per_node)
    text = (f"simulated {args.days:g} days, {args.nodes} nodes: {out['node_hours']:.0f} node-hours powered down "
            f"({out['node_hours_share']:.1%} of all node-hours), {out['kwh']:.1f} kWh, {out['usd']:.2f} {out['currency']}; "
            f"{out['power_downs']} power-downs, {out['wakes_by_demand']} wakes by demand")
    return out, text


def _plan(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.airflow.power_tasks import make_plan
    from gpu_cost.policy import load_policy

    policy = load_policy(args.policy)
    now = instant_arg(args.at, "--at") if args.at else time.time()
    now = float(now // policy.sweep.sample_interval * policy.sweep.sample_interval)
    source = args.source or ("sim" if policy.sweep.source in ("sim", "trace") else policy.sweep.source)
    store = None
    try:
        from gpu_cost.audit.store import AuditStore

        store = AuditStore().ensure_schema()
    except Exception:
        store = None
    plan, snap = make_plan(policy, now, source, store)
    out = plan.to_dict()
    out.update({"source": source, "at": iso(now), "policy": policy.source, "nodes": len(snap.nodes)})
    lines = [f"off-hours plan at {plan.local_time} ({policy.offhours.timezone}) on {source}: "
             f"{'inside' if plan.in_window else 'outside'} the window, cluster GPU util "
             f"{'n/a' if plan.cluster_util is None else f'{plan.cluster_util:.1f}%'}"]
    for c in plan.down:
        lines.append(f"  power down {c.node:<12} {c.power_w:7.0f} W ({c.power_basis})")
    for c in plan.up:
        lines.append(f"  power up   {c.node:<12} {c.reason}")
    if plan.reserve:
        lines.append(f"  kept as warm reserve: {', '.join(plan.reserve)}")
    for h in plan.held:
        lines.append(f"  held: {h}")
    if plan.needs_approval:
        lines.append("  needs approval (more nodes than offhours.approval_over_nodes)")
    return out, "\n".join(lines)
