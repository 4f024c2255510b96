"""Idle allocation: a running job whose allocated GPUs all sit idle.

Policy (``rules.idle_allocation``)::

    idle_allocation:
      util_max: 5        # % — every allocated GPU stays under this for the whole window
      window: 15m        # sliding: the last 15 minutes, not since job start
      min_runtime: 15m   # grace for start-up and data loading
      ladder: [notify, notify_manager (1h), demote (1h), terminate (1h), kill (10m)]

No memory condition: an allocated, empty GPU is waste too. A job with any GPU missing or stale
is skipped (no data, no action). Inference services — declared in ``inference:`` or recognised by
bursts of activity within the lookback — are reported with ``inference=True`` and only advised.
"""

from __future__ import annotations

import numpy as np

from gpu_cost.model import Finding, Snapshot
from gpu_cost.policy.schema import IdleAllocationRule, Policy
from gpu_cost.registry import RuleSpec
from gpu_cost.rules import register
from gpu_cost.rules.common import behaves_like_inference, declared_inference, job_fields, job_rows, r


def why(f: Finding) -> str:
    """The decision reason for an idle-allocation finding."""
    ev = f.evidence
    text = (f"job {f.job_id}: all {f.gpus} allocated GPU(s) ≤{ev.get('util_max')}% for "
            f"{int(ev.get('window_s', 0)) // 60} min")
    if f.inference:
        text += f" — inference service ({ev.get('inference')}): advice only"
    return text


SPEC = RuleSpec(
    "idle_allocation", config=IdleAllocationRule, target="job", title="a running job whose GPUs are all idle",
    label="Idle allocations", why=why, window=lambda cfg, policy: cfg.window,
    doc="A running job whose allocated GPUs all stay idle for the whole window (after ``min_runtime``); "
        "inference services are only advised.",
    example="""
        rules:
          idle_allocation:
            util_max: 5
            window: 15m
            min_runtime: 15m
            ladder:
              - {action: notify}
              - {action: notify_manager, after: 1h}
              - {action: cancel, after: 1h}
    """,
)


@register(SPEC)
def idle_allocation(snapshot: Snapshot, cfg: IdleAllocationRule, policy: Policy) -> list[Finding]:
    """Return one finding per running job whose GPUs were all idle over the window."""
    g = snapshot.view(cfg.window)
    if g.empty:
        return []
    rows = job_rows(g)
    stale = g["stale"].to_numpy(dtype=bool)
    umax = g["util_max"].to_numpy(dtype=float)
    umean = g["util_mean"].to_numpy(dtype=float)
    bursts = g["bursts_lb"].to_numpy()
    umax_lb = g["util_max_lb"].to_numpy(dtype=float)
    findings = []
    for job in snapshot.running_jobs():
        keys = job.gpu_keys()
        if not keys or job.start_ts is None:
            continue
        if snapshot.ts - job.start_ts < max(cfg.min_runtime, cfg.window):
            continue
        pos = rows.get(job.job_id)
        if pos is None or len(pos) < len(keys):
            continue  # some GPU of the job is not seen: no data, no action
        if stale[pos].any() or np.isnan(umax[pos]).any() or not (umax[pos] < cfg.util_max).all():
            continue
        declared = declared_inference(job, policy.inference)
        behaviour = behaves_like_inference(bursts[pos], policy.inference)
        evidence: dict[str, object] = {
            "util_max": r(float(np.max(umax[pos]))), "util_mean": r(float(np.mean(umean[pos]))),
            "window_s": cfg.window, "util_max_lookback": r(float(np.nanmax(umax_lb[pos]))),
            "bursts_lookback": int(np.max(bursts[pos])), "runtime_s": round(snapshot.ts - job.start_ts),
        }
        if declared or behaviour:
            evidence["inference"] = declared or f"{int(np.max(bursts[pos]))} bursts of activity in the lookback"
        hosts = sorted({h for h, _ in keys})
        findings.append(
            Finding(
                rule="idle_allocation", target_kind="job", target=f"job:{job.job_id}",
                action="advise" if (declared or behaviour) else "cancel", gpus=len(keys), host=hosts[0] if len(hosts) == 1 else None,
                gpu_ids=tuple(f"{h}:{i}" for h, i in keys), inference=bool(declared or behaviour), evidence=evidence,
                **job_fields(job),  # type: ignore[arg-type]
            )
        )
    return findings
