"""Idle reservation: Slurm reservations whose nodes sit unused.

Policy (``rules.idle_reservation``)::

    idle_reservation:
      window: 2h          # started at least this long ago, and GPUs idle over it where seen
                          # (unset: 2 h, or the lookback when shorter)
      util_max: 5         # % — a reserved node's GPU above this in the window counts as used
      ladder: [notify, release_reservation (2h)]
      exclude_flags: [MAINT]
      administrators: [ops-oncall]      # told about other people's idle reservations
      release_foreign: {users: [], names: []}   # others' that may be released, with approval

A reservation is idle when it is active, began at least ``window`` ago, no job waits for it, and
some of its nodes run none of its jobs while the GPU metrics show their GPUs idle over the window.
A node without GPU metrics is unknown, not unused: a reservation with one among its unused nodes
is not found (no data, no action), nor is one with a stale GPU. One finding per reservation names
the unused nodes, and says whose it is (``evidence["standing"]``):

``agent``     the agent's own: named with ``reservations.prefix`` *and* recorded in the audit store
              as made by its ``reserve`` (``Reservation.made_by_agent``); both are needed. Its
              ladder notifies the reservation's first user (or ``owner``), then
              ``release_reservation`` deletes it, or shrinks it to the nodes its jobs hold.
``opted_in``  someone else's that ``release_foreign`` names (every user of it, or its name): the
              same ladder, but the engine makes a human approve every release.
``foreign``   anyone else's: notices to ``administrators`` only; the engine keeps the notice rungs
              of the ladder and refuses a release on every way in.

The ladder's wait is what makes "idle for a while" hold across sweeps: a job that starts in the
reservation closes the episode. Maintenance reservations (``MAINT``) and names in
``exclude_names`` are never found.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Annotated

from gpu_cost.analyse.rules import register
from gpu_cost.config.schema import USER_NAME, Mode, Percent, Policy, Rung
from gpu_cost.config.typed import Dur, Invalid, Range
from gpu_cost.core.globs import any_glob
from gpu_cost.core.model import AGENT, FOREIGN, OPTED_IN, Finding, Reservation, Snapshot, reservation_standing
from gpu_cost.core.registry import RuleSpec


@dataclass(frozen=True)
class ReleaseForeign:
    """Someone else's reservations the agent may release, each only once a human approves: those
    whose every user is in ``users``, or whose name matches one of ``names`` (globs). Empty (the
    default): other people's reservations are only reported to ``administrators``."""

    #: Slurm users whose reservations may be released (a reservation of several users: all of them listed)
    users: tuple[str, ...] = ()
    #: reservation names (globs, e.g. ``scratch-*``) that may be released
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class IdleReservationRule:
    """A Slurm reservation whose nodes sit unused: reserved, started at least ``window`` ago, no
    job running or waiting in them, and GPU metrics showing their GPUs idle over the window (a
    node without GPU metrics is unknown, never unused). Notice first, then ``release_reservation``
    frees the unused nodes of the agent's own reservations (named with ``reservations.prefix``
    and recorded as made by it in the audit store): it deletes one nobody uses and shrinks one
    that is partly used to the nodes its jobs hold. Anyone else's reservation gets notices to
    ``administrators`` only, unless ``release_foreign`` names it; even then a human approves."""

    enabled: bool = True
    mode: Mode | None = None
    util_max: Percent = 5.0
    #: unset: two hours, or the whole lookback when that is shorter
    window: Annotated[float, Dur(), Range(60, 7 * 86400)] | None = None
    ladder: tuple[Rung, ...] = (Rung("notify", 0.0), Rung("release_reservation", 2 * 3600.0))
    #: reservations with any of these Slurm flags are never found (maintenance windows are not waste)
    exclude_flags: tuple[str, ...] = ("MAINT",)
    #: reservation names (globs) never found
    exclude_names: tuple[str, ...] = ()
    #: who is told about a reservation that names no user (its first account's owner otherwise unknown)
    owner: str = ""
    #: who is told about someone else's idle reservation (users named in ``people:``); empty: its first user, else ``owner``
    administrators: tuple[str, ...] = ()
    #: someone else's reservations that may be released at all, each with a human's approval
    release_foreign: ReleaseForeign = field(default_factory=ReleaseForeign)


def why(f: Finding) -> str:
    """The decision reason for an idle-reservation finding."""
    ev = f.evidence
    unused = ev.get("unused_nodes") or []
    used = ev.get("used_nodes") or []
    seen = int(ev.get("gpus_idle_for_s") or 0)
    text = (f"reservation {ev.get('reservation')}: {len(unused)} of {ev.get('node_count')} reserved node(s) "
            f"run none of its jobs (their GPUs idle for {seen // 60} min)")
    whose = reservation_standing("reservation", ev)
    if used and whose != FOREIGN:
        text += f" (its jobs hold {', '.join(used)}: shrink to those)"
    if whose != AGENT:
        owner = ", ".join(ev.get("users") or []) or ", ".join(ev.get("accounts") or []) or "unknown"
        text += f"; not the agent's own reservation (it is {owner}'s)"
        text += (": released only with a human's approval (rules.idle_reservation.release_foreign)"
                 if whose == OPTED_IN else ": reported to the administrators, never released or shrunk by the agent")
    return text


def standing_of(r: Reservation, cfg: IdleReservationRule, policy: Policy) -> str:
    """Return whose ``r`` is: :data:`AGENT` only with both proofs (the agent's name prefix and its audit
    row, ``made_by_agent``); else :data:`OPTED_IN` when ``release_foreign`` names every user of it or its
    name; else :data:`FOREIGN`."""
    prefix = policy.reservations.prefix
    if r.made_by_agent and prefix and r.name.startswith(prefix):
        return AGENT
    opt = cfg.release_foreign
    if (r.users and opt.users and set(r.users) <= set(opt.users)) or any(
            fnmatch.fnmatchcase(r.name, pat) for pat in opt.names):
        return OPTED_IN
    return FOREIGN


