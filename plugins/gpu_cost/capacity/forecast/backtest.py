"""The two contract backtests: job end times against the time limit, demand against the simple forecasts.

**Runtime** (:func:`runtime_backtest`): the model is fitted on jobs that *ended* before the split;
it predicts every job that *started* at or after it. A test job's features may use jobs that
finished before that job was submitted (what a live agent would know then), never later ones.
Runtimes are capped at the limit (a job killed at its limit runs a few seconds past it).

**Demand** (:func:`demand_backtest`): per series, the last ``horizon`` hours are held out and the
forecast sees only what came before (or, with ``refit_every``, is refitted that often inside them,
as the nightly DAG does). Scored against the two simple forecasts under the same refit schedule:
the weekly seasonal naive (the value one week earlier) and the daily repeat (yesterday's hours).

* **WAPE** (a fraction: 0.25 means a quarter of the GPU-hours demanded were mis-forecast) is the
  capacity figure: absolute GPUs off summed over the hours, over the GPUs demanded. Overall it is
  pooled -- every series' errors over all their demand -- so a big team weighs what its GPUs
  weigh. ``gpu_hours_short`` (demand above the forecast: queueing if capacity followed it) and
  ``gpu_hours_idle`` (forecast above demand: GPUs kept up for nothing) split the same errors.
* ``best_naive`` is, per series, the better of the two simple forecasts by WAPE on the held-out
  hours (chosen knowing them, so a demanding bar); overall ``best_naive_wape`` pools those
  per-series choices, ``seasonal_naive_wape`` / ``daily_repeat_wape`` pool one method everywhere.
* sMAPE (0 to 200, 0/0 counts 0) averaged over the series, for continuity. It punishes any non-zero
  forecast of an idle hour with the full 200, whatever the GPUs, so it is not the capacity figure.
* ``hindsight_flat_smape``: the best constant forecast *chosen knowing the held-out hours* -- not a
  forecast, a gauge of how predictable the held-out window was. A model far above it has room to
  improve; a model close to it (or below, thanks to the daily shape) is losing to level shifts that
  no forecast from the series alone could see coming.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_cost.capacity.forecast import demand as demand_mod
from gpu_cost.capacity.forecast import prophet_util
from gpu_cost.capacity.forecast import runtime as runtime_mod
from gpu_cost.capacity.forecast.history import finished
from gpu_cost.core.errors import TraceError
from gpu_cost.core.timeutil import iso

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

logger = logging.getLogger(__name__)


def pinball(y: np.ndarray, q: np.ndarray, tau: float = runtime_mod.Q) -> float:
    """Return the mean quantile loss at ``tau`` of predictions ``q`` for outcomes ``y``."""
    import numpy as np

    return float(np.mean(np.where(y > q, tau * (y - q), (1 - tau) * (q - y))))


def runtime_metrics(y: np.ndarray, limit: np.ndarray, p50: np.ndarray, p90: np.ndarray) -> dict[str, Any]:
    """Return the contract metrics for runtimes ``y`` (capped at ``limit``) and predictions."""
    import numpy as np

    y = np.minimum(y, limit)
    return {
        "n_test": len(y),
        "mae_s": round(float(np.mean(np.abs(p50 - y))), 1),
        "baseline_limit_mae_s": round(float(np.mean(np.abs(limit - y))), 1),
        "underpredict_rate": round(float(np.mean(p50 < y)), 4),
        "p90_coverage": round(float(np.mean(y <= p90 + 1e-6)), 4),
        "p90_pinball_s": round(pinball(y, p90), 1),
        "baseline_limit_p90_pinball_s": round(pinball(y, limit), 1),
    }


def runtime_backtest(jobs: pd.DataFrame, split: float, *, k: int = 100, min_class_jobs: int = 30,
                     use_prophet: bool = True) -> dict[str, Any]:
    """Fit on jobs ended before ``split``, predict jobs started at or after it; return the metrics."""
    import numpy as np

    t0 = time.perf_counter()
    done = finished(jobs)
    train = done[done["end_ts"] < split]
    test = done[done["start_ts"] >= split].reset_index(drop=True)
    if train.empty or test.empty:
        raise TraceError(f"backtest split {split}: {len(train)} training and {len(test)} test jobs; need both")
    model = runtime_mod.fit(train, now=split, k=k, min_class_jobs=min_class_jobs, use_prophet=use_prophet)
    pred = runtime_mod.predict(model, test, history=done)
    y = (test["end_ts"] - test["start_ts"]).to_numpy(dtype=float)
    limit = test["time_limit_s"].to_numpy(dtype=float)
    out = runtime_metrics(y, limit, pred["p50_s"].to_numpy(), pred["p90_s"].to_numpy())
    # the simple baseline the issue quotes: per user and limit, the training median (else the limit)
    tr_y = np.minimum((train["end_ts"] - train["start_ts"]).to_numpy(dtype=float), train["time_limit_s"].to_numpy())
    med = train.assign(y=tr_y).groupby(["user", "time_limit_s"])["y"].median()
    base = test.join(med.rename("m"), on=["user", "time_limit_s"])["m"].fillna(test["time_limit_s"]).to_numpy()
    out["baseline_user_limit_median_mae_s"] = round(float(np.mean(np.abs(base - np.minimum(y, limit)))), 1)
    out.update({
        "n_train": len(train), "split": split,
        "methods": {str(m): int(n) for m, n in pred["method"].value_counts().items()},
        "model": model.summary(), "seconds": round(time.perf_counter() - t0, 1),
    })
    for key in ("mae_s", "baseline_limit_mae_s", "p90_pinball_s", "baseline_limit_p90_pinball_s",
                "baseline_user_limit_median_mae_s"):
        out[key.replace("_s", "_h") if key.endswith("_s") else key] = round(out[key] / 3600, 3)
    out["pinball_vs_limit"] = round(out["p90_pinball_s"] / out["baseline_limit_p90_pinball_s"], 3) \
        if out["baseline_limit_p90_pinball_s"] else None
    return out


def smape(y: np.ndarray, p: np.ndarray) -> float:
    """Return sMAPE in percent (0 to 200); a point where both are 0 counts 0."""
    import numpy as np

    den = np.abs(y) + np.abs(p)
    with np.errstate(all="ignore"):
        v = np.where(den == 0, 0.0, 200.0 * np.abs(y - p) / np.where(den == 0, 1.0, den))
    return float(np.mean(v))


def wape(y: np.ndarray, p: np.ndarray) -> float:
    """Return the WAPE of ``p``: the sum of absolute errors over the sum of demand (a fraction; NaN if none).

    Unlike sMAPE it weighs an hour by its GPUs, so being 5 GPUs off costs the same at 2 GPUs
    demanded as at 200, and a quiet team's hours do not dominate the score.
    """
    import numpy as np

    y, p = np.asarray(y, dtype=float), np.asarray(p, dtype=float)
    ok = ~np.isnan(y)
    den = float(np.sum(np.abs(y[ok])))
    return float(np.sum(np.abs(y[ok] - p[ok]))) / den if den > 0 else float("nan")


def short_idle(y: np.ndarray, p: np.ndarray) -> tuple[float, float]:
    """Return ``(GPU-hours short, GPU-hours idle)``: demand above the forecast, forecast above demand."""
    import numpy as np

    y, p = np.asarray(y, dtype=float), np.asarray(p, dtype=float)
    ok = ~np.isnan(y)
    d = y[ok] - p[ok]
    return float(np.sum(np.clip(d, 0, None))), float(np.sum(np.clip(-d, 0, None)))


def seasonal_naive(train: np.ndarray, horizon: int, season: int = 168) -> np.ndarray:
    """Return the last ``season`` values repeated over ``horizon`` (shorter history: daily)."""
    import numpy as np

    if len(train) < season:
        season = 24 if len(train) >= 24 else max(1, len(train))
    return train[-season:][np.arange(horizon) % season]


def hindsight_flat_smape(y: np.ndarray) -> float:
    """Return the lowest sMAPE any constant forecast reaches on ``y`` (the constant chosen knowing ``y``).

    Searched over every observed value and a geometric grid spanning them (sMAPE of a constant is
    not convex, so the minimum is bracketed rather than solved); NaNs are ignored.
    """
    import numpy as np

    y = np.asarray(y, dtype=float)
    y = y[~np.isnan(y)]
    if not len(y):
        return float("nan")
    top = float(np.max(y))
    grid = np.unique(np.concatenate([[0.0], y, np.geomspace(max(top, 1.0) * 1e-3, max(top, 1.0) * 1.2, 400)]))
    den = np.abs(y)[None, :] + grid[:, None]
    with np.errstate(all="ignore"):
        cost = np.where(den == 0, 0.0, 200.0 * np.abs(y[None, :] - grid[:, None]) / np.where(den == 0, 1.0, den))
    return float(cost.mean(axis=1).min())


@dataclass
class _Held:
    """What each forecast said about the held-out hours, and the simple forecasts refreshed as often."""

    yhat: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    daily: np.ndarray
    weekly: np.ndarray
    models: list[str]
    fallbacks: list[str]


def _rolling(tr_ts: np.ndarray, v: np.ndarray, n_train: int, horizon: int, every: int, stats: prophet_util.FitStats,
             use_prophet: bool) -> _Held:
    """Forecast ``v[n_train:]`` in ``every``-hour pieces, each refitted on everything before it.

    What a forecast refreshed every ``every`` hours (the nightly DAG: 24) would have said about
    each held-out hour; the daily repeat and seasonal naive are refreshed at the same instants.
    """
    import numpy as np

    yhat, lo, hi, daily, weekly, models, fallbacks = [], [], [], [], [], [], []
    for o in range(n_train, n_train + horizon, every):
        n = min(every, n_train + horizon - o)
        fc = demand_mod.forecast(tr_ts[:o], v[:o], n, stats=stats, use_prophet=use_prophet)
        yhat.append(fc.yhat)
        lo.append(fc.lower)
        hi.append(fc.upper)
        daily.append(seasonal_naive(np.nan_to_num(v[:o]), n, 24))
        weekly.append(seasonal_naive(np.nan_to_num(v[:o]), n))
        models.append(fc.model)
        if fc.fallback:
            fallbacks.append(f"{iso(tr_ts[o])} {fc.fallback}")
    return _Held(np.concatenate(yhat), np.concatenate(lo), np.concatenate(hi), np.concatenate(daily),
                 np.concatenate(weekly), models, fallbacks)


NAIVES = ("seasonal_naive", "daily_repeat")  # the simple forecasts the model must beat


def demand_backtest(series: pd.DataFrame, horizon: int, *, use_prophet: bool = True,
                    refit_every: int | None = None) -> dict[str, Any]:
    """Hold out the last ``horizon`` hours of every series; return the model's errors next to the naive ones.

    By default one forecast made at the start of the held-out hours covers all of them (the
    contract). With ``refit_every`` (hours) the forecast is refitted that often, on everything seen
    so far, and each piece scores the hours up to the next refit -- how the nightly DAG's forecasts
    (refitted every 24 h) are actually read; the daily repeat and seasonal naive are then refreshed
    as often. Per series and overall: sMAPE (mean over series), WAPE and GPU-hours short / idle
    (pooled over series: the overall WAPE is every series' absolute errors over all their demand),
    for the model and for ``best_naive``, the better of seasonal naive and daily repeat by WAPE.
    """
    import numpy as np

    if refit_every is not None and refit_every < 1:
        raise TraceError(f"demand backtest: refit_every must be at least 1 hour, got {refit_every}")
    t0 = time.perf_counter()
    per: dict[str, dict[str, Any]] = {}
    stats = prophet_util.FitStats()
    pooled: dict[str, list[float]] = {}  # per forecast: GPU-hours short and idle, summed over series
    demand = 0.0
    for key, g in series.groupby("key", sort=True):
        g = g.sort_values("ts")
        ts = g["ts"].to_numpy(dtype=float)
        v = g["value"].to_numpy(dtype=float)
        if len(v) < horizon + 48:
            logger.info("series %s: %d points, too short for a %d h holdout; skipped", key, len(v), horizon)
            continue
        tr_v, te = v[:-horizon], v[-horizon:]
        held = _rolling(ts, v, len(tr_v), horizon, refit_every or horizon, stats, use_prophet)
        ok = ~np.isnan(te)
        y = te[ok]
        fcs = {"model": held.yhat[ok], "seasonal_naive": held.weekly[ok], "daily_repeat": held.daily[ok]}
        figs = {k: _errors(y, p) for k, p in fcs.items()}
        best = min(NAIVES, key=lambda k: _nan_last(figs[k]["wape"]))
        for k, f in (*figs.items(), ("best_naive", figs[best])):
            acc = pooled.setdefault(k, [0.0, 0.0])
            acc[0] += f["gpu_hours_short"]
            acc[1] += f["gpu_hours_idle"]
        demand += float(np.sum(np.abs(y)))
        models: dict[str, int] = {}
        for m in held.models:
            models[m] = models.get(m, 0) + 1
        per[str(key)] = {
            "smape": round(smape(y, fcs["model"]), 2),
            "seasonal_naive_smape": round(smape(y, fcs["seasonal_naive"]), 2),
            "daily_repeat_smape": round(smape(y, fcs["daily_repeat"]), 2),
            "hindsight_flat_smape": round(hindsight_flat_smape(y), 2),
            **_rounded(figs["model"]),
            "seasonal_naive_wape": _round4(figs["seasonal_naive"]["wape"]),
            "daily_repeat_wape": _round4(figs["daily_repeat"]["wape"]),
            "best_naive": best,
            **_rounded(figs[best], "best_naive_"),
            "best_naive_smape": round(smape(y, fcs[best]), 2),
            "coverage_80": round(float(np.mean((y >= held.lower[ok]) & (y <= held.upper[ok]))), 3),
            "gpu_hours": round(float(np.sum(np.abs(y))), 1),
            "model": "+".join(sorted(models)),
            "models": models,
            "fallbacks": held.fallbacks,
        }
    if not per:
        raise TraceError(f"demand backtest: no series has more than {horizon + 48} hourly points")
    mean = {m: round(float(np.mean([p[m] for p in per.values()])), 2)
            for m in ("smape", "seasonal_naive_smape", "daily_repeat_smape", "hindsight_flat_smape", "coverage_80",
                      "best_naive_smape")}
    overall: dict[str, Any] = {"gpu_hours": round(demand, 1)}
    for k, (short, idle) in pooled.items():
        overall.update(_rounded({"wape": (short + idle) / demand if demand > 0 else float("nan"),
                                 "gpu_hours_short": short, "gpu_hours_idle": idle}, "" if k == "model" else f"{k}_"))
    # the one simple method that does best on all series together (per series, best_naive may differ)
    overall["best_single_naive"] = min(NAIVES, key=lambda k: _nan_last(overall[f"{k}_wape"]))
    overall["fallback_series"] = sorted(k for k, p in per.items() if p["fallbacks"])
    logger.info("%s", stats.summary("demand"))
    return {**mean, **overall, "n_series": len(per), "horizon": horizon, "refit_every": refit_every, "series": per,
            "prophet_fits": stats.fits, "seconds": round(time.perf_counter() - t0, 1)}


def _errors(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    short, idle = short_idle(y, p)
    return {"wape": wape(y, p), "gpu_hours_short": short, "gpu_hours_idle": idle}


def _rounded(figs: dict[str, float], prefix: str = "") -> dict[str, Any]:
    return {f"{prefix}wape": _round4(figs["wape"]), f"{prefix}gpu_hours_short": round(figs["gpu_hours_short"], 1),
            f"{prefix}gpu_hours_idle": round(figs["gpu_hours_idle"], 1)}


def _round4(x: float) -> float | None:
    # JSON has no NaN: a series (or set) that saw no demand has no WAPE
    return None if x != x else round(x, 4)


def _nan_last(x: float | None) -> float:
    return float("inf") if x is None or x != x else x
