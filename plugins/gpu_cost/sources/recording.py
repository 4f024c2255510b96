"""Prometheus recording rules for the sweep's aggregates, and the PromQL that reads them.

Without rules, every sweep resamples each GPU's raw DCGM series over the whole lookback (6 h of
1-minute steps, every exporter dialect, ~20 aggregates): at 10,000 GPUs that is millions of
samples every five minutes. With the rules below, Prometheus keeps, at the sample interval:

- **per sample** (one group, ``gpu_cost``, whose later rules read the earlier ones of the same
  evaluation): the sweep's own normalised series, one per GPU
  (labels ``host``, ``gpu``, ``UUID`` and a MIG slice's ``GPU_I_ID`` only): utilisation % (``gpu_cost:gpu_util:pct``, the first
  dialect present, invalid values dropped, exactly :meth:`Dialects.util`), busy (0/1), idle→busy
  bursts, framebuffer used, its sample time, and power;
- **per chunk** (``CHUNK`` = 30 min): the last 30 samples' utilisation sum, count and max, busy
  sum, burst count, framebuffer count, min, max, Σy, Σy², and its time moments Σ(t-T), Σ(t-T)²,
  Σ(t-T)·y about the evaluation time T, and the first and last sample time.

The source then reads the lookback (and the windows of whole chunks) as twelve 30-minute chunks,
one subquery per part whose steps land on the rules' own evaluations: sums, counts, extremes and
the memory's time moments add up in PromQL, means, variances and the slope are finished in Python
(:func:`finish`). A sweep touches ~272 samples per GPU instead of ~4,960, and Prometheus spends a
small fraction of the time (``docs/benchmarks.md``). The answers are the raw path's (the
integration test holds both equal on the same data, to float rounding): the sweep reads the
recorded series as of the rules' last evaluation after the grid step, which on a live Prometheus
is the same aggregate taken up to one interval later.

The source uses the rules only when they fit: the info series ``gpu_cost:recording_rules:info``
(labels ``step``, ``busy_util``, ``chunk``, ``selector``) must exist now *and* one lookback ago
(rules added an hour ago know nothing of the five before), and its labels must equal the
policy's ``sweep.sample_interval``, ``sweep.busy_util`` and the connection's ``selector``.
Otherwise it queries raw series, as before. It asks in a small ``rules`` query of two series
before the others (which then go out at the same time, as of the rules' last evaluation).

The shipped file ``deploy/prometheus/gpu-cost.rules.yml`` holds the rules for the default policy
and no selector; for another one, write it with::

    python -m gpu_cost.sources.recording --busy-util 30 --selector 'job="dcgm"' > gpu-cost.rules.yml

(one set of rules per Prometheus: the recorded series carry no selector label).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_cost.sources.prometheus import KEY_LABELS, Dialects, _dur, _stat, _union

#: the default policy's sweep.sample_interval and sweep.busy_util (the shipped rules fit it)
STEP = 60.0
BUSY_UTIL = 20.0
#: one chunk of the lookback: the default lookback (6 h) is 12 chunks, one per chart bucket
CHUNK = 1800.0
SHIPPED = "deploy/prometheus/gpu-cost.rules.yml"
REGENERATE = "python -m gpu_cost.sources.recording > deploy/prometheus/gpu-cost.rules.yml"

INFO = "gpu_cost:recording_rules:info"
UTIL = "gpu_cost:gpu_util:pct"
BUSY = "gpu_cost:gpu_util_busy:bool"
BURST = "gpu_cost:gpu_util_burst:pct"
MEM = "gpu_cost:gpu_fb_used:mib"
MEM_T = "gpu_cost:gpu_fb_used:timestamp"
POWER = "gpu_cost:gpu_power:watts"
#: the labels a recorded series keeps: the source's device key (a MIG slice's GPU_I_ID with its GPU's)
KEY = ", ".join(KEY_LABELS)


def _tag(seconds: float) -> str:
    return f"{seconds / 60:g}m" if seconds % 60 == 0 else f"{seconds:g}s"


def chunk_series(metric: str, op: str, chunk: float = CHUNK) -> str:
    """Return the name of a per-chunk series: ``gpu_cost:<metric>:<op>_<chunk>`` (e.g. ``gpu_cost:gpu_util:sum_30m``)."""
    return f"gpu_cost:{metric}:{op}_{_tag(chunk)}"


def _num(x: float) -> str:
    return f"{x:g}"


# ---------------------------------------------------------------------------------------------
# the rules


def recording_rules(step: float = STEP, busy: float = BUSY_UTIL, chunk: float = CHUNK,
                    selector: str = "") -> dict[str, Any]:
    """Return the rule file (as data) for a policy's ``sample_interval``/``busy_util`` and a GPU selector."""
    if chunk % step:
        raise ValueError(f"the chunk ({chunk:g}s) must be a whole number of steps ({step:g}s)")
    d = Dialects(selector)
    prev = Dialects(selector, offset=step)
    util, mem = d.util(), d.mem_used()
    info_labels = {"step": _num(step), "busy_util": _num(busy), "chunk": _num(chunk)}
    if selector:
        info_labels["selector"] = selector
    samples = [
        {"record": INFO, "expr": "vector(1)", "labels": info_labels},
        {"record": UTIL, "expr": util},
        {"record": BUSY, "expr": f"({util}) > bool {busy:g}"},
        {"record": BURST, "expr": f"(({util}) > {busy:g}) and (({prev.util()}) < {busy / 4.0:g})"},
        {"record": MEM, "expr": mem},
        {"record": MEM_T, "expr": f"timestamp({mem})"},
        {"record": POWER, "expr": d.power()},
    ]
    r = f"{round(chunk * 1000) - 1}ms"  # (T - chunk, T]: chunks tile the lookback, whatever the phase
    c = lambda metric, op: chunk_series(metric, op, chunk)  # noqa: E731
    n, mean = f"count_over_time({MEM}[{r}])", f"avg_over_time({MEM}[{r}])"
    dt = f"(avg_over_time({MEM_T}[{r}]) - time())"  # the samples' mean time, from this evaluation
    tvar = f"stdvar_over_time({MEM_T}[{r}])"
    chunks = [
        {"record": c("gpu_util", "sum"), "expr": f"sum_over_time({UTIL}[{r}])"},
        {"record": c("gpu_util", "count"), "expr": f"count_over_time({UTIL}[{r}])"},
        {"record": c("gpu_util", "max"), "expr": f"max_over_time({UTIL}[{r}])"},
        {"record": c("gpu_util_busy", "sum"), "expr": f"sum_over_time({BUSY}[{r}])"},
        {"record": c("gpu_util_burst", "count"), "expr": f"count_over_time({BURST}[{r}])"},
        {"record": c("gpu_fb_used", "count"), "expr": n},
        {"record": c("gpu_fb_used", "min"), "expr": f"min_over_time({MEM}[{r}])"},
        {"record": c("gpu_fb_used", "max"), "expr": f"max_over_time({MEM}[{r}])"},
        # moments about this evaluation's time T, as the sweep puts chunks together: Σy, Σy²,
        # Σ(t-T), Σ(t-T)², Σ(t-T)y (from the mean and (co)variance: exact for a constant memory;
        # a chunk of one sample has no slope, its covariance is 0)
        {"record": c("gpu_fb_used", "sum"), "expr": f"sum_over_time({MEM}[{r}])"},
        {"record": c("gpu_fb_used", "sumsq"), "expr": f"{n} * (stdvar_over_time({MEM}[{r}]) + {mean} ^ 2)"},
        {"record": c("gpu_fb_used", "tsum"), "expr": f"{n} * {dt}"},
        {"record": c("gpu_fb_used", "tsumsq"), "expr": f"{n} * ({tvar} + {dt} ^ 2)"},
        {"record": c("gpu_fb_used", "tysum"),
         "expr": f"{n} * ((deriv({MEM}[{r}]) * {tvar} or {n} * 0) + {dt} * {mean})"},
        {"record": c("gpu_fb_used_timestamp", "min"), "expr": f"min_over_time({MEM_T}[{r}])"},
        {"record": c("gpu_fb_used_timestamp", "max"), "expr": f"max_over_time({MEM_T}[{r}])"},
    ]
    # one group: its rules run in order at one evaluation time, so a chunk rule sees the
    # per-sample values of the same evaluation, and every series shares one phase
    return {"groups": [{"name": "gpu_cost", "interval": _tag(step), "rules": samples + chunks}]}


