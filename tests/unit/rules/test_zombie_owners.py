"""Processes outside Slurm are not ours by default: root, system accounts and containers are reported only."""

from __future__ import annotations

import dataclasses
import time

import pytest

from gpu_cost.act.base import ActionContext
from gpu_cost.analyse.rules import run_rules
from gpu_cost.config.loader import parse_policy
from gpu_cost.config.schema import Policy
from gpu_cost.core.errors import PolicyError
from gpu_cost.core.model import Decision
from gpu_cost.decide.engine import decide
from gpu_cost.perceive.snapshot import from_matrix
from gpu_cost.sim.cluster import SimCluster, scenario_from_dict
from tests.fixtures.core import NOW

NODE = {"name": "g1", "gpus": 4, "model": "a100", "mem_total_mib": 40960}
ZOMBIE = {"job_id": "1", "user": "u", "account": "acct", "node": "g1", "gpus": [0], "start": "-4h", "end": "-1h",
          "name": "train", "behaviour": "zombie"}


def leftover_snapshot(policy: Policy, **proc: object):  # type: ignore[no-untyped-def]
    """A snapshot with one simulated leftover process (of no running job), its fields replaced by ``proc``."""
    cluster = SimCluster(scenario_from_dict({"seed": 3, "anchor": "now", "nodes": [NODE], "jobs": [ZOMBIE]}), anchor=NOW)
    m = cluster.matrix(NOW - policy.sweep.lookback, NOW)
    procs = [dataclasses.replace(p, **proc) for p in cluster.processes_at(NOW)]  # type: ignore[arg-type]
    assert procs, "the scenario must leave a process on the GPU"
    return from_matrix(policy=policy, now=NOW, source="sim", hosts=m.hosts, gpus=m.gpus, uuids=m.uuids,
                       models=m.models, mem_total=m.mem_total, times=m.times, util=m.util, mem=m.mem, power=m.power,
                       job=m.job, jobs=cluster.jobs_at(NOW), processes=procs, nodes=cluster.nodes_at(NOW))


def zombie_findings(policy: Policy, **proc: object):  # type: ignore[no-untyped-def]
    """The zombie findings of one simulated leftover process, its fields replaced by ``proc``."""
    return [f for f in run_rules(leftover_snapshot(policy, **proc), policy) if f.rule == "zombie"]


def policy(owners: str = "[]", system_users: str = "[nobody]") -> Policy:
    return parse_policy(f"mode: enforce\nmanual: {{operators: [ops]}}\ncaps: {{max_gpu_share: 1}}\n"
                        f"rules: {{zombie: {{act_on_owners: {owners}, system_users: {system_users}}}}}\n", "p.yaml")


@pytest.mark.parametrize(
    ("proc", "foreign"),
    [({"user": "root"}, "root"), ({"user": "nobody"}, "system"), ({"user": "svc-gpu"}, "system"),
     ({"user": "u", "container": "docker:4f6c3a1be2d9"}, "container:docker"),
     ({"user": "u", "container": "kubepods:9d8c7b6a5f4e"}, "container:kubepods")],
    ids=["root", "system-default-name", "system-configured-name", "docker", "kubernetes"],
)
def test_foreign_owner_is_reported_never_killed(proc: dict[str, object], foreign: str) -> None:
    pol = policy(system_users="[nobody, svc-gpu]")
    (f,) = zombie_findings(pol, **proc)
    assert (f.action, f.evidence["foreign_owner"]) == ("advise", foreign)
    assert "act_on_system" not in f.evidence and "act_on_owner" not in f.evidence
    # the engine turns it into advice only, at every rung, with the reason in the decision
    plan = decide([f], pol, now=NOW, escalations={})
    (d,) = plan.decisions
    assert d.action == "advise" and not d.destructive
    assert f"a {foreign} process, not ours: reported only" in d.reason
    later = decide([f], pol, now=NOW + 7200, escalations={("zombie", f.target, "live"): {
        "state": "open", "episode": 1, "rung": 0, "first_seen": NOW, "last_action_at": NOW}})
    assert later.decisions == [] and later.waiting[0]["why"] == "ladder complete"


