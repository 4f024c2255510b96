"""Manual reclaim: an operator's request, checked by the same policy as the sweep, turned into decisions.

The ``gpu_manual_reclaim`` DAG (and anyone calling this module) goes through four steps:

1. :func:`parse_request` validates the form: target kind, ids (job ids digits/underscore or a SLUID, node
   names hostname-safe, user names POSIX-safe, processes ``node:pid``), the action for that kind,
   a reason, dry-run, and an explicit protection override with its justification. Anything else
   is refused with a message naming the field and the value.
2. :func:`plan` resolves the ids against a fresh snapshot (a job must exist, a process must still
   be on its node, a node to power down must carry no job) and applies the policy: protections
   (``never`` records only, ``notify_only`` refuses destructive actions, ``approval`` asks a
   human) unless overridden — an override is recorded in the decision's reason and evidence and
   always needs a second person's approval —, services by the sweep's own verdict (declared, bursty,
   recognised by their class baseline, or a spare replica of a serving set:
   :func:`gpu_cost.analyse.rules.common.service_verdict`; destructive actions need approval), a job
   the agent cannot classify (its owner's request acts, an operator's needs a second operator's
   approval: :func:`gpu_cost.decide.engine.unsure`), a process that is not ours (root's,
   a system account's, a container's: never killed unless ``rules.zombie.act_on_owners`` names it,
   the sweep's own verdict, :mod:`gpu_cost.analyse.owners`), the cost of being wrong (approval above
   ``approval.gpu_hours_at_risk``), degraded data (nothing destructive) and the per-run caps.
3. The decisions are recorded, approved where needed, and dispatched by the same executors and
   audit trail as the sweep (:func:`gpu_cost.act.dispatch.execute`).

Decision ids are derived from the DAG run and its params, so a retried or cleared run finds its
own audit rows and never acts twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_cost.core import registry
from gpu_cost.core.errors import GpuCostError

if TYPE_CHECKING:  # imported where used: the manual reclaim DAG reads this module's form constants at parse time
    from gpu_cost.config.schema import Policy
    from gpu_cost.core.model import Decision, Finding, Job, Snapshot

logger = logging.getLogger(__name__)

RULE = "manual"
TARGET_KINDS = ("job", "node", "user", "process")
#: the actions the form offers (declared ``form=True`` in the registry), and those for each target kind
FORM_ACTIONS = registry.names(form=True)
ACTIONS_BY_KIND = registry.by_kind(TARGET_KINDS, form=True)
MIN_REASON = 10
MAX_TARGETS = 50

#: what the form accepts for any id (the union of the per-kind syntaxes below): no spaces, quotes
#: or shell characters ever reach a task
ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}$"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = rf"{_LABEL}(?:\.{_LABEL})*"
KIND_PATTERNS = {
    "job": (re.compile(r"^(?:[0-9]+(?:_[0-9]+)?|s[0-9a-hjkmnp-tv-z]{13})$"),
            "a Slurm job id: digits, digits_digits for an array task, or a SLUID (s and 13 base32 digits)"),
    "node": (re.compile(rf"^(?=.{{1,253}}$){_HOST}$"), "a hostname: letters, digits, '-' and '.'"),
    "user": (re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$"), "a user name: letters, digits, '_', '.', '-'"),
    "process": (re.compile(rf"^(?=.{{1,260}}$)({_HOST}):([0-9]{{1,7}})$"), "node:pid, e.g. gpu01:4242"),
}
MAX_PID = 4_194_304


class ReclaimRequestError(GpuCostError):
    """A manual reclaim request is malformed or cannot be carried out; nothing was done."""


@dataclass(frozen=True)
class Request:
    """A validated manual reclaim request.

    :param override_protections: act on protected targets too; needs ``override_justification``
        and always a second person's approval.
    """

    target_kind: str
    target_ids: tuple[str, ...]
    action: str
    reason: str
    dry_run: bool = True
    override_protections: bool = False
    override_justification: str = ""
    requested_by: str | None = None

    def fingerprint(self) -> str:
        """Return a stable digest of what was asked (not who asked, nor when)."""
        data = json.dumps([self.target_kind, sorted(self.target_ids), self.action, self.reason, self.dry_run,
                           self.override_protections, self.override_justification], ensure_ascii=True)
        return hashlib.sha256(data.encode()).hexdigest()[:16]


@dataclass
class ReclaimPlan:
    """The decisions of one manual run, and what was refused."""

    decisions: list[Decision] = field(default_factory=list)
    refused: list[dict[str, str]] = field(default_factory=list)
    cap_violation: str | None = None

    @property
    def needs_approval(self) -> bool:
        return any(needs_approval(d) for d in self.decisions)


def parse_request(params: Mapping[str, Any], requested_by: str | None = None) -> Request:
    """Validate the form's params; raise :class:`ReclaimRequestError` naming every problem."""
    problems: list[str] = []
    kind = str(params.get("target_kind") or "")
    if kind not in TARGET_KINDS:
        problems.append(f"target_kind: {kind!r} is not one of {', '.join(TARGET_KINDS)}")
    raw_ids = params.get("target_ids")
    if isinstance(raw_ids, str):
        raw_ids = [raw_ids]
    if not isinstance(raw_ids, Sequence) or not raw_ids:
        problems.append("target_ids: give at least one id")
        raw_ids = []
    ids: list[str] = []
    for raw in raw_ids:
        for item in str(raw).replace(",", "\n").splitlines():
            item = item.strip()
            if item:
                ids.append(item)
    if len(ids) > MAX_TARGETS:
        problems.append(f"target_ids: {len(ids)} ids, at most {MAX_TARGETS} per run")
    if kind in KIND_PATTERNS:
        pattern, what = KIND_PATTERNS[kind]
        for item in ids:
            m = pattern.match(item)
            if not m:
                problems.append(f"target_ids: {item!r} is not {what}")
            elif kind == "process" and not 1 <= int(m.group(2)) <= MAX_PID:
                problems.append(f"target_ids: {item!r}: pid must be between 1 and {MAX_PID}")
    action = str(params.get("action") or "")
    if action not in FORM_ACTIONS:
        problems.append(f"action: {action!r} is not one of {', '.join(FORM_ACTIONS)}")
    elif kind in ACTIONS_BY_KIND and action not in ACTIONS_BY_KIND[kind]:
        problems.append(f"action: {action} does not apply to a {kind} (use {', '.join(ACTIONS_BY_KIND[kind])})")
    reason = " ".join(str(params.get("reason") or "").split())
    if len(reason) < MIN_REASON:
        problems.append(f"reason: say why in at least {MIN_REASON} characters (it is recorded and shown to the owner)")
    dry_run = params.get("dry_run", True)
    override = params.get("override_protections", False)
    for name, value in (("dry_run", dry_run), ("override_protections", override)):
        if not isinstance(value, bool):
            problems.append(f"{name}: must be true or false, not {value!r}")
    justification = " ".join(str(params.get("override_justification") or "").split())
    if override is True and len(justification) < MIN_REASON:
        problems.append(f"override_justification: overriding protections needs a justification of at least "
                        f"{MIN_REASON} characters")
    if problems:
        raise ReclaimRequestError("manual reclaim refused before any action:\n- " + "\n- ".join(problems))
    return Request(target_kind=kind, target_ids=tuple(dict.fromkeys(ids)), action=action, reason=reason,
                   dry_run=bool(dry_run), override_protections=bool(override),
                   override_justification=justification if override else "", requested_by=requested_by)


