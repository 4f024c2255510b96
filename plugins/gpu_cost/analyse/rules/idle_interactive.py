"""Idle interactive session: a salloc / srun --pty / notebook session whose GPUs sit idle for hours.

Policy (``rules.idle_interactive``, sessions recognised by ``interactive:``)::

    idle_interactive:
      util_max: 5
      window: 2h          # idle while someone types is normal: hours, not minutes
      min_runtime: 1h
      ladder: [notify, notify_manager (4h), terminate (4h), kill (10m)]

The same detection as ``idle_allocation`` (:func:`gpu_cost.analyse.rules.common.idle_jobs`), for the jobs
that rule leaves alone: every job is judged by exactly one of the two.
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
class IdleInteractiveRule:
    """An interactive session (salloc, srun --pty, a notebook) whose GPUs stay idle for long.

    Idle while someone types is normal: the window is hours, not minutes, and the ladder is
    gentler. Sessions are recognised by ``interactive:``; ``idle_allocation`` leaves them to this rule.
    """

    enabled: bool = True
    mode: Mode | None = None
    util_max: Percent = 5.0
    window: Annotated[float, Dur(), Range(60, 7 * 86400)] = 2 * 3600.0
    min_runtime: Seconds = 3600.0
    ladder: tuple[Rung, ...] = (
        Rung("notify", 0.0),
        Rung("notify_manager", 4 * 3600.0),
        Rung("terminate", 4 * 3600.0),
        Rung("kill", 600.0),
    )


def why(f: Finding) -> str:
    """The decision reason for an idle interactive session."""
    ev = f.evidence
    return (f"interactive session {f.job_id} ({ev.get('interactive')}): all {f.gpus} GPU(s) "
            f"≤{ev.get('util_max')}% for {int(ev.get('window_s', 0)) // 60} min")


SPEC = RuleSpec(
    "idle_interactive", config=IdleInteractiveRule, rank=40, target="job", title="an interactive session whose GPUs are idle",
    label="Idle interactive sessions", why=why, window=lambda cfg, policy: cfg.window, idle_jobs=True,
    doc="An interactive session (salloc, srun --pty, a notebook; see ``interactive:``) whose GPUs all stay idle for "
        "the whole window, hours rather than minutes; its own gentler ladder.",
    example="""
        rules:
          idle_interactive:
            window: 2h
            ladder:
              - {action: notify}
              - {action: notify_manager, after: 4h}
              - {action: terminate, after: 4h}
    """,
)


@register(SPEC)
def idle_interactive(snapshot: Snapshot, cfg: IdleInteractiveRule, policy: Policy) -> list[Finding]:
    """Return one finding per interactive session whose GPUs were all idle over the window."""
    return idle_jobs(snapshot, "idle_interactive", cfg, policy, interactive=True)
