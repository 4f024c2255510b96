"""A demand forecast's upper bound, calibrated on the forecast's own recent errors by hour of the day.

The nightly's 80 % band comes from validation folds and widens with the lead: it is honest about
how far a day-ahead forecast can be off, and on a team whose days repeat it is far wider than the
error the forecast actually makes at a given hour. A power decision needs the other view: how
much more than forecast did demand turn out to be, at this hour of the day, lately? That is the
forecast's realised error (demand minus the forecast that was in force for that hour), and its
``q``-quantile over the last ``days`` days, at the same hour of the day give or take
``spread_h``, is the room to keep above the forecast (split conformal prediction, one set of
errors per hour of the day). A forecast biased at some hours (high at night, low in the
morning) is corrected where it errs; a series without a daily shape gets about the same room at
every hour. Until ``min_errors`` errors exist for an hour, the forecast's own band stands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

HOUR = 3600.0
DAY_H = 24
#: the errors of the last week make the calibration (seven of each hour of the day, times the spread)
DAYS = 7.0
#: errors within this many hours of the hour of the day count (the day's shape drifts by an hour)
SPREAD_H = 1
#: fewer errors than this for an hour of the day: the forecast's own band is the bound
MIN_ERRORS = 12


def hour_of_day(ts: np.ndarray) -> np.ndarray:
    import numpy as np

    return (np.floor(np.asarray(ts, dtype=float) / HOUR) % DAY_H).astype(int)


def error_quantiles(past_ts: np.ndarray, past_err: np.ndarray, *, q: float, now: float, days: float = DAYS,
                    spread_h: int = SPREAD_H, min_errors: int = MIN_ERRORS) -> np.ndarray:
    """Return the ``q``-quantile of the forecast's errors for each hour of the day (24 values, UTC;
    NaN where fewer than ``min_errors`` errors fall within ``spread_h`` hours of it).

    :param past_ts: / :param past_err: hours and the forecast's error there (demand minus the
        forecast in force for that hour; NaN where none was); only those in the ``days`` days
        before ``now`` count.
    :param q: the quantile kept room for (0.9: the upper end of an 80 % interval).
    """
    import numpy as np

    if not 0.0 <= q <= 1.0:
        raise ValueError(f"error_quantiles: q must be within 0..1, not {q!r}")
    ts = np.asarray(past_ts, dtype=float)
    err = np.asarray(past_err, dtype=float)
    keep = (ts >= now - days * 86400.0) & (ts < now) & ~np.isnan(err)
    err, hod = err[keep], hour_of_day(ts[keep])
    out = np.full(DAY_H, np.nan)
    if len(err) < min_errors:
        return out
    buckets = [err[hod == h] for h in range(DAY_H)]
    for h in range(DAY_H):
        near = np.sort(np.concatenate([buckets[(h + d) % DAY_H] for d in range(-spread_h, spread_h + 1)]))
        if len(near) >= min_errors:
            pos = q * (len(near) - 1)  # linear interpolation between order statistics, as numpy's default
            lo = int(pos)
            hi = min(lo + 1, len(near) - 1)
            out[h] = float(near[lo] + (near[hi] - near[lo]) * (pos - lo))
    return out


def calibrated_upper(hours: np.ndarray, yhat: np.ndarray, band_upper: np.ndarray, quantiles: np.ndarray) -> np.ndarray:
    """Return, per forecast hour, the forecast plus its error quantile at that hour of the day
    (:func:`error_quantiles`), never below 0; the forecast's own band where none is known.

    Example: a forecast of 40 GPUs at 09:00 that fell about 12 short around 09:00 on most days of
    the last week gets about 52; one of 60 at 03:00 where demand kept 50 under it gets about 10.
    """
    import numpy as np

    q = np.asarray(quantiles, dtype=float)[hour_of_day(hours)]
    cal = np.maximum(np.asarray(yhat, dtype=float) + q, 0.0)
    return np.where(np.isnan(q), np.asarray(band_upper, dtype=float), cal)
