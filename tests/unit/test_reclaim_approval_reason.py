"""A manual reclaim's reason says approval is required exactly when its row says so.

A live deployment (the shipped policy: ``mode: dry-run``) recorded a manual cancel whose reason read
"approval required (25.0 GPU-h at risk)" on a row with ``requires_approval=0``: the guards wrote the
approval into the reasons as they found it, and cleared the flag at the end because the mode held
the action back (nothing acts in dry-run, so nobody is asked). The reason's approval wording now
comes from the flag: "approval required (...)" on a decision that waits for a human, "would need
approval (...)" on one that records only. Driven here through the manual reclaim's own planning
(:func:`gpu_cost.loop.reclaim.plan`) and the audit rows it writes.
"""

from __future__ import annotations

import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.core.model import Decision, Job, Snapshot, empty_gpu_frame
from gpu_cost.loop import reclaim
from tests.unit.policy.helpers import H, policy_from

NOW = 1_795_960_800.0
REQUIRED = "approval required"
#: the request's own words are the operator's (free text): the guards' reasons follow them
REQUEST_REASON = "freeing idle GPUs now"

# carol's job: 2 GPUs for 10 h of a 48 h limit; ops (an operator) asks to cancel it
JOB = Job(job_id="7", user="carol", start_ts=NOW - 10 * H, account="ml", partition="batch", name="train-7",
          time_limit_s=48 * H, gpu_alloc=(("g1", (0, 1)),), labels=())
SERVE = Job(job_id="8", user="carol", start_ts=NOW - 10 * H, account="ml", partition="batch", name="llm-serve",
            time_limit_s=48 * H, gpu_alloc=(("g1", (2,)),), labels=())
OPS = "manual: {operators: [ops, lead], override_approvers: [lead, ops]}\n"
PROTECTED = "protections: [{name: keep, level: never, match: {users: [carol]}}]\n"
ASK_FIRST = "protections: [{name: ask first, level: approval, match: {users: [carol]}}]\n"
INFERENCE = "inference: {name_patterns: ['*serve*']}\n"


def _snap(degraded: bool = False) -> Snapshot:
    return Snapshot(ts=NOW, window_s=900, lookback_s=6 * H, source="prometheus", gpus=empty_gpu_frame().reindex(range(64)),
                    jobs=(JOB, SERVE), problems=("gpu03: no metrics",) if degraded else ())


def _plan(mode: str, extra: str = "", *, dry_run: bool = False, override: str | None = None, ids: tuple[str, ...] = ("7",),
          at_risk: float = 10.0, degraded: bool = False) -> list[Decision]:
    text = f"mode: {mode}\napproval: {{gpu_hours_at_risk: {at_risk}}}\n{OPS}{extra}"
    params = {"target_kind": "job", "target_ids": list(ids), "action": "cancel", "reason": REQUEST_REASON,
              "dry_run": dry_run, "override_protections": override is not None, "override_justification": override}
    request = reclaim.parse_request(params, requested_by="ops")
    return reclaim.plan(request, policy_from(text), _snap(degraded), now=NOW, run_key="r").decisions


def _guards_say_required(reason: str) -> bool:
    """Whether the guards' part of a manual decision's reason says a human must approve it."""
    head = f"manual cancel requested by ops: {REQUEST_REASON}"
    assert reason.startswith(head), reason
    return REQUIRED in reason[len(head):]


CASES = {
    # the deployment's case: the shipped dry-run policy, an operator's live request, 20 GPU-h at risk
    "dry-run-policy-stakes": dict(mode="dry-run"),
    "notify-policy-stakes": dict(mode="notify"),
    "enforce-stakes": dict(mode="enforce"),
    "enforce-under-the-bar": dict(mode="enforce", at_risk=1000.0),
    "dry-run-request-stakes": dict(mode="enforce", dry_run=True),
    "degraded-data-stakes": dict(mode="enforce", degraded=True),
    "override-enforce": dict(mode="enforce", extra=PROTECTED, override="the lead agreed in ticket 42"),
    "override-enforce-under-the-bar": dict(mode="enforce", extra=PROTECTED, override="the lead agreed in ticket 42",
                                           at_risk=1000.0),
    "override-dry-run-policy": dict(mode="dry-run", extra=PROTECTED, override="the lead agreed in ticket 42"),
    "approval-protection-enforce": dict(mode="enforce", extra=ASK_FIRST, at_risk=1000.0),
    "approval-protection-notify": dict(mode="notify", extra=ASK_FIRST, at_risk=1000.0),
    "inference-enforce": dict(mode="enforce", extra=INFERENCE, ids=("8",), at_risk=1000.0),
    "inference-dry-run-policy": dict(mode="dry-run", extra=INFERENCE, ids=("8",), at_risk=1000.0),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_the_reason_says_approval_required_exactly_when_the_row_requires_it(case: dict, store: AuditStore) -> None:  # type: ignore[type-arg]
    decisions = _plan(**case)
    assert decisions
    store.record_decisions(decisions, "gpu_manual_reclaim:r")
    for d in decisions:
        row = store.get_decision(d.decision_id)
        assert row is not None
        assert _guards_say_required(row["reason"]) == bool(row["requires_approval"]) == d.requires_approval, \
            (row["reason"], row["requires_approval"], row["mode"])
        # a decision that records only names the approval it would have needed, as it names the action
        if not d.requires_approval and d.mode == "dry-run" and "at risk" in row["reason"]:
            assert "would need approval (20.0 GPU-h at risk)" in row["reason"]


def test_the_deployments_manual_cancel_under_the_shipped_dry_run_policy() -> None:
    (d,) = _plan("dry-run")
    assert d.mode == "dry-run" and not d.requires_approval and not d.acts
    assert "asked for enforce, the policy's mode dry-run is the ceiling" in d.reason
    assert REQUIRED not in d.reason and "would need approval (20.0 GPU-h at risk)" in d.reason
    # the same request where the policy lets it act: a human is asked, and the reason says so
    (live,) = _plan("enforce")
    assert live.requires_approval and live.acts and "approval required (20.0 GPU-h at risk)" in live.reason


def test_a_request_held_back_by_the_mode_is_refused_with_the_modes_reason() -> None:
    """The refusal an operator reads is why nothing acts (the mode), not the approval it would need."""
    params = {"target_kind": "job", "target_ids": ["7"], "action": "cancel", "reason": REQUEST_REASON,
              "dry_run": False, "override_protections": False, "override_justification": None}
    request = reclaim.parse_request(params, requested_by="ops")
    p = reclaim.plan(request, policy_from(f"mode: notify\n{OPS}{ASK_FIRST}"), _snap(), now=NOW, run_key="r")
    assert p.refused == [{"target": "job:7", "why": "asked for enforce, the policy's mode notify is the ceiling"}]
