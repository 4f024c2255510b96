"""Off-hours power on the real test cluster: POWER_DOWN through Slurm, reserve, busy nodes, resume."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from gpu_cost.act.base import ActionContext
from gpu_cost.act.dispatch import execute
from gpu_cost.airflow.power_tasks import decisions_of, make_plan
from gpu_cost.capacity.offhours import savings_rows
from gpu_cost.config.schema import OffhoursConfig, Policy
from gpu_cost.perceive.slurm import SlurmSource

pytestmark = pytest.mark.integration

NIGHT = dt.datetime(2026, 11, 24, 23, 0, tzinfo=dt.UTC).timestamp()  # a Tuesday night
DAY = dt.datetime(2026, 11, 25, 14, 0, tzinfo=dt.UTC).timestamp()


def policy(**kw) -> Policy:
    off = dataclasses.replace(OffhoursConfig(), require_gpu_metrics=False, **kw)
    return dataclasses.replace(Policy(), mode="enforce", offhours=off)


def test_power_down_reserve_busy_node_and_wake(slurm_cluster, store, monkeypatch) -> None:
    c = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", str(c.conf))  # SlurmSource() / actions use the default local runner
    # other tests of the session may have powered nodes before: read only what this test adds
    log_before, resume_before = len(c.suspend_log()), len(c.resume_log())
    try:
        busy = c.submit("sleep 600", "-w", "gpu01", "--gres=gpu:1", "--job-name=keeps-gpu01-busy")
        c.wait_state(busy, "RUNNING", 30)
        # with a warm reserve of one idle node, the only idle node (gpu02) stays up
        plan, _ = make_plan(policy(warm_reserve_nodes=1), NIGHT, "slurm")
        assert plan.in_window and plan.down == [] and plan.reserve == ["gpu02"]
        assert plan.skipped["gpu01"] == "state mixed"
        # without a reserve it goes down through Slurm; the node with a job is never touched
        plan, _ = make_plan(policy(warm_reserve_nodes=0), NIGHT, "slurm")
        assert [ch.node for ch in plan.down] == ["gpu02"]
        p = policy(warm_reserve_nodes=0)
        results = execute(decisions_of(plan, p, NIGHT, "enforce"), ActionContext(policy=p, dry_run=False, now=NIGHT),
                          store)
        assert [r["status"] for r in results] == ["succeeded"], results
        c.wait_node("gpu02", lambda s: "POWERED_DOWN" in s, 40)
        assert c.suspend_log()[log_before:].split() == ["gpu02"]  # the SuspendProgram got the node's name
        assert "gpu01" not in c.suspend_log()[log_before:] and c.node_state("gpu01").startswith("MIXED")
        nodes = SlurmSource(c.runner).nodes()
        gpu02 = {n.name: n for n in nodes}["gpu02"]
        assert gpu02.state == "idle~" and gpu02.reason == "gpu-cost: off-hours"
        rows = savings_rows(nodes, {"gpu02": (240.0, "measured")}, p.offhours, p.cost.kwh_usd, NIGHT)
        assert [r["target"] for r in rows] == ["node:gpu02"] and rows[0]["kwh"] == pytest.approx(0.24)
        # a pending job that needs the powered-down node gets it back: Slurm resumes it and the job starts
        both = c.submit("sleep 600", "-N", "2", "--job-name=needs-both-nodes")
        c.wait_state(both, "RUNNING", 60)
        assert "gpu02" in c.resume_log()[resume_before:]
        c.cancel_all()
        # power it down again; outside the window the agent brings back what it powered down
        c.run("scontrol", "update", "nodename=gpu02", "state=POWER_DOWN", "reason=gpu-cost: off-hours")
        c.wait_node("gpu02", lambda s: "POWERED_DOWN" in s, 40)
        plan, _ = make_plan(p, DAY, "slurm")
        assert not plan.in_window and [ch.node for ch in plan.up] == ["gpu02"] and plan.down == []
        results = execute(decisions_of(plan, p, DAY, "enforce"), ActionContext(policy=p, dry_run=False, now=DAY), store)
        assert [r["status"] for r in results] == ["succeeded"], results
        assert c.wait_node("gpu02", lambda s: s == "IDLE", 45) == "IDLE"
        assert c.resume_log()[resume_before:].split() == ["gpu02", "gpu02"]
    finally:
        c.cancel_all()
        c.resume_all()


def test_dry_run_powers_nothing(slurm_cluster, store, monkeypatch) -> None:
    c = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    before = c.suspend_log()
    p = policy(warm_reserve_nodes=0, min_up=0)
    plan, _ = make_plan(p, NIGHT, "slurm")
    assert {ch.node for ch in plan.down} == set(c.nodes)
    results = execute(decisions_of(plan, p, NIGHT, "dry-run"), ActionContext(policy=p, dry_run=True, now=NIGHT), store)
    assert {r["status"] for r in results} == {"skipped"}
    assert all("state=POWER_DOWN" in r["command"] for r in results)
    assert c.suspend_log() == before and all(c.node_state(n) == "IDLE" for n in c.nodes)


@pytest.mark.slow
def test_a_node_that_does_not_come_back_is_reported_left_alone_and_the_last_healthy_node_stays_up(
        slurm_cluster, store, monkeypatch) -> None:
    """A ResumeProgram that fails: Slurm marks the node DOWN after ResumeTimeout; the agent finds it,
    records it, never powers it down again within offhours.failed_hold, and keeps the partition's
    last healthy node up (offhours.min_up)."""
    c = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    p = policy(warm_reserve_nodes=0, min_up=1)
    failing = None
    try:
        # two idle nodes, min_up 1: one goes down, the other is the partition's last healthy node
        plan, _ = make_plan(p, NIGHT, "slurm", store)
        assert len(plan.down) == 1 and plan.failed == {}
        failing = plan.down[0].node
        other = next(n for n in c.nodes if n != failing)
        assert "offhours.min_up" in plan.skipped[other]
        results = execute(decisions_of(plan, p, NIGHT, "enforce"), ActionContext(policy=p, dry_run=False, now=NIGHT),
                          store)
        assert [r["status"] for r in results] == ["succeeded"], results
        c.wait_node(failing, lambda s: "POWERED_DOWN" in s, 40)
        # its boot fails: the agent's power-up goes through, the node never registers again
        c.fail_resume(failing)
        plan, _ = make_plan(p, DAY, "slurm", store)
        assert [ch.node for ch in plan.up] == [failing]
        results = execute(decisions_of(plan, p, DAY, "enforce"), ActionContext(policy=p, dry_run=False, now=DAY), store)
        assert [r["status"] for r in results] == ["succeeded"], results
        c.wait_node(failing, lambda s: s.startswith("DOWN"), 90)  # ResumeTimeout (30 s) passed
        # the next run finds it, reports it and records it; the other node is still the last healthy one
        later = NIGHT + 86400.0
        plan, _ = make_plan(p, later, "slurm", store)
        assert set(plan.failed) == {failing} and "ResumeTimeout" in plan.failed[failing]
        assert plan.problems == [f"node {failing} did not come back from power saving: {plan.failed[failing]}"]
        assert plan.down == [] and "offhours.min_up" in plan.skipped[other]
        decisions = decisions_of(plan, p, later, "enforce")
        assert [(d.target, d.action) for d in decisions] == [(f"node:{failing}", "none")]
        store.begin_run("power-failed-1", dag_id="gpu_offhours_power", started_at=later, data_ts=later, source="slurm",
                        mode="enforce")
        store.record_decisions(decisions, "power-failed-1")
        # an operator repairs it: it is idle and healthy again, yet the agent leaves it up within failed_hold
        c.fail_resume(failing, False)
        c.resume_all(90)
        assert c.node_state(failing) == "IDLE"
        free = dataclasses.replace(p, offhours=dataclasses.replace(p.offhours, min_up=0))
        plan, _ = make_plan(free, later + 3600.0, "slurm", store)
        assert set(plan.failed) == {failing} and [ch.node for ch in plan.down] == [other]
        assert "did not come back from power saving" in plan.skipped[failing]
        # past offhours.failed_hold it is an ordinary node again
        short = dataclasses.replace(free, offhours=dataclasses.replace(free.offhours, failed_hold=1800.0))
        plan, _ = make_plan(short, later + 3600.0, "slurm", store)
        assert plan.failed == {} and {ch.node for ch in plan.down} == set(c.nodes)
    finally:
        if failing is not None:
            c.fail_resume(failing, False)
        c.cancel_all()
        c.resume_all(90)
