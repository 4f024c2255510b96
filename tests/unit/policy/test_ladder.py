"""The escalation ladder, rung by rung, across sweeps: table-driven, on a real (SQLite) audit store."""

from __future__ import annotations

import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.decide.snooze import snooze
from gpu_cost.loop import sweep
from tests.fixtures.core import NOW
from tests.unit.policy.helpers import (
    Effects,
    H,
    actions,
    install,
    job_finding,
    policy_from,
    process_finding,
    sweep_once,
)

ENFORCE = "mode: enforce\n"

# (minutes after the first sighting, the action the sweep at that instant decides; None: waits)
IDLE_LADDER = [
    (0, "notify"), (30, None), (60, "notify_manager"), (90, None), (120, "demote"), (180, "terminate"),
    (185, None), (190, "kill"), (200, None), (260, None),
]


@pytest.fixture
def effects(monkeypatch):  # type: ignore[no-untyped-def]
    e = Effects()
    install(monkeypatch, e)
    return e


def test_idle_allocation_ladder_rung_by_rung(store, effects) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(ENFORCE)
    for minutes, expected in IDLE_LADDER:
        now = NOW + minutes * 60
        p = sweep_once(store, policy, [job_finding("7", now=now)], now)
        got = [a for _, a in actions(p)]
        assert got == ([expected] if expected else []), f"at +{minutes} min"
    assert [a for a, _ in effects.calls] == ["notify", "notify_manager", "demote", "terminate", "kill"]
    esc = store.escalation("idle_allocation", "job:7", "live")
    assert esc["rung"] == 4 and esc["state"] == "open" and esc["episode"] == 1


def test_zombie_ladder_notify_then_kill_process(store, effects) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(ENFORCE)
    f = process_finding(now=NOW)
    assert actions(sweep_once(store, policy, [f], NOW)) == [(f.target, "notify")]
    assert actions(sweep_once(store, policy, [f], NOW + 600)) == []
    assert actions(sweep_once(store, policy, [f], NOW + 900)) == [(f.target, "kill_process")]
    assert effects.calls == [("notify", f.target), ("kill_process", f.target)]


def test_ladder_survives_a_restart(tmp_path, effects) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'a.db'}"
    policy = policy_from(ENFORCE)
    sweep_once(AuditStore(url).ensure_schema(), policy, [job_finding("8", now=NOW)], NOW)
    # a new store object on the same database: what a restarted worker sees
    p = sweep_once(AuditStore(url).ensure_schema(), policy, [job_finding("8", now=NOW + H)], NOW + H)
    assert actions(p) == [("job:8", "notify_manager")]


def test_a_new_episode_starts_from_the_first_rung(store, effects) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(ENFORCE)
    first = sweep_once(store, policy, [job_finding("9", now=NOW)], NOW)
    sweep_once(store, policy, [job_finding("9", now=NOW + H)], NOW + H)
    sweep_once(store, policy, [], NOW + 2 * H)  # the job was active again: the episode closes
    assert store.escalation("idle_allocation", "job:9", "live")["state"] == "closed"
    again = sweep_once(store, policy, [job_finding("9", now=NOW + 3 * H)], NOW + 3 * H)
    assert actions(again) == [("job:9", "notify")]
    assert again.decisions[0].episode == 2
    assert again.decisions[0].decision_id != first.decisions[0].decision_id


def test_degraded_snapshot_keeps_episodes_open_and_holds_destructive_rungs(store, effects) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(ENFORCE + "rules: {idle_allocation: {ladder: [{action: notify}, {action: cancel, after: 10m}]}}")
    sweep_once(store, policy, [job_finding("3", now=NOW)], NOW)
    sweep_once(store, policy, [], NOW + 300, degraded=True)
    assert store.escalation("idle_allocation", "job:3", "live")["state"] == "open"
    p = sweep_once(store, policy, [job_finding("3", now=NOW + H)], NOW + H, degraded=True)
    (d,) = p.decisions
    assert d.action == "cancel" and d.mode == "dry-run" and not d.acts and "degraded data" in d.reason
    assert ("cancel", "job:3") not in effects.calls


def test_same_instant_never_climbs_two_rungs(store, effects) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(ENFORCE + "rules: {idle_allocation: {ladder: [{action: notify}, {action: notify_manager}]}}")
    sweep_once(store, policy, [job_finding("4", now=NOW)], NOW)
    again = sweep_once(store, policy, [job_finding("4", now=NOW)], NOW)
    assert actions(again) == [] and again.waiting[0]["why"] == "already acted at this instant"
    later = sweep_once(store, policy, [job_finding("4", now=NOW + 60)], NOW + 60)
    assert actions(later) == [("job:4", "notify_manager")]