def rules_yaml(**kwargs: Any) -> str:
    """Return the rule file as YAML text, with a header saying where it comes from."""
    import yaml

    head = ("# Recording rules for GPU Cost Agent's sweep: generated by gpu_cost.sources.recording\n"
            f"# (regenerate with `{REGENERATE}`).\n"
            "# They keep, at the sample interval, each GPU's normalised utilisation, memory and power and\n"
            "# their 30-minute aggregates, so a sweep reads ~12 samples per GPU and aggregate instead of the\n"
            "# whole lookback of raw DCGM series. The agent uses them only when the info series' labels match\n"
            "# its policy (sweep.sample_interval, sweep.busy_util) and connection selector.\n")
    return head + yaml.safe_dump(recording_rules(**kwargs), sort_keys=False, width=100000)


# ---------------------------------------------------------------------------------------------
# reading them


@dataclass(frozen=True)
class Plan:
    """How a sweep reads the recorded series: as of ``at`` (the rules' last evaluation), from chunks or samples."""

    at: float
    chunk: float | None

    @property
    def mode(self) -> str:
        return "chunks" if self.chunk else "samples"


def plan(rows: Sequence[Any], *, step: float, busy: float, lookback: float, selector: str,
         at: float, now: float) -> Plan | None:
    """Return how to read the recorded series, or None when the raw ones must be read.

    ``rows`` are the ``current`` query's samples with ``stat`` ``rules`` (value: the info series'
    newest sample time) and ``rules_since`` (the info series one lookback ago). The rules must fit
    the policy and the selector, be older than the lookback, and have run since the grid step
    ``at`` (a Prometheus whose rule evaluation lags behind is read raw).
    """
    def labels(r: Any) -> dict[str, str]:
        return {k: v for k, v in r.metric.items() if k not in ("stat", "__name__")}

    since = [labels(r) for r in rows if r.metric.get("stat") == "rules_since"]
    for r in rows:
        if r.metric.get("stat") != "rules":
            continue
        info = labels(r)
        try:
            evaluated = float(r.value[1])
        except ValueError:
            continue
        if info in since and fits(info, step, busy, selector) and at <= evaluated <= now:
            return Plan(evaluated, chunks_fit(info, lookback))
    return None


