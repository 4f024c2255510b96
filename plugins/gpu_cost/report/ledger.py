"""What the savings ledger's freed GPU time became, measured from the sweeps that came after.

The ledger (:mod:`gpu_cost.act.savings`) books *freed* GPU-hours when an action succeeds: GPUs x
the shorter of the time the target had left and the waste already seen on it. Two figures need
the sweeps that followed, so the report computes them from the usage record:

- **re-used**: of the freed GPU-hours, those that other jobs were actually given and could not
  have had without the action. For each later sweep inside the freed span, on each host that gave
  GPUs back: the GPUs allocated there beyond what the host could have offered had the target kept
  its GPUs (``allocated - (host GPUs - freed)``), never more than the GPUs freed there; times the
  sweep's interval (its overlap with the span). A host with spare GPUs re-uses nothing, however
  many jobs start on it; on an idle cluster nothing is re-used, and the report says so: a freed
  GPU nobody needed saved power at most, not money.
- **released by the owner**: a notice or advice saves nothing when it is sent. When the owner then
  ends the job (it leaves the usage record while sweeps go on, idle in the last sweep that saw it:
  a job busy to its last sample finished its work) before the end it would have had,
  the GPUs it gave back count, bounded the same way as the agent's own actions (the end it would
  have had, the waste already seen, the week), and only when no action of the agent ended it.

Both are pure reads of the audit store; the ledger itself is never rewritten.
"""

from __future__ import annotations

import bisect
import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_cost.audit.store import AuditStore
from gpu_cost.config.schema import Policy
from gpu_cost.core import registry
from gpu_cost.core.model import Decision
from gpu_cost.core.timeutil import epoch

logger = logging.getLogger(__name__)

#: actions that only tell someone: the owner may release the GPUs themselves afterwards
TELLING = frozenset({"notify", "advise", "notify_manager"}) & registry.names()

_HOST_ALLOC = """
SELECT ts, host, MAX(interval_s) AS interval_s, SUM(allocated_gpu_s) AS alloc, SUM(total_gpu_s) AS total
FROM gpu_cost_usage WHERE ts > :since AND ts <= :until GROUP BY ts, host
"""
#: the longest time a sweep after ``since`` stood for: how far past a span's end a sweep may still cover it
_LONGEST_AFTER = "SELECT MAX(interval_s) AS interval_s FROM gpu_cost_usage WHERE ts > :since AND ts <= :until"
_JOB_SEEN = """
SELECT job_id, MIN(ts) AS first_ts, MAX(ts) AS last_ts, MAX(interval_s) AS interval_s, MAX(gpus) AS gpus,
       MAX(gpu_model) AS gpu_model
FROM gpu_cost_jobs_usage WHERE ts > :since AND ts <= :until GROUP BY job_id
"""
_LAST_SWEEP = "SELECT MAX(ts) AS ts FROM gpu_cost_jobs_usage WHERE ts <= :until"
#: each job's GPUs above the idle threshold in the last sweep that saw it
_LAST_ACTIVE = """
SELECT u.job_id, u.gpus_active FROM gpu_cost_jobs_usage u
WHERE u.ts > :since AND u.ts <= :until
  AND u.ts = (SELECT MAX(v.ts) FROM gpu_cost_jobs_usage v WHERE v.job_id = u.job_id AND v.ts <= :until)
"""


def _gpus_by_host(decision: Mapping[str, Any]) -> dict[str, int]:
    """Return how many of the decision's GPUs sit on each host."""
    ev = decision.get("evidence")
    data = json.loads(ev) if isinstance(ev, str) and ev else (ev or {})
    ids = [str(i) for i in (data.get("gpu_ids") or [])] if isinstance(data, dict) else []
    hosts: dict[str, int] = defaultdict(int)
    for gpu_id in ids:
        hosts[gpu_id.rsplit(":", 1)[0]] += 1
    if not hosts and decision.get("host"):
        hosts[str(decision["host"])] = int(decision.get("gpus") or 0)
    return dict(hosts)


