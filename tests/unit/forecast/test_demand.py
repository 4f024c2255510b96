"""The demand model: seasonal series, level shifts, stored forecasts and what the power DAG reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpu_cost.errors import TraceError
from gpu_cost.forecast import backtest, demand, history
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
    assert fc.model == "median"
    assert set(fc.scores) == set(demand.CANDIDATES)  # every candidate scored on the validation folds
    assert "seasonal_naive" in fc.scores and fc.baseline_smape == fc.scores["seasonal_naive"]


def test_validation_folds_stay_inside_the_history() -> None:
    # a week ahead on four weeks: week-long folds, each with at least a week of history before it
    vh, cuts = demand.validation_cutoffs(24 * 28, 168)
    assert vh == 168 and cuts == [24 * 28 - 168, 24 * 28 - 168 - 48]
    assert all(c + vh <= 24 * 28 and c >= 168 for c in cuts)
    # 48 h ahead: 48-hour folds; a short history falls back to 48-hour folds; a tiny one gets none
    assert demand.validation_cutoffs(24 * 28, 48) == (48, [24 * 28 - 48, 24 * 28 - 96])
    assert demand.validation_cutoffs(240, 168) == (48, [192, 144])
    assert demand.validation_cutoffs(100, 168) == (48, [])


def test_regime_changes_favour_the_median_over_last_week() -> None:
    """A team whose demand moves between levels every few days (as the Helios VCs do)."""
    rng = np.random.default_rng(3)
    hours = 24 * 35
    t = np.arange(hours)
    level = np.repeat(rng.choice([5.0, 20.0, 40.0, 60.0], size=hours // 72 + 1), 72)[:hours]
    v = np.clip(level + 4 * np.sin(2 * np.pi * t / 24) + rng.normal(0, 2, hours), 0, None)
    ts = T0 + H * t
    fc = demand.forecast(ts[:-168], v[:-168], 168)
    truth = v[-168:]
    assert fc.model == "median"
    assert smape(truth, fc.yhat) < smape(truth, seasonal_naive(v[:-168], 168))
    assert (fc.lower <= fc.yhat + 1e-9).all() and (fc.yhat <= fc.upper + 1e-9).all()
    assert (fc.upper[-1] - fc.lower[-1]) >= (fc.upper[0] - fc.lower[0]) - 1e-9  # no narrower further out


def test_beats_seasonal_naive_on_the_week_before_the_helios_holdout(shared_data: Path) -> None:
    """The real VC demand without its last week (the contract's holdout): the week before it held out."""
    series = history.load_series(shared_data / "helios_vc_demand_hourly.csv")
    series = series[series.groupby("key").cumcount(ascending=False) >= 168]
    out = backtest.demand_backtest(series, 168)
    assert out["n_series"] == 8
    assert out["smape"] < 0.8 * out["seasonal_naive_smape"]
    assert out["smape"] < out["daily_repeat_smape"]
    assert {p["model"] for p in out["series"].values()} == {"median"}
    assert out["coverage_80"] > 0.5


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
    assert fc.model == "median" and "prophet" not in fc.scores  # the median of level, revert and profile
    assert np.isfinite(fc.yhat).all() and (fc.yhat >= 0).all()
    assert fc.baseline_smape is not None
    # under two days of history: the seasonal naive (yesterday's hours), no validation
    short = demand.forecast(ts[:30], v[:30], 48)
    assert short.model == "seasonal_naive" and short.scores == {}
    assert np.allclose(short.yhat, np.resize(v[6:30], 48))


def test_revert_moves_from_the_recent_level_to_the_weeks_median() -> None:
    v = np.full(24 * 14, 40.0)
    v[-3:] = 100.0  # a spike in the last hours
    r = demand._revert(demand.clean(v), 24 * 16)
    assert r[0] > 95 and abs(r[demand.REVERT_HALF_LIFE_H - 1] - 70.0) < 0.5 and r[-1] < 45


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


def test_hindsight_flat_is_the_best_constant() -> None:
    rng = np.random.default_rng(3)
    y = np.concatenate([rng.uniform(30, 60, 100), np.zeros(20), rng.uniform(0, 5, 48)])
    best = backtest.hindsight_flat_smape(y)
    brute = min(smape(y, np.full(len(y), c)) for c in np.linspace(0, 80, 8001))
    assert best <= brute + 1e-6  # no constant on a fine grid does better ...
    assert best >= brute - 0.5  # ... and it is a real constant's score, not an underestimate
    assert best < smape(y, np.full(len(y), np.median(y)))
    assert backtest.hindsight_flat_smape(np.full(24, 7.0)) == 0.0
    assert backtest.hindsight_flat_smape(np.array([np.nan, 5.0, 5.0])) == 0.0
    assert np.isnan(backtest.hindsight_flat_smape(np.array([np.nan])))


def _helios_three_weeks(shared_data: Path):  # type: ignore[no-untyped-def]
    series = history.load_series(shared_data / "helios_vc_demand_hourly.csv")
    return series[series["ts"] < series["ts"].min() + 21 * 86400]


def test_refitting_once_per_horizon_is_the_one_shot_backtest(shared_data: Path) -> None:
    series = _helios_three_weeks(shared_data)
    one = backtest.demand_backtest(series, 48, use_prophet=False)
    same = backtest.demand_backtest(series, 48, use_prophet=False, refit_every=48)
    assert one["refit_every"] is None and same["refit_every"] == 48
    assert {k: s["smape"] for k, s in one["series"].items()} == {k: s["smape"] for k, s in same["series"].items()}
    assert one["daily_repeat_smape"] == same["daily_repeat_smape"]


def test_daily_refits_see_more_and_score_each_piece(shared_data: Path) -> None:
    """Refitted every 24 h over a 96 h holdout: four forecasts per series, each on what was known by then."""
    series = _helios_three_weeks(shared_data)
    one = backtest.demand_backtest(series, 96, use_prophet=False)
    daily = backtest.demand_backtest(series, 96, use_prophet=False, refit_every=24)
    assert daily["n_series"] == one["n_series"] == 8
    # the weekly seasonal naive does not depend on refits; the daily repeat is refreshed each day
    assert daily["seasonal_naive_smape"] == one["seasonal_naive_smape"]
    assert daily["daily_repeat_smape"] != one["daily_repeat_smape"]
    assert daily["smape"] < daily["seasonal_naive_smape"]
    assert daily["smape"] < one["smape"]  # fresher history helps on this trace
    assert daily["hindsight_flat_smape"] == one["hindsight_flat_smape"]
    with pytest.raises(TraceError, match="refit_every"):
        backtest.demand_backtest(series, 96, use_prophet=False, refit_every=0)
