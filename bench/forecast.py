"""Benchmark: the nightly forecast over 500 demand series (60 days hourly, 48 h horizon) + the runtime model.

The same steps as ``gpu_forecast_nightly`` (store the series, fit them in batches of
``policy.forecast.series_per_task``, fit the end-time model, finish), in this process against a
fresh SQLite audit store. Batches run in ``--workers`` processes, as mapped tasks would on the
workers of a LocalExecutor / Celery deployment. Series are synthetic team-demand curves (daily and
weekly cycles, level shifts, bursts, idle stretches, an outage day); jobs come from the simulator
(``--nodes``) or a trace (``--jobs``). The target is under 10 minutes on a 2-core machine.

    python -m bench.forecast [--series 500] [--workers 2] [--jobs TRACE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import report, rss_mb

NOW = 1_795_960_800.0
DAYS = 60


def synthetic_series(n: int, days: int = DAYS, seed: int = 7) -> Any:
    """Return ``n`` hourly demand series (``ts, key, value``) ending at NOW."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    hours = days * 24
    t = np.arange(hours)
    ts = NOW - 3600.0 * hours + 3600.0 * t
    frames = []
    for i in range(n):
        base = float(rng.lognormal(3, 1))
        daily = base * rng.uniform(0, 0.6) * np.sin(2 * np.pi * (t % 24 - rng.uniform(0, 24)) / 24)
        weekday = ((ts // 86400 + 4) % 7) < 5
        weekly = np.where(weekday, 0.0, -base * rng.uniform(0, 0.5))
        shifts = np.cumsum(np.where(rng.random(hours) < 1 / 240, rng.normal(0, base * 0.3, hours), 0.0))
        bursts = np.where(rng.random(hours) < 0.01, base * rng.uniform(0.5, 2), 0.0)
        bursts = np.convolve(bursts, np.ones(6), mode="same")
        v = np.clip(base + daily + weekly + shifts + bursts + rng.normal(0, base * 0.08, hours), 0, None)
        if rng.random() < 0.2:  # a team that goes quiet for a few days
            s = int(rng.integers(0, hours - 96))
            v[s:s + int(rng.integers(24, 96))] = 0
        v[24 * 20:24 * 21] = 0  # the cluster's monitoring outage day
        frames.append(pd.DataFrame({"ts": ts, "key": f"account:team{i:04d}", "value": np.round(v, 2)}))
    return pd.concat(frames, ignore_index=True)


def run(n_series: int, workers: int, jobs_path: str | None, nodes: int) -> dict[str, Any]:
    """Fit ``n_series`` demand series and the runtime model into a temporary store (removed after)."""
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.capacity.forecast import prophet_util
    from gpu_cost.config.loader import load_policy

    prophet_util.silence()
    policy = load_policy()
    with tempfile.TemporaryDirectory(prefix="gpu-cost-bench-forecast-") as tmp:
        return _run(AuditStore(f"sqlite:///{Path(tmp) / 'audit.db'}").ensure_schema(), policy, n_series, workers,
                    jobs_path, nodes)


def _run(store: Any, policy: Any, n_series: int, workers: int, jobs_path: str | None, nodes: int) -> dict[str, Any]:
    from concurrent.futures import ProcessPoolExecutor

    from gpu_cost.capacity.forecast import history, nightly
    from gpu_cost.sim import cluster as sim_cluster

    base = rss_mb()
    series = synthetic_series(n_series)
    jobs = history.load_jobs(jobs_path) if jobs_path else sim_cluster.sim_jobs(NOW, DAYS, nodes=nodes)
    if jobs_path:  # replay the trace's last 60 days as if tonight were its end
        end = float(jobs["end_ts"].max())
        jobs = jobs[jobs["submit_ts"] >= end - DAYS * 86400].copy()
        for c in ("submit_ts", "start_ts", "end_ts"):
            jobs[c] = jobs[c] + (NOW - end)

    t0 = time.perf_counter()
    ref = nightly.extract(policy, NOW, "sim", store, jobs=jobs)  # jobs + their own demand series
    keys = nightly.store_series(store, series, NOW)
    ref["keys"] = ref["keys"] + keys
    t1 = time.perf_counter()
    batches = nightly.make_batches(ref, policy.forecast.series_per_task, policy.forecast.horizon)
    with ProcessPoolExecutor(workers) as pool:
        results = list(pool.map(nightly._fit_batch_url, [store.url] * len(batches), batches))
    t2 = time.perf_counter()
    rt = nightly.fit_runtime(store, policy, NOW)
    t3 = time.perf_counter()
    out = nightly.finish(store, NOW, results, rt)
    t4 = time.perf_counter()
    fits = sum(r["prophet_fits"] for r in results)
    return {
        "series": len(ref["keys"]), "batches": len(batches), "workers": workers, "jobs": len(jobs),
        "extract_s": round(t1 - t0, 2), "fit_demand_s": round(t2 - t1, 2), "fit_runtime_s": round(t3 - t2, 2),
        "finish_s": round(t4 - t3, 2), "total_s": round(t4 - t0, 2), "prophet_fits": fits,
        "prophet_failed": sum(r["prophet_failed"] for r in results),
        "per_series_s": round((t2 - t1) * workers / max(1, len(ref["keys"])), 3),
        "forecast_rows": store.table_counts()["gpu_cost_forecasts"], "runtime_classes": rt.get("classes", 0),
        "validation_smape": out["demand"]["validation_smape"], "naive_smape": out["demand"]["seasonal_naive_smape"],
        "under_10_min": (t4 - t0) < 600, "peak_mb": round(max(0.0, rss_mb() - base), 1),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=int, default=500)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=64, help="simulated nodes for the job history")
    ap.add_argument("--jobs", help="jobs trace for the runtime model instead of the simulator")
    args = ap.parse_args(argv)
    row = run(args.series, args.workers, args.jobs, args.nodes)
    report("forecast", [row], ["series", "batches", "workers", "jobs", "extract_s", "fit_demand_s", "fit_runtime_s",
                               "finish_s", "total_s", "prophet_fits", "per_series_s", "forecast_rows",
                               "validation_smape", "naive_smape", "under_10_min"])
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
