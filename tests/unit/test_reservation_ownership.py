"""Reservations are someone's property (issue 34): the idle-reservation rule releases only the agent's own
reservations, proven by its name prefix *and* its audit row; anyone else's gets notices to the administrators,
released only where the policy opts in and a human approves; a node without GPU metrics is unknown, not unused."""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_cost.act.notices.recipients import recipients
from gpu_cost.act.notices.render import next_step
from gpu_cost.analyse.rules import run_rules
from gpu_cost.capacity import reservations
from gpu_cost.config.loader import parse_policy
from gpu_cost.core.errors import PolicyError
from gpu_cost.core.model import (
    DESTRUCTIVE_ACTIONS,
    Decision,
    Finding,
    Node,
    Reservation,
    Snapshot,
    decision_id,
    empty_gpu_frame,
)
from gpu_cost.decide.engine import NOTICE_ACTIONS, Ask, decide, guard, may_act
from tests.fixtures.core import ROOT

H = 3600.0
NOW = 1_800_000_000.0
MINE = "gpu-cost-vision-2027011508"  # the agent's prefix (reservations.prefix)


def _policy(extra: str = "", mode: str = "enforce") -> Any:
    return parse_policy(f"version: 1\nmode: {mode}\n{extra}", "<test>")


def _idle(*hosts: str) -> pd.DataFrame:
    """GPU metrics of ``hosts``: one idle, fresh GPU each."""
    frame = empty_gpu_frame()
    rows = [{**{c: 0 for c in frame.columns}, "host": h, "gpu": 0, "uuid": "", "model": "a100", "label_job_id": "",
             "util_max": 0.0, "util_mean": 0.0, "stale": False, "util_chart_lb": ""} for h in hosts]
    return pd.DataFrame(rows, columns=frame.columns).astype({"stale": bool, "host": object})


def _resv(name: str = MINE, **kw: Any) -> Reservation:
    base: dict[str, Any] = {"start_ts": NOW - 3 * H, "end_ts": NOW + 5 * H, "nodes": ("gpu01", "gpu02"),
                            "node_count": 2, "accounts": ("vision",)}
    return Reservation(name=name, **{**base, **kw})


def _snap(*resv: Reservation, gpus: pd.DataFrame | None = None) -> Snapshot:
    nodes = tuple(Node(f"gpu0{i}", state="idle", gpus_total=8, partitions=("batch",)) for i in (1, 2, 3))
    return Snapshot(ts=NOW, window_s=900.0, lookback_s=6 * H, source="slurm",
                    gpus=_idle("gpu01", "gpu02", "gpu03") if gpus is None else gpus, nodes=nodes, reservations=resv)


def _found(policy: Any, *resv: Reservation, gpus: pd.DataFrame | None = None) -> dict[str, Finding]:
    return {f.target.split(":", 1)[1]: f for f in run_rules(_snap(*resv, gpus=gpus), policy, ["idle_reservation"])}


