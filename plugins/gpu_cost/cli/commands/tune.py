"""``gpu-cost tune``: candidate policies replayed over a trace; the Pareto set of what they free and cost."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from gpu_cost.cli.options import add_json, add_policy


def register(sub: Any) -> None:
    p = sub.add_parser("tune", help="replay candidate policies from a search space over a trace; print the Pareto set",
                       description="Replay the base policy and candidates from a search space over a trace (each as "
                                   "if enforced, approvals approved) and print the Pareto set over GPU-hours freed, "
                                   "false kills, notices per user per week and GPU-hours left idle. Never changes the "
                                   "running policy; --write writes the chosen candidate to a file of its own.")
    p.add_argument("--samples", required=True, help="GPU samples (CSV or Parquet: ts, host, gpu, util, mem_used_mib, ...)")
    p.add_argument("--jobs", required=True, help="jobs (CSV or Parquet: job_id, user, start_ts, ...)")
    p.add_argument("--logs", help="job log lines (CSV: ts, job_id, stream, line); default: logs.csv beside --jobs "
                                  "when it exists")
    add_policy(p, "base policy file")
    p.add_argument("--space", help="search space (YAML: dotted policy paths to a list of choices or "
                                   "{min, max, steps}); default: the shipped include/tune/default.yaml")
    p.add_argument("--max-candidates", type=int, default=48,
                   help="search the whole grid when it has at most this many candidates, else draw this many at "
                        "random (default: 48)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random search (default: 0)")
    p.add_argument("--workers", type=int, default=1,
                   help="replays run at once, in processes sharing the prepared trace (default: 1)")
    p.add_argument("--write", metavar="OUT",
                   help="write the chosen candidate as a policy file (figures and a diff against the base in its "
                        "header); never the base or the running policy")
    add_json(p)
    p.set_defaults(handler=_tune)


def _tune(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from pathlib import Path

    from gpu_cost.core import paths
    from gpu_cost.core.errors import GpuCostError, PolicyError
    from gpu_cost.sim.replay import prepare_files
    from gpu_cost.sim.tune import load_space, summary_text, tune, write_policy

    if args.max_candidates < 1 or args.workers < 1:
        raise GpuCostError(f"--max-candidates and --workers must be at least 1, got {args.max_candidates} and "
                           f"{args.workers}")
    base = Path(args.policy) if args.policy else paths.default_policy()
    try:
        base_text = base.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(str(base), "", f"cannot read: {exc.strerror or exc}") from None
    space = load_space(args.space or paths.include_dir() / "tune" / "default.yaml", base_text, str(base))
    t0 = time.time()
    prepared = prepare_files(args.samples, args.jobs, args.logs)
    result = tune(prepared, base_text, str(base), space, max_candidates=args.max_candidates, seed=args.seed,
                  progress=_bar() if sys.stderr.isatty() else None, prepare_seconds=time.time() - t0,
                  workers=args.workers)
    payload = result.to_dict()
    if args.write:
        if result.chosen is None:
            payload["written"] = None
            payload["exit_code"] = 1
        else:
            payload["written"] = str(write_policy(result, args.write))
    return payload, summary_text(payload) + (f"\nnothing written to {args.write}" if args.write and
                                             not payload["written"] else "")


def _bar() -> Any:
    """Return a progress callback drawing a bar on stderr (a terminal only)."""
    started = time.time()

    def show(done: int, total: int, name: str) -> None:
        width = 30
        fill = int(width * done / max(total, 1))
        took = time.time() - started
        eta = f", ~{took / done * (total - done):.0f}s left" if done else ""
        sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} replayed{f' ({name})' if done else ''} "
                         f"{took:.0f}s{eta}   ")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show
