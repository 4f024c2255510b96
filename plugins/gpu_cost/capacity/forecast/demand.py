"""Demand model: hourly GPUs wanted (running + pending) per account / partition, 48 h and more ahead.

Team demand on a GPU cluster is mostly a *level* that shifts when projects start and stop, with a
daily / weekly shape that is strong on some clusters and weak or unsteady on others. No single
method wins: Prophet follows the shape but over-reacts to the last shift, the recent level is right
until it moves, last week is often a different regime. So the forecast is the hour-by-hour
**median of seven votes**: the recent level (twice), yesterday repeated, the level reverting to the
week's median, and three with a shape (Prophet, last week, the last week's median day). The recent
values hold three of the seven votes, so after a level shift the median follows the new level at
once instead of averaging it with the old regime's seasonality; on a steady seasonal series they
agree with the shaped votes anyway. The median is also the right centre for WAPE (an absolute
error) and for sMAPE, which both reward not chasing outliers.

**Fallback.** A fixed combination is right for most series, not all: an intermittent team (zeros
for days) is best forecast as zero, and right after a shift yesterday or the last hours can beat
any combination. Every candidate is scored on rolling-origin validation folds (refitted at earlier
cut-offs inside the history, scored on the hours that followed, folds as long as the horizon asked
for, between 48 h and a week; nothing after the forecast instant is seen) by WAPE -- GPUs off over
GPUs demanded, the capacity-relevant error -- with each fold weighted by how recent it is (half
per :data:`RECENT_HALF_LIFE_H`). When a simple forecast (:data:`SIMPLE`: zero, only for a team idle
over the last day; the recent level; yesterday repeated) scores at least :data:`FALLBACK_MARGIN`
times better than the median, it is the forecast instead (``model`` = ``<name> (fallback)``, the
reason in ``fallback``). The margin is there because the best of three scores on two folds is
flattered by luck: without it, on the Helios VC traces, fallbacks cost more than they saved in
held-out weeks before the last one.

The candidates (all clipped at 0):

``prophet``    Prophet with daily and weekly seasonality on the cleaned series (short runs of whole
               zero days followed by demand are outages, treated as missing; see :func:`clean`),
               changepoints allowed up to the last 5 % of the history so it can follow a shift.
``level``      the recent level (median of the last 3 hours), flat.
``revert``     the recent level decaying towards the median of the last week (half-life 4 days):
               a spike or dip right before the forecast is rarely the week's level.
``daily_repeat``  the last 24 hours repeated.
``zero``       no demand.
``median``     the hourly median of level (twice), daily repeat, revert, the last 7 days'
               hour-of-day medians, seasonal naive and Prophet -- **the forecast** unless it fell
               back. Without Prophet (not installed, or the fit failed) the median of the others.
``blend``      the mean of Prophet and level; ``ensemble`` the median of Prophet, level and
               seasonal naive (scored for the record, not used).
``seasonal_naive``  the value one week earlier (one day earlier with under two weeks of history):
               the forecast for a series with under 48 usable hours, and the baseline every fit is
               scored against (``extra.baseline_smape`` of each forecast row).

The sMAPE and WAPE of every candidate go with each forecast (``extra.scores``, ``extra.wape``),
with the candidate chosen and why a fallback was taken (``extra.chosen``, ``extra.fallback``).
The validation errors of the chosen forecast and of the candidates that did about as well on the
folds give the 80 % interval around it (their disagreement is the model's doubt; widening like a
random walk past the folds). Capacity decisions read its upper bound, so a candidate far worse
than the chosen one does not widen it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_cost.capacity.forecast import prophet_util

if TYPE_CHECKING:
    import numpy as np

    from gpu_cost.audit.store import AuditStore

logger = logging.getLogger(__name__)

HOUR = 3600.0
DAY_H = 24
WEEK_H = 168
CANDIDATES = ("prophet", "level", "revert", "blend", "ensemble", "median", "seasonal_naive", "daily_repeat", "zero")
MODEL = "median"         # the forecast, unless a simple one clearly beat it on the validation folds
SIMPLE = ("zero", "level", "daily_repeat")  # the fallbacks, preferred in this order on a tie
FALLBACK_MARGIN = 1.25   # a fallback's weighted validation error times this must not exceed the model's
# the candidates whose fold errors make the interval (zero's errors are the demand itself: no model's doubt)
INTERVAL_PEER_RATIO = 1.5  # ... those whose fold error is at most this times the chosen forecast's
INTERVAL_POOL = ("prophet", "level", "revert", "blend", "ensemble", "median", "seasonal_naive", "daily_repeat")
LEVEL_HOURS = 3          # the recent level: median of this many last hours
REVERT_HALF_LIFE_H = 96  # the recent level's pull fades to half in 4 days ...
REVERT_WINDOW_H = WEEK_H  # ... towards the median of the last week
PROFILE_DAYS = 7         # the robust daily profile: hour-of-day medians of the last 7 days
MIN_HISTORY_H = 48       # usable hours the median needs; shorter series get the seasonal naive
ORIGINS = 2              # validation cut-offs ...
ORIGIN_STEP_H = 48       # ... this far apart
MIN_TRAIN_H = WEEK_H     # history a validation fit needs at least
RECENT_HALF_LIFE_H = 48  # a validation fold's weight in the fallback choice halves every 2 days back
OUTAGE_MAX_DAYS = 2      # whole zero days in a row that can be an outage; longer runs are no demand


@dataclass
class Forecast:
    """A demand forecast for one series.

    :param ts: horizon instants (epoch seconds, hourly); :param yhat: expected GPUs.
    :param lower: / :param upper: the 80 % interval. :param model: the candidate used (``median``;
        ``<simple> (fallback)`` when a simple forecast beat it on the validation folds;
        ``seasonal_naive`` for a short series).
    :param scores: validation sMAPE per candidate (lower is better).
    :param wape: recency-weighted validation WAPE per candidate (a fraction; None where the
        validation hours saw no demand), what the fallback choice is made on.
    :param fallback: why a simple forecast replaced the model, or None.
    """

    ts: Any
    yhat: Any
    lower: Any
    upper: Any
    model: str
    scores: dict[str, float] = field(default_factory=dict)
    wape: dict[str, float | None] = field(default_factory=dict)
    fallback: str | None = None

    @property
    def baseline_smape(self) -> float | None:
        return self.scores.get("seasonal_naive")

    @property
    def candidate(self) -> str:
        """Return the candidate's name without the ``(fallback)`` mark (a key of :attr:`scores`)."""
        return self.model.removesuffix(" (fallback)")


