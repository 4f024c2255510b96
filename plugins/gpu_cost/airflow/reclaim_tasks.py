"""Task bodies of ``gpu_manual_reclaim``: prepare → approve (when needed) → act → finish.

Each returns a small JSON-able value for XCom; the decisions and actions themselves go to the
audit store (``gpu_cost_db``) through the same functions the sweep uses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from gpu_cost.airflow import runtime
from gpu_cost.core.errors import GpuCostError
from gpu_cost.loop import reclaim

logger = logging.getLogger(__name__)

DAG_ID = "gpu_manual_reclaim"


def requested_by(context: Mapping[str, Any]) -> str | None:
    """Return the user who triggered the run (the Airflow UI/API user), when Airflow knows it."""
    dag_run = context.get("dag_run")
    return getattr(dag_run, "triggering_user_name", None) or None


def prepare(params: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the request, resolve its targets, decide under the policy, record the decisions.

    A bad request raises :class:`~gpu_cost.loop.reclaim.ReclaimRequestError` before anything acts; it
    is recorded in ``gpu_cost_runs`` with status ``refused`` and the mode it would have run in (its
    policy's, the request's when milder; none when the policy could not be loaded, and then no source
    either unless the run or the deployment named one).
    """
    from gpu_cost.act.base import SIMULATED_SOURCES
    from gpu_cost.core.errors import PolicyError
    from gpu_cost.core.model import DESTRUCTIVE_ACTIONS
    from gpu_cost.loop import sweep  # numpy, pandas: imported here, not when the DAG file is parsed

    run_id = runtime.audit_run_id(context)
    store = runtime.store()
    source = runtime.asked_source(params)  # the policy's, once it has loaded
    now = time.time()
    mode: str | None = None  # a run's mode is a policy's: none until one is loaded
    try:
        try:
            policy = runtime.pin_policy(store, run_id, params)
        except PolicyError as exc:
            raise reclaim.ReclaimRequestError(f"manual reclaim refused before any action: {exc}") from exc
        mode = policy.mode
        source = runtime.source_from(policy, params)
        now = runtime.data_instant(context, policy)
        request = reclaim.parse_request(params, requested_by(context))
        mode = reclaim.run_mode(request, policy)
        if source in SIMULATED_SOURCES and not request.dry_run and request.action in DESTRUCTIVE_ACTIONS:
            raise reclaim.ReclaimRequestError(
                f"manual reclaim refused before any action: source {source} is simulated data, and simulated "
                f"data never drives a real executor ({request.action}); use dry_run, or a live source")
        store.begin_run(run_id, dag_id=DAG_ID, started_at=time.time(), data_ts=now, source=source, mode=mode)
        snap = sweep.collect(policy, now, source)
        from gpu_cost.analyse import baselines

        baselines.observe(store, snap, policy, run_id=run_id, learn=False)  # a service needs a human's approval
        p = reclaim.plan(request, policy, snap, now=now, run_key=run_id)
    except reclaim.ReclaimRequestError as exc:
        store.begin_run(run_id, dag_id=DAG_ID, started_at=time.time(), data_ts=now, source=source, mode=mode)
        store.finish_run(run_id, status="refused", finished_at=time.time(), problems=[str(exc)])
        raise
    # the act steps read the cluster's size (the rolling GPU-share caps) from here, never from XCom
    store.save_snapshot(run_id, now, snap.to_json())
    # recorded as the sweep records them: what acts is "decided", what only records is "recorded"
    store.record_decisions([d for d in p.decisions if not d.acts], run_id, status="recorded")
    store.record_decisions([d for d in p.decisions if d.acts], run_id, status="decided")
    for d in p.decisions:
        logger.info("decision %s %s → %s [%s]%s %s", d.decision_id, d.target, d.action, d.mode,
                    " (needs approval)" if d.requires_approval and d.acts else "", d.reason)
    for r in p.refused:
        logger.warning("refused %s: %s", r["target"], r["why"])
    # XCom carries ids and counts; what acts is read back from the audit store by the run's id
    return {"run_id": run_id, "now": now, "policy": policy.source, "source": source, "mode": mode,
            "cluster_gpus": snap.gpu_count(), "decision_ids": [d.decision_id for d in p.decisions],
            "refused": p.refused, "needs_approval": p.needs_approval,
            "acting": sum(1 for d in p.decisions if d.acts)}


