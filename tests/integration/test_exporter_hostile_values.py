"""Hostile exporter values scraped by the real Prometheus never make a GPU idle.

The world: the session's real Slurm 22.05 runs eight one-GPU ``sleep`` jobs that fill both
nodes (``gpu01``, ``gpu02``); a crafted dcgm-format exporter (:mod:`tests.fixtures.hostile_exporter`)
serves, for each job's GPU (index from Slurm, ``hpc_job`` label = the job), the readings of its
role — ``NaN`` everything, ``+Inf``, ``-Inf``, utilisation ``-5`` and ``250``, a GPU whose series
vanish mid-window, a healthy idle control and a healthy busy control — and, on a third host
Slurm does not know, two unallocated GPUs at 0 % with negative and absurd (DCGM's blank value)
framebuffer memory, which would be zombies if the memory were read. The session's real
Prometheus 2.42 scrapes it every 5 s. Then ``gpu-cost sweep --source prometheus --mode enforce
--json`` runs as an operator runs it, with a one-rung ``demote`` ladder and no approval, so a
GPU read as idle would get a destructive decision if the data were whole.

Expected: the sweep exits 0 and reports the six GPUs with unusable or vanished utilisation as
stale (the run is degraded, so nothing acts); no finding and no decision names a hostile GPU or
its job; the healthy idle control is still found; no NaN/Inf/out-of-range value reaches the
snapshot's columns.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fixtures.hostile_exporter import STEP, WINDOW, HostileExporter, policy
from tests.fixtures.prometheus import PromLab, gpu_cost_bin

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = "gpu-hostile"
SELECTOR = f'job="{JOB}"'
#: 5 s samples, 60 s windows (the shortest a policy allows); enforce with a one-rung destructive ladder and nothing holding it back
POLICY = policy("enforce", "  idle_allocation: {window: 60s, min_runtime: 60s, ladder: [{action: demote}]}\n"
                           "  low_efficiency: {min_runtime: 60s}\n",
                "protections: []\napproval: {gpu_hours_at_risk: 100000}\n"
                "caps: {max_actions_per_run: 50, max_gpu_share: 1.0}\n")
NAN, INF = math.nan, math.inf
#: DCGM's "blank" value for an int field the driver could not read (0x7ffffff0)
DCGM_BLANK = 2147483632.0
#: role → readings; the first eight run as Slurm jobs (in this order: four per node)
ALLOCATED: dict[str, dict[str, Any]] = {
    "nan": {"util": NAN, "mem_used": NAN, "mem_free": NAN, "power": NAN, "temp": NAN},
    "pos-inf": {"util": INF, "mem_used": 2048, "power": INF, "temp": INF},
    "neg-inf": {"util": -INF, "mem_used": 2048, "power": -INF, "temp": -INF},
    "negative": {"util": -5, "mem_used": 2048, "power": -60},
    "over-100": {"util": 250, "mem_used": 2048},
    "vanish": {"util": 0, "mem_used": 500},
    "idle": {"util": 0, "mem_used": 500},
    "busy": {"util": 92, "mem_used": 30000, "power": 350},
}
#: unallocated GPUs on a host Slurm does not know: idle, memory unreadable
UNALLOCATED: dict[str, tuple[int, dict[str, Any]]] = {
    "neg-mem": (0, {"util": 0, "mem_used": -4096, "mem_free": 86016}),
    "absurd-mem": (1, {"util": 0, "mem_used": DCGM_BLANK, "mem_free": 0}),
}
EXTRA_HOST = "gpu03"
#: roles whose utilisation cannot be used (or vanished): stale, never idle
STALE = {"nan", "pos-inf", "neg-inf", "negative", "over-100", "vanish"}
HOSTILE = set(ALLOCATED) - {"idle", "busy"} | set(UNALLOCATED)


@dataclasses.dataclass
class HostileRun:
    gpu_of: dict[str, tuple[str, int]]  # role → (host, index)
    job_of: dict[str, str]  # role → Slurm job id (allocated roles)
    at: float
    payload: dict[str, Any]
    stderr: str
    snapshot: Any
    audit_url: str

    def role_of_target(self, target: str) -> str | None:
        for role, jid in self.job_of.items():
            if target == f"job:{jid}":
                return role
        for role, (host, gpu) in self.gpu_of.items():
            if target == f"gpu:{host}:{gpu}" or target.startswith(f"proc:{host}:"):
                return role
        return None


def _wait(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise TimeoutError(f"{what} not within {timeout:g}s")


@pytest.fixture(scope="module")
def hostile_run(slurm_cluster, prom_lab: PromLab, hostile_exporter: HostileExporter,  # type: ignore[no-untyped-def]
                tmp_path_factory) -> Iterator[HostileRun]:
    from gpu_cost.config.loader import load_policy
    from gpu_cost.perceive import live
    from gpu_cost.perceive.prometheus import PrometheusSource
    from gpu_cost.perceive.slurm import SlurmSource

    root = tmp_path_factory.mktemp("hostile")
    policy_file = root / "policy.yaml"
    policy_file.write_text(POLICY)
    policy = load_policy(policy_file)
    slurm_cluster.cancel_all()
    job_of = {}
    for i, role in enumerate(ALLOCATED):
        node = slurm_cluster.nodes[i * len(slurm_cluster.nodes) // len(ALLOCATED)]
        job_of[role] = slurm_cluster.submit("sleep 600\n", f"--job-name=hostile-{role}", "--gres=gpu:1",
                                            f"--nodelist={node}", "--cpus-per-task=1", "--mem=100")
    try:
        for jid in job_of.values():
            slurm_cluster.wait_state(jid, "RUNNING", timeout=30)
        running_since = time.time()
        jobs = {j.job_id: j for j in SlurmSource(slurm_cluster.runner).jobs()}
        gpu_of: dict[str, tuple[str, int]] = {}
        for role, jid in job_of.items():
            (key,) = jobs[jid].gpu_keys()
            gpu_of[role] = key
            hostile_exporter.set(*key, job=jid, **ALLOCATED[role])
        assert len(set(gpu_of.values())) == len(ALLOCATED), gpu_of
        for role, (idx, readings) in UNALLOCATED.items():
            gpu_of[role] = (EXTRA_HOST, idx)
            hostile_exporter.set(EXTRA_HOST, idx, **readings)

        prom_lab.add_target(JOB, hostile_exporter.port)
        prom_lab.wait_up(1, timeout=30, job=JOB)
        # most of a window of samples for every GPU, then one GPU's series vanish (Prometheus marks
        # them stale at its next scrape)
        time.sleep(max(0.0, running_since + WINDOW - 2 * STEP - time.time()))
        host, gpu = gpu_of["vanish"]
        hostile_exporter.remove(host, gpu)
        vanished = f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{SELECTOR},Hostname="{host}",gpu="{gpu}"}}'
        _wait(lambda: not prom_lab.query(vanished, at=math.floor(time.time() / STEP) * STEP), 30,
              "the vanished GPU's staleness marker")
        # every job past min_runtime and the window (idle_allocation's condition)
        time.sleep(max(0.0, running_since + WINDOW + STEP - time.time()))
        at = math.floor(time.time() / STEP) * STEP

        audit_url = f"sqlite:///{root / 'audit.db'}"
        env = {**os.environ, **slurm_cluster.env,
               "AIRFLOW_CONN_GPU_COST_PROMETHEUS": prom_lab.conn_env(SELECTOR),
               "AIRFLOW_CONN_GPU_COST_DB": json.dumps({"conn_type": "sqlite", "host": str(root / "audit.db")})}
        for var in ("AIRFLOW_CONN_GPU_COST_NODE_SSH", "AIRFLOW_CONN_GPU_COST_SLACK"):
            env.pop(var, None)
        res = subprocess.run([gpu_cost_bin(), "sweep", "--source", "prometheus", "--policy", str(policy_file),
                              "--mode", "enforce", "--at", str(int(at)), "--json"],
                             capture_output=True, text=True, env=env, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
        payload = json.loads(res.stdout)
        # the same instant in-process, for the per-GPU columns the JSON summary does not carry
        snap = live.snapshot(policy, at, prometheus=PrometheusSource(prom_lab.config(SELECTOR)),
                             slurm=SlurmSource(slurm_cluster.runner), processes=False)
        yield HostileRun(gpu_of, job_of, at, payload, res.stderr, snap, audit_url)
    finally:
        (prom_lab.root / f"extra-{JOB}.json").unlink(missing_ok=True)
        for jid in job_of.values():
            slurm_cluster.run("scancel", jid)


def test_the_sweep_survives_and_reports_the_bad_gpus(hostile_run: HostileRun) -> None:
    from gpu_cost.audit.store import AuditStore

    out = hostile_run.payload
    # the third host's GPUs are outside the scheduler: read, judged by nothing, counted apart
    assert out["source"] == "prometheus" and out["gpus"] == len(ALLOCATED)
    assert out["outside_gpus"] == len(UNALLOCATED)
    assert out["jobs"] == len(ALLOCATED)
    assert out["degraded"], out["problems"]
    hosts = sorted({hostile_run.gpu_of[r][0] for r in STALE})
    assert f"stale or missing GPU series: {len(STALE)} of {out['gpus']} GPUs (on {', '.join(hosts)})" in out["problems"]
    # nothing failed: Prometheus and Slurm answered
    assert not [p for p in out["problems"] if p.startswith(("prometheus", "slurm", "node_exporter"))], out["problems"]
    store = AuditStore(hostile_run.audit_url)
    assert store.get_run(out["run_id"])["status"] == "degraded"

    g = hostile_run.snapshot.gpus.set_index(["host", "gpu"])
    stale = {role for role, key in hostile_run.gpu_of.items() if g.loc[key, "stale"]}
    assert stale == STALE
    # the vanished GPU had samples earlier in the window: it vanished mid-window, it is not unknown
    vanish = g.loc[hostile_run.gpu_of["vanish"]]
    assert vanish["n_samples"] > 0 and math.isnan(vanish["last_ts"])


def test_no_hostile_gpu_is_found_idle_or_acted_on(hostile_run: HostileRun) -> None:
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.core.model import DESTRUCTIVE_ACTIONS

    out = hostile_run.payload
    found = {(f["rule"], hostile_run.role_of_target(f["target"])) for f in out["findings"]}
    assert not {role for _, role in found} & HOSTILE, out["findings"]
    decided = {hostile_run.role_of_target(d["target"]) for d in out["decisions"]}
    assert not decided & HOSTILE, out["decisions"]
    assert [d for d in out["decisions"] if d["action"] in DESTRUCTIVE_ACTIONS and d["mode"] != "dry-run"] == []
    rows = AuditStore(hostile_run.audit_url).query("SELECT target, action, mode FROM gpu_cost_decisions")
    assert not {hostile_run.role_of_target(r["target"]) for r in rows} & HOSTILE, rows
    # the busy control is not flagged either
    assert "busy" not in {role for _, role in found}


def test_the_healthy_idle_gpu_is_still_found(hostile_run: HostileRun) -> None:
    out = hostile_run.payload
    idle = f"job:{hostile_run.job_of['idle']}"
    assert [(f["rule"], f["target"], f["suggested"]) for f in out["findings"]] == [("idle_allocation", idle, "cancel")]
    (held,) = [d for d in out["decisions"] if d["target"] == idle]
    # whole data would demote it (enforce, no approval); the stale GPUs hold it back to a dry-run record
    assert held["action"] == "demote" and held["mode"] == "dry-run", held
    g = hostile_run.snapshot.gpus.set_index(["host", "gpu"])
    row = g.loc[hostile_run.gpu_of["idle"]]
    assert not row["stale"] and row["util_max"] == 0 and row["attribution"] == "slurm"
    busy = g.loc[hostile_run.gpu_of["busy"]]
    assert not busy["stale"] and busy["util_mean"] == pytest.approx(92)


def test_hostile_readings_never_reach_the_snapshot(hostile_run: HostileRun) -> None:
    import numpy as np

    gpus = hostile_run.snapshot.gpus
    util = gpus[["util_mean", "util_max", "util_mean_lb", "util_max_lb"]].to_numpy(float)
    assert ((util >= 0) & (util <= 100) | np.isnan(util)).all(), gpus[["host", "gpu", "util_mean", "util_max"]]
    mem = gpus[["mem_min_mib", "mem_max_mib"]].to_numpy(float)
    assert ((mem >= 0) & (mem <= 81920) | np.isnan(mem)).all(), gpus[["host", "gpu", "mem_min_mib", "mem_max_mib"]]
    assert not np.isinf(gpus["power_w"].to_numpy(float)).any()
    g = gpus.set_index(["host", "gpu"])
    for role in STALE - {"vanish"}:
        row = g.loc[hostile_run.gpu_of[role]]
        assert math.isnan(row["util_max"]) and row["n_samples"] == 0, (role, row.to_dict())
    for role in UNALLOCATED:
        row = g.loc[hostile_run.gpu_of[role]]
        assert not row["stale"] and row["util_max"] == 0, (role, row.to_dict())
        assert math.isnan(row["mem_min_mib"]) and math.isnan(row["mem_max_mib"]), (role, row.to_dict())
    nodes = {n.name: n for n in hostile_run.snapshot.nodes}
    assert all(n.power_w is None or math.isfinite(n.power_w) for n in nodes.values()), nodes


def test_the_sample_path_drops_the_same_readings() -> None:
    """Simulator, traces and replays (``aggregate.clean``) drop what the PromQL drops."""
    import numpy as np

    from gpu_cost.perceive.aggregate import clean

    util = np.array([[NAN, INF, -INF, -5, 250, 0, 92, 0, 0]])
    mem = np.array([[NAN, 2048, 2048, 2048, 2048, 500, 30000, -4096, DCGM_BLANK]])
    u, m = clean(util, mem)
    assert np.isnan(u[0, :5]).all() and list(u[0, 5:]) == [0, 92, 0, 0]
    assert list(m[0, 1:7]) == [2048, 2048, 2048, 2048, 500, 30000] and np.isnan(m[0, [0, 7, 8]]).all()