def clean(v: np.ndarray) -> np.ndarray:
    """Return ``v`` with outage days (short runs of whole zero days inside a busy series) as NaN.

    A run of up to :data:`OUTAGE_MAX_DAYS` aligned days of exact zeros with demand after it is an
    outage: the team still wanted GPUs, the cluster (or its accounting) was down. A longer run, or
    one still going at the end of the history, is the team wanting nothing, and stays zero: hiding
    it would make an idle team's forecast repeat the level it had before it went quiet.
    """
    import numpy as np

    v = np.asarray(v, dtype=float).copy()
    if not np.nanmax(v, initial=0) > 0:
        return v
    off = len(v) % 24
    zero_days = [s for s in range(off, len(v) - 23, 24) if np.all(v[s:s + 24] == 0)]
    runs: list[list[int]] = []
    for s in zero_days:
        if runs and runs[-1][-1] + 24 == s:
            runs[-1].append(s)
        else:
            runs.append([s])
    for run in runs:
        end = run[-1] + 24
        if len(run) <= OUTAGE_MAX_DAYS and end < len(v) and np.nanmax(v[end:], initial=0) > 0:
            v[run[0]:end] = np.nan
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


def _daily_repeat(v: np.ndarray, horizon: int) -> np.ndarray:
    """The last 24 hours repeated (gaps filled with the recent level): "tomorrow is like today"."""
    import numpy as np

    day = np.nan_to_num(v[-DAY_H:], nan=_level(v)) if len(v) else np.zeros(1)
    return day[np.arange(horizon) % len(day)]


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
    return np.asarray(prophet_util.predict(m, pd.DataFrame({"ds": pd.to_datetime(fut, unit="s")}))["yhat"].to_numpy())


