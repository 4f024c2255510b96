"""``gpu-cost sim-trace``: write a simulated cluster's history as a trace (samples + jobs) for replays.

The trace is in the project's trace format: ``samples.parquet`` (``ts, host, gpu, util,
mem_used_mib, uuid, mem_total_mib, power_w, job_id, pid, user``; ``pid``/``user`` name the
process holding the GPU, so a replay can act on orphan processes) and ``jobs.csv`` (``job_id,
user, account, partition, name, state, submit_ts, start_ts, end_ts, time_limit_s, gpus, nodes,
gpu_ids, labels, batch``; ``batch`` is False for an interactive session) plus the ground truth
per job: ``behaviour`` and, for zombies, ``linger_end_ts`` (when the orphan process would have
exited by itself); and ``logs.csv`` (``ts, job_id, stream, line``), what the jobs wrote to their
StdOut/StdErr over the trace.

``--behaviours hard`` generates the behaviours of real clusters that fool a utilisation
threshold (a fleet of quiet service endpoints, checkpoint and data-loading phases, interactive
sessions, finished and crashed jobs that keep their allocation); the default ``basic`` is the
mix it always was, sample for sample. ``--behaviours serving-fleet`` generates a production LLM
serving cluster (:func:`gpu_cost.sim.cluster.serving_fleet`): replica sets of one model each, one
GPU a pod, busy 20-60 % of the time, a few replicas starved for most of the day, a one-day
deployment, plus pods that never computed and finished training jobs whose process lingers.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

from gpu_cost.cli.options import add_json, duration_arg, instant_arg
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.timeutil import iso


def register(sub: Any) -> None:
    p = sub.add_parser("sim-trace", help="write a simulated cluster's history as a trace (for gpu-cost replay)")
    p.add_argument("--days", type=float, default=7.0, help="length of the trace in days (default 7)")
    p.add_argument("--gpus", type=int, default=128, help="number of GPUs (rounded up to whole nodes; default 128)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--jobs-per-node", type=float, default=2.0, help="job arrivals per node per hour (default 2)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--end", help="trace end (ISO 8601 or epoch; default: the start of the current hour)")
    p.add_argument("--sample-interval", default="60s", help="time between samples, with its unit (default 60s)")
    p.add_argument("--format", choices=["parquet", "csv"], default="parquet", help="samples file format")
    p.add_argument("--behaviours", choices=["basic", "hard", "serving-fleet"], default="basic",
                   help="behaviour mix: basic (default), hard (service fleet, checkpoint and data-loading phases, "
                        "finished and crashed jobs, interactive sessions) or serving-fleet (replica sets of one model "
                        "each, one GPU a pod, busy a fifth to three fifths of the time, starved replicas, pods that never computed, lingering "
                        "finished training; --jobs-per-node is not used)")
    p.add_argument("--out", required=True, help="output directory")
    add_json(p)
    p.set_defaults(handler=_simtrace)


def _simtrace(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    if args.days <= 0 or args.gpus <= 0 or args.gpus_per_node <= 0:
        raise GpuCostError("--days, --gpus and --gpus-per-node must be positive")
    end = instant_arg(args.end, "--end") if args.end else float(int(time.time()) // 3600 * 3600)
    out = write_sim_trace(Path(args.out), days=args.days, gpus=args.gpus, gpus_per_node=args.gpus_per_node,
                          jobs_per_node=args.jobs_per_node, seed=args.seed, end=end,
                          sample_interval=duration_arg(args.sample_interval, "--sample-interval"), fmt=args.format,
                          behaviours=args.behaviours)
    text = (f"wrote {out['samples_rows']:,} samples of {out['gpus']} GPUs over {args.days:g} days, "
            f"{out['jobs']} jobs ({out['behaviours']}) and {out['logs_rows']:,} log lines to {out['samples']}, "
            f"{out['jobs_file']} and {out['logs_file']}")
    return out, text


def write_sim_trace(out: Path, *, days: float, gpus: int, gpus_per_node: int = 8, jobs_per_node: float = 2.0,
                    seed: int = 0, end: float, sample_interval: float = 60.0, fmt: str = "parquet",
                    mix: dict[str, float] | None = None, behaviours: str = "basic") -> dict[str, Any]:
    """Generate a scenario, observe it over ``[end - days, end]`` and write the trace files.

    ``behaviours`` is the mix of :func:`gpu_cost.sim.cluster.generate_scenario` (``basic`` or ``hard``).
    """
    from gpu_cost.sim.cluster import generate_scenario

    nodes = max(1, math.ceil(gpus / gpus_per_node))
    sc = generate_scenario(nodes=nodes, gpus_per_node=gpus_per_node, jobs_per_node=jobs_per_node, days=days,
                           seed=seed, sample_interval=sample_interval, pending=0, mix=mix, behaviours=behaviours)
    sc = dataclasses.replace(sc, anchor=float(end), source=f"<sim-trace seed={seed}>")
    return write_scenario_trace(out, sc, end - days * 86400.0, end, fmt=fmt)


def write_scenario_trace(out: Path, scenario: Any, start: float, end: float, *, fmt: str = "parquet") -> dict[str, Any]:
    """Observe ``scenario`` over ``(start, end]`` and write ``samples.<fmt>``, ``jobs.csv`` and ``logs.csv`` under ``out``."""
    import numpy as np

    from gpu_cost.sim.cluster import SimCluster, long_samples, sim_pid

    cluster = SimCluster(scenario, anchor=end)
    if cluster.mig is not None:
        # the trace format keys a GPU by (host, gpu): a slice would collide with its neighbours
        raise GpuCostError(f"{scenario.source}: a scenario with MIG slices cannot be written as a trace "
                           "(samples name a GPU by host and index only); use it with the simulator or the exporter")
    m = cluster.matrix(start, end)
    n_g, n_t = m.util.shape
    pid = np.zeros((n_g, n_t), dtype=np.int64)
    owner = np.full((n_g, n_t), -1, dtype=np.int32)
    users: list[str] = []
    linger_end: dict[str, float] = {}
    for j in scenario.jobs:
        if j.pending or j.start is None or j.node is None:
            continue
        s = cluster.anchor + j.start
        e = math.inf if j.end is None else cluster.anchor + j.end
        if j.behaviour == "zombie":
            tail = math.inf if j.end is None or j.linger is None else e + j.linger
            if j.end is not None:
                linger_end[j.job_id] = tail
        elif j.behaviour in ("idle", "crashed"):
            tail = min(e, s + j.busy_first)  # the process exits (or dies) after its real work; the allocation stays
        else:
            tail = e
        lo = int(np.searchsorted(m.times, s, side="left"))
        hi = int(np.searchsorted(m.times, tail, side="left"))
        if hi <= lo:
            continue
        rows = cluster.job_rows(j)  # every node of a multi-node job
        pid[rows, lo:hi] = sim_pid(j.job_id)
        users.append(j.user)
        owner[rows, lo:hi] = len(users) - 1
    user_arr = np.array([*users, ""], dtype=object)
    samples = long_samples(m, pid=pid, user=user_arr[owner])
    jobs = cluster.jobs_trace(start, end)
    if not jobs.empty:
        jobs["linger_end_ts"] = jobs["job_id"].map(lambda j: linger_end.get(j))
        jobs.loc[jobs["linger_end_ts"] == math.inf, "linger_end_ts"] = None
    out.mkdir(parents=True, exist_ok=True)
    sfile = out / f"samples.{fmt}"
    if fmt == "parquet":
        samples.to_parquet(sfile, index=False)
    else:
        samples.to_csv(sfile, index=False)
    jfile = out / "jobs.csv"
    jobs.to_csv(jfile, index=False)
    logs = cluster.log_lines(start, end)
    lfile = out / "logs.csv"
    logs.to_csv(lfile, index=False)
    counts = jobs["behaviour"].value_counts().to_dict() if not jobs.empty else {}
    return {"samples": str(sfile), "jobs_file": str(jfile), "logs_file": str(lfile), "samples_rows": len(samples),
            "logs_rows": len(logs), "gpus": int(n_g), "jobs": len(jobs),
            "behaviours": {str(k): int(v) for k, v in counts.items()}, "start": iso(start), "end": iso(end)}
