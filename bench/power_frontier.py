"""Benchmark: the power strategies on real demand, every setting of the agent's knob against Slurm's frontier.

Plays ``gpu-cost power replay``'s strategies (the live ``plan_power`` every hour, Slurm's frontier over
its ``SuspendTime``s, the oracle) over a demand series, or over a jobs trace cut into one key per
calendar month (a month of one cluster is one more team-month to judge a default on), and prints,
for each ``offhours.forecast_quantile``, the node-hours off, the GPU-hours waited, the node-hours
over Slurm's frontier at equal waiting (summed over the keys) and the keys where it falls under.

A default is chosen on one set and checked on another: a mechanism that wins on the set it was
tuned on and loses on the other is fitted to that set's accidents, not to how clusters behave.

    python -m bench.power_frontier --series helios_vc_demand_hourly.csv
    python -m bench.power_frontier --jobs thetagpu_jobs.csv --gpus-per-unit 8 --nodes 24 \\
        --months 2023-01:2023-07
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bench._common import report


def month_series(jobs_path: str, gpus_per_unit: float, months: str | None) -> Any:
    """Return the jobs trace's demand (GPUs running plus pending, hourly) with one key per UTC month."""
    import pandas as pd

    from gpu_cost.capacity.forecast.history import demand_series, load_jobs

    jobs = load_jobs(jobs_path)
    jobs["gpus"] = jobs["gpus"] * gpus_per_unit
    d = demand_series(jobs, float(jobs["submit_ts"].min()), float(jobs["end_ts"].max()), by=(), total=True)
    month = pd.to_datetime(d["ts"], unit="s", utc=True).dt.strftime("%Y-%m")
    d = d.assign(key="month-" + month)
    if months:
        lo, _, hi = months.partition(":")
        d = d[(month >= lo) & (month <= (hi or lo))]
    return d[d.groupby("key")["ts"].transform("count") >= 24 * 14][["ts", "key", "value"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--series", help="demand series (ts, key, value)")
    src.add_argument("--jobs", help="jobs trace (the design's jobs format): one key per month")
    ap.add_argument("--gpus-per-unit", type=float, default=1.0,
                    help="GPUs per unit of the trace's gpus column (a trace that counts nodes: 8)")
    ap.add_argument("--months", help="FIRST:LAST months of the jobs trace to keep (YYYY-MM)")
    ap.add_argument("--nodes", type=int, default=None, help="nodes per key (default: the fewest holding its peak)")
    ap.add_argument("--policy", default=None)
    ap.add_argument("--quantiles", default="0.5,0.7,0.8,0.9,0.95,0.99")
    args = ap.parse_args(argv)

    from gpu_cost.capacity.forecast.history import load_series
    from gpu_cost.config.loader import load_policy
    from gpu_cost.sim.power_replay import ReplaySettings, replay

    series = load_series(args.series) if args.series else month_series(args.jobs, args.gpus_per_unit, args.months)
    settings = ReplaySettings(nodes=args.nodes, quantiles=tuple(float(q) for q in args.quantiles.split(",")))
    out = replay(series, load_policy(args.policy), settings)
    rows = [{"quantile": p["forecast_quantile"], "node_hours_off": p["node_hours_off"],
             "gpu_hours_waited": p["gpu_hours_waited"], "slurm_frontier": p["slurm_frontier_node_hours"],
             "over_frontier": p["over_frontier"], "share_of_oracle": p["share_of_oracle"],
             "keys_below": ",".join(p["keys_below_frontier"]) or "-"} for p in out["frontiers"]["forecast"]]
    report(f"power frontier: {len(out['keys'])} keys, {out['node_hours']} node-hours, default quantile "
           f"{out['settings']['forecast_quantile']:g}; Slurm at 2h waits {out['comparison']['reactive_2h_gpu_hours_waited']}"
           f" GPU-h; {out['seconds']} s", rows,
           ("quantile", "node_hours_off", "gpu_hours_waited", "slurm_frontier", "over_frontier", "share_of_oracle",
            "keys_below"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
