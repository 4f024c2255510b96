"""The nightly forecast, step by step: extract → fit demand per batch of series → runtime model → finish.

Each step reads what it needs from the audit store and writes its results there, so the steps can
run in different processes or on different workers (Airflow's mapped tasks) with no shared disk:

* :func:`extract` reads the job history (simulator, Slurm accounting, the agent's own job rows or a
  trace file), stores it as one ``history:jobs`` row and every hourly demand series as one
  ``history:<key>`` row (``kind = history``, values in ``extra``), and returns the series keys.
* :func:`fit_batch` forecasts a batch of series and upserts ``demand:<key>`` rows (one per horizon hour).
* :func:`fit_runtime` fits the end-time model, upserts one ``runtime:class:<class>`` row per class
  and one ``runtime:job:<id>`` row per running job, and backtests itself on the last week.
* :func:`finish` writes the ``backtest:demand`` / ``backtest:runtime`` rows and returns the figures.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from gpu_cost.capacity.forecast import history as hist_mod
from gpu_cost.capacity.forecast import prophet_util
from gpu_cost.core import registry
from gpu_cost.core.errors import GpuCostError, TraceError

if TYPE_CHECKING:
    import pandas as pd

    from gpu_cost.audit.store import AuditStore
    from gpu_cost.config.schema import Policy

logger = logging.getLogger(__name__)

SOURCES = ("sim", "slurm", "store", "trace")
MAX_LISTED = 20  # fallen-back series named in the nightly's figures (XCom); the rest are counted
_JOB_COLS = ("job_id", "user", "account", "partition", "name", "state", "submit_ts", "start_ts", "end_ts",
             "time_limit_s", "gpus")


def history_source(source: str | None) -> str:
    """Map a run's source to where job history comes from (the sweep's ``prometheus`` → Slurm)."""
    if source in (None, "", "sim"):
        return "sim"
    if source in ("prometheus", "slurm"):
        return "slurm"
    if source in SOURCES:
        return str(source)
    raise GpuCostError(f"forecast: unknown history source {source!r} (use one of {', '.join(SOURCES)})")


def load_history(policy: Policy, now: float, source: str, store: AuditStore | None = None,
                 jobs_path: str | None = None, sim_nodes: int = 16) -> pd.DataFrame:
    """Return the jobs of the ``policy.forecast.history`` window before ``now`` from ``source``."""
    days = policy.forecast.history / 86400.0
    since = now - policy.forecast.history
    if source == "sim":
        return registry.source("sim").sim_jobs(now, min(days, policy.forecast.sim_days), nodes=sim_nodes, with_scenario=True)
    if source == "trace":
        if not jobs_path:
            raise GpuCostError("forecast: source 'trace' needs a jobs file (param 'jobs')")
        jobs = hist_mod.load_jobs(jobs_path)
        return jobs[(jobs["submit_ts"] < now) & (jobs["end_ts"].isna() | (jobs["end_ts"] >= since))]
    if source == "slurm":
        jobs = hist_mod.slurm_jobs(since, now)
        if jobs is not None:
            return jobs
        logger.warning("Slurm accounting unavailable: using the agent's own job rows")
    if store is None:
        raise GpuCostError("forecast: history from the audit store needs a store")
    return hist_mod.store_jobs(store, since, now)


def run_key(now: float, run_id: str | None = None) -> str:
    """Return the run id the stored rows name: the caller's, else ``forecast__<epoch>`` (a run outside Airflow)."""
    return run_id or f"forecast__{int(now)}"


def _upsert(store: AuditStore, rows: list[dict[str, Any]], now: float, run_id: str | None) -> int:
    """Upsert forecast rows naming their run and data instant (``now``): an older run never replaces a newer one."""
    return store.execute("upsert_forecast", [{**r, "run_id": run_key(now, run_id), "data_ts": now} for r in rows])


def _history_row(series: str, now: float, payload: Mapping[str, Any]) -> dict[str, Any]:
    return {"series": series, "horizon_ts": now, "kind": "history", "yhat": None, "yhat_lower": None,
            "yhat_upper": None, "model": None, "created_at": now, "extra": json.dumps(payload, separators=(",", ":"))}


