"""Node actions over SSH, always through the node wrapper: kill an orphan GPU process safely.

``kill_process`` sends ``kill-process <pid> <start_ts> <gpu_uuid> <owner> TERM`` to the node
wrapper (``include/node/gpu-cost-node-action``), which re-checks ON THE NODE that the PID still has
the start time, owner, GPU UUID and (absent) Slurm job the agent saw, and refuses otherwise — so a
PID reused by another process is never signalled, nor a process of a running Slurm job, of root,
of a system account (uid under the node's ``UID_MIN``, a ``nologin`` shell) or in a container,
whatever the agent asks. Then it waits the grace period (``ctx.sleep``), checks again (signal ``0``), and sends
``KILL`` if the process is still there. A process already gone counts as done; a refusal is
``skipped`` with the node's one-line reason; bad arguments or a failed tool on the node (no pidfd,
squeue unreachable) are ``failed`` with it. Dry-run runs nothing and reports the command it would
have run.

Policy: the zombie ladder's ``kill_process`` rung::

    zombie:
      ladder:
        - {action: notify}
        - {action: kill_process, after: 15m}

Grace: ``ctx.extra["kill_grace_s"]`` (default 30 s). Node access: ``ctx.node_runner(host)`` when
given, else the ``gpu_cost_node_ssh`` connection.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from gpu_cost.act.base import ActionContext, Outcome, register
from gpu_cost.core.model import Decision
from gpu_cost.core.registry import ActionSpec
from gpu_cost.perceive.runner import Completed, Runner

logger = logging.getLogger(__name__)

DEFAULT_GRACE_S = 30.0
EXIT_GONE, EXIT_REFUSED = 3, 4


def parse_target(d: Decision) -> tuple[str, int, int, str, str]:
    """Return ``(host, pid, start_ts, gpu_uuid, owner)`` of a ``proc:<host>:<pid>:<start>`` decision."""
    parts = d.target.split(":")
    if len(parts) != 4 or parts[0] != "proc" or not parts[2].isdigit() or not parts[3].isdigit():
        raise ValueError(f"target {d.target!r} is not proc:<host>:<pid>:<start_ts>")
    uuid = str((d.evidence or {}).get("gpu_uuid") or "")
    if not uuid:
        raise ValueError(f"decision {d.decision_id} has no gpu_uuid in its evidence: the node cannot re-check it")
    owner = d.user or ""
    if not owner:
        raise ValueError(f"decision {d.decision_id} names no owner of the process: the node cannot re-check it")
    return parts[1], int(parts[2]), int(parts[3]), uuid, owner


def _details(res: Completed) -> dict[str, Any]:
    for line in reversed(res.stdout.strip().splitlines()):
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            return data
    return {"stdout": res.stdout[-300:], "stderr": res.stderr[-300:]}


def _reason(res: Completed) -> str:
    """The node's one-line reason: the wrapper's JSON ``error``, else the end of what it printed."""
    error = _details(res).get("error")
    if isinstance(error, str) and error:
        return error
    return (res.stderr or res.stdout).strip()[-300:]


@register(ActionSpec(
    "kill_process", rank=10, title="kill the process (SIGTERM, then SIGKILL)", verb="kill the process",
    targets=("process",), category=("process_kills", "Processes killed"), destructive=True, ends_job=True,
    final=True, frees_gpus=True, ladder=True, form=True,
    doc="End an orphan GPU process: SIGTERM, grace, re-check, SIGKILL, through the node wrapper "
        "(``gpu-cost-node-action``), which refuses root's processes.",
    example="""
        rules:
          zombie:
            ladder:
              - {action: notify}
              - {action: kill_process, after: 15m}
    """,
))
def kill_process(d: Decision, ctx: ActionContext) -> Outcome:
    """TERM, grace, re-check, KILL an orphan GPU process — through the node wrapper only."""
    from gpu_cost.perceive.nodes import NodeAccess

    try:
        host, pid, start, uuid, owner = parse_target(d)
    except ValueError as exc:
        return Outcome("failed", error=str(exc))
    access = ctx.extra.get("node_access")
    if access is None:
        try:
            access = NodeAccess.from_connection()
        except Exception as exc:
            if ctx.dry_run:
                access = NodeAccess()
            else:
                return Outcome("failed", error=str(exc))
    term = access.argv("kill-process", pid, start, uuid, owner, "TERM")
    command = " ".join(term)
    if ctx.dry_run:
        logger.info("dry-run: would run on %s: %s", host, command)
        return Outcome("skipped", output=f"dry-run: would run on {host}", command=command)
    runner: Runner = ctx.node_runner(host) if ctx.node_runner else access.runner(host)
    sleep = ctx.sleep or time.sleep
    grace = float(ctx.extra.get("kill_grace_s", DEFAULT_GRACE_S))
    steps: list[str] = []

    def call(signal_name: str) -> Completed:
        res = runner.run(access.argv("kill-process", pid, start, uuid, owner, signal_name), timeout=60)
        steps.append(f"{signal_name}: rc={res.rc} {json.dumps(_details(res), sort_keys=True)}")
        return res

    res = call("TERM")
    if res.rc == EXIT_GONE:
        return Outcome("succeeded", output="\n".join(steps), command=command, details={"result": "already gone"})
    if res.rc == EXIT_REFUSED:
        # the node no longer sees the process we found (PID reused, GPU released, in a job now) or
        # will not touch it (root, another owner, a system account, a container): final, not retried
        return Outcome("skipped", output="\n".join(steps), error=_reason(res) or "refused by the node",
                       command=command, details={"result": "refused"})
    if res.rc != 0:
        return Outcome("failed", output="\n".join(steps), error=f"TERM failed ({res.rc}): {_reason(res)}",
                       command=command)
    sleep(grace)
    res = call("0")
    if res.rc in (EXIT_GONE, EXIT_REFUSED):
        # gone, or no longer the GPU-holding process we signalled
        return Outcome("succeeded", output="\n".join(steps), command=command, details={"result": "exited after TERM"})
    if res.rc != 0:
        return Outcome("failed", output="\n".join(steps), error=f"check after TERM failed ({res.rc}): {_reason(res)}",
                       command=command)
    res = call("KILL")
    if res.rc in (EXIT_GONE, EXIT_REFUSED):
        return Outcome("succeeded", output="\n".join(steps), command=command, details={"result": "exited before KILL"})
    if res.rc != 0:
        return Outcome("failed", output="\n".join(steps), error=f"KILL failed ({res.rc}): {_reason(res)}", command=command)
    for _ in range(10):
        sleep(0.5)
        res = call("0")
        if res.rc in (EXIT_GONE, EXIT_REFUSED):
            return Outcome("succeeded", output="\n".join(steps), command=command, details={"result": "killed"})
    return Outcome("failed", output="\n".join(steps), error=f"process {pid} on {host} survived KILL", command=command)
