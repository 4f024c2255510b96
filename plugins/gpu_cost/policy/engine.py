"""Decide: findings + policy + escalation state → decisions. Pure: no I/O, no clock.

For each finding the engine applies, in order: snoozes (recorded once, nothing done);
protections (``never`` records only, ``notify_only`` removes destructive rungs, ``approval``
makes them need a human); inference services (advice only); the rule's escalation ladder (one
rung per wait and at most one per data instant, state per target and episode; notice rungs keep
to working hours when ``notifications.only_in_working_hours``); the mode (``dry-run`` records,
``notify`` holds destructive rungs back, ``enforce`` acts); degraded data (holds destructive
rungs back); the cost of being wrong (approval above a threshold); rejections (a decision a human
rejected is not asked again); and the per-run caps.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_cost.model import DESTRUCTIVE_ACTIONS, Decision, Finding, decision_id
from gpu_cost.policy.cost import stakes
from gpu_cost.policy.protections import protection_for
from gpu_cost.policy.schema import NotificationConfig, Policy, Rung

NOTICE_ACTIONS = frozenset({"advise", "notify", "notify_manager"})


def track_of(mode: str) -> str:
    """Return the escalation track of a mode: what dry-run pretends never moves a live ladder."""
    return "dry-run" if mode == "dry-run" else "live"


@dataclass(frozen=True)
class Opening:
    """An escalation episode to open (a target newly found wasteful)."""

    rule: str
    target: str
    track: str
    episode: int
    job_id: str | None
    user: str | None


@dataclass
class Plan:
    """The engine's output for one run."""

    decisions: list[Decision] = field(default_factory=list)
    openings: list[Opening] = field(default_factory=list)
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    closing: list[tuple[str, str, str]] = field(default_factory=list)
    waiting: list[dict[str, Any]] = field(default_factory=list)
    snoozed: list[str] = field(default_factory=list)
    #: one ``none`` decision per snooze and episode, so the audit shows what a snooze held back
    snooze_records: list[Decision] = field(default_factory=list)
    cap_violation: str | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "decisions": [d.summary() for d in self.decisions],
            "waiting": len(self.waiting),
            "snoozed": len(self.snoozed),
            "closed_episodes": len(self.closing),
            "cap_violation": self.cap_violation,
        }


