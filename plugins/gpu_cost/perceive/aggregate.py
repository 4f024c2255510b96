"""Turn raw GPU samples into the per-GPU window aggregates the rules read.

One implementation for every source that has raw samples (simulator, trace files, replays): a
dense GPU × time matrix reduced with NumPy. The Prometheus source computes the same columns in
PromQL. Invalid samples (negative, above 100 %, NaN; memory negative or above
:data:`MAX_MEM_MIB`) are dropped, never read as idle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

import numpy as np
import pandas as pd

from gpu_cost.core.errors import TraceError
from gpu_cost.core.model import GPU_COLUMNS, MIG_COLUMNS, WINDOW_COLUMNS
from gpu_cost.core.timeutil import iso

#: framebuffer readings above this (2 TiB, several times any GPU's memory) are garbage, e.g. DCGM's
#: blank value 0x7ffffff0 for a field the driver could not read: dropped, never read as memory held
MAX_MEM_MIB = float(1 << 21)


def _in_order(times: np.ndarray, *matrices: np.ndarray | None) -> tuple[Any, ...]:
    """Return ``times`` and the matrices' columns in time order (as they are, no copy, when already sorted)."""
    if len(times) < 2 or bool(np.all(times[1:] >= times[:-1])):
        return (times, *matrices)
    order = np.argsort(times, kind="stable")
    # take: rows stay contiguous (x[:, order] lays the copy out column by column, and a row's sums then depend on
    # how many rows the matrix has)
    return (times[order], *(None if x is None else np.take(x, order, axis=1) for x in matrices))


def _span(times: np.ndarray, start: float, end: float) -> slice:
    """Return the columns of sorted ``times`` with ``start < times <= end``: a slice, so a view, not a copy."""
    return slice(int(np.searchsorted(times, start, side="right")), int(np.searchsorted(times, end, side="right")))


