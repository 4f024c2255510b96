"""``gpu-cost rightsize``: the advice sbatch shows (GPUs, --time), computed from the jobs the sweeps saw finish."""

from __future__ import annotations

import argparse
import time
from typing import Any

from gpu_cost.cli.options import add_db, add_json, add_policy, instant_arg, open_store


def register(sub: Any) -> None:
    p = sub.add_parser("rightsize", help="right-sizing advice at submission: show it, or write it for sbatch",
                       description="Per user and per job class (user and job name stem), from the GPU jobs the sweeps "
                                   "saw finish over rightsize.lookback: the GPUs they needed and how long they ran, "
                                   "against what they asked. include/slurm/cli_filter.lua shows the advice at sbatch "
                                   "time (docs/rightsizing.md).")
    verbs = p.add_subparsers(dest="rightsize_command", required=True, metavar="ACTION")
    show = verbs.add_parser("show", help="compute the advice now and print it (nothing is written)",
                            description="Compute the advice as of --at from the audit store's job rows and print it; "
                                        "nothing is stored or written.")
    show.add_argument("--user", help="only this user's rows")
    show.add_argument("--all", action="store_true", help="also the rows with nothing to advise (status fits)")
    _common(show)
    show.set_defaults(handler=_show)
    write = verbs.add_parser("write", help="compute the advice, write the advice file and store the rows",
                             description="What gpu_forecast_nightly's rightsize task does: compute the advice as of "
                                         "--at, write the advice file atomically (mode 0644) and store the rows in "
                                         "gpu_cost_rightsize. Run it from cron on a login node if the nightly's file "
                                         "cannot reach the hosts users submit from.")
    write.add_argument("--out", help="the advice file (default: the policy's rightsize.advice_file)")
    _common(write)
    write.set_defaults(handler=_write)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--at", help="the data instant (ISO 8601 or epoch seconds; default: now)")
    add_policy(p)
    add_db(p)
    add_json(p)


def _lines(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        who = f"{r['user']} / {r['stem']}" if r["scope"] == "class" else f"{r['user']} (all GPU jobs)"
        if r["status"] != "advice":
            out.append(f"{who}: fits ({r['jobs']} jobs: asked {r['gpus_asked']}, needed {r['gpus_need']})")
            continue
        block = f"; refused above {r['block_above']} GPUs" if r["block_above"] else ""
        out.append(f"{who}: {r['text']}{block}")
    return out


def _show(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.capacity import rightsize
    from gpu_cost.config.loader import load_policy
    from gpu_cost.core.timeutil import iso

    now = instant_arg(args.at, "--at") if args.at else time.time()
    policy = load_policy(args.policy)
    rows = rightsize.compute(open_store(args, writes=False), policy, now)
    if args.user:
        rows = [a for a in rows if a.user == args.user]
    shown = [a.to_dict() for a in rows if args.all or a.status == "advice"]
    text = _lines(shown) or [f"no advice as of {iso(now)}: no user or class has {policy.rightsize.min_jobs} finished "
                             "GPU jobs that asked for materially more than they used"]
    return {**rightsize.summary(rows), "at": iso(now), "advice_rows": shown}, "\n".join(text)


def _write(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.capacity import rightsize
    from gpu_cost.config.loader import load_policy

    now = instant_arg(args.at, "--at") if args.at else time.time()
    policy = load_policy(args.policy)
    out = rightsize.publish(open_store(args, writes=True), policy, now, run_id=f"cli__{int(now)}", out=args.out)
    where = "written to " + (out["file"] or "no file (rightsize.advice_file is empty)")
    if out.get("kept"):
        where = f"not written: {out['kept']['file']} holds newer advice (as of {out['kept']['at']})"
    text = (f"{out['advice']} row(s) of advice ({out['gpu_advice']} on GPUs, {out['time_advice']} on --time, "
            f"{out['blocking']} refusing) of {out['rows']} as of {out['at']}; {where}")
    return out, text
