"""Write the weekly report: HTML with embedded PNG charts, a Markdown summary, the KPIs as JSON.

Output location: ``policy.report.out_dir``, overridden by ``GPU_COST_REPORT_DIR``, overridden by
an explicit ``out``. A plain folder (a relative ``out_dir`` is resolved beside the SQLite store the
report is read from — the demo's reports go to ``.demo/reports`` — else against ``GPU_COST_HOME``), or a
URL (``s3://bucket/reports``, ``file:///srv/reports``...) written through Airflow's
``ObjectStoragePath``. Each report goes to its own sub-folder named after the period::

    <out>/2026-11-16_2026-11-23/index.html      the report (charts embedded as base64 PNG)
                                 summary.md      the Markdown summary (Slack, e-mail, wiki)
                                 kpis.json       every figure, for machines
                                 charts/*.png    the charts as files

Templates are files under ``include/templates/report/`` (Jinja2).
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_cost.audit.store import AuditStore
from gpu_cost.config.schema import Policy
from gpu_cost.core import paths
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.timeutil import epoch, utc
from gpu_cost.report import charts as charts_mod

logger = logging.getLogger(__name__)

ENV_OUT = "GPU_COST_REPORT_DIR"


def out_location(policy: Policy, out: str | os.PathLike[str] | None = None, beside: str | None = None) -> str:
    """Return where reports go: ``out``, else ``GPU_COST_REPORT_DIR``, else ``policy.report.out_dir``.

    A relative ``out`` is resolved against the working directory; a relative folder from the
    environment or the policy beside ``beside`` (the SQLite file the report reads: reports lie next
    to the store they came from), else against ``GPU_COST_HOME``.
    """
    chosen = str(out) if out else (os.environ.get(ENV_OUT) or policy.report.out_dir)
    if "://" in chosen:
        return chosen
    p = Path(chosen).expanduser()
    if not p.is_absolute():
        base = Path.cwd() if out else (Path(beside).resolve().parent if beside else paths.state_dir())
        p = base / p
    return str(p.resolve())


def _root(location: str) -> Any:
    if "://" in location and not location.startswith("file://"):
        try:
            from airflow.sdk import ObjectStoragePath
        except ImportError as exc:  # pragma: no cover - Airflow is a dependency
            raise GpuCostError(f"report.out_dir {location!r} needs Airflow's ObjectStoragePath") from exc
        return ObjectStoragePath(location)
    if location.startswith("file://"):
        return Path(location[len("file://"):])
    return Path(location)


def report_folder(location: str, kpis: Mapping[str, Any]) -> Any:
    """Return the period's folder under ``location`` (a Path or an ObjectStoragePath), created."""
    since = utc(epoch(kpis["period"]["since"])).strftime("%Y-%m-%d")
    until = utc(epoch(kpis["period"]["until"]) - 1).strftime("%Y-%m-%d")
    folder = _root(location) / f"{since}_{until}"
    try:
        (folder / "charts").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpuCostError(f"cannot create the report folder {folder}: {exc}") from exc
    return folder


def _env() -> Any:
    import jinja2

    folder = paths.include_dir() / "templates" / "report"
    if not folder.is_dir():
        raise GpuCostError(f"report templates not found in {folder}")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)), autoescape=jinja2.select_autoescape(["html", "j2"]),
        trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
    )
    env.filters.update({"num": fmt_num, "pct": fmt_pct, "money": fmt_money, "delta": _delta, "signed": _signed})
    return env


#: what a figure of a week without data reads as
NO_DATA = "no data"


def fmt_num(v: Any, digits: int = 0) -> str:
    """A figure for people: thousands separated, ``digits`` decimals; ``no data`` for None."""
    if v is None:
        return NO_DATA
    return f"{float(v):,.{digits}f}"


def fmt_pct(v: Any, digits: int = 0, ratio: bool = False) -> str:
    """A percentage (``ratio``: a 0-1 ratio shown as %); ``no data`` for None."""
    if v is None:
        return NO_DATA
    return f"{float(v) * (100 if ratio else 1):.{digits}f} %"


def fmt_money(v: Any, currency: str = "USD") -> str:
    """Money rounded to the unit, with the currency's sign; ``no data`` for None."""
    if v is None:
        return NO_DATA
    sign = {"USD": "$", "EUR": "€", "GBP": "£"}.get(currency)
    return f"{sign}{float(v):,.0f}" if sign else f"{float(v):,.0f} {currency}"


def _signed(v: Any, digits: int = 1, unit: str = "") -> str:
    if v is None:
        return "no previous data"
    return f"{float(v):+,.{digits}f}{unit}"


def _delta(entry: Mapping[str, Any] | None, versus: str, good: str = "up", scale: float = 1.0, unit: str = "",
           digits: int = 1) -> dict[str, str]:
    """Return text and tone (good / bad / flat) of a change against the period before; ``versus`` names
    it as the report's columns do (``k.period.versus``: "vs last week", "vs the same 10 h a week before")."""
    if not entry or entry.get("vs_last_week") is None:
        return {"text": "no previous data", "tone": "flat"}
    d = float(entry["vs_last_week"]) * scale
    if abs(d) < 10 ** -digits / 2:
        return {"text": f"unchanged {versus}", "tone": "flat"}
    better = (d > 0) == (good == "up")
    arrow = "▲" if d > 0 else "▼"
    return {"text": f"{arrow} {abs(d):,.{digits}f}{unit} {versus}", "tone": "good" if better else "bad"}


