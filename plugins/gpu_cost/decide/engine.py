"""Decide: findings + policy + escalation state → decisions. Pure: no I/O, no clock.

For each finding the engine applies, in order: an owner's "this is wrong" answer (the target is
left alone until it expires, then a new episode starts from the first rung); snoozes (recorded
once, nothing done; a snooze of anything the finding touches counts: :func:`target_keys`);
protections (``never`` records only, ``notify_only`` removes destructive rungs, ``approval``
makes them need a human); someone else's reservation (notices only, a release refused on every
way in, unless ``rules.idle_reservation.release_foreign`` names it: then a human approves);
processes that are not ours (root's, a system account's, a container's: advice only, a kill
refused on every way in, :mod:`gpu_cost.analyse.owners`);
inference services and jobs on shared GPUs (advice only; a destructive action on a shared GPU's
job is refused on every way in); a job the agent cannot classify with ambiguous evidence (notices
only; a manual request needs its owner or a second operator: :func:`unsure`); the rule's escalation ladder (one
rung per wait and at most one per data instant, state per target and episode; notice rungs keep
to working hours when ``notifications.only_in_working_hours``); the mode (``dry-run`` records,
``notify`` holds destructive rungs back, ``enforce`` acts); degraded data (holds destructive
rungs back); the cost of being wrong (approval above a threshold); the finding's confidence and the
verifier's score (approval below their minimums); rejections (a decision a human rejected is not
asked again); and the per-run caps.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_cost.analyse.owners import not_ours
from gpu_cost.config.schema import NotificationConfig, Policy, Protection, Rung, milder
from gpu_cost.core import registry
from gpu_cost.core.model import (
    DESTRUCTIVE_ACTIONS,
    FOREIGN,
    OPTED_IN,
    Decision,
    Finding,
    decision_id,
    reservation_standing,
)
from gpu_cost.core.perf import gc_paused
from gpu_cost.core.timeutil import iso
from gpu_cost.decide.cost import stakes
from gpu_cost.decide.protections import checks_of, most_restrictive, protection_for

#: the notices: every action the registry declares ``notice=True``
NOTICE_ACTIONS = registry.names(notice=True)


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
    #: what the run's problems must say about the planning (a verifier model refused)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "decisions": [d.summary() for d in self.decisions],
            "waiting": len(self.waiting),
            "snoozed": len(self.snoozed),
            "closed_episodes": len(self.closing),
            "cap_violation": self.cap_violation,
        }


@gc_paused()
@registry.steady()
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
    disputed: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
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
    :param disputed: ``(rule, target)`` → the latest "this is wrong" answer of the owner or their
        manager (:func:`gpu_cost.decide.answers.disputed`: ``ts``, ``until_ts``, ``answered_by``): the
        target is left alone until the answer expires (``snooze.max_duration`` after it at most);
        the episode it was given in is over, so the target's next decision opens a new episode.
    """
    plan = Plan()
    snoozes = {k: _snooze_info(v) for k, v in (snoozed_targets or {}).items()}
    rejected_ids = set(rejected)
    awaiting = awaiting or {}
    found_keys: set[tuple[str, str, str]] = set()
    notes = policy.notifications
    modes: dict[str, str] = {}  # rule → its effective mode, asked once per rule
    protections = checks_of(policy.protections)
    for f in findings:
        mode = modes.get(f.rule) or modes.setdefault(f.rule, policy.rule_mode(f.rule))
        track = track_of(mode)
        key = (f.rule, f.target, track)
        found_keys.add(key)
        prot = most_restrictive(f, protections)
        ladder = _ladder(f, policy, prot.level if prot else None)
        row = escalations.get(key)
        wrong = (disputed or {}).get((f.rule, f.target))
        if wrong is not None and now < dispute_until(wrong, policy):
            plan.waiting.append({"target": f.target, "rule": f.rule, "why": (
                f"answered 'this is wrong' by {wrong.get('answered_by') or 'the owner'}: left alone until "
                f"{iso(dispute_until(wrong, policy))}")})
            continue
        # an episode that was open when "this is wrong" came is over: the target starts again from the first rung
        ended = wrong is not None and row is not None and float(row.get("first_seen") or 0.0) <= float(wrong["ts"])
        if row is None or row.get("state") != "open" or ended:
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
        d = _decision(f, policy, rung, nxt, episode, prot, now, degraded, (predicted_end or {}).get(f.job_id or ""))
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


