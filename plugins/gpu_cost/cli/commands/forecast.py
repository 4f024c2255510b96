"""``gpu-cost forecast``: backtests of the end-time and demand models, job ETAs, the nightly run."""

from __future__ import annotations

import argparse
import time
from typing import Any

from gpu_cost.cli.options import add_db, add_json, add_policy, instant_arg, open_store
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.timeutil import format_duration, iso


def register(sub: Any) -> None:
    p = sub.add_parser("forecast", help="job end-time and demand forecasts: backtests, ETAs, the nightly run")
    fsub = p.add_subparsers(dest="forecast_command", required=True, metavar="ACTION")

    b = fsub.add_parser("backtest", help="job end-time model vs the time limit on a jobs trace")
    b.add_argument("--jobs", required=True, help="jobs trace (CSV or Parquet, the design's jobs format)")
    b.add_argument("--split", required=True, help="ISO date/instant: fit on jobs ended before, test jobs started after")
    b.add_argument("--no-prophet", action="store_true", help="empirical model only (no per-class Prophet fits)")
    b.add_argument("--k", type=int, default=100, help="neighbours of the empirical model (default 100)")
    b.add_argument("--min-class-jobs", type=int, default=30, help="jobs a class needs for its own Prophet fit")
    add_json(b)
    b.set_defaults(handler=_backtest)

    d = fsub.add_parser("demand-backtest", help="demand model vs the simple forecasts (WAPE, GPU-hours short/idle, sMAPE), last H hours held out")
    d.add_argument("--series", required=True, help="series file: ts, key, value (hourly)")
    d.add_argument("--horizon", required=True, help="time held out, with its unit (e.g. 168h or 7d)")
    d.add_argument("--no-prophet", action="store_true", help="no Prophet (level and seasonal naive only)")
    d.add_argument("--refit-every", help="refit this often inside the held-out hours (e.g. 24h or 1d, as the nightly"
                   " DAG does); default: one forecast for all of them")
    add_json(d)
    d.set_defaults(handler=_demand_backtest)

    e = fsub.add_parser("eta", help="when a running job will likely end (from the stored nightly forecasts)")
    e.add_argument("--job", required=True, help="job id")
    e.add_argument("--jobs", help="jobs trace to take the job from (default: the agent's own job rows)")
    e.add_argument("--source", choices=["store", "sim"], default="store",
                   help="where the running job is looked up when --jobs is not given (default: store)")
    e.add_argument("--at", help="instant to answer for (ISO 8601 or epoch; default: now)")
    add_db(e)
    add_json(e)
    e.set_defaults(handler=_eta)

    n = fsub.add_parser("nightly", help="run the nightly forecast now, outside Airflow (same steps as the DAG)")
    n.add_argument("--source", choices=["sim", "slurm", "store", "trace"], default="sim", help="job history source")
    n.add_argument("--jobs", help="jobs trace (source trace)")
    n.add_argument("--at", help="instant of the run (ISO 8601 or epoch; default: now, floored to the hour)")
    add_policy(n)
    n.add_argument("--workers", type=int, default=1, help="processes fitting batches in parallel")
    add_db(n)
    add_json(n)
    n.set_defaults(handler=_nightly)


def _hours(value: str, flag: str = "--horizon") -> int:
    """Return whole hours of a duration typed with its unit (``168h``, ``7d``); a bare number is an error."""
    from gpu_cost.cli.options import duration_arg

    secs = duration_arg(value, flag)
    if secs < 3600:
        raise GpuCostError(f"{flag} {value!r}: at least one hour")
    return round(secs / 3600)


