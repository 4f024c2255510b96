"""``gpu-cost demo``: the whole loop on one simulated cluster, through Airflow, into SQLite."""

from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path
from typing import Any

from gpu_cost.cli import add_json

#: decisions the summary shows as examples (the rest are counted)
EXAMPLES = 3


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the DAGs on one simulated cluster in a throwaway Airflow home",
                       description="A simulated week and the DAGs (forecast, sweep, off-hours power) on the same "
                                   "simulated cluster, in the policy's mode (dry-run by default: nothing is touched), "
                                   "then the weekly report. Prints a short summary and the next commands to try.")
    p.add_argument("--home", default=".demo", help="folder for the throwaway Airflow home and audit DB (recreated)")
    add_json(p)
    p.set_defaults(handler=_demo)


def next_commands(result: dict[str, Any], home: Path) -> list[tuple[str, str]]:
    """Return the three commands the summary suggests, each with what it shows; they run as printed
    from the folder the demo ran in (the CLI finds the demo's store there)."""
    here = Path.cwd()
    rel = os.path.relpath(home, here) if home.is_relative_to(here) else str(home)
    exe = _executable(here)
    job = result.get("audit_job") or next(
        (d["job_id"] for d in result["decisions"] if d.get("job_id") and d["action"] != "none"), None)
    trace = f"{rel}/trace"
    return [
        (f"{exe} audit --job {job}" if job else f"{exe} audit --limit 10",
         f"why the agent flagged job {job} and what it would do next, step by step" if job else "the latest decisions"),
        (f"{exe} report --since 7d", "the weekly report again, from the demo's store"),
        (f"{exe} sim-trace --days 7 --gpus 32 --out {trace} && {exe} replay --samples {trace}/samples.parquet "
         f"--jobs {trace}/jobs.csv", "what enforce mode would have done on a simulated week"),
    ]


def _executable(here: Path) -> str:
    """Return how to type ``gpu-cost`` from ``here``: the bare name when it is on PATH, else the script
    beside this interpreter (``.venv/bin/gpu-cost`` after ``make demo``)."""
    import shutil
    import sys

    beside = Path(sys.executable).with_name("gpu-cost")
    found = shutil.which("gpu-cost")
    if found and (not beside.exists() or Path(found).resolve() == beside.resolve()):
        return "gpu-cost"
    if not beside.exists():
        return "gpu-cost"
    return os.path.relpath(beside, here) if beside.is_relative_to(here) else str(beside)


def summary(result: dict[str, Any], home: Path) -> list[str]:
    """Return the demo's terminal summary (at most 30 lines): what ran, what it found, what it is worth."""
    from gpu_cost.report.render import fmt_money as _money

    h = result.get("report_headline") or {}
    cur = h.get("currency", "USD")
    mode = result["mode"]
    touched = "nothing was touched, every decision recorded" if mode == "dry-run" else "actions were carried out"
    c = result["cluster"]
    lines = [f"GPU Cost Agent demo — simulated cluster ({c['gpus']} GPUs on {c['nodes']} nodes), one week, "
             f"mode {mode}: {touched}."]
    if "forecast" in result:
        lines.append(f"forecast  {result['forecast']}")
    acted = [d for d in result["decisions"] if d["action"] != "none"]
    verbs = Counter(d["action"] for d in acted)
    prefix = "would " if mode == "dry-run" else ""
    what = ", ".join(f"{prefix}{a} {n}" for a, n in verbs.most_common()) or "no action"
    lines.append(f"sweep     {len(result['decisions'])} decision(s) now: {what}")
    for d in acted[:EXAMPLES]:
        lines.append(f"          {d['target']:<30} {d['user'] or '?':<8} → {prefix}{d['action']}: {_clip(d['reason'], 60)}")
    if "power" in result:
        lines.append(f"power     {_clip(str(result['power']), 110)}")
    if h:
        idle = h.get("idle_alloc_gpu_hours") or 0.0
        zombie = h.get("zombie_gpu_hours") or 0.0
        lines.append(f"week      {idle:,.0f} GPU-h allocated but idle ({_money(h.get('idle_cost'), cur)}), "
                     f"{zombie:,.0f} GPU-h held by zombie processes ({_money(h.get('zombie_cost'), cur)})")
    if "report" in result:
        lines.append(f"report    {result['report']}")
    lines.append(f"store     {result['audit_db']}   log (Airflow's and the agent's): {result['log']}")
    if h:
        if mode == "dry-run":
            lines.append(f"value     the agent would have freed {h.get('would_have_gpu_hours') or 0.0:,.0f} GPU-h "
                         f"({_money(h.get('would_have_cost'), cur)}) this week; saved so far: nothing (dry-run acts on nothing)")
        else:
            lines.append(f"value     freed {h.get('freed_gpu_hours') or 0.0:,.0f} GPU-h, of which other jobs re-used "
                         f"{h.get('reused_gpu_hours') or 0.0:,.0f} GPU-h: saved {_money(h.get('saved_cost'), cur)}")
    lines.append("next")
    for cmd, why in next_commands(result, home):
        lines.append(f"  {cmd}")
        lines.append(f"      {why}")
    return lines


def _clip(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _demo(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.demo import run_demo

    home = Path(args.home).resolve()
    result = run_demo(home)
    result["next_commands"] = [cmd for cmd, _ in next_commands(result, home)]
    return result, "\n".join(summary(result, home))