def dispute_until(answer: Mapping[str, Any], policy: Policy) -> float:
    """Return when a "this is wrong" answer stops holding its target: like a snooze, at most
    ``snooze.max_duration`` after it (the answer's own ``until_ts`` when sooner)."""
    latest = float(answer["ts"]) + policy.snooze.max_duration
    until = answer.get("until_ts")
    return min(latest, float(until)) if until is not None else latest


def target_keys(target: str, job_id: str | None, gpu_ids: Iterable[str]) -> list[str]:
    """Return the snooze keys of what a finding (or its decision) touches: its target, its job (a
    process's former job, too), its GPUs (``gpu:<host>:<index>``).

    An owner's "keep" snoozes these, and the engine holds a finding back when any of them is snoozed.
    """
    keys = [target]
    if job_id:
        keys.append(f"job:{job_id}")
    keys.extend(f"gpu:{g}" for g in gpu_ids)
    return list(dict.fromkeys(keys))


def snooze_keys(f: Finding) -> list[str]:
    """Return the snooze targets that cover a finding: what it touches (:func:`target_keys`), its owner, its nodes."""
    keys = target_keys(f.target, f.job_id, f.gpu_ids)
    if f.user:
        keys.append(f"user:{f.user}")
    hosts = set(f.nodes) | ({f.host} if f.host else set())
    keys.extend(f"node:{h}" for h in sorted(hosts))
    return keys


def _snoozed(f: Finding, snoozes: Mapping[str, dict[str, Any]], now: float) -> dict[str, Any] | None:
    if not snoozes:
        return None  # the usual sweep: nothing snoozed, nothing to look up
    best: dict[str, Any] | None = None
    for key in snooze_keys(f):
        s = snoozes.get(key)
        if s is not None and s["until"] > now and (best is None or s["until"] > best["until"]):
            best = {**s, "key": key}
    return best


def _snooze_record(f: Finding, rung: Rung, index: int, episode: int, mode: str, now: float,
                   snooze: Mapping[str, Any]) -> Decision:
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
    if f.inference or f.action == "advise" or f.evidence.get("shared"):
        ladder = tuple(r for r in ladder if r.action in NOTICE_ACTIONS)[:1] or (Rung("advise"),)
        ladder = (Rung("advise", ladder[0].after),)
    if level == "notify_only" or reservation_standing(f.target_kind, f.evidence) == FOREIGN:
        # someone else's reservation is theirs: its administrators are told, nothing more
        ladder = tuple(r for r in ladder if r.action in NOTICE_ACTIONS) or (Rung("notify"),)
    if unsure(f, policy):
        # a job the agent cannot classify: notices to its owner and manager, nothing more
        ladder = tuple(r for r in ladder if r.action in NOTICE_ACTIONS) or (Rung("notify"),)
    if f.target_kind == "gpu":
        # no process to act on: a GPU target can only be reported
        ladder = tuple(r for r in ladder if r.action in NOTICE_ACTIONS) or (Rung("notify"),)
    return ladder


