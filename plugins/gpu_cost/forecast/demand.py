"""Demand model: hourly GPUs wanted (running + pending) per account / partition, 48 h and more ahead.

Team demand on a GPU cluster is mostly a *level* that shifts when projects start and stop, with a
daily / weekly shape that is strong on some clusters and weak or unsteady on others. No single
method wins: Prophet follows the shape but over-reacts to the last shift, the recent level is right
until it moves, last week is often a different regime. So the forecast is the hour-by-hour
**median of five forecasts** -- two flat ones (recent level, level reverting to the week's median)
and three with a shape (Prophet, last week, the last week's median day). A fixed combination, not
a per-series pick: with two to four weeks of history a pick scored on a couple of validation folds
is mostly noise, and in rolling-origin tests on the Helios VC traces (every cut-off before the
held-out week) the median beat picking the best two or three candidates per series; on strongly
seasonal series the three shaped members carry the median. The median is also the right centre
for sMAPE, which rewards not chasing outliers. The candidates (all clipped at 0):

``prophet``    Prophet with daily and weekly seasonality on the cleaned series (whole days of exact
               zeros in an otherwise busy series are outages, treated as missing), changepoints
               allowed up to the last 5 % of the history so it can follow a recent level shift.
``level``      the recent level (median of the last 3 hours), flat.
``revert``     the recent level decaying towards the median of the last week (half-life 4 days):
               a spike or dip right before the forecast is rarely the week's level.
``profile``    (inside ``median`` only) the hour-of-day medians of the last 7 days.
``median``     the hourly median of Prophet, level, revert, profile and seasonal naive -- **the
               forecast**. Without Prophet (not installed, or the fit failed) the median of the
               other four.
``blend``      the mean of Prophet and level; ``ensemble`` the median of Prophet, level and
               seasonal naive (scored for the record, not used).
``seasonal_naive``  the value one week earlier (one day earlier with under two weeks of history):
               the fallback for a series with under 48 usable hours, and the baseline every fit is
               scored against (``extra.baseline_smape`` of each forecast row).

Every candidate is scored by sMAPE on rolling-origin validation folds (refitted at earlier
cut-offs inside the history, scored on the hours that followed, folds as long as the horizon
asked for up to a week; nothing after the forecast instant is seen). The scores go with each
forecast (``extra.scores``), and all candidates' validation errors give the 80 % interval around
it (model uncertainty included; widening like a random walk past the folds).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_cost.forecast import prophet_util

if TYPE_CHECKING:
    import numpy as np

    from gpu_cost.audit.store import AuditStore

logger = logging.getLogger(__name__)

HOUR = 3600.0
DAY_H = 24
WEEK_H = 168
CANDIDATES = ("prophet", "level", "revert", "blend", "ensemble", "median", "seasonal_naive")
LEVEL_HOURS = 3          # the recent level: median of this many last hours
REVERT_HALF_LIFE_H = 96  # the recent level's pull fades to half in 4 days ...
REVERT_WINDOW_H = WEEK_H  # ... towards the median of the last week
PROFILE_DAYS = 7         # the robust daily profile: hour-of-day medians of the last 7 days
MIN_HISTORY_H = 48       # usable hours the median needs; shorter series get the seasonal naive
ORIGINS = 2              # validation cut-offs ...
ORIGIN_STEP_H = 48       # ... this far apart
MIN_TRAIN_H = WEEK_H     # history a validation fit needs at least


@dataclass
class Forecast:
    """A demand forecast for one series.

    :param ts: horizon instants (epoch seconds, hourly); :param yhat: expected GPUs.
    :param lower: / :param upper: the 80 % interval. :param model: the candidate used (``median``, or
    ``seasonal_naive`` for a short series).
    :param scores: validation sMAPE per candidate (lower is better).
    """

    ts: Any
    yhat: Any
    lower: Any
    upper: Any
    model: str
    scores: dict[str, float] = field(default_factory=dict)

    @property
    def baseline_smape(self) -> float | None:
        return self.scores.get("seasonal_naive")


def clean(v: np.ndarray) -> np.ndarray:
    """Return ``v`` with outage days (24 aligned hours of exact zeros in a busy series) as NaN."""
    import numpy as np

    v = np.asarray(v, dtype=float).copy()
    if not np.nanmax(v, initial=0) > 0:
        return v
    off = len(v) % 24
    for s in range(off, len(v) - 23, 24):
        day = v[s:s + 24]
        if np.all(day == 0):
            v[s:s + 24] = np.nan
    return v


def _level(v: np.ndarray, n: int = LEVEL_HOURS) -> float:
    import numpy as np

    ok = v[~np.isnan(v)]
    return float(np.median(ok[-n:])) if len(ok) else 0.0


def _seasonal_naive(v: np.ndarray, horizon: int) -> np.ndarray:
    import numpy as np

    season = WEEK_H if len(v) >= 2 * WEEK_H else 24
    season = min(season, len(v)) or 1
    base = np.nan_to_num(v[-season:], nan=_level(v))
    return base[np.arange(horizon) % season]


def _revert(vc: np.ndarray, horizon: int) -> np.ndarray:
    """The recent level decaying (half-life :data:`REVERT_HALF_LIFE_H`) towards the last week's median."""
    import numpy as np

    level = _level(vc)
    week = vc[-REVERT_WINDOW_H:]
    target = float(np.nanmedian(week)) if np.any(~np.isnan(week)) else level
    w = 0.5 ** (np.arange(1, horizon + 1) / REVERT_HALF_LIFE_H)
    return target + (level - target) * w