def fits(info: dict[str, str], step: float, busy: float, selector: str) -> bool:
    """Return True when rules with these info labels give the aggregates of this policy and selector."""
    try:
        return (abs(float(info.get("step", "nan")) - step) < 1e-9 and abs(float(info.get("busy_util", "nan")) - busy) < 1e-9
                and info.get("selector", "") == selector)
    except ValueError:
        return False


def chunks_fit(info: dict[str, str], lookback: float) -> float | None:
    """Return the chunk length when the lookback and each chart bucket are whole chunks, else None."""
    from gpu_cost.aggregate import CHART_BUCKETS

    try:
        chunk = float(info.get("chunk", "nan"))
    except ValueError:
        return None
    if not chunk > 0:
        return None
    bucket = lookback / CHART_BUCKETS
    return chunk if abs(bucket / chunk - round(bucket / chunk)) < 1e-9 and round(bucket / chunk) >= 1 else None


Read = Callable[[str], str]


def _over(agg: str, term: Callable[[Read], str], offsets: Sequence[float]) -> str:
    """``agg by (<KEY>)`` over ``term`` at each offset (each tagged apart, so ``or`` keeps them all).

    ``term`` gets a reader that returns, for a series name, its value of that evaluation exactly
    (``last_over_time(name[1ms] offset o)``): a plain selector would take a value up to five minutes
    older where a series has none (a chunk without bursts), where backfilled rules left no
    staleness marker.
    """
    def reader(shift: str) -> Read:
        return lambda name: f"last_over_time({name}[1ms]{shift})"

    parts = []
    for i, off in enumerate(offsets):
        read = reader(f" offset {_dur(off)}" if off else "")
        parts.append(f'label_replace({term(read)}, "chunk", "{i}", "", "")')
    return f"{agg} by ({KEY}) ({' or '.join(parts)})"


