"""Prometheus recording rules for the sweep's aggregates, and the PromQL that reads them.

Without rules, every sweep resamples each GPU's raw DCGM series over the whole lookback (6 h of
1-minute steps, every exporter dialect, ~20 aggregates): at 10,000 GPUs that is millions of
samples every five minutes. With the rules below, Prometheus keeps, at the sample interval:

- **per sample** (group ``gpu_cost_samples``): the sweep's own normalised series, one per GPU
  (labels ``host``, ``gpu``, ``UUID`` only): utilisation % (``gpu_cost:gpu_util:pct``, the first
  dialect present, invalid values dropped, exactly :meth:`Dialects.util`), busy (0/1), idle→busy
  bursts, framebuffer used, its sample time, and power;
- **per chunk** (group ``gpu_cost_chunks``, ``CHUNK`` = 30 min): each series' sum, count, max,
  mean, variance, time moments and covariance over the last 30 samples.

The source then reads the windows from the per-sample series and the lookback as twelve
30-minute chunks put together in PromQL (pooled means and variances, the least-squares slope
from pooled moments), so a sweep touches ~12 samples per GPU and aggregate instead of ~360 ×
dialects. The answers are the raw path's (the integration test holds both equal on the same
data, to float rounding), provided the rules were evaluated on the sample grid; a live
Prometheus evaluates a group at a fixed phase within its interval, so each recorded value is the
same aggregate taken up to one interval later.

The source uses the rules only when they fit: the info series ``gpu_cost:recording_rules:info``
(labels ``step``, ``busy_util``, ``chunk``, ``selector``) must exist now *and* one lookback ago
(rules added an hour ago know nothing of the five before), and its labels must equal the
policy's ``sweep.sample_interval``, ``sweep.busy_util`` and the connection's ``selector``.
Otherwise it queries raw series, as before. It asks in the ``current`` query it runs anyway, so
detecting costs no query of its own.

The shipped file ``deploy/prometheus/gpu-cost.rules.yml`` holds the rules for the default policy
and no selector; for another one, write it with::

    python -m gpu_cost.sources.recording --busy-util 30 --selector 'job="dcgm"' > gpu-cost.rules.yml

(one set of rules per Prometheus: the recorded series carry no selector label).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_cost.sources.prometheus import Dialects, _dur, _stat, _union

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
KEY = "host, gpu, UUID"


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
    chunks = [
        {"record": c("gpu_util", "sum"), "expr": f"sum_over_time({UTIL}[{r}])"},
        {"record": c("gpu_util", "count"), "expr": f"count_over_time({UTIL}[{r}])"},
        {"record": c("gpu_util", "max"), "expr": f"max_over_time({UTIL}[{r}])"},
        {"record": c("gpu_util_busy", "sum"), "expr": f"sum_over_time({BUSY}[{r}])"},
        {"record": c("gpu_util_burst", "count"), "expr": f"count_over_time({BURST}[{r}])"},
        {"record": c("gpu_fb_used", "count"), "expr": f"count_over_time({MEM}[{r}])"},
        {"record": c("gpu_fb_used", "avg"), "expr": f"avg_over_time({MEM}[{r}])"},
        {"record": c("gpu_fb_used", "stdvar"), "expr": f"stdvar_over_time({MEM}[{r}])"},
        # covariance of memory and time = slope × var(t); a chunk of one sample has none (0)
        {"record": c("gpu_fb_used", "cov"),
         "expr": f"deriv({MEM}[{r}]) * stdvar_over_time({MEM_T}[{r}]) or count_over_time({MEM}[{r}]) * 0"},
        {"record": c("gpu_fb_used_timestamp", "avg"), "expr": f"avg_over_time({MEM_T}[{r}])"},
        {"record": c("gpu_fb_used_timestamp", "stdvar"), "expr": f"stdvar_over_time({MEM_T}[{r}])"},
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


def plan(rows: Sequence[Mapping[str, Any]], *, step: float, busy: float, lookback: float, selector: str,
         at: float, now: float) -> Plan | None:
    """Return how to read the recorded series, or None when the raw ones must be read.

    ``rows`` are the ``current`` query's samples with ``stat`` ``rules`` (value: the info series'
    newest sample time) and ``rules_since`` (the info series one lookback ago). The rules must fit
    the policy and the selector, be older than the lookback, and have run since the grid step
    ``at`` (a Prometheus whose rule evaluation lags behind is read raw).
    """
    def labels(r: Mapping[str, Any]) -> dict[str, str]:
        return {k: v for k, v in r.get("metric", {}).items() if k not in ("stat", "__name__")}

    since = [labels(r) for r in rows if r.get("metric", {}).get("stat") == "rules_since"]
    for r in rows:
        if r.get("metric", {}).get("stat") != "rules":
            continue
        info = labels(r)
        try:
            evaluated = float(r["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
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


def _over(agg: str, term: Callable[[Read], str], offsets: Sequence[float], extra: Sequence[str] = ()) -> str:
    """``agg by (host, gpu, UUID)`` over ``term`` at each offset (each tagged apart, so ``or`` keeps them all).

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
    parts += [f'label_replace({e}, "chunk", "x{i}", "", "")' for i, e in enumerate(extra)]
    return f"{agg} by ({KEY}) ({' or '.join(parts)})"


