"""Benchmark: one sweep's snapshot → findings → decisions at 1k, 10k, 50k and 100k GPUs (8 per node).

The simulated cluster has twice as many jobs as nodes plus a pending queue. What is timed is the
agent's own work on data that has arrived: aggregating the lookback of 1-minute samples into the
per-GPU frame, joining jobs and processes, the rules and the decision engine. Generating the
simulated samples is not timed. Each size runs in a fresh process; peak memory is the process's
peak RSS above what it held before the sweep.

    python -m bench.sweep [--sizes 1000,10000,50000,100000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from bench._common import in_fresh_process, report, rss_mb


def one(gpus: int, seed: int = 1) -> dict[str, float]:
    from gpu_cost.policy import load_policy
    from gpu_cost.policy.engine import decide
    from gpu_cost.rules import run_rules
    from gpu_cost.snapshot import from_matrix
    from gpu_cost.sources.sim import SimCluster, generate_scenario

    policy = load_policy()
    now = 1_795_960_800.0
    nodes = max(1, gpus // 8)
    sc = generate_scenario(nodes=nodes, gpus_per_node=8, jobs_per_node=2, pending=nodes, seed=seed)
    cluster = SimCluster(sc, anchor=now)
    m = cluster.matrix(now - policy.sweep.lookback, now)
    jobs, procs, node_list = cluster.jobs_at(now), cluster.processes_at(now), cluster.nodes_at(now)
    base = rss_mb()
    t0 = time.perf_counter()
    snap = from_matrix(policy=policy, now=now, source="sim", hosts=m.hosts, gpus=m.gpus, uuids=m.uuids, models=m.models,
                       mem_total=m.mem_total, times=m.times, util=m.util, mem=m.mem, power=m.power, job=m.job,
                       jobs=jobs, processes=procs, nodes=node_list)
    t1 = time.perf_counter()
    findings = run_rules(snap, policy)
    t2 = time.perf_counter()
    plan = decide(findings, policy, now=now, escalations={}, total_gpus=len(snap.gpus))
    t3 = time.perf_counter()
    return {
        "gpus": gpus, "jobs": len([j for j in jobs if j.running]), "pending": len([j for j in jobs if j.pending]),
        "samples": int(m.util.size), "snapshot_s": t1 - t0, "rules_s": t2 - t1, "decide_s": t3 - t2, "total_s": t3 - t0,
        "peak_mb": max(0.0, rss_mb() - base), "findings": len(findings), "decisions": len(plan.decisions),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,50000,100000")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one)))
        return
    rows = [in_fresh_process("bench.sweep", ["--one", str(int(s))]) for s in args.sizes.split(",")]
    if len(rows) > 1:
        first = rows[0]
        for r in rows:
            r["per_gpu_us"] = 1e6 * r["total_s"] / r["gpus"]
            r["growth_vs_first"] = (r["total_s"] / first["total_s"]) / (r["gpus"] / first["gpus"])
    report("sweep", rows, ["gpus", "jobs", "pending", "samples", "snapshot_s", "rules_s", "decide_s", "total_s",
                           "peak_mb", "findings", "decisions", "per_gpu_us", "growth_vs_first"])


if __name__ == "__main__":
    main(sys.argv[1:])
