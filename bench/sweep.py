"""Benchmark: one sweep's snapshot → findings → decisions at 1k, 10k, 50k and 100k GPUs (8 per node).

The simulated cluster has twice as many jobs as nodes plus a pending queue. What is timed is the
agent's own work on data that has arrived: aggregating the lookback of 1-minute samples into the
per-GPU frame, joining jobs and processes, the rules and the decision engine. Generating the
simulated samples is not timed. Each size runs in a fresh process; peak memory is the process's
peak RSS during the sweep above what it held when the sweep began (the peak is reset first).
``usage_s`` is the usage record every live sweep also writes (:func:`gpu_cost.report.usage.record_usage`,
on a scratch store), timed apart: ``total_s`` is the decision path alone. So are ``park_s``, the
snapshot written as JSON into the audit store (``park_mb`` of it) for the run's later tasks, as the
DAG's first task does, and ``read_s``, one later task reading it back; ``findings_plan_s``: the
findings and the plan the detect and decide tasks park, each written and read back once; ``size_s``:
what each act step reads of the parked snapshot, the cluster's size for the rolling caps.

    python -m bench.sweep [--sizes 1000,10000,50000,100000] [--sharded 100000:16]
    python -m bench.sweep --sizes 100000 --sharded "" --jobs-per-node 8 --pending-per-node 8.6   # ~200k jobs

``--jobs-per-node`` (default 2) running jobs share each node's 8 GPUs; ``--pending-per-node``
(default 1) jobs wait in the queue per node; both apply to the sharded sizes too.

``--sharded GPUS:SHARDS`` sweeps a cluster in node groups (``sweep.shards``), as the DAG's mapped
tasks do: each group's snapshot (the aggregation of its view's samples) and rules, then the merge
of the groups' snapshots and ONE decision over all their findings. The groups run one after the
other in one process; ``shard_max_s`` is what one worker spends on the slowest group, and
``critical_s`` (slowest group + merge + decide) the sweep's own time with a worker per group.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from bench._common import in_fresh_process, report, reset_peak, rss_mb


def one(gpus: int, seed: int = 1, jobs_per_node: float = 2, pending_per_node: float = 1) -> dict[str, float]:
    from gpu_cost.act.step import cluster_gpus
    from gpu_cost.airflow.sweep_tasks import findings_of, findings_text, plan_of, plan_text
    from gpu_cost.analyse.rules import run_rules
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.config.loader import load_policy
    from gpu_cost.core.model import Snapshot
    from gpu_cost.decide.engine import decide
    from gpu_cost.perceive.snapshot import from_matrix
    from gpu_cost.report.usage import record_usage
    from gpu_cost.sim.cluster import SimCluster, generate_scenario

    policy = load_policy()
    now = 1_795_960_800.0
    nodes = max(1, gpus // 8)
    sc = generate_scenario(nodes=nodes, gpus_per_node=8, jobs_per_node=jobs_per_node,
                           pending=round(nodes * pending_per_node), seed=seed)
    cluster = SimCluster(sc, anchor=now)
    m = cluster.matrix(now - policy.sweep.lookback, now)
    jobs, procs, node_list = cluster.jobs_at(now), cluster.processes_at(now), cluster.nodes_at(now)
    base = reset_peak()
    t0 = time.perf_counter()
    snap = from_matrix(policy=policy, now=now, source="sim", hosts=m.hosts, gpus=m.gpus, uuids=m.uuids, models=m.models,
                       mem_total=m.mem_total, times=m.times, util=m.util, mem=m.mem, power=m.power, job=m.job,
                       jobs=jobs, processes=procs, nodes=node_list)
    t1 = time.perf_counter()
    findings = run_rules(snap, policy)
    t2 = time.perf_counter()
    plan = decide(findings, policy, now=now, escalations={}, total_gpus=len(snap.gpus))
    t3 = time.perf_counter()
    peak = max(0.0, rss_mb() - base)
    # the usage record every live sweep writes besides (not in total_s: the target times the decision path)
    store = AuditStore.scratch().ensure_schema()
    t4 = time.perf_counter()
    record_usage(store, snap, policy, run_id="bench")
    usage_s = time.perf_counter() - t4
    # the snapshot the sweep parks in the audit store for the run's later tasks, and one of them reading it back
    t5 = time.perf_counter()
    text = snap.to_json()
    store.save_snapshot("bench", now, text)
    park_s = time.perf_counter() - t5
    t6 = time.perf_counter()
    Snapshot.from_json(store.load_snapshot("bench"))
    read_s = time.perf_counter() - t6
    # what each act step reads of it: the cluster's size, for the rolling GPU-share caps
    t8 = time.perf_counter()
    size = cluster_gpus(store, "bench")
    size_s = time.perf_counter() - t8
    assert size == snap.gpu_count(), (size, snap.gpu_count())
    # the findings and the plan the detect and decide tasks park, each read back once
    t7 = time.perf_counter()
    findings_of(findings_text(findings))
    plan_of(plan_text(plan))
    findings_plan_s = time.perf_counter() - t7
    return {
        "gpus": gpus, "jobs": len([j for j in jobs if j.running]), "pending": len([j for j in jobs if j.pending]),
        "samples": int(m.util.size), "snapshot_s": t1 - t0, "rules_s": t2 - t1, "decide_s": t3 - t2, "total_s": t3 - t0,
        "peak_mb": peak, "findings": len(findings), "decisions": len(plan.decisions), "usage_s": usage_s,
        "park_s": park_s, "read_s": read_s, "park_mb": len(text) / 1e6, "findings_plan_s": findings_plan_s,
        "size_s": size_s,
    }


def sharded(gpus: int, of: int, seed: int = 1, jobs_per_node: float = 2, pending_per_node: float = 1) -> dict[str, float]:
    import gc

    from gpu_cost.analyse.rules import run_rules
    from gpu_cost.config.loader import load_policy
    from gpu_cost.decide.engine import decide
    from gpu_cost.loop.sweep import merge_shards
    from gpu_cost.perceive import shards
    from gpu_cost.perceive.snapshot import from_matrix
    from gpu_cost.sim.cluster import SimCluster, generate_scenario

    policy = load_policy()
    now = 1_795_960_800.0
    nodes = max(1, gpus // 8)
    sc = generate_scenario(nodes=nodes, gpus_per_node=8, jobs_per_node=jobs_per_node,
                           pending=round(nodes * pending_per_node), seed=seed)
    cluster = SimCluster(sc, anchor=now)
    jobs, node_list = cluster.jobs_at(now), cluster.nodes_at(now)
    base = reset_peak()
    collect_s, detect_s, views, found = [], [], [], []
    for i in range(of):
        # what the group's collect is given (not timed, as above): its view's samples, jobs, processes, nodes
        sel = shards.select([n.name for n in node_list], jobs, (), i, of)
        procs = cluster.processes_at(now, sel.hosts)
        sel = shards.widen(sel, (p.job_id for p in procs if p.job_id))
        m = cluster.matrix(now - policy.sweep.lookback, now, sel.hosts)
        t0 = time.perf_counter()
        snap = from_matrix(policy=policy, now=now, source="sim", hosts=m.hosts, gpus=m.gpus, uuids=m.uuids,
                           models=m.models, mem_total=m.mem_total, times=m.times, util=m.util, mem=m.mem,
                           power=m.power, job=m.job, jobs=[j for j in jobs if j.job_id in sel.jobs], processes=procs,
                           nodes=[n for n in node_list if n.name in sel.hosts])
        t1 = time.perf_counter()
        found.append(shards.owned(run_rules(snap, policy), sel))
        t2 = time.perf_counter()
        collect_s.append(t1 - t0)
        detect_s.append(t2 - t1)
        views.append((sel, snap))
        del m
        gc.collect()
    t0 = time.perf_counter()
    # as the DAG's merge task: each group's selection re-read from its view, the job logs chosen
    # (the class baselines it also reads back from the audit store are not timed: no store here)
    merged = merge_shards([snap for _, snap in views], policy)
    t1 = time.perf_counter()
    findings = shards.merge_findings(found)
    plan = decide(findings, policy, now=now, escalations={}, total_gpus=merged.gpu_count())
    t2 = time.perf_counter()
    per = [c + d for c, d in zip(collect_s, detect_s, strict=True)]
    return {
        "gpus": gpus, "jobs": len([j for j in jobs if j.running]), "pending": len([j for j in jobs if j.pending]),
        "shards": of, "gpus_per_shard": round(gpus / of), "view_gpus_max": max(len(s.gpus) for _, s in views),
        "collect_max_s": max(collect_s), "detect_max_s": max(detect_s), "shard_max_s": max(per),
        "shard_mean_s": sum(per) / of, "merge_s": t1 - t0, "decide_s": t2 - t1,
        "critical_s": max(per) + (t2 - t0), "cpu_s": sum(per) + (t2 - t0), "peak_mb": max(0.0, rss_mb() - base),
        "gpus_merged": len(merged.gpus), "findings": len(findings), "decisions": len(plan.decisions),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,50000,100000", help="GPUS[,GPUS...]; empty: none")
    ap.add_argument("--sharded", default="100000:16", help="GPUS:SHARDS[,GPUS:SHARDS...]; empty: none")
    ap.add_argument("--jobs-per-node", type=float, default=2.0, help="running jobs per 8-GPU node")
    ap.add_argument("--pending-per-node", type=float, default=1.0, help="pending jobs per node")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--one-sharded", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, jobs_per_node=args.jobs_per_node, pending_per_node=args.pending_per_node)))
        return
    if args.one_sharded:
        gpus, of = (int(x) for x in args.one_sharded.split(":"))
        print(json.dumps(sharded(gpus, of, jobs_per_node=args.jobs_per_node, pending_per_node=args.pending_per_node)))
        return
    load = ["--jobs-per-node", str(args.jobs_per_node), "--pending-per-node", str(args.pending_per_node)]
    rows = [in_fresh_process("bench.sweep", ["--one", str(int(s)), *load]) for s in args.sizes.split(",") if s]
    if len(rows) > 1:
        first = rows[0]
        for r in rows:
            r["per_gpu_us"] = 1e6 * r["total_s"] / r["gpus"]
            r["growth_vs_first"] = (r["total_s"] / first["total_s"]) / (r["gpus"] / first["gpus"])
    if rows:
        report("sweep", rows, ["gpus", "jobs", "pending", "samples", "snapshot_s", "rules_s", "decide_s", "total_s", "usage_s",
                               "park_s", "read_s", "park_mb", "findings_plan_s", "size_s", "peak_mb", "findings", "decisions", "per_gpu_us",
                               "growth_vs_first"])
    split = [in_fresh_process("bench.sweep", ["--one-sharded", spec, *load]) for spec in args.sharded.split(",") if spec]
    if split:
        report("sweep-sharded", split, ["gpus", "jobs", "pending", "shards", "gpus_per_shard", "view_gpus_max", "collect_max_s",
                                        "detect_max_s", "shard_max_s", "shard_mean_s", "merge_s", "decide_s",
                                        "critical_s", "cpu_s", "peak_mb", "findings", "decisions"])


if __name__ == "__main__":
    main(sys.argv[1:])