def test_a_plain_user_process_is_still_killed() -> None:
    (f,) = zombie_findings(policy(), user="alice")
    assert f.action == "kill_process" and "foreign_owner" not in f.evidence and "act_on_system" not in f.evidence


@pytest.mark.parametrize(
    ("owners", "proc", "allowed_by"),
    [("[system]", {"user": "nobody"}, "system"), ("[nobody]", {"user": "nobody"}, "nobody")],
    ids=["system-word", "user-name"],
)
def test_act_on_owners_lets_the_rule_act(owners: str, proc: dict[str, object], allowed_by: str) -> None:
    (f,) = zombie_findings(policy(owners), **proc)
    assert f.action == "kill_process" and f.evidence["act_on_owner"] == allowed_by
    assert "act_on_system" not in f.evidence, "nothing asks the node to signal a system uid: it never does"


def test_naming_a_plain_user_changes_nothing() -> None:
    (f,) = zombie_findings(policy("[trainer]"), user="trainer")
    assert f.action == "kill_process" and "foreign_owner" not in f.evidence and "act_on_system" not in f.evidence


@pytest.mark.parametrize(
    ("owners", "proc"),
    [("[system, alice]", {"user": "root"}), ("[system]", {"user": "u", "container": "podman:abababababab"}),
     ("[u]", {"user": "u", "container": "docker:4f6c3a1be2d9"}),
     ("[system, nobody]", {"user": "nobody", "container": "kubepods:9d8c7b6a5f4e"})],
    ids=["root-never", "container-is-not-system", "user-name-is-not-container", "container-never"],
)
def test_act_on_owners_opens_only_what_it_names(owners: str, proc: dict[str, object]) -> None:
    (f,) = zombie_findings(policy(owners), **proc)
    assert f.action == "advise"


@pytest.mark.parametrize(
    ("text", "pattern"),
    [("act_on_owners: [root]", r"act_on_owners\[0\]: root's processes are never killed"),
     ("act_on_owners: [system, container]", r"act_on_owners\[1\]: processes in a container are never killed"),
     ("act_on_owners: [system, 'a b']", r"act_on_owners\[1\]: 'a b' is not a user name"),
     ("system_users: ['x;y']", r"system_users\[0\]: 'x;y' is not a user name"),
     ("act_on_owners: container", r"act_on_owners"),
     ("act_on_owner: [system]", r"unknown key")],
    ids=["root", "container", "space", "system-users-bad", "not-a-list", "misspelt"],
)
def test_policy_key_is_checked(text: str, pattern: str) -> None:
    with pytest.raises(PolicyError, match=pattern):
        parse_policy(f"rules: {{zombie: {{{text}}}}}\n", "p.yaml")


def test_defaults_act_on_no_foreign_owner() -> None:
    z = Policy().rules.zombie
    assert z.act_on_owners == () and z.system_users == ("nobody",)


def _ctx(dry_run: bool = True) -> ActionContext:
    from gpu_cost.perceive.nodes import NodeAccess

    return ActionContext(policy=Policy(), dry_run=dry_run, now=time.time(), run_id="t",
                         extra={"node_access": NodeAccess(command=("wrapper",))})


def _decision(user: str | None, **evidence: object) -> Decision:
    return Decision(decision_id="d1", ts=NOW, rule="zombie", target_kind="process", target="proc:g1:4242:1700000000",
                    action="kill_process", mode="enforce", host="g1", gpus=1, user=user,
                    evidence={"gpu_uuid": "GPU-0f0e0d0c-0000-0000-0000-000000000001", **evidence})


def test_the_action_sends_the_owner_and_never_asks_for_a_system_account() -> None:
    from gpu_cost.act.node import kill_process

    plain = kill_process(_decision("alice"), _ctx())
    assert plain.status == "skipped"
    assert plain.command == "wrapper kill-process 4242 1700000000 GPU-0f0e0d0c-0000-0000-0000-000000000001 alice TERM"
    # evidence of an older agent that asked the node to signal a system uid: no longer sent
    named = kill_process(_decision("trainer", act_on_system=True), _ctx())
    assert named.command == plain.command.replace(" alice ", " trainer ")


def test_the_action_refuses_a_decision_without_owner() -> None:
    from gpu_cost.act.node import kill_process

    out = kill_process(_decision(None), _ctx(dry_run=False))
    assert out.status == "failed" and "names no owner" in (out.error or "")


