"""``gpu-cost demo``: the whole loop on one simulated cluster, through Airflow, into SQLite."""

from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path
from typing import Any

from gpu_cost.cli.options import add_json


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the DAGs on one simulated cluster in a throwaway Airflow home",
                       description="Two simulated weeks and the DAGs (sweep, forecast, off-hours power) on the same "
                                   "simulated cluster at one instant (the latest Sunday 03:00 UTC), in the policy's "
                                   "mode (dry-run by default: nothing is touched), then the report of the last 7 days. "
                                   "Deterministic: the same figures on every run. Prints a short summary and the next "
                                   "commands to try.")
    p.add_argument("--home", default=".demo", help="folder for the throwaway Airflow home and audit DB (recreated)")
    p.add_argument("--days", type=float, default=None,
                   help="days of history to replay (default 14; fewer run quicker, and the forecast may then have "
                        "too little history to score)")
    p.add_argument("--at", help="run the demo as of this instant, ISO 8601 or epoch (default: now); the week ends "
                                "at the latest Sunday 03:00 UTC before it")
    add_json(p)
    p.set_defaults(handler=_demo)


def next_commands(result: dict[str, Any], home: Path) -> list[tuple[str, str]]:
    """Return the three commands the summary suggests, each with what it shows; they run as printed
    from the folder the demo ran in (the project file there names the demo's store, else they say --db)."""
    here = Path.cwd()
    rel = _shown(home)
    exe = _executable(here)
    db = "" if (result.get("project_file") or {}).get("reads_demo_store") else f" --db {rel}/audit.db"
    job = result.get("audit_job") or next(
        (d["job_id"] for d in result["decisions"] if d.get("job_id") and d["action"] != "none"), None)
    trace = f"{rel}/trace"
    return [
        (f"{exe} audit --job {job}{db}" if job else f"{exe} audit --limit 10{db}",
         f"why the agent flagged job {job} and what it would do next, step by step" if job else "the latest decisions"),
        (f"{exe} report --since 7d{db}", "the weekly report again, from the demo's store"),
        (f"{exe} sim-trace --days 7 --gpus 32 --out {trace} && {exe} replay --samples {trace}/samples.parquet "
         f"--jobs {trace}/jobs.csv", "what enforce mode would have done on a simulated week"),
    ]


def _shown(home: Path) -> str:
    """Return ``home`` as the summary types it: relative to the working directory when inside it."""
    here = Path.cwd()
    return os.path.relpath(home, here) if home.is_relative_to(here) else str(home)


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
    days = float(result.get("days") or 7)
    lines = [f"GPU Cost Agent demo — simulated cluster ({c['gpus']} GPUs on {c['nodes']} nodes), {days:g} days to "
             f"{_when(result.get('week_end'))}, mode {mode}: {touched}."]
    if "forecast_figures" in result:
        lines += forecast_lines(result["forecast_figures"])
    elif "forecast" in result:
        lines.append(f"forecast  {result['forecast']}")
    lines += decision_lines(result["decisions"], mode)
    if "power" in result:
        lines.append(f"power     {result['power']}")
    if h:
        idle = h.get("idle_alloc_gpu_hours") or 0.0
        zombie = h.get("zombie_gpu_hours") or 0.0
        lines.append(f"week      {idle:,.0f} GPU-h allocated but idle ({_money(h.get('idle_cost'), cur)}), "
                     f"{zombie:,.0f} GPU-h held by zombie processes ({_money(h.get('zombie_cost'), cur)})")
    if "report" in result:
        lines.append(f"report    {result['report']}")
    lines.append(f"store     {result['audit_db']}   log (Airflow's and the agent's): {result['log']}")
    pf = result.get("project_file") or {}
    if pf and not pf.get("reads_demo_store"):
        lines.append(f"          later commands here read {pf.get('later_commands_read')}: add --db "
                     f"{_shown(home)}/audit.db to read the demo's")
    elif pf.get("names_it"):
        lines.append(f"          {pf['file']} names it: later gpu-cost commands in this folder (or below) read it")
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


