"""Index truth over a real sshd: a node whose nvidia-smi numbers its GPUs otherwise than the metrics
and Slurm do has its GPUs stale, and neither a kill nor a cancel is decided there.

The node is the test run's sshd with the node wrapper as a forced command and the fake
``nvidia-smi`` first on the PATH (``tests/fixtures/sshd.py``); Prometheus and Slurm are stubs
giving what they would (the GPU frame with the exporter's UUID per index, one running job):
this test is about the node access path and the engine's answer.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

from gpu_cost.core.model import GPU_COLUMNS, WINDOW_COLUMNS, Job, Node, empty_gpu_frame
from gpu_cost.loop import reclaim, sweep
from gpu_cost.perceive import live
from gpu_cost.perceive.nodes import NodeAccess, NodeSource
from tests.fixtures.sshd import SshNode
from tests.integration.test_nodes_ssh import OWNER, reap, spawn, start_ts

pytestmark = pytest.mark.integration

GPU0 = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, "map0.node.test"))
GPU1 = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, "map1.node.test"))
JOB = "4242"


def smi(first: str, second: str) -> list[dict[str, Any]]:
    return [{"index": 0, "uuid": first, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 81920, "memory_used": 2048,
             "utilization": 0, "pci_bus_id": "00000000:07:00.0"},
            {"index": 1, "uuid": second, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 81920, "memory_used": 0,
             "utilization": 0, "pci_bus_id": "00000000:0B:00.0"}]


def metrics(now: float) -> pd.DataFrame:
    """The exporter's view: GPU 0 is GPU0 holding 2 GiB at 0 % (a leftover), GPU 1 is GPU1, idle, job 4242's."""
    base = empty_gpu_frame()
    rows = []
    for gpu, (u, mem) in enumerate([(GPU0, 2048.0), (GPU1, 0.0)]):
        row: dict[str, Any] = {c: float("nan") for c in GPU_COLUMNS}
        row.update({"host": "gpu01", "gpu": gpu, "uuid": u, "model": "a100", "label_job_id": "", "util_mean": 0.0,
                    "util_max": 0.0, "mem_min_mib": mem, "mem_max_mib": mem, "mem_total_mib": 81920.0,
                    "n_samples": 60, "expected_samples": 60, "last_ts": now, "util_mean_lb": 0.0, "util_max_lb": 0.0,
                    "busy_share_lb": 0.0, "bursts_lb": 0, "n_lb": 60, "stale": False, "util_chart_lb": ""})
        rows.append(row)
    return pd.DataFrame(rows, columns=list(base.columns)).astype(base.dtypes.to_dict())


class Prom:
    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame
        self.queries_made = 0

    def gpu_frame(self, policy: Any, now: float) -> tuple[pd.DataFrame, dict[float, Any]]:
        from gpu_cost.perceive.snapshot import rule_windows

        # the same aggregates for every rule window: the GPUs looked the same all along
        return self.frame.copy(), {w: self.frame[list(WINDOW_COLUMNS)].copy() for w in rule_windows(policy)[1]}

    def node_stats(self, policy: Any, now: float) -> dict[str, dict[str, float]]:
        return {}


class Slurm:
    def __init__(self, now: float) -> None:
        self.job = Job(job_id=JOB, user=OWNER, state="RUNNING", start_ts=now - 7200, nodes=("gpu01",),
                       gpu_alloc=(("gpu01", (1,)),), time_limit_s=86400.0, name="train")

    def jobs(self) -> list[Job]:
        return [self.job]

    def nodes(self) -> list[Node]:
        return [Node(name="gpu01", state="mixed", gpus_total=2, gpus_alloc=1, gpu_model="a100")]

    def reservations(self) -> list[Any]:
        return []


@pytest.fixture
def access(sshd_node: SshNode, monkeypatch: pytest.MonkeyPatch) -> NodeAccess:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_NODE_SSH", sshd_node.conn_env(sshd_node.wrapper_key,
                                                                             hosts={"gpu01": "127.0.0.1"}))
    return NodeAccess.from_connection()


@pytest.fixture
def leftover() -> Iterator[subprocess.Popen[bytes]]:
    """A plain user's process standing for a leftover holding GPU memory."""
    proc = spawn(["/bin/sleep", "600"])
    yield proc
    reap(proc)


