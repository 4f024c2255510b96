"""``gpu-cost demo``: the whole loop on the simulated cluster, through Airflow, into SQLite."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpu_cost.cli import add_json


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the DAGs on the simulated cluster in a throwaway Airflow home")
    p.add_argument("--home", default=".demo", help="folder for the throwaway Airflow home and audit DB (recreated)")
    add_json(p)
    p.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.demo import run_demo

    result = run_demo(Path(args.home).resolve())
    lines = [
        "",
        f"GPU Cost Agent demo — simulated cluster, mode {result['mode']}: nothing was touched, everything recorded.",
        f"sweep run {result['run_id']} ({result['status']}):",
    ]
    for d in result["decisions"]:
        who = f"{d['user'] or '?'}"
        verb = "record only" if d["action"] == "none" else f"would {d['action']}"
        lines.append(f"  {d['rule']:<16} {d['target']:<34} {who:<8} → {verb:<20} {d['reason']}")
    for key, label in (("report", "weekly report"), ("forecast", "forecasts"), ("power", "off-hours power")):
        if key in result:
            lines.append(f"{label}: {result[key]}")
    lines.append(f"audit store: {result['audit_db']}")
    lines.append(f"Airflow home: {result['airflow_home']} ({result['seconds']} s)")
    return result, "\n".join(lines)
