"""Rules: pure functions from a snapshot to findings, registered by the policy's rule name.

Each rule reads only the snapshot and its own policy section, does no I/O, and never counts a
stale or missing GPU as idle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpu_cost.model import Finding, Snapshot
from gpu_cost.policy.schema import Policy

RuleFn = Callable[[Snapshot, Any, Policy], list[Finding]]
REGISTRY: dict[str, RuleFn] = {}


def register(name: str) -> Callable[[RuleFn], RuleFn]:
    """Register a rule under the policy's name for it."""

    def wrap(fn: RuleFn) -> RuleFn:
        REGISTRY[name] = fn
        return fn

    return wrap


def run_rules(snapshot: Snapshot, policy: Policy, names: list[str] | None = None) -> list[Finding]:
    """Run every enabled rule (or ``names``) and return their findings, most GPUs first."""
    _load()
    findings: list[Finding] = []
    for name in names or list(REGISTRY):
        cfg = getattr(policy.rules, name, None)
        if cfg is None or not getattr(cfg, "enabled", True):
            continue
        findings.extend(REGISTRY[name](snapshot, cfg, policy))
    findings.sort(key=lambda f: (-f.gpus, f.rule, f.target))
    return findings


def _load() -> None:
    # importing the modules registers them
    from gpu_cost.rules import idle_allocation, low_efficiency, zombie  # noqa: F401