def _profile(ts: np.ndarray, vc: np.ndarray, horizon: int) -> np.ndarray:
    """The hour-of-day (UTC) medians of the last :data:`PROFILE_DAYS` days, repeated over the horizon."""
    import numpy as np

    n = PROFILE_DAYS * DAY_H
    seg, hours = vc[-n:], (ts[-n:] // HOUR).astype(int) % DAY_H
    fallback = float(np.nanmedian(seg)) if np.any(~np.isnan(seg)) else 0.0
    prof = np.full(DAY_H, fallback)
    for h in range(DAY_H):
        x = seg[(hours == h) & ~np.isnan(seg)]
        if len(x):
            prof[h] = float(np.median(x))
    fut = (int(ts[-1] // HOUR) + 1 + np.arange(horizon)) % DAY_H
    return prof[fut]


def _prophet(ts: np.ndarray, v: np.ndarray, horizon: int, stats: prophet_util.FitStats) -> np.ndarray | None:
    import numpy as np
    import pandas as pd

    ok = ~np.isnan(v)
    if ok.sum() < 48:
        return None
    df = pd.DataFrame({"ds": pd.to_datetime(ts[ok], unit="s"), "y": v[ok]})
    m = prophet_util.fit(df, stats, daily_seasonality=True, weekly_seasonality=len(v) >= 2 * WEEK_H,
                         yearly_seasonality=False, changepoint_range=0.95, changepoint_prior_scale=0.05,
                         uncertainty_samples=0)
    if m is None:
        return None
    fut = ts[-1] + HOUR * np.arange(1, horizon + 1)
    return np.asarray(m.predict(pd.DataFrame({"ds": pd.to_datetime(fut, unit="s")}))["yhat"].to_numpy())


def candidates(ts: np.ndarray, v: np.ndarray, horizon: int, stats: prophet_util.FitStats,
               use_prophet: bool = True) -> dict[str, np.ndarray]:
    """Return each candidate's forecast of the ``horizon`` hours after ``ts[-1]`` (clipped at 0)."""
    import numpy as np

    vc = clean(v)
    out = {"seasonal_naive": _seasonal_naive(v, horizon), "level": np.full(horizon, _level(vc)),
           "revert": _revert(vc, horizon)}
    members = [out["level"], out["revert"], _profile(ts, vc, horizon), out["seasonal_naive"]]
    p = _prophet(ts, vc, horizon, stats) if use_prophet else None
    if p is not None:
        p = np.clip(p, 0.0, None)
        out["prophet"] = p
        out["blend"] = 0.5 * p + 0.5 * out["level"]
        out["ensemble"] = np.median(np.vstack([p, out["level"], out["seasonal_naive"]]), axis=0)
        members.append(p)
    out["median"] = np.median(np.vstack(members), axis=0)
    return {k: np.clip(x, 0.0, None) for k, x in out.items()}


def _smape(y: np.ndarray, p: np.ndarray) -> float:
    import numpy as np

    ok = ~np.isnan(y)
    y, p = y[ok], p[ok]
    if not len(y):
        return float("nan")
    den = np.abs(y) + np.abs(p)
    with np.errstate(all="ignore"):
        return float(np.mean(np.where(den == 0, 0.0, 200.0 * np.abs(y - p) / np.where(den == 0, 1.0, den))))


def validation_cutoffs(n: int, horizon: int, origins: int = ORIGINS, step: int = ORIGIN_STEP_H,
                       min_train: int = MIN_TRAIN_H) -> tuple[int, list[int]]:
    """Return ``(fold_hours, cut-offs)`` for rolling-origin validation of an ``n``-hour history.

    Folds are as long as the forecast asked for, between 48 h and a week; the latest cut-off
    leaves one whole fold before the end, earlier ones step back ``step`` hours each, and every
    fold keeps ``min_train`` hours of history. A history too short for that gets 48-hour folds
    on at least 72 hours, or none.
    """
    vh = max(48, min(horizon, WEEK_H))
    cuts = [c for c in (n - vh - o * step for o in range(origins)) if c >= min_train]
    if not cuts and vh > 48:
        vh = 48
        cuts = [c for c in (n - vh - o * vh for o in range(origins)) if c >= 72]
    return vh, cuts


def forecast(ts: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray, horizon: int, *,
             stats: prophet_util.FitStats | None = None, use_prophet: bool = True,
             origins: int = ORIGINS) -> Forecast:
    """Forecast the ``horizon`` hours after the last point of an hourly series.

    The forecast is the ``median`` candidate (``seasonal_naive`` for a series with under
    :data:`MIN_HISTORY_H` usable hours). Every candidate is also scored on ``origins``
    rolling-origin validation folds (:func:`validation_cutoffs`): the scores go with the forecast
    (``seasonal_naive``'s is the baseline) and their errors give the interval.
    """
    import numpy as np

    stats = stats or prophet_util.FitStats()
    ts = np.asarray(ts, dtype=float)
    v = np.asarray(values, dtype=float)
    fut = ts[-1] + HOUR * np.arange(1, horizon + 1) if len(ts) else np.zeros(0)
    if len(v) == 0:
        z = np.zeros(horizon)
        return Forecast(fut, z, z, z, "empty")
    final = candidates(ts, v, horizon, stats, use_prophet)
    chosen = "median" if np.sum(~np.isnan(clean(v))) >= MIN_HISTORY_H else "seasonal_naive"
    vh, cuts = validation_cutoffs(len(v), horizon, origins)
    folds = [(v[cut:cut + vh], candidates(ts[:cut], v[:cut], vh, stats, use_prophet)) for cut in cuts]
    scores: dict[str, float] = {}
    for k in final:
        s = [_smape(t, c[k]) for t, c in folds if k in c]
        if s and not all(math.isnan(x) for x in s):
            scores[k] = round(float(np.nanmean(s)), 2)
    errs = np.concatenate([t - x for t, c in folds for x in c.values()]) if folds else np.zeros(0)
    lower, upper = _interval(final[chosen], errs, vh, v)
    return Forecast(fut, final[chosen], lower, upper, chosen, scores)


def _interval(yhat: np.ndarray, errs: np.ndarray, fold_h: int, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return an 80 % band: the 10th / 90th percentiles of the validation errors, else of the spread.

    ``errs`` pools every candidate's errors on every fold (truth minus forecast, leads 1 to
    ``fold_h``): one model's errors on a couple of folds understate how far a week can move,
    the candidates' disagreement adds the model uncertainty. Past ``fold_h`` the band widens
    like a random walk. It always holds the forecast.
    """
    import numpy as np

    n = len(yhat)
    e = errs[~np.isnan(errs)]
    if len(e) >= 20:
        lo, hi = min(float(np.quantile(e, 0.1)), 0.0), max(float(np.quantile(e, 0.9)), 0.0)
        grow = np.sqrt(np.maximum(np.arange(1, n + 1) / max(fold_h, 1), 1.0))
    else:
        ok = v[~np.isnan(v)]
        sd = float(np.std(np.diff(ok))) * 3 if len(ok) > 2 else 0.0
        lo, hi = -sd, sd
        grow = np.clip(np.sqrt(np.arange(1, n + 1) / 24.0), 0.5, 3.0)
    return np.clip(yhat + lo * grow, 0, None), np.clip(yhat + hi * grow, 0, None)


# -- stored forecasts --------------------------------------------------------------------------
def forecast_rows(key: str, fc: Forecast, created_at: float) -> list[dict[str, Any]]:
    """Return ``gpu_cost_forecasts`` rows (series ``demand:<key>``, one per horizon hour)."""
    extra = json.dumps({"scores": fc.scores, "baseline_smape": fc.baseline_smape})
    return [
        {"series": f"demand:{key}", "horizon_ts": float(t), "kind": "demand", "yhat": round(float(y), 3),
         "yhat_lower": round(float(lo), 3), "yhat_upper": round(float(hi), 3), "model": fc.model,
         "created_at": created_at, "extra": extra}
        for t, y, lo, hi in zip(fc.ts, fc.yhat, fc.lower, fc.upper, strict=False)
    ]


def expected_demand(store: AuditStore, now: float, horizon_s: float, key_prefix: str | None = None) -> float | None:
    """Return the most GPUs expected at any hour of ``[now, now + horizon_s]``; None without forecasts.

    ``key_prefix`` selects series by key (``partition:batch``, ``account:``...; series within one
    dimension are summed per hour). Without it the cluster total (``cluster:all``) is used, or the
    sum of the partition series when there is no total. The hour containing ``now`` counts.
    """
    rows = store.fetch("forecasts_of", {"pattern": "demand:%", "since": now - HOUR})
    rows = [r for r in rows if r.get("kind") == "demand" and r["horizon_ts"] <= now + horizon_s
            and r["horizon_ts"] > now - HOUR and r.get("yhat") is not None]
    if not rows:
        return None

    def pick(pred: Any) -> list[Mapping[str, Any]]:
        return [r for r in rows if pred(r["series"][len("demand:"):])]

    if key_prefix is not None:
        chosen = pick(lambda k: k.startswith(key_prefix))
    else:
        chosen = pick(lambda k: k == "cluster:all") or pick(lambda k: k.startswith("partition:"))
    if not chosen:
        return None
    per_hour: dict[float, float] = {}
    for r in chosen:
        per_hour[r["horizon_ts"]] = per_hour.get(r["horizon_ts"], 0.0) + float(r["yhat"])
    return round(max(per_hour.values()), 3)