def run_mode(request: Request, policy: Policy) -> str:
    """Return the mode a request runs in: what it asks for, under the policy's mode as the ceiling."""
    from gpu_cost.config.schema import milder

    return milder(policy.mode, "dry-run" if request.dry_run else "enforce")


def manual_decision_id(run_key: str, request: Request, target: str, track: str | None = None) -> str:
    """Return the decision id: the same run, params and target always give the same id."""
    track = track or ("dry-run" if request.dry_run else "live")
    raw = f"{RULE}|{run_key}|{request.fingerprint()}|{target}|{request.action}|{track}".encode()
    return hashlib.sha256(raw).hexdigest()[:20]


def plan(request: Request, policy: Policy, snapshot: Snapshot, *, now: float, run_key: str) -> ReclaimPlan:
    """Resolve the request's targets in ``snapshot`` and decide under ``policy``.

    Unknown targets raise :class:`ReclaimRequestError` (nothing is done); protected ones are
    recorded with action ``none`` unless the request overrides protections.
    """
    from gpu_cost.decide.engine import check_caps

    findings, unknown = resolve(request, snapshot, policy)
    if unknown:
        raise ReclaimRequestError("manual reclaim refused before any action:\n- " + "\n- ".join(unknown))
    out = ReclaimPlan()
    for f in findings:
        d, refusal = _decide(f, request, policy, snapshot, now, run_key)
        out.decisions.append(d)
        if refusal:
            out.refused.append({"target": f.target, "why": refusal})
    out.cap_violation = check_caps(out.decisions, policy, snapshot.gpu_count())
    if out.cap_violation:
        raise ReclaimRequestError(f"manual reclaim refused before any action: {out.cap_violation}")
    return out


