"""The GPU frame's framebuffer trend over the lookback: slope, R², span (aggregate.mem_trend_stats)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from gpu_cost.core.model import GPU_COLUMNS
from gpu_cost.perceive.aggregate import MAX_MEM_MIB, gpu_frame, mem_trend_stats
from tests.fixtures.core import NOW

STEP = 60.0
LOOKBACK = 6 * 3600.0
TIMES = np.arange(NOW - LOOKBACK + STEP, NOW + 1, STEP)  # 360 samples in (now - 6 h, now]
HOURS = (TIMES - TIMES[0]) / 3600.0


def trend(mem: np.ndarray, times: np.ndarray = TIMES) -> dict[str, np.ndarray]:
    return mem_trend_stats(times, np.atleast_2d(mem), NOW, LOOKBACK)


def test_a_leak_is_measured_within_5_percent() -> None:
    rng = np.random.default_rng(7)
    leak = 20000 + 2048 * HOURS + rng.normal(0, 300, len(TIMES))  # +2 GiB/h over 6 h, noisy
    t = trend(leak)
    assert abs(t["mem_slope_mib_h_lb"][0] - 2048) < 0.05 * 2048
    assert t["mem_r2_lb"][0] > 0.95
    assert t["mem_span_s_lb"][0] == pytest.approx(LOOKBACK - STEP)


def test_flat_and_sawtooth_memory_have_no_steady_trend() -> None:
    rng = np.random.default_rng(8)
    flat = 30000 + rng.normal(0, 200, len(TIMES))
    saw = 30000 + 8192 * np.mod(HOURS, 1.0)  # a checkpoint buffer filling for an hour, then freed
    t = trend(np.vstack([flat, saw]))
    assert abs(t["mem_slope_mib_h_lb"][0]) < 100 and t["mem_r2_lb"][0] < 0.1
    # 8 GiB per hour up and down: a slope of A/N² (~230 MiB/h over 6 periods), no steady growth
    assert abs(t["mem_slope_mib_h_lb"][1]) < 300 and t["mem_r2_lb"][1] < 0.1


def test_constant_memory_has_zero_slope_and_no_r2() -> None:
    t = trend(np.full(len(TIMES), 40960.0 * 0.3))  # 12288.000…: a mean that does not round back exactly
    assert t["mem_slope_mib_h_lb"][0] == 0.0
    assert np.isnan(t["mem_r2_lb"][0])


def test_equals_a_per_gpu_least_squares_fit_with_gaps() -> None:
    rng = np.random.default_rng(9)
    mem = rng.normal(30000, 3000, (40, len(TIMES))) + rng.uniform(-3000, 3000, (40, 1)) * HOURS
    mem[rng.random(mem.shape) < 0.3] = np.nan  # gaps anywhere
    mem[5, :-2], mem[5, -2:] = np.nan, (30000.0, 30100.0)  # two samples: a slope, no R²
    mem[6, :-1], mem[6, -1] = np.nan, 30000.0  # one sample: span 0, no slope
    mem[7, :] = np.nan  # none at all
    t = trend(mem)
    for i in range(len(mem)):
        ok = ~np.isnan(mem[i])
        x, y = TIMES[ok], mem[i, ok]
        if ok.sum() >= 2:
            slope, _ = np.polyfit(x - x.mean(), y, 1)
            assert t["mem_slope_mib_h_lb"][i] == pytest.approx(slope * 3600, rel=1e-9), i
        else:
            assert np.isnan(t["mem_slope_mib_h_lb"][i]), i
        if ok.sum() >= 3:
            assert t["mem_r2_lb"][i] == pytest.approx(np.corrcoef(x, y)[0, 1] ** 2, rel=1e-9), i
        else:
            assert np.isnan(t["mem_r2_lb"][i]), i
        if ok.any():
            assert t["mem_span_s_lb"][i] == x[-1] - x[0], i
        else:
            assert np.isnan(t["mem_span_s_lb"][i]), i
    assert t["mem_span_s_lb"][6] == 0.0


def test_only_the_lookback_counts() -> None:
    times = np.arange(NOW - 2 * LOOKBACK + STEP, NOW + 1, STEP)
    hours = (times - times[0]) / 3600.0
    mem = np.where(times > NOW - LOOKBACK, 30000.0 + 1000 * hours, 0.0)  # a step before the lookback
    t = trend(mem, times)
    assert t["mem_slope_mib_h_lb"][0] == pytest.approx(1000.0) and t["mem_r2_lb"][0] == pytest.approx(1.0)


def _frame(mem: np.ndarray) -> object:
    n = len(mem)
    util = np.full(mem.shape, 50.0)
    return gpu_frame(
        hosts=np.array(["g1"] * n, dtype=object), gpus=np.arange(n), uuids=np.array([""] * n, dtype=object),
        models=np.array(["a100"] * n, dtype=object), mem_total=np.full(n, 81920.0), label_job=np.full(n, "", dtype=object),
        times=TIMES, util=util, mem=mem, power=None, now=NOW, window_s=900.0, lookback_s=LOOKBACK,
        sample_interval_s=STEP, min_sample_ratio=0.6, max_staleness_s=180.0, busy_util=20.0,
    )


def test_gpu_frame_has_the_columns_and_drops_garbage_readings() -> None:
    mem = np.vstack([20000 + 2048 * HOURS, 20000 + 2048 * HOURS])
    mem[1, ::7] = float(0x7FFFFFF0)  # DCGM's blank value: far above MAX_MEM_MIB, dropped
    mem[1, 3::11] = -5.0
    assert float(0x7FFFFFF0) > MAX_MEM_MIB
    g = _frame(mem)
    assert list(g.columns) == list(GPU_COLUMNS)  # type: ignore[attr-defined]
    slope = g["mem_slope_mib_h_lb"].to_numpy()  # type: ignore[index]
    assert slope == pytest.approx([2048.0, 2048.0], rel=1e-9)
    assert g["mem_r2_lb"].to_numpy() == pytest.approx([1.0, 1.0])  # type: ignore[index]


def test_ten_thousand_gpus_stay_fast() -> None:
    rng = np.random.default_rng(10)
    mem = rng.normal(30000, 500, (10_000, len(TIMES)))
    mem[rng.random(mem.shape) < 0.05] = np.nan
    mem_trend_stats(TIMES, mem[:10], NOW, LOOKBACK)  # warm
    t0 = time.perf_counter()
    t = mem_trend_stats(TIMES, mem, NOW, LOOKBACK)
    elapsed = time.perf_counter() - t0
    assert len(t["mem_slope_mib_h_lb"]) == 10_000 and np.isfinite(t["mem_r2_lb"]).all()
    # vectorised this takes a few tens of milliseconds; a Python fit per GPU takes seconds
    assert elapsed < 1.0, elapsed