def _after_notice(f: Finding) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The escalation state of a finding whose notice went out three hours ago: the release rung is due."""
    return {(f.rule, f.target, "live"): {"state": "open", "episode": 1, "rung": 0, "first_seen": NOW - 3 * H,
                                         "last_action_at": NOW - 3 * H}}


# -- the proof of ownership: the name prefix AND the audit row --------------------------------------------
@pytest.mark.parametrize("made_by_agent, name, standing", [
    (True, MINE, "agent"),
    (False, MINE, "foreign"),                  # an administrator may name a reservation with the agent's prefix
    (True, "team-vision", "foreign"),          # an audit row alone, without the prefix, is not the proof either
], ids=["prefix and audit row", "prefix without audit row", "audit row without prefix"])
def test_a_reservation_is_the_agents_only_with_both_proofs(made_by_agent: bool, name: str, standing: str) -> None:
    p = _policy()
    f = _found(p, _resv(name, made_by_agent=made_by_agent))[name]
    assert f.evidence["standing"] == standing
    plan = decide([f], p, now=NOW, escalations=_after_notice(f), total_gpus=24)
    if standing == "agent":
        (d,) = plan.decisions
        assert (d.action, d.mode, d.requires_approval) == ("release_reservation", "enforce", False)
    else:
        # the shipped ladder (notify, release after 2 h) keeps its notice only: after it, the ladder is complete
        assert plan.decisions == [] and plan.waiting[0]["why"] == "ladder complete"


def _audit(store: Any, name: str, *, start: float, end: float, started: float, status: str = "succeeded",
           dry_run: bool = False, decision: bool = True, tag: str = "") -> None:
    """Write the audit rows the power run and the one execute step write for a ``reserve`` of ``name``."""
    d = Decision(decision_id=decision_id("forecast_peak", f"reservation:{name}{tag}", 1, 0), ts=started,
                 rule="forecast_peak", target_kind="reservation", target=f"reservation:{name}", action="reserve",
                 mode="enforce", gpus=8, reason="peak", evidence={"reservation": name, "start_ts": start,
                                                                 "end_ts": end, "standing": "agent"})
    if decision:
        store.record_decisions([d], "gpu_offhours_power:test")
    aid = f"{d.decision_id}:reserve"
    store.action_started(action_id=aid, decision_id=d.decision_id, run_id="gpu_offhours_power:test",
                         action="reserve", target=d.target, executor="test", dry_run=dry_run, started_at=started)
    store.action_finished(aid, status, started + 1)


@pytest.mark.parametrize("case, proven", [
    ("made by the agent", True),
    ("no audit row", False),
    ("dry-run only", False),
    ("already there when the agent came", False),
    ("began before the agent's reserve", False),
    ("ends elsewhere: made again by someone", False),
    ("an action without its decision", False),
    ("no prefix", False),
])
def test_mark_own_reads_the_audit_rows_of_the_agents_reserve(store, case: str, proven: bool) -> None:  # type: ignore[no-untyped-def]
    start, end = NOW - 3 * H, NOW + 5 * H
    name = "team-vision" if case == "no prefix" else MINE
    kw: dict[str, Any] = {"start": start, "end": end, "started": start - 30}
    if case == "dry-run only":
        kw["dry_run"] = True
    elif case == "already there when the agent came":
        kw["status"] = "skipped"  # the reserve executor's answer to a reservation of that name already there
    elif case == "began before the agent's reserve":
        kw["started"] = start + 3600
    elif case == "ends elsewhere: made again by someone":
        kw["end"] = end - 3600
    elif case == "an action without its decision":
        kw["decision"] = False
    if case != "no audit row":
        _audit(store, name, **kw)
    _audit(store, "gpu-cost-other-2027011508", start=start, end=end, started=start, tag="x")  # another one's row
    snap = _snap(_resv(name, made_by_agent=True), _resv("admin-weekly", made_by_agent=True, flags=("WEEKLY",)))
    reservations.mark_own(store, snap, _policy())
    marked = {r.name: r.made_by_agent for r in snap.reservations}
    assert marked == {name: proven, "admin-weekly": False}, case
    f = _found(_policy(), *snap.reservations)[name]
    assert f.evidence["standing"] == ("agent" if proven else "foreign")


# -- someone else's reservation: notices to the administrators, never a release ---------------------------
def test_someone_elses_reservation_gets_notices_to_the_administrators_and_no_release() -> None:
    p = _policy("people: {ops: {slack: U0OPS}, carol: {email: carol@example.org}}\n"
                "rules: {idle_reservation: {administrators: [ops, carol]}}\n")
    f = _found(p, _resv("admin-weekly-train", users=("root",), flags=("WEEKLY",)))["admin-weekly-train"]
    assert f.evidence["standing"] == "foreign" and f.evidence["administrators"] == ["ops", "carol"]
    (d,) = decide([f], p, now=NOW, escalations={}, total_gpus=24).decisions
    assert (d.action, d.mode) == ("notify", "enforce")
    assert "not the agent's own reservation (it is root's)" in d.reason and "never released" in d.reason
    assert [(r.user, r.role, r.slack) for r in recipients(d, p)] == [("ops", "administrator", "U0OPS"),
                                                                     ("carol", "administrator", None)]
    assert next_step(d, p, NOW) is None  # the notice says nothing more is scheduled
    # the next sweeps: the ladder is complete, whatever the time
    for later in (2 * H + 60, 30 * 86400):
        plan = decide([f], p, now=NOW + later, escalations=_after_notice(f), total_gpus=24)
        assert plan.decisions == [] and plan.waiting[0]["why"] == "ladder complete"
    # the agent's own: the notice names the release that follows, and goes to its owner as before
    mine = _found(p, _resv(made_by_agent=True))[MINE]
    (d,) = decide([mine], p, now=NOW, escalations={}, total_gpus=24).decisions
    assert "administrators" not in d.evidence and (next_step(d, p, NOW) or {}).get("action") == "release_reservation"


def test_every_way_in_refuses_to_release_someone_elses_reservation() -> None:
    p = _policy("manual: {operators: [opal]}\n")
    f = _found(p, _resv("dc-maintenance", users=("root",), flags=("OVERLAP",)))["dc-maintenance"]
    for ask in (Ask(), Ask(entry="manual", mode="enforce", requested_by="opal"), Ask(entry="replay")):
        v = guard(f, "release_reservation", p, now=NOW, ask=ask)
        assert v.action == "none" and "someone else's reservation" in (v.refusal or ""), ask
    # a finding that does not say whose it is counts as someone else's
    bare = dataclasses.replace(f, evidence={k: v for k, v in f.evidence.items() if k != "standing"})
    assert guard(bare, "release_reservation", p, now=NOW).action == "none"
    # the agent's own reservation-to-be is made as before
    proposal = reservations.Proposal(account="vision", name=MINE, start_ts=NOW, end_ts=NOW + H, node_count=1, gpus=8,
                                     shortfall_gpus=8, peak_upper=16, free_gpus=8)
    (d,) = reservations.decisions_for([proposal], _policy("reservations: {enabled: true}\n"), NOW, "enforce")
    assert (d.action, d.mode) == ("reserve", "enforce")


# -- the policy's opt-in: still a human's approval, whatever the threshold --------------------------------
OPT_IN = ("approval: {gpu_hours_at_risk: 1000000}\n"
          "rules: {idle_reservation: {release_foreign: {users: [svc-batch], names: ['scratch-*']}}}\n")


@pytest.mark.parametrize("resv, standing", [
    (_resv("nightly", users=("svc-batch",)), "opted_in"),
    (_resv("scratch-7", users=("alice",)), "opted_in"),
    (_resv("shared", users=("svc-batch", "alice")), "foreign"),  # alice did not opt in
    (_resv("nightly", accounts=("svc-batch",)), "foreign"),       # an account is not a user
], ids=["its user", "its name", "one of its users", "an account of that name"])
def test_an_opted_in_reservation_is_released_only_with_a_humans_approval(resv: Reservation, standing: str) -> None:
    p = _policy(OPT_IN)
    f = _found(p, resv)[resv.name]
    assert f.evidence["standing"] == standing
    plan = decide([f], p, now=NOW, escalations=_after_notice(f), total_gpus=24)
    if standing == "foreign":
        assert plan.decisions == []
        return
    (d,) = plan.decisions
    assert (d.action, d.requires_approval) == ("release_reservation", True)
    assert "release_foreign" in d.reason
    row = {**d.to_dict(), "status": "decided"}
    for answer in (None, "pending", "rejected", "timed_out"):
        assert not may_act({**row, "approval_status": answer}), answer
    assert may_act({**row, "approval_status": "approved"})


standings = st.sampled_from(["agent", "opted_in", "foreign", None, "AGENT", "mine"])


@functools.cache
def _ladder_policy(opted: bool, last: str) -> Any:
    return _policy("manual: {operators: [opal]}\n"
                   f"rules: {{idle_reservation: {{ladder: [{{action: notify}}, {{action: {last}, after: 1h}}]"
                   + (", release_foreign: {users: [bob]}" if opted else "") + "}}\n")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(standings, st.booleans(), st.integers(-1, 3), st.floats(0, 48 * H), st.integers(0, 10_000_000),
       st.sampled_from(["notify", "release_reservation", "notify_manager"]), st.booleans())
def test_without_the_proof_nothing_is_released_without_a_human(standing: str | None, opted: bool, rung: int,
                                                               ago: float, threshold: int, last: str,
                                                               manual: bool) -> None:
    """Whatever the ladder, its state, the approval threshold and the way in: a reservation the evidence does not
    prove the agent's is never released on the agent's word; one the policy opts in always waits for a human."""
    p = _ladder_policy(opted, last)
    p = dataclasses.replace(p, approval=dataclasses.replace(p.approval, gpu_hours_at_risk=float(threshold)))
    ev = {"reservation": "r1", "users": ["bob"], "unused_nodes": ["gpu01"], "node_count": 1}
    if standing is not None:
        ev["standing"] = standing
    f = Finding(rule="idle_reservation", target_kind="reservation", target="reservation:r1",
                action="release_reservation", gpus=8, user="bob", nodes=("gpu01",), evidence=ev)
    esc = {(f.rule, f.target, "live"): {"state": "open", "episode": 1, "rung": rung, "first_seen": NOW - ago - 1,
                                        "last_action_at": NOW - ago if rung >= 0 else None}}
    decisions = decide([f], p, now=NOW, escalations=esc, total_gpus=64).decisions
    verdicts = [(d.action, d.requires_approval) for d in decisions]
    if manual:
        v = guard(f, "release_reservation", p, now=NOW, ask=Ask(entry="manual", requested_by="opal"))
        verdicts.append((v.action, v.requires_approval))
    for action, approval in verdicts:
        if standing == "agent":
            continue
        if standing == "opted_in":
            assert action not in DESTRUCTIVE_ACTIONS or approval
        else:
            assert action in NOTICE_ACTIONS or action == "none"


# -- no GPU metrics: unknown, not unused --------------------------------------------------------------------
@pytest.mark.parametrize("gpus", [empty_gpu_frame(), _idle("gpu01"), _idle("gpu03")],
                         ids=["no metrics at all", "one unused node without metrics", "metrics of other nodes only"])
def test_a_reservation_whose_nodes_have_no_gpu_metrics_is_not_found(gpus: pd.DataFrame) -> None:
    p = _policy()
    assert _found(p, _resv("admin-weekly", flags=("WEEKLY",)), gpus=gpus) == {}
    # even the agent's own: nothing that could lead to a release
    assert _found(p, _resv(made_by_agent=True), gpus=gpus) == {}
    # with the metrics: found
    assert set(_found(p, _resv(made_by_agent=True), gpus=_idle("gpu01", "gpu02"))) == {MINE}


# -- the policy keys ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, where", [
    ("rules: {idle_reservation: {release_foreign: {owners: [bob]}}}", r"release_foreign\.owners: unknown key"),
    ("rules: {idle_reservation: {release_foreign: {names: ['*']}}}", r"release_foreign\.names\[0\]: .* every reservation"),
    ("rules: {idle_reservation: {release_foreign: {names: ['']}}}", r"release_foreign\.names\[0\]"),
    ("rules: {idle_reservation: {release_foreign: {users: [bob, bob]}}}", r"release_foreign\.users: lists a user twice"),
    ("rules: {idle_reservation: {release_foreign: {users: ['a b']}}}", r"release_foreign\.users\[0\]: 'a b' is not"),
    ("rules: {idle_reservation: {administrators: ops}}", r"idle_reservation\.administrators"),
    ("rules: {idle_reservation: {admins: [ops]}}", r"idle_reservation\.admins: unknown key"),
])
def test_the_ownership_keys_are_validated(text: str, where: str) -> None:
    with pytest.raises(PolicyError, match=where):
        parse_policy(f"version: 1\n{text}\n", "<test>")


def test_the_shipped_policy_only_notifies_about_other_peoples_reservations() -> None:
    from gpu_cost.config.loader import load_policy

    shipped = load_policy(ROOT / "include" / "policy" / "default.yaml")
    rule = shipped.rules.idle_reservation
    for mode in ("dry-run", "notify", "enforce"):
        p = dataclasses.replace(shipped, mode=mode)
        for resv in (_resv("admin-weekly-train", users=("root",), flags=("WEEKLY",)),
                     _resv("dc-maintenance", users=("root",), flags=("OVERLAP",)), _resv(MINE)):
            f = _found(p, resv)[resv.name]
            for state in ({}, _after_notice(f)):
                for d in decide([f], p, now=NOW, escalations=state, total_gpus=24).decisions:
                    assert d.action in NOTICE_ACTIONS, (mode, resv.name, d.action)
    assert rule.release_foreign.users == () and rule.release_foreign.names == ()
    assert json.dumps(dataclasses.asdict(rule.release_foreign)) == '{"users": [], "names": []}'