def extract(policy: Policy, now: float, source: str, store: AuditStore, *, jobs_path: str | None = None,
            jobs: pd.DataFrame | None = None, run_id: str | None = None) -> dict[str, Any]:
    """Read the history, store jobs and hourly demand series; return ``{now, keys, ...}`` (small)."""
    src = history_source(source)
    if jobs is None:
        jobs = load_history(policy, now, src, store, jobs_path)
    jobs = jobs[jobs["submit_ts"].fillna(jobs["start_ts"]) < now]
    # a job still running at ``now`` has no end yet, whatever the source knew later
    jobs = jobs.assign(end_ts=jobs["end_ts"].where(jobs["end_ts"] <= now))
    since = now - policy.forecast.history
    if len(jobs):  # a shorter history than the window: leading empty hours are no demand signal
        since = max(since, float(jobs["submit_ts"].fillna(jobs["start_ts"]).min()) // 3600 * 3600)
    series = hist_mod.demand_series(jobs, since, now, policy.forecast.dimensions)
    _upsert(store, [_history_row("history:jobs", now, {c: _col(jobs[c]) for c in _JOB_COLS})], now, run_id)
    keys = store_series(store, series, now, run_id=run_id)
    finished = int(jobs["end_ts"].notna().sum())
    logger.info("forecast history from %s: %d jobs (%d finished), %d demand series", src, len(jobs), finished,
                len(keys))
    return {"now": now, "source": src, "jobs": len(jobs), "finished_jobs": finished, "keys": keys,
            "run_id": run_key(now, run_id)}


def store_series(store: AuditStore, series: pd.DataFrame, now: float, *, run_id: str | None = None) -> list[str]:
    """Store each hourly series (``ts, key, value``) as one ``history:<key>`` row; return the keys kept.

    A series that never saw any demand is left out (nothing to forecast).
    """
    import numpy as np

    rows, keys = [], []
    for key, g in series.groupby("key", sort=True):
        g = g.sort_values("ts")
        if not float(g["value"].max()) > 0:
            continue
        keys.append(str(key))
        rows.append(_history_row(f"history:{key}", now, {"t0": float(g["ts"].iloc[0]), "step": 3600.0,
                                                          "values": np.round(g["value"].to_numpy(), 3).tolist()}))
    _upsert(store, rows, now, run_id)
    return keys


def _col(s: pd.Series) -> list[Any]:
    if s.dtype.kind in "fi":
        return [None if v != v else (round(float(v), 1)) for v in s.to_numpy(dtype=float)]
    return [str(v) for v in s.fillna("").to_numpy()]


def _load_row(store: AuditStore, series: str, now: float) -> dict[str, Any]:
    # this run's own row (a newer run's rows do not hide it from this run's later steps)
    rows = store.fetch("forecast_at", {"series": series, "horizon_ts": now})
    if not rows:
        raise GpuCostError(f"forecast: no stored {series} for the run at {now} (run extract first)")
    return json.loads(rows[0]["extra"])


def stored_jobs(store: AuditStore, now: float) -> pd.DataFrame:
    """Return the job history :func:`extract` stored for the run at ``now``."""
    import pandas as pd

    return hist_mod.normalise_jobs(pd.DataFrame(_load_row(store, "history:jobs", now)), "stored history")


def stored_series(store: AuditStore, key: str, now: float) -> tuple[Any, Any]:
    """Return (ts, values) of one demand series :func:`extract` stored for the run at ``now``."""
    import numpy as np

    p = _load_row(store, f"history:{key}", now)
    v = np.asarray(p["values"], dtype=float)
    return float(p["t0"]) + float(p["step"]) * np.arange(len(v)), v


def make_batches(ref: Mapping[str, Any], size: int, horizon_s: float) -> list[dict[str, Any]]:
    """Split the series keys into batches of ``size``: the arguments of the mapped fit tasks."""
    keys = list(ref.get("keys", []))
    horizon_h = math.ceil(horizon_s / 3600.0)
    return [{"now": ref["now"], "keys": keys[i:i + size], "horizon_h": horizon_h, "batch": i // size,
             "run_id": ref.get("run_id")} for i in range(0, len(keys), max(1, size))]


def fit_batch(store: AuditStore, batch: Mapping[str, Any]) -> dict[str, Any]:
    """Forecast each series of the batch and upsert its ``demand:<key>`` rows; return a summary."""
    from gpu_cost.capacity.forecast import demand

    now = float(batch["now"])
    stats = prophet_util.FitStats()
    models: dict[str, int] = {}
    val, base, val_wape, naive_wape = [], [], [], []
    fallbacks: list[str] = []
    n_rows = 0
    t0 = time.perf_counter()
    for key in batch["keys"]:
        ts, v = stored_series(store, key, now)
        fc = demand.forecast(ts, v, int(batch["horizon_h"]), stats=stats)
        n_rows += _upsert(store, demand.forecast_rows(key, fc, now), now, batch.get("run_id")) or len(fc.ts)
        models[fc.model] = models.get(fc.model, 0) + 1
        if fc.fallback:
            fallbacks.append(key)
            logger.info("demand:%s fell back to %s", key, fc.fallback)
        if fc.candidate in fc.scores and fc.baseline_smape is not None:
            val.append(fc.scores[fc.candidate])
            base.append(fc.baseline_smape)
        naive = [w for k in ("seasonal_naive", "daily_repeat") if (w := fc.wape.get(k)) is not None]
        chosen = fc.wape.get(fc.candidate)
        if chosen is not None and naive:
            val_wape.append(chosen)
            naive_wape.append(min(naive))
    logger.info("batch %s: %d series, %s", batch.get("batch"), len(batch["keys"]), stats.summary("demand"))
    return {"batch": batch.get("batch"), "series": len(batch["keys"]), "rows": n_rows, "models": models,
            "val_smape_sum": round(sum(val), 3), "baseline_smape_sum": round(sum(base), 3), "scored": len(val),
            "val_wape_sum": round(sum(val_wape), 4), "best_naive_wape_sum": round(sum(naive_wape), 4),
            "wape_scored": len(val_wape), "fallbacks": fallbacks,
            "prophet_fits": stats.fits, "prophet_failed": stats.failed,
            "seconds": round(time.perf_counter() - t0, 2)}


def fit_runtime(store: AuditStore, policy: Policy, now: float, *, backtest_days: float = 7.0,
                run_id: str | None = None) -> dict[str, Any]:
    """Fit the end-time model on the stored history; upsert class and running-job rows; backtest it."""
    from gpu_cost.capacity.forecast import backtest, runtime

    t0 = time.perf_counter()
    jobs = stored_jobs(store, now)
    done = hist_mod.finished(jobs, before=now)
    if done.empty:
        logger.warning("no finished jobs in the history: no runtime model tonight")
        return {"classes": 0, "running_jobs": 0, "backtest": None}
    model = runtime.fit(jobs, now=now, min_class_jobs=policy.forecast.min_class_jobs)
    rows = runtime.class_rows(model, now)
    job_rows = runtime.job_rows(model, jobs, now)
    _upsert(store, rows + job_rows, now, run_id)
    figures: dict[str, Any] | None = None
    split = now - backtest_days * 86400.0
    if (done["end_ts"] < split).sum() >= 30 and (done["start_ts"] >= split).sum() >= 10:
        try:
            figures = backtest.runtime_backtest(jobs[jobs["start_ts"] < now], split,
                                                min_class_jobs=policy.forecast.min_class_jobs)
            figures = {k: figures[k] for k in ("n_test", "mae_s", "baseline_limit_mae_s", "underpredict_rate",
                                               "p90_coverage", "p90_pinball_s", "baseline_limit_p90_pinball_s")}
        except TraceError as exc:
            logger.info("runtime backtest skipped: %s", exc)
    return {"classes": len(rows), "running_jobs": len(job_rows), "model": model.summary(), "backtest": figures,
            "seconds": round(time.perf_counter() - t0, 2)}


def finish(store: AuditStore, now: float, batches: Iterable[Mapping[str, Any]],
           runtime_out: Mapping[str, Any] | None, *, run_id: str | None = None) -> dict[str, Any]:
    """Sum the batch summaries, write the backtest rows, return the figures for XCom."""
    batches = list(batches)
    models: dict[str, int] = {}
    for b in batches:
        for m, n in b.get("models", {}).items():
            models[m] = models.get(m, 0) + int(n)
    scored = sum(int(b.get("scored", 0)) for b in batches)
    val = sum(float(b.get("val_smape_sum", 0)) for b in batches) / scored if scored else None
    base = sum(float(b.get("baseline_smape_sum", 0)) for b in batches) / scored if scored else None
    wape_scored = sum(int(b.get("wape_scored", 0)) for b in batches)
    val_wape = sum(float(b.get("val_wape_sum", 0)) for b in batches) / wape_scored if wape_scored else None
    naive_wape = sum(float(b.get("best_naive_wape_sum", 0)) for b in batches) / wape_scored if wape_scored else None
    fell_back = sorted(k for b in batches for k in b.get("fallbacks", []))
    demand_fig = {"series": sum(int(b.get("series", 0)) for b in batches), "rows": sum(int(b.get("rows", 0)) for b in batches),
                  "models": models, "validation_smape": _round(val), "seasonal_naive_smape": _round(base),
                  "validation_wape": _round(val_wape, 4), "best_naive_wape": _round(naive_wape, 4),
                  # XCom stays small: the count, and the first keys (each row's extra says why)
                  "fallbacks": len(fell_back), "fallback_series": fell_back[:MAX_LISTED],
                  "prophet_fits": sum(int(b.get("prophet_fits", 0)) for b in batches),
                  "prophet_failed": sum(int(b.get("prophet_failed", 0)) for b in batches)}
    rt_fig = dict((runtime_out or {}).get("backtest") or {})
    rows = [{"series": "backtest:demand", "horizon_ts": now, "kind": "backtest", "yhat": _round(val),
             "yhat_lower": None, "yhat_upper": _round(base), "model": "smape vs seasonal naive", "created_at": now,
             "extra": json.dumps(demand_fig)}]
    if rt_fig:
        rows.append({"series": "backtest:runtime", "horizon_ts": now, "kind": "backtest", "yhat": rt_fig.get("mae_s"),
                     "yhat_lower": None, "yhat_upper": rt_fig.get("baseline_limit_mae_s"),
                     "model": "mae_s vs time limit", "created_at": now, "extra": json.dumps(rt_fig)})
    _upsert(store, rows, now, run_id)
    out = {"now": now, "demand": demand_fig, "runtime": {**{k: v for k, v in (runtime_out or {}).items()
                                                                if k != "backtest"}, "backtest": rt_fig or None}}
    logger.info("nightly forecast: %s", json.dumps(out, default=str))
    return out


def _round(v: float | None, digits: int = 2) -> float | None:
    return None if v is None else round(v, digits)


def run(policy: Policy, now: float, store: AuditStore, source: str | None = "sim", *, jobs_path: str | None = None,
        jobs: pd.DataFrame | None = None, workers: int = 1, run_id: str | None = None) -> dict[str, Any]:
    """Run the whole nightly in this process (the CLI and the bench): same steps as the DAG.

    :param run_id: the run the stored rows name (default ``forecast__<epoch of now>``).
    """
    ref = extract(policy, now, source or "sim", store, jobs_path=jobs_path, jobs=jobs, run_id=run_id)
    batches = make_batches(ref, policy.forecast.series_per_task, policy.forecast.horizon)
    if workers > 1 and len(batches) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(_fit_batch_url, [store.url] * len(batches), batches))
    else:
        results = [fit_batch(store, b) for b in batches]
    rt = fit_runtime(store, policy, now, run_id=ref["run_id"])
    return finish(store, now, results, rt, run_id=ref["run_id"])