def render_html(kpis: Mapping[str, Any], images: Mapping[str, bytes]) -> str:
    """Return the report HTML with the charts embedded."""
    embedded = {name: "data:image/png;base64," + base64.b64encode(data).decode() for name, data in images.items()}
    from gpu_cost.report.kpis import CATEGORIES

    return str(_env().get_template("report.html.j2").render(k=kpis, charts=embedded, sizes=charts_mod.SIZES,
                                                           categories=CATEGORIES))


def render_markdown(kpis: Mapping[str, Any], link: str | None = None) -> str:
    """Return the Markdown summary."""
    return str(_env().get_template("summary.md.j2").render(k=kpis, link=link))


def write_report(kpis: Mapping[str, Any], images: Mapping[str, bytes], location: str) -> dict[str, Any]:
    """Write the report files for ``kpis``; return their locations as strings."""
    folder = report_folder(location, kpis)
    chart_paths = {}
    for name, data in images.items():
        target = folder / "charts" / f"{name}.png"
        target.write_bytes(data)
        chart_paths[name] = str(target)
    index = folder / "index.html"
    index.write_text(render_html(kpis, images), encoding="utf-8")
    summary = folder / "summary.md"
    md = render_markdown(kpis, link=str(index))
    summary.write_text(md, encoding="utf-8")
    (folder / "kpis.json").write_text(json.dumps(kpis, indent=1, default=str), encoding="utf-8")
    logger.info("report written to %s", index)
    return {"folder": str(folder), "index": str(index), "summary": str(summary), "kpis": str(folder / "kpis.json"),
            "charts": chart_paths}


def build_report(store: AuditStore, policy: Policy, since: float, until: float,
                 out: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Compute the KPIs for ``[since, until)``, draw the charts and write the report; return where it is."""
    from gpu_cost.report.kpis import compute

    kpis = compute(store, policy, since, until)
    images = charts_mod.render_all(kpis)
    written = write_report(kpis, images, out_location(policy, out, beside=_store_file(store)))
    return {**written, "period": kpis["period"], "headline": headline(kpis)}


#: the PNG text chunk in which ``scripts/report-screenshot.py`` keeps the figures of the report it drew
FIGURES_CHUNK = "gpu-cost-figures"


def sample_table(h: Mapping[str, Any]) -> str:
    """Return the Markdown table of a report's headline (:func:`headline`) that the operator guide shows
    beside the picture of the same report; the figures as the demo's summary prints them."""
    cur = h.get("currency", "USD")

    def hours(v: Any, cost: Any) -> str:
        return f"{float(v or 0.0):,.0f} GPU-h ({fmt_money(cost, cur)})"

    saved = ("nothing: dry-run acts on nothing" if not h.get("freed_gpu_hours") and not h.get("saved_cost")
             else f"{fmt_money(h.get('saved_cost'), cur)} ({float(h.get('reused_gpu_hours') or 0.0):,.0f} GPU-h re-used)")
    rows = [("Allocated but idle", hours(h.get("idle_alloc_gpu_hours"), h.get("idle_cost"))),
            ("Held by zombie processes", hours(h.get("zombie_gpu_hours"), h.get("zombie_cost"))),
            ("Would have freed (dry-run, not counted as saved)",
             hours(h.get("would_have_gpu_hours"), h.get("would_have_cost"))),
            ("Saved", saved)]
    return "\n".join(["| | this week |", "|---|---:|", *(f"| {a} | {b} |" for a, b in rows)]) + "\n"


def _store_file(store: AuditStore) -> str | None:
    """Return the SQLite file ``store`` reads, None for a server database or an in-memory one."""
    url = str(store.url)
    if not url.startswith("sqlite") or "///" not in url:
        return None
    path = url.split("///", 1)[1].split("?", 1)[0]
    return path if path and path != ":memory:" else None


def headline(kpis: Mapping[str, Any]) -> dict[str, Any]:
    """Return the few figures a caller prints or puts in XCom."""
    c = kpis["cluster"]
    s = kpis["savings"]["freed"]
    r = kpis["savings"]["reused"]
    return {"util_all_pct": c["util_all_pct"], "util_alloc_pct": c["util_alloc_pct"], "waste_ratio": c["waste_ratio"],
            "idle_alloc_gpu_hours": c["idle_alloc_gpu_hours"], "zombie_gpu_hours": c["zombie_gpu_hours"],
            "saved_gpu_hours": r["gpu_hours"], "saved_kwh": s["kwh"], "saved_cost": kpis["savings"]["headline_cost"],
            "freed_gpu_hours": s["gpu_hours"], "freed_cost": s["cost"], "reused_gpu_hours": r["gpu_hours"],
            "would_have_gpu_hours": kpis["savings"]["potential"]["gpu_hours"],
            "would_have_cost": kpis["savings"]["potential"]["cost"],
            "idle_cost": c.get("idle_cost"), "zombie_cost": c.get("zombie_cost"),
            "currency": kpis["currency"], "live_events": kpis["events"]["live_total"],
            "would_have_events": kpis["events"]["would_have_total"]}
