"""The live snapshot on real servers: Slurm 22.05 jobs drive the simulated GPUs Prometheus scrapes.

One job of each behaviour is submitted with ``sbatch``; ``gpu-cost sim serve --slurm`` turns them
into dcgm-exporter series (GPU indices from Slurm, behaviour from the job's comment); Prometheus
scrapes them every 5 s. The snapshot must attribute every job's GPUs, and ``gpu-cost sweep
--source prometheus --json`` must find what the pure simulator finds for the same jobs.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.prometheus import PromLab, gpu_cost_bin

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: windows short enough for a test: 5 s samples, 60 s rule windows, 5 min lookback
POLICY = """
version: 1
mode: dry-run
sweep: {source: prometheus, sample_interval: 5s, lookback: 5m, min_sample_ratio: 0.6, max_staleness: 30s}
rules:
  zombie: {window: 60s}
  idle_allocation: {window: 60s, min_runtime: 60s}
  idle_interactive: {window: 60s, min_runtime: 60s}
  low_efficiency: {min_runtime: 60s}
protections: []
"""
JOBS = {  # name: (gpus, comment, seconds to run)
    "train-llm": (2, "gpu-cost-sim:training", 600),
    "finetune-idle": (1, "gpu-cost-sim:idle", 600),
    "resnet-loader": (1, "gpu-cost-sim:dataloader", 600),
    "chat-inference": (2, "gpu-cost-sim:inference:burst_every=30s:burst_length=5s", 600),
    "sweep-zombie": (1, "gpu-cost-sim:zombie", 12),
    "rl-memleak": (1, "gpu-cost-sim:memleak", 600),
}
JOB_JOB = "gpu-slurm"
OUTSIDE_JOB = "gpu-outside"

#: a GPU host Slurm does not run: an inference server scraped by the same Prometheus. GPU 0 holds memory at 0 %
#: utilisation and no job (what a zombie looks like), GPU 1 runs a job Slurm has never heard of, idle since
#: (its exporter label names that job).
OUTSIDE_SCENARIO = {
    "seed": 3, "anchor": "now", "sample_interval": "5s",
    "nodes": [{"name": "infer01", "gpus": 2, "model": "a100", "mem_total_mib": 81920}],
    "jobs": [
        {"job_id": "970001", "user": "svc", "name": "old-server", "behaviour": "zombie", "node": "infer01",
         "gpus": [0], "start": "-4h", "end": "-2h", "time_limit": "3d"},
        {"job_id": "970002", "user": "svc", "name": "llm-endpoint", "behaviour": "idle", "node": "infer01",
         "gpus": [1], "start": "-3h", "busy_first": "10m", "time_limit": "30d"},
    ],
}


class LiveCluster:
    def __init__(self, slurm: Any, lab: PromLab, policy_file: Path, feed: Any, ids: dict[str, str], started: float) -> None:
        self.slurm, self.lab, self.policy_file, self.feed, self.ids, self.started = slurm, lab, policy_file, feed, ids, started

    def prometheus(self):  # type: ignore[no-untyped-def]
        from gpu_cost.perceive.prometheus import PrometheusSource

        return PrometheusSource(self.lab.config(f'job="{JOB_JOB}"'))

    def wait(self, seconds: float) -> None:
        """Sleep, keeping the test's own view of Slurm current (it notices the zombie's end)."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            self.feed.state(time.time())
            time.sleep(1)


