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

The source then reads the lookback (and the windows of whole chunks, and the notices' chart) as
twelve 30-minute chunks: one range query per chunk series (:data:`CHUNK_READS`), whose steps land
on the rules' own evaluations, all sent at once. Sums, counts, extremes and the memory's time
moments add up in numpy (:func:`chunk_columns`), means, variances and the slope are finished there
too (:func:`finish`). A range query answers a series once with its twelve values: an instant query
of twelve offsets (or a twelve-step subquery per part, added up in PromQL) builds and sends twelve
labelled series, which cost Prometheus about ten times as much at 10,000 GPUs. A sweep touches
~266 samples per GPU instead of ~4,960, and Prometheus spends a small fraction of the time
(``docs/benchmarks.md``). The answers are the raw path's (the integration test holds both equal
on the same data, to float rounding): the sweep reads the recorded series as of the rules' last
evaluation after the grid step, which on a live Prometheus is the same aggregate taken up to one
interval later.

The source uses the rules only when they fit: the info series ``gpu_cost:recording_rules:info``
(labels ``step``, ``busy_util``, ``chunk``, ``selector``) must exist now *and* one lookback ago
(rules added an hour ago know nothing of the five before), and its labels must equal the
policy's ``sweep.sample_interval``, ``sweep.busy_util`` and the connection's ``selector``.
Otherwise it queries raw series, as before. It asks in a small ``rules`` query of two series
before the others (which then go out at the same time, as of the rules' last evaluation).

The shipped file ``deploy/prometheus/gpu-cost.rules.yml`` holds the rules for the default policy
and no selector; for another one, write it with::

    python -m gpu_cost.perceive.recording --busy-util 30 --selector 'job="dcgm"' > gpu-cost.rules.yml

(one set of rules per Prometheus: the recorded series carry no selector label).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_cost.perceive.promql import Dialects, _dur, _stat, _union, chart_buckets_query

#: the default policy's sweep.sample_interval and sweep.busy_util (the shipped rules fit it)
STEP = 60.0
BUSY_UTIL = 20.0
#: one chunk of the lookback: the default lookback (6 h) is 12 chunks, one per chart bucket
CHUNK = 1800.0
SHIPPED = "deploy/prometheus/gpu-cost.rules.yml"
REGENERATE = "python -m gpu_cost.perceive.recording > deploy/prometheus/gpu-cost.rules.yml"

INFO = "gpu_cost:recording_rules:info"
UTIL = "gpu_cost:gpu_util:pct"
BUSY = "gpu_cost:gpu_util_busy:bool"
BURST = "gpu_cost:gpu_util_burst:pct"
MEM = "gpu_cost:gpu_fb_used:mib"
MEM_T = "gpu_cost:gpu_fb_used:timestamp"
POWER = "gpu_cost:gpu_power:watts"


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

    head = ("# Recording rules for GPU Cost Agent's sweep: generated by gpu_cost.perceive.recording\n"
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
    from gpu_cost.perceive.aggregate import CHART_BUCKETS

    try:
        chunk = float(info.get("chunk", "nan"))
    except ValueError:
        return None
    if not chunk > 0:
        return None
    bucket = lookback / CHART_BUCKETS
    return chunk if abs(bucket / chunk - round(bucket / chunk)) < 1e-9 and round(bucket / chunk) >= 1 else None


#: the per-chunk series a sweep reads: one range query each, over its last evaluations a chunk apart
CHUNK_READS: tuple[tuple[str, str], ...] = (
    ("gpu_util", "sum"), ("gpu_util", "count"), ("gpu_util", "max"), ("gpu_util_busy", "sum"),
    ("gpu_util_burst", "count"), ("gpu_fb_used", "count"), ("gpu_fb_used", "min"), ("gpu_fb_used", "max"),
    ("gpu_fb_used", "sum"), ("gpu_fb_used", "sumsq"), ("gpu_fb_used", "tsum"), ("gpu_fb_used", "tsumsq"),
    ("gpu_fb_used", "tysum"), ("gpu_fb_used_timestamp", "min"), ("gpu_fb_used_timestamp", "max"),
)


def chunk_window(w: float, primary: float, chunk: float) -> bool:
    """Whether a rule window is read from the chunks (whole chunks, and not the primary window, which wants power)."""
    return abs(w - primary) >= 1e-6 and w % chunk < 1e-6


def chunk_steps(lookback: float, windows: Sequence[float], primary: float, chunk: float) -> int:
    """How many evaluations back the chunk reads go: the lookback's chunks, or a longer window's."""
    return round(max([lookback, *(w for w in windows if chunk_window(w, primary, chunk))]) / chunk)


def chunk_read(metric: str, op: str, chunk: float) -> str:
    """A per-chunk series as a range query reads it: at each step, the value of that very evaluation.

    A range query's steps fall on ``start + i × step``: with ``start`` on an evaluation and the step
    a chunk, every step is one (:func:`chunk_range`). ``last_over_time(…[1ms])`` takes that
    evaluation's value or none: a plain selector would take one up to five minutes older where a
    chunk has none (no bursts in it), where backfilled rules left no staleness marker.
    """
    return f"last_over_time({chunk_series(metric, op, chunk)}[1ms])"


def chunk_range(at: float, chunk: float, k: int) -> tuple[str, str, str]:
    """``(start, end, step)`` of the chunk reads as of the rules' evaluation ``at``: ``k`` evaluations a
    chunk apart, the newest ``at``, exact to the millisecond (a step a millisecond off would miss it)."""
    at_ms, chunk_ms = round(at * 1000), round(chunk * 1000)
    return f"{(at_ms - (k - 1) * chunk_ms) / 1000:.3f}", f"{at_ms / 1000:.3f}", f"{chunk_ms / 1000:.3f}"


def chunk_columns(mats: Mapping[tuple[str, str], np.ndarray], rows: int, *, chunk: float, lookback: float,
                  windows: Sequence[float], primary: float, burst_edge: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Put the chunks together into the parts :func:`finish` turns into the raw queries' columns.

    ``mats[(metric, op)]`` holds, per row, the chunk series' values at the rules' last evaluation
    ``at`` (column 0) and at each evaluation a chunk before it (column ``j``: ``at - j × chunk``;
    NaN: none): chunk ``j`` aggregates the samples in ``(at - (j+1) chunk, at - j chunk]``, so the
    first ``lookback / chunk`` columns tile the lookback's samples exactly. Sums, counts and extremes
    add up; a chunk's time moments, taken about its own evaluation time, are moved to ``at`` on the
    way (``t - at = (t - T_j) - j × chunk``). ``burst_edge``: the bursts at the lookback's oldest
    step, whose quiet sample lies before it (the raw query leaves them out).
    """
    from gpu_cost.perceive.aggregate import CHART_BUCKETS

    k_lb = round(lookback / chunk)
    k_all = max([k_lb, *(m.shape[1] for m in mats.values())])
    empty = np.full((rows, k_all), np.nan)

    def m(metric: str, op: str, k: int = k_lb) -> np.ndarray:
        return mats.get((metric, op), empty)[:, :k]

    def total(x: np.ndarray) -> np.ndarray:  # sum_over_time: NaN when no chunk has a value
        return np.where((~np.isnan(x)).any(axis=1), np.nansum(x, axis=1), np.nan)

    def top(x: np.ndarray) -> np.ndarray:
        return np.fmax.reduce(x, axis=1) if x.shape[1] else np.full(rows, np.nan)

    def bottom(x: np.ndarray) -> np.ndarray:
        return np.fmin.reduce(x, axis=1) if x.shape[1] else np.full(rows, np.nan)

    age = np.arange(k_lb, dtype=float) * chunk  # chunk j's evaluation is j chunks before ``at``
    n, y, t = m("gpu_fb_used", "count"), m("gpu_fb_used", "sum"), m("gpu_fb_used", "tsum")
    bursts = total(m("gpu_util_burst", "count"))
    out = {
        "util_sum_lb": total(m("gpu_util", "sum")),
        "n_lb": total(m("gpu_util", "count")),
        "busy_sum_lb": total(m("gpu_util_busy", "sum")),
        "bursts_lb": bursts - (np.nan_to_num(burst_edge, nan=0.0) if burst_edge is not None else 0.0),
        "mem_n_lb": total(n),
        "mem_sy_lb": total(y),
        "mem_syy_lb": total(m("gpu_fb_used", "sumsq")),
        "mem_sd_lb": total(t - age * n),
        "mem_sdd_lb": total(m("gpu_fb_used", "tsumsq") - 2 * age * t + age ** 2 * n),
        "mem_sdy_lb": total(m("gpu_fb_used", "tysum") - age * y),
        "mem_t0_lb": bottom(m("gpu_fb_used_timestamp", "min")),
        "mem_t1_lb": top(m("gpu_fb_used_timestamp", "max")),
    }
    per = round(lookback / CHART_BUCKETS / chunk)
    umax = m("gpu_util", "max")
    for b in range(CHART_BUCKETS):
        first = (CHART_BUCKETS - 1 - b) * per
        out[f"chart_{b}"] = top(umax[:, first:first + per])
    for w in windows:
        if not chunk_window(w, primary, chunk):
            continue
        k, tag = round(w / chunk), f"{w:g}"
        out[f"util_sum@{tag}"] = total(m("gpu_util", "sum", k))
        out[f"util_max@{tag}"] = top(m("gpu_util", "max", k))
        out[f"n@{tag}"] = total(m("gpu_util", "count", k))
        out[f"mem_min@{tag}"] = bottom(m("gpu_fb_used", "min", k))
        out[f"mem_max@{tag}"] = top(m("gpu_fb_used", "max", k))
    return out


def finish(cols: dict[str, np.ndarray], rows: int) -> None:
    """Turn the chunked queries' parts into the raw queries' columns, in place (one value per row; NaN: none)."""
    from gpu_cost.perceive.aggregate import CHART_BUCKETS

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
                           lookback: float = 0.0, step: float = STEP) -> str:
    """The window aggregates of :func:`~gpu_cost.perceive.prometheus.windows_query` from the recorded series.

    Asked as of the rules' evaluation ``T``: a window ``w`` is the samples in ``(T - w, T]``. With
    ``chunk``, a window of whole chunks (:func:`chunk_window`) is left to the chunk reads
    (:func:`chunk_columns`), and the query adds the lookback's edge bursts (``burst_edge``).
    """
    parts = []
    for w in windows:
        tag = f"{w:g}"
        if chunk and chunk_window(w, primary, chunk):
            continue
        r = _dur(w - 0.001)
        parts += [
            _stat(f"avg_over_time({UTIL}[{r}])", f"util_mean@{tag}"),
            _stat(f"max_over_time({UTIL}[{r}])", f"util_max@{tag}"),
            _stat(f"count_over_time({UTIL}[{r}])", f"n@{tag}"),
            _stat(f"min_over_time({MEM}[{r}])", f"mem_min@{tag}"),
            _stat(f"max_over_time({MEM}[{r}])", f"mem_max@{tag}"),
        ]
        if abs(w - primary) < 1e-6:
            parts.append(_stat(f"avg_over_time({POWER}[{r}])", f"power@{tag}"))
    if chunk:
        # the oldest step's burst needs its quiet sample before the lookback: the raw query leaves it out
        parts.append(_stat(f"count_over_time({BURST}[{_dur(step - 0.001)}] offset {_dur(lookback - step)})",
                           "burst_edge"))
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
    return chart_buckets_query(lookback, lambda bucket, shift: f"max_over_time({UTIL}[{_dur(bucket - 0.001)}]{shift})")




def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpu_cost.perceive.recording", description=__doc__.splitlines()[0])
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
