"""Multi-node jobs on a real Slurm: a ``--nodes=2`` job is read with its GPUs on both nodes, the
simulated exporter shows every node of it, and the rules judge it over all its GPUs: all idle is
``idle_allocation`` (with the count per node), some idle is ``partly_idle`` advice."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.integration


def test_a_two_node_job_is_judged_over_both_nodes(slurm_cluster, policy) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.analyse.rules import run_rules
    from gpu_cost.perceive.slurm import SlurmSource
    from gpu_cost.perceive.snapshot import from_matrix
    from gpu_cost.sim.cluster import SimCluster, SimNode
    from gpu_cost.sim.exporter import SlurmFeed

    slurm_cluster.cancel_all()
    common = ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:2", "--cpus-per-task=1", "--mem=100")
    idle = slurm_cluster.submit("sleep 600\n", "--job-name=ddp-hung", "--comment=gpu-cost-sim:idle", *common)
    part = slurm_cluster.submit("sleep 600\n", "--job-name=ddp-skewed", "--comment=gpu-cost-sim:training:idle_gpus=3",
                                *common)
    try:
        for jid in (idle, part):
            assert slurm_cluster.wait_state(jid, "RUNNING", timeout=30) == "RUNNING"
        src = SlurmSource(slurm_cluster.runner)
        jobs = {j.job_id: j for j in src.jobs()}
        assert jobs[idle].nodes == ("gpu01", "gpu02")
        assert [(h, len(i)) for h, i in jobs[idle].gpu_alloc] == [("gpu01", 2), ("gpu02", 2)]

        feed = SlurmFeed([SimNode(n, slurm_cluster.gpus_per_node) for n in slurm_cluster.nodes], src.jobs,
                         sample_interval=60.0, refresh_s=0.0)
        now = time.time()
        feed.state(now)
        sim_jobs = {j.job_id: j for j in feed.scenario().jobs}
        assert sim_jobs[idle].node == "gpu01" and [h for h, _ in sim_jobs[idle].also] == ["gpu02"]
        assert sim_jobs[part].idle_gpus == 3

        # the simulated GPUs of these real jobs two hours on (they stay as Slurm placed them), past both
        # rules' windows and grace periods
        cluster = SimCluster(feed.scenario(), anchor=feed.anchor)
        t = now + 7200
        m = cluster.matrix(t - policy.sweep.lookback, t)
        snap = from_matrix(policy=policy, now=t, source="test", hosts=m.hosts, gpus=m.gpus, uuids=m.uuids,
                           models=m.models, mem_total=m.mem_total, times=m.times, util=m.util, mem=m.mem, power=m.power,
                           job=m.job, jobs=list(jobs.values()), processes=[], nodes=[])
        assert not snap.disagreements, snap.disagreements
        found = {(f.rule, f.job_id): f for f in run_rules(snap, policy)}
        f = found[("idle_allocation", idle)]
        assert f.gpus == 4 and f.action == "cancel" and f.host is None
        assert f.evidence["per_node"] == {"gpu01": {"gpus": 2, "idle": 2}, "gpu02": {"gpus": 2, "idle": 2}}
        p = found[("partly_idle", part)]
        assert p.action == "advise" and (p.evidence["idle_gpus"], p.evidence["gpus"]) == (3, 4)
        assert sum(n["idle"] for n in p.evidence["per_node"].values()) == 3 and set(p.evidence["per_node"]) == {
            "gpu01", "gpu02"}
        assert ("idle_allocation", part) not in found and ("partly_idle", idle) not in found
    finally:
        slurm_cluster.cancel_all()