class Chunks:
    """Reads of the per-chunk series as of the rules' evaluation ``at``: ``k`` chunks back, one subquery each.

    A subquery's steps fall on multiples of its step; reading each chunk series ``Δ = at mod
    chunk`` later (a negative offset) lands exactly on the rules' evaluations ``at - j × chunk``,
    and ``last_over_time(…[1ms])`` takes that evaluation's value or none (a plain selector would
    take one up to five minutes older where a chunk has none, e.g. no bursts, and backfilled rules
    leave no staleness marker). Inside, ``time()`` is the step: a chunk's age is ``base - time()``.
    """

    def __init__(self, at: float, chunk: float, k: int) -> None:
        self.chunk_ms = round(chunk * 1000)
        at_ms = round(at * 1000)
        self.delta_ms = at_ms % self.chunk_ms
        self.base = (at_ms - self.delta_ms) / 1000.0
        self.range_ms = (k - 1) * self.chunk_ms + self.delta_ms

    def v(self, name: str) -> str:
        shift = f" offset -{self.delta_ms}ms" if self.delta_ms else ""
        return f"last_over_time({name}[1ms]{shift})"

    def age(self) -> str:
        return f"({self.base!r} - time())"

    def over(self, fn: str, inner: str) -> str:
        return f"{fn}(({inner})[{self.range_ms}ms:{self.chunk_ms}ms])"


def lookback_query_chunked(lookback: float, step: float, chunk: float, at: float) -> str:
    """The lookback's parts from the per-chunk series, for :func:`finish` to turn into the raw query's columns.

    Asked at the rules' evaluation ``at``, chunk ``j`` is the value recorded at ``at - j × chunk``:
    the aggregate of the samples in ``(at - (j+1) chunk, at - j chunk]``, so the chunks tile the
    lookback's samples exactly. Sums, counts and extremes add up here; a chunk's time moments,
    taken about its own evaluation time, are moved to ``at`` on the way (``t - at = (t - T_j) -
    age``). Means, variances and the slope are left to :func:`finish`.
    """

    ch = Chunks(at, chunk, round(lookback / chunk))

    def c(metric: str, op: str) -> str:
        return chunk_series(metric, op, chunk)

    def total(metric: str, op: str) -> str:
        return ch.over("sum_over_time", ch.v(c(metric, op)))

    n, y, t = ch.v(c("gpu_fb_used", "count")), ch.v(c("gpu_fb_used", "sum")), ch.v(c("gpu_fb_used", "tsum"))
    tt, ty, a = ch.v(c("gpu_fb_used", "tsumsq")), ch.v(c("gpu_fb_used", "tysum")), ch.age()
    bursts = total("gpu_util_burst", "count")
    # the oldest step's burst needs its quiet sample before the lookback: the raw query leaves it out
    edge = f"count_over_time({BURST}[{_dur(step - 0.001)}] offset {_dur(lookback - step)})"
    return _union([
        _stat(total("gpu_util", "sum"), "util_sum_lb"),
        _stat(total("gpu_util", "count"), "n_lb"),
        _stat(total("gpu_util_busy", "sum"), "busy_sum_lb"),
        _stat(f"({bursts}) - ({edge} or ({bursts}) * 0)", "bursts_lb"),
        _stat(total("gpu_fb_used", "count"), "mem_n_lb"),
        _stat(total("gpu_fb_used", "sum"), "mem_sy_lb"),
        _stat(total("gpu_fb_used", "sumsq"), "mem_syy_lb"),
        _stat(ch.over("sum_over_time", f"{t} - {a} * {n}"), "mem_sd_lb"),
        _stat(ch.over("sum_over_time", f"{tt} - 2 * {a} * {t} + {a} ^ 2 * {n}"), "mem_sdd_lb"),
        _stat(ch.over("sum_over_time", f"{ty} - {a} * {y}"), "mem_sdy_lb"),
        _stat(ch.over("min_over_time", ch.v(c("gpu_fb_used_timestamp", "min"))), "mem_t0_lb"),
        _stat(ch.over("max_over_time", ch.v(c("gpu_fb_used_timestamp", "max"))), "mem_t1_lb"),
    ])


