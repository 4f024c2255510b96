"""The vectorised paths of a sweep answer what the plain ones do: window aggregates over a view of sorted
columns or over a mask of unsorted ones, per-job reductions in one pass or job by job, and the chart."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpu_cost.analyse.jobrows import JobRows
from gpu_cost.perceive.aggregate import clean, last_sample_ts, lookback_stats, mem_trend_stats, window_stats
from gpu_cost.perceive.snapshot import sparkline

NOW = 1_800_000_000.0 + 60.0 * 359


def _samples(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    times = 1_800_000_000.0 + 60.0 * np.arange(400)  # 40 samples after NOW: ignored
    util = np.where(rng.random((9, 400)) < 0.4, 0.0, rng.random((9, 400)) * 100)
    util[rng.random(util.shape) < 0.1] = np.nan
    util[2] = np.nan  # never reported
    util[4, 3] = -5.0  # garbage
    util[5, 7] = np.inf
    mem = rng.random(util.shape) * 80000
    mem[6] = 1000.0  # constant
    mem[rng.random(mem.shape) < 0.05] = np.nan
    power = rng.random(util.shape) * 300
    return times, util, mem, power


@pytest.mark.parametrize("seed", [0, 1])
def test_unsorted_columns_give_the_sorted_answer(seed: int) -> None:
    times, util, mem, power = _samples(seed)
    u, m = clean(util, mem)
    order = np.random.default_rng(seed + 10).permutation(len(times))  # the mask path, not the view
    for window in (900.0, 3600.0):
        want = window_stats(times, u, m, NOW, window, 60.0, 0.8, 180.0, power)
        got = window_stats(times[order], u[:, order], m[:, order], NOW, window, 60.0, 0.8, 180.0, power[:, order])
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-12, equal_nan=True, err_msg=key)
    want_lb = lookback_stats(times, u, NOW, 6 * 3600.0, 5.0)
    got_lb = lookback_stats(times[order], u[:, order], NOW, 6 * 3600.0, 5.0)
    for key in want_lb:
        np.testing.assert_allclose(got_lb[key], want_lb[key], rtol=1e-12, equal_nan=True, err_msg=key)
    want_trend = mem_trend_stats(times, m, NOW, 6 * 3600.0)
    got_trend = mem_trend_stats(times[order], m[:, order], NOW, 6 * 3600.0)
    for key in want_trend:
        np.testing.assert_allclose(got_trend[key], want_trend[key], rtol=1e-9, equal_nan=True, err_msg=key)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_last_sample_time_read_once_serves_every_window(seed: int) -> None:
    times, util, mem, power = _samples(seed)
    u, m = clean(util, mem)
    order = np.random.default_rng(seed + 10).permutation(len(times))
    last = last_sample_ts(times[order], u[:, order], NOW)
    valid = ~np.isnan(u[:, times <= NOW])
    assert np.isnan(last[2]) and last[0] == times[times <= NOW][np.flatnonzero(valid[0])[-1]]  # last valid at or before NOW
    for window in (900.0, 3600.0, 7200.0):
        want = window_stats(times, u, m, NOW, window, 60.0, 0.8, 180.0, power)
        got = window_stats(times, u, m, NOW, window, 60.0, 0.8, 180.0, power, last_ts=last)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_window_aggregates_equal_numpys_nan_functions() -> None:
    times, util, mem, power = _samples(3)
    u, m = clean(util, mem)
    sel = (times > NOW - 1800) & (times <= NOW)
    got = window_stats(times, u, m, NOW, 1800.0, 60.0, 0.8, 180.0, power)
    with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning):
        np.testing.assert_allclose(got["util_mean"], np.nanmean(u[:, sel], axis=1), rtol=1e-12)  # the last bit
        np.testing.assert_array_equal(got["util_max"], np.nanmax(u[:, sel], axis=1))
        np.testing.assert_array_equal(got["mem_min_mib"], np.nanmin(m[:, sel], axis=1))
        np.testing.assert_allclose(got["power_w"], np.nanmean(power[:, sel], axis=1), rtol=1e-12)
    assert np.isnan(got["util_mean"][2]) and got["stale"][2]  # never reported: no mean, stale
    assert np.isnan(u[4, 3]) and np.isnan(u[5, 7])  # garbage (negative, infinite) dropped, never read as idle


def test_job_rows_and_their_reductions() -> None:
    frame = pd.DataFrame({"job_id": [None, "7", "", "9", "7", np.nan, "9", "7"],
                          "util": [1.0, 10.0, 2.0, np.nan, 30.0, 4.0, np.nan, np.nan]})
    index = JobRows(frame)
    assert {k: v.tolist() for k, v in index.rows.items()} == {"7": [1, 4, 7], "9": [3, 6]}  # "" and NaN: no job
    util = frame["util"].to_numpy()
    busy = util >= 20
    assert index.count(busy)[index.code["7"]] == 1 and index.count(busy)[index.code["9"]] == 0
    assert bool(index.any(np.isnan(util))[index.code["9"]])
    means = index.nanmean(util)
    assert means[index.code["7"]] == pytest.approx(20.0)
    assert np.isnan(means[index.code["9"]])  # no value at all: NaN, as np.nanmean says


def test_sparkline_takes_the_top_of_each_bucket_and_marks_no_data() -> None:
    assert sparkline(["0,100,,50", "90,0,,", ""]) == "█" + "█" + "·" + "▅"
    assert sparkline(["0,0", "0,5"]) == "▁▁"
    assert sparkline([]) == ""
