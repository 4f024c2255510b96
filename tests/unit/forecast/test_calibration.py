"""The forecast's upper bound calibrated on its own errors per hour of the day, and read from the store."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpu_cost.capacity.forecast import demand, nightly
from gpu_cost.capacity.forecast.calibration import calibrated_upper, error_quantiles

H = 3600.0
T0 = 1795996800.0  # Monday 2026-11-30 00:00 UTC


def working_days(days: int) -> tuple[np.ndarray, np.ndarray]:
    ts = T0 + H * np.arange(days * 24)
    hour = (ts // H).astype(int) % 24
    return ts, np.where((hour >= 9) & (hour < 17), 100.0, 10.0)


def test_a_forecast_biased_by_hour_of_day_is_corrected_where_it_errs() -> None:
    ts, v = working_days(8)
    flat = np.full(len(ts), 55.0)  # a forecast that averages day and night
    now = ts[-1] + H
    qs = error_quantiles(ts, v - flat, q=0.9, now=now)
    # a night hour (and its neighbours) was 45 over-forecast every day; 09:00 had 08:00's -45 beside it
    assert qs[3] == pytest.approx(-45.0) and qs[13] == pytest.approx(45.0) and qs[9] == pytest.approx(45.0)
    hours = now + H * np.arange(24)  # Tuesday 00:00 ... 23:00
    upper = calibrated_upper(hours, np.full(24, 55.0), np.full(24, 120.0), qs)
    assert upper[3] == pytest.approx(10.0) and upper[13] == pytest.approx(100.0)
    assert upper.min() >= 0
    # only the last week counts, and too few errors leave the forecast's own band standing
    assert np.isnan(error_quantiles(ts, v - flat, q=0.9, now=now + 30 * 86400.0)).all()
    thin = error_quantiles(ts[-10:], (v - flat)[-10:], q=0.9, now=now)
    assert np.isnan(thin).all()
    assert calibrated_upper(hours[:2], np.full(2, 55.0), np.full(2, 120.0), thin).tolist() == [120.0, 120.0]
    with pytest.raises(ValueError, match=r"q must be within 0\.\.1"):
        error_quantiles(ts, v - flat, q=1.5, now=now)


def test_the_power_run_reads_the_calibrated_bound_from_the_nightlys_rows(store) -> None:  # type: ignore[no-untyped-def]
    ts, v = working_days(9)
    # eight nightly runs at 02:00, each storing its demand history and a flat 55 (band to 120) for 48 h
    for day in range(1, 9):
        run = T0 + day * 86400.0 + 2 * H
        known = ts < run
        nightly.store_series(store, pd.DataFrame({"ts": ts[known], "key": "cluster:all", "value": v[known]}), run)
        fut = run + H * np.arange(1, 49)
        fc = demand.Forecast(fut, np.full(48, 55.0), np.zeros(48), np.full(48, 120.0), "median")
        nightly._upsert(store, demand.forecast_rows("cluster:all", fc, run), run, None)
    now = T0 + 8 * 86400.0 + 3 * H  # Tuesday of the next week, 03:00, after the last nightly
    past_ts, err = demand.forecast_errors(store, "cluster:all", now, 7.0)
    assert len(past_ts) > 100 and set(np.round(err, 6)) == {45.0, -45.0}
    # the band keeps room for 120 GPUs; calibrated, the night needs 10 and the working morning 100
    assert demand.expected_demand(store, now, 2 * H, bound="upper") == 120.0
    assert demand.expected_demand(store, now, 2 * H, bound="upper", quantile=0.9) == pytest.approx(10.0)
    assert demand.expected_demand(store, now + 6 * H, 2 * H, bound="upper", quantile=0.9) == pytest.approx(100.0)
    # a series with no stored history has no errors to calibrate on: its band stands
    run = T0 + 8 * 86400.0 + 2 * H
    fc = demand.Forecast(run + H * np.arange(1, 49), np.full(48, 5.0), np.zeros(48), np.full(48, 30.0), "median")
    nightly._upsert(store, demand.forecast_rows("account:new", fc, run), run, None)
    assert demand.expected_demand(store, now, 2 * H, key_prefix="account:", bound="upper", quantile=0.9) == 30.0