def decision_lines(decisions: list[dict[str, Any]], mode: str) -> list[str]:
    """Return the sweep's decisions for the summary: a count, then every decision on a line of its own
    (those acted on first, then those not acted on, with why: protected, advice only...), each with its
    reason in full (``gpu-cost audit`` adds the evidence and what comes next)."""
    prefix = "would " if mode == "dry-run" else ""
    verbs = Counter("no action" if d["action"] == "none" else f"{prefix}{d['action']}" for d in decisions)
    what = ", ".join(f"{v} {n}" for v, n in sorted(verbs.items(), key=lambda x: (x[0] == "no action", -x[1], x[0])))
    lines = [f"sweep     {len(decisions)} decision(s) now: {what or 'nothing found'}"]
    for d in sorted(decisions, key=lambda d: (d["action"] == "none", d["rule"], d["target"])):
        verb = "no action" if d["action"] == "none" else f"{prefix}{d['action']}"
        lines.append(f"          {d['target']:<28} {d['user'] or '?':<8} → {verb}: {_reason(d)}")
    return lines


def _when(ts: Any) -> str:
    """Return the demo's instant in words (``Sun 29 Nov 03:00 UTC``)."""
    import datetime as dt

    if ts is None:
        return "now"
    return dt.datetime.fromtimestamp(float(ts), tz=dt.UTC).strftime("%a %d %b %H:%M UTC")


def _reason(decision: dict[str, Any]) -> str:
    """Return a decision's reason without the ``job <id>:`` its line already names."""
    text = " ".join(str(decision.get("reason") or "").split())
    return text.removeprefix(f"job {decision.get('job_id')}: ") if decision.get("job_id") else text


def forecast_lines(figures: dict[str, Any]) -> list[str]:
    """Return what the nightly forecast learnt, in words: what it forecasts, its error next to a simple
    rule's on past data it was not fitted on (lower is better)."""
    d, r = figures.get("demand") or {}, figures.get("runtime") or {}
    lines = []
    if d.get("validation_smape") is not None:
        lines.append(f"forecast  GPUs demanded per hour, {d.get('series', 0)} series (cluster, partitions, accounts): "
                     f"error {d['validation_smape']:.0f} on past hours held out of the fit, vs "
                     f"{d.get('seasonal_naive_smape') or 0:.0f} for \"same hour last week\" (sMAPE, 0-200, lower is better)")
    else:
        lines.append(f"forecast  GPUs demanded per hour, {d.get('series', 0)} series: too little history to score it")
    bt = r.get("backtest") or {}
    err = (f"; on the last 7 days' jobs (held out) off by {bt['mae_s'] / 3600:.1f} h on average, vs "
           f"{bt['baseline_limit_mae_s'] / 3600:.1f} h for \"runs to its time limit\"") if bt else ""
    lines.append(f"          job end times: {r.get('classes', 0):,} job classes learnt, an ETA for each of "
                 f"{r.get('running_jobs', 0)} running jobs{err}")
    return lines


def _name_store(db: Path) -> dict[str, Any]:
    """Write the working directory's project file naming the demo's store (unless it names another),
    and say which store later commands run here will read."""
    from gpu_cost.cli import project
    from gpu_cost.cli.options import resolve_store
    from gpu_cost.core.errors import GpuCostError

    out = project.name_store(Path.cwd(), db)
    try:
        later = resolve_store(None)
    except GpuCostError as exc:
        out.update(reads_demo_store=False, later_commands_read=f"nothing ({exc})")
        return out
    out.update(reads_demo_store=later.url == f"sqlite:///{db.resolve()}", later_commands_read=later.label())
    return out


def _demo(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.cli.demo import DEMO_DAYS, run_demo
    from gpu_cost.cli.options import instant_arg
    from gpu_cost.core.errors import GpuCostError

    home = Path(args.home).resolve()
    days = DEMO_DAYS if args.days is None else float(args.days)
    if not 1 <= days <= 60:
        raise GpuCostError(f"--days {args.days}: give 1 to 60 days of history")
    result = run_demo(home, now=instant_arg(args.at, "--at") if args.at else None, days=days)
    result["project_file"] = _name_store(Path(result["audit_db"]))
    result["next_commands"] = [cmd for cmd, _ in next_commands(result, home)]
    return result, "\n".join(summary(result, home))
