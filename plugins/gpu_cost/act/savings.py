"""The savings ledger: what an action really freed, written once, apart from the waste observed.

Registered in :data:`gpu_cost.act.dispatch.SAVINGS_HOOKS` when this module is imported (the
dispatcher imports it with the executors), so it runs after every *successful, live* action —
never for dry-run, skipped or failed ones. Only actions that give GPUs back count:
``cancel``, ``terminate``, ``kill`` (a job ends) and ``kill_process`` (a zombie process ends).
Advice and notices save nothing when they are sent; when the owner then ends the job early, the
report books that release (:func:`gpu_cost.report.ledger.owner_releases`).

**Freed** = GPUs freed x the shorter of two durations:

1. *the end it would have had*: the job's forecast median end (p50: ``decision.evidence``
   ``p50_end`` / ``predicted_end``, else the forecasts table, series ``runtime:job:<id>``), else its
   time limit; a process of no job, or a job with neither, has no such end and is credited by (2) alone;
2. *the waste already seen*: how long the target had been wasting when it was acted on — the rule's
   window before its first finding plus the time since that finding (the escalation's
   ``first_seen``). An idle job seen idle for 2 h is credited at most 2 h more; a zombie process as
   long as it had already been one. So a saving never exceeds the waste observed on its target.

never later than the end of the week of the action (in the report's time zone). Money is GPU-hours
x ``cost.gpu_hour_usd`` of the GPU model. Freed GPUs stay powered (another job gets them), so a GPU
saving carries no kWh; energy savings are the power DAG's (kind ``power``). Whether other work
really used the freed GPUs (*re-used*) is measured from later sweeps by the report
(:mod:`gpu_cost.report.ledger`).

One saving per target and escalation episode (``saving_id = gpu:<target>:<episode>``): a
``terminate`` followed by a ``kill`` of the same job is one saving, not two.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from gpu_cost.act.base import ActionContext, Outcome
from gpu_cost.act.dispatch import SAVINGS_HOOKS
from gpu_cost.audit.store import AuditStore
from gpu_cost.config.schema import Policy
from gpu_cost.core import registry
from gpu_cost.core.model import Decision
from gpu_cost.core.timeutil import week_bounds

logger = logging.getLogger(__name__)

#: actions whose success gives GPUs back (declared ``frees_gpus=True`` in the registry)
FREEING_ACTIONS = registry.names(frees_gpus=True)


def week_end(ts: float, timezone: str = "UTC") -> float:
    """Return the end of the ISO week holding ``ts`` (next Monday 00:00 in ``timezone``), as the report
    defines a week (:func:`gpu_cost.core.timeutil.week_bounds`)."""
    return week_bounds(ts, timezone, weeks_back=0)[1]


def _forecast_end(store: AuditStore, job_id: str | None, now: float) -> float | None:
    """Return the job's forecast median end (epoch seconds), or None."""
    if not job_id:
        return None
    try:
        rows = store.fetch("forecasts_of_series", {"series": [f"runtime:job:{job_id}"], "since": 0})
    except Exception as exc:  # a forecasts table in another shape must not lose the saving
        logger.debug("no forecast for job %s: %s", job_id, exc)
        return None
    for row in rows:  # the job's own series only: read by its name
        extra = row.get("extra")
        try:
            data = json.loads(extra) if isinstance(extra, str) and extra else {}
        except json.JSONDecodeError:
            data = {}
        for value in (data.get("p50_end"), row.get("yhat")):
            if isinstance(value, int | float) and value > now - 366 * 86400:
                return float(value)
    return None


def _job_row(store: AuditStore, job_id: str | None, now: float) -> dict[str, Any] | None:
    if not job_id:
        return None
    rows = store.fetch("job_usage_of", {"job_id": job_id, "until": now + 1})
    return rows[0] if rows else None


def expected_end(decision: Decision, store: AuditStore, now: float) -> tuple[float | None, str]:
    """Return when the target would have ended without the action, and the basis of that figure.

    The forecast median (p50) end when there is one, else the time limit; never later than the
    time limit. A process of no job (a zombie) has no expected end: ``(None, "no end")``.
    """
    ev = dict(decision.evidence or {})
    limit_end = None
    job = _job_row(store, decision.job_id, now) if decision.target_kind == "job" else None
    start = ev.get("job_start_ts") or (job or {}).get("start_ts")
    limit = ev.get("time_limit_s") or (job or {}).get("time_limit_s")
    if start is None and ev.get("runtime_s") is not None:
        start = decision.ts - float(ev["runtime_s"])
    if start is not None and limit:
        limit_end = float(start) + float(limit)
    if decision.target_kind != "job":
        return None, "no end"
    for key in ("p50_end", "predicted_end"):
        if isinstance(ev.get(key), int | float):
            end = float(ev[key])
            return (min(end, limit_end) if limit_end else end), "forecast p50 end"
    forecast = _forecast_end(store, decision.job_id, now)
    if forecast is not None:
        return (min(forecast, limit_end) if limit_end else forecast), "forecast p50 end"
    if limit_end is not None:
        return limit_end, "time limit"
    return None, "unknown end"