# -- one verdict on every way in: the manual reclaim judges a process as the sweep does ---------------


def _manual(pol: Policy, snap, dry_run: bool = False):  # type: ignore[no-untyped-def]
    """The manual reclaim's plan (the DAG's ``prepare`` calls these two) for a kill of the leftover process."""
    from gpu_cost.loop import reclaim

    (p,) = {(p.host, p.pid) for p in snap.processes}
    request = reclaim.parse_request({"target_kind": "process", "target_ids": [f"{p[0]}:{p[1]}"],
                                     "action": "kill_process", "reason": "frees the GPU for the queue",
                                     "dry_run": dry_run}, requested_by="ops")
    return reclaim.plan(request, pol, snap, now=NOW, run_key="gpu_manual_reclaim:manual__1")


def _sweep(pol: Policy, snap):  # type: ignore[no-untyped-def]
    """The sweep's finding and its decision once the ladder reaches the kill rung."""
    (f,) = [f for f in run_rules(snap, pol) if f.rule == "zombie"]
    plan = decide([f], pol, now=NOW + 7200, escalations={("zombie", f.target, "live"): {
        "state": "open", "episode": 1, "rung": 0, "first_seen": NOW, "last_action_at": NOW}})
    return f, plan


@pytest.mark.parametrize(
    ("owners", "proc", "foreign"),
    [("[]", {"user": "root"}, "root"), ("[]", {"user": "nobody"}, "system"),
     ("[nobody]", {"user": "root"}, "root"),
     ("[system]", {"user": "u", "container": "docker:4f6c3a1be2d9"}, "container:docker"),
     ("[u]", {"user": "u", "container": "kubepods:9d8c7b6a5f4e"}, "container:kubepods")],
    ids=["root", "system-account", "root-whatever-is-named", "docker", "kubernetes"],
)
def test_the_manual_reclaim_never_kills_what_the_sweep_only_reports(owners: str, proc: dict[str, object],
                                                                     foreign: str) -> None:
    pol = policy(owners)
    snap = leftover_snapshot(pol, **proc)
    f, swept = _sweep(pol, snap)
    assert f.action == "advise" and swept.decisions == []  # the sweep advised once; its ladder is complete
    manual = _manual(pol, snap)
    (d,) = manual.decisions
    assert d.action == "none" and not d.acts and not d.destructive, d
    why = f"a {foreign} process, not ours: reported only"
    assert why in d.reason and manual.refused and why in manual.refused[0]["why"]
    assert d.evidence["foreign_owner"] == foreign and "act_on_owner" not in d.evidence
    # the reason is the sweep's own
    first = decide([f], pol, now=NOW, escalations={}).decisions[0]
    assert first.action == "advise" and manual.refused[0]["why"] in first.reason
    # an override of protections does not open it either
    from gpu_cost.loop import reclaim

    request = reclaim.parse_request({"target_kind": "process", "target_ids": [d.target.split(":", 1)[1].rsplit(":", 1)[0]],
                                     "action": "kill_process", "reason": "frees the GPU for the queue", "dry_run": False,
                                     "override_protections": True, "override_justification": "the lead agreed"},
                                    requested_by="ops")
    (o,) = reclaim.plan(request, pol, snap, now=NOW, run_key="r").decisions
    assert o.action == "none" and "override" not in o.evidence


@pytest.mark.parametrize(
    ("owners", "proc"),
    [("[]", {"user": "alice"}), ("[system]", {"user": "nobody"}), ("[nobody]", {"user": "nobody"})],
    ids=["a-person", "system-word", "named-system-account"],
)
def test_the_manual_reclaim_kills_what_the_sweep_kills(owners: str, proc: dict[str, object]) -> None:
    pol = policy(owners)
    snap = leftover_snapshot(pol, **proc)
    f, swept = _sweep(pol, snap)
    (s,) = swept.decisions
    (d,) = _manual(pol, snap).decisions
    assert (f.action, s.action, d.action) == ("kill_process",) * 3 and d.acts and d.mode == "enforce"
    assert d.evidence.get("act_on_owner") == f.evidence.get("act_on_owner")
