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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpu_cost.analyse.jobrows import JobRows, job_index
from gpu_cost.audit.store import AuditStore, Columns
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
    g = snapshot.columns()
    fresh = ~g.get("stale", bool)
    util_mean = g.get("util_mean", float)
    umax = g.get("util_max", float)
    fresh &= ~np.isnan(umax)
    memmin = np.nan_to_num(g.get("mem_min_mib", float), nan=0.0)
    umax0 = np.nan_to_num(umax, nan=100.0)
    job_ids = g.get("job_id", object) if "job_id" in g else np.full(len(g), None, dtype=object)
    # a GPU on a node where a running job holds GPUs no source places may be that job's, and one outside the
    # scheduler is no job's: no zombie
    how = g.get("attribution", object) if "attribution" in g else None
    placed = np.ones(len(g), bool) if how is None else (how != "unplaced") & (how != "outside")
    return {
        "fresh": fresh,
        "util": np.where(fresh, np.nan_to_num(util_mean, nan=0.0), 0.0),
        "active": fresh & (umax0 >= policy.rules.idle_allocation.util_max),
        "busy": fresh & (np.nan_to_num(util_mean, nan=0.0) >= policy.sweep.busy_util),
        "zombie": fresh & placed & (umax0 < policy.rules.zombie.util_max) & (memmin > policy.rules.zombie.mem_min_mib),
        "job": job_ids,
        "host": g.get("host", object),
        "model": snapshot.gpus["model"].fillna("").to_numpy(dtype=object),
        "mem_max": g.get("mem_max_mib", float) if "mem_max_mib" in g else np.full(len(g), np.nan),
        "mem_total": g.get("mem_total_mib", float) if "mem_total_mib" in g else np.full(len(g), np.nan),
    }


def usage_columns(snapshot: Snapshot, policy: Policy, interval_s: float | None = None) -> dict[str, Any]:
    """Return the ``gpu_cost_usage`` rows of one sweep as columns (:data:`USAGE_KEYS`, ``ts`` and ``interval_s``
    one value for every row): one row per host x GPU model x owner, in the order the frame first shows each.

    Every GPU's seconds are summed into its group in the frame's order, all groups at once (a 100,000-GPU
    sweep has as many rows to sum as GPUs).

    :param interval_s: wall time each row stands for; default the policy's sweep interval.
    """
    g = snapshot.gpus
    interval = float(interval_s or policy.sweep.interval)
    if g.empty:
        return {**{k: [] for k in USAGE_KEYS}, "ts": snapshot.ts, "interval_s": interval}
    c = _columns(snapshot, policy)
    # a GPU outside the scheduler (an inference server the same Prometheus scrapes) is not the cluster's
    mine = snapshot.columns().ours()
    if not mine.all():
        c = {k: v[mine] for k, v in c.items()}
        if not mine.any():
            return {**{k: [] for k in USAGE_KEYS}, "ts": snapshot.ts, "interval_s": interval}
    n = len(c["host"])
    jobs = {j.job_id: j for j in snapshot.running_jobs()}
    # each GPU's owner: the running job its row names (none: no owner, not allocated)
    job_code, job_ids = pd.factorize(c["job"], use_na_sentinel=True)
    running = [jobs.get(jid) if jid else None for jid in job_ids]
    owners: dict[tuple[str, str, str], int] = {("", "", ""): 0}
    owner_of_job = np.array([owners.setdefault((j.user, j.account, j.partition), len(owners)) if j is not None else 0
                             for j in running] + [0], dtype=np.int64)  # the last: rows of no job (code -1)
    held_of_job = np.array([j is not None for j in running] + [False], dtype=bool)
    owner, held = owner_of_job[job_code], held_of_job[job_code]
    host_code, hosts = pd.factorize(np.array([str(h) for h in c["host"]], dtype=object))
    model_code, models = pd.factorize(np.array([str(m or "") for m in c["model"]], dtype=object))
    key = (host_code.astype(np.int64) * len(models) + model_code) * len(owners) + owner
    group = pd.factorize(key)[0]  # groups numbered in the order their first GPU shows
    _, at = np.unique(group, return_index=True)  # each group's first GPU
    size = len(at)

    def seconds(where: np.ndarray | None) -> list[float]:
        """The interval summed over the group's GPUs ``where`` holds (None: every GPU), in the frame's order."""
        weights = np.full(n, interval) if where is None else np.where(where, interval, 0.0)
        return np.bincount(group, weights=weights, minlength=size).tolist()

    fresh, active = c["fresh"], c["active"]
    who = [k for k, _ in sorted(owners.items(), key=lambda kv: kv[1])]
    return {
        "ts": snapshot.ts, "interval_s": interval,
        "host": [str(hosts[k]) for k in host_code[at]], "gpu_model": [str(models[k]) for k in model_code[at]],
        "user_name": [who[k][0] for k in owner[at]], "account": [who[k][1] for k in owner[at]],
        "partition_name": [who[k][2] for k in owner[at]],
        "gpus": np.bincount(group, minlength=size).tolist(), "total_gpu_s": seconds(None),
        "allocated_gpu_s": seconds(held), "busy_gpu_s": seconds(active),
        "idle_alloc_gpu_s": seconds(held & fresh & ~active), "zombie_gpu_s": seconds(~held & c["zombie"]),
        "util_sum": [round(v, 3) for v in np.bincount(group, weights=interval * c["util"] / 100.0,
                                                       minlength=size).tolist()],
    }