@pytest.fixture
def enforcing(policy):  # type: ignore[no-untyped-def]
    # a two-GPU test node: one GPU is half of the cluster, so the share cap is opened for it
    return dataclasses.replace(policy, mode="enforce", manual=dataclasses.replace(policy.manual, operators=("ops",)),
                               caps=dataclasses.replace(policy.caps, max_gpu_share=1.0))


def snapshot(sshd_node: SshNode, access: NodeAccess, policy: Any, pid: int, gpus: list[dict[str, Any]]) -> Any:
    sshd_node.set_state(gpus=gpus, processes=[{"pid": pid, "gpu_uuid": GPU0, "used_mib": 2048, "name": "python"}])
    now = time.time() + 3 * 3600  # the leftover has held its memory for the whole window
    return live.snapshot(policy, now, prometheus=Prom(metrics(now)), slurm=Slurm(now), node_source=NodeSource(access))


def manual(kind: str, target: str, action: str) -> reclaim.Request:
    return reclaim.parse_request({"target_kind": kind, "target_ids": [target], "action": action, "dry_run": False,
                                  "reason": "operator asked to free the GPUs"}, requested_by="ops")


def test_agreeing_node_lets_the_engine_act(sshd_node: SshNode, access: NodeAccess, enforcing, leftover) -> None:  # type: ignore[no-untyped-def]
    snap = snapshot(sshd_node, access, enforcing, leftover.pid, smi(GPU0, GPU1))
    assert not snap.problems, snap.problems
    assert not snap.gpus["stale"].any()
    assert any(p.pid == leftover.pid for p in snap.processes)
    found = {f.rule for f in sweep.detect(snap, enforcing)}
    assert "zombie" in found and "idle_allocation" in found
    out = reclaim.plan(manual("job", JOB, "cancel"), enforcing, snap, now=snap.ts, run_key="t-agree")
    assert out.refused == [] and out.decisions[0].action == "cancel" and out.decisions[0].mode == "enforce"


def test_swapped_numbering_makes_the_node_stale_and_refuses_kill_and_cancel(sshd_node: SshNode, access: NodeAccess,  # type: ignore[no-untyped-def]
                                                                           enforcing, leftover) -> None:
    # nvidia-smi's index 0 is the GPU the exporter calls index 1: an action by index would hit the wrong GPU
    snap = snapshot(sshd_node, access, enforcing, leftover.pid, smi(GPU1, GPU0))
    assert snap.gpus.loc[snap.gpus["host"] == "gpu01", "stale"].all()
    problem = next(p for p in snap.problems if p.startswith("gpu index check on gpu01"))
    assert f"the metrics call GPU 0 {GPU0}, nvidia-smi calls it {GPU1}" in problem
    assert snap.degraded
    assert sweep.detect(snap, enforcing) == []  # stale GPUs: no zombie, no idle allocation
    start = start_ts(leftover.pid)
    for kind, target, action in [("job", JOB, "cancel"), ("process", f"gpu01:{leftover.pid}", "kill_process")]:
        out = reclaim.plan(manual(kind, target, action), enforcing, snap, now=snap.ts, run_key=f"t-{kind}")
        (d,) = out.decisions
        assert d.mode == "dry-run", d  # held back: nothing runs
        assert out.refused and "gpu index check on gpu01" in out.refused[0]["why"], out.refused
    assert leftover.poll() is None and start == start_ts(leftover.pid)


def test_slurm_counting_more_gpus_than_the_node_shows(sshd_node: SshNode, access: NodeAccess, enforcing,  # type: ignore[no-untyped-def]
                                                       leftover, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Slurm, "nodes", lambda self: [Node(name="gpu01", state="mixed", gpus_total=4, gpus_alloc=1)])
    snap = snapshot(sshd_node, access, enforcing, leftover.pid, smi(GPU0, GPU1))
    assert any("Slurm counts 4 GPUs, nvidia-smi shows 2" in p for p in snap.problems), snap.problems
    assert snap.gpus["stale"].all()
