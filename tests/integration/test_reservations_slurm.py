"""Reservations on the real test cluster: proposed for a forecast peak, created, used, shrunk, released;
the idle-reservation rule on a real idle reservation (and never on a maintenance one)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from gpu_cost.act.base import ActionContext
from gpu_cost.act.dispatch import execute
from gpu_cost.airflow.power_tasks import reservation_decisions
from gpu_cost.analyse.rules import run_rules
from gpu_cost.analyse.rules.idle_reservation import IdleReservationRule
from gpu_cost.capacity import reservations
from gpu_cost.config.schema import Policy, ReservationsConfig, Rules, Rung
from gpu_cost.core.model import Snapshot, empty_gpu_frame
from gpu_cost.decide.engine import decide
from gpu_cost.loop import sweep
from gpu_cost.perceive.slurm import SlurmSource
from gpu_cost.sim import cluster as sim
from tests.fixtures.slurm import GPUS_PER_NODE, NODES

pytestmark = pytest.mark.integration

HOUR = 3600.0


def _policy(**resv) -> Policy:
    rule = IdleReservationRule(window=600.0, ladder=(Rung("release_reservation", 0.0),))
    cfg = dataclasses.replace(ReservationsConfig(), enabled=True, **{"min_gpus": 2, "max_nodes": 2,
                                                                     "approval_over_nodes": 1, **resv})
    return dataclasses.replace(Policy(), mode="enforce", reservations=cfg,
                               rules=Rules(idle_reservation=rule))


def _snapshot(src: SlurmSource, ts: float, p: Policy | None = None, *, metrics: bool = True) -> Snapshot:
    """Slurm's jobs, nodes and reservations now, with the GPU metrics of the test cluster's nodes at ``ts``: the
    GPUs are the one simulated part (idle, no job on them), as DCGM would show them."""
    gpus = sim.snapshot(p or _policy(), ts, sim.scenario_from_dict(
        {"nodes": [{"name": h, "gpus": GPUS_PER_NODE} for h in NODES], "jobs": []}))
    return Snapshot(ts=ts, window_s=gpus.window_s, lookback_s=gpus.lookback_s, source="slurm",
                    gpus=gpus.gpus if metrics else empty_gpu_frame(), windows=dict(gpus.windows) if metrics else {},
                    jobs=tuple(src.jobs()), nodes=tuple(src.nodes()), reservations=tuple(src.reservations()))


def _forecast(store, now: float, key: str, values: list[tuple[float, float]]) -> None:
    hour = now - now % HOUR
    store.execute("upsert_forecast", [
        {"series": f"demand:{key}", "horizon_ts": hour + i * HOUR, "kind": "demand", "yhat": y, "yhat_lower": 0.0,
         "yhat_upper": hi, "model": "test", "created_at": now, "extra": "{}", "run_id": None, "data_ts": now}
        for i, (y, hi) in enumerate(values)])


def _act(decisions, p: Policy, now: float, store, c) -> list[dict]:
    return execute(decisions, ActionContext(policy=p, dry_run=False, now=now, slurm=c.runner), store)


def _sweep(src: SlurmSource, p: Policy, ts: float, store, c) -> tuple[list, list[dict]]:
    """One sweep of the idle-reservation rule as the DAG runs it: detect, decide (escalations from the
    store), record, act. Returns (findings, action results)."""
    snap = _snapshot(src, ts, p)
    reservations.mark_own(store, snap, p)  # as sweep.run_once and the DAG's collect do
    findings = run_rules(snap, p, ["idle_reservation"])
    plan = sweep.plan(findings, snap, p, store, ts)
    sweep.record(plan, store, f"test:{ts}", ts)
    return findings, _act(plan.decisions, p, ts, store, c)


def test_a_forecast_peak_is_reserved_used_shrunk_and_released(slurm_cluster, store, monkeypatch) -> None:
    c = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    src = SlurmSource(c.runner)
    now = time.time()
    # research's peak: up to 8 GPUs for three hours; the others expect 4 of the cluster's 8: 4 short
    _forecast(store, now, "account:research", [(6.0, 8.0)] * 3)
    _forecast(store, now, "account:other", [(4.0, 5.0)] * 3)
    p = _policy()
    name = None
    try:
        decisions, notes = reservation_decisions(_snapshot(src, now), p, now, "enforce", store)
        assert [d.action for d in decisions] == ["reserve"], notes
        d = decisions[0]
        name = d.target.split(":", 1)[1]
        assert name.startswith("gpu-cost-research-") and d.account == "research"
        assert d.evidence["node_count"] == 2 and d.gpus == 8 and d.evidence["shortfall_gpus"] == 4.0
        # two nodes is over approval_over_nodes: a human is asked before it is made
        assert d.requires_approval and "approval_over_nodes" in d.reason
        # (approved) made through Slurm, once: the second run finds it there
        store.record_decisions([d], f"gpu_offhours_power:{now}")  # as the power run's plan step does
        assert [r["status"] for r in _act([d], p, now, store, c)] == ["succeeded"]
        resv = {r.name: r for r in src.reservations()}[name]
        assert resv.accounts == ("research",) and set(resv.nodes) == set(c.nodes) and resv.active
        assert abs(resv.start_ts - now) < 120 and resv.end_ts > now + HOUR
        again, notes = reservation_decisions(_snapshot(src, now), p, now, "enforce", store)
        assert again == [] and any("already reserved" in n for n in notes)

        # used: a research job runs in it; a job outside it waits for the reserved nodes
        inside = c.submit("sleep 600", f"--reservation={name}", "-A", "research", "-N", "1", "--gres=gpu:1",
                          "--job-name=in-the-reservation")
        c.wait_state(inside, "RUNNING", 30)
        outside = c.submit("sleep 600", "-N", "1", "--job-name=outside")
        time.sleep(3)
        assert c.job_state(outside) == "PENDING"
        job = {j.job_id: j for j in src.jobs()}[inside]
        assert job.reservation == name and len(job.nodes) == 1

        # the demand did not come in full: one node unused → shrunk to the node its job holds
        later = now + 700
        findings, results = _sweep(src, p, later, store, c)
        assert [f.target for f in findings] == [f"reservation:{name}"]
        f = findings[0]
        assert f.evidence["used_nodes"] == list(job.nodes) and len(f.evidence["unused_nodes"]) == 1
        assert f.gpus == c.gpus_per_node
        assert [r["status"] for r in results] == ["succeeded"], results
        resv = {r.name: r for r in src.reservations()}[name]
        assert resv.nodes == job.nodes
        c.wait_state(outside, "RUNNING", 30)  # the freed node went to the job that waited
        # fully used now: nothing found, the episode ends
        findings, results = _sweep(src, p, later + 60, store, c)
        assert findings == [] and results == []

        # no job in it at all → a new episode, released
        c.run("scancel", inside)
        c.wait_state(inside, ("CANCELLED", "GONE"), 30)
        findings, results = _sweep(src, p, later + 120, store, c)
        assert [f.evidence["unused_nodes"] for f in findings] == [list(job.nodes)]
        assert [r["status"] for r in results] == ["succeeded"], results
        assert name not in {r.name for r in src.reservations()}
        # gone: the next sweep finds nothing
        assert _sweep(src, p, later + 180, store, c) == ([], [])
    finally:
        if name:
            c.run("scontrol", "delete", f"reservationname={name}")
        c.cancel_all()


def test_the_rule_finds_a_real_idle_reservation_but_not_maintenance(slurm_cluster, store, monkeypatch) -> None:
    """An operator's idle reservation is found and reported, never released (it is not the agent's); a
    maintenance one is not found; without GPU metrics for its nodes nothing is found (unknown, not unused)."""
    c = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    src = SlurmSource(c.runner)
    made = []
    try:
        for name, flags in (("team-idle", "ignore_jobs"), ("fix-gpu02", "maint,ignore_jobs")):
            res = c.run("scontrol", "create", "reservation", f"reservationname={name}", "starttime=now", "duration=120",
                        "nodecnt=1", "accounts=research", f"flags={flags}")
            assert res.rc == 0, res.stderr
            made.append(name)
        now = time.time()
        p = _policy()
        snap = _snapshot(src, now)
        assert {r.name for r in snap.reservations} >= {"team-idle", "fix-gpu02"}
        assert {r.name: r.flags for r in snap.reservations}["fix-gpu02"] == ("MAINT", "IGNORE_JOBS")
        # just made: not idle for the window yet
        assert run_rules(snap, p, ["idle_reservation"]) == []
        findings = run_rules(dataclasses.replace(snap, ts=now + 700), p, ["idle_reservation"])
        assert [f.target for f in findings] == ["reservation:team-idle"]
        assert findings[0].account == "research" and findings[0].evidence["gpus_idle_for_s"] == 600
        assert findings[0].evidence["standing"] == "foreign"
        # no GPU metrics for its nodes: unknown, not unused
        assert run_rules(dataclasses.replace(_snapshot(src, now, metrics=False), ts=now + 700), p,
                         ["idle_reservation"]) == []
        # enforce, a ladder of release alone: someone else's reservation gets a notice, never a release
        plan = decide(findings, p, now=now + 700, escalations={})
        assert [(d.action, d.mode) for d in plan.decisions] == [("notify", "enforce")]
        assert "not the agent's own reservation" in plan.decisions[0].reason
        results = execute(plan.decisions, ActionContext(policy=p, dry_run=True, now=now, slurm=c.runner), store)
        assert "scontrol" not in (results[0]["command"] or "")
        assert "team-idle" in {r.name for r in src.reservations()}
    finally:
        for name in made:
            c.run("scontrol", "delete", f"reservationname={name}")


def _reserve(src: SlurmSource, store, c, now: float, hours: float = 8.0) -> str:  # type: ignore[no-untyped-def]
    """Make the agent's own reservation as the power run does: a ``reserve`` decision through the guards,
    carried out by the one execute step (its audit rows are the proof that the agent made it)."""
    made = _policy(max_nodes=1)
    name = f"{made.reservations.prefix}research-{int(now)}"
    proposal = reservations.Proposal(account="research", name=name, start_ts=now, end_ts=now + hours * HOUR,
                                     node_count=1, gpus=GPUS_PER_NODE, shortfall_gpus=4.0, peak_upper=8.0,
                                     free_gpus=4.0)
    (d,) = reservations.decisions_for([proposal], made, now, "enforce")
    assert (d.action, d.mode, d.requires_approval) == ("reserve", "enforce", False), d.reason
    store.record_decisions([d], f"gpu_offhours_power:{now}")  # as the power run's plan step does
    assert [r["status"] for r in _act([d], made, now, store, c)] == ["succeeded"]
    return name


def test_the_shipped_policy_in_enforce_releases_only_the_agents_own_reservation(
        slurm_cluster, store, monkeypatch, slack_sink) -> None:
    """Issue 34: the shipped policy, raised to enforce, over two sweeps. An administrator's WEEKLY
    reservation, root's OVERLAP one, and one named with the agent's prefix that the agent did not make are
    reported (a notice decision each) and still there afterwards; the agent's own idle reservation is deleted."""
    from gpu_cost.config.loader import load_policy
    from tests.fixtures.core import ROOT

    c = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLACK",
                       json.dumps({"conn_type": "slackwebhook", "password": slack_sink.webhook_url()}))
    src = SlurmSource(c.runner)
    shipped = load_policy(ROOT / "include" / "policy" / "default.yaml")
    assert shipped.mode == "dry-run"
    p = dataclasses.replace(shipped, mode="enforce")
    now = time.time()
    theirs = {"admin-weekly-train": ("flags=weekly", "accounts=research"),
              "dc-maintenance": ("flags=overlap", "users=root"),
              f"{p.reservations.prefix}research-squatted": ("flags=overlap", "users=root")}
    own = None
    try:
        own = _reserve(src, store, c, now)
        (mine,) = [r for r in src.reservations() if r.name == own]
        other = next(h for h in NODES if h not in mine.nodes)
        for name, (flags, who) in theirs.items():
            res = c.run("scontrol", "create", "reservation", f"reservationname={name}", "starttime=now",
                        "duration=480", f"nodes={other if 'weekly' in flags else ','.join(NODES)}", who, flags)
            assert res.rc == 0, (name, res.stderr)
        assert {r.name for r in src.reservations()} >= {own, *theirs}

        first = now + 2 * HOUR + 60  # the window (2 h) after they began
        findings, results = _sweep(src, p, first, store, c)
        standing = {f.target.split(":", 1)[1]: f.evidence["standing"] for f in findings}
        assert standing == {own: "agent", **{n: "foreign" for n in theirs}}, standing
        assert all(r["status"] == "succeeded" for r in results), results  # the notices, through the Slack sink

        second = first + 2 * HOUR + 60  # the release rung is due
        findings, results = _sweep(src, p, second, store, c)
        assert [r["status"] for r in results] == ["succeeded"], results
        left = {r.name for r in src.reservations()}
        assert own not in left, "the agent's own idle reservation is released"
        assert set(theirs) <= left, "someone else's reservation was deleted"
        rows = store.query("SELECT target, action, mode FROM gpu_cost_decisions WHERE rule = 'idle_reservation'")
        acted = {(r["target"].split(":", 1)[1], r["action"]) for r in rows if r["mode"] == "enforce"}
        assert acted == {(own, "notify"), (own, "release_reservation"), *((n, "notify") for n in theirs)}, acted
        deleted = store.query("SELECT target FROM gpu_cost_actions WHERE action = 'release_reservation'")
        assert [r["target"] for r in deleted] == [f"reservation:{own}"]
    finally:
        for name in [*theirs, *([own] if own else [])]:
            c.run("scontrol", "delete", f"reservationname={name}")
