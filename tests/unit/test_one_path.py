"""One decision path: every way in passes the engine's guards, and none can lower the bar.

The guards themselves (:func:`gpu_cost.decide.engine.guard`), the manual reclaim built on them,
named and pinned policies, the approval's second person, and the caps (per run and rolling).
"""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_cost.config.schema import Match, Protection
from gpu_cost.core.errors import PolicyError
from gpu_cost.core.model import DESTRUCTIVE_ACTIONS, Decision, Job, Snapshot, empty_gpu_frame
from gpu_cost.decide.engine import Ask, check_caps, guard, rolling_cap_violation
from gpu_cost.loop import reclaim
from tests.unit.policy.helpers import H, job_finding, policy_from

NOW = 1_795_960_800.0


# -- named policies ------------------------------------------------------------------------------
@pytest.fixture
def policy_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "prod.yaml").write_text("mode: enforce\nmanual: {operators: [ops]}\n")
    (tmp_path / "loose.yaml").write_text("mode: enforce\nprotections: []\n")
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(folder))
    return folder


@pytest.mark.parametrize("asked", ["/etc/passwd", "../loose", "../loose.yaml", "sub/prod", "nope", ".hidden",
                                   "prod; rm -rf /"])
def test_a_run_names_a_policy_of_the_deployment_never_a_path(policy_dir: Path, asked: str) -> None:
    from gpu_cost.airflow import runtime

    with pytest.raises(PolicyError, match=r"not a policy of the deployment's policy directory .*available: prod"):
        runtime.resolve_policy(asked)


def test_names_resolve_in_the_policy_directory(policy_dir: Path) -> None:
    from gpu_cost.airflow import runtime

    assert runtime.resolve_policy("prod") == policy_dir / "prod.yaml"
    assert runtime.resolve_policy("prod.yaml") == policy_dir / "prod.yaml"
    assert runtime.policy_from({"policy": "prod"}).mode == "enforce"
    assert runtime.policy_names() == ["prod"]


def test_the_form_field_itself_refuses_a_path(policy_dir: Path) -> None:
    from airflow.sdk import Param
    from airflow.sdk.exceptions import ParamValidationError

    from gpu_cost.airflow import runtime

    param = runtime.policy_param()
    # the form suggests the shipped names, never the directory's (a new file must not re-version the DAG)
    assert isinstance(param, Param) and param.schema["examples"] == list(runtime.SHIPPED_POLICIES)
    assert param.resolve("prod") == "prod"
    with pytest.raises(ParamValidationError):
        param.resolve("/work/include/policy/default.yaml")


def test_a_run_decides_under_the_policy_it_pinned(policy_dir: Path, store) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.airflow import runtime

    pinned = runtime.pin_policy(store, "gpu_zombie_sweep:r1", {"policy": "prod"})
    (policy_dir / "prod.yaml").write_text("mode: dry-run\n")  # edited mid-run
    later = runtime.run_policy(store, "gpu_zombie_sweep:r1")
    assert pinned.mode == later.mode == "enforce" and later.manual.operators == ("ops",)
    assert "pinned for gpu_zombie_sweep:r1" in later.source
    assert runtime.pin_policy(store, "gpu_zombie_sweep:r1", {"policy": "prod"}).mode == "enforce"  # a retry
    assert runtime.pin_policy(store, "gpu_zombie_sweep:r2", {"policy": "prod"}).mode == "dry-run"  # a new run
    with pytest.raises(PolicyError, match="pinned no policy"):
        runtime.run_policy(store, "gpu_zombie_sweep:never-started")


def test_a_pinned_policy_whose_content_was_rewritten_is_refused(policy_dir: Path, store) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.airflow import runtime

    runtime.pin_policy(store, "gpu_manual_reclaim:r1", {"policy": "prod"})
    with store.engine.begin() as conn:  # the owner could; the agent's role has no UPDATE (test_grants)
        conn.exec_driver_sql("UPDATE gpu_cost_run_policies SET content = 'mode: enforce\nprotections: []\n'")
    with pytest.raises(PolicyError, match="does not match its hash"):
        runtime.run_policy(store, "gpu_manual_reclaim:r1")


# -- the manual reclaim under the engine's guards --------------------------------------------------
JOB = Job(job_id="7", user="carol", start_ts=NOW - 10 * H, account="ml", partition="batch", name="train-7",
          time_limit_s=48 * H, gpu_alloc=(("g1", (0, 1)),), labels=())


