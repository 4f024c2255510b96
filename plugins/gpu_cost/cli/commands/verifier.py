"""``gpu-cost verifier``: label the recent decisions with their outcomes and train the verifier, or show its models."""

from __future__ import annotations

import argparse
import time
from typing import Any

from gpu_cost.cli.options import add_db, add_json, add_policy, instant_arg, open_store


def register(sub: Any) -> None:
    p = sub.add_parser("verifier", help="the verifier: train it on the decisions' outcomes, show its models",
                       description="A model of the chance that a finding is waste, learnt from what happened after "
                                   "earlier decisions; below verifier.min_probability a destructive rung needs approval.")
    verbs = p.add_subparsers(dest="verifier_command", required=True, metavar="ACTION")
    train = verbs.add_parser("train", help="compute the outcomes, train and backtest a model, store it",
                             description="Label the decisions of the last verifier.history with what happened next "
                                         "(gpu_cost_outcomes), train a standardised logistic regression on them, "
                                         "backtest it on a time split and store it (gpu_cost_verifier_models). "
                                         "With fewer than verifier.min_labels labels it is stored as too_few_labels "
                                         "and never used.")
    train.add_argument("--at", help="the data instant (ISO 8601 or epoch seconds; default: now)")
    add_policy(train)
    add_db(train)
    add_json(train)
    train.set_defaults(handler=_train)
    show = verbs.add_parser("show", help="the newest models and their figures")
    show.add_argument("--limit", type=int, default=5, help="how many models, newest first (default 5)")
    add_db(show)
    add_json(show)
    show.set_defaults(handler=_show)


def _line(m: dict[str, Any]) -> str:
    from gpu_cost.core.timeutil import iso

    bt = ""
    if m.get("backtest_precision") is not None or m.get("false_kills_prevented") is not None:
        bt = (f"; backtest precision {m.get('backtest_precision')}, recall {m.get('backtest_recall')}, false kills "
              f"prevented {m.get('false_kills_prevented')}, GPU-h given up {m.get('gpu_hours_given_up')}")
    return (f"{m['model_id']} ({iso(m['trained_at'])}): {m['status']}, {m['labels']} labels "
            f"({m['false_positives']} false positives, {m['confirmed']} confirmed){bt}")


def _train(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.config.loader import load_policy
    from gpu_cost.learn import verifier

    now = instant_arg(args.at, "--at") if args.at else time.time()
    store = open_store(args, writes=True)
    row = verifier.train(store, load_policy(args.policy), now, run_id=f"cli__{int(now)}")
    lines = [_line(row)]
    if row.get("note"):
        lines.append(f"  {row['note']}")
    if row.get("outcomes"):
        lines.append("  outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(row["outcomes"].items())))
    return row, "\n".join(lines)


def _show(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.learn import verifier

    store = open_store(args, writes=False)
    rows = verifier.models(store, max(1, args.limit))
    lines = [_line(m) for m in rows] or ["no verifier model trained yet (gpu-cost verifier train)"]
    return {"models": rows}, "\n".join(lines)
