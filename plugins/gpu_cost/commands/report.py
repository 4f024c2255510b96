"""``gpu-cost report``: the weekly report outside Airflow (same code as the DAG)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from gpu_cost.cli import add_db, add_json, add_policy, open_store
from gpu_cost.errors import GpuCostError


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="write the cost report (HTML + Markdown + charts) for a period")
    p.add_argument("--since", help="start, ISO 8601 or epoch (default: Monday of the previous week)")
    p.add_argument("--until", help="end, exclusive (default: Monday of this week)")
    p.add_argument("--out", help="folder or URL (default: GPU_COST_REPORT_DIR or the policy's report.out_dir)")
    add_policy(p)
    add_db(p)
    add_json(p)
    p.set_defaults(handler=_report)


def _report(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.policy import load_policy
    from gpu_cost.report.kpis import week_bounds
    from gpu_cost.report.render import build_report
    from gpu_cost.timeutil import epoch, iso

    policy = load_policy(args.policy)
    since, until = week_bounds(time.time(), policy.report.timezone, weeks_back=1)
    try:
        if args.since:
            since = epoch(args.since)
        if args.until:
            until = epoch(args.until)
    except ValueError as exc:
        raise GpuCostError(f"--since/--until: {exc}") from None
    if args.since and not args.until:
        until = since + 7 * 86400
    if args.until and not args.since:
        since = until - 7 * 86400
    out = build_report(open_store(args), policy, since, until, args.out)
    h = out["headline"]
    cur = h["currency"]
    lines = [
        f"GPU cost report {out['period']['label']} ({iso(since)} - {iso(until)})",
        f"  utilisation: {h['util_all_pct']} % of all GPUs, {h['util_alloc_pct']} % of allocated GPUs",
        f"  waste: {h['idle_alloc_gpu_hours']} GPU-h idle while allocated (ratio {h['waste_ratio']}), "
        f"{h['zombie_gpu_hours']} GPU-h zombie",
        f"  realized savings: {h['saved_gpu_hours']} GPU-h, {h['saved_kwh']} kWh, {h['saved_cost']} {cur}; "
        f"{h['live_events']} automated actions ({h['would_have_events']} more in dry-run)",
        f"report: {out['index']}",
        f"summary: {out['summary']}",
    ]
    return out, "\n".join(lines)