def reused(store: AuditStore, savings: Iterable[Mapping[str, Any]], until: float) -> dict[str, float]:
    """Return, per ``saving_id`` of GPU savings, the GPU-hours other jobs were given inside its freed span."""
    rows = [s for s in savings if s.get("kind") in ("gpu", "owner") and float(s.get("gpu_hours") or 0) > 0 and s.get("decision_id")]
    if not rows:
        return {}
    decisions = {d["decision_id"]: d for d in store.decisions_by_ids([str(s["decision_id"]) for s in rows])}
    start = min(float(s["ts"]) for s in rows) - 86400.0
    end = max(float(s["ts"]) + float(s["gpu_hours"]) * 3600.0 / max(1, int(s["gpus"] or 1)) for s in rows)
    alloc: dict[str, list[tuple[float, float, float, float]]] = defaultdict(list)
    hi = min(end, until) + 1
    # the sweeps up to the latest span's end, and those after it that still cover part of a span (a sweep
    # stands for ts - interval to ts): the first sweep stamped after a span's end holds its last minutes
    after = None
    if end < until:
        after = (store.query(_LONGEST_AFTER, {"since": hi, "until": until + 1})[0] or {}).get("interval_s")
    for r in store.scan(_HOST_ALLOC, {"since": start, "until": min(end + float(after or 0.0), until) + 1}):
        interval = float(r["interval_s"] or 0.0)
        if interval > 0:
            alloc[str(r["host"])].append((float(r["ts"]), interval, float(r["alloc"] or 0.0) / interval,
                                          float(r["total"] or 0.0) / interval))
    for series in alloc.values():
        series.sort()
    # per host: its sweeps' instants, and the longest time one of them stood for (a sweep covers ts - interval to ts)
    instants = {host: [x[0] for x in series] for host, series in alloc.items()}
    longest = {host: max(x[1] for x in series) for host, series in alloc.items()}
    out: dict[str, float] = {}
    for s in rows:
        d = decisions.get(str(s["decision_id"]))
        if d is None:
            continue
        gpus = max(1, int(s["gpus"] or 1))
        t0 = float(s["ts"])
        t1 = min(t0 + float(s["gpu_hours"]) * 3600.0 / gpus, until)
        total = 0.0
        for host, freed in _gpus_by_host(d).items():
            if host not in alloc:
                continue
            # the host's sweeps that can overlap the span, in order: none before t0 does, none a second past
            # t1 + its longest interval does (a week of sweeps per saving otherwise)
            first = bisect.bisect_right(instants[host], t0)
            last = bisect.bisect_left(instants[host], t1 + longest[host] + 1.0, lo=first)
            for ts, interval, allocated, host_gpus in alloc[host][first:last]:
                lo, hi = max(ts - interval, t0), min(ts, t1)
                if ts <= t0 or hi <= lo:
                    continue
                # without the action the host could have offered host_gpus - freed GPUs to others
                total += min(float(freed), max(0.0, allocated - (host_gpus - freed))) * (hi - lo)
        out[str(s["saving_id"])] = round(min(total / 3600.0, float(s["gpu_hours"])), 4)
    return out


def owner_releases(store: AuditStore, decisions: Iterable[Mapping[str, Any]], policy: Policy, since: float,
                   until: float, acted_jobs: Iterable[str]) -> list[dict[str, Any]]:
    """Return the GPU time owners gave back themselves after a notice or advice (one per job and episode)."""
    from gpu_cost.act.savings import expected_end, waste_seen_s, week_end

    told: dict[str, Mapping[str, Any]] = {}
    for d in sorted(decisions, key=lambda x: float(x["ts"])):
        if d.get("mode") == "dry-run" or d.get("action") not in TELLING or d.get("target_kind") != "job":
            continue
        if d.get("status") != "acted" or not d.get("job_id") or not d.get("gpus"):  # the notice went out
            continue
        told.setdefault(str(d["job_id"]), d)
    acted = set(acted_jobs)
    if not told:
        return []
    last_sweep = (store.query(_LAST_SWEEP, {"until": until})[0] or {}).get("ts")
    if last_sweep is None:
        return []
    seen = {str(r["job_id"]): r for r in store.query(_JOB_SEEN, {"since": since - 86400.0, "until": until})}
    active_at_end = {str(r["job_id"]): int(r["gpus_active"] or 0)
                     for r in store.query(_LAST_ACTIVE, {"since": since - 86400.0, "until": until})}
    out = []
    for job_id, d in told.items():
        job = seen.get(job_id)
        if job_id in acted or job is None:
            continue
        last, interval = epoch(job["last_ts"]), float(job["interval_s"] or 0.0)
        if last >= epoch(last_sweep) or last < float(d["ts"]):
            continue  # still running at the last sweep, or gone before the notice
        if active_at_end.get(job_id, 0) > 0:
            continue  # busy until it ended: it finished its work, nobody released anything
        decision = Decision.from_row(d)
        released = last + interval / 2.0  # it left between the sweep that saw it last and the next one
        end, basis = expected_end(decision, store, float(d["ts"]))
        if end is None or end <= released:
            continue  # it ended when it would have anyway
        credit = min(end - released, waste_seen_s(decision, store, released),
                     max(0.0, week_end(released, policy.report.timezone) - released))
        gpus = int(d["gpus"])
        hours = round(gpus * credit / 3600.0, 4)
        model = str(job.get("gpu_model") or "").split(",")[0]
        out.append({"saving_id": f"owner:{d['target']}:{d.get('episode') or 1}", "decision_id": d["decision_id"],
                    "ts": released, "kind": "owner", "target": d["target"], "user_name": d.get("user_name"),
                    "gpus": gpus, "gpu_hours": hours, "kwh": 0.0, "usd": round(hours * policy.cost.gpu_hour(model), 2),
                    "basis": f"released by the owner after the {d['action']}: {gpus} GPU x {credit / 3600.0:.2f} h "
                             f"(until {basis} or the waste already seen)"})
    return out
