"""The one act step every way in ends with: what a run may carry out, read from the audit store.

The sweep, the manual reclaim and the off-hours power DAG each end a run with this step (their
Airflow tasks only hand it the run and map its errors to the task's failure). In order:

1. the run's data instant and its decisions come from the audit store, never from XCom;
2. a *branch* picks the decisions: ``automatic`` (no human needed), ``approved`` (a permitted approver
   said yes) or ``all`` (each as its own approval allows) — :func:`gpu_cost.decide.engine.may_act`;
3. the run's whole plan (both branches, what may still act) passes the engine's batch caps on the cluster's size as the
   run's snapshot recorded it (an unknown size refuses every destructive action on running work);
   over a cap, every decision of the plan is marked ``capped`` and nothing acts (:class:`CapExceeded`);
4. for the scheduled ways in, another unfinished run of the same DAG on the same data acts instead
   (:class:`RunConflict`), except for a human's answer, which only its own run carries out;
5. approved decisions are checked again on data as recent as the answer (the caller's ``reverify``:
   the sweep re-judges the target, the power DAG re-plans the node); those that no longer hold are
   ``expired``;
6. :func:`gpu_cost.act.dispatch.execute` carries out the rest, one at a time: the audit row before, the
   effect guard and the rolling caps over every way in, in the same transaction as that row, the
   executor (which re-checks the target's identity before it touches it), the audit row after.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpu_cost.act import dispatch, locks
from gpu_cost.audit.store import AuditStore
from gpu_cost.config.schema import Policy
from gpu_cost.core.errors import AuditError, GpuCostError
from gpu_cost.core.model import Decision, Snapshot
from gpu_cost.decide.engine import ACTABLE_STATUSES, check_caps, may_act

logger = logging.getLogger(__name__)

Branch = Literal["automatic", "approved", "all"]
#: ``reverify(decisions, run_row, now)`` → the decisions that still hold, and why each other one expired
Reverify = Callable[[list[Decision], Mapping[str, Any], float], tuple[list[Decision], dict[str, str]]]


class CapExceeded(GpuCostError):
    """The chosen decisions together exceed a batch cap: none acted, each is marked ``capped``."""


class RunConflict(GpuCostError):
    """Another unfinished run of the same way in, on the same data, has the right to act."""


@dataclass
class ActResult:
    """What one act step did."""

    branch: str
    chosen: list[Decision] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    expired: dict[str, str] = field(default_factory=dict)

    def by_status(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r["status"]] = out.get(r["status"], 0) + 1
        return out

    def failed(self) -> list[str]:
        return [str(r["decision_id"]) for r in self.results if r["status"] == "failed"]


def live_rows(store: AuditStore, run_id: str) -> list[dict[str, Any]]:
    """Return the run's decision rows that could act (live mode, an action, not only recorded or snoozed)."""
    return [r for r in store.decisions_of_run(run_id)
            if r["mode"] != "dry-run" and r["action"] != "none" and r["status"] not in ("recorded", "snoozed")]


def cluster_gpus(store: AuditStore, run_id: str) -> int:
    """Return the cluster's GPU count as the run's stored snapshot has it; 0 (unknown) without one."""
    try:
        return Snapshot.gpu_count_of_json(store.load_snapshot(run_id))
    except AuditError:
        return 0


def concurrent_run(store: AuditStore, run_id: str, dag_id: str, data_ts: float, window_s: float) -> str | None:
    """Return the id of another unfinished run of ``dag_id`` on the same data (within ``window_s``), or None."""
    since = time.time() - 6 * 3600
    for row in store.fetch("running_runs", {"dag_id": dag_id, "run_id": run_id, "since": since}):
        other = row.get("data_ts")
        if other is not None and abs(float(other) - data_ts) <= window_s:
            return str(row["run_id"])
    return None


def _approved_before(row: Mapping[str, Any], run_id: str) -> bool:
    """Return whether ``row`` was approved in the run that first decided it, another than ``run_id``."""
    return bool(row["requires_approval"]) and row["approval_status"] == "approved" and row["run_id"] != run_id