def snap(*jobs: Job, gpus: int = 64) -> Snapshot:
    return Snapshot(ts=NOW, window_s=900, lookback_s=6 * H, source="prometheus",
                    gpus=empty_gpu_frame().reindex(range(gpus)), jobs=jobs or (JOB,))


def ask(action: str = "cancel", *, dry_run: bool = False, by: str | None = "ops", ids: tuple[str, ...] = ("7",),
        override: str | None = None) -> reclaim.Request:
    params = {"target_kind": "job", "target_ids": list(ids), "action": action, "reason": "freeing idle GPUs now",
              "dry_run": dry_run, "override_protections": override is not None, "override_justification": override}
    return reclaim.parse_request(params, requested_by=by)


ENFORCE = "mode: enforce\napproval: {gpu_hours_at_risk: 1000}\nmanual: {operators: [ops], override_approvers: [lead, ops]}\n"


def one(request: reclaim.Request, policy_text: str = ENFORCE, snapshot: Snapshot | None = None) -> Decision:
    (d,) = reclaim.plan(request, policy_from(policy_text), snapshot or snap(), now=NOW, run_key="r").decisions
    return d


@pytest.mark.parametrize(("policy_mode", "mode", "why"), [
    ("dry-run", "dry-run", "asked for enforce, the policy's mode dry-run is the ceiling"),
    ("notify", "dry-run", "mode notify: would cancel"),
    ("enforce", "enforce", None),
])
def test_the_policy_mode_is_the_ceiling_of_a_manual_request(policy_mode: str, mode: str, why: str | None) -> None:
    d = one(ask(), ENFORCE.replace("mode: enforce", f"mode: {policy_mode}"))
    assert d.action == "cancel" and d.mode == mode and d.acts == (mode == "enforce")
    if why:
        assert why in d.reason
    # a request may be milder than the policy: dry_run under enforce records only
    assert not one(ask(dry_run=True)).acts


@pytest.mark.parametrize(("by", "acts", "why"), [
    ("ops", True, None),                               # a named operator: anyone's job
    ("carol", True, None),                             # the owner: her own job
    ("mallory", False, "mallory may not cancel job:7: only its owner (carol) or one of manual.operators"),
    (None, False, "needs a requester the scheduler knows"),
])
def test_who_may_ask_for_a_destructive_action_is_the_policys_word(by: str | None, acts: bool, why: str | None) -> None:
    p = reclaim.plan(ask(by=by), policy_from(ENFORCE), snap(), now=NOW, run_key="r")
    (d,) = p.decisions
    assert d.acts == acts and (d.action == "cancel") == acts
    if why:
        assert why in p.refused[0]["why"]
    # anyone who can trigger the DAG may still send a notice (recorded with their name)
    assert one(ask("notify", by=by)).acts


def test_owners_may_not_reclaim_when_the_policy_says_so() -> None:
    d = one(ask(by="carol"), ENFORCE.replace("manual: {", "manual: {owners_may_reclaim: false, "))
    assert not d.acts and "only its owner (carol) or one of manual.operators" in d.reason


PROTECTED = ENFORCE + "protections: [{name: keep, level: never, match: {users: [carol]}}]\n"


def test_an_override_needs_an_approver_who_is_not_the_requester() -> None:
    d = one(ask(override="the lead agreed in ticket 42"), PROTECTED)
    assert d.action == "cancel" and d.requires_approval and d.evidence["approvers"] == ["lead"]
    solo = PROTECTED.replace("override_approvers: [lead, ops]", "override_approvers: [ops]")
    p = reclaim.plan(ask(override="the lead agreed in ticket 42"), policy_from(solo), snap(), now=NOW, run_key="r")
    assert p.decisions[0].action == "none" and "an approver from manual.override_approvers who is not the requester" \
        in p.refused[0]["why"]


def test_a_dry_run_never_waits_for_an_approval() -> None:
    d = one(ask(dry_run=True, override="the lead agreed in ticket 42"), PROTECTED)
    assert d.mode == "dry-run" and not d.requires_approval and not d.acts


