"""The audit store's usage rows as a trace (samples + jobs, the project's trace format), for replays.

Every sweep writes what it saw (:mod:`gpu_cost.report.usage`): per running job, the GPUs it held,
how many were active (above the idle threshold), busy, stale, its work (Σ utilisation) and the most
framebuffer used; per host and owner, the GPUs, and how many unallocated ones held memory while
idle (zombies). :func:`trace_from_usage` turns a window of those rows back into the frames
:func:`gpu_cost.sim.replay.replay` reads, so ``gpu_policy_tune`` can replay candidate policies on the
cluster's own history without Prometheus.

What comes back is the sweeps' summary, not each sample:

- A host has as many GPUs as its rows ever counted at one sweep. A job keeps the same GPUs while it
  runs (placed on a host where its owner's rows are, else where GPUs are free).
- Each sweep's figures stand for the samples of the interval it covers (``interval_s`` before its
  ``ts``, at the policy's ``sweep.sample_interval``). Of a job's GPUs, the stale ones have no sample,
  the active ones share its work (at least the idle threshold each), the others read 0 %; every one
  holds the job's most framebuffer used. Unallocated GPUs read the host's mean utilisation; the
  zombie ones 0 % with memory above ``rules.zombie.mem_min_mib``.
- Usage rows name no process: the GPUs of a host that turn zombie at one sweep read as one process of
  no user, until they are zombie no more. They carry
  no labels, QOS or batch flag: protections by those cannot be applied (say so when reading the
  figures). A job's end is its last sweep (none when it runs at the window's end).
- A sweep no row covers is a gap: no samples, which the replay reads as stale, never idle.

Usage written under an acting policy already holds its effects (jobs it cancelled end early).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpu_cost.audit.store import AuditStore
from gpu_cost.config.schema import Policy
from gpu_cost.core.errors import TraceError
from gpu_cost.core.timeutil import iso

logger = logging.getLogger(__name__)

#: the host that takes a job no host of the usage rows has room for (placement is a reconstruction)
OVERFLOW_HOST = "unplaced"
#: the first process id given to a zombie stretch
ZOMBIE_PID = 40000


@dataclass
class UsageTrace:
    """Trace frames rebuilt from usage rows: ``samples`` and ``jobs`` in the trace format, and what to know."""

    samples: pd.DataFrame
    jobs: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    sweeps: int = 0


def trace_from_usage(store: AuditStore, since: float, until: float, policy: Policy,
                     sample_interval: float | None = None) -> UsageTrace:
    """Return the trace of the usage rows in ``(since, until]`` (:func:`build_trace`); TraceError when there are none."""
    usage = store.fetch("usage_between", {"since": since, "until": until})
    if not usage:
        raise TraceError(f"the audit store has no usage rows between {iso(since)} and {iso(until)}: no sweep "
                         "(gpu_zombie_sweep) recorded usage then, so there is no history to replay")
    jobs = store.fetch("job_usage_between", {"since": since, "until": until, "min_gpus": 1})
    return build_trace(usage, jobs, policy, sample_interval)


def build_trace(usage_rows: Sequence[Mapping[str, Any]], job_rows: Sequence[Mapping[str, Any]], policy: Policy,
                sample_interval: float | None = None) -> UsageTrace:
    """Return the trace of ``gpu_cost_usage`` / ``gpu_cost_jobs_usage`` rows (times as epoch seconds)."""
    dt = float(sample_interval or policy.sweep.sample_interval)
    thr = float(policy.rules.idle_allocation.util_max)
    zombie_mem = float(policy.rules.zombie.mem_min_mib) + 1024.0
    u = pd.DataFrame(list(usage_rows))
    if u.empty:
        raise TraceError("no usage rows: nothing to rebuild a trace from")
    for col in ("user_name", "account", "partition_name", "gpu_model"):
        u[col] = u[col].fillna("").astype(str)
    u["ts"] = u["ts"].astype(float)
    j = pd.DataFrame(list(job_rows))
    if not j.empty:
        j["ts"] = j["ts"].astype(float)
        j["job_id"] = j["job_id"].astype(str)
    sweeps = np.sort(u["ts"].unique())
    interval = u.groupby("ts")["interval_s"].max().reindex(sweeps).to_numpy(dtype=float)
    cap = u.groupby(["ts", "host"])["gpus"].sum().groupby(level="host").max()
    hosts = [str(h) for h in sorted(cap.index)]
    slots = _Slots(hosts, [int(cap[h]) for h in hosts])
    u_at = {float(ts): part for ts, part in u.groupby("ts")}
    j_at = {float(ts): part.to_dict("records") for ts, part in j.groupby("ts")} if not j.empty else {}

    cells: list[tuple[int, int, float, float, int, int]] = []  # (slot, sweep, util, mem, job code, pid)
    job_names = [""]
    code_of: dict[str, int] = {}
    meta: dict[str, dict[str, Any]] = {}
    placed: dict[str, list[int]] = {}
    zombies: dict[str, dict[int, int]] = {}  # host -> slot -> pid of its zombie stretch
    next_pid = ZOMBIE_PID
    for k, ts in enumerate(sweeps):
        rows = u_at[float(ts)]
        present = {str(r["job_id"]): r for r in j_at.get(float(ts), [])}
        for jid in [x for x in placed if x not in present]:
            slots.free(placed.pop(jid))
        for jid in sorted((x for x in present if x not in placed), key=lambda x: (-int(present[x]["gpus"] or 1), x)):
            r = present[jid]
            mine = rows[(rows["user_name"] == str(r.get("user_name") or "")) & (rows["allocated_gpu_s"] > 0)
                         & (rows["account"] == str(r.get("account") or ""))
                         & (rows["partition_name"] == str(r.get("partition_name") or ""))]
            placed[jid] = slots.take(max(1, int(r["gpus"] or 1)), [str(h) for h in mine["host"]],
                                     previous=meta.get(jid, {}).get("slots"))
            if jid not in code_of:
                code_of[jid] = len(job_names)
                job_names.append(jid)
                meta[jid] = {"row": r, "first": float(ts), "first_interval": float(interval[k])}
            meta[jid]["slots"] = placed[jid]
        for jid, taken in placed.items():
            meta[jid]["last"] = float(ts)
            r = present[jid]
            n = len(taken)
            stale = min(int(r.get("gpus_stale") or 0), n)
            active = min(int(r.get("gpus_active") or 0), n - stale)
            work = 100.0 * float(r.get("work_gpus") or 0.0)
            mem = float(r.get("mem_max_mib") or 0.0)
            mem = 0.0 if math.isnan(mem) else mem
            quiet = 0.0 if active else min(work / max(n - stale, 1), max(thr - 1.0, 0.0))
            for i, s in enumerate(taken):
                if i < stale:
                    continue  # no data: no sample
                util = min(100.0, max(thr, work / active)) if i < stale + active else quiet
                cells.append((s, k, util, mem, code_of[jid], 0))
        for _, g in rows[(rows["user_name"] == "") & (rows["account"] == "") & (rows["partition_name"] == "")].iterrows():
            host = str(g["host"])
            free = slots.free_of(host)
            span = float(g["interval_s"] or 0.0) or float(interval[k])
            count = min(len(free), round(float(g["zombie_gpu_s"] or 0.0) / span)) if span > 0 else 0
            total = float(g["total_gpu_s"] or 0.0)
            mean = min(100.0, 100.0 * float(g["util_sum"] or 0.0) / total) if total > 0 else 0.0
            before = zombies.get(host, {})
            keep = [s for s in free if s in before][:count]
            keep += [s for s in free if s not in keep][: count - len(keep)]
            now: dict[int, int] = {}
            fresh_pid = None  # the GPUs of a host that turn zombie at one sweep: one process (a job's leftover)
            for s in keep:
                if s in before:
                    now[s] = before[s]
                else:
                    if fresh_pid is None:
                        fresh_pid, next_pid = next_pid, next_pid + 1
                    now[s] = fresh_pid
            zombies[host] = now
            for s in free:
                if s in now:
                    cells.append((s, k, 0.0, zombie_mem, 0, now[s]))
                else:
                    cells.append((s, k, mean, 0.0, 0, 0))
    samples = _expand(cells, slots, sweeps, interval, dt, job_names)
    jobs = _jobs(meta, float(sweeps[-1]))
    notes = [f"trace rebuilt from the audit store's usage rows: {len(sweeps)} sweep(s) from {iso(sweeps[0])} to "
             f"{iso(sweeps[-1])}, {slots.size()} GPUs, {len(meta)} job(s); each sweep's summary stands for the samples "
             "of the interval it covers (docs/tune.md)",
             "usage rows carry no job labels, QOS or batch flag: protections by those cannot be applied in this replay"]
    if slots.overflow:
        notes.append(f"{slots.overflow} GPU(s) placed on host {OVERFLOW_HOST!r}: the jobs held more GPUs than the "
                     "hosts' usage rows had free")
    logger.info("usage trace: %d sweeps, %d samples, %d jobs", len(sweeps), len(samples), len(jobs))
    return UsageTrace(samples=samples, jobs=jobs, notes=notes, sweeps=len(sweeps))


class _Slots:
    """The cluster's GPUs as slots (host, index); which job holds each one now."""

    def __init__(self, hosts: list[str], sizes: list[int]) -> None:
        self.host: list[str] = []
        self.gpu: list[int] = []
        self.of_host: dict[str, list[int]] = {}
        for h, n in zip(hosts, sizes, strict=True):
            for i in range(n):
                self._add(h, i)
        self.busy: list[bool] = [False] * len(self.host)
        self.overflow = 0

    def _add(self, host: str, gpu: int) -> int:
        self.host.append(host)
        self.gpu.append(gpu)
        self.of_host.setdefault(host, []).append(len(self.host) - 1)
        return len(self.host) - 1

    def size(self) -> int:
        return len(self.host)

    def free_of(self, host: str) -> list[int]:
        return [s for s in self.of_host.get(host, []) if not self.busy[s]]

    def free(self, taken: list[int]) -> None:
        for s in taken:
            self.busy[s] = False

    def take(self, n: int, preferred: list[str], previous: list[int] | None = None) -> list[int]:
        """Return ``n`` free slots: the job's previous ones when free, else on one preferred host, else on the
        host with most free, else spread over hosts; the overflow host gets what is still missing."""
        if previous and len(previous) == n and not any(self.busy[s] for s in previous):
            chosen = list(previous)
        else:
            order = sorted(self.of_host, key=lambda h: (h not in preferred, -len(self.free_of(h)), h))
            whole = next((h for h in order if h != OVERFLOW_HOST and len(self.free_of(h)) >= n), None)
            if whole is not None:
                chosen = self.free_of(whole)[:n]
            else:
                chosen = []
                for h in order:
                    chosen += self.free_of(h)[: n - len(chosen)]
                while len(chosen) < n:
                    chosen.append(self._add(OVERFLOW_HOST, len(self.of_host.get(OVERFLOW_HOST, []))))
                    self.busy.append(False)
                    self.overflow += 1
        for s in chosen:
            self.busy[s] = True
        return chosen