@pytest.fixture(scope="module")
def live(slurm_cluster, prom_lab: PromLab, tmp_path_factory) -> Iterator[LiveCluster]:  # type: ignore[no-untyped-def]
    from gpu_cost.config.loader import parse_policy
    from gpu_cost.perceive.slurm import SlurmSource
    from gpu_cost.sim.cluster import SimNode
    from gpu_cost.sim.exporter import SlurmFeed

    slurm_cluster.cancel_all()
    policy_file = tmp_path_factory.mktemp("live") / "policy.yaml"
    policy_file.write_text(POLICY)
    parse_policy(POLICY, str(policy_file))
    nodes = ",".join(f"{n}:{slurm_cluster.gpus_per_node}" for n in slurm_cluster.nodes)
    port = prom_lab.start_exporter(JOB_JOB, "--slurm", "--nodes", nodes, "--sample-interval", "5s",
                                   env=slurm_cluster.env)
    prom_lab.add_target(JOB_JOB, port)
    scenario = tmp_path_factory.mktemp("outside") / "outside.yaml"
    scenario.write_text(yaml.safe_dump(OUTSIDE_SCENARIO))
    prom_lab.add_target(OUTSIDE_JOB, prom_lab.start_exporter(OUTSIDE_JOB, "--scenario", str(scenario)))
    ids = {}
    for name, (gpus, comment, seconds) in JOBS.items():
        ids[name] = slurm_cluster.submit(f"sleep {seconds}\n", f"--job-name={name}", f"--gres=gpu:{gpus}",
                                         f"--comment={comment}", "--cpus-per-task=1", "--mem=100")
    for jid in ids.values():
        slurm_cluster.wait_state(jid, ("RUNNING", "COMPLETED", "GONE"), timeout=30)
    feed = SlurmFeed([SimNode(n, slurm_cluster.gpus_per_node) for n in slurm_cluster.nodes],
                     SlurmSource(slurm_cluster.runner).jobs, sample_interval=5.0, refresh_s=0.5)
    feed.state(time.time())
    prom_lab.wait_up(1, timeout=30, job=JOB_JOB)
    prom_lab.wait_up(1, timeout=30, job=OUTSIDE_JOB)
    try:
        yield LiveCluster(slurm_cluster, prom_lab, policy_file, feed, ids, time.time())
    finally:
        slurm_cluster.cancel_all()
        for job in (JOB_JOB, OUTSIDE_JOB):
            if job in prom_lab.procs:
                prom_lab.stop_process(job)


def test_every_job_is_attributed(live: LiveCluster) -> None:
    from gpu_cost.config.loader import load_policy
    from gpu_cost.perceive import live as live_mod
    from gpu_cost.perceive.slurm import SlurmSource

    policy = load_policy(live.policy_file)
    live.wait(6)  # a scrape after every job started
    snap = live_mod.snapshot(policy, time.time(), prometheus=live.prometheus(), slurm=SlurmSource(live.slurm.runner),
                             processes=False)
    assert not [p for p in snap.problems if p.startswith(("prometheus", "slurm"))], snap.problems
    assert len(snap.gpus) == 8 and not snap.disagreements
    jobs = {j.job_id: j for j in snap.running_jobs()}
    g = snap.gpus.set_index(["host", "gpu"])
    for name, jid in live.ids.items():
        job = jobs.get(jid)
        if job is None:
            assert name == "sweep-zombie"  # short-lived: may already be over
            continue
        assert job.gpu_count == JOBS[name][0]
        for key in job.gpu_keys():
            row = g.loc[key]
            assert row["attribution"] == "slurm" and row["job_id"] == jid, (name, key)
            assert row["label_job_id"] == jid, "the exporter's hpc_job label names the Slurm job"
    assert set(snap.gpus["attribution"]) == {"slurm"} or "none" in set(snap.gpus["attribution"])


def test_an_exporter_naming_nodes_in_full_is_read_under_slurms_names(live: LiveCluster) -> None:
    """dcgm-exporter on nodes whose hostname is fully qualified labels its series ``node1.cluster.example.org``
    where Slurm says ``node1``. Read under Slurm's names, every job has its GPUs (before: none had, and every run
    said "no GPU series for node(s) running GPU jobs" and acted on nothing)."""
    from gpu_cost.config.loader import load_policy
    from gpu_cost.perceive import live as live_mod
    from gpu_cost.perceive.prometheus import PrometheusSource
    from gpu_cost.perceive.slurm import SlurmSource

    job = "gpu-slurm-fqdn"
    nodes = ",".join(f"{n}:{live.slurm.gpus_per_node}" for n in live.slurm.nodes)
    port = live.lab.start_exporter(job, "--slurm", "--nodes", nodes, "--sample-interval", "5s",
                                   "--hostname-domain", "cluster.example.org", env=live.slurm.env)
    live.lab.add_target(job, port)
    try:
        live.lab.wait_up(1, timeout=30, job=job)
        live.wait(11)  # two scrapes after the exporter came up
        policy = load_policy(live.policy_file)
        snap = live_mod.snapshot(policy, time.time(), prometheus=PrometheusSource(live.lab.config(f'job="{job}"')),
                                 slurm=SlurmSource(live.slurm.runner), processes=False)
    finally:
        live.lab.stop_process(job)
    assert not [p for p in snap.problems if p.startswith(("prometheus", "slurm", "no GPU series"))], snap.problems
    assert set(snap.gpus["host"]) == set(live.slurm.nodes)
    g = snap.gpus.set_index(["host", "gpu"])
    running = snap.running_jobs()
    assert running
    for j in running:
        for key in j.gpu_keys():
            assert g.loc[key, "attribution"] == "slurm" and g.loc[key, "job_id"] == j.job_id, (j.job_id, key)