def _fit_batch_url(url: str, batch: Mapping[str, Any]) -> dict[str, Any]:
    from gpu_cost.audit.store import AuditStore

    prophet_util.silence()
    return fit_batch(AuditStore(url).ensure_schema(), batch)


def summary_line(out: Mapping[str, Any]) -> str:
    """Return the demo's one-line summary of a nightly result."""
    d = out.get("demand") or {}
    r = out.get("runtime") or {}
    bt = r.get("backtest") or {}
    fell = f"; {d['fallbacks']} fell back to a simple forecast" if d.get("fallbacks") else ""
    parts = [f"{d.get('series', 0)} demand series (validation sMAPE {d.get('validation_smape')} vs seasonal naive "
             f"{d.get('seasonal_naive_smape')}{fell})", f"{r.get('classes', 0)} runtime classes",
             f"{r.get('running_jobs', 0)} running-job ETAs"]
    if bt:
        parts.append(f"runtime MAE {bt['mae_s'] / 3600:.2f} h vs limit {bt['baseline_limit_mae_s'] / 3600:.2f} h")
    return ", ".join(parts)



def demo_forecast(store: AuditStore, home: Any, result: dict[str, Any]) -> None:
    """Demo hook: add ``forecast`` (one line on what the nightly forecast stored) to the demo's result."""
    rows = store.query("SELECT * FROM gpu_cost_forecasts WHERE kind = 'backtest' ORDER BY horizon_ts DESC")
    if not rows:
        result["forecast"] = "no nightly forecast recorded"
        return
    latest = max(float(r["horizon_ts"]) for r in rows)
    figs = {r["series"].split(":", 1)[1]: json.loads(r["extra"] or "{}") for r in rows
            if abs(float(r["horizon_ts"]) - latest) < 1}
    classes = store.query("SELECT COUNT(*) AS n FROM gpu_cost_forecasts WHERE series LIKE 'runtime:class:%'")[0]["n"]
    jobs = store.query("SELECT COUNT(*) AS n FROM gpu_cost_forecasts WHERE series LIKE 'runtime:job:%'")[0]["n"]
    out = {"demand": figs.get("demand") or {}, "runtime": {"classes": classes, "running_jobs": jobs,
                                                           "backtest": figs.get("runtime")}}
    result["forecast"] = summary_line(out)
    result["forecast_figures"] = out