#: the window when the policy sets none (capped at the lookback)
DEFAULT_WINDOW_S = 2 * 3600.0


def window_of(cfg: IdleReservationRule, policy: Policy) -> float:
    """Return the rule's window: the policy's, else two hours or the whole lookback when that is shorter."""
    return float(cfg.window) if cfg.window is not None else min(DEFAULT_WINDOW_S, policy.sweep.lookback)


def check(cfg: IdleReservationRule, policy: Policy) -> None:
    """Check who is told about, and whose reservations may be released by, this rule."""
    for key, names in (("administrators", cfg.administrators), ("release_foreign.users", cfg.release_foreign.users)):
        if len(set(names)) != len(names):
            raise Invalid(key, "lists a user twice")
        for i, user in enumerate(names):
            if not USER_NAME.match(user):
                raise Invalid(f"{key}[{i}]", f"{user!r} is not a user name")
    for i, pat in enumerate(cfg.release_foreign.names):
        where = f"release_foreign.names[{i}]"
        if not pat.strip() or set(pat.strip()) <= {"*"}:
            raise Invalid(where, f"{pat!r} would let the agent release every reservation: name them")
        try:
            any_glob((pat,))  # what the release test will compile
        except re.error as exc:
            raise Invalid(where, f"bad pattern: {exc}") from None


SPEC = RuleSpec(
    "idle_reservation", config=IdleReservationRule, rank=70, check=check, target="reservation", title="a reservation whose nodes sit unused",
    label="Idle reservations", why=why, window=window_of,
    doc="An active Slurm reservation, begun at least ``window`` ago, with nodes no job of it uses, whose GPUs the "
        "metrics show idle (no metrics: not found), and no job waiting for it; ``release_reservation`` deletes or "
        "shrinks only the agent's own (its name prefix and its audit row). Anyone else's is reported to "
        "``administrators``, released only where ``release_foreign`` names it, with a human's approval. "
        "Maintenance reservations are left alone.",
    example="""
        rules:
          idle_reservation:
            window: 2h
            ladder:
              - {action: notify}
              - {action: release_reservation, after: 2h}
    """,
)


def _excluded(r: Reservation, cfg: IdleReservationRule) -> bool:
    flags = {f.upper() for f in cfg.exclude_flags}
    return bool(flags & set(r.flags)) or any(fnmatch.fnmatchcase(r.name, pat) for pat in cfg.exclude_names)


def _busy_hosts(snapshot: Snapshot, hosts: set[str], cfg: IdleReservationRule,
                window: float) -> tuple[set[str], set[str], set[str]]:
    """Return the hosts among ``hosts`` whose GPUs were busy in the window, were stale, and were seen."""
    if not hosts or not len(snapshot.gpus):
        return set(), set(), set()
    try:
        frame = snapshot.view(window)
    except KeyError:
        frame = snapshot.gpus
    frame = frame[frame["host"].isin(sorted(hosts))]
    busy = {str(h) for h in frame.loc[(~frame["stale"]) & (frame["util_max"] > cfg.util_max), "host"]}
    stale = {str(h) for h in frame.loc[frame["stale"], "host"]}
    return busy, stale, {str(h) for h in frame["host"]}


@register(SPEC)
def idle_reservation(snapshot: Snapshot, cfg: IdleReservationRule, policy: Policy) -> list[Finding]:
    """Return one finding per active reservation with nodes that ran none of its jobs over the window."""
    out: list[Finding] = []
    now = snapshot.ts
    window = window_of(cfg, policy)
    gpus_of = {n.name: int(n.gpus_total or 0) for n in snapshot.nodes}
    for r in snapshot.reservations:
        if not r.active or _excluded(r, cfg) or now - r.start_ts < window or not r.nodes:
            continue
        mine = [j for j in snapshot.jobs if j.reservation == r.name]
        if any(j.pending for j in mine):
            continue  # demand is waiting for it: not idle
        used = {h for j in mine if j.running for h in j.nodes} & set(r.nodes)
        busy, stale, seen = _busy_hosts(snapshot, set(r.nodes) - used, cfg, window)
        if stale:
            continue  # part of it unseen: no data, no action
        unused = [h for h in r.nodes if h not in used and h not in busy]
        if not unused or not set(unused) <= seen:
            continue  # a node without GPU metrics is unknown, not unused: no data, no action
        user = r.users[0] if r.users else (cfg.owner or None)
        standing = standing_of(r, cfg, policy)
        out.append(Finding(
            rule="idle_reservation", target_kind="reservation", target=f"reservation:{r.name}",
            action="release_reservation", gpus=sum(gpus_of.get(h, 0) for h in unused), user=user,
            account=r.accounts[0] if r.accounts else None, partition=r.partition or None, nodes=tuple(unused),
            evidence={
                "reservation": r.name, "node_count": r.node_count, "nodes": list(r.nodes), "unused_nodes": unused,
                "used_nodes": sorted(used | busy), "jobs": sorted(j.job_id for j in mine if j.running),
                "reservation_start_ts": r.start_ts, "reservation_end_ts": r.end_ts,
                "gpus_idle_for_s": window,
                "accounts": list(r.accounts), "users": list(r.users), "flags": list(r.flags),
                "window_s": window, "util_max": cfg.util_max, "standing": standing,
                "made_by_agent": r.made_by_agent,
                **({"administrators": list(cfg.administrators)} if standing != AGENT and cfg.administrators else {}),
            },
        ))
    return out