def resolve(request: Request, snap: Snapshot, policy: Policy | None = None) -> tuple[list[Finding], list[str]]:
    """Return one finding per concrete target, and why any id could not be resolved (or may not be acted on)."""
    from gpu_cost.analyse.owners import owner_evidence
    from gpu_cost.config.schema import Policy
    from gpu_cost.core.model import DESTRUCTIVE_ACTIONS, Finding

    findings: list[Finding] = []
    unknown: list[str] = []
    power_nodes: list[str] = []
    running = {j.job_id: j for j in snap.jobs if j.running or j.pending}
    destructive = request.action in DESTRUCTIVE_ACTIONS
    for ident in request.target_ids:
        if request.target_kind == "job":
            job = running.get(ident)
            if job is None:
                unknown.append(f"job {ident}: not running or pending in the current snapshot ({snap.source})")
            else:
                findings.append(_job_finding(job, request.action))
        elif request.target_kind == "user":
            jobs = [j for j in snap.jobs if j.user == ident and (j.running or j.pending)]
            if not jobs:
                unknown.append(f"user {ident}: has no running or pending job in the current snapshot")
            elif request.action == "notify":
                findings.append(Finding(rule=RULE, target_kind="user", target=f"user:{ident}", action="notify",
                                        gpus=sum(j.gpu_count for j in jobs), user=ident,
                                        evidence={"jobs": [j.job_id for j in jobs]}))
            else:
                findings.extend(_job_finding(j, request.action) for j in jobs)
        elif request.target_kind == "node":
            node = next((n for n in snap.nodes if n.name == ident), None)
            jobs = [j for j in snap.jobs if j.running and ident in ({h for h, _ in j.gpu_alloc} | set(j.nodes))]
            if node is None:
                unknown.append(f"node {ident}: not in the current snapshot")
            elif request.action == "power_down":
                if jobs:
                    unknown.append(f"node {ident}: runs job(s) {', '.join(j.job_id for j in jobs)}; "
                                   "cancel or wait for them before powering it down")
                else:
                    power_nodes.append(ident)
            elif not jobs:
                unknown.append(f"node {ident}: no running job there, nobody to notify")
            else:
                findings.extend(_job_finding(j, "notify") for j in jobs)
        else:
            host, _, pid_text = ident.rpartition(":")
            entries = [p for p in snap.processes if p.host == host and p.pid == int(pid_text)]
            proc = entries[0] if entries else None  # one entry per GPU the process holds
            if proc is None:
                unknown.append(f"process {ident}: not seen on a GPU of {host} in the current snapshot")
                continue
            job = running.get(proc.job_id or "")
            if job is not None and job.running and destructive:
                unknown.append(f"process {ident}: belongs to running job {job.job_id}; act on the job instead")
                continue
            ev = {"pid": proc.pid, "process_start_ts": proc.start_ts, "gpu_uuid": proc.gpu_uuid,
                  "gpu_uuids": sorted({p.gpu_uuid for p in entries if p.gpu_uuid}),
                  "process_mem_mib": sum(p.used_mib for p in entries), "process_name": proc.name,
                  "former_job": proc.job_id,
                  # whose it is, as the sweep judges it: root's, a system account's or a container's
                  # is refused by the guard (gpu_cost.analyse.owners)
                  **owner_evidence(proc, (policy or Policy()).rules.zombie)}
            gpu_ids = tuple(sorted({f"{host}:{p.gpu}" for p in entries if p.gpu is not None}))
            findings.append(Finding(rule=RULE, target_kind="process", target=proc.key, action=request.action,
                                    gpus=max(1, len(gpu_ids)),
                                    user=proc.user or None, host=host, gpu_ids=gpu_ids, job_id=proc.job_id,
                                    nodes=(host,), evidence=ev))
    if power_nodes:
        findings.extend(_power_findings(request, power_nodes, snap, policy, unknown))
    return findings, unknown


def _power_findings(request: Request, names: list[str], snap: Snapshot, policy: Policy | None,
                    unknown: list[str]) -> list[Finding]:
    """Vet a manual power-down by the off-hours path's own checks (idle, exclusions, protections,
    warm reserve, ``offhours.max_nodes_per_run``); append why a node may not go to ``unknown``."""
    from gpu_cost.capacity.offhours import vet_power_down
    from gpu_cost.config.schema import Policy
    from gpu_cost.core.model import Finding

    chosen, refused = vet_power_down(snap, policy or Policy(), snap.ts, names,
                                     override_protections=request.override_protections)
    unknown.extend(f"node {name}: {why}" for name, why in refused.items())
    nodes = {n.name: n for n in snap.nodes}
    return [Finding(rule=RULE, target_kind="node", target=f"node:{c.node}", action="power_down", gpus=c.gpus,
                    host=c.node, nodes=(c.node,),
                    evidence={"node_state": nodes[c.node].state, "power_w": c.power_w, "power_basis": c.power_basis,
                              "partitions": list(c.partitions), "vetted": c.reason})
            for c in chosen]


