"""``gpu-cost replay``: what a policy would have done over a trace (what-if backtest)."""

from __future__ import annotations

import argparse
from typing import Any

from gpu_cost.cli.options import add_json, add_policy


def register(sub: Any) -> None:
    p = sub.add_parser("replay", help="replay a policy over a trace in simulated time: what would it have done?",
                       description="Run the sweep's rules and decision engine over a trace at the policy's sweep "
                                   "interval, as if the policy were enforced (unless --mode says otherwise).")
    p.add_argument("--samples", help="GPU samples (CSV or Parquet: ts, host, gpu, util, mem_used_mib, ...); "
                                     "without it only allocated GPU-hours can be reported")
    p.add_argument("--jobs", required=True, help="jobs (CSV or Parquet: job_id, user, start_ts, ...)")
    p.add_argument("--logs", help="job log lines (CSV: ts, job_id, stream, line), the evidence a sweep reads from the "
                                  "jobs' StdOut/StdErr; default: logs.csv beside --jobs when it exists")
    add_policy(p)
    p.add_argument("--without-baselines", action="store_true",
                   help="judge every job alone, as if baselines.enabled were false (to see what the class "
                        "baselines change)")
    p.add_argument("--mode", choices=["enforce", "notify", "dry-run"], default="enforce",
                   help="replay as if in this mode (default: enforce)")
    p.add_argument("--approvals", choices=["approve", "reject", "owner"], default="approve",
                   help="how decisions that need a human are answered (default: approve); owner: only the target "
                        "owner's own release answer counts, and without one nothing destructive happens")
    p.add_argument("--actions-limit", type=int, default=None,
                   help="list at most this many actions in the output (default: all)")
    add_json(p)
    p.set_defaults(handler=_replay)


def _replay(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.config.loader import load_policy
    from gpu_cost.sim.replay import replay_files, summary_text

    policy = load_policy(args.policy)
    if args.without_baselines:
        import dataclasses

        src = policy.source
        policy = dataclasses.replace(policy, baselines=dataclasses.replace(policy.baselines, enabled=False))
        object.__setattr__(policy, "source", src)
    res = replay_files(args.samples, args.jobs, policy, mode=args.mode, approvals=args.approvals,
                       logs=args.logs).to_dict()
    if args.actions_limit is not None and len(res["actions"]) > args.actions_limit:
        res["actions_total"] = len(res["actions"])
        res["actions"] = res["actions"][: args.actions_limit]
    return res, summary_text(res)
