"""The demand model: seasonal series, level shifts, stored forecasts and what the power DAG reads."""

from __future__ import annotations

import numpy as np

from gpu_cost.forecast import demand
from gpu_cost.forecast.backtest import seasonal_naive, smape

H = 3600.0
T0 = 1_767_225_600.0  # a Thursday 00:00 UTC


def _series(hours: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(hours)
    ts = T0 + H * t
    daily = 20 * np.clip(np.sin(2 * np.pi * (t % 24 - 6) / 24), 0, None)
    weekend = np.where(((t // 24) + 3) % 7 >= 5, -10.0, 0.0)
    return ts, np.clip(40 + daily + weekend + rng.normal(0, 2, hours), 0, None)


def test_forecast_beats_seasonal_naive_after_a_level_shift() -> None:
    ts, v = _series(24 * 28)
    v[-60:] += 30  # the team's demand stepped up two and a half days ago and stays up
    truth = _series(24 * 28 + 48)[1][-48:] + 30
    fc = demand.forecast(ts, v, 48)
    assert len(fc.ts) == 48 and fc.ts[0] == ts[-1] + H
    assert (fc.lower <= fc.yhat + 1e-9).all() and (fc.yhat <= fc.upper + 1e-9).all()
    assert smape(truth, fc.yhat) < smape(truth, seasonal_naive(v, 48))
    assert "seasonal_naive" in fc.scores and fc.baseline_smape == fc.scores["seasonal_naive"]


def test_outage_days_are_missing_not_zero_demand() -> None:
    _, v = _series(24 * 10)
    v[48:72] = 0.0
    c = demand.clean(v)
    assert np.isnan(c[48:72]).all() and not np.isnan(c[:48]).any()
    quiet = np.zeros(24 * 3)
    assert not np.isnan(demand.clean(quiet)).any()  # an idle series stays idle


def test_without_prophet_the_fallback_still_forecasts() -> None:
    ts, v = _series(24 * 20)
    fc = demand.forecast(ts, v, 48, use_prophet=False)
    assert set(fc.model.split("+")) <= {"level", "seasonal_naive"}
    assert np.isfinite(fc.yhat).all() and (fc.yhat >= 0).all()


def test_stored_forecasts_upsert_and_expected_demand(store) -> None:  # type: ignore[no-untyped-def]
    now = T0 + 100 * H
    assert demand.expected_demand(store, now, 12 * H) is None
    ts = now + H * np.arange(1, 49)
    for key, level in (("cluster:all", 10.0), ("partition:gpu", 7.0), ("partition:cpu", 3.0), ("account:a", 6.0)):
        fc = demand.Forecast(ts, np.full(48, level) + np.arange(48) / 10, np.zeros(48), np.full(48, 99.0), "level")
        store.execute("upsert_forecast", demand.forecast_rows(key, fc, now))
        store.execute("upsert_forecast", demand.forecast_rows(key, fc, now))  # a re-run: still one row per key
    assert store.query("SELECT COUNT(*) AS n FROM gpu_cost_forecasts")[0]["n"] == 4 * 48
    # max over the next 12 hourly forecasts (now + 1 h ... now + 12 h) of the cluster total
    assert demand.expected_demand(store, now, 12 * H) == 11.1
    # a prefix sums the matching series hour by hour
    assert demand.expected_demand(store, now, 12 * H, key_prefix="partition:") == 10.0 + 2 * 1.1
    assert demand.expected_demand(store, now, 12 * H, key_prefix="account:nobody") is None
    assert demand.expected_demand(store, now + 60 * H, 12 * H) is None  # forecasts ran out
