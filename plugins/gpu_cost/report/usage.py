"""The usage record: what every sweep writes so any week's KPIs can be computed without Prometheus.

Two tables, both upserted (a retried sweep rewrites the same rows):

``gpu_cost_usage``       one row per sweep x host x GPU model x user x account x partition
``gpu_cost_jobs_usage``  one row per sweep x running job (GPUs held, busy, work done)

Each row stands for ``interval_s`` seconds of wall time: the time the sweep really covers, from the
previous sweep's data instant (the newest usage ``ts`` before it) to its own, at most
:data:`MAX_COVER` x ``sweep.interval`` (a long outage does not count hours from one snapshot); the
first sweep covers ``sweep.interval`` (:func:`coverage`). It is described by the snapshot's rule
window ending at ``ts``. GPU-second columns, per GPU of the group:

``total_gpu_s``       every GPU seen
``allocated_gpu_s``   attributed to a running job
``busy_gpu_s``        fresh data and active: max utilisation in the window at or above the
                      idle threshold (``rules.idle_allocation.util_max``)
``idle_alloc_gpu_s``  allocated, fresh data, idle (the waste the idle-allocation rule targets)
``zombie_gpu_s``      not allocated, fresh, idle (``rules.zombie.util_max``), memory held above
                      ``rules.zombie.mem_min_mib``
``util_sum``          Σ mean utilisation % x GPU-seconds / 100, over fresh GPUs only

A GPU with no or stale data is neither busy nor idle: it is never counted as waste, and adds
nothing to ``util_sum``. Mean utilisation of a group is ``util_sum / total_gpu_s``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_cost.audit.store import AuditStore
from gpu_cost.config.schema import Policy
from gpu_cost.core.model import Snapshot
from gpu_cost.core.timeutil import format_duration

logger = logging.getLogger(__name__)

#: keys of a ``gpu_cost_usage`` row, in the order of the ``upsert_usage`` statement
USAGE_KEYS = (
    "ts", "interval_s", "host", "gpu_model", "user_name", "account", "partition_name", "gpus", "total_gpu_s",
    "allocated_gpu_s", "busy_gpu_s", "idle_alloc_gpu_s", "zombie_gpu_s", "util_sum",
)
#: keys of a ``gpu_cost_jobs_usage`` row
JOB_USAGE_KEYS = (
    "ts", "job_id", "interval_s", "user_name", "account", "partition_name", "gpu_model", "job_name", "gpus",
    "gpus_requested", "gpus_busy", "gpus_active", "gpus_stale", "work_gpus", "time_limit_s", "start_ts",
    "gpus_needed", "mem_max_mib", "mem_total_mib",
)


def _columns(snapshot: Snapshot, policy: Policy) -> dict[str, np.ndarray]:
    g = snapshot.gpus
    fresh = ~g["stale"].to_numpy(dtype=bool)
    util_mean = g["util_mean"].to_numpy(dtype=float)
    umax = g["util_max"].to_numpy(dtype=float)
    fresh &= ~np.isnan(umax)
    memmin = np.nan_to_num(g["mem_min_mib"].to_numpy(dtype=float), nan=0.0)
    umax0 = np.nan_to_num(umax, nan=100.0)
    job_ids = g["job_id"].to_numpy(dtype=object) if "job_id" in g else np.full(len(g), None, dtype=object)
    return {
        "fresh": fresh,
        "util": np.where(fresh, np.nan_to_num(util_mean, nan=0.0), 0.0),
        "active": fresh & (umax0 >= policy.rules.idle_allocation.util_max),
        "busy": fresh & (np.nan_to_num(util_mean, nan=0.0) >= policy.sweep.busy_util),
        "zombie": fresh & (umax0 < policy.rules.zombie.util_max) & (memmin > policy.rules.zombie.mem_min_mib),
        "job": job_ids,
        "host": g["host"].to_numpy(dtype=object),
        "model": g["model"].fillna("").to_numpy(dtype=object),
        "mem_max": g["mem_max_mib"].to_numpy(dtype=float) if "mem_max_mib" in g else np.full(len(g), np.nan),
        "mem_total": g["mem_total_mib"].to_numpy(dtype=float) if "mem_total_mib" in g else np.full(len(g), np.nan),
    }


def usage_rows(snapshot: Snapshot, policy: Policy, interval_s: float | None = None) -> list[dict[str, Any]]:
    """Return the ``gpu_cost_usage`` rows of one sweep (one per host x model x owner).

    :param interval_s: wall time each row stands for; default the policy's sweep interval.
    """
    g = snapshot.gpus
    if g.empty:
        return []
    interval = float(interval_s or policy.sweep.interval)
    c = _columns(snapshot, policy)
    jobs = {j.job_id: j for j in snapshot.running_jobs()}
    acc: dict[tuple[str, str, str, str, str], dict[str, float]] = {}
    for i in range(len(g)):
        jid = c["job"][i]
        job = jobs.get(jid) if jid else None
        key = (str(c["host"][i]), str(c["model"][i] or ""), job.user if job else "", job.account if job else "",
               job.partition if job else "")
        a = acc.setdefault(key, dict.fromkeys(("gpus", "total", "alloc", "busy", "idle_alloc", "zombie", "util"), 0.0))
        a["gpus"] += 1
        a["total"] += interval
        fresh = bool(c["fresh"][i])
        active = bool(c["active"][i])
        if job is not None:
            a["alloc"] += interval
            if fresh and not active:
                a["idle_alloc"] += interval
        elif c["zombie"][i]:
            a["zombie"] += interval
        if active:
            a["busy"] += interval
        a["util"] += interval * float(c["util"][i]) / 100.0
    return [
        {"ts": snapshot.ts, "interval_s": interval, "host": k[0], "gpu_model": k[1], "user_name": k[2],
         "account": k[3], "partition_name": k[4], "gpus": int(v["gpus"]), "total_gpu_s": v["total"],
         "allocated_gpu_s": v["alloc"], "busy_gpu_s": v["busy"], "idle_alloc_gpu_s": v["idle_alloc"],
         "zombie_gpu_s": v["zombie"], "util_sum": round(v["util"], 3)}
        for k, v in acc.items()
    ]


def job_usage_rows(snapshot: Snapshot, policy: Policy, interval_s: float | None = None) -> list[dict[str, Any]]:
    """Return the ``gpu_cost_jobs_usage`` rows of one sweep: per running job, GPUs held and used.

    ``gpus_busy`` counts GPUs whose mean utilisation in the window reached ``sweep.busy_util``;
    ``gpus_active`` those above the idle threshold; ``work_gpus`` is Σ utilisation / 100 (how
    many fully busy GPUs the same work would need); ``gpus_needed`` is :func:`gpus_needed`;
    ``mem_max_mib`` the most framebuffer used on one of its GPUs, ``mem_total_mib`` their
    framebuffer (the smallest). Right-sizing reads these.
    """
    g = snapshot.gpus
    if g.empty:
        return []
    interval = float(interval_s or policy.sweep.interval)
    c = _columns(snapshot, policy)
    by_job: dict[str, list[int]] = {}
    for i, jid in enumerate(c["job"]):
        if jid:
            by_job.setdefault(str(jid), []).append(i)
    rows = []
    for job in snapshot.running_jobs():
        pos = by_job.get(job.job_id)
        if not pos:
            continue
        idx = np.array(pos)
        models = sorted({str(m) for m in c["model"][idx] if m})
        mem = c["mem_max"][idx]
        total = c["mem_total"][idx]
        busy = int(c["busy"][idx].sum())
        stale = int((~c["fresh"][idx]).sum())
        work = float(c["util"][idx].sum()) / 100.0
        rows.append({
            "ts": snapshot.ts, "job_id": job.job_id, "interval_s": interval, "user_name": job.user,
            "account": job.account, "partition_name": job.partition, "gpu_model": ",".join(models),
            "job_name": job.name, "gpus": len(idx), "gpus_requested": int(job.gpus_requested or len(idx)),
            "gpus_busy": busy, "gpus_active": int(c["active"][idx].sum()),
            "gpus_stale": stale, "work_gpus": round(work, 4),
            "time_limit_s": job.time_limit_s, "start_ts": job.start_ts,
            "gpus_needed": gpus_needed(len(idx), busy, stale, work, mem, total),
            "mem_max_mib": _finite_max(mem), "mem_total_mib": _finite_min(total),
        })
    return rows


def gpus_needed(held: int, busy: int, stale: int, work_gpus: float, mem_mib: Sequence[float] | np.ndarray = (),
                mem_total_mib: Sequence[float] | np.ndarray = ()) -> int:
    """Return how many GPUs a job needed in one sample, at most the ``held`` ones.

    At least its busy GPUs plus those with no fresh data (no data is never evidence of less), its
    work in GPU-equivalents rounded up, and the GPUs its resident memory fills: the framebuffer used
    on each of its GPUs (``mem_mib``) summed, over one GPU's framebuffer (``mem_total_mib``, the
    smallest known; ignored when none is). A job sharding a model over GPUs it barely computes on
    still needs them for the memory.
    """
    need = max(busy + stale, math.ceil(work_gpus - 1e-9))
    used = np.asarray(mem_mib, dtype=float)
    sizes = np.asarray(mem_total_mib, dtype=float)
    sizes = sizes[np.isfinite(sizes) & (sizes > 0)]
    if used.size and sizes.size:
        need = max(need, math.ceil(float(np.nansum(used)) / float(sizes.min()) - 1e-9))
    return int(min(held, max(0, need)))


def _finite_max(values: np.ndarray) -> float | None:
    v = values[np.isfinite(values)]
    return round(float(v.max()), 1) if v.size else None


def _finite_min(values: np.ndarray) -> float | None:
    v = values[np.isfinite(values)]
    return round(float(v.min()), 1) if v.size else None


#: the most one sweep's rows stand for, in sweep intervals: after an outage the first snapshot
#: does not speak for the hours nobody looked
MAX_COVER = 2.0
#: how far the time between sweeps may stray from ``sweep.interval`` before it is a warning
TOLERANCE = 0.2
#: gaps in a row that must all stray, the same way, before the measured cadence is a warning (one
#: late or missed run is not a schedule)
CONSISTENT_GAPS = 3


@dataclass(frozen=True)
class Coverage:
    """The wall time one sweep's usage rows stand for, and why it may be wrong.

    :param interval_s: seconds each row stands for.
    :param gap_s: seconds since the previous sweep's data instant (None: the first sweep).
    :param warnings: the schedule disagrees with ``sweep.interval`` (the run's problems; not a degradation).
    """

    interval_s: float
    gap_s: float | None = None
    warnings: tuple[str, ...] = ()


def coverage(store: AuditStore, ts: float, policy: Policy, *, schedule_s: float | None = None,
             measured: bool = True) -> Coverage:
    """Return what the sweep at data instant ``ts`` covers: since the previous sweep, capped.

    :param schedule_s: the period of the schedule that runs the sweep (the DAG's cron), when known.
    :param measured: also warn when the measured gaps between sweeps stray from ``sweep.interval``
        (off for runs only ever triggered by hand: they keep no cadence).
    """
    interval = float(policy.sweep.interval)
    before = [float(r["ts"]) for r in store.fetch("usage_instants_before", {"ts": ts, "limit": CONSISTENT_GAPS})]
    gap = ts - before[0] if before else None
    covered = interval if gap is None else min(gap, MAX_COVER * interval)
    warnings: list[str] = []
    if schedule_s and abs(schedule_s - interval) > TOLERANCE * interval:
        warnings.append(_cadence_warning(f"the sweep's schedule fires every {format_duration(schedule_s)}",
                                         interval))
    elif measured and len(before) == CONSISTENT_GAPS:
        gaps = [a - b for a, b in zip([ts, *before], before, strict=False)]
        if all(g > (1 + TOLERANCE) * interval for g in gaps) or all(g < (1 - TOLERANCE) * interval for g in gaps):
            warnings.append(_cadence_warning(
                f"the last {len(gaps) + 1} sweeps came {', '.join(format_duration(g) for g in reversed(gaps))} "
                "apart", interval))
    return Coverage(interval_s=covered, gap_s=gap, warnings=tuple(warnings))


def _cadence_warning(what: str, interval: float) -> str:
    return (f"{what} but the policy's sweep.interval is {format_duration(interval)}: usage counts the time "
            f"between sweeps (at most {format_duration(MAX_COVER * interval)} each); make the schedule "
            "(GPU_COST_SWEEP_SCHEDULE) and sweep.interval agree")


def record_usage(store: AuditStore, snapshot: Snapshot, policy: Policy, interval_s: float | None = None, *,
                 run_id: str | None = None, schedule_s: float | None = None,
                 measured: bool = True) -> dict[str, Any]:
    """Write both usage tables for one sweep (idempotent); return the row counts and any ``warnings``.

    Rows name ``run_id`` (default ``sweep__<epoch of the snapshot>``, for a write outside a run) and the
    snapshot's instant as their data instant: an older snapshot never replaces a newer one's rows.
    Without ``interval_s`` the rows stand for the time the sweep covers (:func:`coverage`, which
    ``schedule_s`` and ``measured`` go to); a sweep recorded after a later one (runs overlap) takes
    its share back from that later sweep's rows, so no stretch of time is counted twice.
    """
    cover = coverage(store, snapshot.ts, policy, schedule_s=schedule_s, measured=measured) \
        if interval_s is None else Coverage(float(interval_s))
    origin = {"run_id": run_id or f"sweep__{int(snapshot.ts)}", "data_ts": snapshot.ts}
    rows = [{**r, **origin} for r in usage_rows(snapshot, policy, cover.interval_s)]
    jobs = [{**r, **origin} for r in job_usage_rows(snapshot, policy, cover.interval_s)]
    store.execute("upsert_usage", rows)
    store.execute("upsert_job_usage", jobs)
    if interval_s is None and rows:
        _share_with_next(store, snapshot.ts, policy)
    for w in cover.warnings:
        logger.warning("usage at %s: %s", snapshot.ts, w)
    logger.debug("usage at %s: %d group rows, %d job rows, %.0f s each", snapshot.ts, len(rows), len(jobs),
                 cover.interval_s)
    return {"usage_rows": len(rows), "job_rows": len(jobs), "interval_s": cover.interval_s,
            "warnings": list(cover.warnings)}


def _share_with_next(store: AuditStore, ts: float, policy: Policy) -> None:
    """Shrink the next sweep's rows to the time after ``ts``, when they were written before this sweep's."""
    for nxt in store.fetch("usage_instant_after", {"ts": ts}):
        if nxt["ts"] is None:
            continue
        covered = min(float(nxt["ts"]) - ts, MAX_COVER * float(policy.sweep.interval))
        if store.execute("rescale_usage", {"ts": nxt["ts"], "interval_s": covered}):
            store.execute("rescale_job_usage", {"ts": nxt["ts"], "interval_s": covered})
            logger.info("usage at %s was recorded before the sweep at %s: it now covers %.0f s", nxt["ts"], ts,
                        covered)
