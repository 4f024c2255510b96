"""The weekly KPIs, computed from the audit store alone (usage record, decisions, actions, ledger).

:func:`compute` returns one JSON-able dict; the charts, the HTML, the Markdown, Slack and
``gpu-cost report --json`` all read that dict and nothing else. Every figure says what it counts:

- utilisation, waste and idle time come from ``gpu_cost_usage`` (what was *observed*);
- automated events from ``gpu_cost_actions`` (live, succeeded) and ``gpu_cost_decisions``; an
  action counts in the week its decision was taken, once (actions are keyed by decision);
- dry-run decisions are counted apart as "would have", and so is the GPU time they would have
  freed ("potential"): the report never claims what was only observed;
- right-sizing: the advice in force at the period's end (:func:`gpu_cost.capacity.rightsize.compute`, what
  ``gpu-cost rightsize show`` prints), and how many GPU jobs started in the period followed the advice
  ``sbatch`` showed (``gpu_cost_rightsize``, :func:`gpu_cost.capacity.rightsize.followed`);
- savings come from the savings ledger ``gpu_cost_savings`` only: *freed* (what the agent's actions,
  and owners' own releases after a notice, gave back, bounded by the waste seen on each target) and
  *re-used* (what other jobs were then given, measured from later sweeps); the headline is re-used
  (:func:`ledger_savings`, :mod:`gpu_cost.report.ledger`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from zoneinfo import ZoneInfo

from gpu_cost.audit.store import AuditStore
from gpu_cost.capacity import rightsize
from gpu_cost.config.schema import Policy
from gpu_cost.core import registry, timeutil
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.model import MODES
from gpu_cost.core.timeutil import iso, utc

logger = logging.getLogger(__name__)

#: event categories, mildest first: (key, label, actions), from each action's registered ``category``
CATEGORIES: tuple[tuple[str, str, frozenset[str]], ...] = registry.categories()
#: actions whose success gives GPUs back (declared ``frees_gpus=True``)
FREEING = registry.names(frees_gpus=True)
TREND_WEEKS = 4

# Report reads (aggregates over the contract tables); parameterised, never formatted.
_USAGE_BY_TS = """
SELECT ts, MAX(interval_s) AS interval_s, SUM(total_gpu_s) AS total, SUM(allocated_gpu_s) AS alloc, SUM(busy_gpu_s) AS busy,
       SUM(idle_alloc_gpu_s) AS idle_alloc, SUM(zombie_gpu_s) AS zombie, SUM(util_sum) AS util
FROM gpu_cost_usage WHERE ts > :since AND ts <= :until GROUP BY ts
"""
_USAGE_BY_OWNER = """
SELECT account, user_name, gpu_model, SUM(total_gpu_s) AS total, SUM(allocated_gpu_s) AS alloc,
       SUM(busy_gpu_s) AS busy, SUM(idle_alloc_gpu_s) AS idle_alloc, SUM(zombie_gpu_s) AS zombie,
       SUM(util_sum) AS util
FROM gpu_cost_usage WHERE ts > :since AND ts <= :until GROUP BY account, user_name, gpu_model
"""
_ACTIONS_OF_DECISIONS = """
SELECT a.action_id, a.decision_id, a.action, a.status, a.dry_run, a.target, d.ts AS ts, d.rule, d.user_name,
       d.account, d.gpus, d.mode