def unsure(f: Finding, policy: Policy) -> str | None:
    """Return why the agent cannot tell whether job finding ``f`` is waste, or None when it can.

    A job whose kind is unknown (no class baseline, or a class neither service nor training,
    and not a service itself) with ambiguous evidence: memory resident on its idle GPUs (or not
    measured at all: nothing says they are empty) and a confidence under
    ``evidence.min_confidence``. Such a job gets notices to its owner and manager only; its
    owner's "release" answer, or an operator's manual request approved by a second operator, is
    the only way to a destructive action. A third party's approval of the agent's own
    recommendation is not enough when the agent is unsure.
    """
    ev = f.evidence
    if f.target_kind != "job" or (ev.get("mem_resident") is not True and ev.get("mem_measured") is not False):
        return None
    conf = ev.get("confidence")
    floor = policy.evidence.min_confidence
    if conf is None or float(conf) >= floor:
        return None
    klass = ev.get("class")
    klass = klass if isinstance(klass, Mapping) else {}
    if str(klass.get("kind") or "unknown") != "unknown" or klass.get("member_kind"):
        return None
    memory = "memory resident on idle GPUs" if ev.get("mem_resident") is True else "GPU memory not measured"
    return (f"the agent cannot classify it (kind unknown) and the evidence is ambiguous: {memory} "
            f"(a model may be waiting for requests), confidence {float(conf):.2f} under evidence.min_confidence "
            f"{floor:g}")


@dataclass(frozen=True)
class Ask:
    """What a way in asks of the engine for one target, beyond the finding.

    :param entry: ``sweep``, ``manual``, ``power`` or ``replay``.
    :param mode: the mode asked for (a manual request's dry-run or enforce); the policy's mode is
        the ceiling, so a request may be milder, never stronger. None: the policy's.
    :param requested_by: who asked (the Airflow user who triggered a manual run).
    :param override: a justification to act on a protected target (manual reclaim only).
    :param approve: why the way in itself wants a human to approve a destructive action, beyond what
        the guards find: the run is larger than its policy lets it act alone (``offhours`` /
        ``reservations.approval_over_nodes``), a protection of level ``approval`` the way in let
        through. Worded like every other approval (:func:`approval_reason`).
    """

    entry: str = "sweep"
    mode: str | None = None
    requested_by: str | None = None
    override: str | None = None
    approve: tuple[str, ...] = ()


@dataclass
class Verdict:
    """What the guards allow for one target: the effective action, mode and approval need."""

    action: str
    mode: str
    track: str
    requires_approval: bool
    reasons: list[str]
    protection: str | None
    level: str | None
    refusal: str | None
    stakes_at_risk: float
    stakes_saved: float
    evidence: dict[str, Any]
    #: why a destructive action is only recorded (the mode's ceiling, ``notify``, degraded data, the
    #: verifier's wait), the first such reason; None when nothing holds it back
    held: str | None = None


def approval_reason(why: str, *, asked: bool) -> str:
    """Return how a decision's reason states an approval it needs, from the flag the decision carries.

    ``approval required (why)`` only on a decision that waits for a human (``requires_approval``);
    ``would need approval (why)`` on one that acts on nothing (dry-run, held back, refused), as its
    action reads ``would cancel``: the reason and the flag cannot disagree.
    """
    return f"approval required ({why})" if asked else f"would need approval ({why})"


def guard(f: Finding, action: str, policy: Policy, *, now: float, ask: Ask = Ask(), degraded: bool = False,
          problems: Sequence[str] = (), predicted: float | None = None, inference: str | None = None) -> Verdict:
    """Apply the guards every way in passes, in one order, to ``action`` on finding ``f``.

    Protections (``never`` records only; ``notify_only`` refuses destructive actions; ``approval``
    asks a human; a manual override keeps the action but needs an approver who is not the
    requester), who may ask (manual: the owner of the target or a named operator for destructive
    actions), whose a reservation is (someone else's is never released or shrunk; one that
    ``rules.idle_reservation.release_foreign`` names only with a human's approval), a process that is
    not ours (never killed: :func:`gpu_cost.analyse.owners.not_ours`), inference services (destructive actions need a human), the mode (the policy's, or
    the rule's when milder, is the ceiling: ``notify`` holds destructive actions back and
    ``dry-run`` records only), degraded data (holds destructive actions back), the cost of
    being wrong (approval above ``approval.gpu_hours_at_risk``), the finding's confidence
    (approval below ``evidence.min_confidence``) and the verifier's chance that it is waste, when
    the sweep scored it (approval below ``verifier.min_probability``).
    """
    return _guarded(f, action, policy, protection_for(f, policy.protections), now=now, ask=ask, degraded=degraded,
                    problems=problems, predicted=predicted, inference=inference)


