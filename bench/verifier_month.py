"""Benchmark: what the verifier's gate changes over the last week of a month of hard behaviours.

Generates 28 days of ``sim-trace --behaviours hard``, replays the first three weeks with the shipped
policy in dry-run (the going-live weeks: every rung recorded, nothing touched, so what each target did
next is in the later sweeps' usage rows), computes the outcomes and trains the verifier on them at the
split, then replays the last week in enforce mode twice from copies of that store (class baselines,
outcomes and the model as they stood): with the verifier's gate and without it. Approvals are left
unanswered (an action that needs a human is not carried out) in both. Figures count the actions of
the last week only (the test replay starts a lookback earlier to fill its windows). Nothing is
asserted: the figures are for reading (tests/unit/test_verifier.py holds the behaviour).

    python -m bench.verifier_month [--days 28] [--test-days 7] [--gpus 32] [--seed 0] [--without-baselines]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import report

END = 1795392000.0  # 2026-11-23T00:00:00Z: the same trace on every run


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.verifier_month")
    ap.add_argument("--days", type=float, default=28.0)
    ap.add_argument("--test-days", type=float, default=7.0)
    ap.add_argument("--gpus", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--approvals", choices=("reject", "approve"), default="reject",
                    help="how the last week's approval requests are answered (reject: as if unanswered)")
    ap.add_argument("--on-doubt", choices=("approval", "wait"), default=None,
                    help="verifier.on_doubt for the gated run (default: the policy's)")
    ap.add_argument("--without-baselines", action="store_true",
                    help="judge every job alone (baselines.enabled: false) in every phase: what the verifier "
                         "catches when the class baselines do not")
    args = ap.parse_args(argv)
    import pandas as pd

    from gpu_cost.audit.store import AuditStore
    from gpu_cost.cli.commands.simtrace import write_sim_trace
    from gpu_cost.config.loader import load_policy
    from gpu_cost.learn import verifier
    from gpu_cost.perceive.trace import normalise_jobs, normalise_samples, read_table
    from gpu_cost.sim.replay import read_logs, replay_files

    policy = load_policy(None)
    if args.without_baselines:
        src = policy.source
        policy = dataclasses.replace(policy, baselines=dataclasses.replace(policy.baselines, enabled=False))
        object.__setattr__(policy, "source", src)
    split = END - args.test_days * 86400.0
    head = split - policy.sweep.lookback  # the test replay's windows fill before the split
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        info = write_sim_trace(out / "all", days=args.days, gpus=args.gpus, seed=args.seed, end=END,
                               behaviours="hard")
        samples = normalise_samples(read_table(out / "all" / "samples.parquet", "samples"))
        jobs = normalise_jobs(read_table(out / "all" / "jobs.csv", "jobs"))
        logs = read_logs(out / "all" / "logs.csv")
        ended = jobs["end_ts"].isna() | (jobs["end_ts"] > head) if "end_ts" in jobs else jobs["start_ts"].notna()
        for name, s, j, lg in (
                ("train", samples[samples["ts"] < split], jobs[jobs["start_ts"] < split], logs[logs["ts"] < split]),
                ("test", samples[samples["ts"] >= head], jobs[ended], logs)):
            (out / name).mkdir()
            s.to_parquet(out / name / "samples.parquet", index=False)
            j.to_csv(out / name / "jobs.csv", index=False)
            lg.to_csv(out / name / "logs.csv", index=False)
        del samples
        gen_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        learnt = AuditStore(f"sqlite:///{out / 'learnt.db'}")
        train_run = replay_files(out / "train" / "samples.parquet", out / "train" / "jobs.csv", policy, mode="dry-run",
                                 store=learnt)
        model = verifier.train(learnt, policy, split, run_id="bench")
        learnt.engine.dispose()
        train_s = time.perf_counter() - t0

        runs: list[dict[str, Any]] = []
        for name, enabled in (("without verifier", False), ("with verifier", True)):
            db = out / f"{name.replace(' ', '-')}.db"
            shutil.copy(out / "learnt.db", db)
            doubt = args.on_doubt or policy.verifier.on_doubt
            pol = dataclasses.replace(policy, verifier=dataclasses.replace(policy.verifier, enabled=enabled,
                                                                           on_doubt=doubt))
            object.__setattr__(pol, "source", policy.source)
            store = AuditStore(f"sqlite:///{db}")
            t0 = time.perf_counter()
            r = replay_files(out / "test" / "samples.parquet", out / "test" / "jobs.csv", pol, mode="enforce",
                             approvals=args.approvals, store=store).to_dict()
            week = [a for a in r["actions"] if pd.Timestamp(a["ts"]).timestamp() >= split]
            kills = [a for a in week if a.get("freed_gpu_hours") is not None and "false_kill" in a]
            held = store.query("SELECT COUNT(*) AS n FROM gpu_cost_decisions WHERE ts >= :since AND reason LIKE :p",
                               {"since": split, "p": "%verifier.min_probability%"})[0]["n"]
            scores = [json.loads(e["evidence"] or "{}").get("verifier", {}).get("p_waste") for e in store.query(
                "SELECT evidence FROM gpu_cost_decisions WHERE ts >= :since AND mode = 'enforce' AND action IN "
                "('demote', 'terminate', 'kill', 'cancel')", {"since": split})]
            scored = [float(s) for s in scores if s is not None]
            runs.append({"run": name, "kills": len(kills), "false_kills": sum(1 for a in kills if a["false_kill"]),
                         "reclaimed_gpu_h": round(sum(float(a["freed_gpu_hours"]) for a in kills), 1),
                         # what the true kills freed: a false kill "frees" the rest of a job still at work
                         "reclaimed_waste_gpu_h": round(sum(float(a["freed_gpu_hours"]) for a in kills
                                                            if not a["false_kill"]), 1),
                         "destructive_decisions": len(scores), "scored": len(scored),
                         "min_p_waste": round(min(scored), 3) if scored else None,
                         "held_by_verifier": int(held), "approvals_unanswered": r["approvals_requested"],
                         "wall_s": round(time.perf_counter() - t0, 1)})
            store.engine.dispose()
    report(f"verifier model trained at the split: {args.days:g} days x {info['gpus']} GPUs, {info['jobs']} jobs, "
           f"seed {args.seed}{', baselines off' if args.without_baselines else ''}; trace {gen_s:.0f} s, {args.days - args.test_days:g} training days replayed in dry-run "
           f"in {train_s:.0f} s ({train_run.sweeps} sweeps)",
           [{k: model.get(k) for k in ("model_id", "status", "labels", "false_positives", "confirmed",
                                       "backtest_precision", "backtest_recall", "false_kills_prevented",
                                       "gpu_hours_given_up")}],
           ["model_id", "status", "labels", "false_positives", "confirmed", "backtest_precision", "backtest_recall",
            "false_kills_prevented", "gpu_hours_given_up"])
    base, gated = runs
    lost = (1 - gated["reclaimed_waste_gpu_h"] / base["reclaimed_waste_gpu_h"]) if base["reclaimed_waste_gpu_h"] else 0.0
    print(f"\nfalse kills {base['false_kills']} -> {gated['false_kills']}; GPU-h reclaimed from real waste "
          f"{base['reclaimed_waste_gpu_h']} -> {gated['reclaimed_waste_gpu_h']} ({100 * lost:.1f} % given up; all kills: "
          f"{base['reclaimed_gpu_h']} -> {gated['reclaimed_gpu_h']}; target: fewer false kills, at most 10 % given up)")
    answered = "approvals unanswered" if args.approvals == "reject" else "approvals granted"
    report(f"last {args.test_days:g} days replayed in enforce, {answered}, verifier.on_doubt "
           f"{args.on_doubt or policy.verifier.on_doubt}", runs, list(runs[0]))


if __name__ == "__main__":
    main()
