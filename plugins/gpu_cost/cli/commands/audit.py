"""``gpu-cost audit``: what the agent decided about a job, target or user, what it did, and why."""

from __future__ import annotations

import argparse
import time
from typing import Any

from gpu_cost.cli.options import add_db, add_json, add_policy, instant_arg, open_store
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.timeutil import iso


def register(sub: Any) -> None:
    p = sub.add_parser("audit", help="the audit trail of a job, target or user: decisions, actions, approvals, savings",
                       description="Read the audit store: every decision about the job, target or user (oldest "
                                   "first), with its reason, stakes, approval, the actions carried out (command, "
                                   "outcome, error) and the saving booked. Read-only.")
    p.add_argument("--job", help="a Slurm job id: its decisions, and those naming it")
    p.add_argument("--target", help="a target as decisions name it: job:<id>, proc:<host>:<pid>:<start>, node:<name>")
    p.add_argument("--user", help="decisions about this user's jobs and processes")
    p.add_argument("--rule", help="only this rule (zombie, idle_allocation, low_efficiency, manual, offhours, ...)")
    p.add_argument("--since", help="from this instant (ISO 8601 or epoch) or this long ago (e.g. 7d)")
    p.add_argument("--limit", type=int, default=50, help="the newest this many decisions (default 50, at most 1000)")
    add_policy(p, "policy file (for the currency)")
    add_db(p)
    add_json(p)
    p.set_defaults(handler=_audit)


def _audit(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.audit.trail import render, trail
    from gpu_cost.config.loader import load_policy

    if args.limit is not None and args.limit < 1:
        raise GpuCostError(f"--limit {args.limit}: must be at least 1")
    since = instant_arg(args.since, "--since", before=time.time()) if args.since else None
    store = open_store(args, writes=False)
    entries = trail(store, job=args.job, target=args.target, user=args.user, rule=args.rule, since=since,
                    limit=args.limit)
    filters = {k: v for k, v in {"job": args.job, "target": args.target, "user": args.user, "rule": args.rule,
                                 "since": iso(since) if since is not None else None}.items() if v}
    what = ", ".join(f"{k} {v}" for k, v in filters.items()) or "the whole cluster"
    currency = load_policy(args.policy).cost.currency
    out: dict[str, Any] = {"filters": filters, "count": len(entries), "decisions": entries}
    if not entries:
        out["exit_code"] = 1  # as grep: nothing found is not success (a script asking about a job learns so)
    return out, render(entries, what, currency)