PROTECTION_CASES = [
    # level, expected actions over the whole ladder (one sweep every 2 h), executed effects
    (None, ["notify", "notify_manager", "demote", "terminate", "kill"], 5),
    ("never", ["none"], 0),
    ("notify_only", ["notify", "notify_manager"], 2),
    ("approval", ["notify", "notify_manager", "demote", "terminate", "kill"], 5),
]


@pytest.mark.parametrize(("level", "expected", "n_effects"), PROTECTION_CASES,
                         ids=[str(c[0]) for c in PROTECTION_CASES])
@pytest.mark.parametrize("by", ["users", "accounts", "partitions", "qos", "name_patterns", "labels", "nodes"])
def test_protection_levels_by_every_criterion(store, effects, level, expected, n_effects, by) -> None:  # type: ignore[no-untyped-def]
    value = {"users": "alice", "accounts": "acct", "partitions": "batch", "qos": "normal", "name_patterns": "tr*",
             "labels": "keep", "nodes": "g[0-9]"}[by]
    prot = "" if level is None else f"protections: [{{name: p, level: {level}, match: {{{by}: ['{value}']}}}}]\n"
    policy = policy_from(ENFORCE + prot)
    got: list[str] = []
    approvals: list[bool] = []
    for i in range(8):
        now = NOW + i * 2 * H
        p = sweep_once(store, policy, [job_finding("5", now=now, labels=("keep",))], now)
        got += [d.action for d in p.decisions]
        approvals += [d.requires_approval for d in p.decisions]
        if level is not None:
            assert all(d.protection == "p" for d in p.decisions)
    assert got == expected
    assert len(effects.calls) == n_effects
    if level == "approval":
        assert approvals == [False, False, True, True, True]  # destructive rungs need a human


def test_a_protection_that_does_not_match_changes_nothing(store, effects) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(ENFORCE + "protections: [{name: p, level: never, match: {users: [zed], accounts: [acct]}}]")
    p = sweep_once(store, policy, [job_finding("6", now=NOW)], NOW)
    assert actions(p) == [("job:6", "notify")] and p.decisions[0].protection is None


def test_most_restrictive_protection_wins(store, effects) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(ENFORCE + "protections: [{name: a, level: approval, match: {users: [alice]}}, "
                                   "{name: n, level: never, match: {accounts: [acct]}}]")
    p = sweep_once(store, policy, [job_finding("6", now=NOW)], NOW)
    assert [(d.action, d.protection) for d in p.decisions] == [("none", "n")]


def test_inference_services_are_only_advised(store, effects) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(ENFORCE)
    got = []
    for i in range(10):
        now = NOW + i * 2 * H
        got += [d.action for d in sweep_once(store, policy, [job_finding("11", now=now, inference=True)], now).decisions]
    assert got == ["advise"]
    assert effects.calls == [("advise", "job:11")]


MODE_CASES = [
    ("dry-run", ["notify", "notify_manager", "demote", "terminate", "kill"], []),
    ("notify", ["notify", "notify_manager", "demote", "demote", "demote"], ["notify", "notify_manager"]),
    ("enforce", ["notify", "notify_manager", "demote", "terminate", "kill"],
     ["notify", "notify_manager", "demote", "terminate", "kill"]),
]


@pytest.mark.parametrize(("mode", "decided", "executed"), MODE_CASES, ids=[c[0] for c in MODE_CASES])
def test_modes(store, effects, mode, decided, executed) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(f"mode: {mode}\n")
    got = []
    for i in range(5):
        now = NOW + i * 2 * H
        p = sweep_once(store, policy, [job_finding("12", now=now)], now)
        got += [d.action for d in p.decisions]
        if mode == "notify":
            for d in p.decisions:
                assert (d.mode == "dry-run") == (d.action == "demote")
    assert got == decided
    assert [a for a, _ in effects.calls] == executed


def test_stakes_above_threshold_need_approval(store, effects) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(ENFORCE + "approval: {gpu_hours_at_risk: 10}\n"
                                   "rules: {idle_allocation: {ladder: [{action: cancel}]}}")
    small = job_finding("21", gpus=2, ran_s=2 * H, now=NOW)   # 4 GPU-h at risk
    big = job_finding("22", gpus=8, ran_s=2 * H, now=NOW)     # 16 GPU-h at risk
    p = sweep_once(store, policy, [small, big], NOW, approve=False)
    by_job = {d.job_id: d for d in p.decisions}
    assert not by_job["21"].requires_approval and by_job["22"].requires_approval
    assert by_job["22"].gpu_hours_at_risk == pytest.approx(16.0)
    assert effects.calls == [("cancel", "job:21")]
    assert store.get_decision(by_job["22"].decision_id)["approval_status"] == "pending"


