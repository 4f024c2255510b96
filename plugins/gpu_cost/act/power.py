"""Power actions: ``power_down`` / ``power_up`` of whole nodes, through Slurm's power saving.

``power_down``  ``scontrol update nodename=<node> state=POWER_DOWN reason="<offhours.reason>"``:
                Slurm drains nothing, marks the node powering down, runs the site's
                ``SuspendProgram`` (IPMI, cloud API...) and shows it ``idle~`` once off; a job that
                needs it later makes Slurm run ``ResumeProgram`` by itself.
``power_up``    ``scontrol update nodename=<node> state=POWER_UP``.

Both re-check the node first (``scontrol show nodes --json`` / ``sinfo --json``): a node that is no
longer idle is never powered down (``skipped``), one already down / up counts as done. A node
outside Slurm (decision evidence ``outside_slurm: true``) is powered off over SSH through the node
wrapper (``gpu-cost-node-action power-off``); waking such a node is the site's IPMI/Wake-on-LAN's
job, not the agent's. Dry-run runs nothing and returns ``skipped`` with the command.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence

from gpu_cost.act.base import ActionContext, Outcome, register
from gpu_cost.core.errors import SourceError
from gpu_cost.core.model import Decision, Node
from gpu_cost.core.registry import ActionSpec
from gpu_cost.perceive.runner import Runner

logger = logging.getLogger(__name__)

NODE_WRAPPER = "gpu-cost-node-action"


def node_of(d: Decision) -> str:
    """Return the node a power decision targets (``host`` or a ``node:<name>`` target)."""
    if d.target.startswith("node:"):
        return d.target[5:]
    if d.host:
        return d.host
    raise ValueError(f"decision {d.decision_id} targets {d.target!r}, not a node")


def _runner(ctx: ActionContext) -> Runner:
    if ctx.slurm is not None:
        return ctx.slurm
    from gpu_cost.perceive.slurm import default_runner

    return default_runner()


def _current(ctx: ActionContext, name: str) -> Node | None:
    from gpu_cost.perceive.slurm import SlurmSource

    for n in SlurmSource(_runner(ctx), timeout=30.0).nodes():
        if n.name == name:
            return n
    return None


def _precheck(ctx: ActionContext, name: str, argv: Sequence[str]) -> Node | Outcome:
    """Return the node as Slurm sees it now, or the outcome that ends the action: dry-run, re-check
    failed, unknown node."""
    cmd = shlex.join(argv)
    if ctx.dry_run:
        return Outcome("skipped", output="dry-run: nothing run", command=cmd, details={"node": name})
    try:
        node = _current(ctx, name)
    except SourceError as exc:
        return Outcome("failed", error=f"re-check of {name} failed: {exc}", command=cmd)
    if node is None:
        return Outcome("failed", error=f"Slurm does not know node {name}", command=cmd)
    return node


def _scontrol(ctx: ActionContext, argv: Sequence[str], name: str, what: str) -> Outcome:
    from gpu_cost.act.slurm import classify

    res = _runner(ctx).run(list(argv), timeout=30.0)
    kind = classify(res)
    msg = (res.stderr.strip() or res.stdout.strip())[:400]
    if res.ok:
        return Outcome("succeeded", output=f"{what} requested for {name}", command=res.command, details={"node": name})
    if kind == "denied":
        return Outcome("failed", error=f"permission denied ({what} {name}): {msg}", command=res.command)
    if kind == "unreachable":
        return Outcome("failed", error=f"Slurm controller unreachable ({what} {name}): {msg}", command=res.command)
    return Outcome("failed", error=f"{what} {name} failed (exit {res.rc}): {msg}", command=res.command)


@register(ActionSpec(
    "power_down", rank=11, title="power the node down", verb="power down", targets=("node",),
    category=("power_downs", "Nodes powered down"), destructive=True, form=True,
    doc="Power an idle node down through Slurm's power saving (``scontrol update nodename=<node> "
        "state=POWER_DOWN``); off-hours power and the manual form use it, never a rule's ladder.",
    example="""
        offhours:
          windows: [{days: [sat, sun], start: "00:00", end: "24:00"}]
          max_nodes_per_run: 4
          warm_reserve_nodes: 1
    """,
))
def power_down(d: Decision, ctx: ActionContext) -> Outcome:
    """Power an idle node down through Slurm.

    YAML (policy)::

        offhours: {reason: "gpu-cost: off-hours", max_nodes_per_run: 4, warm_reserve_nodes: 1}
    """
    name = node_of(d)
    reason = ctx.policy.offhours.reason
    if d.evidence.get("outside_slurm"):
        argv = [NODE_WRAPPER, "power-off"]
        if ctx.dry_run:
            return Outcome("skipped", output="dry-run: nothing run", command=f"ssh {name} {shlex.join(argv)}")
        if ctx.node_runner is None:
            return Outcome("failed", error=f"{name} is outside Slurm and no node runner is configured")
        res = ctx.node_runner(name).run(argv, timeout=60.0)
        if res.ok:
            return Outcome("succeeded", output=res.stdout.strip()[:400], command=f"ssh {name} {res.command}")
        return Outcome("failed", error=f"{res.command} on {name} exited {res.rc}: {res.stderr.strip()[:300]}",
                       command=f"ssh {name} {res.command}")
    argv = ["scontrol", "update", f"nodename={name}", "state=POWER_DOWN", f"reason={reason}"]
    node = _precheck(ctx, name, argv)
    if isinstance(node, Outcome):
        return node
    if node.state.endswith(("~", "%", "!")):
        return Outcome("succeeded", output=f"{name} already powered down ({node.state})", command=shlex.join(argv),
                       details={"node": name, "noop": True})
    if node.state != "idle" or node.gpus_alloc:
        return Outcome("skipped", error=f"{name} is {node.state} with {node.gpus_alloc} GPU(s) allocated: not powered down",
                       command=shlex.join(argv), details={"node": name, "state": node.state})
    return _scontrol(ctx, argv, name, "power down")


@register(ActionSpec(
    "power_up", rank=12, title="power the node up", verb="power up", targets=("node",),
    category=("power_ups", "Nodes powered up"),
    doc="Bring a node the agent powered down back (``scontrol update nodename=<node> state=POWER_UP``) "
        "before forecast demand returns or when pending jobs need it.",
    example="""
        offhours:
          wake_lead: 30m
          wake_on_pending: true
    """,
))
def power_up(d: Decision, ctx: ActionContext) -> Outcome:
    """Bring a node the agent powered down back: ``scontrol update nodename=<node> state=POWER_UP``."""
    name = node_of(d)
    if d.evidence.get("outside_slurm"):
        return Outcome("skipped", error=f"{name} is outside Slurm: wake it with the site's IPMI / Wake-on-LAN")
    argv = ["scontrol", "update", f"nodename={name}", "state=POWER_UP"]
    node = _precheck(ctx, name, argv)
    if isinstance(node, Outcome):
        return node
    if not node.state.endswith(("~", "%", "!")):
        return Outcome("succeeded", output=f"{name} already up ({node.state})", command=shlex.join(argv),
                       details={"node": name, "noop": True})
    return _scontrol(ctx, argv, name, "power up")
