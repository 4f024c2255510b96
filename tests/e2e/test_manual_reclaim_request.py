"""The manual reclaim library: form validation, target resolution and the policy checks, on the simulator."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpu_cost.config.schema import Caps
from gpu_cost.core.model import Job, Node
from gpu_cost.loop import reclaim, sweep
from tests.fixtures.core import NOW

OK = {"target_kind": "job", "target_ids": ["1003"], "action": "notify", "reason": "idle for hours, freeing GPUs"}


def req(**kw):  # type: ignore[no-untyped-def]
    return reclaim.parse_request({**OK, **kw}, requested_by="alice")


@pytest.fixture(scope="module")
def policy():  # type: ignore[no-untyped-def]
    """The shipped policy, enforcing, with alice as an operator and lead as the override approver."""
    from gpu_cost.config.loader import load_policy
    from gpu_cost.config.schema import ManualConfig
    from tests.fixtures.core import ROOT

    shipped = load_policy(ROOT / "include" / "policy" / "default.yaml")
    return dataclasses.replace(shipped, mode="enforce",
                               manual=ManualConfig(operators=("alice",), override_approvers=("lead", "alice")))


@pytest.fixture(scope="module")
def snap():  # type: ignore[no-untyped-def]
    from gpu_cost.config.loader import load_policy
    from tests.fixtures.core import ROOT

    return sweep.collect(load_policy(ROOT / "include" / "policy" / "default.yaml"), NOW, "sim")


@pytest.mark.parametrize(
    ("kind", "ident", "ok"),
    [("job", "1234", True), ("job", "1234_5", True), ("job", "12a", False), ("job", "1234_", False),
     ("job", "-1", False), ("job", "1;reboot", False),
     ("node", "gpu01", True), ("node", "gpu-01.cluster.local", True), ("node", "gpu_01", False),
     ("node", "-gpu", False), ("node", "a..b", False), ("node", "x" * 64, False),
     ("user", "alice", True), ("user", "a.b-c_d", True), ("user", "al ice", False), ("user", "$(id)", False),
     ("process", "gpu01:4242", True), ("process", "gpu01", False), ("process", "gpu01:abc", False),
     ("process", "gpu01:0", False), ("process", "gpu01:99999999", False)],
)
def test_target_ids_are_validated_per_kind(kind: str, ident: str, ok: bool) -> None:
    action = {"job": "cancel", "node": "power_down", "user": "notify", "process": "kill_process"}[kind]
    params = {**OK, "target_kind": kind, "target_ids": [ident], "action": action}
    if ok:
        assert reclaim.parse_request(params).target_ids == (ident,)
    else:
        what = {"job": "job id", "node": "hostname", "user": "user name", "process": "(node:pid|pid must)"}[kind]
        with pytest.raises(reclaim.ReclaimRequestError, match=rf"target_ids: .*{what}"):
            reclaim.parse_request(params)


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(reclaim.ReclaimRequestError) as err:
        reclaim.parse_request({"target_kind": "node", "target_ids": ["gpu01"], "action": "cancel", "reason": "x",
                               "dry_run": "yes", "override_protections": True})
    text = str(err.value)
    for field in ("action: cancel does not apply to a node", "reason:", "dry_run:", "override_justification:"):
        assert field in text


def test_ids_are_split_trimmed_and_deduplicated() -> None:
    assert req(target_ids=["1003, 1004", " 1003 ", "", "1005"]).target_ids == ("1003", "1004", "1005")


def test_decision_ids_are_deterministic_per_run_and_params() -> None:
    a = reclaim.manual_decision_id("run-1", req(), "job:1003")
    assert a == reclaim.manual_decision_id("run-1", req(), "job:1003")
    assert a != reclaim.manual_decision_id("run-2", req(), "job:1003")
    assert a != reclaim.manual_decision_id("run-1", req(dry_run=False), "job:1003")
    assert a != reclaim.manual_decision_id("run-1", req(reason="another reason entirely"), "job:1003")


def test_protection_refuses_unless_overridden(policy, snap) -> None:  # type: ignore[no-untyped-def]
    p = reclaim.plan(req(target_ids=["1007"], action="cancel", dry_run=False), policy, snap, now=NOW, run_key="r")
    (d,) = p.decisions
    assert d.action == "none" and not d.acts and p.refused[0]["target"] == "job:1007" and not p.needs_approval
    p = reclaim.plan(req(target_ids=["1007"], action="cancel", dry_run=False, override_protections=True,
                         override_justification="research lead agreed, ticket 42"), policy, snap, now=NOW, run_key="r")
    (d,) = p.decisions
    assert d.action == "cancel" and d.requires_approval and p.needs_approval and not p.refused
    assert d.evidence["override"] == {"protection": "no-interrupt label", "level": "never", "by": "alice",
                                      "justification": "research lead agreed, ticket 42"}
    assert "OVERRIDDEN by alice" in d.reason
    assert d.evidence["approvers"] == ["lead"], "the requester never approves their own override"


def test_cost_of_being_wrong_asks_for_approval(policy, snap) -> None:  # type: ignore[no-untyped-def]
    (d,) = reclaim.plan(req(action="cancel", dry_run=False), policy, snap, now=NOW, run_key="r").decisions
    assert d.requires_approval and d.gpu_hours_at_risk > policy.approval.gpu_hours_at_risk
    (n,) = reclaim.plan(req(dry_run=False), policy, snap, now=NOW, run_key="r").decisions
    assert n.action == "notify" and not n.requires_approval and n.gpu_hours_at_risk == 0


def test_inference_service_needs_approval_for_destructive_actions(policy, snap) -> None:  # type: ignore[no-untyped-def]
    inference = dataclasses.replace(policy, inference=dataclasses.replace(policy.inference, partitions=("batch",)))
    (d,) = reclaim.plan(req(target_ids=["1006"], action="demote", dry_run=False), inference, snap, now=NOW,
                        run_key="r").decisions
    assert d.requires_approval and "inference service" in d.reason


def test_unknown_targets_refuse_the_whole_request(policy, snap) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(reclaim.ReclaimRequestError, match="job 9999: not running or pending"):
        reclaim.plan(req(target_ids=["1003", "9999"]), policy, snap, now=NOW, run_key="r")
    with pytest.raises(reclaim.ReclaimRequestError, match="node gpu01: runs job"):
        reclaim.plan(req(target_kind="node", target_ids=["gpu01"], action="power_down"), policy, snap, now=NOW,
                     run_key="r")
    with pytest.raises(reclaim.ReclaimRequestError, match="belongs to running job 1001"):
        reclaim.plan(req(target_kind="process", target_ids=["gpu01:11001"], action="kill_process"), policy, snap,
                     now=NOW, run_key="r")


def test_user_and_node_targets_expand_to_their_jobs(policy, snap) -> None:  # type: ignore[no-untyped-def]
    p = reclaim.plan(req(target_kind="user", target_ids=["carol"], action="demote"), policy, snap, now=NOW, run_key="r")
    assert [d.target for d in p.decisions] == ["job:1003"]
    p = reclaim.plan(req(target_kind="user", target_ids=["carol"]), policy, snap, now=NOW, run_key="r")
    assert [d.target for d in p.decisions] == ["user:carol"]
    p = reclaim.plan(req(target_kind="node", target_ids=["gpu03"]), policy, snap, now=NOW, run_key="r")
    assert sorted(d.job_id for d in p.decisions) == ["1006", "1007"]
    assert {d.action for d in p.decisions} == {"notify", "none"}  # 1007 is protected (never)


def test_zombie_process_and_idle_node(policy, snap) -> None:  # type: ignore[no-untyped-def]
    (d,) = reclaim.plan(req(target_kind="process", target_ids=["gpu01:11002"], action="kill_process"), policy, snap,
                        now=NOW, run_key="r").decisions
    assert d.target.startswith("proc:gpu01:11002:") and d.user == "bob" and d.evidence["pid"] == 11002
    assert d.evidence["process_start_ts"] == 1795896000.0
    idle = dataclasses.replace(snap, nodes=(*snap.nodes, Node(name="gpu04", state="idle", gpus_total=8)))
    # the off-hours path's own checks: a node without GPU metrics is not known to be idle...
    with pytest.raises(reclaim.ReclaimRequestError, match="node gpu04: no GPU metrics for the node"):
        reclaim.plan(req(target_kind="node", target_ids=["gpu04"], action="power_down"), policy, idle, now=NOW,
                     run_key="r")
    # ...unless the deployment trusts Slurm's allocation state alone (and keeps no warm reserve, nor
    # a last healthy node up: gpu04 is the only node of no partition)
    slurm_only = dataclasses.replace(policy, offhours=dataclasses.replace(policy.offhours, require_gpu_metrics=False,
                                                                          warm_reserve_nodes=0, min_up=0))
    (n,) = reclaim.plan(req(target_kind="node", target_ids=["gpu04"], action="power_down"), slurm_only, idle,
                        now=NOW, run_key="r").decisions
    assert n.target == "node:gpu04" and n.action == "power_down"


def test_degraded_data_never_acts_destructively(policy, snap) -> None:  # type: ignore[no-untyped-def]
    bad = dataclasses.replace(snap, problems=("prometheus: newest sample 20 min old",))
    p = reclaim.plan(req(action="cancel", dry_run=False), policy, bad, now=NOW, run_key="r")
    (d,) = p.decisions
    # recorded as the sweep records it: what it would have done, in dry-run, never acting
    assert not d.acts and d.mode == "dry-run" and "degraded data" in p.refused[0]["why"]


def test_caps_refuse_a_run_that_would_touch_too_much(policy, snap) -> None:  # type: ignore[no-untyped-def]
    tight = dataclasses.replace(policy, caps=Caps(max_actions_per_run=1, max_gpu_share=1.0))
    jobs = tuple(Job(job_id=str(2000 + i), user="zed", gpu_alloc=(("gpu01", (i,)),)) for i in range(3))
    many = dataclasses.replace(snap, jobs=(*snap.jobs, *jobs))
    with pytest.raises(reclaim.ReclaimRequestError, match="max_actions_per_run"):
        reclaim.plan(req(target_kind="user", target_ids=["zed"], action="demote", dry_run=False), tight, many,
                     now=NOW, run_key="r")


def test_a_rerun_of_the_act_step_does_not_act_twice(policy, snap, slack_sink, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import types

    from gpu_cost.airflow import reclaim_tasks, runtime

    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLACK",
                       json.dumps({"conn_type": "slackwebhook", "password": slack_sink.webhook_url()}))
    run_id = "gpu_manual_reclaim:rerun-test"
    p = reclaim.plan(req(dry_run=False), policy, snap, now=NOW, run_key=run_id)
    store = runtime.store()
    text = "mode: enforce\nmanual: {operators: [alice]}\n"
    store.execute("pin_policy", {"run_id": run_id, "name": "t", "sha256": runtime._sha256(text), "content": text,
                                 "pinned_at": NOW})
    store.begin_run(run_id, dag_id="gpu_manual_reclaim", started_at=NOW, data_ts=NOW, source="sim", mode="enforce")
    store.record_decisions(p.decisions, run_id)
    context = {"dag_run": types.SimpleNamespace(dag_id="gpu_manual_reclaim", run_id="rerun-test")}
    # XCom names the run and nothing else that acts: a forged id in it is ignored
    prep = {"run_id": run_id, "cluster_gpus": 64, "decision_ids": ["forged"]}
    first = reclaim_tasks.act(prep, "automatic", context)
    second = reclaim_tasks.act(prep, "automatic", context)
    assert [r["status"] for r in first["results"]] == ["succeeded"]
    assert [r["decision_id"] for r in first["results"]] == [p.decisions[0].decision_id]
    assert [r["status"] for r in second["results"]] == ["succeeded"] and second["results"][0]["repeated"] is False
    assert len(slack_sink.requests) == 1
