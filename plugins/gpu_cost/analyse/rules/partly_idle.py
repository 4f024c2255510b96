"""Partly idle: a running job some of whose GPUs sit idle while the others work — right-sizing advice.

Policy (``rules.partly_idle``)::

    partly_idle:
      util_max: 5          # % — an idle GPU stays under this for the whole window
      window: 1h           # unset: an hour, or the lookback when shorter
      min_runtime: 1h
      min_idle_gpus: 1     # at least this many of the job's GPUs idle ...
      min_idle_share: 0.25 # ... and at least this share of them
      ladder: [{action: advise}]

A multi-node job is judged over all its GPUs on all its nodes: 6 of 8 GPUs idle across two nodes
is one finding with the count per node (``per_node``), the idle devices (``idle_gpu_ids``) and
how many GPUs the work would fit on (``suggested_gpus``). It is advice to the owner and never
more (``advice_only``: the policy loader refuses a destructive rung): the idle ranks may be
waiting on the busy ones by design. A job whose GPUs are all idle is ``idle_allocation``'s; a
job with a GPU missing, stale or shared with other jobs is left alone (no data, no action).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np

from gpu_cost.analyse.evidence import signal
from gpu_cost.analyse.jobrows import job_index
from gpu_cost.analyse.rules import register
from gpu_cost.analyse.rules.common import Devices, job_fields, per_node, r, shared_rows
from gpu_cost.config.schema import Mode, Percent, Policy, Rung, Seconds
from gpu_cost.config.typed import Dur, Range
from gpu_cost.core.model import Finding, Snapshot
from gpu_cost.core.registry import RuleSpec


@dataclass(frozen=True)
class PartlyIdleRule:
    """A running job some of whose GPUs (on one node or many) stay idle while the others work:
    right-sizing advice to the owner, never a cancel or a kill."""

    enabled: bool = True
    mode: Mode | None = None
    util_max: Percent = 5.0
    #: unset: an hour, or the whole lookback when that is shorter
    window: Annotated[float, Dur(), Range(60, 86400)] | None = None
    min_runtime: Seconds = 3600.0
    #: at least this many of the job's GPUs idle ...
    min_idle_gpus: Annotated[int, Range(1, 100_000)] = 1
    #: ... and at least this share of them
    min_idle_share: Annotated[float, Range(0.0, 1.0)] = 0.25
    ladder: tuple[Rung, ...] = (Rung("advise", 0.0),)


#: how sure the advice is: the per-GPU utilisation is the finding
ADVICE_CONFIDENCE = 0.8


#: the window when the policy sets none (capped at the lookback)
DEFAULT_WINDOW_S = 3600.0


def window_of(cfg: PartlyIdleRule, policy: Policy) -> float:
    """Return the rule's window: the policy's, else an hour or the whole lookback when that is shorter."""
    return float(cfg.window) if cfg.window is not None else min(DEFAULT_WINDOW_S, policy.sweep.lookback)


def why(f: Finding) -> str:
    """The decision reason for a partly-idle finding."""
    ev = f.evidence
    nodes = ev.get("per_node") or {}
    where = f" on {len(nodes)} nodes" if len(nodes) > 1 else ""
    return (f"job {f.job_id}: {ev.get('idle_gpus')} of {ev.get('gpus')} GPU(s){where} ≤{ev.get('util_max_idle')}% "
            f"for {int(ev.get('window_s', 0)) // 60} min while the others work — would fit on "
            f"{ev.get('suggested_gpus')}: advice only")


SPEC = RuleSpec(
    "partly_idle", config=PartlyIdleRule, rank=50, target="job", title="a job some of whose GPUs sit idle",
    label="Partly idle jobs", why=why, advice_only=True, window=lambda cfg, policy: window_of(cfg, policy),
    doc="A running job (on one node or many) some of whose GPUs stay idle for the whole window while the "
        "others work: right-sizing advice to the owner, never a cancel.",
    example="""
        rules:
          partly_idle:
            util_max: 5
            window: 1h
            min_idle_share: 0.25
            ladder: [{action: advise}]
    """,
)


@register(SPEC)
def partly_idle(snapshot: Snapshot, cfg: PartlyIdleRule, policy: Policy) -> list[Finding]:
    """Return one advisory finding per running job with some, not all, of its GPUs idle over the window."""
    window = window_of(cfg, policy)
    g = snapshot.columns(window)
    if g.empty:
        return []
    index = job_index(snapshot)
    rows = index.rows
    shared = shared_rows(g)
    devices = Devices(g)
    stale = g.get("stale", bool)
    umax = g.get("util_max", float)
    umean = g.get("util_mean", float)
    # per job, over its rows, every job at once: every GPU fresh, and some but not all idle, enough of them
    with np.errstate(invalid="ignore"):
        n_idle_of, sizes = index.count(umax < cfg.util_max), index.sizes()
        partly = (~index.any(stale | np.isnan(umax)) & (n_idle_of < sizes) & (n_idle_of >= cfg.min_idle_gpus)
                  & ~(n_idle_of / sizes < cfg.min_idle_share)).tolist()
    findings = []
    for job in snapshot.running_jobs():
        code = index.code.get(job.job_id)
        if code is None or not partly[code]:
            continue  # no GPU seen, one stale, none or all idle, or too few idle
        keys = job.gpu_keys()
        if len(keys) < 2 or job.start_ts is None or snapshot.ts - job.start_ts < max(cfg.min_runtime, window):
            continue
        pos = rows.get(job.job_id)
        if job.job_id in shared or pos is None or len(pos) < len(keys):
            continue  # a GPU missing or shared: its utilisation is not known to be the job's
        idle = umax[pos] < cfg.util_max
        n_idle, n = int(idle.sum()), len(pos)
        ids, _ = devices(pos)
        _, share = devices(pos[idle])  # MIG slices: what the idle ones cost in whole GPUs
        idle_ids = [d for d, i in zip(ids, idle, strict=True) if i]
        counts = per_node(ids)
        idle_counts = per_node(idle_ids)
        ev = {
            "gpus": n, "idle_gpus": n_idle, "busy_gpus": n - n_idle, "suggested_gpus": n - n_idle,
            "idle_gpu_ids": idle_ids, "window_s": window,
            "util_max_idle": r(float(np.max(umax[pos][idle]))), "util_mean_busy": r(float(np.mean(umean[pos][~idle]))),
            "per_node": {h: {"gpus": counts[h], "idle": idle_counts.get(h, 0)} for h in sorted(counts)},
            "runtime_s": round(snapshot.ts - job.start_ts), "confidence": ADVICE_CONFIDENCE,
            "signals": [
                signal("GPU utilisation", f"{n_idle} of {n} GPU(s) at most {r(float(np.max(umax[pos][idle])))} % over "
                       f"{int(window) // 60} min", f"under {cfg.util_max:g} %: those ranks compute nothing"),
                signal("Nodes", ", ".join(f"{h}: {idle_counts.get(h, 0)} of {counts[h]} idle" for h in sorted(counts)),
                       "the job is judged over all its GPUs on all its nodes"),
            ],
        }
        if share is not None:
            ev["gpu_share"] = share
        findings.append(Finding(
            rule="partly_idle", target_kind="job", target=f"job:{job.job_id}", action="advise", gpus=n_idle,
            host=job.nodes[0] if len(job.nodes) == 1 else None, gpu_ids=tuple(idle_ids), evidence=ev, gpu_share=share,
            **job_fields(job),  # type: ignore[arg-type]
        ))
    return findings