def decide(
    findings: Sequence[Finding],
    policy: Policy,
    *,
    now: float,
    escalations: Mapping[tuple[str, str, str], Mapping[str, Any]],
    snoozed_targets: Mapping[str, float | Mapping[str, Any]] | None = None,
    degraded: bool = False,
    total_gpus: int = 0,
    predicted_end: Mapping[str, float] | None = None,
    rejected: Iterable[str] = (),
    awaiting: Mapping[str, str] | None = None,
) -> Plan:
    """Return the plan for one sweep.

    :param escalations: open and closed escalation rows keyed by ``(rule, target, track)``.
    :param snoozed_targets: snooze target (``job:1``, ``user:ann``, ``node:g1``...) → snoozed-until
        (epoch seconds) or the ``gpu_cost_snoozes`` row (until_ts, reason, created_by, snooze_id).
    :param degraded: the snapshot is incomplete; nothing destructive may act.
    :param predicted_end: job id → forecast p90 end (epoch seconds).
    :param rejected: decision ids a human rejected; they are not asked again.
    :param awaiting: decision id → run id, for decisions an earlier run asked a human about and
        that await the answer: not asked again, and the ladder waits on them (no later rung).
    """
    plan = Plan()
    snoozes = {k: _snooze_info(v) for k, v in (snoozed_targets or {}).items()}
    rejected_ids = set(rejected)
    awaiting = awaiting or {}
    found_keys: set[tuple[str, str, str]] = set()
    notes = policy.notifications
    for f in findings:
        mode = policy.rule_mode(f.rule)
        track = track_of(mode)
        key = (f.rule, f.target, track)
        found_keys.add(key)
        prot = protection_for(f, policy.protections)
        ladder = _ladder(f, policy, prot.level if prot else None)
        row = escalations.get(key)
        if row is None or row.get("state") != "open":
            episode = int(row["episode"]) + 1 if row else 1
            plan.openings.append(Opening(f.rule, f.target, track, episode, f.job_id, f.user))
            last_rung, ref, last_act = -1, now, None
        else:
            episode = int(row["episode"])
            last_rung = int(row["rung"])
            last_act = row.get("last_action_at")
            ref = float(last_act or row.get("first_seen") or now)
            plan.seen.append(key)
        snooze = _snoozed(f, snoozes, now)
        if snooze is not None:
            plan.snoozed.append(f.target)
            nxt = min(last_rung + 1, len(ladder) - 1)
            plan.snooze_records.append(_snooze_record(f, ladder[nxt], nxt, episode, mode, now, snooze))
            continue
        nxt = last_rung + 1
        if nxt >= len(ladder):
            plan.waiting.append({"target": f.target, "rule": f.rule, "why": "ladder complete"})
            continue
        if last_act is not None and now <= float(last_act):
            # a re-run for the same data instant never climbs a second rung
            plan.waiting.append({"target": f.target, "rule": f.rule, "why": "already acted at this instant"})
            continue
        rung = ladder[nxt]
        notice = rung.action in NOTICE_ACTIONS
        if notice and notes.only_in_working_hours:
            if not in_working_hours(now, notes):
                plan.waiting.append({"target": f.target, "rule": f.rule, "rung": nxt, "action": rung.action,
                                     "why": "outside working hours"})
                continue
            waited = working_seconds(ref, now, notes)
        else:
            waited = now - ref
        if waited < rung.after:
            plan.waiting.append({"target": f.target, "rule": f.rule, "rung": nxt, "action": rung.action,
                                 "due_in_s": round(rung.after - waited)})
            continue
        d = _decision(f, policy, rung, nxt, episode, mode, track, prot.name if prot else None,
                      prot.level if prot else None, now, degraded, (predicted_end or {}).get(f.job_id or ""))
        if d.decision_id in awaiting:
            plan.waiting.append({"target": f.target, "rule": f.rule, "rung": nxt, "action": rung.action,
                                 "why": f"awaiting approval (asked by run {awaiting[d.decision_id]})"})
            continue
        if d.decision_id in rejected_ids:
            plan.waiting.append({"target": f.target, "rule": f.rule, "rung": nxt, "action": rung.action,
                                 "why": "rejected by a human: not asked again in this episode"})
            continue
        plan.decisions.append(d)
    if not degraded:
        for key, row in escalations.items():
            if row.get("state") == "open" and key not in found_keys:
                plan.closing.append(key)
    plan.cap_violation = check_caps(plan.decisions, policy, total_gpus)
    return plan