def chart_query_chunked(lookback: float, chunk: float) -> str:
    """The notices' chart from the per-chunk maxima: a bucket is one chunk or the max of several,
    asked at the rules' evaluation (as :func:`lookback_query_chunked`)."""
    from gpu_cost.aggregate import CHART_BUCKETS

    per = round(lookback / CHART_BUCKETS / chunk)
    umax = chunk_series("gpu_util", "max", chunk)
    chart = []
    for b in range(CHART_BUCKETS):
        first = (CHART_BUCKETS - 1 - b) * per
        if per == 1:
            off = f" offset {_dur(first * chunk)}" if first else ""
            chart.append(_stat(f"last_over_time({umax}[1ms]{off})", f"chart_{b}"))
        else:
            chart.append(_stat(_over("max", lambda v: v(umax), [(first + i) * chunk for i in range(per)]), f"chart_{b}"))
    return _union(chart)


def finish(cols: dict[str, np.ndarray], rows: int) -> None:
    """Turn the chunked queries' parts into the raw queries' columns, in place (one value per row; NaN: none)."""
    from gpu_cost.aggregate import CHART_BUCKETS

    nan = np.full(rows, np.nan)

    def get(name: str) -> np.ndarray:
        return cols.get(name, nan)

    with np.errstate(divide="ignore", invalid="ignore"):
        for key in [k for k in cols if k.startswith("util_sum@")]:
            tag = key.split("@", 1)[1]
            cols[f"util_mean@{tag}"] = get(key) / get(f"n@{tag}")
        if "n_lb" not in cols:
            return
        n_u = get("n_lb")
        cols["util_mean_lb"] = get("util_sum_lb") / n_u
        cols["busy_share_lb"] = get("busy_sum_lb") / n_u
        charts = np.stack([get(f"chart_{k}") for k in range(CHART_BUCKETS)], axis=1)
        # the buckets tile the lookback (NaN-skipping max; NaN where no bucket has data)
        cols["util_max_lb"] = np.where(np.isnan(n_u), np.nan, np.fmax.reduce(charts, axis=1))
        n = get("mem_n_lb")
        has = n > 0  # NaN: no memory sample
        sy, sd = get("mem_sy_lb"), get("mem_sd_lb")
        var_t = (get("mem_sdd_lb") - sd * sd / n) / n
        cols["mem_var_lb"] = np.where(has, (get("mem_syy_lb") - sy * sy / n) / n, np.nan)
        cols["mem_tvar_lb"] = np.where(has, var_t, np.nan)
        cov = (get("mem_sdy_lb") - sd * sy / n) / n
        cols["mem_slope_lb"] = np.where(has & (n >= 2) & (var_t > 0), cov / var_t * 3600.0, np.nan)


def windows_query_recorded(windows: Sequence[float], primary: float, chunk: float | None = None,
                           at: float = 0.0) -> str:
    """The window aggregates of :func:`~gpu_cost.sources.prometheus.windows_query` from the recorded series.

    Asked as of the rules' evaluation ``T``: a window ``w`` is the samples in ``(T - w, T]``; a
    window of whole chunks (not the primary one, which also wants power) is read from them, its
    mean left to :func:`finish`.
    """
    parts = []
    for w in windows:
        tag = f"{w:g}"
        primary_w = abs(w - primary) < 1e-6
        if chunk and not primary_w and w % chunk < 1e-6:
            ch = Chunks(at, chunk, round(w / chunk))

            def read(fn: str, metric: str, op: str, ch: Chunks = ch) -> str:
                return ch.over(fn, ch.v(chunk_series(metric, op, chunk)))

            parts += [
                _stat(read("sum_over_time", "gpu_util", "sum"), f"util_sum@{tag}"),
                _stat(read("max_over_time", "gpu_util", "max"), f"util_max@{tag}"),
                _stat(read("sum_over_time", "gpu_util", "count"), f"n@{tag}"),
                _stat(read("min_over_time", "gpu_fb_used", "min"), f"mem_min@{tag}"),
                _stat(read("max_over_time", "gpu_fb_used", "max"), f"mem_max@{tag}"),
            ]
            continue
        r = _dur(w - 0.001)
        parts += [
            _stat(f"avg_over_time({UTIL}[{r}])", f"util_mean@{tag}"),
            _stat(f"max_over_time({UTIL}[{r}])", f"util_max@{tag}"),
            _stat(f"count_over_time({UTIL}[{r}])", f"n@{tag}"),
            _stat(f"min_over_time({MEM}[{r}])", f"mem_min@{tag}"),
            _stat(f"max_over_time({MEM}[{r}])", f"mem_max@{tag}"),
        ]
        if primary_w:
            parts.append(_stat(f"avg_over_time({POWER}[{r}])", f"power@{tag}"))
    return _union(parts)