FROM gpu_cost_actions a JOIN gpu_cost_decisions d ON a.decision_id = d.decision_id
WHERE d.ts >= :since AND d.ts < :until
"""
_ANSWERS = """
SELECT answer_id, ts, channel, choice, status, decision_id, answered_by, role FROM gpu_cost_answers
WHERE ts >= :since AND ts < :until
"""
_RUNS = """
SELECT dag_id, mode, source, status, COUNT(*) AS n FROM gpu_cost_runs
WHERE data_ts > :since AND data_ts <= :until GROUP BY dag_id, mode, source, status
"""


# -- periods ------------------------------------------------------------------------------------
def data_end(store: AuditStore, now: float) -> float:
    """Return the instant a period counted back from ``now`` ends at: the store's newest sweep at or
    before ``now`` (a report is of the data, not of the clock), ``now`` when the store has none."""
    rows = store.fetch("latest_usage_instant", {"until": now})
    latest = rows[0].get("ts") if rows else None
    return float(latest) if latest is not None else float(now)


def recent_period(store: AuditStore, length_s: float, now: float) -> tuple[float, float]:
    """Return ``(since, until)``: the ``length_s`` of data ending at :func:`data_end` of ``now``.

    The one definition of "the last 7 days" of a store: the demo's report and ``gpu-cost report
    --since 7d`` read the same period of the same store, so they print the same figures.
    """
    until = data_end(store, now)
    return until - length_s, until


def week_bounds(at: float, timezone: str = "UTC", weeks_back: int = 1) -> tuple[float, float]:
    """Return the ISO week ``weeks_back`` weeks before the one holding ``at``
    (:func:`gpu_cost.core.timeutil.week_bounds`); an unknown time zone is named as ``report.timezone``."""
    try:
        return timeutil.week_bounds(at, timezone, weeks_back)
    except ValueError:
        raise GpuCostError(f"report.timezone: unknown time zone {timezone!r}") from None


def _shown_path(source: str) -> str:
    """Return a policy file's path as the report shows it: relative to the package's include folder
    (``include/policy/default.yaml``) when it lies there, as given otherwise."""
    from pathlib import Path

    from gpu_cost.core import paths

    try:
        inc = paths.include_dir().resolve()
        rel = Path(source).resolve().relative_to(inc)
    except (ValueError, OSError):
        return source
    return f"include/{rel}"


def _tz(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except Exception as exc:  # ZoneInfo raises several kinds
        raise GpuCostError(f"report.timezone: unknown time zone {name!r}") from exc


def period_label(since: float, until: float, timezone: str) -> str:
    tz = _tz(timezone)
    a = utc(since).astimezone(tz)
    b = utc(until - 1).astimezone(tz)
    year, week, _ = a.isocalendar()
    span = f"{a:%a %d %b} – {b:%a %d %b %Y}"
    if abs((until - since) - 7 * 86400) < 7200 and a.weekday() == 0 and a.hour == 0:
        return f"Week {week}, {year} ({span})"
    return span


WEEK_S = 7 * 86400.0
#: the share of a period its sweeps must cover for the report to speak of the whole period
FULL_COVER = 0.9


def previous_step(since: float, until: float) -> float:
    """Return how far back the periods a report is compared with lie: a week, or the period's own
    length when it is longer (so "the period before" never overlaps the one it is compared with)."""
    return max(WEEK_S, until - since)


def duration_text(seconds: float) -> str:
    """A length of time for a column heading: ``45 min``, ``10 h``, ``3.5 days``."""
    if seconds < 3600:
        return f"{max(1, round(seconds / 60))} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.0f} h" if seconds >= 10 * 3600 else f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} days"


def columns(since: float, until: float, measured_s: float) -> dict[str, Any]:
    """Return what a report's figures are of and what they are compared with, as its columns say it.

    ``this``: "this week" only for a week its sweeps covered; else the hours measured ("these 10 h"),
    or the period's length when it was covered. ``versus``: "vs last week" when the period is a week;
    a shorter period is compared with the same hours a week before, a longer one with the period before.
    """
    span = until - since
    is_week = abs(span - WEEK_S) < 7200
    covered = measured_s <= 0 or measured_s >= FULL_COVER * span  # nothing measured: the period is all there is
    this = "this week" if is_week and covered else f"these {duration_text(span if covered else measured_s)}"
    step = previous_step(since, until)
    if is_week:
        versus = "vs last week"
    elif step == WEEK_S:
        versus = f"vs the same {duration_text(span)} a week before"
    else:
        versus = f"vs the {duration_text(span)} before"
    return {"is_week": is_week, "this": this, "versus": versus,
            "measured": duration_text(measured_s) if measured_s > 0 else "nothing"}


# -- pure pieces (unit-tested on hand-made rows) ---------------------------------------------------
def _h(seconds: float) -> float:
    return round(float(seconds) / 3600.0, 2)


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 else None


def usage_totals(by_ts: Iterable[Mapping[str, Any]], since: float, until: float) -> dict[str, Any]:
    """Return the cluster totals from per-sweep sums (rows with interval_s, total, alloc, busy, idle_alloc,
    zombie, util).

    ``measured_hours``: the time the sweeps cover (each sweep's ``interval_s``, at most the period);
    ``gpus_avg``: the GPUs the cluster had over that time (None when nothing was measured). A period
    the agent measured 10 hours of has the GPUs of those 10 hours, not a tenth of them spread over a week.
    """
    t = dict.fromkeys(("total", "alloc", "busy", "idle_alloc", "zombie", "util"), 0.0)
    n = 0
    covered = 0.0
    for r in by_ts:
        n += 1
        covered += float(r.get("interval_s") or 0.0)
        for k in t:
            t[k] += float(r.get(k) or 0.0)
    measured = min(covered, max(0.0, until - since))
    # utilisation of allocated GPUs: busy work on allocated GPUs is not split out per row, so
    # use utilisation summed over owned groups (see by_owner) when available; here all GPUs.
    return {
        "sweeps": n,
        "measured_hours": _h(measured),
        "gpus_avg": round(t["total"] / covered, 1) if covered > 0 else None,
        "gpu_hours": _h(t["total"]),
        "allocated_gpu_hours": _h(t["alloc"]),
        "busy_gpu_hours": _h(t["busy"]),
        "idle_alloc_gpu_hours": _h(t["idle_alloc"]),
        "zombie_gpu_hours": _h(t["zombie"]),
        "allocation_ratio": _ratio(t["alloc"], t["total"]),
        "util_all_pct": None if t["total"] <= 0 else round(100.0 * t["util"] / t["total"], 1),
        "waste_ratio": _ratio(t["idle_alloc"], t["alloc"]),
    }


def owner_tables(rows: Iterable[Mapping[str, Any]], policy: Policy, top: int = 15) -> dict[str, Any]:
    """Return per-team and per-user waste tables and the utilisation of allocated GPUs.

    ``rows``: sums per (account, user_name, gpu_model); an empty user is unallocated GPU time.
    """
    teams: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    users: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    alloc_util = alloc_total = 0.0
    zombie_usd = zombie_h = 0.0
    for r in rows:
        rate = policy.cost.gpu_hour(r.get("gpu_model"))
        user = r.get("user_name") or ""
        if not user:
            zombie_h += float(r.get("zombie") or 0.0)
            zombie_usd += float(r.get("zombie") or 0.0) / 3600.0 * rate
            continue
        account = r.get("account") or "(no account)"
        alloc_util += float(r.get("util") or 0.0)
        alloc_total += float(r.get("alloc") or 0.0)
        for bucket in (teams[account], users[(user, account)]):
            bucket["alloc"] += float(r.get("alloc") or 0.0)
            bucket["idle"] += float(r.get("idle_alloc") or 0.0)
            bucket["util"] += float(r.get("util") or 0.0)
            bucket["idle_usd"] += float(r.get("idle_alloc") or 0.0) / 3600.0 * rate

    def table(items: Iterable[tuple[Any, dict[str, float]]], key: str) -> list[dict[str, Any]]:
        out = []
        for name, b in items:
            row: dict[str, Any] = {
                "allocated_gpu_hours": _h(b["alloc"]), "idle_gpu_hours": _h(b["idle"]),
                "waste_ratio": _ratio(b["idle"], b["alloc"]),
                "util_pct": None if b["alloc"] <= 0 else round(100.0 * b["util"] / b["alloc"], 1),
                "idle_cost": round(b["idle_usd"], 2),
            }
            if key == "user":
                row.update({"user": name[0], "account": name[1]})
            else:
                row["account"] = name
            out.append(row)
        out.sort(key=lambda x: (-x["idle_gpu_hours"], -x["allocated_gpu_hours"], str(x.get("user", x["account"]))))
        return out

    team_rows = table(teams.items(), "account")
    user_rows = table(users.items(), "user")
    idle_usd = sum(b["idle_usd"] for b in teams.values())
    return {
        "by_team": team_rows,
        "by_user": user_rows[:top],
        "users_with_idle": sum(1 for u in user_rows if u["idle_gpu_hours"] > 0),
        "util_alloc_pct": None if alloc_total <= 0 else round(100.0 * alloc_util / alloc_total, 1),
        "idle_cost": round(idle_usd, 2),
        "zombie_cost": round(zombie_usd, 2),
        "zombie_gpu_hours_unowned": _h(zombie_h),
    }


def category_of(action: str) -> str | None:
    for key, _, actions in CATEGORIES:
        if action in actions:
            return key
    return None


def event_counts(actions: Iterable[Mapping[str, Any]], decisions: Iterable[Mapping[str, Any]],
                 snoozes: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Return live events (succeeded, not dry-run actions; each action id once) and dry-run "would have" counts.

    ``actions``: action rows joined with their decision (``ts``, ``mode``); ``decisions``: decision rows.
    """
    live: dict[str, int] = {k: 0 for k, _, _ in CATEGORIES}
    failed = 0
    seen: set[str] = set()
    for a in actions:
        if a["action_id"] in seen:
            continue
        seen.add(a["action_id"])
        if int(a.get("dry_run") or 0) or a.get("mode") == "dry-run":
            continue
        if a["status"] == "failed":
            failed += 1
        if a["status"] != "succeeded":
            continue
        cat = category_of(a["action"])
        if cat:
            live[cat] += 1
    would: dict[str, int] = {k: 0 for k, _, _ in CATEGORIES}
    approvals = {"requested": 0, "approved": 0, "rejected": 0, "timed_out": 0, "pending": 0}
    for d in decisions:
        if d.get("mode") == "dry-run":
            cat = category_of(d["action"])
            if cat and d["action"] != "none":
                would[cat] += 1
            continue
        if int(d.get("requires_approval") or 0) and d.get("status") != "capped":
            approvals["requested"] += 1
            status = d.get("approval_status") or "pending"
            approvals[status if status in approvals else "pending"] += 1
    snooze_n = sum(1 for _ in snoozes)
    return {"live": live, "would_have": would, "approvals": approvals, "snoozes": snooze_n, "failed": failed,
            "live_total": sum(live.values()), "would_have_total": sum(would.values())}


def answer_kpis(answers: Iterable[Mapping[str, Any]], actions: Iterable[Mapping[str, Any]],
                decided_at: Mapping[str, float]) -> dict[str, Any]:
    """What people answered the period's notices: kept, released, wrong, refused; the share of
    notices answered "wrong"; how long answers took (from the notice's decision to the answer).

    :param answers: ``gpu_cost_answers`` rows given in the period
    :param actions: the period's action rows (notices sent are the live, succeeded notices)
    :param decided_at: decision id → when it was decided (for the time to answer)
    """
    rows = list(answers)
    accepted = [a for a in rows if a.get("status") == "accepted"]
    by = {c: sum(1 for a in accepted if a.get("choice") == c) for c in ("keep", "release", "wrong")}
    notices = {str(a["decision_id"]) for a in actions
               if category_of(str(a["action"])) == "notifications" and not a["dry_run"] and a["status"] == "succeeded"}
    wrong_notices = {str(a["decision_id"]) for a in accepted if a.get("choice") == "wrong"} & notices
    answered = {str(a["decision_id"]) for a in accepted} & notices
    waits = sorted(float(a["ts"]) - decided_at[str(a["decision_id"])] for a in accepted
                   if str(a.get("decision_id")) in decided_at and float(a["ts"]) >= decided_at[str(a["decision_id"])])
    median = waits[len(waits) // 2] if waits else None
    p90 = waits[min(len(waits) - 1, int(0.9 * len(waits)))] if waits else None
    return {"kept": by["keep"], "released": by["release"], "wrong": by["wrong"],
            "refused": sum(1 for a in rows if a.get("status") == "refused"),
            "notices": len(notices), "answered": len(answered), "answered_share": _ratio(len(answered), len(notices)),
            "wrong_share": _ratio(len(wrong_notices), len(notices)),
            "median_answer_h": round(median / 3600, 2) if median is not None else None,
            "p90_answer_h": round(p90 / 3600, 2) if p90 is not None else None}


#: a verifier model's status (:data:`gpu_cost.learn.verifier.STATUSES`) as the report says it to a manager
VERIFIER_STATUS_TEXT = {
    "active": "In use: it is asked before every destructive action",
    "too_few_labels": "Not in use yet: too few decisions with a known outcome to learn from",
    "one_class": "Not in use yet: every decision with a known outcome went the same way, nothing to learn from",
    "refused": "Not in use: the last training gave a model that cannot score; the one before it, if any, goes on",
}


def verifier_kpis(store: AuditStore, decisions: Sequence[Mapping[str, Any]], until: float) -> dict[str, Any] | None:
    """The verifier in use at the period's end (its training window, labels and backtest), and how many
    of the period's destructive rungs it held back; None when no model was ever trained."""
    rows = store.fetch("latest_verifier_model", {"until": until})
    if not rows:
        return None
    m = rows[0]
    held = sum(1 for d in decisions if "verifier.min_probability" in str(d.get("reason") or ""))
    return {"model_id": m["model_id"], "status": m["status"], "status_text": VERIFIER_STATUS_TEXT.get(
                str(m["status"]).lower(), f"not in use ({m['status']})"), "trained_at": iso(float(m["trained_at"])),
            "since": iso(float(m["since_ts"])) if m.get("since_ts") is not None else None,
            "until": iso(float(m["until_ts"])) if m.get("until_ts") is not None else None,
            "labels": int(m["labels"] or 0), "false_positives": int(m["false_positives"] or 0),
            "precision": m.get("backtest_precision"), "recall": m.get("backtest_recall"),
            "false_kills_prevented": m.get("false_kills_prevented"), "gpu_hours_given_up": m.get("gpu_hours_given_up"),
            "held": held}


def potential_savings(store: AuditStore, decisions: Iterable[Mapping[str, Any]], policy: Policy,
                      until: float) -> dict[str, Any]:
    """Return GPU time dry-run decisions *would* have freed (one per target and episode), counted as the ledger
    counts a live action (:func:`gpu_cost.act.savings.saving_row`) at the decision's instant, capped at ``until``."""
    from gpu_cost.act.savings import saving_row
    from gpu_cost.core.model import Decision

    best: dict[tuple[str, int], tuple[float, float, float]] = {}
    for d in sorted(decisions, key=lambda x: float(x["ts"])):
        if d.get("mode") != "dry-run" or d["action"] not in FREEING or not d.get("gpus"):
            continue
        key = (d["target"], int(d.get("episode") or 1))
        if key in best:
            continue
        ts = float(d["ts"])
        row = saving_row(Decision.from_row(d), policy, store, ts)
        if row is None:
            continue
        hours = min(float(row["gpu_hours"]), float(d["gpus"]) * max(0.0, until - ts) / 3600.0)
        rate = float(row["usd"]) / float(row["gpu_hours"]) if row["gpu_hours"] else 0.0
        best[key] = (ts, hours, hours * rate)
    return {"count": len(best), "gpu_hours": round(sum(h for _, h, _ in best.values()), 2),
            "cost": round(sum(c for _, _, c in best.values()), 2),
            "points": sorted((ts, round(h, 3)) for ts, h, _ in best.values())}


def savings_totals(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Return savings from ledger rows: totals and by kind (each saving once)."""
    by_kind: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    points = []
    seen: set[str] = set()
    for r in rows:
        if r["saving_id"] in seen:
            continue
        seen.add(r["saving_id"])
        k = by_kind[r["kind"]]
        k["count"] += 1
        k["gpu_hours"] += float(r.get("gpu_hours") or 0.0)
        k["kwh"] += float(r.get("kwh") or 0.0)
        k["cost"] += float(r.get("usd") or 0.0)
        points.append((float(r["ts"]), round(float(r.get("gpu_hours") or 0.0), 3), round(float(r.get("usd") or 0.0), 2)))
    total = {f: round(sum(k[f] for k in by_kind.values()), 2) for f in ("gpu_hours", "kwh", "cost")}
    total["count"] = int(sum(k["count"] for k in by_kind.values()))
    return {**total, "by_kind": {kind: {f: round(v, 2) for f, v in k.items()} for kind, k in sorted(by_kind.items())},
            "points": sorted(points)}


def right_sizing(advice: Iterable[rightsize.Advice], top: int = 10) -> list[dict[str, Any]]:
    """Return the right-sizing advice in force at the period's end, as the report lists it: the rows of
    :func:`gpu_cost.capacity.rightsize.compute` with something to advise (what ``gpu-cost rightsize show`` prints
    and ``sbatch`` shows), most GPU time held beyond need first.

    One definition of what a job needed (:func:`gpu_cost.report.usage.gpus_needed`: its busy GPUs,
    those without fresh data, its work and its memory) and of the advice, for the report, the CLI and
    ``sbatch``.
    """
    rows = [a for a in advice if a.status == "advice"]
    rows.sort(key=lambda a: (-a.idle_gpu_hours, a.user, a.scope != "user", a.stem))
    return [{"user": a.user, "stem": a.stem, "scope": a.scope, "jobs": a.jobs, "requested": a.gpus_asked,
             "need": a.gpus_need, "suggest": a.gpus_advice, "time_advice_s": a.time_advice_s,
             "who": a.user if a.scope == "user" else f"{a.user} / {a.stem}", "text": a.text,
             "held_beyond_need_gpu_hours": round(a.idle_gpu_hours, 1)} for a in rows[:top]]


def heatmap(by_ts: Iterable[Mapping[str, Any]], timezone: str) -> list[list[float | None]]:
    """Return mean utilisation % of all GPUs per weekday (rows Mon..Sun) x hour (0..23), None where unseen."""
    tz = _tz(timezone)
    util = [[0.0] * 24 for _ in range(7)]
    total = [[0.0] * 24 for _ in range(7)]
    for r in by_ts:
        # a row describes the interval ending at ts: bucket it by its middle
        t = float(r["ts"]) - float(r.get("interval_s") or 0.0) / 2
        local = utc(t).astimezone(tz)
        util[local.weekday()][local.hour] += float(r.get("util") or 0.0)
        total[local.weekday()][local.hour] += float(r.get("total") or 0.0)
    return [[None if total[d][h] <= 0 else round(100.0 * util[d][h] / total[d][h], 1) for h in range(24)]
            for d in range(7)]


def daily_series(since: float, until: float, timezone: str, actions: Iterable[Mapping[str, Any]],
                 decisions: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Return per-day counts of live events by category and of dry-run "would have" decisions."""
    tz = _tz(timezone)
    days = []
    day = utc(since).astimezone(tz).date()
    last = utc(until - 1).astimezone(tz).date()
    while day <= last:
        days.append(day.isoformat())
        day += dt.timedelta(days=1)
    index = {d: i for i, d in enumerate(days)}
    live = {k: [0] * len(days) for k, _, _ in CATEGORIES}
    would = [0] * len(days)
    seen: set[str] = set()
    for a in actions:
        if a["action_id"] in seen or a["status"] != "succeeded" or int(a.get("dry_run") or 0) or a.get("mode") == "dry-run":
            continue
        seen.add(a["action_id"])
        cat = category_of(a["action"])
        i = index.get(utc(float(a["ts"])).astimezone(tz).date().isoformat())
        if cat and i is not None:
            live[cat][i] += 1
    for d in decisions:
        if d.get("mode") == "dry-run" and d["action"] != "none" and category_of(d["action"]):
            i = index.get(utc(float(d["ts"])).astimezone(tz).date().isoformat())
            if i is not None:
                would[i] += 1
    return {"days": days, "live": live, "would_have": would}


def change(current: Mapping[str, Any], previous: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Return deltas of the headline figures against last week and the mean of the previous weeks."""
    out: dict[str, Any] = {}
    for key in ("util_all_pct", "util_alloc_pct", "waste_ratio", "idle_alloc_gpu_hours", "zombie_gpu_hours",
                "savings_gpu_hours", "savings_cost"):
        cur = current.get(key)
        prev = [float(p[key]) for p in previous if p.get("has_data") and p.get(key) is not None]
        last = previous[0].get(key) if previous and previous[0].get("has_data") else None
        out[key] = {
            "current": cur,
            "vs_last_week": None if cur is None or last is None else round(cur - last, 4),
            "vs_mean": None if cur is None or not prev else round(cur - sum(prev) / len(prev), 4),
        }
    return out


def ledger_savings(store: AuditStore, policy: Policy, decisions: Sequence[Mapping[str, Any]], since: float,
                   until: float) -> dict[str, Any]:
    """Return the period's savings: ``freed`` (the ledger, plus owners' own releases after a notice),
    ``reused`` (what other jobs were then given, :func:`gpu_cost.report.ledger.reused`) and the headline.

    The headline money is the re-used GPU time's value plus the power savings' energy value: GPU time
    freed that nobody needed is shown (``freed``) but is not money saved.
    """
    from gpu_cost.report import ledger

    rows = store.fetch("savings_between", {"since": since, "until": until})
    acted = {str(r["target"]).split(":", 1)[1] for r in rows if str(r.get("target") or "").startswith("job:")}
    owner = ledger.owner_releases(store, decisions, policy, since, until, acted)
    every = [*rows, *owner]
    freed = savings_totals(every)
    per_saving = ledger.reused(store, every, until)
    rate = {str(r["saving_id"]): float(r.get("usd") or 0.0) / float(r["gpu_hours"])
            for r in every if float(r.get("gpu_hours") or 0.0) > 0}
    gpu_freed = sum(float(r.get("gpu_hours") or 0.0) for r in every if r.get("kind") in ("gpu", "owner"))
    reused_h = sum(per_saving.values())
    reused_cost = sum(h * rate.get(sid, 0.0) for sid, h in per_saving.items())
    power_cost = float(freed["by_kind"].get("power", {}).get("cost", 0.0))
    return {
        "freed": freed,
        "reused": {"gpu_hours": round(reused_h, 2), "cost": round(reused_cost, 2),
                   "count": sum(1 for h in per_saving.values() if h > 0), "share_of_freed": _ratio(reused_h, gpu_freed),
                   "by_saving": {k: round(v, 3) for k, v in sorted(per_saving.items())}},
        "power_cost": round(power_cost, 2),
        "headline_cost": round(reused_cost + power_cost, 2),
    }


# -- the whole thing -------------------------------------------------------------------------------
def _week_summary(store: AuditStore, policy: Policy, since: float, until: float) -> dict[str, Any]:
    by_ts = store.query(_USAGE_BY_TS, {"since": since, "until": until})
    tot = usage_totals(by_ts, since, until)
    owners = owner_tables(store.query(_USAGE_BY_OWNER, {"since": since, "until": until}), policy)
    sav = ledger_savings(store, policy, store.fetch("decisions_between", {"since": since, "until": until}), since, until)
    return {"since": iso(since), "until": iso(until), "label": period_label(since, until, policy.report.timezone),
            "has_data": tot["sweeps"] > 0, "util_all_pct": tot["util_all_pct"], "util_alloc_pct": owners["util_alloc_pct"],
            "waste_ratio": tot["waste_ratio"], "idle_alloc_gpu_hours": tot["idle_alloc_gpu_hours"],
            "zombie_gpu_hours": tot["zombie_gpu_hours"], "savings_gpu_hours": sav["reused"]["gpu_hours"],
            "savings_cost": sav["headline_cost"], "freed_gpu_hours": sav["freed"]["gpu_hours"]}


def compute(store: AuditStore, policy: Policy, since: float, until: float, trend_weeks: int = TREND_WEEKS) -> dict[str, Any]:
    """Return every KPI of the report for ``[since, until)``, from the audit store."""
    if until <= since:
        raise GpuCostError(f"report period is empty: since {iso(since)} is not before until {iso(until)}")
    tzname = policy.report.timezone
    _tz(tzname)
    by_ts = store.query(_USAGE_BY_TS, {"since": since, "until": until})
    totals = usage_totals(by_ts, since, until)
    owners = owner_tables(store.query(_USAGE_BY_OWNER, {"since": since, "until": until}), policy)
    decisions = store.fetch("decisions_between", {"since": since, "until": until})
    actions = store.query(_ACTIONS_OF_DECISIONS, {"since": since, "until": until})
    snoozes = [s for s in store.fetch("active_snoozes", {"now": since}) if since <= float(s["created_at"]) < until]
    events = event_counts(actions, decisions, snoozes)
    given = store.query(_ANSWERS, {"since": since, "until": until})
    asked = {str(a["decision_id"]) for a in given if a.get("decision_id")}
    decided_at = {str(d["decision_id"]): float(d["ts"]) for d in store.decisions_by_ids(asked)} if asked else {}
    answered = answer_kpis(given, actions, decided_at)
    savings = ledger_savings(store, policy, decisions, since, until)
    freed, reused = savings["freed"], savings["reused"]
    potential = potential_savings(store, decisions, policy, until)
    sizing = right_sizing(rightsize.compute(store, policy, until))
    advice = rightsize.followed(store, since, until)
    runs = store.query(_RUNS, {"since": since, "until": until})
    rate = policy.cost.gpu_hour("default")
    cluster = {**totals, "util_alloc_pct": owners["util_alloc_pct"],
               "idle_cost": owners["idle_cost"], "zombie_cost": owners["zombie_cost"],
               "waste_cost": round(owners["idle_cost"] + owners["zombie_cost"], 2)}
    current = {"has_data": totals["sweeps"] > 0, "util_all_pct": totals["util_all_pct"],
               "util_alloc_pct": owners["util_alloc_pct"], "waste_ratio": totals["waste_ratio"],
               "idle_alloc_gpu_hours": totals["idle_alloc_gpu_hours"], "zombie_gpu_hours": totals["zombie_gpu_hours"],
               "savings_gpu_hours": reused["gpu_hours"], "savings_cost": savings["headline_cost"],
               "freed_gpu_hours": freed["gpu_hours"]}
    # the periods before, back to back: a period longer than a week steps back by its own length, so
    # "last week" never overlaps the period it is compared with
    step = previous_step(since, until)
    previous = [_week_summary(store, policy, since - step * k, until - step * k) for k in range(1, trend_weeks + 1)]
    # the policy's modes the period's runs ran in, mildest first; a run with none (its policy never
    # loaded) or an older agent's non-mode ("refused" was once written there) is no mode
    modes = [m for m in MODES if any(r.get("mode") == m for r in runs)]
    result = {
        "period": {"since": iso(since), "until": iso(until), "timezone": tzname,
                   "label": period_label(since, until, tzname), "measured_hours": totals["measured_hours"],
                   **columns(since, until, totals["measured_hours"] * 3600.0)},
        "currency": policy.cost.currency,
        "gpu_hour_price": rate,
        "policy": {"source": _shown_path(policy.source), "mode": policy.mode},
        "thresholds": {"busy_util": policy.sweep.busy_util, "idle_util": policy.rules.idle_allocation.util_max},
        "cluster": cluster,
        "by_team": owners["by_team"],
        "by_user": owners["by_user"],
        "users_with_idle": owners["users_with_idle"],
        "events": events,
        "answers": answered,
        "verifier": verifier_kpis(store, decisions, until),
        "savings": {**savings, "potential": potential},
        "right_sizing": sizing,
        #: the advice shown at sbatch: jobs it applied to, how many followed it (None: never published)
        "rightsize_advice": advice,
        "heatmap": heatmap(by_ts, tzname),
        "daily": daily_series(since, until, tzname, actions, decisions),
        # only weeks with data: a week before the agent was installed is not a week of 0 % utilisation
        "trend": [{**p} for p in reversed(previous) if p["has_data"]] + [{"label": period_label(since, until, tzname), "since": iso(since),
                                                           "until": iso(until), **current}],
        "change": change(current, previous),
        "data": {
            "sweeps": totals["sweeps"], "decisions": len(decisions), "actions": len({a["action_id"] for a in actions}),
            "runs": [{"dag_id": r["dag_id"], "mode": r["mode"], "source": r["source"], "status": r["status"],
                      "n": int(r["n"])} for r in runs],
            "modes": modes,
            #: runs that read the simulator, not a real cluster (the report says so at the top)
            "simulated_runs": sum(int(r["n"]) for r in runs if "sim" in str(r.get("source") or "").split(" ", 1)[0]),
        },
    }
    logger.info("KPIs for %s: %s sweeps, util %.1f%%, waste ratio %s, %d live events, %.1f GPU-h saved",
                result["period"]["label"], totals["sweeps"], totals["util_all_pct"] or 0.0, totals["waste_ratio"],
                events["live_total"], freed["gpu_hours"])
    return result