@pytest.mark.parametrize(("open_ended", "hours"), [(None, 24.0), ("6h", 6.0)])
def test_open_ended_waste_counts_the_policys_horizon(store, effects, open_ended, hours) -> None:  # type: ignore[no-untyped-def]
    """A zombie process has no time limit and no forecast: what killing it frees is ``cost.open_ended``."""
    text = ENFORCE + "rules: {zombie: {ladder: [{action: kill_process}]}}\n"
    if open_ended:
        text += f"cost: {{open_ended: {open_ended}}}\n"
    p = sweep_once(store, policy_from(text), [process_finding(gpus=2, now=NOW)], NOW, act=False)
    (d,) = p.decisions
    assert d.gpu_hours_saved == pytest.approx(2 * hours)
    assert d.evidence["stakes_basis"] == "default horizon"


def test_rejected_decision_is_not_asked_again(store, effects) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(ENFORCE + "approval: {gpu_hours_at_risk: 0}\nrules: {idle_allocation: {ladder: [{action: cancel}]}}")
    p = sweep_once(store, policy, [job_finding("23", now=NOW)], NOW, act=False)
    store.set_approval(p.decisions[0].decision_id, "rejected", "carol", NOW + 60)
    again = sweep_once(store, policy, [job_finding("23", now=NOW + 600)], NOW + 600)
    assert again.decisions == [] and "rejected by a human" in again.waiting[0]["why"]
    assert effects.calls == []


def test_a_decision_awaiting_an_answer_is_not_asked_again_by_later_sweeps(store, effects) -> None:  # type: ignore[no-untyped-def]
    """A run that asked a human is still waiting: the next sweeps neither ask again nor climb past it,
    and still act on everything else. Once the request is older than the approval timeout (its run
    died before asking), it no longer holds the target back."""
    policy = policy_from(ENFORCE + "approval: {gpu_hours_at_risk: 10, timeout: 1h}\n"
                                   "rules: {idle_allocation: {ladder: [{action: terminate}, {action: kill, after: 1m}]}}")
    big = job_finding("31", gpus=8, ran_s=2 * H, now=NOW)
    first = sweep_once(store, policy, [big], NOW, act=False)
    (asked,) = first.decisions
    assert asked.requires_approval and store.get_decision(asked.decision_id)["approval_status"] == "pending"
    assert sweep.awaiting_approval(store, policy, NOW + 600) == {asked.decision_id: f"test:{int(NOW)}"}
    small = job_finding("32", gpus=1, ran_s=H, now=NOW + 600)
    later = sweep_once(store, policy, [job_finding("31", gpus=8, ran_s=2 * H + 600, now=NOW + 600), small], NOW + 600)
    assert actions(later) == [("job:32", "terminate")]  # the other job is acted on
    (held,) = [w for w in later.waiting if w["target"] == "job:31"]
    assert held["why"] == f"awaiting approval (asked by run test:{int(NOW)})" and held["rung"] == 0
    assert effects.calls == [("terminate", "job:32")]
    # a request the timeout has long resolved (or that was never shown) holds nothing any more
    stale = NOW + policy.approval.timeout + policy.sweep.interval + 60
    assert sweep.awaiting_approval(store, policy, stale) == {}


def test_snooze_is_honoured_recorded_once_and_expires(store, effects) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(ENFORCE)
    sweep_once(store, policy, [job_finding("31", now=NOW)], NOW)  # notify
    snooze(store, "31", NOW + 4 * H, "rerunning the eval tomorrow", "alice", now=NOW + 60, policy=policy)
    for i in range(1, 4):
        p = sweep_once(store, policy, [job_finding("31", now=NOW + i * H)], NOW + i * H)
        assert p.decisions == [] and p.snoozed == ["job:31"]
    rows = store.query("SELECT * FROM gpu_cost_decisions WHERE status = 'snoozed'")
    assert len(rows) == 1 and rows[0]["action"] == "none"
    assert "snoozed (job:31)" in rows[0]["reason"] and "alice" in rows[0]["reason"] and "held back: notify_manager" in rows[0]["reason"]
    assert store.escalation("idle_allocation", "job:31", "live")["snooze_reason"] == "rerunning the eval tomorrow"
    after = sweep_once(store, policy, [job_finding("31", now=NOW + 5 * H)], NOW + 5 * H)
    assert actions(after) == [("job:31", "notify_manager")]
    assert [a for a, _ in effects.calls] == ["notify", "notify_manager"]


def test_user_and_node_snoozes_cover_their_targets(store, effects) -> None:  # type: ignore[no-untyped-def]
    policy = policy_from(ENFORCE)
    snooze(store, "user:alice", NOW + H, "conference demo all day", "alice", now=NOW - 60)
    snooze(store, "node:g1", NOW + H, "node under maintenance", "ops", now=NOW - 60)
    p = sweep_once(store, policy, [job_finding("32", now=NOW), process_finding(now=NOW)], NOW)
    assert p.decisions == [] and sorted(p.snoozed) == sorted(["job:32", process_finding(now=NOW).target])