def _job_finding(job: Job, action: str) -> Finding:
    from gpu_cost.analyse.rules.common import job_fields
    from gpu_cost.core.model import Finding

    keys = job.gpu_keys()
    hosts = sorted({h for h, _ in keys})
    return Finding(rule=RULE, target_kind="job", target=f"job:{job.job_id}", action=action, gpus=job.gpu_count,
                   host=hosts[0] if len(hosts) == 1 else None, gpu_ids=tuple(f"{h}:{i}" for h, i in keys),
                   evidence={"job_state": job.state}, **job_fields(job))  # type: ignore[arg-type]


def _decide(f: Finding, request: Request, policy: Policy, snap: Snapshot, now: float,
            run_key: str) -> tuple[Decision, str | None]:
    """Decide one target through the engine's guards (:func:`gpu_cost.decide.engine.guard`)."""
    from gpu_cost.analyse.evidence import classify_log
    from gpu_cost.analyse.rules.common import job_bursts, service_verdict
    from gpu_cost.core.model import DESTRUCTIVE_ACTIONS, Decision
    from gpu_cost.decide.engine import Ask, guard, identity_of

    who = request.requested_by or "an operator"
    ask = Ask(entry="manual", mode="dry-run" if request.dry_run else "enforce", requested_by=request.requested_by,
              override=request.override_justification if request.override_protections else None)
    job = snap.job(f.job_id) if f.job_id else None
    if job is not None and f.target_kind == "job" and request.action in DESTRUCTIVE_ACTIONS:
        # what the agent makes of the job now: one it cannot classify needs its owner or a second operator
        from dataclasses import replace

        from gpu_cost.analyse.evidence import assess
        from gpu_cost.analyse.rules.common import interactive_session

        seen = assess(snap, job, policy, session=bool(interactive_session(job, policy.interactive)))
        if seen is not None:
            f = replace(f, evidence={**f.evidence, **seen})
    inference = None
    if job is not None:  # a service by the sweep's own verdict: its destructive actions need a human's approval
        log = classify_log(snap.job_logs.get(job.job_id), policy.evidence.job_log, now,
                           policy.rules.idle_allocation.window)
        inference = service_verdict(snap, policy, job, bursts=job_bursts(snap, job.job_id), log=log).reason
    v = guard(f, request.action, policy, now=now, ask=ask, degraded=snap.degraded, problems=snap.problems,
              inference=inference)
    refusal = v.refusal
    if refusal is None and request.action in DESTRUCTIVE_ACTIONS and not request.dry_run:
        # held back (degraded data, the policy's mode): say so in the refusals the operator reads
        refusal = v.held
    evidence: dict[str, Any] = dict(f.evidence)
    evidence.update(v.evidence)
    evidence.update({"gpu_ids": list(f.gpu_ids), "requested_by": request.requested_by, "request_reason": request.reason,
                     "policy_mode": policy.mode, "entry": "manual", "track": v.track})
    evidence.update(identity_of(f))
    destructive = v.action in DESTRUCTIVE_ACTIONS
    return Decision(
        decision_id=manual_decision_id(run_key, request, f.target, v.track), ts=now, rule=RULE,
        target_kind=f.target_kind, target=f.target, action=v.action, mode=v.mode, job_id=f.job_id, user=f.user,
        account=f.account, partition=f.partition, host=f.host, gpus=f.gpus,
        reason="; ".join([f"manual {request.action} requested by {who}: {request.reason}", *v.reasons]),
        protection=v.protection, requires_approval=v.requires_approval,
        gpu_hours_at_risk=round(v.stakes_at_risk, 3) if destructive else 0.0,
        gpu_hours_saved=round(v.stakes_saved, 3) if destructive else 0.0, evidence=evidence,
    ), refusal


def needs_approval(decision: Decision) -> bool:
    """Return True when ``decision`` waits for a human before its executor runs."""
    return bool(decision.requires_approval and decision.acts)


__all__ = ["ACTIONS_BY_KIND", "FORM_ACTIONS", "ID_PATTERN", "TARGET_KINDS", "ReclaimPlan", "ReclaimRequestError",
           "Request", "manual_decision_id", "needs_approval", "parse_request", "plan", "resolve",
           "run_mode"]