def _guarded(f: Finding, action: str, policy: Policy, prot: Protection | None, *, now: float, ask: Ask = Ask(),
             degraded: bool = False, problems: Sequence[str] = (), predicted: float | None = None,
             inference: str | None = None) -> Verdict:
    """:func:`guard` with the finding's protection already looked up (:func:`decide` has, for its ladder)."""
    reasons: list[str] = []
    evidence: dict[str, Any] = {}
    refusal: str | None = None
    held: str | None = None
    # the approvals the action needs: (where in reasons, what leads the sentence, why); their
    # sentences are written at the end, from the flag (approval_reason)
    asks: list[tuple[int, str, str]] = []

    def need_approval(why: str, lead: str = "") -> None:
        if any(a[1] == lead and a[2] == why for a in asks):
            return  # one sentence per reason (a protection the guards and the way in both name)
        asks.append((len(reasons), lead, why))
        reasons.append("")
    destructive = action in DESTRUCTIVE_ACTIONS
    level = prot.level if prot else None
    manual = ask.entry == "manual"
    if prot is not None and (level == "never" or (level == "notify_only" and destructive)):
        if manual and ask.override:
            approvers = [u for u in policy.manual.override_approvers if u != ask.requested_by]
            if not approvers:
                refusal = (f"protected by {prot.name!r} ({level}); an override needs an approver from "
                           "manual.override_approvers who is not the requester, and the policy names none")
                action = "none"
            else:
                evidence["override"] = {"protection": prot.name, "level": level, "by": ask.requested_by,
                                        "justification": ask.override}
                evidence["approvers"] = approvers
                reasons.append(f"protection {prot.name!r} ({level}) OVERRIDDEN by {ask.requested_by or 'an operator'}: "
                               f"{ask.override}")
                need_approval(f"a second person: {', '.join(approvers)}")
        elif manual:
            refusal = (f"protected by {prot.name!r} ({level}); not acted on — set override_protections "
                       "with a justification to override")
            action = "none"
        else:
            action = "none"
            reasons.append(f"protected ({prot.name}): recorded only")
        if refusal:
            reasons.append(refusal)
    elif prot is not None and level == "approval" and destructive:
        need_approval(f"protection {prot.name}")
    destructive = action in DESTRUCTIVE_ACTIONS
    if manual and destructive:
        who = ask.requested_by
        owner = bool(who) and policy.manual.owners_may_reclaim and f.user == who
        if not who:
            refusal = ("a destructive action needs a requester the scheduler knows (the Airflow user who "
                       "triggered the run); none was given: not acted on")
        elif not (owner or who in policy.manual.operators):
            refusal = (f"{who} may not {action} {f.target}: only its owner ({f.user or 'unknown'}) or one of "
                       "manual.operators may ask for a destructive action")
        if refusal:
            reasons.append(refusal)
            action, destructive = "none", False
    doubt = unsure(f, policy) if destructive else None
    if doubt is not None:
        evidence["unsure"] = doubt
        requester = ask.requested_by
        if not manual:
            # the agent's own recommendation on a job it cannot classify: nobody's approval makes it act
            refusal = f"{doubt}: notices to its owner and manager only, never {action} on the agent's word"
            reasons.append(refusal)
            action, destructive = "none", False
        elif not (requester and policy.manual.owners_may_reclaim and f.user == requester):
            # four eyes: an operator's request on a job the agent cannot classify needs a second operator
            approvers = [u for u in dict.fromkeys((*policy.manual.operators, *policy.manual.override_approvers))
                         if u != requester]
            if not approvers:
                refusal = (f"{doubt}: an operator's {action} needs a second operator (manual.operators or "
                           "manual.override_approvers, not the requester) to approve, and the policy names none")
                reasons.append(refusal)
                action, destructive = "none", False
            else:
                evidence.setdefault("approvers", approvers)
                need_approval(f"a second operator: {', '.join(evidence['approvers'])}", lead=f"{doubt}: ")
    whose = reservation_standing(f.target_kind, f.evidence) if destructive else None
    if whose == FOREIGN:
        # only the agent's own reservations (its name prefix and its audit row) are released on its word
        refusal = (f"{f.target} is someone else's reservation (not proven the agent's own): never released or "
                   "shrunk by the agent unless rules.idle_reservation.release_foreign names it")
        reasons.append(refusal)
        action, destructive = "none", False
    elif whose == OPTED_IN:
        need_approval("someone else's reservation, named in rules.idle_reservation.release_foreign")
    withheld = not_ours(f.evidence) if destructive else None
    if withheld is not None:
        # a process of root, a system account or a container (the zombie rule's own verdict): never
        # acted on, whoever asks, protections overridden or not
        refusal = withheld
        reasons.append(withheld)
        action, destructive = "none", False
    if destructive and f.evidence.get("shared"):
        # several jobs on one device: its utilisation is no single job's, so nothing is done to one of
        # them because of it, whoever asks (the finding's evidence names the sharers)
        refusal = str(f.evidence.get("refused") or "its GPU is shared with other jobs: never acted on")
        reasons.append(refusal)
        action, destructive = "none", False
    if inference and destructive:
        evidence["inference"] = inference
        need_approval(f"looks like an inference service: {inference}")
    if destructive:
        for why in ask.approve:
            need_approval(why)
    ceiling = policy.rule_mode(f.rule) if not manual else policy.mode
    mode = milder(ceiling, ask.mode) if ask.mode else ceiling
    if ask.mode and mode != ask.mode:
        held = f"asked for {ask.mode}, the policy's mode {ceiling} is the ceiling"
        reasons.append(held)
    shadow = False
    if destructive and mode == "notify":
        shadow = True
        reasons.append(f"mode notify: would {action}")
        held = held or reasons[-1]
    if destructive and degraded:
        shadow = True
        why = f" ({'; '.join(problems)})" if problems else ""
        reasons.append(f"degraded data{why}: would {action}")
        held = held or reasons[-1]
    st = stakes(f, now, predicted, policy.cost.open_ended)
    if destructive and st.at_risk > policy.approval.gpu_hours_at_risk:
        need_approval(f"{st.at_risk:.1f} GPU-h at risk")
    conf = f.evidence.get("confidence")
    # the agent's own confidence in its finding; a manual request is a person's, judged above (unsure)
    if destructive and not manual and conf is not None and float(conf) < policy.evidence.min_confidence:
        need_approval(f"confidence {float(conf):.2f} is below evidence.min_confidence "
                      f"{policy.evidence.min_confidence:g}")
    ver = f.evidence.get("verifier")
    p_waste = ver.get("p_waste") if isinstance(ver, Mapping) else None
    if destructive and p_waste is not None and policy.verifier.enabled and \
            float(p_waste) < policy.verifier.min_probability:
        # a second opinion learnt from outcomes: it may hold an action back, never cause one
        doubt = (f"the verifier {ver.get('model') or ''} gives a {float(p_waste):.2f} chance of waste, "  # type: ignore[union-attr]
                 f"below verifier.min_probability {policy.verifier.min_probability:g}")
        if policy.verifier.on_doubt == "wait":
            shadow = True
            reasons.append(f"{doubt}: waits (would {action})")
            held = held or reasons[-1]
        else:
            need_approval(doubt)
    eff_mode = "dry-run" if shadow else mode
    track = "shadow" if shadow else track_of(mode)
    evidence["stakes_basis"] = st.basis
    # a human is asked only where something would act; the reason's wording follows this one flag
    requires_approval = bool(asks) and action != "none" and eff_mode != "dry-run"
    for at, lead, why in asks:
        reasons[at] = lead + approval_reason(why, asked=requires_approval)
    return Verdict(action=action, mode=eff_mode, track=track, requires_approval=requires_approval,
                   reasons=reasons, protection=prot.name if prot else None, level=level, refusal=refusal,
                   stakes_at_risk=st.at_risk, stakes_saved=st.saved, evidence=evidence,
                   held=held if destructive and eff_mode == "dry-run" else None)


