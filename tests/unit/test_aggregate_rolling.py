"""Running sums along a GPU x time matrix give the window and lookback aggregates of a pass over the window."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_cost.perceive.aggregate import RollingWindows, chart_buckets, clean, lookback_stats, window_stats

BUSY = 5.0


def _matrix(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    times, util, mem, _ = _with_power(seed)
    return times, util, mem


def _with_power(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n_g, n_t = 12, 400
    times = 1_800_000_000.0 + 60.0 * np.arange(n_t)
    times = np.delete(times, [50, 51, 52, 300])  # a scrape gap
    util = np.where(rng.random((n_g, len(times))) < 0.5, 0.0, rng.random((n_g, len(times))) * 100)
    util[rng.random(util.shape) < 0.1] = np.nan  # missing samples
    util[3] = np.nan  # a GPU never reported
    util[4, :200] = np.nan
    util[5, 5] = 250.0  # garbage: clean drops it
    mem = rng.random(util.shape) * 80000
    mem[rng.random(mem.shape) < 0.05] = np.nan
    u, m = clean(util, mem)
    power = np.round(60.0 + 3.4 * np.nan_to_num(u, nan=0.0) + rng.random(u.shape) * 20, 1).astype(np.float32)
    power[rng.random(power.shape) < 0.1] = np.nan  # a reading missed
    power[6] = np.nan  # a GPU whose power no exporter reads
    return times, u, m, power


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray], power: bool = False) -> None:
    assert set(got) >= set(want) - {"power_w"}
    for key, value in want.items():
        if key == "power_w" and not power:
            continue
        np.testing.assert_allclose(got[key], value, rtol=1e-12, atol=1e-9, equal_nan=True, err_msg=key)


@pytest.mark.parametrize("seed", [0, 1, 2], ids=["seed0", "seed1", "seed2"])
@pytest.mark.parametrize("window", [900.0, 7200.0, 1e9], ids=["15m", "2h", "longer-than-the-slice"])
def test_windows_and_lookbacks_match_a_pass_over_the_samples(seed: int, window: float) -> None:
    """The GPUs' power (a replay's trace column) is averaged over the window as a pass over the live samples does."""
    times, util, mem, power = _with_power(seed)
    rolling = RollingWindows(times, util, mem, BUSY, power=power)
    lookback = 6 * 3600.0
    for hi in (1, 2, 30, 120, 250, len(times)):
        now = float(times[hi - 1])
        lo = int(np.searchsorted(times, now - lookback, side="right"))
        t, u, m, p = times[lo:hi], util[:, lo:hi], mem[:, lo:hi], power[:, lo:hi].astype(float)
        got = rolling.window(t, now, window, 60.0, 0.6, 180.0)
        _same(got, window_stats(t, u, m, now, window, 60.0, 0.6, 180.0, p), power=True)
        assert got["power_w"].dtype == np.float64 and np.isnan(got["power_w"][6])
        _same(rolling.lookback(t, now, lookback, BUSY), lookback_stats(t, u, now, lookback, BUSY))


def test_an_edited_matrix_is_read_again_after_refresh() -> None:
    times, util, mem = _matrix(3)
    rolling = RollingWindows(times, util, mem, BUSY)
    util[[1, 7], 100:] = 0.0  # what a simulated kill does
    mem[[1, 7], 100:] = 0.0
    rolling.refresh(np.array([1, 7]))
    now = float(times[199])
    lo = int(np.searchsorted(times, now - 3600.0, side="right"))
    got = rolling.lookback(times[lo:200], now, 3600.0, BUSY)
    assert got["util_mean_lb"][1] == 0.0 and got["busy_share_lb"][7] == 0.0
    _same(got, lookback_stats(times[lo:200], util[:, lo:200], now, 3600.0, BUSY))


def test_without_power_the_window_reads_none() -> None:
    times, util, mem = _matrix(5)
    got = RollingWindows(times, util, mem, BUSY).window(times, float(times[-1]), 900.0, 60.0, 0.6, 180.0)
    assert np.isnan(got["power_w"]).all()


def test_a_different_busy_level_is_refused() -> None:
    times, util, mem = _matrix(4)
    with pytest.raises(ValueError, match=r"busy above 5\.0, not 10"):
        RollingWindows(times, util, mem, BUSY).lookback(times, float(times[-1]), 3600.0, 10)


def test_chart_text_is_the_max_of_each_bucket() -> None:
    times = 1_800_000_000.0 + 60.0 * np.arange(1, 13)
    util = np.array([[0, 1, 2.5, 3.5, np.nan, np.nan, 10, 20, 30, 40, 50, 99.5],
                     [np.nan] * 12])
    now = float(times[-1])
    assert chart_buckets(times, util, now, 720.0, buckets=4) == ["2,4,30,100", ",,,"]
