"""Outcomes: what happened after each decision that did something, read from the later sweeps.

Every sweep writes one ``gpu_cost_jobs_usage`` row per running job, so the store knows, for a job
an earlier decision was about, whether it went back to work, stopped appearing, or stayed idle.
Each decision whose action is not ``none`` (a dry-run's "would" decisions included: they are what a
going-live week learns from) gets one outcome, computed, never guessed:

* ``wrong`` — an accepted "this is wrong" answer to the decision or its episode;
* ``active_again`` — a later usage row of the target's job within ``verifier.horizon`` shows a GPU
  above the idle threshold (``after_s`` says how soon);
* ``acted`` — an action that ends the job (cancel, terminate, kill) succeeded on it first: what it
  would have done next is unknowable, so it is no label (a demote or a hold leaves the job running,
  and its later usage still tells);
* ``snoozed`` — a snooze covering the target was set within the horizon and it stayed idle;
* ``ended`` — the job stopped appearing (a later sweep no longer saw it) without being acted on;
* ``still_idle`` — it was seen through the whole horizon and never active;
* ``pending`` — too recent to say; ``unobserved`` — not a job (a process, a GPU): the usage rows
  do not follow it, only answers, actions and snoozes do.

``active_again`` and ``wrong`` are false positives; ``ended`` and ``still_idle`` confirm the waste;
the rest are not labels (:func:`label_of`). The results go to ``gpu_cost_outcomes`` with the data
instant they were computed at; an older instant never replaces a newer one.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_cost.audit.store import AuditStore
from gpu_cost.config.schema import Policy
from gpu_cost.core.model import KILL_ACTIONS

logger = logging.getLogger(__name__)

OUTCOMES = ("active_again", "wrong", "acted", "snoozed", "ended", "still_idle", "pending", "unobserved")
#: outcomes that say the finding was not waste
FALSE_POSITIVE = frozenset({"active_again", "wrong"})
#: outcomes that confirm the waste
CONFIRMED = frozenset({"ended", "still_idle"})
#: a job is gone when sweeps went on this long after its last usage row (two sweeps of 5 min)
ENDED_GAP = 600.0


def label_of(outcome: str) -> int | None:
    """Return 1 (waste confirmed), 0 (false positive) or None (no label) for an outcome."""
    if outcome in FALSE_POSITIVE:
        return 0
    if outcome in CONFIRMED:
        return 1
    return None


def _chunks(items: Sequence[str], n: int = 500) -> list[list[str]]:
    return [list(items[i:i + n]) for i in range(0, len(items), n)]


def compute(store: AuditStore, now: float, horizon: float, since: float) -> list[dict[str, Any]]:
    """Return the outcome row of every decision (action not ``none``) made in ``[since, now]``, as the
    store shows it at ``now``."""
    decisions = store.fetch("decisions_to_label", {"since": since, "until": now})
    if not decisions:
        return []
    last = store.fetch("last_job_usage_ts", {"until": now})
    latest = float(last[0]["ts"]) if last and last[0].get("ts") is not None else None
    t_min = min(float(d["ts"]) for d in decisions)
    jobs = sorted({str(d["job_id"]) for d in decisions if d["target_kind"] == "job" and d.get("job_id")})
    seen: dict[str, tuple[list[float], list[int]]] = {}
    for part in _chunks(jobs):
        for r in store.fetch("job_usage_of_jobs", {"job_ids": part, "since": t_min, "until": now}):
            ts, act = seen.setdefault(str(r["job_id"]), ([], []))
            ts.append(float(r["ts"]))
            act.append(int(r["gpus_active"] or 0))
    targets = sorted({str(d["target"]) for d in decisions})
    ended_by: dict[str, list[float]] = {}
    for part in _chunks(targets):
        for r in store.fetch("succeeded_actions_on", {"targets": part, "actions": sorted(KILL_ACTIONS),
                                                      "since": t_min}):
            if r.get("finished_at") is not None:
                ended_by.setdefault(str(r["target"]), []).append(float(r["finished_at"]))
    for v in ended_by.values():
        v.sort()
    snoozes: dict[str, list[float]] = {}
    for r in store.fetch("snoozes_created_since", {"since": t_min, "until": now}):
        snoozes.setdefault(str(r["target"]), []).append(float(r["created_at"]))
    wrong_by_id: dict[str, float] = {}
    wrong_by_episode: dict[tuple[str, str, int], float] = {}
    for r in store.fetch("wrong_answers_since", {"since": t_min, "until": now}):
        if r.get("decision_id"):
            wrong_by_id.setdefault(str(r["decision_id"]), float(r["ts"]))
        if r.get("target") and r.get("episode") is not None:
            wrong_by_episode.setdefault((str(r["rule"]), str(r["target"]), int(r["episode"])), float(r["ts"]))
    out = []
    for d in decisions:
        outcome, at = _outcome(d, now, horizon, latest, seen, ended_by, snoozes, wrong_by_id, wrong_by_episode)
        t0 = float(d["ts"])
        out.append({"decision_id": d["decision_id"], "ts": t0, "rule": d["rule"], "target": d["target"],
                    "episode": int(d["episode"] or 1), "job_id": d.get("job_id"), "user_name": d.get("user_name"),
                    "action": d["action"], "outcome": outcome, "outcome_ts": at,
                    "after_s": None if at is None else round(max(0.0, at - t0), 1), "horizon_s": float(horizon)})
    return out


def _outcome(d: Mapping[str, Any], now: float, horizon: float, latest: float | None,
             seen: Mapping[str, tuple[list[float], list[int]]], ended_by: Mapping[str, list[float]],
             snoozes: Mapping[str, list[float]], wrong_by_id: Mapping[str, float],
             wrong_by_episode: Mapping[tuple[str, str, int], float]) -> tuple[str, float | None]:
    t0 = float(d["ts"])
    until = t0 + horizon
    target = str(d["target"])
    wrong = wrong_by_id.get(str(d["decision_id"]))
    if wrong is None:
        wrong = wrong_by_episode.get((str(d["rule"]), target, int(d["episode"] or 1)))
    if wrong is not None and wrong >= t0:
        return "wrong", wrong
    kills = [k for k in ended_by.get(target, []) if k >= t0]
    kill = kills[0] if kills and kills[0] <= until else None
    keys = [target, f"job:{d.get('job_id')}", f"user:{d.get('user_name')}"]
    snoozed = min((s for k in keys for s in snoozes.get(k, []) if t0 <= s <= until), default=None)
    known = min(now, latest) if latest is not None else now
    if d["target_kind"] != "job" or not d.get("job_id"):
        if kill is not None:
            return "acted", kill
        if snoozed is not None:
            return "snoozed", snoozed
        return ("unobserved", until) if known >= until else ("pending", None)
    ts, act = seen.get(str(d["job_id"]), ([], []))
    lo = bisect.bisect_right(ts, t0)
    hi = bisect.bisect_right(ts, until)
    for i in range(lo, hi):
        if act[i] > 0 and (kill is None or ts[i] < kill):
            return "active_again", ts[i]
    if kill is not None:
        return "acted", kill
    if snoozed is not None and known >= until:
        return "snoozed", snoozed
    last_seen = ts[hi - 1] if hi > lo else t0
    after = ts[hi] if hi < len(ts) else None
    if after is None and latest is not None and latest > last_seen and last_seen < min(until, latest) - ENDED_GAP:
        return "ended", last_seen  # later sweeps no longer saw it, and nothing ended it
    if known >= until:
        return "still_idle", until
    return "pending", None


def refresh(store: AuditStore, policy: Policy, now: float, run_id: str | None = None) -> dict[str, int]:
    """Compute the outcomes of the decisions of the last ``verifier.history`` and store them; return
    the count per outcome."""
    cfg = policy.verifier
    rows = compute(store, now, cfg.horizon, now - cfg.history)
    if rows:
        store.execute("upsert_outcome", [{**r, "run_id": run_id, "data_ts": now} for r in rows])
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    logger.info("outcomes of %d decisions: %s", len(rows), counts)
    return counts