def identity_of(f: Finding) -> dict[str, Any]:
    """Return what identifies the target besides its id, for the executors' re-check before the effect.

    A job: its name and start time (the owner is the decision's ``user``); a process carries its
    PID, start time and GPU in the finding's evidence already.
    """
    out: dict[str, Any] = {}
    if f.name:
        out["job_name"] = f.name
    if f.target_kind == "job" and f.job_start_ts is not None:
        out["job_start_ts"] = float(f.job_start_ts)
    return out


def _decision(f: Finding, policy: Policy, rung: Rung, index: int, episode: int, prot: Protection | None,
              now: float, degraded: bool, predicted: float | None) -> Decision:
    v = _guarded(f, rung.action, policy, prot, now=now, degraded=degraded, predicted=predicted)
    evidence = {**f.evidence, **v.evidence, "gpu_ids": list(f.gpu_ids), "track": v.track, **identity_of(f)}
    doubt = unsure(f, policy)
    if doubt is not None:
        # the notice says why the agent is unsure, and that only the owner's release goes further
        evidence["unsure"] = doubt
        v.reasons.append(f"notices only: {doubt}")
    if f.target_kind == "job" and f.time_limit_s:
        evidence.setdefault("time_limit_s", float(f.time_limit_s))  # the savings ledger's "end it would have had"
    return Decision(
        decision_id=decision_id(f.rule, f.target, episode, index, v.track), ts=now, rule=f.rule,
        target_kind=f.target_kind, target=f.target, action=v.action, mode=v.mode, rung=index, episode=episode,
        job_id=f.job_id, user=f.user, account=f.account, partition=f.partition, host=f.host, gpus=f.gpus,
        reason="; ".join([_why(f), *v.reasons]), protection=v.protection, requires_approval=v.requires_approval,
        gpu_hours_at_risk=round(v.stakes_at_risk, 3), gpu_hours_saved=round(v.stakes_saved, 3), evidence=evidence,
    )


