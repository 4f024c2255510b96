"""Protections: who and what the agent treats gently."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

from gpu_cost.model import Finding
from gpu_cost.policy.schema import Match, Protection

#: most restrictive first
LEVEL_ORDER = {"never": 0, "notify_only": 1, "approval": 2}


def matches(m: Match, f: Finding) -> bool:
    """Return True when every criterion given in ``m`` matches the finding (each list is an OR)."""
    checks: list[bool] = []
    if m.users:
        checks.append((f.user or "") in m.users)
    if m.accounts:
        checks.append((f.account or "") in m.accounts)
    if m.partitions:
        checks.append((f.partition or "") in m.partitions)
    if m.qos:
        checks.append((f.qos or "") in m.qos)
    if m.name_patterns:
        checks.append(any(fnmatch.fnmatchcase(f.name or "", p) for p in m.name_patterns))
    if m.labels:
        checks.append(any(label in f.labels for label in m.labels))
    if m.nodes:
        hosts = set(f.nodes) | ({f.host} if f.host else set()) | {g.split(":")[0] for g in f.gpu_ids}
        checks.append(any(fnmatch.fnmatchcase(h, p) for h in hosts for p in m.nodes))
    return bool(checks) and all(checks)


def protection_for(f: Finding, protections: Iterable[Protection]) -> Protection | None:
    """Return the most restrictive protection covering the finding, or None."""
    best: Protection | None = None
    for p in protections:
        if matches(p.match, f) and (best is None or LEVEL_ORDER[p.level] < LEVEL_ORDER[best.level]):
            best = p
    return best