def lookback_query_chunked(lookback: float, step: float, chunk: float) -> str:
    """The lookback aggregates of :func:`~gpu_cost.sources.prometheus.lookback_query`, from the per-chunk series.

    Asked as of the rules' evaluation ``T``, chunk ``j`` is the value recorded at ``T - j × chunk``:
    the aggregate of the samples in ``(T - (j+1) chunk, T - j chunk]``, so the chunks tile the
    lookback's samples exactly. Counts, sums and maxima combine directly; the framebuffer's
    variance, its time variance and covariance are pooled from each chunk's count, mean and
    (co)variance about the query time (``time()``), which keeps the sums small (and exact for a
    constant memory).
    """
    from gpu_cost.aggregate import CHART_BUCKETS

    k = round(lookback / chunk)
    offsets = [j * chunk for j in range(k)]

    def c(metric: str, op: str) -> str:
        return chunk_series(metric, op, chunk)

    def sum_(term: Callable[[Read], str]) -> str:
        return _over("sum", term, offsets)

    un, us, umax = c("gpu_util", "count"), c("gpu_util", "sum"), c("gpu_util", "max")
    busy, burst = c("gpu_util_busy", "sum"), c("gpu_util_burst", "count")
    mn, my, mv, mc = c("gpu_fb_used", "count"), c("gpu_fb_used", "avg"), c("gpu_fb_used", "stdvar"), c("gpu_fb_used", "cov")
    tm, tv = c("gpu_fb_used_timestamp", "avg"), c("gpu_fb_used_timestamp", "stdvar")
    tmin, tmax = c("gpu_fb_used_timestamp", "min"), c("gpu_fb_used_timestamp", "max")

    n_u = sum_(lambda v: v(un))
    n = sum_(lambda v: v(mn))
    sy = sum_(lambda v: f"{v(mn)} * {v(my)}")
    syy = sum_(lambda v: f"{v(mn)} * ({v(mv)} + {v(my)} ^ 2)")
    sd = sum_(lambda v: f"{v(mn)} * ({v(tm)} - time())")
    sdd = sum_(lambda v: f"{v(mn)} * ({v(tv)} + ({v(tm)} - time()) ^ 2)")
    sdy = sum_(lambda v: f"{v(mn)} * ({v(mc)} + ({v(tm)} - time()) * {v(my)})")
    # the oldest step's burst needs its quiet sample before the lookback: the raw query leaves it out
    edge = f"-1 * count_over_time({BURST}[{_dur(step - 0.001)}] offset {_dur(lookback - step)})"
    bucket = lookback / CHART_BUCKETS
    per = round(bucket / chunk)
    chart = []
    for b in range(CHART_BUCKETS):
        first = (CHART_BUCKETS - 1 - b) * per
        chart.append(_stat(_over("max", lambda v: v(umax), [(first + i) * chunk for i in range(per)]), f"chart_{b}"))
    return _union([
        _stat(f"({sum_(lambda v: v(us))}) / ({n_u})", "util_mean_lb"),
        _stat(_over("max", lambda v: v(umax), offsets), "util_max_lb"),
        _stat(n_u, "n_lb"),
        _stat(f"({sum_(lambda v: v(busy))}) / ({n_u})", "busy_share_lb"),
        _stat(_over("sum", lambda v: v(burst), offsets, [edge]), "bursts_lb"),
        _stat(f"(({sdy}) - ({sd}) * ({sy}) / ({n})) / (({sdd}) - ({sd}) ^ 2 / ({n})) * 3600", "mem_slope_lb"),
        _stat(f"(({syy}) - ({sy}) ^ 2 / ({n})) / ({n})", "mem_var_lb"),
        _stat(f"(({sdd}) - ({sd}) ^ 2 / ({n})) / ({n})", "mem_tvar_lb"),
        _stat(n, "mem_n_lb"),
        _stat(_over("min", lambda v: v(tmin), offsets), "mem_t0_lb"),
        _stat(_over("max", lambda v: v(tmax), offsets), "mem_t1_lb"),
        *chart,
    ])


def windows_query_recorded(windows: Sequence[float], primary: float) -> str:
    """The window aggregates of :func:`~gpu_cost.sources.prometheus.windows_query` from the per-sample series.

    Asked as of the rules' evaluation ``T``: a window ``w`` is the samples in ``(T - w, T]``.
    """
    parts = []
    for w in windows:
        r = _dur(w - 0.001)
        tag = f"{w:g}"
        parts += [
            _stat(f"avg_over_time({UTIL}[{r}])", f"util_mean@{tag}"),
            _stat(f"max_over_time({UTIL}[{r}])", f"util_max@{tag}"),
            _stat(f"count_over_time({UTIL}[{r}])", f"n@{tag}"),
            _stat(f"min_over_time({MEM}[{r}])", f"mem_min@{tag}"),
            _stat(f"max_over_time({MEM}[{r}])", f"mem_max@{tag}"),
        ]
        if abs(w - primary) < 1e-6:
            parts.append(_stat(f"avg_over_time({POWER}[{r}])", f"power@{tag}"))
    return _union(parts)


def lookback_query_samples(lookback: float, step: float) -> str:
    """The lookback aggregates from the per-sample series (when chunks do not tile the lookback)."""
    from gpu_cost.aggregate import CHART_BUCKETS

    r = _dur(lookback - 0.001)
    rb = _dur(lookback - step - 0.001)  # a burst needs its quiet sample inside the lookback too
    bucket = lookback / CHART_BUCKETS
    chart = []
    for k in range(CHART_BUCKETS):
        off = (CHART_BUCKETS - 1 - k) * bucket
        shift = f" offset {_dur(off)}" if off else ""
        chart.append(_stat(f"max_over_time({UTIL}[{_dur(bucket - 0.001)}]{shift})", f"chart_{k}"))
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
        *chart,
    ])


def lookback_query_recorded(lookback: float, step: float, chunk: float | None) -> str:
    """The lookback query on recorded series: from chunks when they tile it, else from the per-sample series."""
    if chunk:
        return lookback_query_chunked(lookback, step, chunk)
    return lookback_query_samples(lookback, step)


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