def _why(f: Finding) -> str:
    """The decision's reason for a finding: its rule's registered ``why``."""
    return registry.why(f)


def touches_work(action: str) -> bool:
    """Return True for a destructive action on running work (a job, a process): its GPUs count in the
    GPU-share caps. Powering down an idle node touches no work; ``offhours.max_nodes_per_run`` and the
    warm reserve bound it, and it counts in the rolling action caps."""
    spec = registry.action(action)
    return spec is not None and spec.touches_work


def check_caps(decisions: Sequence[Decision], policy: Policy, total_gpus: int) -> str | None:
    """Return why the acting decisions of one run exceed a cap, or None.

    A run with destructive decisions on a cluster of unknown size is refused: the GPU-share cap
    cannot be checked (``caps.cluster_gpus`` names the size when snapshots cannot).
    """
    acting = [d for d in decisions if d.acts and d.action not in ("none", "advise")]
    caps = policy.caps
    if len(acting) > caps.max_actions_per_run:
        return (f"{len(acting)} actions exceed caps.max_actions_per_run={caps.max_actions_per_run}; "
                "nothing acted this run (a bad policy or bad data is more likely than that much waste)")
    gpus = sum(d.gpus for d in acting if touches_work(d.action))
    total_gpus = total_gpus or caps.cluster_gpus
    if gpus and not total_gpus:
        return ("destructive actions on a cluster of unknown size (no GPUs in the snapshot, caps.cluster_gpus "
                "unset): the GPU-share cap cannot be checked; nothing acted this run")
    if total_gpus and gpus > caps.max_gpu_share * total_gpus:
        return (f"destructive actions would touch {gpus} of {total_gpus} GPUs ({gpus / total_gpus:.0%}), over "
                f"caps.max_gpu_share={caps.max_gpu_share:.0%}; nothing acted this run")
    return None