def test_a_manual_power_down_passes_the_off_hours_checks() -> None:
    from gpu_cost.core.model import Node

    nodes = tuple(Node(name=f"n{i}", state="idle", gpus_total=8, partitions=("batch",)) for i in range(6))
    s = dataclasses.replace(snap(gpus=0), nodes=nodes, jobs=())
    policy = policy_from(ENFORCE + "offhours: {max_nodes_per_run: 2, warm_reserve_nodes: 1, require_gpu_metrics: false,"
                                   " exclude_nodes: [n5]}\n")
    request = reclaim.parse_request({"target_kind": "node", "target_ids": ["n0", "n1", "n2", "n5"],
                                     "action": "power_down", "reason": "nobody uses these tonight"}, "ops")
    with pytest.raises(reclaim.ReclaimRequestError) as err:
        reclaim.plan(request, policy, s, now=NOW, run_key="r")
    text = str(err.value)
    assert "node n5: excluded by offhours.exclude_nodes" in text
    assert "max_nodes_per_run=2" in text


# -- the approval: a second person ---------------------------------------------------------------
def test_the_requester_is_never_a_permitted_approver() -> None:
    from gpu_cost.airflow.approval import approval_text, permitted_approvers

    rows = [{"evidence": '{"requested_by": "ops", "approvers": ["lead"]}', "target": "job:7", "action": "cancel",
             "user_name": "carol", "gpus": 2, "gpu_hours_at_risk": 20.0, "gpu_hours_saved": 4.0, "reason": "r",
             "decision_id": "d1", "ts": NOW}]
    named, requesters = permitted_approvers(rows, policy_from(ENFORCE))
    assert named == ["lead"] and requesters == {"ops"}
    sweep_policy = policy_from(ENFORCE.replace("approval: {", "approval: {assigned_users: [ops, lead], "))
    assert permitted_approvers([{**rows[0], "evidence": '{"requested_by": "ops"}'}], sweep_policy) == (["lead"], {"ops"})
    assert permitted_approvers([{**rows[0], "evidence": "{}"}], policy_from(ENFORCE)) == (None, set())
    assert approval_text(rows, policy_from(ENFORCE), "manual")[1].startswith("A manual reclaim asks to act")
    assert approval_text(rows, policy_from(ENFORCE), "sweep")[1].startswith("The sweep wants to act")


