"""The vectorised paths of a sweep answer what the plain ones do: window aggregates over a view of sorted
columns or over a mask of unsorted ones, per-job reductions in one pass or job by job, and the chart."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpu_cost.analyse.jobrows import JobRows
from gpu_cost.perceive import aggregate
from gpu_cost.perceive.aggregate import (
    chart_buckets,
    clean,
    last_sample_ts,
    lookback_stats,
    mem_trend_stats,
    window_stats,
)
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


def _fleet(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A random fleet's samples: a random number of GPUs and samples, gaps, garbage, constant and growing memory,
    columns sometimes out of order."""
    rng = np.random.default_rng(seed)
    rows, cols = int(rng.integers(1, 60)), int(rng.integers(1, 500))
    times = NOW - 60.0 * np.arange(cols)[::-1] + 60.0 * int(rng.integers(0, 30))  # some samples after NOW
    if rng.random() < 0.3:
        times = times[rng.permutation(cols)]
    util = np.where(rng.random((rows, cols)) < rng.random(), 0.0, rng.random((rows, cols)) * 100)
    util[rng.random(util.shape) < rng.random() * 0.3] = np.nan
    util[rng.random(util.shape) < 0.01] = rng.choice([-3.0, 250.0, np.inf])
    mem = rng.random((rows, 1)) * 80000 + np.cumsum(rng.random((rows, cols)) * rng.choice([0.0, 50.0], (rows, 1)), axis=1)
    mem[rng.random(mem.shape) < 0.05] = np.nan
    mem[rng.random(mem.shape) < 0.01] = 1e12  # DCGM's blank value, or worse
    power = rng.random((rows, cols)) * 300
    return times, util, mem, power


def _aggregates(times: np.ndarray, util: np.ndarray, mem: np.ndarray, power: np.ndarray) -> dict[str, object]:
    u, m = clean(util, mem)
    last = last_sample_ts(times, u, NOW)
    out: dict[str, object] = {"util": u, "mem": m, "last_ts": last,
                              "chart": chart_buckets(times, u, NOW, 6 * 3600.0)}
    for window in (900.0, 3600.0):
        out.update({f"{k}@{window:g}": v for k, v in window_stats(times, u, m, NOW, window, 60.0, 0.8, 180.0, power,
                                                                   last).items()})
        out.update({f"{k}@{window:g} own last": v for k, v in window_stats(times, u, m, NOW, window, 60.0, 0.8,
                                                                            180.0, power).items()})
    out.update(lookback_stats(times, u, NOW, 6 * 3600.0, 5.0))
    out.update(mem_trend_stats(times, m, NOW, 6 * 3600.0))
    return out


@pytest.mark.parametrize("seed", range(24))
def test_a_gpus_aggregates_are_its_own_whether_the_matrix_is_taken_whole_in_blocks_or_row_by_row(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large cluster's matrix is aggregated in blocks of GPU rows (its temporaries then fit the allocator's
    reused memory): every figure of a GPU, bit for bit, is what the whole matrix gives it, and what its row alone
    gives it, whatever the block size (one row, a few, a block ending part-way)."""
    times, util, mem, power = _fleet(seed)
    whole = _aggregates(times, util, mem, power)
    rng = np.random.default_rng(seed + 100)
    for rows_per_block in (1, int(rng.integers(2, 7)), len(util) - 1):
        monkeypatch.setattr(aggregate, "BLOCK_BYTES", 8 * len(times) * max(1, rows_per_block))
        blocks = _aggregates(times, util, mem, power)
        for key, want in whole.items():
            got = blocks[key]
            if isinstance(want, list):
                assert got == want, key
            else:
                np.testing.assert_array_equal(got, want, err_msg=f"{key} in blocks of {rows_per_block} rows")
    monkeypatch.setattr(aggregate, "BLOCK_BYTES", 1 << 40)
    for row in rng.choice(len(util), size=min(5, len(util)), replace=False):
        alone = _aggregates(times, util[row:row + 1], mem[row:row + 1], power[row:row + 1])
        for key, want in whole.items():
            got = alone[key]
            if isinstance(want, list):
                assert got == [want[row]], key
            else:
                np.testing.assert_array_equal(np.asarray(got)[0], np.asarray(want)[row], err_msg=f"{key} of row {row} alone")
    if not np.isfinite(util).all() or not np.isfinite(mem).all():
        assert whole["util"] is not util or whole["mem"] is not mem  # garbage was dropped from a copy, not in place
