"""Benchmark: reading Slurm's JSON of each version at cluster scale, and the GPU index check per node.

Each version's ``squeue.json`` / ``nodes.json`` (``tests/data/slurm/<version>/``) is scaled up by
repeating its jobs and nodes under new ids and names, then ``json.loads`` + the parser are timed
(median of ``--repeat``). The index check row times :func:`gpu_cost.perceive.gpu_map.check_node`
on 8-GPU nodes with driver entries, Slurm allocations and metric UUIDs.

    python -m bench.slurm_json [--jobs 20000] [--nodes 2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

from bench._common import report

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "slurm"


def scaled(release: str, jobs: int, nodes: int) -> tuple[str, str]:
    sq = json.loads((DATA / release / "squeue.json").read_text())
    nd = json.loads((DATA / release / "nodes.json").read_text())
    base_jobs, base_nodes = sq["jobs"], nd["nodes"]
    out_jobs = []
    for i in range(jobs):
        j = copy.deepcopy(base_jobs[i % len(base_jobs)])
        j["job_id"] = 100000 + i
        if isinstance(j.get("array_job_id"), dict):
            j["array_job_id"]["number"] = 0
        out_jobs.append(j)
    out_nodes = []
    for i in range(nodes):
        n = copy.deepcopy(base_nodes[i % len(base_nodes)])
        n["name"] = f"gpu{i:05d}"
        out_nodes.append(n)
    return json.dumps({**sq, "jobs": out_jobs}), json.dumps({**nd, "nodes": out_nodes})


def time_it(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def index_check(nodes: int, repeat: int) -> dict[str, object]:
    from gpu_cost.perceive.gpu_map import DriverGpu, NodeMap, NvmlGpu, check_node

    uuids = [f"GPU-{i:08x}-aaaa-bbbb-cccc-0123456789ab" for i in range(8)]
    nm = NodeMap(nvml=[NvmlGpu(i, uuids[i], f"0000:{0x07 + 16 * i:02x}:00.0") for i in range(8)],
                 driver=[DriverGpu(f"0000:{0x07 + 16 * i:02x}:00.0", i, uuids[i]) for i in range(8)])
    alloc = {"1": [0, 1, 2, 3], "2": [4, 5]}
    metrics = dict(enumerate(uuids))

    def run() -> None:
        for _ in range(nodes):
            check_node("gpu", nm, slurm_gpus=8, slurm_alloc=alloc, metric_uuids=metrics)

    s = time_it(run, repeat)
    return {"version": "index check", "jobs": 0, "nodes": nodes, "jobs_s": 0.0, "nodes_s": s,
            "per_node_us": round(s / nodes * 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from tests.data.slurm.construct import VERSIONS

    from gpu_cost.perceive.slurm import load_json, parse_jobs, parse_nodes

    rows: list[dict[str, object]] = []
    for release in VERSIONS:
        sq, nd = scaled(release, args.jobs, args.nodes)
        jobs_s = time_it(lambda: parse_jobs(load_json(sq, "squeue --json")), args.repeat)  # noqa: B023
        nodes_s = time_it(lambda: parse_nodes(load_json(nd, "scontrol show nodes --json")), args.repeat)  # noqa: B023
        rows.append({"version": f"{release} ({VERSIONS[release][0]})", "jobs": args.jobs, "nodes": args.nodes,
                     "jobs_s": jobs_s, "nodes_s": nodes_s, "per_node_us": None})
    rows.append(index_check(args.nodes, args.repeat))
    report("slurm_json", rows, ["version", "jobs", "nodes", "jobs_s", "nodes_s", "per_node_us"])


if __name__ == "__main__":
    main()
