"""Snoozes: an owner's justified request to leave a target alone until a given time.

A snooze covers one target (``job:<id>``, ``proc:<host>:<pid>:<start>``, ``gpu:<host>:<i>``) or
everything of a user (``user:<name>``) or on a node (``node:<name>``). It is written to
``gpu_cost_snoozes`` (never deleted; it simply expires) and onto the target's escalation rows.
While it holds, the engine decides nothing for any finding that touches it (its target, its job
or the job a process still names, its GPUs, its owner, its nodes:
:func:`gpu_cost.decide.engine.snooze_keys`) and records, once per snooze and episode, a ``none``
decision saying what the snooze held back. When it expires the ladder
continues where it stood.

The ``gpu-cost snooze`` command and the manual reclaim DAG both call :func:`snooze`.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from typing import Any

from gpu_cost.audit.store import AuditStore
from gpu_cost.config.schema import Policy, SnoozeConfig
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.timeutil import format_duration, iso

logger = logging.getLogger(__name__)

_TARGET = re.compile(r"^(job|proc|gpu|user|node):\S+$")


class SnoozeError(GpuCostError):
    """A snooze request is malformed or exceeds what the policy allows."""


def normalise_target(target: str) -> str:
    """Return the canonical target key: a bare job id ``123`` or ``123_4`` becomes ``job:123``."""
    t = (target or "").strip()
    if re.fullmatch(r"\d+(?:_\d+)?", t):
        return f"job:{t}"
    if not _TARGET.match(t):
        raise SnoozeError(f"target {target!r}: use job:<id>, proc:<host>:<pid>:<start>, gpu:<host>:<index>, "
                          "user:<name> or node:<name>")
    return t


def snooze(store: AuditStore, target: str, until: float, reason: str, by: str | None,
           *, now: float | None = None, policy: Policy | None = None) -> dict[str, Any]:
    """Snooze ``target`` until ``until`` (epoch seconds); return the snooze row written.

    :param reason: the justification; required (``snooze.min_reason_chars`` of the policy).
    :param by: who asked (user name); recorded.
    :param policy: bounds the duration (``snooze.max_duration``); defaults apply without one.
    """
    cfg = policy.snooze if policy is not None else SnoozeConfig()
    now = time.time() if now is None else float(now)
    key = normalise_target(target)
    why = (reason or "").strip()
    if len(why) < cfg.min_reason_chars:
        raise SnoozeError(f"reason {reason!r}: give a justification of at least {cfg.min_reason_chars} characters")
    if until <= now:
        raise SnoozeError(f"until {iso(until)} is not in the future")
    if until - now > cfg.max_duration + 1:
        raise SnoozeError(f"{format_duration(until - now)} is longer than snooze.max_duration="
                          f"{format_duration(cfg.max_duration)}; a longer exemption belongs in the policy's protections")
    sid = hashlib.sha256(f"{key}|{int(until)}|{by or ''}|{why}".encode()).hexdigest()[:16]
    row = {"snooze_id": sid, "target": key, "until_ts": float(until), "reason": why, "created_by": by,
           "created_at": now}
    store.execute("insert_snooze", row)
    store.execute("snooze_escalations", {"target": key, "until_ts": float(until), "reason": why, "created_by": by})
    logger.info("snoozed %s until %s by %s: %s", key, iso(until), by or "?", why)
    return row


def active(store: AuditStore, now: float | None = None) -> list[dict[str, Any]]:
    """Return the snoozes in force at ``now``, longest first."""
    return store.active_snoozes(time.time() if now is None else now)
