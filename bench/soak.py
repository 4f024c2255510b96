"""Soak: many simulated sweeps in a row through the engine and a real audit store.

Default: 24 simulated hours at 5-minute intervals (288 runs) on the default scenario. Reports
memory per run (steady, not growing), audit rows added per run (bounded), and duplicates (none).

    python -m bench.soak [--hours 24] [--interval 300] [--mode dry-run]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import report, rss_mb


def soak(hours: float = 24.0, interval: float = 300.0, mode: str = "dry-run", db: str | None = None,
         start: float = 1_795_910_400.0) -> dict[str, Any]:
    """Run the sweep every ``interval`` for ``hours`` on the simulated cluster into the store at ``db`` (default: a
    temporary one, removed after)."""
    import dataclasses

    if db is None:
        with tempfile.TemporaryDirectory(prefix="gpu-cost-soak-") as tmp:
            return {**soak(hours, interval, mode, str(Path(tmp) / "audit.db"), start), "db": None}

    from gpu_cost.audit.store import AuditStore
    from gpu_cost.config.loader import load_policy
    from gpu_cost.loop.sweep import run_once
    from gpu_cost.sim.cluster import load_scenario

    policy = load_policy()
    policy2 = dataclasses.replace(policy, mode=mode)
    object.__setattr__(policy2, "source", policy.source)
    scenario = load_scenario()
    path = db
    store = AuditStore(f"sqlite:///{path}").ensure_schema()
    runs = int(hours * 3600 // interval)
    rss, rows, times = [], [], []
    for i in range(runs):
        now = start + i * interval
        t0 = time.perf_counter()
        run_once(policy2, now, store, run_id=f"soak-{i}", source="sim", scenario=scenario)
        times.append(time.perf_counter() - t0)
        rss.append(rss_mb())
        rows.append(sum(store.table_counts().values()))
    dup_decisions = store.query("SELECT decision_id, COUNT(*) AS n FROM gpu_cost_decisions GROUP BY decision_id HAVING COUNT(*) > 1")
    dup_actions = store.query("SELECT action_id, COUNT(*) AS n FROM gpu_cost_actions GROUP BY action_id HAVING COUNT(*) > 1")
    per_run = [b - a for a, b in itertools.pairwise(rows)]
    half = max(1, runs // 2)
    return {
        "runs": runs, "mode": mode, "mean_run_s": sum(times) / len(times), "max_run_s": max(times),
        "rss_first_half_mb": max(rss[:half]), "rss_end_mb": rss[-1],
        "rss_growth_second_half_mb": rss[-1] - max(rss[:half]),
        "rows_total": rows[-1], "rows_per_run_max": max(per_run) if per_run else rows[-1],
        "rows_per_run_mean": (sum(per_run) / len(per_run)) if per_run else float(rows[-1]),
        "duplicate_decisions": len(dup_decisions), "duplicate_actions": len(dup_actions),
        "decisions": store.table_counts()["gpu_cost_decisions"], "db": path,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--interval", type=float, default=300.0)
    ap.add_argument("--mode", default="dry-run", choices=["dry-run", "notify", "enforce"])
    args = ap.parse_args(argv)
    r = soak(args.hours, args.interval, args.mode)
    report("soak", [r], ["runs", "mode", "mean_run_s", "max_run_s", "rss_first_half_mb", "rss_end_mb",
                        "rss_growth_second_half_mb", "rows_per_run_mean", "rows_per_run_max", "duplicate_decisions",
                        "duplicate_actions", "decisions"])


if __name__ == "__main__":
    main(sys.argv[1:])