def _snooze_info(value: float | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return {"until": float(value.get("until_ts", value.get("until", 0.0))), "reason": value.get("reason", ""),
                "by": value.get("created_by", value.get("by")), "id": value.get("snooze_id", value.get("id", ""))}
    return {"until": float(value), "reason": "", "by": None, "id": ""}


def snooze_keys(f: Finding) -> list[str]:
    """Return the snooze targets that cover a finding: itself, its job, its owner, its nodes."""
    keys = [f.target]
    if f.job_id and f.target_kind == "job":
        keys.append(f"job:{f.job_id}")
    if f.user:
        keys.append(f"user:{f.user}")
    hosts = set(f.nodes) | ({f.host} if f.host else set())
    keys.extend(f"node:{h}" for h in sorted(hosts))
    return keys


def _snoozed(f: Finding, snoozes: Mapping[str, dict[str, Any]], now: float) -> dict[str, Any] | None:
    best: dict[str, Any] | None = None
    for key in snooze_keys(f):
        s = snoozes.get(key)
        if s is not None and s["until"] > now and (best is None or s["until"] > best["until"]):
            best = {**s, "key": key}
    return best


def _snooze_record(f: Finding, rung: Rung, index: int, episode: int, mode: str, now: float,
                   snooze: Mapping[str, Any]) -> Decision:
    from gpu_cost.timeutil import iso

    by = f" by {snooze['by']}" if snooze.get("by") else ""
    why = f": {snooze['reason']}" if snooze.get("reason") else ""
    reason = (f"{_why(f)}; snoozed ({snooze['key']}) until {iso(snooze['until'])}{by}{why}; "
              f"held back: {rung.action}")
    track = f"snooze:{snooze.get('id') or snooze['key']}"
    evidence = dict(f.evidence)
    evidence.update({"gpu_ids": list(f.gpu_ids), "snooze": {k: snooze.get(k) for k in ("key", "until", "by", "reason", "id")},
                     "held_back": rung.action, "rule_mode": mode})
    return Decision(
        decision_id=decision_id(f.rule, f.target, episode, index, track), ts=now, rule=f.rule,
        target_kind=f.target_kind, target=f.target, action="none", mode="dry-run", rung=index, episode=episode,
        job_id=f.job_id, user=f.user, account=f.account, partition=f.partition, host=f.host, gpus=f.gpus,
        reason=reason, evidence=evidence,
    )


def _local(ts: float, tz: str) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, tz=zoneinfo.ZoneInfo(tz))


_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def _hours(cfg: NotificationConfig) -> tuple[int, int]:
    a, b = (p.strip() for p in cfg.working_hours.split("-"))
    return int(a[:2]) * 60 + int(a[3:]), int(b[:2]) * 60 + int(b[3:])


def _working_day(day: dt.date, cfg: NotificationConfig) -> bool:
    return _DAYS[day.weekday()] in cfg.working_days and day.isoformat() not in cfg.holidays


def in_working_hours(ts: float, cfg: NotificationConfig) -> bool:
    """Return True when ``ts`` falls in working hours (policy time zone, working days, not a holiday)."""
    local = _local(ts, cfg.timezone)
    start, end = _hours(cfg)
    minute = local.hour * 60 + local.minute + local.second / 60.0
    return _working_day(local.date(), cfg) and start <= minute < end


def working_seconds(a: float, b: float, cfg: NotificationConfig) -> float:
    """Return the working-hours seconds between instants ``a`` and ``b`` (0 when ``b <= a``)."""
    if b <= a:
        return 0.0
    tz = zoneinfo.ZoneInfo(cfg.timezone)
    start_m, end_m = _hours(cfg)
    day = _local(a, cfg.timezone).date()
    last = _local(b, cfg.timezone).date()
    total = 0.0
    while day <= last:
        if _working_day(day, cfg):
            midnight = dt.datetime(day.year, day.month, day.day, tzinfo=tz)
            w0 = (midnight + dt.timedelta(minutes=start_m)).timestamp()
            w1 = (midnight + dt.timedelta(minutes=end_m)).timestamp()
            total += max(0.0, min(b, w1) - max(a, w0))
        day += dt.timedelta(days=1)
    return total


def _ladder(f: Finding, policy: Policy, level: str | None) -> tuple[Rung, ...]:
    if level == "never":
        return (Rung("advise"),)  # recorded once per episode as "none" below
    rule = policy.rule(f.rule)
    ladder: tuple[Rung, ...] = rule.ladder
    if f.inference or f.action == "advise":
        ladder = tuple(r for r in ladder if r.action in NOTICE_ACTIONS)[:1] or (Rung("advise"),)
        ladder = (Rung("advise", ladder[0].after),)
    if level == "notify_only":
        ladder = tuple(r for r in ladder if r.action in NOTICE_ACTIONS) or (Rung("notify"),)
    if f.target_kind == "gpu":
        # no process to act on: a GPU target can only be reported
        ladder = tuple(r for r in ladder if r.action in NOTICE_ACTIONS) or (Rung("notify"),)
    return ladder


