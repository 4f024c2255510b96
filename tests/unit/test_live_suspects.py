"""A sweep inspects over SSH only the nodes that can hold a zombie, not the whole cluster."""

from __future__ import annotations

from gpu_cost.perceive.live import suspect_hosts
from gpu_cost.sim import cluster as sim
from tests.fixtures.core import NOW


def test_only_nodes_with_idle_memory_outside_jobs_are_inspected(policy, scenario) -> None:  # type: ignore[no-untyped-def]
    snap = sim.snapshot(policy, NOW, scenario)
    # gpu01 holds bob's zombie (memory held, 0 %, no job); gpu02 and gpu03 have only allocated or empty GPUs
    assert suspect_hosts(snap.gpus, snap.jobs, policy) == ["gpu01"]


def test_stale_gpus_are_not_suspects(policy, scenario) -> None:  # type: ignore[no-untyped-def]
    snap = sim.snapshot(policy, NOW, scenario)
    frame = snap.gpus.copy()
    frame["stale"] = True
    assert suspect_hosts(frame, snap.jobs, policy) == []


def test_a_running_job_explains_its_memory(policy, scenario) -> None:  # type: ignore[no-untyped-def]
    snap = sim.snapshot(policy, NOW, scenario)
    frame = snap.gpus.copy()
    frame["mem_min_mib"] = 50_000.0
    frame["util_max"] = 0.0
    hosts = suspect_hosts(frame, snap.jobs, policy)
    # every node has at least one GPU no job holds, so all are suspects now; allocated GPUs alone never are
    assert hosts == ["gpu01", "gpu02", "gpu03"]
    only_alloc = frame[frame["job_id"].notna()]
    assert set(suspect_hosts(only_alloc, snap.jobs, policy)) == set()
