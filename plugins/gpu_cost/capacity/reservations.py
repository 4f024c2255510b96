"""Reservations for predicted peaks: which account needs nodes held for it, when, and how many.

Policy (``reservations:``, off unless ``enabled``)::

    reservations:
      enabled: true
      accounts: [vision]      # empty: every account with a demand forecast
      lead: 1h                # reserve this long before the peak
      horizon: 12h            # look this far ahead
      min_gpus: 4             # a smaller shortfall gets nothing
      max_nodes: 4            # per reservation
      approval_over_nodes: 1  # more nodes than this: a human approves

For each account with a demand forecast (``demand:account:<a>``, written by the nightly), at each
forecast hour: *what would be free* for it is the partition's GPUs minus the other accounts'
expected demand (their forecast); its *need* is its forecast's 80 % upper bound minus the GPUs its
running jobs will still hold then (by their time limits). When the upper bound exceeds what would
be free by at least ``min_gpus``, the hours of that shortfall are a peak; once the peak is within
``lead``, a ``reserve`` decision proposes a reservation from the peak's first hour to its last,
of enough nodes for the need (at most ``max_nodes``), for that account. A peak an agent
reservation of the account already covers gets nothing more. The decisions pass the same guards as
every other way in (:func:`gpu_cost.decide.engine.guard`): protections, the mode, degraded data;
over ``approval_over_nodes`` a human approves. A reservation the demand then leaves unused is the
``idle_reservation`` rule's: it is shrunk or released under its ladder.

Which reservations are the agent's own (:func:`mark_own`): those whose name starts with
``reservations.prefix`` *and* that the audit store records the agent's ``reserve`` making, that
very reservation (it began no earlier than the action, and ends when the decision said). A name
with the prefix alone is someone else's: an administrator may name one so.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_cost.config.schema import Policy, ReservationsConfig, milder
from gpu_cost.core.model import AGENT, Decision, Finding, Reservation, Snapshot, decision_id
from gpu_cost.core.timeutil import iso

if TYPE_CHECKING:
    from gpu_cost.audit.store import AuditStore

logger = logging.getLogger(__name__)

#: the rule name of reservation decisions in the audit trail (a way in, not a registered rule)
RULE = "forecast_peak"
HOUR = 3600.0
_UNUSABLE = ("down", "drain", "fail", "maint")


@dataclass(frozen=True)
class Proposal:
    """One reservation to propose: ``node_count`` nodes for ``account`` over ``[start_ts, end_ts)``."""

    account: str
    name: str
    start_ts: float
    end_ts: float
    node_count: int
    gpus: int
    shortfall_gpus: float
    peak_upper: float
    free_gpus: float
    partition: str = ""
    hours: tuple[float, ...] = field(default=())

    def evidence(self) -> dict[str, Any]:
        # a reservation the agent is to make is its own (``standing``: the engine's reservation guard)
        return {"reservation": self.name, "start_ts": self.start_ts, "end_ts": self.end_ts,
                "node_count": self.node_count, "accounts": [self.account], "partition": self.partition,
                "shortfall_gpus": round(self.shortfall_gpus, 2), "peak_upper": round(self.peak_upper, 2),
                "free_gpus": round(self.free_gpus, 2), "gpus": self.gpus, "standing": AGENT}

    def why(self) -> str:
        return (f"account {self.account}: forecast up to {self.peak_upper:.0f} GPUs from {iso(self.start_ts)} to "
                f"{iso(self.end_ts)}, {self.free_gpus:.0f} would be free once the others' expected demand is "
                f"served ({self.shortfall_gpus:.0f} short): reserve {self.node_count} node(s) ({self.gpus} GPUs)")


def _name(cfg: ReservationsConfig, account: str, start: float) -> str:
    import datetime as dt

    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", account).strip("-") or "account"
    return f"{cfg.prefix}{safe}-{dt.datetime.fromtimestamp(start, dt.UTC):%Y%m%d%H}"


def _pool(snapshot: Snapshot, cfg: ReservationsConfig) -> tuple[int, int]:
    """Return (usable GPUs in the reservations' partition, GPUs per node)."""
    nodes = [n for n in snapshot.nodes
             if (not cfg.partition or cfg.partition in n.partitions) and not any(u in n.state for u in _UNUSABLE)]
    sizes = Counter(int(n.gpus_total) for n in nodes if n.gpus_total)
    per_node = sizes.most_common(1)[0][0] if sizes else cfg.gpus_per_node
    return sum(int(n.gpus_total or 0) for n in nodes), per_node


def _still_held(snapshot: Snapshot, account: str, at: float) -> int:
    """GPUs the account's running jobs will still hold at ``at`` (by their time limits; none: held)."""
    held = 0
    for j in snapshot.running_jobs():
        if j.account != account:
            continue
        end = (j.start_ts + j.time_limit_s) if j.start_ts is not None and j.time_limit_s else math.inf
        if end > at:
            held += j.gpu_count
    return held


def plan_reservations(snapshot: Snapshot, policy: Policy, now: float,
                      demand: Mapping[str, Mapping[float, tuple[float, float]]]) -> tuple[list[Proposal], list[str]]:
    """Return the reservations to propose now and notes on the peaks seen but not (yet) reserved for.

    :param demand: series key → hour → (forecast, upper bound), as :func:`gpu_cost.capacity.forecast.demand.demand_rows`.
    """
    cfg = policy.reservations
    notes: list[str] = []
    if not cfg.enabled:
        return [], ["reservations: disabled"]
    accounts = {k[len("account:"):]: v for k, v in demand.items() if k.startswith("account:")}
    if not accounts:
        return [], ["reservations: no per-account demand forecast"]
    capacity, per_node = _pool(snapshot, cfg)
    if capacity <= 0:
        return [], ["reservations: no usable node in the partition"]
    # each account's first peak: consecutive forecast hours short of what would be free for it
    peaks: list[tuple[float, str, list[tuple[float, float, float, float]]]] = []
    for account in sorted(accounts):
        if cfg.accounts and account not in cfg.accounts:
            continue
        hours = sorted(t for t in accounts[account] if now - HOUR < t <= now + cfg.horizon)
        short: list[tuple[float, float, float, float]] = []  # (hour, shortfall, upper, free)
        for t in hours:
            others = sum(v.get(t, (0.0, 0.0))[0] for a, v in accounts.items() if a != account)
            free = max(0.0, capacity - others)
            upper = accounts[account][t][1]
            if upper - free >= cfg.min_gpus:
                short.append((t, upper - free, upper, free))
        if not short:
            continue
        peak = [short[0]]
        for item in short[1:]:
            if item[0] - peak[-1][0] > HOUR + 1:
                break
            peak.append(item)
        peaks.append((max(x[1] for x in peak), account, peak))
    # nodes left to reserve: the pool's, less those reservations hold; the largest shortfall goes first
    left = capacity // per_node - sum(r.node_count for r in snapshot.reservations if r.end_ts > now)
    out: list[Proposal] = []
    for _worst, account, peak in sorted(peaks, key=lambda x: (-x[0], x[1])):
        first, end = peak[0][0], peak[-1][0] + HOUR
        start = max(first, now)
        covered = [r.name for r in snapshot.reservations
                   if r.name.startswith(cfg.prefix) and account in r.accounts and r.start_ts < end and r.end_ts > start]
        if covered:
            notes.append(f"{account}: peak from {iso(first)} already reserved ({', '.join(covered)})")
            continue
        need = max(u - _still_held(snapshot, account, t) for t, _s, u, _f in peak)
        nodes = min(cfg.max_nodes, math.ceil(need / per_node)) if need > 0 else 0
        if nodes <= 0 or nodes * per_node < cfg.min_gpus:
            notes.append(f"{account}: peak from {iso(first)}, but its running jobs hold what it needs")
            continue
        if first - cfg.lead > now:
            notes.append(f"{account}: peak from {iso(first)}; reservation proposed from {iso(first - cfg.lead)}")
            continue
        if left <= 0:
            notes.append(f"{account}: peak from {iso(first)}, but every node is reserved already")
            continue
        nodes = min(nodes, left)
        left -= nodes
        worst = max(peak, key=lambda x: x[1])
        out.append(Proposal(account=account, name=_name(cfg, account, first), start_ts=start, end_ts=end,
                            node_count=nodes, gpus=nodes * per_node, shortfall_gpus=worst[1],
                            peak_upper=max(x[2] for x in peak), free_gpus=worst[3], partition=cfg.partition,
                            hours=tuple(x[0] for x in peak)))
    return out, notes


def decisions_for(proposals: Sequence[Proposal], policy: Policy, now: float, mode: str, *,
                  degraded: bool = False, problems: Sequence[str] = ()) -> list[Decision]:
    """Return one ``reserve`` decision per proposal, through the guards every way in passes."""
    from gpu_cost.decide.engine import Ask, guard

    cfg = policy.reservations
    run_mode = milder(mode, cfg.mode) if cfg.mode else mode
    out = []
    for p in proposals:
        f = Finding(rule=RULE, target_kind="reservation", target=f"reservation:{p.name}", action="reserve",
                    gpus=p.gpus, account=p.account, partition=p.partition or None, user=None,
                    evidence=p.evidence())
        big = (f"{p.node_count} nodes, over reservations.approval_over_nodes {cfg.approval_over_nodes}",)
        v = guard(f, "reserve", policy, now=now, degraded=degraded, problems=problems,
                  ask=Ask(entry="power", mode=run_mode, approve=big if p.node_count > cfg.approval_over_nodes else ()))
        track = v.track
        out.append(Decision(
            decision_id=decision_id(RULE, f.target, 1, 0, track), ts=now, rule=RULE, target_kind="reservation",
            target=f.target, action=v.action, mode=v.mode, account=p.account, partition=p.partition or None,
            gpus=p.gpus, reason="; ".join([p.why(), *v.reasons]), protection=v.protection,
            requires_approval=v.requires_approval, evidence={**f.evidence, **v.evidence, "track": track},
        ))
    return out


#: how far a reservation's start may precede the ``reserve`` action that made it (clocks, Slurm's rounding)
START_SLACK_S = 120.0
#: how far its end may lie from the end the decision planned (``create_argv`` rounds the duration up to minutes)
END_SLACK_S = 300.0


def made_it(r: Reservation, rows: Sequence[Mapping[str, Any]]) -> bool:
    """Return whether one of the audit rows of the agent's ``reserve`` actions (query ``reservations_made``)
    made this very reservation: it began no earlier than the action and ends when its decision planned."""
    for row in rows:
        if row.get("target") != f"reservation:{r.name}":
            continue
        ev = row.get("evidence")
        try:
            planned = json.loads(ev) if isinstance(ev, str) else dict(ev or {})
            end = float(planned["end_ts"])
            started = float(row["started_at"])
        except (KeyError, TypeError, ValueError):
            continue
        if r.start_ts >= started - START_SLACK_S and abs(r.end_ts - end) <= END_SLACK_S:
            return True
    return False


def mark_own(store: AuditStore, snapshot: Snapshot, policy: Policy) -> None:
    """Set ``made_by_agent`` on the snapshot's reservations the agent made (:func:`made_it`), in place.

    Only names with ``reservations.prefix`` are looked up; the rest, and all of them when the audit
    store cannot be read, stay someone else's (never released without the policy's opt-in and a human).
    """
    from gpu_cost.core.errors import AuditError

    prefix = policy.reservations.prefix
    names = sorted({r.name for r in snapshot.reservations if prefix and r.name.startswith(prefix)})
    rows: list[dict[str, Any]] = []
    if names:
        try:
            rows = store.fetch("reservations_made", {"targets": [f"reservation:{n}" for n in names]})
        except AuditError as exc:
            logger.warning("the reservations the agent made were not read (each counts as someone else's): %s", exc)
    snapshot.reservations = tuple(dataclasses.replace(r, made_by_agent=r.name in names and made_it(r, rows))
                                  for r in snapshot.reservations)
