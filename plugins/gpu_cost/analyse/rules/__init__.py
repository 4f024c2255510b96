"""Rules: pure functions from a snapshot to findings, registered by the policy's rule name.

Each rule reads only the snapshot and its own policy section, does no I/O, and never counts a
stale or missing GPU as idle. A rule module declares its rule once, with
``@register(RuleSpec(...))``: name, config dataclass, the reason text of its decisions, its
window, the words messages and the report use (:mod:`gpu_cost.core.registry`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from gpu_cost.config.schema import Policy
from gpu_cost.core import registry
from gpu_cost.core.model import Finding, Snapshot
from gpu_cost.core.perf import gc_paused
from gpu_cost.core.registry import RuleSpec

RuleFn = Callable[[Snapshot, Any, Policy], list[Finding]]


def register(spec: RuleSpec) -> Callable[[RuleFn], RuleFn]:
    """Declare a rule (its spec) with ``fn`` as its detector."""

    def wrap(fn: RuleFn) -> RuleFn:
        registry.add_rule(dataclasses.replace(spec, detect=fn))
        return fn

    return wrap


@gc_paused()
def run_rules(snapshot: Snapshot, policy: Policy, names: list[str] | None = None) -> list[Finding]:
    """Run every enabled rule (or ``names``) and return their findings, most GPUs first."""
    specs = registry.rules()
    findings: list[Finding] = []
    for name in names or list(specs):
        cfg = getattr(policy.rules, name, None)
        if cfg is None or not getattr(cfg, "enabled", True):
            continue
        detect = specs[name].detect
        assert detect is not None
        findings.extend(detect(snapshot, cfg, policy))
    findings.sort(key=lambda f: (-f.gpus, f.rule, f.target))
    return findings
