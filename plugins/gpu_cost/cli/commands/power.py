"""``gpu-cost power plan``: what the off-hours power run would do now (nothing is powered)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from gpu_cost.cli.options import add_db, add_json, add_policy, instant_arg, open_store
from gpu_cost.core.timeutil import iso


def register(sub: Any) -> None:
    p = sub.add_parser("power", help="off-hours node power management")
    psub = p.add_subparsers(dest="power_command", required=True, metavar="SUBCOMMAND")
    plan = psub.add_parser("plan", help="show which nodes the off-hours run would power down / up now, and the "
                           "reservations it would propose for forecast peaks (reservations.enabled)",
                           description="What the off-hours power run would do now, from the audit store's demand "
                                       "forecasts; nothing is powered and nothing is recorded.")
    plan.add_argument("--source", choices=["sim", "slurm", "prometheus"], default=None,
                      help="sim (default with the shipped policy), slurm (nodes and jobs), prometheus (with GPU metrics)")
    add_policy(plan)
    plan.add_argument("--at", help="instant to plan for (ISO 8601 or epoch; default: now)")
    add_db(plan)
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
    rep = psub.add_parser("replay", help="Slurm's reactive power saving, the off-hours policy and the same with "
                          "forecasts, played side by side against an hourly demand series")
    rep.add_argument("--series", required=True, help="series file: ts, key, value (GPUs demanded per key per hour)")
    rep.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    rep.add_argument("--nodes", type=int, default=None,
                     help="nodes per key (default: the fewest that hold the key's peak demand)")
    rep.add_argument("--boot", default="10m", help="a resumed node's time until usable (Slurm's ResumeTimeout "
                     "covers it; default 10m)")
    rep.add_argument("--suspend-time", default="30m", help="Slurm's SuspendTime for the reactive strategy "
                     "(default 30m)")
    rep.add_argument("--step", default="5m", help="simulation step, dividing an hour (default 5m)")
    rep.add_argument("--refit-hour", type=int, default=2, choices=range(24), metavar="H",
                     help="UTC hour of the daily forecast refit (the nightly DAG's: 2)")
    rep.add_argument("--prophet", action="store_true",
                     help="fit Prophet among the forecast's members, as the nightly does (about 2 s per key and day)")
    rep.add_argument("--timezone", help="zone of the off-hours windows (default: the policy's offhours.timezone)")
    rep.add_argument("--suspend-times", default=None, metavar="T,T,...",
                     help="SuspendTimes of Slurm's frontier (default 10m,30m,1h,2h,4h,6h,12h,1d,2d,4d,8d,16d)")
    rep.add_argument("--quantiles", default=None, metavar="Q,Q,...",
                     help="offhours.forecast_quantile values of the agent's frontier (default 0.5,0.7,0.8,0.9,0.95,0.99)")
    rep.add_argument("--no-frontiers", action="store_true",
                     help="play the three default points and the oracle only (no sweeps; faster)")
    rep.add_argument("--node-type", default="", metavar="MODEL",
                     help="the nodes' GPU model, for their power figures (offhours.node_types; default: the "
                          "offhours defaults)")
    rep.add_argument("--plot", metavar="FILE", help="draw the three frontiers into this PNG")
    add_policy(rep)
    add_json(rep)
    rep.set_defaults(handler=_replay)


def _replay(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.capacity.forecast.history import load_series
    from gpu_cost.cli.options import duration_arg
    from gpu_cost.config.loader import load_policy
    from gpu_cost.sim.power_replay import ReplaySettings, plot, replay, table

    policy = load_policy(args.policy)
    extra: dict[str, Any] = {}
    if args.suspend_times:
        extra["suspend_times"] = tuple(duration_arg(x.strip(), "--suspend-times") for x in args.suspend_times.split(","))
    if args.quantiles:
        extra["quantiles"] = tuple(_number(x, "--quantiles") for x in args.quantiles.split(","))
    settings = ReplaySettings(gpus_per_node=args.gpus_per_node, nodes=args.nodes,
                              step_s=duration_arg(args.step, "--step"), boot_s=duration_arg(args.boot, "--boot"),
                              suspend_time_s=duration_arg(args.suspend_time, "--suspend-time"),
                              refit_hour=args.refit_hour, use_prophet=args.prophet, timezone=args.timezone,
                              node_type=args.node_type, frontiers=not args.no_frontiers, **extra)
    out = replay(load_series(args.series), policy, settings)
    if args.plot:
        out["plot"] = plot(out, args.plot)
    s = out["settings"]
    head = (f"power replay of {args.series}: {len(out['keys'])} keys, {out['node_hours']:g} node-hours "
            f"({s['gpus_per_node']} GPUs a node, {s['idle_power_w']:g} W idle, {s['boot_kwh']:g} kWh a boot), "
            f"boot {s['boot_s']:g} s, SuspendTime {s['suspend_time_s']:g} s, windows in {s['timezone']}; "
            f"{out['gpu_hours_over_pool']:g} GPU-hours of demand above the pools queue under every strategy")
    lines = [head, "", table(out), "", out["verdict"]]
    if args.plot:
        lines.append(f"plot: {out['plot']}")
    return out, "\n".join(lines)


def _number(text: str, flag: str) -> float:
    from gpu_cost.core.errors import GpuCostError

    try:
        return float(text.strip())
    except ValueError:
        raise GpuCostError(f"{flag}: {text.strip()!r} is not a number") from None


def _week(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.airflow.power_tasks import simulate_week
    from gpu_cost.config.loader import load_policy

    policy = load_policy(args.policy)
    out = simulate_week(policy, nodes=args.nodes, days=args.days, seed=args.seed, jobs_per_node=args.jobs_per_node)
    text = (f"simulated {args.days:g} days, {args.nodes} nodes: {out['node_hours']:.0f} node-hours powered down "
            f"({out['node_hours_share']:.1%} of all node-hours), {out['kwh']:.1f} kWh, {out['usd']:.2f} {out['currency']}; "
            f"{out['power_downs']} power-downs, {out['wakes_by_demand']} wakes by demand")
    return out, text


def _plan(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.airflow.power_tasks import make_plan, reservation_decisions
    from gpu_cost.config.loader import load_policy

    policy = load_policy(args.policy)
    now = instant_arg(args.at, "--at") if args.at else time.time()
    now = float(now // policy.sweep.sample_interval * policy.sweep.sample_interval)
    source = args.source or ("sim" if policy.sweep.source in ("sim", "trace") else policy.sweep.source)
    store = open_store(args, writes=False)  # the nightly's demand forecasts; planning records nothing
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
    for problem in plan.problems:
        lines.append(f"  problem: {problem}")
    if plan.needs_approval:
        lines.append("  needs approval (more nodes than offhours.approval_over_nodes)")
    resv, notes = reservation_decisions(snap, policy, now, "enforce" if policy.mode == "enforce" else "dry-run", store)
    out["reservations"] = [{"target": d.target, "action": d.action, "mode": d.mode, "account": d.account,
                            "nodes": d.evidence.get("node_count"), "requires_approval": d.requires_approval,
                            "reason": d.reason} for d in resv]
    out["reservation_notes"] = notes
    for d in resv:
        lines.append(f"  {'reserve' if d.action == 'reserve' else d.action}: {d.reason}")
    lines += [f"  {n}" for n in notes if policy.reservations.enabled]
    return out, "\n".join(lines)
