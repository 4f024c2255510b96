"""``gpu-cost policy check FILE``: validate a policy file."""

from __future__ import annotations

import argparse
from typing import Any

from gpu_cost.cli.options import add_json


def register(sub: Any) -> None:
    p = sub.add_parser("policy", help="policy tools")
    psub = p.add_subparsers(dest="policy_command", required=True)
    check = psub.add_parser("check", help="validate a policy file; exits non-zero naming file, path and reason")
    check.add_argument("file")
    add_json(check)
    check.set_defaults(handler=_check)


def _check(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.config.loader import load_policy
    from gpu_cost.core import registry

    policy = load_policy(args.file)
    rules = {n: policy.rule_mode(n) for n in registry.rules() if policy.rule(n).enabled}
    payload = {"ok": True, "file": args.file, "mode": policy.mode, "rules": rules,
               "protections": [p.name for p in policy.protections]}
    return payload, f"{args.file}: OK (mode {policy.mode}; rules {', '.join(f'{k}={v}' for k, v in rules.items())})"
