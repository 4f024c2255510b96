"""``gpu-cost report``: the weekly report outside Airflow (same code as the DAG)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from gpu_cost.cli.options import add_db, add_json, add_policy, instant_arg, open_store
from gpu_cost.core.errors import GpuCostError


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="write the cost report (HTML + Markdown + charts) for a period")
    p.add_argument("--since", help="start: ISO 8601, epoch or a duration, e.g. 7d, counted back from the store's "
                                   "newest sweep (default: Monday of the previous week)")
    p.add_argument("--until", help="end, exclusive: ISO 8601, epoch or a duration before the store's newest sweep "
                                   "(default: Monday of this week)")
    p.add_argument("--out", help="folder or URL (default: GPU_COST_REPORT_DIR or the policy's report.out_dir, "
                                 "beside a SQLite store)")
    add_policy(p)
    add_db(p)
    add_json(p)
    p.set_defaults(handler=_report)


def _report(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.config.loader import load_policy
    from gpu_cost.core.timeutil import iso
    from gpu_cost.report.kpis import data_end, week_bounds
    from gpu_cost.report.render import build_report, fmt_money, fmt_num, fmt_pct

    policy = load_policy(args.policy)
    now = time.time()
    for flag, value in (("--since", args.since), ("--until", args.until)):
        if value:
            instant_arg(value, flag, before=now)  # a bad value is named before any store is opened
    store = open_store(args, writes=False)
    # a duration counts back from the newest data (kpis.recent_period), not from the clock
    ref = data_end(store, now) if args.since or args.until else now
    since, until = week_bounds(now, policy.report.timezone, weeks_back=1)
    if args.since:
        since = instant_arg(args.since, "--since", before=ref)
    if args.until:
        until = instant_arg(args.until, "--until", before=ref)
    if args.since and not args.until:
        until = min(since + 7 * 86400, ref) if since > ref - 7 * 86400 else since + 7 * 86400
    if args.until and not args.since:
        since = until - 7 * 86400
    if until <= since:
        raise GpuCostError(f"--since {iso(since)} is not before --until {iso(until)}")
    out = build_report(store, policy, since, until, args.out)
    h = out["headline"]
    cur = h["currency"]
    lines = [
        f"GPU cost report {out['period']['label']} ({iso(since)} - {iso(until)})",
        f"  utilisation: {fmt_pct(h['util_all_pct'])} of all GPUs, {fmt_pct(h['util_alloc_pct'])} of allocated GPUs",
        f"  waste: {fmt_num(h['idle_alloc_gpu_hours'])} GPU-h idle while allocated "
        f"(ratio {fmt_pct(h['waste_ratio'], 1, True)}), {fmt_num(h['zombie_gpu_hours'])} GPU-h zombie",
        f"  saved: {fmt_money(h['saved_cost'], cur)} ({fmt_num(h['reused_gpu_hours'], 1)} GPU-h re-used by other jobs "
        f"of {fmt_num(h['freed_gpu_hours'], 1)} freed, {fmt_num(h['saved_kwh'], 1)} kWh); "
        f"{h['live_events']} automated actions ({h['would_have_events']} more in dry-run)",
        f"  dry-run: would have freed {fmt_num(h['would_have_gpu_hours'], 1)} GPU-h "
        f"({fmt_money(h['would_have_cost'], cur)}; not counted as saved)",
        f"report: {out['index']}",
        f"summary: {out['summary']}",
    ]
    return out, "\n".join(lines)
