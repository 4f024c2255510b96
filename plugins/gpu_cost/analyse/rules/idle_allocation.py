"""Idle allocation: a running job whose allocated GPUs all sit idle.

Policy (``rules.idle_allocation``)::

    idle_allocation:
      util_max: 5        # % — every allocated GPU stays under this for the whole window
      window: 15m        # sliding: the last 15 minutes, not since job start
      min_runtime: 15m   # grace for start-up and data loading
      ladder: [notify, notify_manager (1h), demote (1h), terminate (1h), kill (10m)]

No memory condition: an allocated, empty GPU is waste too. A job with any GPU missing or stale
is skipped (no data, no action), and so is a job showing progress (its log still written, GPU
power or CPU busy). Services — declared in ``inference:``, bursty within the lookback, or whose
class behaves like one (``baselines:``) — are reported with ``inference=True`` and only advised.
Interactive sessions (``interactive:``) are left to ``idle_interactive``. Each finding carries its
evidence (``signals``) and a ``confidence`` (:mod:`gpu_cost.analyse.evidence`).

A multi-node job is judged over all its GPUs on all its nodes (``per_node`` counts them); a job
holding MIG slices is judged on its slices and costed by their share (``gpu_share``); a job on a
GPU shared with other jobs (``shared``: Slurm shard/MPS gres, time-slicing) is only advised, and
the engine refuses any destructive action on it (``refused`` says why). Some GPUs idle while
the others work is ``partly_idle``'s advice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from gpu_cost.analyse.rules import register
from gpu_cost.analyse.rules.common import idle_jobs
from gpu_cost.config.schema import Mode, Percent, Policy, Rung, Seconds
from gpu_cost.config.typed import Dur, Range
from gpu_cost.core.model import Finding, Snapshot
from gpu_cost.core.registry import RuleSpec


@dataclass(frozen=True)
class IdleAllocationRule:
    """A running job whose allocated GPUs are all idle."""

    enabled: bool = True
    mode: Mode | None = None
    util_max: Percent = 5.0
    window: Annotated[float, Dur(), Range(60, 86400)] = 900.0
    #: a job must have run this long before its GPUs can count as idle (start-up, data loading)
    min_runtime: Seconds = 900.0
    ladder: tuple[Rung, ...] = (
        Rung("notify", 0.0),
        Rung("notify_manager", 3600.0),
        Rung("demote", 3600.0),
        Rung("terminate", 3600.0),
        Rung("kill", 600.0),
    )


def why(f: Finding) -> str:
    """The decision reason for an idle-allocation finding."""
    ev = f.evidence
    held = (f"{f.gpus} allocated GPU(s)" if f.gpu_share is None else
            f"{f.gpus} allocated MIG slice(s) ({', '.join(ev.get('mig_profiles') or [])}: {f.gpu_share:.2g} GPU)")
    text = f"job {f.job_id}: all {held} ≤{ev.get('util_max')}% for {int(ev.get('window_s', 0)) // 60} min"
    nodes = ev.get("per_node") or {}
    if len(nodes) > 1:
        text += f" on {len(nodes)} nodes"
    if f.inference:
        text += f" — inference service ({ev.get('inference')}): advice only"
    if ev.get("refused"):
        text += f" — {ev['refused']}"
    if ev.get("log_state"):
        text += f"; its log says it {ev['log_state']}"
    return text


SPEC = RuleSpec(
    "idle_allocation", config=IdleAllocationRule, rank=20, target="job", title="a running job whose GPUs are all idle",
    label="Idle allocations", why=why, window=lambda cfg, policy: cfg.window, idle_jobs=True,
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
    """Return one finding per running batch job whose GPUs were all idle over the window."""
    return idle_jobs(snapshot, "idle_allocation", cfg, policy, interactive=False)
