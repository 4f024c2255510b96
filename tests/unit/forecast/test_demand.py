"""The demand model: seasonal series, level shifts, stored forecasts and what the power DAG reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpu_cost.capacity.forecast import backtest, demand, history
from gpu_cost.capacity.forecast.backtest import seasonal_naive, smape
from gpu_cost.core.errors import TraceError

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
    # capacity reads the band's upper bound, summed the same way
    assert demand.expected_demand(store, now, 12 * H, bound="upper") == 99.0
    assert demand.expected_demand(store, now, 12 * H, key_prefix="partition:", bound="upper") == 198.0
    with pytest.raises(ValueError, match="bound must be"):
        demand.expected_demand(store, now, 12 * H, bound="p95")


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


# -- WAPE, fallbacks, intermittent series and level shifts ----------------------------------------
def test_wape_and_gpu_hours_short_and_idle_on_a_hand_checked_example() -> None:
    y = np.array([10.0, 0.0, 5.0, np.nan])
    p = np.array([8.0, 2.0, 5.0, 99.0])  # 2 GPUs short, 2 idle, exact; the unknown hour does not count
    assert backtest.wape(y, p) == pytest.approx(4 / 15)
    assert backtest.short_idle(y, p) == (2.0, 2.0)
    assert backtest.wape(y, np.zeros(4)) == pytest.approx(1.0)  # forecasting nothing misses all of it
    assert np.isnan(backtest.wape(np.zeros(3), np.ones(3)))  # no demand: no WAPE, not a division by zero


def test_recent_folds_weigh_more_in_the_fallback_choice() -> None:
    truth = np.array([10.0, 10.0])
    folds = [(96, truth, {"a": np.array([10.0, 10.0]), "b": np.array([0.0, 0.0])}),  # ended 2 days ago
             (98, truth, {"a": np.array([0.0, 0.0]), "b": np.array([10.0, 10.0])})]  # ended now
    err, den = demand.fold_wape(folds, 100, half_life=2)
    assert den == pytest.approx(0.5 * 20 + 20)
    assert err["a"] == pytest.approx(20) and err["b"] == pytest.approx(0.5 * 20)
    assert min(err, key=err.get) == "b"  # right on the latest fold wins over right on an older one


def test_idle_days_at_the_end_are_no_demand_not_an_outage() -> None:
    _, v = _series(24 * 10)
    v[-48:] = 0.0  # the team stopped two days ago: nothing says it comes back
    assert not np.isnan(demand.clean(v)).any()
    v = _series(24 * 10)[1]
    v[24:24 * 5] = 0.0  # four quiet days in the middle: idle, not a four-day outage
    assert not np.isnan(demand.clean(v)).any()


def _went_quiet(idle_days: int) -> tuple[np.ndarray, np.ndarray]:
    ts, v = _series(24 * 21 + 24 * idle_days)
    v[-24 * idle_days:] = 0.0
    return ts, v


def test_intermittent_series_falls_back_to_zero_and_says_so(store) -> None:  # type: ignore[no-untyped-def]
    """A team that wanted about 45 GPUs for three weeks and nothing for the last four days."""
    ts, v = _went_quiet(4)
    fc = demand.forecast(ts, v, 48)
    assert fc.model == "zero (fallback)" and fc.candidate == "zero"
    assert fc.fallback is not None and fc.fallback.startswith("zero:") and "no demand" in fc.fallback
    assert np.all(fc.yhat < 0.5) and np.all(fc.lower <= fc.yhat) and np.all(fc.yhat <= fc.upper)
    assert fc.wape["median"] is None  # no demand in the validation hours: WAPE undefined, ranked by GPU-h
    # the model's own median was not zero on the folds: the fallback is what chose nothing
    cut = len(v) - 48
    assert demand.candidates(ts[:cut - 48], v[:cut - 48], 48, demand.prophet_util.FitStats())["median"].mean() > 10
    # the stored rows say what was used and why
    store.execute("upsert_forecast", demand.forecast_rows("account:quiet", fc, ts[-1]))
    rows = store.query("SELECT model, extra FROM gpu_cost_forecasts WHERE series = 'demand:account:quiet'")
    assert len(rows) == 48 and {r["model"] for r in rows} == {"zero (fallback)"}
    extra = json.loads(rows[0]["extra"])
    assert extra["chosen"] == "zero" and extra["fallback"] == fc.fallback
    assert set(extra["wape"]) == set(fc.wape) and extra["scores"] == fc.scores


def test_a_busy_team_is_never_forecast_zero() -> None:
    """A demand that fell to a few GPUs is low, not gone: zero is a fallback only for a team idle over the last day."""
    ts, v = _series(24 * 24)
    v[-30:] = 3.0 + np.arange(30) % 2
    fc = demand.forecast(ts, v, 48)
    assert fc.candidate != "zero" and fc.yhat.mean() > 1


def test_after_a_level_drop_the_recent_level_outweighs_old_seasonality() -> None:
    """A steady daily cycle around 40 GPUs for three weeks; two days ago the team dropped to around 15."""
    rng = np.random.default_rng(7)
    t = np.arange(24 * 26)
    y = 40 + 10 * np.sin(2 * np.pi * t / 24) + rng.normal(0, 2, len(t))
    y[-96:] -= 25.0
    ts, v, truth = T0 + H * t[:-48], y[:-48], y[-48:]
    fc = demand.forecast(ts, v, 48)
    # last week remembers 40 GPUs; the median of five without the extra recent votes scored 0.40 here
    assert backtest.wape(truth, fc.yhat) < 0.25 * backtest.wape(truth, seasonal_naive(v, 48))
    assert backtest.wape(truth, fc.yhat) < 0.35
    assert abs(fc.yhat.mean() - 15) < 5
    assert (fc.lower <= fc.yhat + 1e-9).all() and (fc.yhat <= fc.upper + 1e-9).all()


def test_nightly_batch_counts_fallbacks_and_stores_why(store) -> None:  # type: ignore[no-untyped-def]
    import pandas as pd

    from gpu_cost.capacity.forecast import nightly

    quiet_ts, quiet = _went_quiet(4)
    busy = _series(len(quiet))[1]
    series = pd.DataFrame({"ts": np.concatenate([quiet_ts, quiet_ts]), "value": np.concatenate([quiet, busy]),
                           "key": ["account:quiet"] * len(quiet) + ["account:busy"] * len(busy)})
    now = float(quiet_ts[-1] + H)
    keys = nightly.store_series(store, series, now)
    out = nightly.fit_batch(store, {"now": now, "keys": keys, "horizon_h": 48, "batch": 0})
    assert out["fallbacks"] == ["account:quiet"] and out["models"]["zero (fallback)"] == 1
    done = nightly.finish(store, now, [out], None)
    assert done["demand"]["fallbacks"] == 1 and done["demand"]["fallback_series"] == ["account:quiet"]
    assert "1 fell back" in nightly.summary_line(done)
    row = store.query("SELECT extra FROM gpu_cost_forecasts WHERE series = 'demand:account:quiet' LIMIT 1")[0]
    assert json.loads(row["extra"])["fallback"].startswith("zero:")


def test_backtest_reports_wape_pooled_and_the_best_naive_per_series() -> None:
    rng = np.random.default_rng(5)
    frames = []
    for key, level in (("big", 200.0), ("small", 4.0)):
        ts, v = _series(24 * 21, seed=int(level))
        v = v * level / 40 + rng.normal(0, 1, len(v))
        frames.append({"ts": ts, "value": np.clip(v, 0, None), "key": key})
    import pandas as pd

    series = pd.concat([pd.DataFrame(f) for f in frames])
    out = backtest.demand_backtest(series, 72, use_prophet=False, refit_every=24)
    per = out["series"]
    for s in per.values():
        assert s["best_naive_wape"] == min(s["seasonal_naive_wape"], s["daily_repeat_wape"])
        assert s["best_naive_wape"] == s[f"{s['best_naive']}_wape"]
        # short and idle split the absolute error: together they are the WAPE's numerator
        assert s["gpu_hours_short"] + s["gpu_hours_idle"] == pytest.approx(s["wape"] * s["gpu_hours"], rel=1e-3)
    # pooled, not a mean of ratios: the big team's GPUs dominate
    pooled = sum(s["wape"] * s["gpu_hours"] for s in per.values()) / sum(s["gpu_hours"] for s in per.values())
    assert out["wape"] == pytest.approx(pooled, abs=1e-3)
    assert out["best_naive_wape"] <= min(out["seasonal_naive_wape"], out["daily_repeat_wape"]) + 1e-9
    assert out["gpu_hours_short"] == pytest.approx(sum(s["gpu_hours_short"] for s in per.values()), abs=0.5)


def test_a_team_whose_days_repeat_gets_a_band_as_narrow_as_its_forecast_was_right() -> None:
    # busy 09:00-18:00 at 64 GPUs, 4 otherwise, for 15 days: the daily repeat is exact on every fold,
    # the recent level misses every morning by 60; the band must not inherit the level's misses
    ts = 1793577600.0 + 3600.0 * np.arange(15 * 24 + 2)  # 2026-11-02 00:00 UTC, then up to 02:00
    hour = (ts // 3600).astype(int) % 24
    v = np.where((hour >= 9) & (hour < 18), 64.0, 4.0)
    fc = demand.forecast(ts, v, 48, use_prophet=False)
    assert fc.candidate == "daily_repeat" and fc.fallback
    night = (((fc.ts // 3600).astype(int) % 24) < 9)
    assert np.allclose(fc.yhat[night], 4.0) and np.all(fc.upper[night] < 8.0)
    assert np.all(fc.upper >= fc.yhat) and np.all(fc.lower <= fc.yhat)
    # a candidate far worse than the chosen one is no doubt about it; one about as good is
    err = {"daily_repeat": 0.0, "level": 500.0, "median": 10.0, "revert": 400.0}
    assert demand.interval_peers("daily_repeat", err, 1000.0) == {"daily_repeat", "median"}
    assert demand.interval_peers("median", {"median": 100.0, "level": 140.0, "revert": 170.0}, 1000.0) == \
        {"median", "level"}
