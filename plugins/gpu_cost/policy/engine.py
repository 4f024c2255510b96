"""Decide: findings + policy + escalation state → decisions. Pure: no I/O, no clock.

For each finding the engine applies, in order: snoozes; protections (``never`` records only,
``notify_only`` removes destructive rungs, ``approval`` makes them need a human); inference
services (advice only); the rule's escalation ladder (one rung per wait, state per target and
episode); the mode (``dry-run`` records, ``notify`` holds destructive rungs back, ``enforce``
acts); degraded data (holds destructive rungs back); the cost of being wrong (approval above a
threshold); and the per-run caps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_cost.model import DESTRUCTIVE_ACTIONS, Decision, Finding, decision_id
from gpu_cost.policy.cost import stakes
from gpu_cost.policy.protections import protection_for
from gpu_cost.policy.schema import Policy, Rung

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
    snoozed_targets: Mapping[str, float] | None = None,
    degraded: bool = False,
    total_gpus: int = 0,
    predicted_end: Mapping[str, float] | None = None,
    rejected: Iterable[str] = (),
) -> Plan:
    """Return the plan for one sweep.

    :param escalations: open and closed escalation rows keyed by ``(rule, target, track)``.
    :param snoozed_targets: target → snoozed-until (epoch seconds).
    :param degraded: the snapshot is incomplete; nothing destructive may act.
    :param predicted_end: job id → forecast p90 end (epoch seconds).
    :param rejected: decision ids a human rejected; they are not asked again.
    """
    plan = Plan()
    snoozes = dict(snoozed_targets or {})
    rejected_ids = set(rejected)
    found_keys: set[tuple[str, str, str]] = set()
    for f in findings:
        mode = policy.rule_mode(f.rule)
        track = track_of(mode)
        key = (f.rule, f.target, track)
        found_keys.add(key)
        until = snoozes.get(f.target)
        if until is not None and until > now:
            plan.snoozed.append(f.target)
            plan.seen.append(key)
            continue
        prot = protection_for(f, policy.protections)
        ladder = _ladder(f, policy, prot.level if prot else None)
        row = escalations.get(key)
        if row is None or row.get("state") != "open":
            episode = int(row["episode"]) + 1 if row else 1
            plan.openings.append(Opening(f.rule, f.target, track, episode, f.job_id, f.user))
            last_rung, ref = -1, now
        else:
            episode = int(row["episode"])
            last_rung = int(row["rung"])
            ref = float(row.get("last_action_at") or row.get("first_seen") or now)
            plan.seen.append(key)
        nxt = last_rung + 1
        if nxt >= len(ladder):
            plan.waiting.append({"target": f.target, "rule": f.rule, "why": "ladder complete"})
            continue
        rung = ladder[nxt]
        if now - ref < rung.after:
            plan.waiting.append({"target": f.target, "rule": f.rule, "rung": nxt, "action": rung.action,
                                 "due_in_s": round(rung.after - (now - ref))})
            continue
        plan.decisions.append(
            _decision(f, policy, rung, nxt, episode, mode, track, prot.name if prot else None,
                      prot.level if prot else None, now, degraded, (predicted_end or {}).get(f.job_id or ""))
        )
    plan.decisions = [d for d in plan.decisions if d.decision_id not in rejected_ids]
    if not degraded:
        for key, row in escalations.items():
            if row.get("state") == "open" and key not in found_keys:
                plan.closing.append(key)
    plan.cap_violation = check_caps(plan.decisions, policy, total_gpus)
    return plan


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
    action = rung.action
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
    st = stakes(f, now, predicted)
    needs_approval = destructive and (level == "approval" or st.at_risk > policy.approval.gpu_hours_at_risk)
    if needs_approval:
        reasons.append(
            f"approval required ({'protection ' + str(protection) if level == 'approval' else f'{st.at_risk:.1f} GPU-h at risk'})"
        )
    eff_mode = "dry-run" if shadow else mode
    id_track = "shadow" if shadow else track
    evidence = dict(f.evidence)
    evidence.update({"gpu_ids": list(f.gpu_ids), "stakes_basis": st.basis})
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
        return (f"{f.gpus} GPU(s) hold {ev.get('mem_min_mib')} MiB at ≤{ev.get('util_max')}% for "
                f"{int(ev.get('window_s', 0)) // 60} min with no running job")
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
