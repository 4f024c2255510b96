"""Whose GPU processes are ours to kill: one verdict for every way in (the zombie sweep, the manual reclaim).

A process of no running job that is not a person's — root's, a system account's, one in a
container — is reported, never killed. :func:`owner_evidence` classifies a process under
``rules.zombie`` (``act_on_owners``, ``system_users``) into the evidence its finding carries
(``foreign_owner``: ``root``, ``system``, ``container:<runtime>`` or ``job unknown``; ``act_on_owner``: the policy
entry that lets the agent act on it), and :func:`not_ours` reads that evidence back: why nothing
destructive is done to it, or None. The zombie rule turns such a finding into advice; the
engine's guard (:func:`gpu_cost.decide.engine.guard`) refuses a destructive action on it whoever
asks, protections overridden or not.

Root's processes and those in a container are never ours: the node wrapper refuses them whatever
the agent asks, so no policy entry opens them. A system account named in ``system_users`` is acted
on only when ``act_on_owners`` names ``system`` or that user; the node still refuses a uid under
its ``UID_MIN`` or with a ``nologin``/``false`` shell, which only it can see.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gpu_cost.core.model import GpuProcess


class OwnerSettings(Protocol):
    """The owner settings of ``rules.zombie`` (its :class:`~gpu_cost.analyse.rules.zombie.ZombieRule`)."""

    @property
    def act_on_owners(self) -> tuple[str, ...]: ...

    @property
    def system_users(self) -> tuple[str, ...]: ...


def foreign_owner(p: GpuProcess, cfg: OwnerSettings) -> str | None:
    """Return why a process is not ours by default (``root``, ``system``, ``container:<runtime>``, ``job unknown``),
    or None."""
    if not p.job_known:
        return "job unknown"
    if p.container:
        runtime, sep, _ = p.container.partition(":")
        return f"container:{runtime}" if sep else "container"
    if p.user == "root":
        return "root"
    if p.user and p.user in cfg.system_users:
        return "system"
    return None


def owner_allowed(kind: str, user: str, cfg: OwnerSettings) -> str | None:
    """Return the ``act_on_owners`` entry that lets the agent act on a foreign owner, or None."""
    if kind in ("root", "job unknown") or kind.startswith("container"):
        return None  # the node wrapper refuses them whatever the policy says; no policy makes a job known
    allowed = set(cfg.act_on_owners)
    if "system" in allowed:
        return "system"
    return user if user and user in allowed else None


def owner_evidence(p: GpuProcess, cfg: OwnerSettings) -> dict[str, Any]:
    """Return the evidence a finding on process ``p`` carries about its owner (empty for a person's)."""
    kind = foreign_owner(p, cfg)
    if kind is None:
        return {}
    evidence: dict[str, Any] = {"foreign_owner": kind}
    allowed_by = owner_allowed(kind, p.user, cfg)
    if allowed_by is not None:
        evidence["act_on_owner"] = allowed_by
    return evidence


def not_ours(evidence: Mapping[str, Any]) -> str | None:
    """Return why nothing destructive is done to the process a finding's ``evidence`` describes, or None."""
    kind = evidence.get("foreign_owner")
    if not kind or evidence.get("act_on_owner"):
        return None
    if kind == "root":
        why = "the node never signals uid 0"
    elif str(kind).startswith("container"):
        why = "the node never signals a process in a container"
    elif kind == "job unknown":
        why = ("no job is known to have held its GPU when it started (a trace without job labels, whose jobs file "
               "may leave out the job that owns it)")
    else:
        why = "rules.zombie.act_on_owners does not name it"
    what = "a process whose job is unknown" if kind == "job unknown" else f"a {kind} process"
    return f"{what}, not ours: reported only ({why})"


__all__ = ["foreign_owner", "not_ours", "owner_allowed", "owner_evidence"]