def _backtest(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.capacity.forecast import backtest, history

    jobs = history.load_jobs(args.jobs)
    out = backtest.runtime_backtest(jobs, instant_arg(args.split, "--split"), k=args.k,
                                    min_class_jobs=args.min_class_jobs, use_prophet=not args.no_prophet)
    text = "\n".join([
        f"end-time backtest on {args.jobs}: {out['n_train']} training jobs, {out['n_test']} test jobs "
        f"(split {iso(out['split'])})",
        f"  MAE             {out['mae_h']:.3f} h   (time limit: {out['baseline_limit_mae_h']:.3f} h, "
        f"per-user/limit median: {out['baseline_user_limit_median_mae_h']:.3f} h)",
        f"  p90 coverage    {out['p90_coverage']:.1%}",
        f"  p90 pinball     {out['p90_pinball_h']:.3f} h   (time limit as p90: {out['baseline_limit_p90_pinball_h']:.3f} h,"
        f" ratio {out['pinball_vs_limit']})",
        f"  underpredicted  {out['underpredict_rate']:.1%};  methods {out['methods']}",
    ])
    return out, text


def _demand_backtest(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.capacity.forecast import backtest, history

    series = history.load_series(args.series)
    every = _hours(args.refit_every, "--refit-every") if args.refit_every else None
    out = backtest.demand_backtest(series, _hours(args.horizon), use_prophet=not args.no_prophet, refit_every=every)
    how = f", refitted every {every} h" if every else ", one forecast"
    lines = [f"demand backtest on {args.series}: {out['n_series']} series, last {out['horizon']} h held out{how}",
             f"  WAPE {_pct(out['wape'])}   best naive per series {_pct(out['best_naive_wape'])}   "
             f"seasonal naive {_pct(out['seasonal_naive_wape'])}   daily repeat {_pct(out['daily_repeat_wape'])}",
             f"  GPU-h short {out['gpu_hours_short']:.0f}  idle {out['gpu_hours_idle']:.0f}   (best naive: short "
             f"{out['best_naive_gpu_hours_short']:.0f}  idle {out['best_naive_gpu_hours_idle']:.0f})",
             f"  sMAPE {out['smape']:.1f}   seasonal naive {out['seasonal_naive_smape']:.1f}   "
             f"daily repeat {out['daily_repeat_smape']:.1f}   80% interval coverage {out['coverage_80']:.0%}",
             f"  best flat forecast in hindsight {out['hindsight_flat_smape']:.1f} (knows the held-out hours: a gauge"
             " of how predictable they were, not a forecast)",
             f"  {'series':<12} {'WAPE':>6} {'naive':>6} {'best naive':<15} {'sMAPE':>6} {'short':>6} {'idle':>6}  model"]
    for key, s in out["series"].items():
        lines.append(f"  {key:<12} {_pct(s['wape']):>6} {_pct(s['best_naive_wape']):>6} {s['best_naive']:<15} "
                     f"{s['smape']:6.1f} {s['gpu_hours_short']:6.0f} {s['gpu_hours_idle']:6.0f}  {s['model']}")
        lines.extend(f"      fell back {why}" for why in s["fallbacks"])
    return out, "\n".join(lines)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _find_job(args: argparse.Namespace, now: float) -> dict[str, Any]:
    from gpu_cost.capacity.forecast import history

    if args.jobs:
        jobs = history.load_jobs(args.jobs)
        hit = jobs[jobs["job_id"] == str(args.job)]
        if hit.empty:
            raise GpuCostError(f"job {args.job} is not in {args.jobs}")
        return dict(hit.iloc[-1].to_dict())
    if args.source == "sim":
        from gpu_cost.sim.cluster import SimCluster, load_scenario

        for job in SimCluster(load_scenario(), now).jobs_at(now, include_finished=True):
            if job.job_id == str(args.job):
                return history._job_dict(job)
        raise GpuCostError(f"job {args.job} is not in the simulated cluster at {iso(now)}")
    store = open_store(args, writes=False)
    rows = store.fetch("job_usage_of", {"job_id": str(args.job), "until": now})
    if not rows:
        known = store.fetch("jobs_seen", {"until": now})[0]
        if not known["jobs"]:
            raise GpuCostError(f"job {args.job}: the audit store has no job rows up to {iso(now)} (no sweep has "
                               "recorded a job yet); pass --jobs TRACE or --source sim")
        raise GpuCostError(f"job {args.job} is not among the {known['jobs']} jobs the sweeps recorded in the audit "
                           f"store ({iso(known['first_ts'])} to {iso(known['last_ts'])}); pass --jobs TRACE or "
                           "--source sim")
    r = rows[0]
    seen: dict[str, Any] = {
        "job_id": str(args.job), "user": r.get("user_name") or "", "account": r.get("account") or "",
        "partition": r.get("partition_name") or "", "name": r.get("job_name") or "", "start_ts": r.get("start_ts"),
        "time_limit_s": r.get("time_limit_s"), "gpus": r.get("gpus_requested") or r.get("gpus") or 0}
    # read as the nightly reads these rows (forecast.history.store_jobs): a job missing from a later
    # sweep ended at its last sighting
    if store.fetch("job_rows_after", {"since": r["ts"], "until": now}):
        seen["end_ts"] = float(r["ts"])
    return seen


def _eta(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.capacity.forecast import runtime

    now = instant_arg(args.at, "--at") if args.at else time.time()
    job = _find_job(args, now)
    if job.get("end_ts") is not None and job["end_ts"] == job["end_ts"] and float(job["end_ts"]) <= now:
        out = {"job_id": str(args.job), "ended": True, "end_ts": float(job["end_ts"])}
        return out, f"job {args.job} already ended at {iso(job['end_ts'])}"
    if job.get("start_ts") is None or job["start_ts"] != job["start_ts"]:
        raise GpuCostError(f"job {args.job} has not started: no end time to forecast")
    res = runtime.eta(open_store(args, writes=False), job, now)
    if res is None:
        raise GpuCostError(f"job {args.job}: no stored forecast for it or its class "
                           "(has gpu_forecast_nightly run in the last 8 days?)")
    res.update({"ended": False, "now": now, "p50_in_s": round(res["p50_end"] - now),
                "p90_in_s": round(res["p90_end"] - now), "past_p90": now > res["p90_end"]})
    when = (f"likely ends {iso(res['p50_end'])} (in {format_duration(max(0, res['p50_in_s']))}); "
            f"90% sure by {iso(res['p90_end'])}; time limit {iso(res['limit_end'])}")
    if res["past_p90"]:
        when += " — already past its p90 end"
    return res, f"job {args.job}: {when}  [{res['basis']}]"


def _nightly(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gpu_cost.capacity.forecast import nightly
    from gpu_cost.config.loader import load_policy

    policy = load_policy(args.policy)
    now = instant_arg(args.at, "--at") if args.at else time.time()
    now = float(now // 3600 * 3600)
    store = open_store(args, writes=True)
    out = nightly.run(policy, now, store, args.source, jobs_path=args.jobs, workers=args.workers)
    return out, f"nightly forecast at {iso(now)}: {nightly.summary_line(out)}"