def lookback_query_samples(lookback: float, step: float) -> str:
    """The lookback aggregates from the per-sample series (when chunks do not tile the lookback)."""

    r = _dur(lookback - 0.001)
    rb = _dur(lookback - step - 0.001)  # a burst needs its quiet sample inside the lookback too
    return _union([
        _stat(f"avg_over_time({UTIL}[{r}])", "util_mean_lb"),
        _stat(f"max_over_time({UTIL}[{r}])", "util_max_lb"),
        _stat(f"count_over_time({UTIL}[{r}])", "n_lb"),
        _stat(f"avg_over_time({BUSY}[{r}])", "busy_share_lb"),
        _stat(f"count_over_time({BURST}[{rb}])", "bursts_lb"),
        _stat(f"deriv({MEM}[{r}]) * 3600", "mem_slope_lb"),
        _stat(f"stdvar_over_time({MEM}[{r}])", "mem_var_lb"),
        _stat(f"stdvar_over_time({MEM_T}[{r}])", "mem_tvar_lb"),
        _stat(f"count_over_time({MEM}[{r}])", "mem_n_lb"),
        _stat(f"min_over_time({MEM_T}[{r}])", "mem_t0_lb"),
        _stat(f"max_over_time({MEM_T}[{r}])", "mem_t1_lb"),
    ])


def chart_query_samples(lookback: float) -> str:
    """The notices' chart from the per-sample series (when chunks do not tile the lookback)."""
    from gpu_cost.aggregate import CHART_BUCKETS

    bucket = lookback / CHART_BUCKETS
    chart = []
    for k in range(CHART_BUCKETS):
        off = (CHART_BUCKETS - 1 - k) * bucket
        shift = f" offset {_dur(off)}" if off else ""
        chart.append(_stat(f"max_over_time({UTIL}[{_dur(bucket - 0.001)}]{shift})", f"chart_{k}"))
    return _union(chart)


def lookback_query_recorded(lookback: float, step: float, chunk: float | None, at: float) -> str:
    """The lookback query on recorded series, asked at ``at``: from chunks when they tile it, else from the samples."""
    if chunk:
        return lookback_query_chunked(lookback, step, chunk, at)
    return lookback_query_samples(lookback, step)


def chart_query_recorded(lookback: float, chunk: float | None, at: float) -> str:
    """The chart query on recorded series, asked at ``at`` (as :func:`lookback_query_recorded`)."""
    return chart_query_chunked(lookback, chunk) if chunk else chart_query_samples(lookback)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpu_cost.sources.recording", description=__doc__.splitlines()[0])
    ap.add_argument("--sample-interval", type=float, default=STEP, help="the policy's sweep.sample_interval, seconds")
    ap.add_argument("--busy-util", type=float, default=BUSY_UTIL, help="the policy's sweep.busy_util, percent")
    ap.add_argument("--chunk", type=float, default=CHUNK, help="seconds per lookback chunk (lookback/12 must be whole chunks)")
    ap.add_argument("--selector", default="", help="label matchers for the GPU series, as the connection's extra.selector")
    args = ap.parse_args(argv)
    sys.stdout.write(rules_yaml(step=args.sample_interval, busy=args.busy_util, chunk=args.chunk,
                                selector=args.selector.strip().strip("{}")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