def job_usage_columns(snapshot: Snapshot, policy: Policy, interval_s: float | None = None) -> dict[str, Any]:
    """Return the ``gpu_cost_jobs_usage`` rows of one sweep as columns (:data:`JOB_USAGE_KEYS`, ``ts`` and
    ``interval_s`` one value for every row): per running job with GPUs in the frame, GPUs held and used.

    ``gpus_busy`` counts GPUs whose mean utilisation in the window reached ``sweep.busy_util``;
    ``gpus_active`` those above the idle threshold; ``work_gpus`` is Σ utilisation / 100 (how
    many fully busy GPUs the same work would need); ``gpus_needed`` is :func:`gpus_needed`;
    ``mem_max_mib`` the most framebuffer used on one of its GPUs, ``mem_total_mib`` their
    framebuffer (the smallest). Right-sizing reads these. Every job at once, from the frame's rows per
    job (:class:`gpu_cost.analyse.jobrows.JobRows`).
    """
    g = snapshot.gpus
    interval = float(interval_s or policy.sweep.interval)
    out: dict[str, Any] = {**{k: [] for k in JOB_USAGE_KEYS}, "ts": snapshot.ts, "interval_s": interval}
    if g.empty or "job_id" not in g:
        return out
    c = _columns(snapshot, policy)
    index = job_index(snapshot)
    running = [(j, index.code[j.job_id]) for j in snapshot.running_jobs() if j.job_id in index.code]
    if not running:
        return out
    codes = np.array([k for _, k in running], dtype=np.int64)
    held = index.sizes()[codes]
    busy, stale = index.count(c["busy"])[codes], index.count(~c["fresh"])[codes]
    work = index.sum(c["util"])[codes] / 100.0
    mem, total = c["mem_max"], c["mem_total"]
    mem_max = index.reduce(np.fmax, np.where(np.isfinite(mem), mem, np.nan))[codes]
    size = index.reduce(np.fmin, np.where(np.isfinite(total) & (total > 0), total, np.nan))[codes]
    used = index.sum(np.where(np.isnan(mem), 0.0, mem))[codes]
    smallest = index.reduce(np.fmin, np.where(np.isfinite(total), total, np.nan))[codes]
    needed = _needed(held, busy, stale, work, used, size)
    models = _models(index, c["model"], codes)
    jobs = [j for j, _ in running]
    out.update({
        "job_id": [j.job_id for j in jobs], "user_name": [j.user for j in jobs], "account": [j.account for j in jobs],
        "partition_name": [j.partition for j in jobs], "gpu_model": models, "job_name": [j.name for j in jobs],
        "gpus": held.tolist(), "gpus_requested": [int(j.gpus_requested or n) for j, n in zip(jobs, held.tolist(), strict=True)],
        "gpus_busy": busy.tolist(), "gpus_active": index.count(c["active"])[codes].tolist(), "gpus_stale": stale.tolist(),
        "work_gpus": [round(w, 4) for w in work.tolist()], "time_limit_s": [j.time_limit_s for j in jobs],
        "start_ts": [j.start_ts for j in jobs], "gpus_needed": needed.tolist(),
        "mem_max_mib": [None if v != v else round(v, 1) for v in mem_max.tolist()],
        "mem_total_mib": [None if v != v else round(v, 1) for v in smallest.tolist()],
    })
    return out


