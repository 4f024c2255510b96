"""Benchmark: the shipped policy over random serving fleets (``sim-trace --behaviours serving-fleet``).

Each fleet is one day of a production LLM serving cluster drawn from its seed (replica sets of one
model each, one GPU a pod, busy 20-60 % of the time, starved replicas, a one-day deployment, plus
pods that never computed and finished training jobs whose process lingers). Every fleet is
replayed with the shipped policy in enforce, approvals granted, with the class baselines and
without them. The figures: false kills (the target: 0), replicas killed, the never-active pods
and the lingering finished training jobs found (the target: all), and the destructive rungs a
human was asked about with the lowest confidence they showed. Nothing is asserted here
(``tests/unit/test_serving_fleet.py`` holds the properties).

    python -m bench.serving_fleet [--fleets 20] [--gpus 144] [--seed 0] [--days 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import report

END = 1795392000.0  # 2026-11-23T00:00:00Z: the same traces on every run


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.serving_fleet")
    ap.add_argument("--fleets", type=int, default=20)
    ap.add_argument("--gpus", type=int, default=144)
    ap.add_argument("--seed", type=int, default=0, help="the first fleet's seed (then seed + 1, ...)")
    ap.add_argument("--days", type=float, default=1.0)
    args = ap.parse_args(argv)
    from gpu_cost.cli.commands.simtrace import write_sim_trace
    from gpu_cost.config.loader import load_policy
    from gpu_cost.sim.replay import replay_files

    shipped = load_policy(None)
    alone = dataclasses.replace(shipped, baselines=dataclasses.replace(shipped.baselines, enabled=False))
    object.__setattr__(alone, "source", shipped.source)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seed, args.seed + args.fleets):
            out = Path(tmp) / str(seed)
            info = write_sim_trace(out, days=args.days, gpus=args.gpus, seed=seed, end=END, behaviours="serving-fleet")
            for variant, policy in (("baselines", shipped), ("without baselines", alone)):
                t0 = time.perf_counter()
                r = replay_files(out / "samples.parquet", out / "jobs.csv", policy, mode="enforce",
                                 approvals="approve").to_dict()
                beh = r["by_behaviour"]
                conf = [float(a["confidence"]) for a in r["human_asked"] if a.get("confidence") is not None]
                rows.append({
                    "seed": seed, "policy": variant, "replicas": beh.get("replica", {}).get("jobs", 0),
                    "kills": r["kills"], "false_kills": r["false_kills"],
                    "replicas_killed": beh.get("replica", {}).get("killed", 0),
                    "never_active_found": f"{beh.get('never_active', {}).get('found', 0)}/"
                                          f"{info['behaviours'].get('never_active', 0)}",
                    "lingering_found": f"{beh.get('zombie', {}).get('found', 0)}/{info['behaviours'].get('zombie', 0)}",
                    "human_asked": r["human_asked_count"], "min_conf_asked": min(conf) if conf else None,
                    "wall_s": round(time.perf_counter() - t0, 1)})
    cols = list(rows[0])
    report(f"{args.fleets} serving fleets of {args.gpus} GPUs over {args.days:g} day(s), shipped policy in enforce, "
           "approvals granted", rows, cols)
    summary = []
    for variant in ("baselines", "without baselines"):
        mine = [r for r in rows if r["policy"] == variant]
        never = [tuple(int(x) for x in r["never_active_found"].split("/")) for r in mine]
        linger = [tuple(int(x) for x in r["lingering_found"].split("/")) for r in mine]
        conf = [r["min_conf_asked"] for r in mine if r["min_conf_asked"] is not None]
        summary.append({"policy": variant, "fleets": len(mine), "false_kills": sum(r["false_kills"] for r in mine),
                        "replicas_killed": sum(r["replicas_killed"] for r in mine),
                        "never_active_found": f"{sum(a for a, _ in never)}/{sum(b for _, b in never)}",
                        "lingering_found": f"{sum(a for a, _ in linger)}/{sum(b for _, b in linger)}",
                        "human_asked": sum(r["human_asked"] for r in mine), "min_conf_asked": min(conf) if conf else None})
    report("serving fleets, all seeds together (targets: 0 false kills, every never-active pod and lingering "
           "finished job found)", summary, list(summary[0]))

if __name__ == "__main__":
    main()