def _expand(cells: list[tuple[int, int, float, float, int, int]], slots: _Slots, sweeps: np.ndarray,
            interval: np.ndarray, dt: float, job_names: list[str]) -> pd.DataFrame:
    """Return the long samples frame: each sweep's cells repeated at ``dt`` over the interval the sweep covers."""
    cols = ("ts", "host", "gpu", "util", "mem_used_mib", "job_id", "pid")
    if not cells:
        return pd.DataFrame({c: [] for c in cols})
    arr = np.array(cells, dtype=float)
    slot, sweep = arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64)
    # the sample instants of each sweep: back from its ts over its interval, never into the sweep before it
    counts = np.empty(len(sweeps), dtype=np.int64)
    for k in range(len(sweeps)):
        span = float(interval[k]) if interval[k] == interval[k] and interval[k] > 0 else dt
        if k:
            span = min(span, float(sweeps[k] - sweeps[k - 1]))
        counts[k] = max(1, round(span / dt))
    per_cell = counts[sweep]
    rep = np.repeat(np.arange(len(cells)), per_cell)
    # offset within the sweep's run of samples: 0 .. count-1, counted back from the sweep's ts
    starts = np.cumsum(per_cell) - per_cell
    offset = np.arange(len(rep)) - np.repeat(starts, per_cell)
    ts = sweeps[sweep[rep]] - (per_cell[rep] - 1 - offset) * dt
    hosts = np.array(slots.host, dtype=object)
    host_names, host_codes = np.unique(hosts, return_inverse=True)
    job_code = arr[rep, 4].astype(np.int64)
    frame = pd.DataFrame({
        "ts": ts,
        "host": pd.Categorical.from_codes(host_codes[slot[rep]], categories=list(host_names)),
        "gpu": np.array(slots.gpu, dtype=np.int64)[slot[rep]],
        "util": arr[rep, 2],
        "mem_used_mib": arr[rep, 3],
        "job_id": pd.Categorical.from_codes(job_code - 1, categories=job_names[1:]) if len(job_names) > 1
        else pd.Categorical([None] * len(rep), categories=["-"]),
        "pid": arr[rep, 5].astype(np.int64),
    })
    return frame.sort_values(["ts", "host", "gpu"], kind="stable").reset_index(drop=True)


def _jobs(meta: Mapping[str, Mapping[str, Any]], last_sweep: float) -> pd.DataFrame:
    """Return the jobs frame: one row per job seen, its end the last sweep that saw it (none: running at the end)."""
    rows = []
    for jid, m in meta.items():
        r = m["row"]
        start = r.get("start_ts")
        start = float(start) if start is not None and start == start else m["first"] - m["first_interval"]
        limit = r.get("time_limit_s")
        rows.append({
            "job_id": jid, "user": str(r.get("user_name") or ""), "account": str(r.get("account") or ""),
            "partition": str(r.get("partition_name") or ""), "name": str(r.get("job_name") or ""),
            "start_ts": start, "end_ts": math.nan if m["last"] >= last_sweep else float(m["last"]),
            "time_limit_s": float(limit) if limit is not None and limit == limit else math.nan,
            "gpus": int(r.get("gpus") or len(m["slots"])),
            "state": "RUNNING" if m["last"] >= last_sweep else "COMPLETED",
        })
    cols = ["job_id", "user", "account", "partition", "name", "start_ts", "end_ts", "time_limit_s", "gpus", "state"]
    return pd.DataFrame(rows, columns=cols)


__all__ = ["UsageTrace", "build_trace", "trace_from_usage"]