def _models(index: JobRows, models: np.ndarray, codes: np.ndarray) -> list[str]:
    """Return, per job code of ``codes``, its GPUs' models (the known ones, sorted, comma-separated)."""
    code_of, names = pd.factorize(np.array([str(m or "") for m in models], dtype=object))
    low, high = index.reduce(np.fmin, code_of.astype(float))[codes], index.reduce(np.fmax, code_of.astype(float))[codes]
    out = []
    for k, lo, hi in zip(codes.tolist(), low.tolist(), high.tolist(), strict=True):
        if lo == hi:  # one model on every GPU of the job (the usual case)
            out.append(str(names[int(lo)]))
        else:
            out.append(",".join(sorted({str(names[m]) for m in code_of[index.rows_of_code(k)]} - {""})))
    return out


def gpus_needed(held: int, busy: int, stale: int, work_gpus: float, mem_mib: Sequence[float] | np.ndarray = (),
                mem_total_mib: Sequence[float] | np.ndarray = ()) -> int:
    """Return how many GPUs a job needed in one sample, at most the ``held`` ones.

    At least its busy GPUs plus those with no fresh data (no data is never evidence of less), its
    work in GPU-equivalents rounded up, and the GPUs its resident memory fills: the framebuffer used
    on each of its GPUs (``mem_mib``) summed, over one GPU's framebuffer (``mem_total_mib``, the
    smallest known; ignored when none is). A job sharding a model over GPUs it barely computes on
    still needs them for the memory.
    """
    used = np.asarray(mem_mib, dtype=float)
    sizes = np.asarray(mem_total_mib, dtype=float)
    sizes = sizes[np.isfinite(sizes) & (sizes > 0)]
    size = float(sizes.min()) if used.size and sizes.size else np.nan
    return int(_needed(np.asarray(held), np.asarray(busy), np.asarray(stale), np.asarray(work_gpus, dtype=float),
                       np.asarray(float(np.nansum(used)) if used.size else 0.0), np.asarray(size)))


def _needed(held: np.ndarray, busy: np.ndarray, stale: np.ndarray, work: np.ndarray, used: np.ndarray,
            size: np.ndarray) -> np.ndarray:
    """:func:`gpus_needed` of every job at once: ``used`` its framebuffer used summed, ``size`` one GPU's (NaN: none known)."""
    need = np.maximum(busy + stale, np.ceil(work - 1e-9))
    with np.errstate(invalid="ignore", divide="ignore"):
        by_memory = np.where(np.isnan(size), -np.inf, np.ceil(used / np.where(np.isnan(size), 1.0, size) - 1e-9))
    return np.minimum(held, np.maximum(0, np.maximum(need, by_memory))).astype(np.int64)


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
    rows = Columns({**usage_columns(snapshot, policy, cover.interval_s), **origin})
    jobs = Columns({**job_usage_columns(snapshot, policy, cover.interval_s), **origin})
    n_rows, n_jobs = len(rows["host"]), len(jobs["job_id"])
    store.execute("upsert_usage", rows)
    store.execute("upsert_job_usage", jobs)
    if interval_s is None and n_rows:
        _share_with_next(store, snapshot.ts, policy)
    for w in cover.warnings:
        logger.warning("usage at %s: %s", snapshot.ts, w)
    logger.debug("usage at %s: %d group rows, %d job rows, %.0f s each", snapshot.ts, n_rows, n_jobs, cover.interval_s)
    return {"usage_rows": n_rows, "job_rows": n_jobs, "interval_s": cover.interval_s,
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
