"""The power run's decisions pass the engine's guards like every other way in (one decision path)."""

from __future__ import annotations

import dataclasses

from gpu_cost.airflow.power_tasks import decisions_of
from gpu_cost.capacity.offhours import NodeChoice, PowerPlan
from gpu_cost.config.schema import Match, OffhoursConfig, Policy, Protection

NOW = 1795561200.0  # Tue 2026-11-24 23:00 UTC


def plan(**kw) -> PowerPlan:
    p = PowerPlan(now=NOW, in_window=True, local_time="2026-11-24T23:00+00:00", cluster_util=1.0)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def policy(**kw) -> Policy:
    return dataclasses.replace(Policy(), mode="enforce", **{"offhours": OffhoursConfig(), **kw})


def test_a_protection_the_plan_did_not_see_holds_the_power_down_back() -> None:
    # the guard, not the plan, has the last word: a protection naming the node records it only
    never = Protection(name="serving", level="never", match=Match(nodes=("gpu01",)))
    p = plan(down=[NodeChoice("gpu01", "idle in the off-hours window", power_w=400.0, gpus=4, partitions=("batch",)),
                   NodeChoice("gpu02", "idle in the off-hours window", power_w=400.0, gpus=4, partitions=("batch",))])
    ds = {d.target: d for d in decisions_of(p, policy(protections=(never,)), NOW, "enforce")}
    assert ds["node:gpu01"].action == "none" and "protected (serving): recorded only" in ds["node:gpu01"].reason
    assert ds["node:gpu01"].protection == "serving"
    assert ds["node:gpu02"].action == "power_down" and ds["node:gpu02"].mode == "enforce"
    assert not ds["node:gpu02"].requires_approval


def test_degraded_data_and_approval_protections_come_from_the_guard() -> None:
    p = plan(down=[NodeChoice("gpu01", "idle", gpus=4)], up=[NodeChoice("gpu09", "forecast demand", gpus=4)])
    ds = {d.target: d for d in decisions_of(p, policy(), NOW, "enforce", degraded=True, problems=("prometheus: down",))}
    assert ds["node:gpu01"].mode == "dry-run" and "degraded data (prometheus: down)" in ds["node:gpu01"].reason
    assert ds["node:gpu09"].action == "power_up" and ds["node:gpu09"].mode == "enforce"  # waking is never held back
    ask = Protection(name="ask first", level="approval", match=Match(nodes=("gpu01",)))
    d = decisions_of(p, policy(protections=(ask,)), NOW, "enforce")[0]
    assert d.action == "power_down" and d.requires_approval and "approval required (protection ask first)" in d.reason


def test_a_node_that_did_not_come_back_is_recorded_as_a_decision_later_runs_read() -> None:
    p = plan(failed={"gpu05": "failed to resume: down* (ResumeTimeout reached)"})
    (d,) = decisions_of(p, policy(), NOW, "enforce")
    assert (d.target, d.action, d.host) == ("node:gpu05", "none", "gpu05")
    assert d.evidence["resume_failure"] == "failed to resume: down* (ResumeTimeout reached)"
    assert d.reason.startswith("did not come back from power saving: failed to resume")
    # one id per node and hour: a retried task records it once
    assert decisions_of(p, policy(), NOW + 60, "enforce")[0].decision_id == d.decision_id


def test_a_plan_larger_than_the_policy_allows_alone_says_why_it_waits_for_a_human() -> None:
    # offhours.approval_over_nodes: the plan's size is the reason, worded as every approval is, from the flag
    down = [NodeChoice(f"gpu0{i}", "idle", gpus=4) for i in (1, 2, 3)]
    p = plan(down=down, up=[NodeChoice("gpu09", "forecast demand", gpus=4)], needs_approval=True)
    pol = policy(offhours=OffhoursConfig(approval_over_nodes=2))
    ds = {d.target: d for d in decisions_of(p, pol, NOW, "enforce")}
    for n in ("gpu01", "gpu02", "gpu03"):
        d = ds[f"node:{n}"]
        assert d.requires_approval and "approval required (3 nodes, over offhours.approval_over_nodes 2)" in d.reason
    assert not ds["node:gpu09"].requires_approval and "approval" not in ds["node:gpu09"].reason  # waking asks no one
    # recorded only: it would need one, and its reason says so without asking anybody
    d = decisions_of(p, pol, NOW, "dry-run")[0]
    assert not d.requires_approval and "would need approval (3 nodes, over offhours.approval_over_nodes 2)" in d.reason
    # a plan within the bound asks no one
    d = decisions_of(plan(down=down[:2]), pol, NOW, "enforce")[0]
    assert not d.requires_approval and "approval" not in d.reason


def test_a_protection_named_by_the_plan_and_the_guard_is_one_sentence() -> None:
    ask = Protection(name="ask first", level="approval", match=Match(nodes=("gpu01",)))
    p = plan(down=[NodeChoice("gpu01", "idle", gpus=4, protection="ask first")])
    (d,) = decisions_of(p, policy(protections=(ask,)), NOW, "enforce")
    assert d.requires_approval and d.reason.count("protection ask first") == 1
    # one the guard does not see (a job's, on the node) is asked about all the same
    (d,) = decisions_of(p, policy(), NOW, "enforce")
    assert d.requires_approval and "approval required (protection ask first)" in d.reason
