"""``gpu-cost snooze``: leave a target alone for a while, with a justification (or list snoozes)."""

from __future__ import annotations

import argparse
import getpass
import os
import time
from typing import Any

from gpu_cost.cli.options import add_db, add_json, add_policy, duration_arg, open_store
from gpu_cost.core.errors import GpuCostError


def register(sub: Any) -> None:
    p = sub.add_parser("snooze", help="snooze a target (job, process, GPU, user, node) with a reason, or --list",
                       description="Snooze a target: the sweep decides nothing for it until the snooze expires, "
                                   "and records what it held back.")
    p.add_argument("--target", help="job:<id> (or a bare job id), proc:<host>:<pid>:<start>, gpu:<host>:<i>, "
                                    "user:<name>, node:<name>")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--for", dest="duration", help="how long, e.g. 4h, 2d")
    when.add_argument("--until", help="until when (ISO 8601 or epoch seconds)")
    p.add_argument("--reason", help="the justification (required)")
    p.add_argument("--by", help="who asks (default: the current user)")
    add_policy(p, "policy file bounding the duration")
    p.add_argument("--list", action="store_true", help="list the snoozes in force")
    add_db(p)
    add_json(p)
    p.set_defaults(handler=_snooze)


def _snooze(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.config.loader import load_policy
    from gpu_cost.core.timeutil import epoch, iso
    from gpu_cost.decide import snooze as lib

    now = time.time()
    if not args.list:
        if not args.target or not args.reason or not (args.duration or args.until):
            raise GpuCostError("snooze needs --target, --for (or --until) and --reason (or --list)")
        if args.duration:
            until = now + duration_arg(args.duration, "--for")
        else:
            try:
                until = epoch(args.until)
            except ValueError as exc:
                raise GpuCostError(f"--until {args.until!r}: {exc}") from None
    store = open_store(args, writes=not args.list)
    if args.list:
        rows = lib.active(store, now)
        items = [{"target": r["target"], "until": iso(r["until_ts"]), "reason": r["reason"], "by": r["created_by"],
                  "snooze_id": r["snooze_id"]} for r in rows]
        lines = [f"{len(items)} snooze(s) in force"]
        lines += [f"  {i['target']:<34} until {i['until']}  by {i['by'] or '?'}: {i['reason']}" for i in items]
        return {"snoozes": items}, "\n".join(lines)
    by = args.by or os.environ.get("SUDO_USER") or getpass.getuser()
    policy = load_policy(args.policy)
    row = lib.snooze(store, args.target, until, args.reason, by, now=now, policy=policy)
    out = {"snoozed": True, "target": row["target"], "until": iso(row["until_ts"]), "reason": row["reason"],
           "by": row["created_by"], "snooze_id": row["snooze_id"]}
    return out, f"snoozed {out['target']} until {out['until']} (by {out['by']}): {out['reason']}"