def _findings(payload: dict[str, Any]) -> set[tuple[str, str, str, bool]]:
    return {(f["rule"], f["target"], f["suggested"], bool(f["inference"])) for f in payload["findings"]}


def test_sweep_on_real_sources_matches_the_simulator(live: LiveCluster, artifacts: Path) -> None:
    from gpu_cost.analyse.rules import run_rules
    from gpu_cost.config.loader import load_policy
    from gpu_cost.loop.sweep import finding_summary
    from gpu_cost.perceive import live as live_mod
    from gpu_cost.perceive.slurm import SlurmSource
    from gpu_cost.perceive.snapshot import from_matrix
    from gpu_cost.sim.cluster import SimCluster

    policy = load_policy(live.policy_file)
    live.slurm.wait_state(live.ids["sweep-zombie"], ("COMPLETED", "GONE"), timeout=40)
    zombie_end = time.time()
    live.wait(max(0.0, live.started + 75 - time.time()))
    live.wait(max(0.0, zombie_end + 70 - time.time()))  # a whole 60 s window after the zombie's job ended
    now = math.floor(time.time() / 5) * 5

    env = {**os.environ, **live.slurm.env, "AIRFLOW_CONN_GPU_COST_PROMETHEUS": live.lab.conn_env(f'job="{JOB_JOB}"')}
    env.pop("AIRFLOW_CONN_GPU_COST_NODE_SSH", None)
    t0 = time.monotonic()
    res = subprocess.run([gpu_cost_bin(), "sweep", "--source", "prometheus", "--policy", str(live.policy_file), "--at",
                          str(now), "--json"], capture_output=True, text=True, env=env, timeout=120)
    cli_seconds = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-2000:]
    payload = json.loads(res.stdout)
    assert payload["source"] == "prometheus" and payload["gpus"] == 8 and not payload["degraded"], payload["problems"]

    # the pure simulator on the same jobs (GPU indices and start times from Slurm), same instant
    cluster = SimCluster(live.feed.scenario(), anchor=now)
    m = cluster.matrix(now - policy.sweep.lookback, now)
    sim = from_matrix(policy=policy, now=now, source="sim", hosts=m.hosts, gpus=m.gpus, uuids=m.uuids, models=m.models,
                      mem_total=m.mem_total, times=m.times, util=m.util, mem=m.mem, power=m.power, job=m.job,
                      jobs=SlurmSource(live.slurm.runner).jobs(), processes=(), nodes=())
    expected = {tuple(v) for v in (finding_summary(f) for f in run_rules(sim, policy)) for v in
                [(v["rule"], v["target"], v["suggested"], bool(v["inference"]))]}
    assert _findings(payload) == expected
    ids = live.ids
    z_gpu = [t for r, t, _, _ in expected if r == "zombie"]
    assert len(z_gpu) == 1 and z_gpu[0].startswith("gpu:")
    assert ("idle_allocation", f"job:{ids['finetune-idle']}", "cancel", False) in expected
    assert ("low_efficiency", f"job:{ids['resnet-loader']}", "advise", False) in expected
    assert not {t for _, t, _, _ in expected} & {f"job:{ids['train-llm']}", f"job:{ids['rl-memleak']}"}
    assert all(inf for r, t, _, inf in expected if t == f"job:{ids['chat-inference']}")

    # what one sweep costs on this cluster, measured in-process (no interpreter start-up)
    src = live.prometheus()
    t1 = time.monotonic()
    snap = live_mod.snapshot(policy, now, prometheus=src, slurm=SlurmSource(live.slurm.runner), processes=False)
    snapshot_seconds = time.monotonic() - t1
    assert len(snap.gpus) == 8
    (artifacts / "live_sweep.json").write_text(json.dumps({
        "promql_queries_per_sweep": src.queries_made, "snapshot_seconds": round(snapshot_seconds, 3),
        "cli_sweep_seconds": round(cli_seconds, 2), "gpus": len(snap.gpus), "jobs": len(snap.running_jobs()),
        "findings": sorted(map(list, expected)),
    }, indent=1))
    assert src.queries_made == 6