def candidates(ts: np.ndarray, v: np.ndarray, horizon: int, stats: prophet_util.FitStats,
               use_prophet: bool = True) -> dict[str, np.ndarray]:
    """Return each candidate's forecast of the ``horizon`` hours after ``ts[-1]`` (clipped at 0)."""
    import numpy as np

    vc = clean(v)
    out = {"seasonal_naive": _seasonal_naive(v, horizon), "level": np.full(horizon, _level(vc)),
           "revert": _revert(vc, horizon), "daily_repeat": _daily_repeat(v, horizon), "zero": np.zeros(horizon)}
    # the recent level votes twice and yesterday once, so a level shift moves the median at once rather
    # than after the members that remember the old level (revert, profile, last week, Prophet) catch up
    members = [out["level"], out["level"], out["revert"], _profile(ts, vc, horizon), out["seasonal_naive"],
               out["daily_repeat"]]
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

    The forecast is the ``median`` candidate, unless one of the :data:`SIMPLE` forecasts had a
    lower recency-weighted WAPE on the ``origins`` rolling-origin validation folds
    (:func:`validation_cutoffs`, :func:`fold_wape`): then that one, marked ``(fallback)``, with
    the reason in :attr:`Forecast.fallback`. A series with under :data:`MIN_HISTORY_H` usable
    hours gets the ``seasonal_naive`` unscored. Every candidate's sMAPE goes with the forecast
    (``seasonal_naive``'s is the baseline), and the fold errors give the interval.
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
    vh, cuts = validation_cutoffs(len(v), horizon, origins)
    folds = [(cut, v[cut:cut + vh], candidates(ts[:cut], v[:cut], vh, stats, use_prophet)) for cut in cuts]
    scores: dict[str, float] = {}
    for k in final:
        s = [_smape(t, c[k]) for _, t, c in folds if k in c]
        if s and not all(math.isnan(x) for x in s):
            scores[k] = round(float(np.nanmean(s)), 2)
    err, den = fold_wape(folds, len(v))
    wape = {k: (round(e / den, 4) if den > 0 else None) for k, e in err.items()}
    chosen, reason = MODEL, None
    if np.sum(~np.isnan(clean(v))) < MIN_HISTORY_H:
        chosen = "seasonal_naive"
    elif MODEL in err:
        # zero only for a team idle now: the folds' hours can all lie before its demand returned
        idle = float(np.nanmedian(v[-DAY_H:])) == 0 if np.any(~np.isnan(v[-DAY_H:])) else False
        best = min((k for k in SIMPLE if k != "zero" or idle), key=lambda k: err.get(k, math.inf))
        if err[MODEL] > 0 and err[best] * FALLBACK_MARGIN <= err[MODEL]:
            chosen, reason = best, _fallback_reason(best, err, den)
            logger.debug("demand forecast falls back to %s: %s", best, reason)
    pool = interval_peers(chosen, err, den)
    errs = np.concatenate([t - x for _, t, c in folds for k, x in c.items() if k in pool]) if folds else np.zeros(0)
    lower, upper = _interval(final[chosen], errs, vh, v)
    model = f"{chosen} (fallback)" if reason else chosen
    return Forecast(fut, final[chosen], lower, upper, model, scores, wape, reason)


def interval_peers(chosen: str, err: Mapping[str, float], den: float) -> set[str]:
    """Return the candidates whose fold errors make the interval around ``chosen``'s forecast.

    The chosen forecast and the candidates that did about as well on the folds (weighted error at
    most :data:`INTERVAL_PEER_RATIO` times the chosen one's, plus 1 % of the demand): their
    disagreement is the model's doubt. A candidate far worse than the chosen one is not a doubt
    about it: on a team whose days repeat exactly, the recent level misses every morning, and
    pooling its errors would keep a band of the whole day's swing around a forecast that was
    right on every fold (capacity kept up "just in case" for nothing).
    """
    if chosen not in err:
        return set(INTERVAL_POOL) | {chosen}
    bar = INTERVAL_PEER_RATIO * err[chosen] + 0.01 * den
    return {k for k in INTERVAL_POOL if k in err and err[k] <= bar} | {chosen}


def fold_wape(folds: Sequence[tuple[int, np.ndarray, Mapping[str, np.ndarray]]], n: int,
              half_life: float = RECENT_HALF_LIFE_H) -> tuple[dict[str, float], float]:
    """Return each candidate's recency-weighted absolute error on the folds, and the weighted demand.

    ``folds`` are ``(cut-off, truth, candidates)``; a fold that ended ``a`` hours before the end of
    the ``n``-hour history weighs ``0.5 ** (a / half_life)`` (the latest 1, one a step earlier
    half), so the regime of the last days outweighs the weeks before it. Whole folds are weighted,
    not hours: weighting a fold's late hours up would favour whatever fits the newest level at the
    longest leads, which is no forecast's skill. Error over demand is the weighted WAPE; the
    ranking is the same without dividing, which also ranks folds that saw no demand at all.
    """
    import numpy as np

    err: dict[str, float] = {}
    den = 0.0
    for cut, truth, cands in folds:
        w = 0.5 ** ((n - cut - len(truth)) / half_life)
        ok = ~np.isnan(truth)
        den += w * float(np.sum(np.abs(truth[ok])))
        for k, x in cands.items():
            err[k] = err.get(k, 0.0) + w * float(np.sum(np.abs(truth[ok] - x[:len(truth)][ok])))
    return err, den


def _fallback_reason(best: str, err: Mapping[str, float], den: float) -> str:
    """Say why ``best`` replaced the model, in the units the choice was made in."""
    if den > 0:
        return f"{best}: the model's validation WAPE {err[MODEL] / den:.2f} did not beat it ({err[best] / den:.2f})"
    return (f"{best}: no demand in the validation hours; the model's weighted error {err[MODEL]:.1f} GPU-h "
            f"did not beat it ({err[best]:.1f})")


def _interval(yhat: np.ndarray, errs: np.ndarray, fold_h: int, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return an 80 % band: the 10th / 90th percentiles of the validation errors, else of the spread.

    ``errs`` pools the errors of the chosen forecast and its peers (:func:`interval_peers`) on
    every fold (truth minus forecast, leads 1 to ``fold_h``): one model's errors on a couple of
    folds understate how far a week can move, the peers' disagreement adds the model uncertainty. Past ``fold_h`` the band widens
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
    extra = json.dumps({"scores": fc.scores, "baseline_smape": fc.baseline_smape, "wape": fc.wape,
                        "chosen": fc.candidate, "fallback": fc.fallback})
    return [
        {"series": f"demand:{key}", "horizon_ts": float(t), "kind": "demand", "yhat": round(float(y), 3),
         "yhat_lower": round(float(lo), 3), "yhat_upper": round(float(hi), 3), "model": fc.model,
         "created_at": created_at, "extra": extra}
        for t, y, lo, hi in zip(fc.ts, fc.yhat, fc.lower, fc.upper, strict=False)
    ]


def demand_rows(store: AuditStore, now: float, horizon_s: float) -> dict[str, dict[float, tuple[float, float]]]:
    """Return series key → hour → (forecast, 80 % upper bound) for the hours of ``[now, now + horizon_s]``.

    The newest forecast rows per series and hour are read; a row without a band gives its forecast
    as the upper bound. The hour containing ``now`` counts.
    """
    rows = store.fetch("forecasts_of", {"pattern": "demand:%", "since": now - HOUR})
    out: dict[str, dict[float, tuple[float, float]]] = {}
    for r in rows:
        if r.get("kind") != "demand" or r.get("yhat") is None:
            continue
        if not (now - HOUR < r["horizon_ts"] <= now + horizon_s):
            continue
        y = float(r["yhat"])
        hi = float(r["yhat_upper"]) if r.get("yhat_upper") is not None else y
        out.setdefault(r["series"][len("demand:"):], {})[float(r["horizon_ts"])] = (y, hi)
    return out


def forecast_errors(store: AuditStore, key: str, now: float, days: float) -> tuple[np.ndarray, np.ndarray]:
    """Return (hours, demand minus the forecast in force) of series ``key`` over the ``days`` before ``now``.

    The demand is the newest series the nightly stored (``history:<key>``), the forecast each
    hour's stored row (the newest run covering it, so the one in force then). Hours missing either
    are left out; nothing stored gives empty arrays.
    """
    import numpy as np

    since = now - days * 86400.0
    hist = store.fetch("newest_history", {"series": f"history:{key}", "until": now})
    rows = store.fetch("forecast_hours_between", {"pattern": f"demand:{key}", "since": since, "until": now})
    if not hist or not rows:
        return np.zeros(0), np.zeros(0)
    p = json.loads(hist[0]["extra"])
    values = np.asarray(p["values"], dtype=float)
    t0, step = float(p["t0"]), float(p["step"])
    ts, err = [], []
    for r in rows:
        if r["series"] != f"demand:{key}" or r.get("yhat") is None:
            continue
        i = round((float(r["horizon_ts"]) - t0) / step)
        if 0 <= i < len(values) and not math.isnan(values[i]):
            ts.append(float(r["horizon_ts"]))
            err.append(float(values[i]) - float(r["yhat"]))
    return np.asarray(ts), np.asarray(err)


def expected_demand(store: AuditStore, now: float, horizon_s: float, key_prefix: str | None = None, *,
                    bound: str = "yhat", quantile: float | None = None) -> float | None:
    """Return the most GPUs expected at any hour of ``[now, now + horizon_s]``; None without forecasts.

    ``key_prefix`` selects series by key (``partition:batch``, ``account:``...; series within one
    dimension are summed per hour). Without it the cluster total (``cluster:all``) is used, or the
    sum of the partition series when there is no total. The hour containing ``now`` counts.
    ``bound="upper"`` reads the 80 % band's upper bound instead of the forecast (what capacity
    decisions keep room for; a row without a band counts its forecast). With ``quantile`` the upper
    bound is calibrated on the forecast's own errors at the same hour of the day over the last
    week (:func:`gpu_cost.capacity.forecast.calibration.calibrated_upper`; the band where too few exist).
    """
    if bound not in ("yhat", "upper"):
        raise ValueError(f"expected_demand: bound must be 'yhat' or 'upper', not {bound!r}")
    series = demand_rows(store, now, horizon_s)
    if not series:
        return None

    def pick(pred: Any) -> list[tuple[str, dict[float, tuple[float, float]]]]:
        return [(k, v) for k, v in series.items() if pred(k)]

    if key_prefix is not None:
        chosen = pick(lambda k: k.startswith(key_prefix))
    else:
        chosen = pick(lambda k: k == "cluster:all") or pick(lambda k: k.startswith("partition:"))
    if not chosen:
        return None
    per_hour: dict[float, float] = {}
    for key, hours in chosen:
        uppers = {t: hi for t, (_, hi) in hours.items()}
        if bound == "upper" and quantile is not None and hours:
            import numpy as np

            from gpu_cost.capacity.forecast.calibration import DAYS, calibrated_upper, error_quantiles

            past_ts, past_err = forecast_errors(store, key, now, DAYS)
            ts = np.asarray(sorted(hours))
            cal = calibrated_upper(ts, np.asarray([hours[t][0] for t in ts]), np.asarray([hours[t][1] for t in ts]),
                                   error_quantiles(past_ts, past_err, q=quantile, now=now))
            uppers = dict(zip(ts.tolist(), cal.tolist(), strict=True))
        for t, (y, _) in hours.items():
            per_hour[t] = per_hour.get(t, 0.0) + (uppers[t] if bound == "upper" else y)
    return round(max(per_hour.values()), 3)
