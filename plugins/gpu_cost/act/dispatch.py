"""Carry out decisions: audit row before, executor, audit row after — once per decision.

For each acting decision: write the ``gpu_cost_actions`` row (status ``started``) *before* any
effect; if the store cannot be written, nothing is done. If a row for this action already
exists, a previous attempt got that far: a finished row means done (never again); a ``started``
row without an end means a worker died mid-action, and the executor is asked to finish it
idempotently (every executor re-checks the target before acting: a job already gone counts as
done). Then the executor runs and the row is updated (``succeeded`` / ``failed`` / ``skipped``),
the live escalation ladder advances on success, and a saving is written for effects that free GPUs.

An executor that acts on a *simulated* cluster (the replay's trace) says so (``simulated = True``): its
cluster's clock is the context's instant (``ctx.now``, trace time), so its audit rows are stamped, and
with ``touches_cluster`` its rolling caps counted, in that time; and simulated data may drive it (it
reaches nothing real).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from gpu_cost.act.base import REGISTRY, SIMULATED_SOURCES, ActionContext, Executor, Outcome
from gpu_cost.audit.store import AuditStore
from gpu_cost.core.errors import AuditError
from gpu_cost.core.model import Decision

logger = logging.getLogger(__name__)

#: modules that register hooks of the dispatch when imported (the savings ledger: its SAVINGS_HOOKS entry);
#: the executors' modules are the registry's one list of action modules (core.registry.ACTION_MODULES, plus
#: those a deployment names in GPU_COST_ACTION_MODULES)
HOOK_MODULES = ("gpu_cost.act.savings",)

#: called after a successful action to write its saving (set by the savings ledger)
SAVINGS_HOOKS: list[Callable[[AuditStore, Decision, Outcome, ActionContext], None]] = []


def load_executors() -> dict[str, Any]:
    """Import every action module the registry loads (importing one registers its executors) and the hook
    modules; return the executors by action name."""
    import importlib

    from gpu_cost.core import registry

    registry.actions()
    for name in HOOK_MODULES:
        importlib.import_module(name)
    return REGISTRY


@contextlib.contextmanager
def simulated_executors(effects: Executor) -> Iterator[None]:
    """While the block runs, ``effects`` (a simulation's executor) carries out every action; the real
    executors are back after it, whatever happens."""
    from gpu_cost.core.model import ACTIONS

    load_executors()  # import the real ones first, so none registers over the simulation's mid-run
    saved = dict(REGISTRY)
    try:
        for a in ACTIONS:
            if a != "none":
                REGISTRY[a] = effects
        yield
    finally:
        REGISTRY.clear()
        REGISTRY.update(saved)


#: attempts of one action before a failure is final (its ladder then stops for the episode)
MAX_ATTEMPTS = 3


def _retryable(row: dict[str, Any]) -> bool:
    if row["status"] == "skipped":
        return str(row.get("error") or "").startswith("rate limit:")
    return row["status"] == "failed" and int(row.get("attempt") or 1) < MAX_ATTEMPTS


def action_id(d: Decision) -> str:
    return f"{d.decision_id}:{d.action}"


def cap_held(row: Mapping[str, Any] | None) -> bool:
    """Return whether an action row was held back by a rolling cap (``skipped``, ``cap: …``)."""
    return row is not None and row["status"] == "skipped" and str(row.get("error") or "").startswith("cap:")


def current_attempt(d: Decision, store: AuditStore) -> tuple[str, dict[str, Any] | None]:
    """Return the id and row of the action of ``d`` to carry out now.

    A destructive action a rolling cap held back is tried again when a later sweep proposes the same rung
    (a cap is a rate, not a verdict): each try is its own row (``<action id>~2``, ``~3``…) with its own start
    time, so the caps count it when it starts and the trail keeps every refusal.
    """
    aid = action_id(d)
    row = store.get_action(aid)
    n = 1
    while cap_held(row):
        n += 1
        aid = f"{action_id(d)}~{n}"
        row = store.get_action(aid)
    return aid, row


def execute(decisions: Iterable[Decision], ctx: ActionContext, store: AuditStore) -> list[dict[str, Any]]:
    """Execute acting decisions in order; return one result dict per decision."""
    load_executors()
    store.ping()
    results = []
    for d in decisions:
        if not d.acts and not ctx.dry_run:
            results.append({"decision_id": d.decision_id, "status": "not-acting", "action": d.action})
            continue
        results.append(execute_one(d, ctx, store))
    return results


def clock(executor: Any, ctx: ActionContext) -> float:
    """Return the time now on the cluster ``executor`` acts on: the wall clock, or for a simulated
    cluster's executor (``simulated``) the context's instant (a replay's trace time)."""
    return float(ctx.now) if getattr(executor, "simulated", False) else time.time()


def execute_one(d: Decision, ctx: ActionContext, store: AuditStore) -> dict[str, Any]:
    """Execute one decision with the audit trail around it."""
    dry_run = ctx.dry_run or d.mode == "dry-run"
    executor = REGISTRY.get(d.action)
    aid, existing = current_attempt(d, store)
    if (existing is not None and not dry_run and _retryable(existing)
            and store.execute("action_reopen", {"action_id": aid, "max_attempts": MAX_ATTEMPTS}) > 0):
        # not done yet (rate limit) or failed (controller down, node unreachable): a later sweep
        # tries again, a bounded number of times; the executor re-checks the target first
        logger.info("action %s was %s (%s): trying again", aid, existing["status"], existing.get("error"))
        existing = store.get_action(aid)
    if existing is not None and existing["status"] != "started":
        logger.info("action %s already %s: not repeated", aid, existing["status"])
        return {"decision_id": d.decision_id, "action_id": aid, "status": existing["status"], "repeated": False}
    resumed = existing is not None
    owner = None
    if not resumed:
        row: dict[str, Any] = {
            "action_id": aid, "decision_id": d.decision_id, "run_id": ctx.run_id, "action": d.action,
            "target": d.target, "executor": getattr(executor, "__module__", "none"), "dry_run": int(dry_run),
            "started_at": clock(executor, ctx), "attempt": 1, "command": None,
        }
        if executor is not None and not dry_run and d.destructive:
            from gpu_cost.act import locks
            from gpu_cost.decide.engine import entry_of

            # one effect per target: the manual reclaim and the sweep (different decision ids) never both act;
            # and, for executors that reach the cluster, the rolling caps counted over every way in, in the
            # same transaction (a simulated week's executors touch nothing and count nothing; a replay's reach its
            # trace, and count in trace time)
            caps = locks.CapCheck(policy=ctx.policy, entry=entry_of(ctx.run_id), total_gpus=ctx.cluster_gpus,
                                  now=float(row["started_at"])) if getattr(executor, "touches_cluster", False) else None
            created, owner = locks.start_effect(store, d, row, caps=caps)
        else:
            created = store.action_started(action_id=aid, decision_id=d.decision_id, run_id=ctx.run_id,
                                           action=d.action, target=d.target, executor=str(row["executor"]),
                                           dry_run=dry_run, started_at=float(row["started_at"]))
        if not created:
            # another worker wrote the row between our read and our write: it owns the action
            return {"decision_id": d.decision_id, "action_id": aid, "status": "owned-elsewhere"}
    else:
        store.execute("action_retry", {"action_id": aid})
        logger.warning("action %s was started before without an end: finishing it (executors re-check first)", aid)
    if resumed and executor is not None and not dry_run and d.destructive:
        from gpu_cost.act import locks

        owner = locks.effect_done(store, aid, d)
    if executor is None:
        outcome = Outcome("skipped", error=f"no executor for action {d.action!r} in this deployment")
    elif simulated_refusal(d, ctx, executor, dry_run):
        outcome = Outcome("skipped", error=simulated_refusal(d, ctx, executor, dry_run))
    elif owner is not None:
        from gpu_cost.act import locks

        outcome = Outcome("skipped", error=locks.owner_message(d, owner))
    else:
        try:
            outcome = executor(d, _ctx_for(ctx, dry_run))
        except AuditError:
            raise
        except Exception as exc:
            logger.exception("executor for %s failed", aid)
            outcome = Outcome("failed", error=f"{type(exc).__name__}: {exc}")
    store.action_finished(aid, outcome.status, clock(executor, ctx), output=_with_command(outcome),
                          error=outcome.error)
    if outcome.status == "succeeded" and not dry_run:
        store.execute("advance_escalation", {"rule": d.rule, "target": d.target, "track": "live", "episode": d.episode,
                                             "rung": d.rung, "now": ctx.now})
        store.set_decision_status(d.decision_id, "acted")
        for hook in SAVINGS_HOOKS:
            hook(store, d, outcome, ctx)
    elif outcome.status == "failed":
        store.set_decision_status(d.decision_id, "failed")
    elif cap_held({"status": outcome.status, "error": outcome.error}):
        # the next sweep that proposes this rung again tries it again (loop.sweep.record)
        store.set_decision_status(d.decision_id, "capped", run_id=ctx.run_id, note=outcome.error)
    logger.info("action %s %s → %s%s", d.action, d.target, outcome.status, f" ({outcome.error})" if outcome.error else "")
    return {"decision_id": d.decision_id, "action_id": aid, "status": outcome.status, "error": outcome.error,
            "command": outcome.command, "resumed": resumed}


def simulated_refusal(d: Decision, ctx: ActionContext, executor: Any, dry_run: bool) -> str | None:
    """Return why a destructive effect decided on simulated data may not run, or None.

    A simulated job id is not a real job: ``scancel 1003`` on the simulator's word would end
    whatever real job has that id. Notices still go out (they say what was seen).
    """
    if dry_run or not d.destructive or ctx.source not in SIMULATED_SOURCES:
        return None
    if getattr(executor, "simulated", False):
        return None  # it acts on the simulation itself (a replay's trace)
    if not getattr(executor, "touches_cluster", False):
        return None
    return (f"refused: {d.action} on {d.target} was decided on simulated data (source {ctx.source}); simulated "
            "data never drives a real executor")


def _ctx_for(ctx: ActionContext, dry_run: bool) -> ActionContext:
    if ctx.dry_run == dry_run:
        return ctx
    import dataclasses

    return dataclasses.replace(ctx, dry_run=dry_run)


def _with_command(o: Outcome) -> str:
    parts = []
    if o.command:
        parts.append(f"$ {o.command}")
    if o.output:
        parts.append(o.output)
    return "\n".join(parts)
