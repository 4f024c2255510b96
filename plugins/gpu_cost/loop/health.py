"""The agent's own health: one ops alert per degraded episode, never one per sweep.

A sweep whose data is incomplete (a source down, stale, partial or malformed) is recorded
``degraded`` and acts on nothing destructive. Operators must hear about it — once. (A run whose
freshness sensor gave up is ``stale`` and *fails* in Airflow, which alerts on failed runs; it
records no decision.) :func:`degraded_alert` raises the alert only when the run is
unhealthy and the previous finished run of the same DAG was healthy (or there was none): the
start of an episode. It records a decision with rule ``agent_health`` (target ``agent:<dag_id>``,
evidence: the problems) and, when ``notifications.slack_channel`` is configured, posts to it
through the one act path: the ``alert_ops`` action (:mod:`gpu_cost.act.ops`, the Slack connection
``gpu_cost_slack``) dispatched by :func:`gpu_cost.act.dispatch.execute`, with the audit row written
before the post and updated after, as for every action. The decision id comes
from the run id, so a retried task never alerts twice. The problems are redacted
(:func:`gpu_cost.core.redact.redact`) before they are quoted anywhere.

Policy::

    notifications:
      slack_channel: "#gpu-ops"
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpu_cost.act import dispatch
from gpu_cost.act.base import ActionContext
from gpu_cost.config.schema import Policy
from gpu_cost.core.model import Decision
from gpu_cost.core.redact import redact_all

if TYPE_CHECKING:
    from gpu_cost.audit.store import AuditStore

logger = logging.getLogger(__name__)

RULE = "agent_health"
#: run statuses that make an unhealthy episode
UNHEALTHY = frozenset({"degraded"})

# the most recent finished run of the same DAG before this one
_PREVIOUS_RUN = """
SELECT run_id, status, started_at FROM gpu_cost_runs
WHERE dag_id = :dag_id AND run_id <> :run_id AND status NOT IN ('running', 'awaiting_approval')
  AND started_at <= :started_at
ORDER BY started_at DESC, run_id DESC LIMIT 1
"""


def previous_run(store: AuditStore, dag_id: str, run_id: str, started_at: float) -> dict[str, Any] | None:
    """Return the latest finished run of ``dag_id`` that started before ``started_at`` (not ``run_id``)."""
    rows = store.query(_PREVIOUS_RUN, {"dag_id": dag_id, "run_id": run_id, "started_at": started_at})
    return rows[0] if rows else None


def alert_id(dag_id: str, run_id: str) -> str:
    """Return the deterministic decision id of the alert raised by ``run_id``."""
    return hashlib.sha256(f"{RULE}|{dag_id}|{run_id}".encode()).hexdigest()[:20]


def degraded_alert(store: AuditStore, policy: Policy, *, run_id: str, dag_id: str, status: str,
                   problems: Sequence[str], now: float, sleep: Callable[[float], None] | None = None,
                   slack_conn_id: str | None = None) -> dict[str, Any] | None:
    """Raise the ops alert when ``run_id`` starts an unhealthy episode; return what was done, else None.

    :param status: the run's final status (``ok``, ``degraded``, ``capped``...).
    :param now: the run's data instant (the decision's ``ts``).
    """
    if status not in UNHEALTHY:
        return None
    problems = redact_all(problems)  # quoted in the alert, the decision and the log: no credentials
    run = store.get_run(run_id)
    started = float(run["started_at"]) if run and run.get("started_at") is not None else time.time()
    prev = previous_run(store, dag_id, run_id, started)
    if prev is not None and prev["status"] in UNHEALTHY:
        logger.info("run %s is %s, as was %s: same episode, no new alert", run_id, status, prev["run_id"])
        return None
    did = alert_id(dag_id, run_id)
    text = (f":warning: GPU cost agent `{dag_id}`: run `{run_id}` is *{status}* — nothing destructive acts until "
            f"the data is whole again.\n" + "\n".join(f"• {p}" for p in problems[:10]))
    d = Decision(decision_id=did, ts=now, rule=RULE, target_kind="agent", target=f"agent:{dag_id}",
                 action="alert_ops", mode="notify", reason=f"run {status}: {'; '.join(problems)[:500]}",
                 evidence={"run_status": status, "problems": list(problems), "text": text,
                           "previous_run": prev["run_id"] if prev else None,
                           "previous_status": prev["status"] if prev else None})
    channel = policy.notifications.slack_channel
    store.record_decisions([d], run_id, status="decided" if channel else "recorded")
    logger.warning("agent health: %s run %s is %s (%s); alert %s", dag_id, run_id, status, "; ".join(problems), did)
    if not channel:
        return {"decision_id": did, "status": status, "sent": False,
                "why": "notifications.slack_channel is not configured: recorded only"}
    # the one act path: the audit row before the post and after it, once per decision id
    ctx = ActionContext(policy=policy, dry_run=False, now=now, run_id=run_id, sleep=sleep or time.sleep,
                        extra={"store": store, **({"slack_conn_id": slack_conn_id} if slack_conn_id else {})})
    (res,) = dispatch.execute([d], ctx, store)
    out: dict[str, Any] = {"decision_id": did, "status": status, "sent": res["status"] == "succeeded",
                           "action_id": res.get("action_id")}
    if res.get("error"):
        out["why" if res["status"] == "skipped" else "error"] = res["error"]
    return out


__all__ = ["RULE", "UNHEALTHY", "alert_id", "degraded_alert", "previous_run"]
