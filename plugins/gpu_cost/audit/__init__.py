"""Audit store: every decision and action, before and after."""

from __future__ import annotations

from gpu_cost.audit.store import AuditStore

__all__ = ["AuditStore"]
