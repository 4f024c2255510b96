"""The executor interface every action implements, and the registry keyed by action name.

An executor module declares each action it carries out once, with ``@register(ActionSpec(...))``:
the spec (what the policy, engine, messages and report know about the action) goes to
:mod:`gpu_cost.core.registry`, the executor to :data:`REGISTRY`.

An executor receives a :class:`~gpu_cost.core.model.Decision` and an :class:`ActionContext` and returns
an :class:`Outcome`; it never decides. The audit rows before and after are written by the caller
(:mod:`gpu_cost.act.dispatch`), not by executors. In dry-run an executor must not touch
anything: it returns ``skipped`` with the command it would have run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from gpu_cost.config.schema import Policy
from gpu_cost.core.model import Decision
from gpu_cost.core.registry import ActionSpec, add_action
from gpu_cost.perceive.runner import Runner

Status = Literal["succeeded", "failed", "skipped"]


@dataclass(frozen=True)
class Outcome:
    """What an executor did.

    :param status: ``succeeded`` (the effect happened or was already there: a job already gone
        counts as done), ``failed``, or ``skipped`` (dry-run, nothing to do, not allowed).
    :param command: the command line run (or that would have run), for the audit row.
    """

    status: Status
    output: str = ""
    error: str | None = None
    command: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class ActionContext:
    """Everything an executor may use.

    :param slurm: runs Slurm commands (local, or on a login node over SSH).
    :param node_runner: returns a runner for a node name (SSH through the node wrapper).
    :param sleep: injectable for grace periods (tests pass a fast one; production time.sleep).
    :param source: where the decisions' data came from; simulated data (``sim``, ``trace``) never
        drives an executor that touches the cluster.
    :param cluster_gpus: the cluster's GPU count, for the rolling GPU-share caps (0: unknown).
    """

    policy: Policy
    dry_run: bool
    now: float
    run_id: str | None = None
    slurm: Runner | None = None
    node_runner: Callable[[str], Runner] | None = None
    sleep: Callable[[float], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    source: str | None = None
    cluster_gpus: int = 0


#: sources whose data is made up (the simulator, a replayed trace): never a reason to touch a cluster
SIMULATED_SOURCES = frozenset({"sim", "trace"})


Executor = Callable[[Decision, ActionContext], Outcome]
REGISTRY: dict[str, Executor] = {}


def register(*specs: ActionSpec) -> Callable[[Executor], Executor]:
    """Declare one or more actions (their specs) and register ``fn`` as their executor."""

    def wrap(fn: Executor) -> Executor:
        # every registered executor reaches a real system (Slurm, a node, a chat tool)
        fn.touches_cluster = True  # type: ignore[attr-defined]
        for spec in specs:
            add_action(spec)
            REGISTRY[spec.name] = fn
        return fn

    return wrap