def _decision(f: Finding, policy: Policy, rung: Rung, index: int, episode: int, mode: str, track: str,
              protection: str | None, level: str | None, now: float, degraded: bool,
              predicted: float | None) -> Decision:
    action: str = rung.action
    reasons = [_why(f)]
    shadow = False
    if level == "never":
        action = "none"
        reasons.append(f"protected ({protection}): recorded only")
    destructive = action in DESTRUCTIVE_ACTIONS
    if destructive and mode == "notify":
        shadow = True
        reasons.append(f"mode notify: would {action}")
    if destructive and degraded:
        shadow = True
        reasons.append(f"degraded data: would {action}")
    st = stakes(f, now, predicted, policy.cost.open_ended)
    needs_approval = destructive and (level == "approval" or st.at_risk > policy.approval.gpu_hours_at_risk)
    if needs_approval:
        reasons.append(
            f"approval required ({'protection ' + str(protection) if level == 'approval' else f'{st.at_risk:.1f} GPU-h at risk'})"
        )
    eff_mode = "dry-run" if shadow else mode
    id_track = "shadow" if shadow else track
    evidence = dict(f.evidence)
    evidence.update({"gpu_ids": list(f.gpu_ids), "stakes_basis": st.basis, "track": id_track})
    if f.name:
        evidence["job_name"] = f.name
    return Decision(
        decision_id=decision_id(f.rule, f.target, episode, index, id_track), ts=now, rule=f.rule,
        target_kind=f.target_kind, target=f.target, action=action, mode=eff_mode, rung=index, episode=episode,
        job_id=f.job_id, user=f.user, account=f.account, partition=f.partition, host=f.host, gpus=f.gpus,
        reason="; ".join(reasons), protection=protection, requires_approval=needs_approval,
        gpu_hours_at_risk=round(st.at_risk, 3), gpu_hours_saved=round(st.saved, 3), evidence=evidence,
    )


def _why(f: Finding) -> str:
    ev = f.evidence
    if f.rule == "zombie":
        text = (f"{f.gpus} GPU(s) hold {ev.get('mem_min_mib')} MiB at ≤{ev.get('util_max')}% for "
                f"{int(ev.get('window_s', 0)) // 60} min with no running job")
        if ev.get("foreign_owner") and f.action == "advise":
            why = ("the node never signals uid 0" if ev["foreign_owner"] == "root"
                   else "rules.zombie.act_on_owners does not name it")
            text += f" — a {ev['foreign_owner']} process, not ours: reported only ({why})"
        return text
    if f.rule == "idle_allocation":
        text = (f"job {f.job_id}: all {f.gpus} allocated GPU(s) ≤{ev.get('util_max')}% for "
                f"{int(ev.get('window_s', 0)) // 60} min")
        if f.inference:
            text += f" — inference service ({ev.get('inference')}): advice only"
        return text
    if f.rule == "low_efficiency":
        return f"job {f.job_id}: mean utilisation {ev.get('util_mean')}% over {int(ev.get('window_s', 0)) // 60} min"
    return f"{f.rule} on {f.target}"


def check_caps(decisions: Sequence[Decision], policy: Policy, total_gpus: int) -> str | None:
    """Return why the acting decisions exceed a cap, or None."""
    acting = [d for d in decisions if d.acts and d.action not in ("none", "advise")]
    caps = policy.caps
    if len(acting) > caps.max_actions_per_run:
        return (f"{len(acting)} actions exceed caps.max_actions_per_run={caps.max_actions_per_run}; "
                "nothing acted this run (a bad policy or bad data is more likely than that much waste)")
    gpus = sum(d.gpus for d in acting if d.destructive)
    if total_gpus and gpus > caps.max_gpu_share * total_gpus:
        return (f"destructive actions would touch {gpus} of {total_gpus} GPUs ({gpus / total_gpus:.0%}), over "
                f"caps.max_gpu_share={caps.max_gpu_share:.0%}; nothing acted this run")
    return None
