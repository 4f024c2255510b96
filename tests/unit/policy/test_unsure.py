"""What the agent cannot classify goes to its owner: notices only on the sweep's ladder, the owner's own
release or two operators on the manual way in, and the notice says why the agent is unsure."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpu_cost.act.notices import render
from gpu_cost.core.model import Finding
from gpu_cost.decide.engine import Ask, guard, unsure
from gpu_cost.loop import reclaim
from tests.fixtures.core import NOW
from tests.unit.policy.helpers import Effects, H, actions, install, job_finding, policy_from, sweep_once

ENFORCE = "mode: enforce\napproval: {gpu_hours_at_risk: 1000}\nmanual: {operators: [ops, lead]}\n"
# (minutes after the first sighting, the action the sweep decides; None: waits) — notify, notify_manager, then nothing
NOTICES_ONLY = [(0, "notify"), (60, "notify_manager"), (120, None), (180, None), (190, None), (600, None)]


def ambiguous(job_id: str = "7", *, kind: str | None = "unknown", confidence: float = 0.45,
              resident: bool | None = True, now: float = NOW, **kw: Any) -> Finding:
    """An idle finding as the rule writes it for a job whose class says nothing, model resident, under min_confidence."""
    f = job_finding(job_id, now=now, ran_s=20 * H, user="carol", **kw)
    ev = dict(f.evidence, confidence=confidence, mem_resident=resident, mem_min_mib=17000.0,
              confidence_why=["utilisation alone: 0.7", "-0.25 memory resident: a model may be waiting for requests"])
    if kind is not None:
        ev["class"] = {"key": "k", "members": 40, "kind": kind, "member_kind": None}
    return dataclasses.replace(f, evidence=ev)


@pytest.fixture
def effects(monkeypatch):  # type: ignore[no-untyped-def]
    e = Effects()
    install(monkeypatch, e)
    return e


@pytest.mark.parametrize(("kw", "why"), [
    ({}, "kind unknown"), ({"kind": None}, "no class baseline (baselines off, or none yet)"),
])
def test_the_ladder_of_a_job_the_agent_cannot_classify_stops_at_notices(store, effects, kw, why) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(ENFORCE)
    for minutes, expected in NOTICES_ONLY:
        now = NOW + minutes * 60
        p = sweep_once(store, policy, [ambiguous(now=now, **kw)], now)  # approvals granted: it makes no difference
        assert [a for _, a in actions(p)] == ([expected] if expected else []), f"{why}: at +{minutes} min"
    assert [a for a, _ in effects.calls] == ["notify", "notify_manager"] and not p.decisions
    rows = store.query("SELECT action, reason, evidence FROM gpu_cost_decisions ORDER BY ts")
    assert [r["action"] for r in rows] == ["notify", "notify_manager"]
    assert all("notices only: the agent cannot classify it" in r["reason"] for r in rows)
    assert all("confidence 0.45 under evidence.min_confidence 0.5" in r["evidence"] for r in rows)


@pytest.mark.parametrize("kw", [{"kind": "training"}, {"confidence": 0.5}, {"resident": False},
                                {"kind": "unknown", "confidence": 0.3, "resident": None}],
                         ids=["class-says-training", "confidence-at-the-floor", "nothing-resident", "no-memory-evidence"])
def test_a_job_the_agent_can_judge_climbs_the_whole_ladder(store, effects, kw) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(ENFORCE)
    assert unsure(ambiguous(**kw), policy) is None
    done = []
    for minutes in (0, 60, 120, 180, 190):
        now = NOW + minutes * 60
        done += [a for _, a in actions(sweep_once(store, policy, [ambiguous(now=now, **kw)], now))]
    assert done == ["notify", "notify_manager", "demote", "terminate", "kill"]


def test_a_job_whose_memory_was_not_measured_is_one_the_agent_cannot_classify(store, effects) -> None:  # type: ignore[no-untyped-def]
    """Memory not measured (a trace of utilisation alone, an exporter without the framebuffer metric): nothing says
    the GPUs are empty, so a job of unknown kind under min_confidence gets notices only, as with memory resident."""
    policy = policy_from(ENFORCE)
    blind = dataclasses.replace(ambiguous(resident=None), evidence={**ambiguous(resident=None).evidence,
                                                                    "mem_measured": False})
    assert "GPU memory not measured" in (unsure(blind, policy) or "")
    for minutes, expected in NOTICES_ONLY:
        now = NOW + minutes * 60
        f = dataclasses.replace(ambiguous(resident=None, now=now), evidence={
            **ambiguous(resident=None, now=now).evidence, "mem_measured": False})
        assert [a for _, a in actions(sweep_once(store, policy, [f], now))] == ([expected] if expected else [])
    assert [a for a, _ in effects.calls] == ["notify", "notify_manager"]


def test_no_approval_makes_the_sweep_act_on_a_job_it_cannot_classify() -> None:
    policy = policy_from(ENFORCE)
    for action in ("demote", "terminate", "kill", "cancel"):
        v = guard(ambiguous(), action, policy, now=NOW)
        assert v.action == "none" and not v.requires_approval
        assert "notices to its owner and manager only" in (v.refusal or "") and v.evidence["unsure"]


# -- the manual way in: the owner's own release, or two operators -----------------------------------
def test_the_owners_own_release_acts_without_anyone_else() -> None:
    v = guard(ambiguous(), "cancel", policy_from(ENFORCE), now=NOW,
              ask=Ask(entry="manual", mode="enforce", requested_by="carol"))
    assert v.action == "cancel" and v.mode == "enforce" and not v.requires_approval and v.refusal is None


def test_an_operators_request_needs_a_second_operator() -> None:
    v = guard(ambiguous(), "cancel", policy_from(ENFORCE), now=NOW,
              ask=Ask(entry="manual", mode="enforce", requested_by="ops"))
    assert v.action == "cancel" and v.requires_approval and v.evidence["approvers"] == ["lead"]
    assert any("approval required (a second operator: lead)" in r for r in v.reasons)
    alone = guard(ambiguous(), "cancel", policy_from(ENFORCE.replace("[ops, lead]", "[ops]")), now=NOW,
                  ask=Ask(entry="manual", mode="enforce", requested_by="ops"))
    assert alone.action == "none" and "needs a second operator" in (alone.refusal or "")


def test_a_second_operator_is_asked_by_the_approval_step_and_the_requester_may_not_answer() -> None:
    from gpu_cost.airflow.approval import permitted_approvers

    v = guard(ambiguous(), "cancel", policy_from(ENFORCE), now=NOW,
              ask=Ask(entry="manual", mode="enforce", requested_by="lead"))
    row = {"evidence": {"approvers": v.evidence["approvers"], "requested_by": "lead"}}
    named, requesters = permitted_approvers([row], policy_from(ENFORCE))
    assert named == ["ops"] and requesters == {"lead"}


def test_the_manual_reclaim_reads_what_the_agent_makes_of_the_job() -> None:
    """End to end through reclaim.plan: an idle job, model resident, no class: the operator's cancel waits for a second."""
    import numpy as np

    from gpu_cost.core.model import Job, Node
    from gpu_cost.perceive.snapshot import from_matrix

    step, lookback = 60.0, 6 * H
    times = np.arange(NOW - lookback + step, NOW + 1, step)
    job = Job(job_id="7", user="carol", start_ts=NOW - 20 * H, account="ml", partition="batch", name="chat-api-7",
              time_limit_s=30 * 86400.0, gpu_alloc=(("g1", (0,)),), nodes=("g1",), batch=True)
    policy = policy_from(ENFORCE + "caps: {max_gpu_share: 1}\n")  # a one-GPU cluster
    snap = from_matrix(policy=policy, now=NOW, source="test", hosts=np.array(["g1"], dtype=object),
                       gpus=np.zeros(1, dtype=np.int64), uuids=np.array(["GPU-0"], dtype=object),
                       models=np.array(["h100"], dtype=object), mem_total=np.full(1, 81920.0), times=times,
                       util=np.full((1, len(times)), 0.3), mem=np.full((1, len(times)), 17000.0),
                       power=np.full((1, len(times)), 60.0), job=np.full((1, len(times)), "", dtype=object),
                       jobs=(job,), processes=(), nodes=(Node("g1", state="mixed", gpus_total=1, gpus_alloc=1),))

    def plan(by: str) -> Any:
        req = reclaim.parse_request({"target_kind": "job", "target_ids": ["7"], "action": "cancel",
                                     "reason": "idle for a day now", "dry_run": False}, requested_by=by)
        (d,) = reclaim.plan(req, policy, snap, now=NOW, run_key="r").decisions
        return d

    ops = plan("ops")
    assert ops.action == "cancel" and ops.requires_approval and ops.evidence["approvers"] == ["lead"]
    assert ops.evidence["confidence"] == 0.45 and ops.evidence["mem_resident"] is True and ops.evidence["unsure"]
    owner = plan("carol")
    assert owner.action == "cancel" and owner.acts and not owner.requires_approval


# -- the notice says why ------------------------------------------------------------------------------
def test_the_notice_says_why_the_agent_is_unsure_and_that_nothing_follows(store, effects) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(ENFORCE + "people: {carol: {manager: dave}}\n")
    p = sweep_once(store, policy, [ambiguous()], NOW, act=False)
    (d,) = p.decisions
    assert d.action == "notify" and d.evidence["unsure"]
    msg = render.render(d, policy, NOW)
    for text in (msg.plain, msg.html):
        assert "The agent is not sure this is waste" in text and "kind unknown" in text
        assert "only you can release it" in text
    assert render.next_step(d, policy, NOW)["action"] == "notify_manager"
    manager = dataclasses.replace(d, action="notify_manager", rung=1)
    assert render.next_step(manager, policy, NOW) is None