def waste_seen_s(decision: Decision, store: AuditStore, now: float) -> float:
    """Return how long the target had been seen wasting at ``now``: the rule's window before its first
    finding in this episode, plus the time since that finding."""
    window = float((decision.evidence or {}).get("window_s") or 0.0)
    first = decision.ts
    esc = store.escalation(decision.rule, decision.target, "dry-run" if decision.mode == "dry-run" else "live")
    if esc and int(esc.get("episode") or 1) == decision.episode and esc.get("first_seen") is not None:
        first = min(first, float(esc["first_seen"]))
    return max(0.0, now - first) + window


def saving_row(decision: Decision, policy: Policy, store: AuditStore, now: float,
               gpu_model: str | None = None) -> dict[str, Any] | None:
    """Return the ledger row for a successful action of ``decision`` at ``now``, or None if it frees nothing."""
    if decision.action not in FREEING_ACTIONS or decision.gpus <= 0:
        return None
    end, basis = expected_end(decision, store, now)
    seen = waste_seen_s(decision, store, now)
    remaining = max(0.0, end - now) if end is not None else seen
    cap = max(0.0, week_end(now, policy.report.timezone) - now)
    credited = min(remaining, seen, cap)
    if credited == cap and cap < min(remaining, seen):
        why = "the end of the week"
    elif end is not None and remaining <= seen:
        why = basis
    else:
        why = f"the waste already seen ({seen / 3600.0:.2f} h)"
    hours = credited / 3600.0
    share = decision.evidence.get("gpu_share")  # MIG slices: their share of whole GPUs
    gpus = float(share) if isinstance(share, int | float) and not isinstance(share, bool) else float(decision.gpus)
    gpu_hours = round(gpus * hours, 4)
    model = gpu_model if gpu_model is not None else _gpu_model(store, decision, now)
    rate = policy.cost.gpu_hour(model)
    note = (f"freed: {decision.gpus} GPU x {hours:.2f} h, until {why}" if share is None else
            f"freed: {decision.gpus} MIG slice(s) = {gpus:.3g} GPU x {hours:.2f} h, until {why}")
    return {
        "saving_id": f"gpu:{decision.target}:{decision.episode}", "decision_id": decision.decision_id, "ts": now,
        "kind": "gpu", "target": decision.target, "user_name": decision.user, "account": decision.account,
        "gpu_model": model or "", "gpus": decision.gpus, "gpu_hours": gpu_hours, "kwh": 0.0,
        "usd": round(gpu_hours * rate, 2), "basis": note,
    }


def _gpu_model(store: AuditStore, decision: Decision, now: float) -> str:
    """Return the GPU model of the decision's GPUs, from the usage record near ``now``."""
    job = _job_row(store, decision.job_id, now)
    if job and job.get("gpu_model"):
        return str(job["gpu_model"]).split(",")[0]
    host = decision.host
    if not host:
        ids = list((decision.evidence or {}).get("gpu_ids") or [])
        host = str(ids[0]).split(":")[0] if ids else None
    if host:
        rows = store.fetch("gpu_models_of_host", {"host": host, "since": now - 2 * 86400, "until": now + 1})
        models = {r["gpu_model"] for r in rows if r["gpu_model"]}
        if models:
            return str(sorted(models)[0])
    return ""


def record_action_saving(store: AuditStore, decision: Decision, outcome: Outcome, ctx: ActionContext) -> None:
    """Write the saving of a successful live action (a ``SAVINGS_HOOKS`` entry); idempotent."""
    if outcome.status != "succeeded" or ctx.dry_run or decision.mode == "dry-run":
        return
    if outcome.details.get("already_gone") or outcome.details.get("noop"):
        logger.info("no saving for %s: the target was already gone", decision.target)
        return
    row = saving_row(decision, ctx.policy, store, ctx.now)
    if row is None:
        return
    n = store.execute("insert_saving", {**row, "run_id": ctx.run_id, "data_ts": ctx.now})
    if n:
        logger.info("saving %s: %.2f GPU-h, %.2f %s (%s)", row["saving_id"], row["gpu_hours"], row["usd"],
                    ctx.policy.cost.currency, row["basis"])


if record_action_saving not in SAVINGS_HOOKS:
    SAVINGS_HOOKS.append(record_action_saving)
