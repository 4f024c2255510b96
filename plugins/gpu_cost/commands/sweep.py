"""``gpu-cost sweep``: one sweep outside Airflow (collect → detect → decide → record)."""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

from gpu_cost.audit.store import AuditStore
from gpu_cost.cli import add_json, add_policy, instant_arg
from gpu_cost.policy import load_policy
from gpu_cost.sweep import run_once
from gpu_cost.timeutil import iso


def register(sub: Any) -> None:
    p = sub.add_parser("sweep", help="run one sweep now, outside Airflow")
    p.add_argument("--source", choices=["sim", "prometheus"], help="data source (default: the policy's)")
    p.add_argument("--mode", choices=["dry-run", "notify", "enforce"], help="override the policy's mode")
    add_policy(p)
    p.add_argument("--scenario", help="simulator scenario file (source sim)")
    p.add_argument("--at", help="instant to look at (ISO 8601 or epoch; default: now)")
    add_json(p)
    p.set_defaults(handler=_sweep)


def _sweep(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    policy = load_policy(args.policy)
    if args.mode:
        policy = _with_mode(policy, args.mode)
    now = instant_arg(args.at, "--at") if args.at else time.time()
    now = float(now // policy.sweep.sample_interval * policy.sweep.sample_interval)
    store = AuditStore().ensure_schema()
    kwargs: dict[str, Any] = {}
    if args.scenario:
        kwargs["scenario"] = args.scenario
    out = run_once(policy, now, store, source=args.source, **kwargs)
    out["audit_db"] = store.path or store.url.split("@")[-1]
    lines = [f"sweep at {iso(now)} on {out['source']} ({out['gpus']} GPUs, {out['jobs']} running jobs), mode {out['mode']}"]
    if out["problems"]:
        lines.append("degraded: " + "; ".join(out["problems"]))
    lines.append(f"{len(out['findings'])} finding(s), {len(out['decisions'])} decision(s):")
    for d in out["decisions"]:
        lines.append(f"  {d['rule']:<16} {d['target']:<34} → {d['action']:<14} [{d['mode']}] {d['reason']}")
    lines.append(f"audit: {out['audit_db']}")
    return out, "\n".join(lines)


def _with_mode(policy: Any, mode: str) -> Any:
    new = dataclasses.replace(policy, mode=mode)
    object.__setattr__(new, "source", policy.source)
    return new