def act(prep: Mapping[str, Any] | None, branch: str, context: Mapping[str, Any]) -> dict[str, Any]:
    """Dispatch one branch's decisions with the audit trail around each.

    What acts is read from the audit store by the run's id, never from XCom: the run's decisions,
    the approval answers recorded on them, the policy pinned by ``prepare``, its data instant and
    the cluster's size (its snapshot). The branch's decisions pass the caps again on that size (a
    run whose size is unknown acts on nothing that touches work).
    ``automatic``: the decisions that need no human (run at once, whatever the approver answers);
    ``approved``: the ones that do, when a permitted approver approved them. A decision is in
    exactly one branch, so a *Reject* holds back only what the approval request listed.
    """
    from airflow.sdk.exceptions import AirflowFailException

    from gpu_cost.act.step import act_run
    from gpu_cost.airflow.sweep_tasks import action_context

    if branch not in ("automatic", "approved"):
        raise ValueError(f"act: unknown branch {branch!r} (automatic or approved)")
    run_id = runtime.audit_run_id(context)
    store = runtime.store()
    policy = runtime.run_policy(store, run_id)

    def ctx(now: float, total: int, run: Mapping[str, Any]) -> Any:
        return action_context(policy, now, run_id, store=store, source=run.get("source"), cluster_gpus=total)

    try:
        out = act_run(store, run_id, policy, "approved" if branch == "approved" else "automatic", context=ctx)
    except GpuCostError as exc:  # a cap, no data instant: nothing acted
        raise AirflowFailException(f"manual reclaim {branch}: {exc}") from exc
    for r in out.results:
        logger.info("%s action %s → %s%s", branch, r.get("action_id") or r.get("decision_id"), r["status"],
                    f" ({r['error']})" if r.get("error") else "")
    return {"branch": branch, "results": out.results, "held": out.held}


def finish(prep: Mapping[str, Any] | None, approval: Mapping[str, Any] | None,
           acted: Mapping[str, Any] | None, acted_approved: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Record the run's end in ``gpu_cost_runs``; fail the run when an action failed.

    Runs whatever happened upstream, so a rejected or failed run still gets its audit row. The run
    is ``failed`` when an action failed or the automatic branch did not finish; else ``rejected``
    when the approver said no (or did not answer), the automatic part having acted; else ``ok``.
    """
    from airflow.sdk.exceptions import AirflowFailException

    if prep is None:
        raise AirflowFailException("prepare did not finish: the request was refused or failed (see its log)")
    store = runtime.store()
    decisions = store.decisions_of_run(prep["run_id"])
    # the approval operator has written the answer onto the decisions already
    answer = (approval or {}).get("status") if prep.get("needs_approval") else None
    results = list((acted or {}).get("results") or []) + list((acted_approved or {}).get("results") or [])
    failed = [r for r in results if r.get("status") == "failed"]
    approved_missing = answer == "approved" and acted_approved is None
    if acted is None or failed or approved_missing:
        status = "failed"
    elif answer in ("rejected", "timed_out", "refused"):
        status = "rejected"
    else:
        status = "ok"
    counts = {"decisions": len(decisions), "refused": len(prep.get("refused") or []),
              "acted": sum(1 for r in results if r.get("status") == "succeeded"),
              "skipped": sum(1 for r in results if r.get("status") == "skipped"), "failed": len(failed)}
    store.finish_run(prep["run_id"], status=status, finished_at=time.time(), counts=counts)
    summary = {"run_id": prep["run_id"], "status": status, "approval": answer, **counts,
               "results": [{k: r.get(k) for k in ("decision_id", "status", "error")} for r in results]}
    logger.info("manual reclaim %s: %s", prep["run_id"], summary)
    if status == "failed":
        why = "; ".join(f"{r.get('action_id')}: {r.get('error')}" for r in failed) or "an act step did not finish"
        raise AirflowFailException(f"manual reclaim failed: {why}")
    return summary



__all__ = ["act", "finish", "prepare", "requested_by"]