def test_a_gpu_host_outside_slurms_node_list_is_judged_by_no_rule(live: LiveCluster) -> None:
    """The same Prometheus scrapes a GPU host Slurm does not run (an inference server, a workstation). Slurm's node
    list does not name it and no running job holds it, so its GPUs are ``outside``: no rule judges them, however
    wasted they look, the caps divide by Slurm's GPUs alone, and the node is not made one of Slurm's. Before, its
    GPU holding memory with no job was a zombie, and the sweep counted its GPUs as the cluster's."""
    from gpu_cost.config.loader import load_policy
    from gpu_cost.perceive import live as live_mod
    from gpu_cost.perceive.prometheus import PrometheusSource
    from gpu_cost.perceive.slurm import SlurmSource

    live.wait(max(0.0, live.started + 75 - time.time()))  # a whole 60 s rule window of samples: not stale
    both = f'job=~"{JOB_JOB}|{OUTSIDE_JOB}"'
    policy = load_policy(live.policy_file)
    now = math.floor(time.time() / 5) * 5
    snap = live_mod.snapshot(policy, now, prometheus=PrometheusSource(live.lab.config(both)),
                             slurm=SlurmSource(live.slurm.runner), processes=False)
    env = {**os.environ, **live.slurm.env, "AIRFLOW_CONN_GPU_COST_PROMETHEUS": live.lab.conn_env(both)}
    env.pop("AIRFLOW_CONN_GPU_COST_NODE_SSH", None)
    res = subprocess.run([gpu_cost_bin(), "sweep", "--source", "prometheus", "--policy", str(live.policy_file),
                          "--at", str(now), "--json"], capture_output=True, text=True, env=env, timeout=120)
    slurm_gpus = len(live.slurm.nodes) * live.slurm.gpus_per_node
    g = snap.gpus.set_index(["host", "gpu"])
    # the outside GPUs are read, fresh, and they look wasted: 0 % for the whole window, memory held on GPU 0
    assert {("infer01", 0), ("infer01", 1)} <= set(g.index)
    for gpu in (0, 1):
        row = g.loc[("infer01", gpu)]
        assert row["attribution"] == "outside" and not row["job_id"] and not row["stale"], row.to_dict()
        assert row["util_mean"] < 1, row.to_dict()
    assert g.loc[("infer01", 0), "mem_min_mib"] > 1000
    assert "outside" not in set(snap.gpus.loc[snap.gpus["host"] != "infer01", "attribution"])
    assert snap.gpu_count() == slurm_gpus and "infer01" not in {n.name for n in snap.nodes}
    assert not snap.problems, snap.problems
    assert res.returncode == 0, res.stderr[-2000:]
    payload = json.loads(res.stdout)
    assert payload["gpus"] == slurm_gpus and payload["outside_gpus"] == 2 and not payload["degraded"], payload["problems"]
    judged = [f for f in payload["findings"] if "infer01" in f["target"] or f.get("job_id") in ("970001", "970002")]
    assert not judged, judged
    assert payload["findings"], "the Slurm jobs' findings are still made beside the outside host"

    # the outside host's exporter stops: its series go stale, and the cluster is still seen whole (before, every
    # sweep was degraded by a machine that is not the cluster's, and nothing destructive could act anywhere)
    live.lab.stop_process(OUTSIDE_JOB)
    live.wait(policy.sweep.max_staleness + 10)
    later = live_mod.snapshot(policy, math.floor(time.time() / 5) * 5,
                              prometheus=PrometheusSource(live.lab.config(both)), slurm=SlurmSource(live.slurm.runner),
                              processes=False)
    rows = later.gpus[later.gpus["host"] == "infer01"]
    assert len(rows) == 2 and rows["stale"].all() and set(rows["attribution"]) == {"outside"}
    assert not later.problems and not later.degraded, later.problems
