"""Benchmark: what the class baselines and the evidence change on a trace with the hard behaviours.

Generates ``sim-trace --behaviours hard`` (a serving fleet that wakes rarely, checkpoint pauses,
data loading, finished and crashed jobs that keep their GPUs, zombies, leaks, sessions), replays
the shipped policy in enforce mode with the baselines on and off, and prints per behaviour the
jobs found, notified, killed, false kills and the median time to the first notice, then the
totals. Nothing is asserted: the figures are for reading (tests/unit/test_replay_hard.py holds
the behaviour on a smaller trace).

    python -m bench.replay_hard [--days 7] [--gpus 64] [--seed 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import report

END = 1795392000.0  # 2026-11-23T00:00:00Z: the same trace on every run


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.replay_hard")
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from gpu_cost.cli.commands.simtrace import write_sim_trace
    from gpu_cost.config.loader import load_policy
    from gpu_cost.sim.replay import replay_files

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        info = write_sim_trace(out, days=args.days, gpus=args.gpus, seed=args.seed, end=END, behaviours="hard")
        policy = load_policy(None)
        alone = dataclasses.replace(policy, baselines=dataclasses.replace(policy.baselines, enabled=False))
        object.__setattr__(alone, "source", policy.source)
        runs: dict[str, dict[str, Any]] = {}
        for name, pol in (("baselines on", policy), ("baselines off", alone)):
            t0 = time.perf_counter()
            runs[name] = replay_files(out / "samples.parquet", out / "jobs.csv", pol).to_dict()
            runs[name]["wall_s"] = time.perf_counter() - t0
    rows = []
    for beh in sorted(set(runs["baselines on"]["by_behaviour"]) | set(runs["baselines off"]["by_behaviour"])):
        for name, r in runs.items():
            b = r["by_behaviour"].get(beh) or {}
            rows.append({"behaviour": beh, "run": name, "jobs": b.get("jobs"), "found": b.get("found"),
                         "notified": b.get("notified"), "killed": b.get("killed"), "false_kills": b.get("false_kills"),
                         "first_notice_min": None if b.get("median_first_notice_s") is None
                         else round(b["median_first_notice_s"] / 60)})
    report(f"replay_hard: {info['gpus']} GPUs x {args.days:g} days, {info['jobs']} jobs, seed {args.seed}", rows,
           ["behaviour", "run", "jobs", "found", "notified", "killed", "false_kills", "first_notice_min"])
    totals = [{"run": name, "kills": r["kills"], "false_kills": r["false_kills"],
               "reclaimed_gpu_h": r["reclaimed_gpu_hours"], "from_services_gpu_h": r["reclaimed_by_kind"].get("service", 0.0),
               "from_training_gpu_h": r["reclaimed_by_kind"].get("training", 0.0), "idle_gpu_h": r["idle_gpu_hours"],
               "idle_acted_share": r["idle_acted_share"], "approvals": r["approvals_requested"],
               "capped_sweeps": r["capped_sweeps"], "wall_s": round(r["wall_s"], 1)} for name, r in runs.items()]
    report("replay_hard totals", totals, list(totals[0]))


if __name__ == "__main__":
    main()