def act_run(store: AuditStore, run_id: str, policy: Policy, branch: Branch, *,
            context: Callable[[float, int, Mapping[str, Any]], Any],
            select: Callable[[Mapping[str, Any]], bool] | None = None,
            reverify: Reverify | None = None, one_run_at_a_time: bool = False,
            same_data_window_s: float | None = None, simulated_gpus: int | None = None) -> ActResult:
    """Carry out the run's ``branch`` decisions (module docstring, steps 1–6); return what happened.

    :param context: ``context(now, cluster_gpus, run_row)`` → the executors' ``ActionContext``.
    :param select: keeps only the rows this step is about (the power DAG's one action per task).
    :param reverify: re-checks approved decisions on recent data (step 5).
    :param one_run_at_a_time: a scheduled way in (the sweep, the power DAG): an older unfinished run of
        the same DAG, or one that has acted, is a :class:`RunConflict`; so is, with
        ``same_data_window_s``, one whose data instant is that close (two runs on one sample act once).
        Manual reclaims are each their own request and do not wait on one another.
    :param simulated_gpus: the simulated cluster's size, for a simulation that keeps no snapshots (the
        demo's week); the Airflow ways in never pass it: their size is the stored snapshot's.
    :raises CapExceeded: over a batch cap (the chosen decisions are marked ``capped``).
    :raises RunConflict: another run acts instead.
    :raises GpuCostError: the run has no data instant in the store.
    """
    run = store.get_run(run_id) or {}
    if run.get("data_ts") is None:
        raise GpuCostError(f"run {run_id} has no data instant in the audit store: nothing acts")
    now = float(run["data_ts"])
    # the run's plan: what may still act, and what the engine already held back for a cap (the act step
    # fails the run on it too); a human's no or an expiry took the rest out
    batch = [r for r in live_rows(store, run_id)
             if (select is None or select(r)) and (r["status"] in ACTABLE_STATUSES or r["status"] == "capped")]
    rows = batch
    if branch == "automatic":
        # a human's yes given to an earlier run carries over when a cap held the action back and this run
        # proposed the rung again (loop.sweep.record): no second question
        rows = [r for r in batch if not r["requires_approval"] or _approved_before(r, run_id)]
    elif branch == "approved":
        rows = [r for r in batch if r["requires_approval"] and not _approved_before(r, run_id)]
    chosen = [Decision.from_row(r) for r in rows if may_act(r, approved_only=branch == "approved")]
    out = ActResult(branch=branch, chosen=chosen,
                    held=[str(r["decision_id"]) for r in rows if not may_act(r, approved_only=branch == "approved")])
    if not batch:
        return out
    total = cluster_gpus(store, run_id) if simulated_gpus is None else simulated_gpus
    # the caps hold the run's whole plan (both branches): that much at once is more likely a bad
    # policy or bad data than that much waste
    violation = check_caps([Decision.from_row(r) for r in batch], policy, total)
    if violation:
        for r in batch:
            store.set_decision_status(r["decision_id"], "capped")
        raise CapExceeded(f"cap exceeded, nothing acted: {violation}")
    if not chosen:
        return out
    dag_id = run_id.split(":", 1)[0]
    if one_run_at_a_time and branch != "approved":
        # a human's answer is carried out by the run that asked (later runs wait on it); the run guard
        # is for deciding twice on the same data
        other = (concurrent_run(store, run_id, dag_id, now, same_data_window_s)
                 if same_data_window_s is not None else None) or locks.run_conflict(store, run_id, dag_id)
        if other:
            raise RunConflict(f"another run of {dag_id} ({other}) is unfinished on the same data: not acting twice")
    if branch != "automatic" and reverify is not None:
        asked = [d for d in chosen if d.requires_approval]
        kept, out.expired = reverify(asked, run, now)
        keep = {d.decision_id for d in kept}
        chosen = [d for d in chosen if not d.requires_approval or d.decision_id in keep]
        out.chosen = chosen
    out.results = dispatch.execute(chosen, context(now, total, run), store) if chosen else []
    logger.info("run %s, %s: acted on %d decision(s): %s%s", run_id, branch, len(chosen), out.by_status(),
                f"; expired {sorted(out.expired)}" if out.expired else "")
    return out

