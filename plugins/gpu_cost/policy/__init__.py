"""Policy: schema, loader, protections, escalation, cost of being wrong, caps."""

from __future__ import annotations

from gpu_cost.policy.loader import load_policy, parse_policy
from gpu_cost.policy.schema import Policy

__all__ = ["Policy", "load_policy", "parse_policy"]