def test_an_answer_by_the_requester_is_refused_and_recorded(store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.airflow import approval, runtime

    monkeypatch.setattr(runtime, "store", lambda: store)
    run_id = "gpu_manual_reclaim:r-self"
    store.execute("pin_policy", {"run_id": run_id, "name": "t", "sha256": runtime._sha256(PROTECTED),
                                 "content": PROTECTED, "pinned_at": NOW})
    d = one(ask(override="the lead agreed in ticket 42"), PROTECTED)
    store.record_decisions([d], run_id)
    pushed: dict[str, object] = {}
    ti = types.SimpleNamespace(xcom_push=lambda key, value: pushed.update({key: value}))
    dag_run = types.SimpleNamespace(dag_id="gpu_manual_reclaim", run_id="r-self")
    op = approval.RecordingApprovalOperator(task_id="approve", notifiers=[])
    completed: list[dict[str, object]] = []
    monkeypatch.setattr(approval.ApprovalOperator, "execute_complete",
                        lambda self, context, event: completed.append(event))
    op.execute_complete({"ti": ti, "dag_run": dag_run}, {"chosen_options": ["Approve"], "responded_at": NOW,
                                                        "responded_by_user": {"id": "ops", "name": "ops"}})
    row = store.get_decision(d.decision_id)
    assert row["approval_status"] == "refused" and row["approved_by"] == "ops" and row["status"] == "rejected"
    assert "ops requested these actions and may not approve them" in str(pushed["decision"])
    assert completed[0]["chosen_options"] == ["Reject"]  # downstream is skipped as on a Reject


# -- caps ------------------------------------------------------------------------------------------
def decision(action: str = "cancel", gpus: int = 8, target: str = "job:1") -> Decision:
    return Decision(decision_id=f"d-{target}-{action}", ts=NOW, rule="idle_allocation", target_kind="job",
                    target=target, action=action, mode="enforce", gpus=gpus)


def test_a_cluster_of_unknown_size_gets_no_destructive_action() -> None:
    policy = policy_from(ENFORCE)
    assert "unknown size" in (check_caps([decision()], policy, 0) or "")
    assert check_caps([decision("notify")], policy, 0) is None
    assert check_caps([decision()], dataclasses.replace(policy, caps=dataclasses.replace(policy.caps, cluster_gpus=800)),
                      0) is None
    # powering an idle node down touches no work: its GPUs do not count in the share
    assert check_caps([decision("power_down", 8, "node:n1")], policy, 16) is None
    assert "max_gpu_share" in (check_caps([decision("cancel", 8)], policy, 16) or "")


def history(*rows: tuple[float, int, str, str, str]) -> list[dict[str, object]]:
    return [{"started_at": t, "gpus": g, "entry": e, "target": tg, "action": a} for t, g, e, tg, a in rows]


def test_rolling_caps_count_every_way_in_per_hour_and_day() -> None:
    policy = policy_from(ENFORCE + "caps: {rolling: {max_actions_per_hour: 2, max_actions_per_day: 3, "
                                   "max_gpu_share_per_hour: 0.5}, entry_points: {manual: {max_actions_per_hour: 1}}}\n")
    d = decision(gpus=1, target="job:9")
    an_hour = history((NOW - 600, 1, "sweep", "job:1", "cancel"), (NOW - 1200, 1, "manual", "job:2", "cancel"))
    assert "caps.rolling.max_actions_per_hour=2" in (rolling_cap_violation(an_hour, d, policy, entry="sweep",
                                                                          total_gpus=100, now=NOW) or "")
    old = history((NOW - 7200, 1, "sweep", "job:1", "cancel"), (NOW - 9000, 1, "sweep", "job:2", "cancel"),
                  (NOW - 600, 1, "sweep", "job:3", "kill"))
    assert "max_actions_per_day=3" in (rolling_cap_violation(old, d, policy, entry="sweep", total_gpus=100,
                                                             now=NOW) or "")
    one_manual = history((NOW - 600, 1, "manual", "job:1", "cancel"))
    assert "caps.entry_points.manual.max_actions_per_hour=1" in (
        rolling_cap_violation(one_manual, d, policy, entry="manual", total_gpus=100, now=NOW) or "")
    assert rolling_cap_violation(one_manual, d, policy, entry="sweep", total_gpus=100, now=NOW) is None
    # GPUs touched in the hour: each target once, power-downs not at all
    policy = policy_from(ENFORCE + "caps: {rolling: {max_gpu_share_per_hour: 0.5}}\n")
    big = history((NOW - 600, 40, "sweep", "job:1", "terminate"), (NOW - 500, 40, "sweep", "job:1", "kill"))
    assert rolling_cap_violation(big, decision(gpus=9, target="job:9"), policy, entry="sweep", total_gpus=100,
                                 now=NOW) is None
    assert "max_gpu_share_per_hour=50%" in (rolling_cap_violation(
        big, decision(gpus=11, target="job:9"), policy, entry="sweep", total_gpus=100, now=NOW) or "")
    assert rolling_cap_violation(big, decision("power_down", 80, "node:n1"), policy, entry="power", total_gpus=100,
                                 now=NOW) is None


# -- the property: no way in acts where the sweep's guards would not ------------------------------
LEVELS = st.sampled_from(["never", "notify_only", "approval"])
USERS = st.sampled_from(["carol", "dave", "ops", "lead"])


@st.composite
def scenario(draw):  # type: ignore[no-untyped-def]
    mode = draw(st.sampled_from(["dry-run", "notify", "enforce"]))
    protections = tuple(
        Protection(name=f"p{i}", level=draw(LEVELS), match=m)
        for i, m in enumerate(draw(st.lists(st.sampled_from([
            Match(users=("carol",)), Match(accounts=("ml",)), Match(partitions=("batch",)), Match(qos=("high",)),
            Match(labels=("no-interrupt",)), Match(name_patterns=("*serve*",)), Match(nodes=("g1",))]), max_size=2))))
    policy = policy_from(f"mode: {mode}\n", protections=protections)
    manual = dataclasses.replace(policy.manual, operators=tuple(draw(st.lists(USERS, max_size=2))),
                                 override_approvers=tuple(draw(st.lists(USERS, max_size=2))),
                                 owners_may_reclaim=draw(st.booleans()))
    policy = dataclasses.replace(policy, manual=manual,
                                 approval=dataclasses.replace(policy.approval, gpu_hours_at_risk=draw(
                                     st.sampled_from([0.5, 10.0, 1000.0]))))
    f = job_finding("7", user=draw(USERS), gpus=draw(st.integers(1, 8)), ran_s=draw(st.sampled_from([600.0, 5 * H])),
                    now=NOW, account=draw(st.sampled_from(["ml", "cv"])), qos=draw(st.sampled_from(["normal", "high"])),
                    name=draw(st.sampled_from(["train", "llm-serve"])), labels=tuple(draw(st.lists(
                        st.sampled_from(["no-interrupt", "inference"]), max_size=1))))
    action = draw(st.sampled_from(["notify", "demote", "terminate", "kill", "cancel"]))
    a = Ask(entry="manual", mode=draw(st.sampled_from(["dry-run", "enforce"])), requested_by=draw(
        st.one_of(st.none(), USERS)), override=draw(st.one_of(st.none(), st.just("the lead agreed in ticket 42"))))
    return policy, f, action, a, draw(st.booleans())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_no_way_in_acts_where_the_sweep_would_not(case) -> None:  # type: ignore[no-untyped-def]
    policy, f, action, a, degraded = case
    problems = ("metrics stale",) if degraded else ()
    sweep = guard(f, action, policy, now=NOW, degraded=degraded, problems=problems)
    manual = guard(f, action, policy, now=NOW, ask=a, degraded=degraded, problems=problems)
    destructive = manual.action in DESTRUCTIVE_ACTIONS
    acts = manual.mode != "dry-run" and manual.action != "none"
    # the policy's mode is the ceiling: never stronger than the sweep's
    order = {"dry-run": 0, "notify": 1, "enforce": 2}
    assert order[manual.mode] <= order[sweep.mode if sweep.mode != "dry-run" else policy.mode]
    if not (acts and destructive):
        return
    assert not degraded and policy.mode == "enforce"
    assert a.requested_by is not None
    assert a.requested_by in policy.manual.operators or (policy.manual.owners_may_reclaim and a.requested_by == f.user)
    if a.override is None:
        # without an override the manual request is held exactly where the sweep is held
        assert sweep.action == manual.action and sweep.mode == "enforce"
        assert manual.requires_approval or not sweep.requires_approval
    else:
        # an override acts only with the approval of a named approver who is not the requester
        overridden = sweep.action == "none" or sweep.action != manual.action
        if overridden:
            assert manual.requires_approval
            assert a.requested_by not in manual.evidence["approvers"]
            assert set(manual.evidence["approvers"]) <= set(policy.manual.override_approvers)


@pytest.mark.parametrize(("answer", "skips"), [("approved", False), ("rejected", True), ("refused", True)])
def test_a_retried_approval_task_replays_the_recorded_answer(store, monkeypatch, answer: str, skips: bool) -> None:  # type: ignore[no-untyped-def]
    """A retry of ``approve`` after the answer (a worker lost mid-commit) must not skip the approved actions."""
    from airflow.sdk.exceptions import AirflowSkipException

    from gpu_cost.airflow import approval, runtime

    monkeypatch.setattr(runtime, "store", lambda: store)
    run_id = "gpu_manual_reclaim:r-retry"
    store.execute("pin_policy", {"run_id": run_id, "name": "t", "sha256": runtime._sha256(PROTECTED),
                                 "content": PROTECTED, "pinned_at": NOW})
    d = one(ask(override="the lead agreed in ticket 42"), PROTECTED)
    store.record_decisions([d], run_id)
    store.set_approval(d.decision_id, answer, "lead", NOW)
    pushed: dict[str, object] = {}
    context = {"ti": types.SimpleNamespace(xcom_push=lambda key, value: pushed.update({key: value})),
               "dag_run": types.SimpleNamespace(dag_id="gpu_manual_reclaim", run_id="r-retry")}
    op = approval.RecordingApprovalOperator(task_id="approve", notifiers=[])
    if skips:
        with pytest.raises(AirflowSkipException, match=f"answered already: {answer}"):
            op.execute(context)
    else:
        assert op.execute(context) is None
    decision = pushed["decision"]
    assert isinstance(decision, dict) and decision["replayed"] is True and decision["by"] == "lead"
    assert decision["status"] == answer and decision["decision_ids"] == [d.decision_id]