#: decision statuses an act step may carry out (``acted``: the dispatcher knows it is done and does not
#: repeat it; ``failed``: it retries, bounded)
ACTABLE_STATUSES = frozenset({"decided", "failed", "acted"})


def may_act(row: Mapping[str, Any], *, approved_only: bool = False) -> bool:
    """Return whether a stored decision row may be carried out: live, acting, not refused, approved if asked.

    :param approved_only: only decisions that needed a human and got an *Approve*.
    """
    if row["mode"] == "dry-run" or row["action"] == "none" or row["status"] not in ACTABLE_STATUSES:
        return False
    if approved_only:
        return bool(row["requires_approval"]) and row["approval_status"] == "approved"
    return not row["requires_approval"] or row["approval_status"] == "approved"


#: the entry point of each DAG, for the per-entry rolling caps (``replay``: the sweep, replayed over a trace)
ENTRY_OF_DAG = {"gpu_zombie_sweep": "sweep", "gpu_manual_reclaim": "manual", "gpu_offhours_power": "power",
                "replay": "sweep"}


def entry_of(run_id: str | None) -> str:
    """Return the way in of an audit run id (``<dag_id>:<run>``): sweep, manual, power, or other."""
    dag_id = (run_id or "").split(":", 1)[0]
    return ENTRY_OF_DAG.get(dag_id, "other")


def rolling_cap_violation(history: Iterable[Mapping[str, Any]], d: Decision, policy: Policy, *, entry: str,
                          total_gpus: int, now: float) -> str | None:
    """Return why one more destructive action ``d`` would exceed a rolling cap, or None.

    :param history: the destructive, non-dry-run actions started in the last day by every way in
        (``started_at`` epoch seconds, ``gpus``, ``entry``, ``target``), not counting ``d``'s own row.
    """
    caps = policy.caps
    total_gpus = total_gpus or caps.cluster_gpus
    rows = [(float(r["started_at"]), int(r.get("gpus") or 0), str(r.get("entry") or "other"), str(r.get("target")),
             str(r.get("action")))
            for r in history]
    scopes: list[tuple[str, Any, list[tuple[float, int, str, str, str]]]] = [("caps.rolling", caps.rolling, rows)]
    if entry in caps.entry_points:
        scopes.append((f"caps.entry_points.{entry}", caps.entry_points[entry], [r for r in rows if r[2] == entry]))
    for name, limits, scoped in scopes:
        for span, seconds, max_actions, max_share in (
                ("hour", 3600.0, limits.max_actions_per_hour, limits.max_gpu_share_per_hour),
                ("day", 86400.0, limits.max_actions_per_day, limits.max_gpu_share_per_day)):
            recent = [r for r in scoped if r[0] > now - seconds]
            if len(recent) + 1 > max_actions:
                return (f"cap: {len(recent)} destructive action(s) in the last {span} already reach "
                        f"{name}.max_actions_per_{span}={max_actions}")
            # GPUs touched: each target once (a ladder's terminate then kill is one job's GPUs). An unknown
            # cluster size was refused by the run's own cap check (check_caps) before anything got here
            touched = {r[3]: r[1] for r in recent if r[3] != d.target and touches_work(r[4])}
            gpus = sum(touched.values()) + (d.gpus if touches_work(d.action) else 0)
            if total_gpus and gpus > max_share * total_gpus:
                return (f"cap: destructive actions in the last {span} would touch {gpus} of {total_gpus} GPUs, over "
                        f"{name}.max_gpu_share_per_{span}={max_share:.0%}")
    return None
