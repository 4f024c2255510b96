"""Reservations on the real test cluster: proposed for a forecast peak, created, used, shrunk, released;
the idle-reservation rule on a real idle reservation (and never on a maintenance one)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from gpu_cost import sweep
from gpu_cost.actions.base import ActionContext
from gpu_cost.actions.dispatch import execute
from gpu_cost.airflow.power_tasks import reservation_decisions
from gpu_cost.model import Snapshot, empty_gpu_frame
from gpu_cost.policy.engine import decide
from gpu_cost.policy.schema import IdleReservationRule, Policy, ReservationsConfig, Rules, Rung
from gpu_cost.rules import run_rules
from gpu_cost.sources.slurm import SlurmSource

pytestmark = pytest.mark.integration

HOUR = 3600.0


def _policy(**resv) -> Policy:
    rule = IdleReservationRule(window=600.0, ladder=(Rung("release_reservation", 0.0),))
    cfg = dataclasses.replace(ReservationsConfig(), enabled=True, min_gpus=2, max_nodes=2, approval_over_nodes=1, **resv)
    return dataclasses.replace(Policy(), mode="enforce", reservations=cfg,
                               rules=dataclasses.replace(Rules(), idle_reservation=rule))


def _snapshot(src: SlurmSource, ts: float) -> Snapshot:
    return Snapshot(ts=ts, window_s=600.0, lookback_s=6 * HOUR, source="slurm", gpus=empty_gpu_frame(),
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
    snap = _snapshot(src, ts)
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
        assert findings[0].account == "research" and findings[0].evidence["gpus_idle_for_s"] == 0
        # dry-run: recorded, nothing released
        dry = dataclasses.replace(p, mode="dry-run")
        plan = decide(findings, dry, now=now + 700, escalations={})
        results = execute(plan.decisions, ActionContext(policy=dry, dry_run=True, now=now, slurm=c.runner), store)
        assert "scontrol delete reservationname=team-idle" in (results[0]["command"] or "")
        assert "team-idle" in {r.name for r in src.reservations()}
    finally:
        for name in made:
            c.run("scontrol", "delete", f"reservationname={name}")
