"""Reservations: the scontrol parser, the idle-reservation rule, the forecast-peak planner and its guards."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from gpu_cost.act.base import ActionContext
from gpu_cost.act.reservation import create_argv, release_reservation, reserve
from gpu_cost.analyse.rules import run_rules
from gpu_cost.analyse.rules.idle_reservation import IdleReservationRule
from gpu_cost.capacity.reservations import decisions_for, plan_reservations
from gpu_cost.config.schema import Match, Policy, Protection, ReservationsConfig, Rules
from gpu_cost.core.errors import SourceError
from gpu_cost.core.model import Job, Node, Reservation, Snapshot, empty_gpu_frame
from gpu_cost.decide.engine import may_act
from gpu_cost.perceive.slurm import key_values, parse_reservations

HOUR = 3600.0
NOW = 1_800_000_000.0  # on the hour
LINE = ("ReservationName=team-a StartTime=1799990000 EndTime=1800050000 Duration=16:40:00 Nodes=gpu[01-02] "
        "NodeCnt=2 CoreCnt=8 Features=(null) PartitionName=batch Flags=IGNORE_JOBS,SPEC_NODES TRES=cpu=8,gres/gpu=8 "
        "Users=alice,-bob Groups=(null) Accounts=vision Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a "
        "MaxStartDelay=(null)")


def test_scontrol_reservations_are_parsed_with_values_holding_equals() -> None:
    assert key_values(LINE)["TRES"] == "cpu=8,gres/gpu=8"
    (r,) = parse_reservations(LINE + "\n\n")
    assert (r.name, r.start_ts, r.end_ts, r.nodes, r.node_count) == ("team-a", 1799990000.0, 1800050000.0,
                                                                       ("gpu01", "gpu02"), 2)
    assert (r.accounts, r.users, r.partition, r.flags, r.active) == (("vision",), ("alice",), "batch",
                                                                     ("IGNORE_JOBS", "SPEC_NODES"), True)
    assert parse_reservations("No reservations in the system\n") == []
    # Slurm's default time text (local time) is read too
    (r2,) = parse_reservations(LINE.replace("StartTime=1799990000", "StartTime=2027-01-15T09:30:00"))
    assert r2.start_ts == pytest.approx(pd.Timestamp("2027-01-15T09:30:00").timestamp(), abs=86400)


@pytest.mark.parametrize("bad, what", [
    (LINE.replace("ReservationName=team-a ", ""), "ReservationName is missing"),
    (LINE.replace("StartTime=1799990000", "StartTime=soon"), "StartTime is 'soon'"),
])
def test_a_malformed_reservation_line_names_the_line_and_the_field(bad: str, what: str) -> None:
    with pytest.raises(SourceError, match=rf"line 2 .*{what}"):
        parse_reservations("No reservations in the system\n" + bad if "Name" not in what else "\n" + bad)


def _frame(rows: list[tuple[str, float, bool]]) -> pd.DataFrame:
    frame = empty_gpu_frame()
    data = [{**{c: 0 for c in frame.columns}, "host": h, "gpu": 0, "uuid": "", "model": "a100", "label_job_id": "",
             "util_max": u, "util_mean": u, "stale": st, "util_chart_lb": ""} for h, u, st in rows]
    return pd.DataFrame(data, columns=frame.columns).astype({"stale": bool, "host": object})


def _snap(resv: tuple[Reservation, ...], jobs: tuple[Job, ...] = (), gpus: pd.DataFrame | None = None,
          ts: float = NOW) -> Snapshot:
    nodes = tuple(Node(f"gpu0{i}", state="idle", gpus_total=8, partitions=("batch",)) for i in (1, 2, 3, 4))
    return Snapshot(ts=ts, window_s=900.0, lookback_s=6 * HOUR, source="slurm",
                    gpus=gpus if gpus is not None else empty_gpu_frame(), jobs=jobs, nodes=nodes, reservations=resv)


def _resv(name: str = "team-a", **kw) -> Reservation:
    base = {"start_ts": NOW - 3 * HOUR, "end_ts": NOW + 5 * HOUR, "nodes": ("gpu01", "gpu02"), "node_count": 2,
            "accounts": ("vision",), "users": ("alice",)}
    return Reservation(name=name, **{**base, **kw})


def _job(jid: str, *, resv: str = "team-a", host: str = "gpu01", state: str = "RUNNING", account: str = "vision",
         gpus: int = 8, limit: float | None = None) -> Job:
    return Job(jid, "alice", state=state, start_ts=NOW - HOUR if state == "RUNNING" else None, account=account,
               nodes=(host,) if state == "RUNNING" else (), gpu_alloc=((host, tuple(range(gpus))),) if state == "RUNNING"
               else (), gpus_requested=gpus, reservation=resv, time_limit_s=limit)


def test_the_rule_finds_unused_nodes_of_an_active_reservation() -> None:
    p = Policy()
    idle = _frame([("gpu01", 0.0, False), ("gpu02", 1.0, False)])
    (f,) = run_rules(_snap((_resv(),), gpus=idle), p, ["idle_reservation"])
    assert (f.target, f.target_kind, f.gpus, f.user, f.account) == ("reservation:team-a", "reservation", 16, "alice",
                                                                    "vision")
    # GPU metrics show both idle: the finding says for how long
    assert f.evidence["unused_nodes"] == ["gpu01", "gpu02"] and f.evidence["gpus_idle_for_s"] == 2 * 3600
    assert "run none of its jobs (their GPUs idle for 120 min)" in __import__("gpu_cost.core.registry").core.registry.why(f)
    # one node runs a job of it: the other is unused
    (f,) = run_rules(_snap((_resv(),), (_job("7"),), gpus=idle), p, ["idle_reservation"])
    assert f.evidence["unused_nodes"] == ["gpu02"] and f.evidence["used_nodes"] == ["gpu01"] and f.gpus == 8
    # the node its job holds needs no metrics: it is used
    (f,) = run_rules(_snap((_resv(),), (_job("7"),), gpus=_frame([("gpu02", 0.0, False)])), p, ["idle_reservation"])
    assert f.evidence["unused_nodes"] == ["gpu02"]


@pytest.mark.parametrize("case", ["young", "pending", "all used", "maint", "excluded", "busy gpus", "stale gpus",
                                  "inactive"])
def test_the_rule_leaves_alone_what_is_not_idle_or_not_seen(case: str) -> None:
    rule = dataclasses.replace(IdleReservationRule(), exclude_names=("keep-*",))
    p = dataclasses.replace(Policy(), rules=Rules(idle_reservation=rule))
    resv, jobs, gpus = _resv(), (), None
    if case == "young":
        resv = _resv(start_ts=NOW - 600)
    elif case == "pending":
        jobs = (_job("8", state="PENDING"),)
    elif case == "all used":
        jobs = (_job("7"), _job("9", host="gpu02"))
    elif case == "maint":
        resv = _resv(flags=("MAINT", "IGNORE_JOBS"))
    elif case == "excluded":
        resv = _resv(name="keep-me")
    elif case == "busy gpus":
        gpus = _frame([("gpu01", 80.0, False), ("gpu02", 90.0, False)])
    elif case == "stale gpus":
        gpus = _frame([("gpu01", 0.0, True), ("gpu02", 0.0, False)])
    elif case == "inactive":
        resv = _resv(state="INACTIVE")
    assert run_rules(_snap((resv,), jobs, gpus), p, ["idle_reservation"]) == []


def _demand(**accounts: list[tuple[float, float]]) -> dict[str, dict[float, tuple[float, float]]]:
    return {f"account:{a}": {NOW + i * HOUR: v for i, v in enumerate(vals)} for a, vals in accounts.items()}


def _rpolicy(**kw) -> Policy:
    return dataclasses.replace(Policy(), mode="enforce",
                               reservations=dataclasses.replace(ReservationsConfig(), enabled=True, **kw))


def test_a_peak_above_what_would_be_free_is_reserved_largest_shortfall_first() -> None:
    # 32 GPUs. Hours 1-2: vision's upper bound 30 while nlp expects 12 (20 free for vision: 10 short);
    # nlp's 20 while vision expects 20 (12 free for nlp: 8 short). Hour 0: nobody is short.
    demand = _demand(vision=[(4, 4), (20, 30), (20, 30), (4, 4)], nlp=[(12, 12), (12, 20), (12, 20), (2, 2)])
    proposals, notes = plan_reservations(_snap(()), _rpolicy(max_nodes=2, lead=2 * HOUR), NOW, demand)
    assert [(x.account, x.node_count, x.start_ts, x.end_ts) for x in proposals] == [
        ("vision", 2, NOW + HOUR, NOW + 3 * HOUR), ("nlp", 2, NOW + HOUR, NOW + 3 * HOUR)]
    assert proposals[0].shortfall_gpus == 10 and proposals[0].name == "gpu-cost-vision-2027011509"
    # only two nodes left: the largest shortfall gets them
    proposals, notes = plan_reservations(_snap((_resv(name="other", nodes=("gpu03", "gpu04")),)),
                                         _rpolicy(max_nodes=2, lead=2 * HOUR), NOW, demand)
    assert [x.account for x in proposals] == ["vision"] and any("every node is reserved" in n for n in notes)


def test_the_planner_waits_for_the_lead_and_skips_covered_held_and_small_peaks() -> None:
    demand = _demand(vision=[(4, 4), (4, 4), (4, 4), (20, 24)], nlp=[(16, 16)] * 4)
    proposals, notes = plan_reservations(_snap(()), _rpolicy(lead=HOUR), NOW, demand)
    assert proposals == [] and any("proposed from" in n for n in notes)
    demand = _demand(vision=[(20, 30)], nlp=[(8, 8)])  # vision 6 short; nlp fits
    covered = _resv(name="gpu-cost-vision-x", start_ts=NOW, end_ts=NOW + HOUR)
    assert plan_reservations(_snap((covered,)), _rpolicy(), NOW, demand)[0] == []
    # vision's running jobs will still hold all 32 GPUs then: nothing more is needed
    held = tuple(_job(str(i), resv="", host=f"gpu0{i}") for i in (1, 2, 3, 4))
    proposals, notes = plan_reservations(_snap((), held), _rpolicy(), NOW, demand)
    assert proposals == [] and any("running jobs hold" in n for n in notes)
    # ...unless their time limits end before the peak
    ending = tuple(_job(str(i), resv="", host=f"gpu0{i}", limit=HOUR) for i in (1, 2, 3, 4))
    assert [x.node_count for x in plan_reservations(_snap((), ending), _rpolicy(), NOW + 1, demand)[0]] == [4]
    assert plan_reservations(_snap(()), _rpolicy(min_gpus=20), NOW, demand)[0] == []
    assert plan_reservations(_snap(()), _rpolicy(accounts=("nlp",)), NOW, demand)[0] == []
    assert plan_reservations(_snap(()), Policy(), NOW, demand) == ([], ["reservations: disabled"])


def test_reserve_decisions_pass_the_guards_of_every_way_in() -> None:
    demand = _demand(vision=[(20, 30)], nlp=[(8, 8)])
    proposals, _ = plan_reservations(_snap(()), _rpolicy(), NOW, demand)
    (d,) = decisions_for(proposals, _rpolicy(), NOW, "enforce")
    assert (d.action, d.mode, d.requires_approval, d.gpus) == ("reserve", "enforce", True, 32)
    assert "approval required (4 nodes, over reservations.approval_over_nodes 1)" in d.reason and "6 short" in d.reason
    (d,) = decisions_for(proposals, _rpolicy(), NOW, "dry-run")  # worded from the flag: nobody is asked
    assert not d.requires_approval and "would need approval (4 nodes, over reservations.approval_over_nodes 1)" in d.reason
    (d,) = decisions_for(proposals, _rpolicy(approval_over_nodes=4), NOW, "enforce")
    assert not d.requires_approval and "approval" not in d.reason
    # the run's dry-run, the section's milder mode, degraded data: recorded, never made
    for kw, mode, args in (({}, "dry-run", {}), ({"mode": "notify"}, "dry-run", {}),
                           ({}, "dry-run", {"degraded": True, "problems": ["slurm: down"]})):
        (d,) = decisions_for(proposals, _rpolicy(approval_over_nodes=4, **kw), NOW,
                             "dry-run" if not kw and not args else "enforce", **args)
        assert d.mode == mode and not may_act({**d.to_dict(), "status": "decided", "approval_status": None})
    # a protection of the account holds it back
    prot = Protection(name="vision is off-limits", level="never", match=Match(accounts=("vision",)))
    (d,) = decisions_for(proposals, dataclasses.replace(_rpolicy(), protections=(prot,)), NOW, "enforce")
    assert d.action == "none" and d.protection == "vision is off-limits"


def test_the_executors_say_what_they_would_run_in_dry_run() -> None:
    demand = _demand(vision=[(20, 30)], nlp=[(8, 8)])
    proposals, _ = plan_reservations(_snap(()), _rpolicy(partition="batch"), NOW, demand)
    (d,) = decisions_for(proposals, _rpolicy(partition="batch"), NOW, "enforce")
    ctx = ActionContext(policy=_rpolicy(), dry_run=True, now=NOW)
    out = reserve(d, ctx)
    assert out.status == "skipped" and out.command == (
        "scontrol create reservation reservationname=gpu-cost-vision-2027011508 starttime=now duration=60 "
        "nodecnt=4 accounts=vision partitionname=batch")
    assert create_argv(d, NOW + 2 * HOUR) is None  # the peak is over
    later = dataclasses.replace(d, evidence={**d.evidence, "start_ts": NOW + 2 * HOUR, "end_ts": NOW + 4 * HOUR})
    assert "starttime=now+120minutes" in (create_argv(later, NOW) or []) and "duration=120" in (create_argv(later, NOW) or [])
    rel = dataclasses.replace(d, action="release_reservation")
    assert release_reservation(rel, ctx).command == "scontrol delete reservationname=gpu-cost-vision-2027011508"


def test_a_snapshot_keeps_its_reservations_through_json() -> None:
    snap = _snap((_resv(flags=("MAINT",)),), (_job("7"),))
    back = Snapshot.from_json(snap.to_json())
    assert back.reservations == snap.reservations and back.jobs[0].reservation == "team-a"


def test_the_window_left_unset_follows_a_short_lookback_and_a_set_one_is_checked() -> None:
    from gpu_cost.analyse.rules.idle_reservation import window_of
    from gpu_cost.config.loader import parse_policy
    from gpu_cost.core.errors import PolicyError

    short = parse_policy("version: 1\nsweep: {sample_interval: 5s, lookback: 5m, max_staleness: 30s}\n"
                         "rules: {zombie: {window: 60s}, idle_allocation: {window: 60s}, idle_interactive: {window: 60s}}\n")
    assert window_of(short.rules.idle_reservation, short) == 300
    default = parse_policy("version: 1\n")
    assert window_of(default.rules.idle_reservation, default) == 2 * 3600
    with pytest.raises(PolicyError, match=r"rules\.idle_reservation\.window"):
        parse_policy("version: 1\nsweep: {lookback: 3h}\nrules: {idle_reservation: {window: 4h}}\n")
