"""The report's charts as PNG bytes (matplotlib, Agg backend, imported inside the functions).

Every chart has a fixed pixel size (:data:`SIZES`), so the HTML layout and the tests can rely on
it. Each function takes the KPI dict of :func:`gpu_cost.report.kpis.compute` and nothing else.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

DPI = 100
#: chart name → (width, height) in pixels
SIZES: dict[str, tuple[int, int]] = {
    "utilisation_heatmap": (1000, 360),
    "waste_by_team": (1000, 380),
    "cumulative_savings": (1000, 340),
    "actions_over_time": (1000, 340),
}
#: the chart Slack gets with the summary
MAIN_CHART = "waste_by_team"

INK = "#1f2937"
MUTED = "#6b7280"
GRID = "#e5e7eb"
USED = "#3b82f6"
IDLE = "#f97316"
SAVED = "#16a34a"
POTENTIAL = "#9ca3af"
CATEGORY_COLORS = {
    "notifications": "#60a5fa",
    "demotions": "#a78bfa",
    "cancels": "#ef4444",
    "holds": "#f59e0b",
    "process_kills": "#b91c1c",
    "power_downs": "#10b981",
    "power_ups": "#6ee7b7",
    "reservations": "#0ea5e9",
    "reservations_released": "#7dd3fc",
}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({
        "font.family": "DejaVu Sans", "font.size": 10, "axes.edgecolor": GRID, "axes.labelcolor": INK,
        "xtick.color": MUTED, "ytick.color": MUTED, "axes.titleweight": "bold", "axes.titlesize": 12,
        "axes.titlecolor": INK, "axes.titlelocation": "left",
    })
    return plt


def _figure(name: str) -> tuple[Any, Any, Any]:
    plt = _plt()
    w, h = SIZES[name]
    fig, ax = plt.subplots(figsize=(w / DPI, h / DPI), dpi=DPI, layout="constrained")
    return plt, fig, ax


def _png(plt: Any, fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
    plt.close(fig)
    return buf.getvalue()


def _money(value: float, currency: str) -> str:
    sign = {"USD": "$", "EUR": "€", "GBP": "£"}.get(currency)
    return f"{sign}{value:,.0f}" if sign else f"{value:,.0f} {currency}"


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", color=MUTED, fontsize=12, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])
    for s in ax.spines.values():
        s.set_visible(False)


def utilisation_heatmap(k: Mapping[str, Any]) -> bytes:
    """Mean GPU utilisation by weekday x hour (report time zone), all GPUs."""
    import numpy as np

    plt, fig, ax = _figure("utilisation_heatmap")
    data = np.array([[np.nan if v is None else v for v in row] for row in k["heatmap"]], dtype=float)
    ax.set_title(f"GPU utilisation by hour and weekday — all GPUs, % ({k['period']['timezone']})")
    if np.isnan(data).all():
        _empty(ax, "no usage recorded in this period")
        return _png(plt, fig)
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="#f3f4f6")
    im = ax.imshow(np.ma.masked_invalid(data), aspect="auto", cmap=cmap, vmin=0, vmax=100, interpolation="nearest")
    ax.set_yticks(range(7), ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"])
    ax.set_xticks(range(24), [f"{h:02d}" for h in range(24)])
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    for d in range(7):
        for h in range(24):
            v = data[d, h]
            if not np.isnan(v):
                ax.text(h, d, f"{v:.0f}", ha="center", va="center", fontsize=7.5,
                        color="white" if v < 25 or v > 80 else INK)
    bar = fig.colorbar(im, ax=ax, fraction=0.025, pad=0.01)
    bar.outline.set_visible(False)
    bar.ax.tick_params(labelsize=8, length=0)
    return _png(plt, fig)


def waste_by_team(k: Mapping[str, Any]) -> bytes:
    """Allocated GPU-hours per team, split into used and idle, idle cost annotated."""
    plt, fig, ax = _figure("waste_by_team")
    teams = [t for t in k["by_team"] if t["allocated_gpu_hours"] > 0][:10]
    ax.set_title("Allocated GPU-hours by team: used vs. idle (waste)")
    if not teams:
        _empty(ax, "no allocated GPU time in this period")
        return _png(plt, fig)
    teams = list(reversed(teams))
    names = [t["account"] for t in teams]
    idle = [t["idle_gpu_hours"] for t in teams]
    used = [max(0.0, t["allocated_gpu_hours"] - t["idle_gpu_hours"]) for t in teams]
    ax.barh(names, used, color=USED, label="used (allocated, active)", height=0.6)
    ax.barh(names, idle, left=used, color=IDLE, label="idle while allocated", height=0.6)
    top = max(u + i for u, i in zip(used, idle, strict=True)) or 1.0
    cur = k["currency"]
    for y, t in enumerate(teams):
        ratio = t["waste_ratio"] or 0.0
        ax.text(used[y] + idle[y] + top * 0.01, y,
                f"{t['idle_gpu_hours']:,.0f} GPU-h idle · {ratio:.0%} · {_money(t['idle_cost'], cur)}",
                va="center", fontsize=9, color=INK)
    ax.set_xlim(0, top * 1.38)
    ax.set_xlabel("GPU-hours")
    _frame(ax, "x", loc="lower right")
    return _png(plt, fig)


def _frame(ax: Any, grid: str, **legend: Any) -> None:
    """The house style: light grid along ``grid`` behind the data, no top/right spines, a plain legend."""
    ax.grid(axis=grid, color=GRID)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(frameon=False, fontsize=9, **legend)


def cumulative_savings(k: Mapping[str, Any]) -> bytes:
    """GPU-hours freed over the period (ledger), with how much of it other jobs re-used, and what dry-run
    decisions would have freed."""
    import datetime as dt

    from gpu_cost.core.timeutil import epoch

    plt, fig, ax = _figure("cumulative_savings")
    since, until = epoch(k["period"]["since"]), epoch(k["period"]["until"])
    freed = [p for p in k["savings"]["freed"]["points"] if float(p[1]) > 0]
    potential = k["savings"]["potential"]["points"]
    ax.set_title("Cumulative GPU-hours freed by actions (savings ledger)")
    if not freed and not potential:
        _empty(ax, "no savings recorded in this period")
        return _png(plt, fig)

    def steps(points: list[Any]) -> tuple[list[Any], list[float]]:
        xs = [dt.datetime.fromtimestamp(since, tz=dt.UTC)]
        ys = [0.0]
        total = 0.0
        for p in points:
            total += float(p[1])
            xs.append(dt.datetime.fromtimestamp(float(p[0]), tz=dt.UTC))
            ys.append(total)
        xs.append(dt.datetime.fromtimestamp(until, tz=dt.UTC))
        ys.append(total)
        return xs, ys

    cur = k["currency"]
    if freed:
        xs, ys = steps(freed)
        ax.step(xs, ys, where="post", color=SAVED, linewidth=2.2,
                label=f"freed: {ys[-1]:,.0f} GPU-h, of which re-used by other jobs "
                      f"{k['savings']['reused']['gpu_hours']:,.0f} GPU-h · {_money(k['savings']['reused']['cost'], cur)}")
        ax.fill_between(xs, ys, step="post", color=SAVED, alpha=0.12)
    if potential:
        xs, ys = steps(potential)
        ax.step(xs, ys, where="post", color=POTENTIAL, linewidth=1.6, linestyle="--",
                label=f"would have freed (dry-run, not counted): {ys[-1]:,.0f} GPU-h")
    import matplotlib.dates as mdates

    ax.xaxis.set_major_locator(mdates.DayLocator())
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%a %d"))
    ax.set_xlim(dt.datetime.fromtimestamp(since, tz=dt.UTC), dt.datetime.fromtimestamp(until, tz=dt.UTC))
    ax.set_ylim(bottom=0)
    ax.set_ylabel("GPU-hours")
    _frame(ax, "y", loc="upper left")
    return _png(plt, fig)


def actions_over_time(k: Mapping[str, Any]) -> bytes:
    """Automated events per day, stacked by kind; dry-run "would have" decisions as a line."""
    plt, fig, _ = actions_axes(k)
    return _png(plt, fig)


def actions_axes(k: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """Draw :func:`actions_over_time` and return ``(plt, figure, axes)``: counts start at zero (a line of
    dry-run decisions alone would otherwise start the axis at its lowest day)."""
    import numpy as np

    from gpu_cost.report.kpis import CATEGORIES

    plt, fig, ax = _figure("actions_over_time")
    daily = k["daily"]
    days = daily["days"]
    ax.set_title("Automated actions per day (live) and dry-run decisions (would have)")
    total_live = sum(sum(v) for v in daily["live"].values())
    if not days or (total_live == 0 and not any(daily["would_have"])):
        _empty(ax, "no actions or decisions in this period")
        return plt, fig, ax
    import datetime as dt

    labels = [dt.date.fromisoformat(d).strftime("%a %d") for d in days]
    x = np.arange(len(days))
    bottom = np.zeros(len(days))
    for key, label, _ in CATEGORIES:
        vals = np.array(daily["live"][key], dtype=float)
        if vals.sum() == 0:
            continue
        ax.bar(x, vals, bottom=bottom, color=CATEGORY_COLORS.get(key, POTENTIAL), label=label, width=0.6)
        bottom += vals
    if any(daily["would_have"]):
        ax.plot(x, daily["would_have"], color=POTENTIAL, linestyle="--", marker="o", markersize=4,
                label="would have (dry-run)")
    ax.set_xticks(x, labels)
    ax.set_ylabel("events")
    ax.set_ylim(bottom=0)
    _frame(ax, "y", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return plt, fig, ax


CHARTS: dict[str, Callable[[Mapping[str, Any]], bytes]] = {
    "utilisation_heatmap": utilisation_heatmap,
    "waste_by_team": waste_by_team,
    "cumulative_savings": cumulative_savings,
    "actions_over_time": actions_over_time,
}


def render_all(kpis: Mapping[str, Any]) -> dict[str, bytes]:
    """Return every chart as PNG bytes, keyed by name."""
    out = {}
    for name, fn in CHARTS.items():
        out[name] = fn(kpis)
        logger.debug("chart %s: %d bytes", name, len(out[name]))
    return out