def _nanmean(x: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return each row's count of ``valid`` (not NaN) values and their mean (NaN when none): no copy of ``x``."""
    n = np.count_nonzero(valid, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return n, np.add.reduce(x, axis=1, where=valid) / n


#: bytes of a GPU × time matrix one pass works on at once (:func:`_by_rows`): under the C allocator's largest
#: threshold for serving an allocation from fresh pages (glibc: 32 MiB), so a block's temporaries are reused
BLOCK_BYTES = 16 << 20


def _block_rows(columns: int) -> int:
    """Return the GPU rows of a block of a matrix with ``columns`` samples per row."""
    return max(1, BLOCK_BYTES // (8 * max(1, columns)))


_Out = TypeVar("_Out", dict[str, np.ndarray], list[str], np.ndarray)


def _by_rows(fn: Callable[..., _Out], times: np.ndarray, *rows: np.ndarray | None, **kw: Any) -> _Out:
    """Return ``fn(times, *rows, **kw)`` computed over blocks of GPU rows and joined (dicts of arrays key by key,
    lists and arrays end to end); ``rows`` are matrices (GPU × time) and per-row arrays, cut alike.

    Every aggregate here is per GPU row, so a block's rows come out as the whole matrix's would, bit for bit. Each
    pass over a whole matrix allocates temporaries of its size (a 100,000-GPU, 6 h lookback is 288 MB a float array):
    above the allocator's threshold they come as fresh pages from the kernel each time, and those page faults cost
    more than the arithmetic (a 100,000-GPU sweep's framebuffer trend: 1.2 s whole, 0.3 s in blocks).
    """
    n = next((len(x) for x in rows if x is not None), 0)
    step = _block_rows(len(times))
    if n <= step:
        return fn(times, *rows, **kw)
    parts: list[Any] = [fn(times, *(None if x is None else x[i:i + step] for x in rows), **kw)
                        for i in range(0, n, step)]
    if isinstance(parts[0], dict):
        joined: Any = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
    elif isinstance(parts[0], list):
        joined = [x for part in parts for x in part]
    else:
        joined = np.concatenate(parts)
    return cast(_Out, joined)


def window_stats(
    times: np.ndarray,
    util: np.ndarray,
    mem: np.ndarray,
    now: float,
    window_s: float,
    sample_interval_s: float,
    min_sample_ratio: float,
    max_staleness_s: float,
    power: np.ndarray | None = None,
    last_ts: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Return window aggregates (one value per GPU row) for samples in ``(now - window, now]``.

    :param last_ts: :func:`last_sample_ts` of these samples, where the caller has it (the same for every window).
    """
    return _by_rows(_window_stats, times, util, mem, power, last_ts, now=now, window_s=window_s,
                    sample_interval_s=sample_interval_s, min_sample_ratio=min_sample_ratio,
                    max_staleness_s=max_staleness_s)


def _window_stats(times: np.ndarray, util: np.ndarray, mem: np.ndarray, power: np.ndarray | None,
                  last_ts: np.ndarray | None, *, now: float, window_s: float, sample_interval_s: float,
                  min_sample_ratio: float, max_staleness_s: float) -> dict[str, np.ndarray]:
    times, util, mem, power = _in_order(times, util, mem, power)
    sel = _span(times, now - window_s, now)
    u = util[:, sel]
    m = mem[:, sel]
    n, mean = _nanmean(u, ~np.isnan(u))
    expected = max(1, round(window_s / sample_interval_s))
    nan = np.full(len(u), np.nan)
    p = power[:, sel] if power is not None else None
    out = {  # NaN-skipping reductions (fmax, fmin) over views: no copy of the samples
        "util_mean": mean if u.shape[1] else nan,
        "util_max": np.fmax.reduce(u, axis=1) if u.shape[1] else nan.copy(),
        "mem_min_mib": np.fmin.reduce(m, axis=1) if m.shape[1] else nan.copy(),
        "mem_max_mib": np.fmax.reduce(m, axis=1) if m.shape[1] else nan.copy(),
        "power_w": _nanmean(p, ~np.isnan(p))[1] if p is not None and p.shape[1] else nan.copy(),
    }
    if last_ts is None:
        last_ts = _last_sample_ts(times, util, now=now)
    out["n_samples"] = n.astype(np.int64)
    out["expected_samples"] = np.full(len(u), expected, dtype=np.int64)
    out["last_ts"] = last_ts
    out["stale"] = (n < min_sample_ratio * expected) | ~(now - np.nan_to_num(last_ts, nan=-np.inf) <= max_staleness_s)
    return out


def last_sample_ts(times: np.ndarray, util: np.ndarray, now: float) -> np.ndarray:
    """Return per GPU row the time of its last valid utilisation sample at or before ``now`` (NaN: none)."""
    return _by_rows(_last_sample_ts, times, util, now=now)


def _last_sample_ts(times: np.ndarray, util: np.ndarray, *, now: float) -> np.ndarray:
    times, util = _in_order(times, util)
    upto = _span(times, -np.inf, now)
    any_valid = ~np.isnan(util[:, upto])
    if not any_valid.shape[1]:
        return np.full(len(util), np.nan)
    last_idx = any_valid.shape[1] - 1 - np.argmax(any_valid[:, ::-1], axis=1)
    return np.where(any_valid.any(axis=1), times[upto][last_idx], np.nan)


def lookback_stats(times: np.ndarray, util: np.ndarray, now: float, lookback_s: float, busy_util: float) -> dict[str, np.ndarray]:
    """Return lookback aggregates: mean/max utilisation, busy share and idle→busy transitions."""
    return _by_rows(_lookback_stats, times, util, now=now, lookback_s=lookback_s,
                    busy_util=busy_util)


def _lookback_stats(times: np.ndarray, util: np.ndarray, *, now: float, lookback_s: float,
                    busy_util: float) -> dict[str, np.ndarray]:
    times, util = _in_order(times, util)
    u = util[:, _span(times, now - lookback_s, now)]
    n, mean = _nanmean(u, ~np.isnan(u))
    with np.errstate(invalid="ignore"):
        busy = u > busy_util  # NaN compares False: a missing sample is neither busy nor quiet
        mean = mean if u.shape[1] else np.full(len(u), np.nan)
        mx = np.fmax.reduce(u, axis=1) if u.shape[1] else np.full(len(u), np.nan)
        share = np.where(n > 0, busy.sum(axis=1) / np.maximum(n, 1), np.nan)
        if u.shape[1] > 1:
            # a burst starts where a quiet sample (under a quarter of the busy level) is followed by a
            # busy one: a service waking up, not an input-bound job hovering around the busy level
            idle = u[:, :-1] < busy_util / 4.0
            bursts = (idle & busy[:, 1:]).sum(axis=1)
        else:
            bursts = np.zeros(len(u), dtype=np.int64)
    return {"util_mean_lb": mean, "util_max_lb": mx, "busy_share_lb": share, "bursts_lb": bursts.astype(np.int64), "n_lb": n.astype(np.int64)}


def mem_trend_stats(times: np.ndarray, mem: np.ndarray, now: float, lookback_s: float) -> dict[str, np.ndarray]:
    """Return the framebuffer's trend over the lookback, per GPU row, from its valid samples.

    ``mem_slope_mib_h_lb``: least-squares slope of used MiB against time, per hour (NaN under two
    samples; 0 for constant memory); ``mem_r2_lb``: the fit's R² (NaN when memory is constant or
    under three samples); ``mem_span_s_lb``: seconds between the first and the last valid sample
    (NaN when none). One pass over the GPU × time matrix, no loop per GPU. The Prometheus source
    computes the same with ``deriv`` and ``stdvar_over_time`` on the same sample grid.
    """
    return _by_rows(_mem_trend_stats, times, mem, now=now, lookback_s=lookback_s)


def _mem_trend_stats(times: np.ndarray, mem: np.ndarray, *, now: float, lookback_s: float) -> dict[str, np.ndarray]:
    times, mem = _in_order(times, mem)
    sel = _span(times, now - lookback_s, now)
    m = mem[:, sel]
    rows = len(m)
    if not m.shape[1]:
        nan = np.full(rows, np.nan)
        return {"mem_slope_mib_h_lb": nan, "mem_r2_lb": nan.copy(), "mem_span_s_lb": nan.copy()}
    ts = times[sel].astype(float)
    t = ts - ts.mean()  # centred: squares of epoch seconds would lose precision
    valid = ~np.isnan(m)
    n = np.count_nonzero(valid, axis=1)
    safe_n = np.maximum(n, 1)
    mean_t = np.einsum("ij,j->i", valid, t) / safe_n  # einsum reads the mask as it is: no float copy of it
    sxx = np.einsum("ij,j->i", valid, t * t) - n * mean_t * mean_t
    dy = np.where(valid, m, 0.0)  # the one full-size copy, centred in place below
    mean_y = dy.sum(axis=1) / safe_n
    dy -= mean_y[:, None]  # two passes for y: memory is large, its variance may be small
    np.copyto(dy, 0.0, where=~valid)
    syy = np.einsum("ij,ij->i", dy, dy)
    # NumPy's own loop, not BLAS: a row's dot product then does not depend on how many rows the matrix has (a block,
    # a node group's shard, the whole cluster give a GPU the same figures, bit for bit)
    sxy = np.einsum("ij,j->i", dy, t) - mean_t * dy.sum(axis=1)
    first = np.argmax(valid, axis=1)
    last = valid.shape[1] - 1 - np.argmax(valid[:, ::-1], axis=1)
    # constant memory exactly (the mean's rounding would leave a spurious tiny variance)
    const = ((m == m[np.arange(rows), first][:, None]) | ~valid).all(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where((n >= 2) & (sxx > 0), np.where(const, 0.0, sxy / sxx * 3600.0), np.nan)
        r2 = np.where((n >= 3) & (sxx > 0) & (syy > 0) & ~const, np.clip(sxy * sxy / (sxx * syy), 0.0, 1.0), np.nan)
    span = np.where(n > 0, ts[last] - ts[first], np.nan)
    return {"mem_slope_mib_h_lb": slope, "mem_r2_lb": r2, "mem_span_s_lb": span}


def clean(util: np.ndarray, mem: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ``util`` and ``mem`` with impossible values (negative, > 100 %, > MAX_MEM_MIB, ±inf) replaced by NaN.

    An array with such a value is copied first; one without is returned as it is (as float), not
    copied: a 100,000-GPU lookback is 288 MB an array. Read what is returned; do not change it unless
    the arrays given were yours to change.
    """
    return _within(util, 100.0), _within(mem, MAX_MEM_MIB)


def _within(values: np.ndarray, top: float) -> np.ndarray:
    """Return ``values`` as float with those outside ``[0, top]`` (±inf too) set to NaN: a copy only when some are.

    Checked in blocks of rows (:func:`_by_rows`: the masks of a whole matrix are fresh pages)."""
    v = np.asarray(values, dtype=float)
    out = v
    step = _block_rows(v.shape[1] if v.ndim > 1 else 1)
    for i in range(0, len(v), step):
        with np.errstate(invalid="ignore"):
            bad = (v[i:i + step] < 0) | (v[i:i + step] > top)  # NaN compares False: already missing
        if bad.any():
            if out is v:
                out = v.copy()
            out[i:i + step][bad] = np.nan
    return out


def gpu_frame(
    *,
    hosts: np.ndarray,
    gpus: np.ndarray,
    uuids: np.ndarray,
    models: np.ndarray,
    mem_total: np.ndarray,
    label_job: np.ndarray,
    times: np.ndarray,
    util: np.ndarray,
    mem: np.ndarray,
    power: np.ndarray | None,
    now: float,
    window_s: float,
    lookback_s: float,
    sample_interval_s: float,
    min_sample_ratio: float,
    max_staleness_s: float,
    busy_util: float,
    mig: Mapping[str, np.ndarray] | None = None,
    rolling: RollingWindows | None = None,
    cleaned: bool = False,
    last_ts: np.ndarray | None = None,
) -> pd.DataFrame:
    """Return the :data:`~gpu_cost.core.model.GPU_COLUMNS` frame from a dense sample matrix.

    ``mig`` holds the :data:`~gpu_cost.core.model.MIG_COLUMNS` per row; they are added only when some
    row is a MIG slice, so a cluster of whole GPUs gives the same frame as before.

    :param rolling: running sums over the whole (clean) matrix ``times``/``util``/``mem`` are a slice
        of: the window and lookback counts, sums and bursts come from them, not from the samples again.
    :param cleaned: ``util`` and ``mem`` went through :func:`clean` already (a copy of each saved).
    :param last_ts: :func:`last_sample_ts` of the clean ``util``, where the caller has it.
    """
    if rolling is None:
        if not cleaned:
            util, mem = clean(util, mem)
            last_ts = None  # of other samples than these
        w = window_stats(times, util, mem, now, window_s, sample_interval_s, min_sample_ratio, max_staleness_s, power,
                         last_ts)
        lb = lookback_stats(times, util, now, lookback_s, busy_util)
    else:
        w = rolling.window(times, now, window_s, sample_interval_s, min_sample_ratio, max_staleness_s)
        lb = rolling.lookback(times, now, lookback_s, busy_util)
    trend = mem_trend_stats(times, mem, now, lookback_s)
    columns: dict[str, Any] = {
        "host": hosts.astype(object),
        "gpu": gpus.astype(np.int64),
        "uuid": uuids.astype(object),
        "model": models.astype(object),
        "label_job_id": label_job.astype(object),
        "mem_total_mib": mem_total.astype(float),
        **w,
        **lb,
        **trend,
        "util_chart_lb": chart_buckets(times, util, now, lookback_s),
    }
    # built in the contract's column order (not reordered after: a second frame)
    frame = pd.DataFrame({col: columns[col] for col in GPU_COLUMNS})
    return with_mig(frame, mig)


def with_mig(frame: pd.DataFrame, mig: Mapping[str, np.ndarray] | None) -> pd.DataFrame:
    """Return ``frame`` with the MIG columns from ``mig`` when some row is a slice, else unchanged.

    A slice's ``power_w`` is NaN: no exporter measures a slice's own power.
    """
    if not mig or not any(str(x) for x in mig.get("mig", ())):
        return frame
    out = frame.copy()
    n = len(out)
    for col in MIG_COLUMNS:
        if col == "share":
            out[col] = np.asarray(mig.get(col, np.ones(n)), dtype=float)
        else:
            out[col] = pd.Series([str(x or "") for x in mig.get(col, [""] * n)], index=out.index, dtype=object)
    # device-level power on a slice is the whole GPU's (dcgm-exporter repeats it), not the slice's work
    out.loc[out["mig"] != "", "power_w"] = np.nan
    return out


#: buckets of the utilisation chart a notice shows (the lookback in equal parts)
CHART_BUCKETS = 12


def chart_buckets(times: np.ndarray, util: np.ndarray, now: float, lookback: float,
                  buckets: int = CHART_BUCKETS) -> list[str]:
    """Return per GPU the max utilisation of each lookback bucket as a comma-separated string
    (empty: no sample in the bucket); :func:`gpu_cost.perceive.snapshot.sparkline` draws it."""
    return _by_rows(_chart_buckets, times, util, now=now, lookback=lookback, buckets=buckets)


def _chart_buckets(times: np.ndarray, util: np.ndarray, *, now: float, lookback: float, buckets: int) -> list[str]:
    n_g = util.shape[0]
    if not len(times) or not n_g:
        return [""] * n_g
    edges = now - lookback + lookback * np.arange(buckets + 1) / buckets
    idx = np.clip(np.searchsorted(edges, times, side="left") - 1, 0, buckets - 1)
    out = np.full((n_g, buckets), np.nan)
    # times are sorted, so each bucket is a run of columns: one fmax (NaN-skipping max) per run
    present, first = np.unique(idx, return_index=True)
    out[:, present] = np.fmax.reduceat(util, first, axis=1)
    return chart_text(out)


#: chart text by the bytes of its rounded row: most GPUs show the same few charts sweep after sweep
_CHART_TEXT: dict[bytes, str] = {}
#: the most charts any cache of them holds (this one, and the parsed charts and sparklines of
#: :mod:`gpu_cost.perceive.snapshot`): a sweep of 1,000 GPUs shows at most 1,000, and a week's replay sees
#: hundreds of thousands, a few hundred bytes each, that it never reads again
CHART_CACHE = 16_384


def chart_text(maxima: np.ndarray) -> list[str]:
    """Return each row of bucket maxima as the chart column's text: ``"0,0,85,,0"`` (empty: no data)."""
    with np.errstate(invalid="ignore"):
        rounded = np.where(np.isnan(maxima), -1.0, np.rint(maxima)).astype(np.int64)  # rint: round()'s half-even
    if len(_CHART_TEXT) > CHART_CACHE:
        _CHART_TEXT.clear()
    out = []
    for row in rounded:
        key = row.tobytes()
        text = _CHART_TEXT.get(key)
        if text is None:
            text = _CHART_TEXT[key] = ",".join(["" if v < 0 else str(v) for v in row.tolist()])
        out.append(text)
    return out


def extra_window(
    times: np.ndarray, util: np.ndarray, mem: np.ndarray, now: float, window_s: float, sample_interval_s: float,
    min_sample_ratio: float, max_staleness_s: float, rolling: RollingWindows | None = None, cleaned: bool = False,
    last_ts: np.ndarray | None = None,
) -> pd.DataFrame:
    """Return the window columns for another window length (rules with their own window; ``last_ts``: as
    :func:`gpu_frame`'s).

    They carry no ``power_w`` (:data:`WINDOW_COLUMNS`): a rule judging over a window of its own reads the GPUs'
    power over the primary window, the recent draw that says they work now."""
    if rolling is not None:
        w = rolling.window(times, now, window_s, sample_interval_s, min_sample_ratio, max_staleness_s)
    else:
        if not cleaned:
            util, mem = clean(util, mem)
            last_ts = None
        w = window_stats(times, util, mem, now, window_s, sample_interval_s, min_sample_ratio, max_staleness_s,
                         last_ts=last_ts)
    return pd.DataFrame({col: w[col] for col in WINDOW_COLUMNS})


class RollingWindows:
    """Running sums along the time axis of a whole clean GPU × time matrix, for windows that slide over it.

    A window's sample count, utilisation sum, busy samples and idle→busy transitions are two
    subtractions of these sums, whatever its length; its maxima and minima (exact, no rounding to
    accumulate) are one NaN-skipping pass over its own columns. The replay slides the sweep's
    lookback along a week of samples this way instead of aggregating it again at every sweep: the
    aggregates are :func:`window_stats`' and :func:`lookback_stats`' (means equal to the last bits
    of rounding). A slice passed to :meth:`window` / :meth:`lookback` is a run of this matrix's
    columns, told apart by its times.

    :param times: the sorted sample times (columns).
    :param util: utilisation, already :func:`clean`; edits to it must be followed by :meth:`refresh`.
    :param mem: framebuffer used, already :func:`clean`.
    :param busy_util: the busy level of :func:`lookback_stats`.
    :param power: the GPUs' power draw (any float type; a trace's ``power_w``), averaged over a window as
        :func:`window_stats` averages it; no running sums (the window is short), so an edit needs no refresh.
    """

    def __init__(self, times: np.ndarray, util: np.ndarray, mem: np.ndarray, busy_util: float,
                 power: np.ndarray | None = None) -> None:
        self.times, self.util, self.mem, self.busy_util, self.power = times, util, mem, busy_util, power
        shape = (util.shape[0], util.shape[1] + 1)
        self._n = np.zeros(shape, dtype=np.int32)
        self._sum = np.zeros(shape)
        self._busy = np.zeros(shape, dtype=np.int32)
        self._bursts = np.zeros((util.shape[0], max(1, util.shape[1])), dtype=np.int32)
        self._last = np.zeros(util.shape, dtype=np.int32)
        self.refresh(np.arange(util.shape[0]))

    def refresh(self, rows: np.ndarray) -> None:
        """Recompute the sums of ``rows`` after their samples changed."""
        for r in np.asarray(rows, dtype=np.int64):
            u = self.util[r]
            valid = ~np.isnan(u)
            busy = valid & (u > self.busy_util)
            np.cumsum(valid, out=self._n[r, 1:])
            np.cumsum(np.where(valid, u, 0.0), out=self._sum[r, 1:])
            np.cumsum(busy, out=self._busy[r, 1:])
            # the transition from column j to j + 1 is counted at j + 1
            np.cumsum(valid[:-1] & (u[:-1] < self.busy_util / 4.0) & busy[1:], out=self._bursts[r, 1:])
            last = np.where(valid, np.arange(len(u), dtype=np.int32), -1).astype(np.int32)
            np.maximum.accumulate(last, out=self._last[r])

    def _start(self, times: np.ndarray) -> int:
        """Return the column of this matrix where the slice ``times`` starts."""
        return int(np.searchsorted(self.times, times[0], side="left")) if len(times) else 0

    def window(self, times: np.ndarray, now: float, window_s: float, sample_interval_s: float,
               min_sample_ratio: float, max_staleness_s: float) -> dict[str, np.ndarray]:
        """Return :func:`window_stats` for the columns of ``times`` (a slice of this matrix's)."""
        lo = self._start(times)
        upto = lo + int(np.searchsorted(times, now, side="right"))
        wlo = lo + int(np.searchsorted(times, now - window_s, side="right"))
        n_g = self.util.shape[0]
        n = self._n[:, upto] - self._n[:, wlo] if upto > wlo else np.zeros(n_g, dtype=np.int32)
        nan = np.full(n_g, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(n > 0, (self._sum[:, upto] - self._sum[:, wlo]) / n, np.nan) if upto > wlo else nan
        expected = max(1, round(window_s / sample_interval_s))
        if upto > lo:
            last = self._last[:, upto - 1]
            last_ts = np.where(last >= lo, self.times[np.maximum(last, 0)], np.nan)
        else:
            last_ts = nan.copy()
        return {
            "util_mean": mean,
            "util_max": np.fmax.reduce(self.util[:, wlo:upto], axis=1) if upto > wlo else nan.copy(),
            "mem_min_mib": np.fmin.reduce(self.mem[:, wlo:upto], axis=1) if upto > wlo else nan.copy(),
            "mem_max_mib": np.fmax.reduce(self.mem[:, wlo:upto], axis=1) if upto > wlo else nan.copy(),
            "power_w": self._power(wlo, upto) if upto > wlo and self.power is not None else nan.copy(),
            "n_samples": n.astype(np.int64),
            "expected_samples": np.full(n_g, expected, dtype=np.int64),
            "last_ts": last_ts,
            "stale": (n < min_sample_ratio * expected) | ~(now - np.nan_to_num(last_ts, nan=-np.inf) <= max_staleness_s),
        }

    def _power(self, wlo: int, upto: int) -> np.ndarray:
        """Each GPU's mean power over the columns ``wlo:upto`` (NaN where none was read), summed in double precision."""
        assert self.power is not None
        p = self.power[:, wlo:upto]
        valid = ~np.isnan(p)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.add.reduce(p, axis=1, where=valid, dtype=np.float64) / np.count_nonzero(valid, axis=1)

    def lookback(self, times: np.ndarray, now: float, lookback_s: float, busy_util: float) -> dict[str, np.ndarray]:
        """Return :func:`lookback_stats` for the columns of ``times`` (a slice of this matrix's)."""
        if busy_util != self.busy_util:
            raise ValueError(f"these running sums count busy above {self.busy_util}, not {busy_util}")
        lo = self._start(times)
        upto = lo + int(np.searchsorted(times, now, side="right"))
        lo = lo + int(np.searchsorted(times, now - lookback_s, side="right"))
        n_g = self.util.shape[0]
        if upto <= lo:
            nan = np.full(n_g, np.nan)
            zero = np.zeros(n_g, dtype=np.int64)
            return {"util_mean_lb": nan, "util_max_lb": nan.copy(), "busy_share_lb": nan.copy(), "bursts_lb": zero,
                    "n_lb": zero.copy()}
        n = self._n[:, upto] - self._n[:, lo]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(n > 0, (self._sum[:, upto] - self._sum[:, lo]) / n, np.nan)
            share = np.where(n > 0, (self._busy[:, upto] - self._busy[:, lo]) / np.maximum(n, 1), np.nan)
        bursts = (self._bursts[:, upto - 1] - self._bursts[:, lo]) if upto - lo > 1 else np.zeros(n_g, dtype=np.int64)
        return {"util_mean_lb": mean, "util_max_lb": np.fmax.reduce(self.util[:, lo:upto], axis=1),
                "busy_share_lb": share, "bursts_lb": bursts.astype(np.int64), "n_lb": n.astype(np.int64)}


#: GPUs whose own sampling step is measured (their consecutive samples' median gap), spread over the fleet
STEP_GPUS = 64
#: the intervals exporters and scrapes are set to, in seconds: a measured step within 5 % of one is taken as it
NOMINAL_STEPS = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1800, 3600)


def sorted_factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ``np.unique(values, return_inverse=True)`` for many rows of few distinct values (sample times):
    hashed once, then only the distinct values are sorted."""
    codes, uniq = pd.factorize(values, use_na_sentinel=False)
    order = np.argsort(uniq, kind="stable")
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[order] = np.arange(len(uniq))
    return np.asarray(uniq)[order], rank[codes]


def sample_steps(ts: np.ndarray, row: np.ndarray, step: float | None = None,
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, float | None]:
    """Return ``(times, col, keep, step)``: the matrix's sample times, each sample's column in it, which samples
    to keep (None: all) and the step the times were put on (None: they were not). ``step``: read the samples at
    this step whatever theirs (:func:`coarse_step`).

    A trace's GPUs are rarely sampled at one instant: each host's exporter runs on its own clock, and a
    scrape or an ``nvidia-smi`` loop drifts by a second or two. Taken as they come, every GPU would then
    have its own column of a matrix whose other GPUs read "no sample", every window would look nearly
    empty, and runs of samples (bursts, a steady load) would be cut into pieces. When the distinct times'
    median gap is under half the GPUs' own step (the median gap between one GPU's consecutive samples a
    step apart, over :data:`STEP_GPUS` GPUs: one of :data:`NOMINAL_STEPS` when within 5 % of it, else in
    whole seconds), each sample is read at the nearest whole multiple of that step since the epoch, as a
    Prometheus range query aligns its steps, once its GPU's own phase is taken off (:func:`clock_offsets`); of a
    GPU's samples that land on one step, the latest is kept. GPUs that would lose 40 % of their samples so, at a
    regular shorter step, are a pool sampled faster than the rest: the step is then theirs. Times that line up
    already (a Prometheus range query, the simulator) are taken as they are. Either way, when the times are whole
    steps apart with whole steps missing (an interval changed, an outage), every step gets a column (:func:`_on_grid`).
    """
    times, col = sorted_factorize(ts)
    if len(times) < 3:
        return times, col, None, None
    rows = int(row.max()) + 1
    forced = step is not None
    if step is None:
        chosen = np.zeros(rows, dtype=bool)
        chosen[::max(1, rows // STEP_GPUS)] = True  # GPUs from all over the fleet
        step = _own_step(times, col, row, chosen[row])
        if step is None:
            return times, col, None, None
        if float(np.median(np.diff(times))) >= step / 2:
            times, col = _on_grid(times, col, step)
            return times, col, None, None
    while True:
        grid, cells = sorted_factorize(np.rint((ts - clock_offsets(ts, row, step)) / step) * step)
        # of one GPU's samples on one step the latest: the last of each (row, column) once ordered by time
        flat = row.astype(np.int64) * len(grid) + cells
        order = np.lexsort((ts, flat))
        last = np.ones(len(order), dtype=bool)
        last[:-1] = flat[order][1:] != flat[order][:-1]
        keep = np.zeros(len(ts), dtype=bool)
        keep[order[last]] = True
        # GPUs that lost 40 % of their samples so, at a regular shorter step, are sampled faster than the step (a
        # pool scraped every 15 s among GPUs scraped every 60 s): their bursts would be lost, so the step is theirs.
        # A second sample now and then (two exporters a second apart) is kept to one, as above.
        fast = np.bincount(row[~keep], minlength=rows) * 5 >= np.bincount(row, minlength=rows) * 2
        finer = _own_step(times, col, row, fast[row], regular=True) if fast.any() and not forced else None
        if finer is None or finer >= step:
            moved = not keep.all() or not np.array_equal(grid[cells], ts)  # aligned but for a faster pool: as given
            grid, cells = _on_grid(grid, cells, step)
            return grid, cells, (None if keep.all() else keep), (step if moved else None)
        step = finer


#: GPU × time cells a replay's matrices may hold (about 80 bytes each, over them all: some 2 GB)
MAX_CELLS = 25_000_000


def coarse_step(times: np.ndarray, n_rows: int) -> float | None:
    """Return the step to read a trace of ``n_rows`` GPUs at, its sample ``times`` (sorted) giving more than
    :data:`MAX_CELLS` cells, else None: the least of :data:`NOMINAL_STEPS` that fits.

    A trace sampled every second (or every 100 ms, as a job's own ``nvidia-smi`` loop writes) over a week of a
    hundred GPUs would be 60 million cells, several GB of matrices: the replay would be killed for memory, with
    nothing said. Read at a coarser step instead, each GPU's latest sample of the step stands for it, as an
    exporter scraped at that step reads the GPU's newest value.
    """
    if not n_rows or n_rows * len(times) <= MAX_CELLS:
        return None
    span = float(times[-1] - times[0])
    fits = [s for s in NOMINAL_STEPS if n_rows * (span / s + 1) <= MAX_CELLS]
    return float(fits[0] if fits else NOMINAL_STEPS[-1])


def _own_step(times: np.ndarray, col: np.ndarray, row: np.ndarray, which: np.ndarray, *,
              regular: bool = False) -> float | None:
    """Return the step the samples ``which`` (a mask) of their GPUs are taken at (None: no GPU has two; with
    ``regular``, also None unless most of their gaps are that step: not a sample and its double a second apart)."""
    pick = np.flatnonzero(which)
    r, c = row[pick], col[pick]
    order = np.lexsort((c, r))
    r, c = r[order], c[order]
    gaps = np.diff(times[c])[r[1:] == r[:-1]]
    gaps = gaps[gaps > 0]
    if not len(gaps):
        return None
    if regular:
        step = float(np.median(gaps))
        if np.count_nonzero(np.abs(gaps - step) <= 0.2 * step) < 0.6 * len(gaps):
            return None
        gaps = gaps[np.abs(gaps - step) <= 0.2 * step]
    # the gaps of one step (a missed sample makes one of two or more): the median of those under 1.5 times the
    # lower quartile, which lies among them while at most half the samples are missing; a sample written twice a
    # moment apart (two exporters) makes a gap under a third of the median, not a step (a pool truly sampled faster
    # sets the step afterwards, in sample_steps)
    gaps = gaps[gaps >= np.median(gaps) / 3]
    gaps = gaps[gaps < 1.5 * np.percentile(gaps, 25)]
    step = float(np.median(gaps))
    nominal = min(NOMINAL_STEPS, key=lambda n: abs(n - step))
    return float(nominal) if abs(nominal - step) <= 0.05 * nominal else max(1.0, float(np.rint(step)))


def _on_grid(times: np.ndarray, col: np.ndarray, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(times, col)`` with a column for every ``step`` from the first time to the last, where the times are
    whole steps apart but some steps have no sample of any GPU: the whole fleet scraped every 60 s for a while, then
    every 30 s (the interval changed), or an outage. Each window then counts the samples the step promises, and
    :func:`held_cells` sees the slower spans. Times off the step, or a grid over twice the columns, are left as they
    are."""
    k = (times - times[0]) / step
    whole = np.rint(k)
    n = int(whole[-1]) + 1
    if n == len(times) or n > 2 * len(times) or not np.allclose(k, whole, rtol=0.0, atol=1e-6):
        return times, col
    at = whole.astype(np.int64)
    grid = times[0] + np.arange(n) * step
    grid[at] = times  # the times as given, to the last bit
    return grid, at[col]


#: seconds a Prometheus query reads a series' last sample for (its default ``--query.lookback-delta``)
LOOKBACK_DELTA_S = 300.0
#: the share of a GPU's gaps between samples that must be one whole number of steps for it to be read as
#: sampled at that slower step (:func:`held_cells`); a GPU losing samples at random has gaps of every length
SLOW_REGULAR_SHARE = 0.8


def held_cells(flat: np.ndarray, n_rows: int, times: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[int, int]]:
    """Return ``(cells, src, slow)``: further cells of a GPU × time matrix (``n_rows`` by ``len(times)``, the sample
    times) each to hold sample ``src`` (an index into ``flat``, each sample's cell), and ``slow``: row → its own step
    in columns, for the GPUs sampled at a whole multiple of the matrix's step.

    A fleet's exporters need not share one interval: a node pool scraped every 60 s beside one scraped every
    30 s. On the 30 s matrix the slow GPUs would have a sample every other column, every window would be half
    empty, and the sweep would read them as stale: no rule would judge them, and no class baseline would learn
    from them (a service whose peers vanish from its class is then judged alone). A Prometheus range query at the
    30 s step reads such a series as a Prometheus sweep does: each sample stands until the next. So does this: a
    GPU whose gaps between samples are, for at least :data:`SLOW_REGULAR_SHARE` of them, one whole number ``k >=
    2`` of columns has each sample held in the ``k - 1`` columns after it, up to its next sample, and for no longer
    than Prometheus holds a sample (:data:`LOOKBACK_DELTA_S`): a series scraped every 10 minutes reads as half
    empty here as in a live sweep. A GPU whose samples are lost at random has gaps of many lengths and keeps its
    holes: missing data stays missing.
    """
    none = np.zeros(0, dtype=np.int64)
    n_cols = len(times)
    if not len(flat) or n_cols < 3:
        return none, none, {}
    step = float(np.median(np.diff(times)))
    hold = int(LOOKBACK_DELTA_S // step)
    # judged an hour (at least 20 columns) at a time: a scrape interval changed mid-trace is followed
    span = max(20, int(OFFSET_SPAN_S // step))
    n_spans = -(-n_cols // span)
    has = np.zeros(n_rows * n_cols, dtype=bool)
    has[flat] = True
    count = np.add.reduceat(has.reshape(n_rows, n_cols), np.arange(0, n_cols, span), axis=1, dtype=np.int64).ravel()
    del has
    sparse = (count >= 3) & (count * 4 <= 3 * span)  # at most three samples in four columns
    if not sparse.any():
        return none, none, {}
    row = flat // n_cols
    key = row * n_spans + (flat % n_cols) // span
    idx = np.flatnonzero(sparse[key])
    idx = idx[np.argsort(flat[idx], kind="stable")]  # by row, then column
    r, c, kk = row[idx], flat[idx] % n_cols, key[idx]
    same = np.r_[r[1:] == r[:-1], False]  # a sample followed by its row's next
    gap = np.where(same, np.r_[c[1:], 0] - c, 0)
    pairs, counts = np.unique(np.stack([kk[same], gap[same]]), axis=1, return_counts=True)
    gaps_of = np.bincount(kk[same], minlength=n_rows * n_spans)
    k_of = np.zeros(n_rows * n_spans, dtype=np.int64)
    regular = (pairs[1] >= 2) & (counts >= SLOW_REGULAR_SHARE * gaps_of[pairs[0]])
    k_of[pairs[0][regular]] = pairs[1][regular]
    k = k_of[kk]
    if not k.any():
        return none, none, {}
    slow: dict[int, int] = {}
    for g_row, own in zip(r[k > 0].tolist(), k[k > 0].tolist(), strict=True):
        slow.setdefault(g_row, own)
    k = np.minimum(k, hold + 1)
    nxt = np.where(same, np.r_[c[1:], 0], n_cols)  # the row's next sample's column (or the end)
    cells, src = [none], [none]
    for j in range(1, int(k.max())):
        to = c + j
        ok = (j < k) & (to < nxt)
        cells.append(r[ok] * n_cols + to[ok])
        src.append(idx[ok])
    return np.concatenate(cells), np.concatenate(src), slow


def slow_note(slow: Mapping[int, int], times: np.ndarray) -> str:
    """Return the replay's note on :func:`held_cells`' ``slow`` GPUs (row → own step in columns)."""
    step = float(np.median(np.diff(times)))
    own = sorted({k * step for k in slow.values()})
    return (f"{len(slow)} GPU(s) sampled every {', '.join(f'{x:g}' for x in own[:3])}s for some or all of the "
            f"trace, slower than its {step:g}s: each of their samples is read until the next, for at most "
            f"{LOOKBACK_DELTA_S:g}s, as a Prometheus query at the trace's step reads it")


#: seconds over which one GPU's clock offset from the step is taken as constant (:func:`clock_offsets`)
OFFSET_SPAN_S = 3600.0


def clock_offsets(ts: np.ndarray, row: np.ndarray, step: float) -> np.ndarray:
    """Return each sample's offset from the nearest whole ``step``, as its GPU's samples of that hour agree on it.

    A host's exporter samples at its own phase of the step: a scrape target's offset, a loop started at boot.
    Rounding each sample alone fails where that phase is near half a step: 14.9 s on a 30 s step, with a second
    of jitter, rounds one sample down and the next up, and two samples land on one step (one is lost) beside a
    step with none. The phase is instead taken per GPU, as the circular mean of its samples' places in the step
    (a phase of 29 s and one of 1 s are 2 s apart), over spans of :data:`OFFSET_SPAN_S` (at least 20 steps), so an
    exporter restarted at another phase is followed, each span's phase taken as the change from the span before;
    each sample is then rounded after its GPU's phase is taken off, and the GPU's consecutive samples stay on
    consecutive steps.
    """
    span = max(OFFSET_SPAN_S, 20.0 * step)
    chunk = np.floor(ts / span).astype(np.int64)
    chunk -= int(chunk.min())
    spans = int(chunk.max()) + 1
    keys, code = sorted_factorize(row.astype(np.int64) * spans + chunk)
    angle = (2.0 * np.pi / step) * np.mod(ts, step)
    phase = np.arctan2(np.bincount(code, weights=np.sin(angle)), np.bincount(code, weights=np.cos(angle)))
    # keys are in order of GPU, then span: each span's phase is its GPU's previous span's plus the change between
    # them, within half a step, so a phase near half a step (+29.9 s in one hour, -29.9 s the next) stays one
    first = np.r_[True, keys[1:] // spans != keys[:-1] // spans]
    change = np.r_[0.0, np.angle(np.exp(1j * np.diff(phase)))]
    change[first] = 0.0
    total = np.cumsum(change)
    starts = np.flatnonzero(first)
    base = np.repeat(phase[starts] - total[starts], np.diff(np.r_[starts, len(keys)]))
    return ((base + total) * (step / (2.0 * np.pi)))[code]


def check_one_sample_per_cell(flat: np.ndarray, size: int, util: np.ndarray, mem: np.ndarray,
                              where: Callable[[int], str]) -> None:
    """Refuse several samples of one GPU at one time that differ (``flat``: each sample's cell of a GPU x time
    matrix of ``size`` cells; ``util``, ``mem``: each sample's values; ``where(i)``: sample ``i`` named).

    The trace format has one row per GPU per sample time. Several at once are MIG instances exported without
    their instance, or two exporters on one GPU: read as one, whichever came last would stand for the GPU, and
    an idle instance would make a busy job's GPU look idle (the replay's false-kill check reads the same
    matrix, so it could not tell). Equal duplicates (two Prometheus replicas) are one sample.
    """
    if not len(flat):
        return
    dtype = np.int64 if len(flat) > np.iinfo(np.int32).max else np.int32
    owner = np.full(size, -1, dtype=dtype)
    owner[flat] = np.arange(len(flat), dtype=dtype)  # of several samples in one cell, one owns it

    def differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return ~((a == b) | (np.isnan(a) & np.isnan(b)))

    bad: list[np.ndarray] = []
    for lo in range(0, len(flat), 1 << 20):  # a million samples at a time: a week's trace is ten million
        winner = owner[flat[lo:lo + (1 << 20)]]
        lost = np.flatnonzero(winner != np.arange(lo, lo + len(winner), dtype=dtype))
        if len(lost):
            other, mine = winner[lost], lost + lo
            d = differ(util[mine], util[other]) | differ(mem[mine], mem[other])
            bad.append(np.stack([mine[d], other[d]]))
    del owner
    pairs = np.concatenate(bad, axis=1) if bad else np.zeros((2, 0), dtype=np.int64)
    if pairs.shape[1]:
        i, j = int(pairs[0, 0]), int(pairs[1, 0])
        raise TraceError(
            f"{pairs.shape[1]} sample(s) share their GPU and time with another that differs ({where(i)}: util "
            f"{util[i]:g} and {util[j]:g}, memory {mem[i]:g} and {mem[j]:g} MiB): the trace format has one row per "
            "GPU per sample time. MIG instances exported without their instance, or two exporters on one GPU? "
            "Keep one series per GPU")


def to_dense(samples: pd.DataFrame, start: float, end: float) -> tuple[pd.DataFrame, np.ndarray, dict[str, np.ndarray]]:
    """Pivot long trace samples in ``(start, end]`` to a dense matrix.

    Return ``(gpu_index, times, arrays)`` where ``gpu_index`` has ``host, gpu`` (and ``uuid``,
    ``mem_total_mib``, ``job_id`` when the samples carry them) per row, ``times`` the sorted
    distinct sample times, and ``arrays`` ``util``, ``mem``, ``power``, ``job`` (GPU × time).
    """
    s = samples[(samples["ts"] > start) & (samples["ts"] <= end)]
    keys = s[["host", "gpu"]].drop_duplicates().sort_values(["host", "gpu"]).reset_index(drop=True)
    if s.empty:
        empty = np.zeros((len(keys), 0))
        return keys, np.zeros(0), {"util": empty, "mem": empty, "power": empty, "job": empty.astype(object)}
    row_of = pd.MultiIndex.from_frame(keys).get_indexer(pd.MultiIndex.from_frame(s[["host", "gpu"]]))
    times, col_of, keep, _ = sample_steps(s["ts"].to_numpy(dtype=float), row_of)
    if keep is not None:
        s, row_of, col_of = s[keep], row_of[keep], col_of[keep]
    shape = (len(keys), len(times))
    check_one_sample_per_cell(
        row_of.astype(np.int64) * shape[1] + col_of, shape[0] * shape[1],
        pd.to_numeric(s["util"], errors="coerce").to_numpy(dtype=float),
        pd.to_numeric(s["mem_used_mib"], errors="coerce").to_numpy(dtype=float),
        lambda i: f"{s['host'].iloc[i]} GPU {s['gpu'].iloc[i]} at {iso(float(s['ts'].iloc[i]))}")

    flat = row_of.astype(np.int64) * shape[1] + col_of
    held, held_src, _ = held_cells(flat, shape[0], times)  # a GPU sampled slower: each sample until its next

    def put(out: np.ndarray, values: np.ndarray) -> np.ndarray:
        out.ravel()[flat] = values
        out.ravel()[held] = values[held_src]
        return out

    def fill(col: str, default: float = np.nan) -> np.ndarray:
        out = np.full(shape, default)
        if col in s.columns:
            put(out, pd.to_numeric(s[col], errors="coerce").to_numpy(dtype=float))
        return out

    arrays = {"util": fill("util"), "mem": fill("mem_used_mib"), "power": fill("power_w")}
    job = np.full(shape, "", dtype=object)
    if "job_id" in s.columns:
        put(job, s["job_id"].astype(object).fillna("").astype(str).to_numpy())  # categories too
    arrays["job"] = job
    last = s.sort_values("ts").groupby(["host", "gpu"], sort=True).last().reset_index()
    for col in ("uuid", "mem_total_mib", "model"):
        if col in last.columns:
            keys[col] = last[col].to_numpy()
    return keys, times, arrays


def last_label(job: np.ndarray, util: np.ndarray, mem: np.ndarray) -> np.ndarray:
    """Return, per GPU row, the job label of its newest sample ("" when none), the columns in time order.

    That is the last column's, but for a row with no sample there (no utilisation or memory reading: a
    missed scrape, or another host's clock when the times were put on one step) it is the label of the
    newest column the row has a sample in: the job the exporter last saw, not "no job". ``job`` may hold
    only the newest of the columns of ``util`` and ``mem`` (a replay hands the last one).
    """
    n, m = job.shape
    if m == 0:
        return np.full(n, "", dtype=object)
    util, mem = util[:, util.shape[1] - m:], mem[:, mem.shape[1] - m:]  # the columns the labels are of
    label = job[:, -1]
    gone = np.flatnonzero(np.isnan(util[:, -1]) & np.isnan(mem[:, -1]))
    if len(gone):
        present = ~(np.isnan(util[gone]) & np.isnan(mem[gone]))
        has = present.any(axis=1)
        newest = m - 1 - np.argmax(present[:, ::-1], axis=1)
        label = label.copy()
        label[gone[has]] = job[gone[has], newest[has]]
    return label


def windows_needed(windows: Iterable[float]) -> list[float]:
    return sorted({float(w) for w in windows})
