"""Human approval of decisions: an ``ApprovalOperator`` that lists them and records the answer.

Any DAG that records decisions under its audit run id (``<dag_id>:<run_id>``, see
:func:`gpu_cost.airflow.runtime.audit_run_id`) can put :class:`RecordingApprovalOperator` in
front of its acting task: the request lists the run's decisions awaiting approval (evidence and
stakes), the answer (who, when, what) is written as an approval event (``gpu_cost_decisions.approval_status /
approved_by / approved_at``) through the approver's connection ``gpu_cost_db_approver`` (on PostgreSQL the
only role that may write one; unset: the audit store's own), and a *Reject* skips the acting task (the run still succeeds). An
unanswered request takes the default, *Reject*, after ``approval.timeout`` of the policy.

The timeout: Airflow needs one when the DAG is parsed, and the policy is only read at run time,
so the operator is built with :data:`DEFAULT_TIMEOUT` and, when the request is written, replaces
it with the policy's ``approval.timeout`` (Airflow takes the deadline from that moment). Set
``GPU_COST_APPROVAL_TIMEOUT`` (e.g. ``2h``) to change the parse-time fallback.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator

from gpu_cost.core.timeutil import format_duration, iso, parse_duration

logger = logging.getLogger(__name__)


def _default_timeout() -> dt.timedelta:
    raw = os.environ.get("GPU_COST_APPROVAL_TIMEOUT")
    try:
        return dt.timedelta(seconds=parse_duration(raw)) if raw else dt.timedelta(hours=1)
    except ValueError:
        logger.warning("GPU_COST_APPROVAL_TIMEOUT=%r is not a duration; using 1h", raw)
        return dt.timedelta(hours=1)


#: parse-time fallback; the policy's approval.timeout replaces it when the request is written
DEFAULT_TIMEOUT = _default_timeout()

#: statuses written to gpu_cost_decisions.approval_status; ``refused``: an answer came from someone
#: who may not give it (the requester of an override, or a user outside the approvers), and counts as a no
APPROVED, REJECTED, TIMED_OUT, REFUSED = "approved", "rejected", "timed_out", "refused"

#: who wants to act, by the way in (the DAG of the run)
ASKER = {"sweep": "The sweep wants", "manual": "A manual reclaim asks", "power": "The off-hours power run wants"}


def _evidence(row: Mapping[str, Any]) -> dict[str, Any]:
    import json

    raw = row.get("evidence")
    try:
        return json.loads(raw) if isinstance(raw, str) and raw else dict(raw or {})
    except ValueError:
        return {}


def permitted_approvers(rows: Sequence[Mapping[str, Any]], policy: Any) -> tuple[list[str] | None, set[str]]:
    """Return (who may answer, who may not) for a request listing ``rows``.

    Who may answer: the override approvers named on an overriding decision (the requester already
    left out), else ``approval.assigned_users``, else anyone (None). Who may not: whoever requested
    any of the decisions (a manual reclaim's requester never approves their own request).
    """
    requesters = {str(_evidence(r).get("requested_by")) for r in rows if _evidence(r).get("requested_by")}
    named: list[str] | None = None
    for r in rows:
        approvers = _evidence(r).get("approvers")
        if approvers is not None:
            listed = [str(a) for a in approvers]
            named = listed if named is None else [a for a in named if a in listed]
    if named is None and policy.approval.assigned_users:
        named = list(policy.approval.assigned_users)
    if named is not None:
        named = [a for a in named if a not in requesters]
    return named, requesters


def pending_approvals(store: Any, run_id: str) -> list[dict[str, Any]]:
    """Return the run's decisions that wait for a human (acting, approval required, unanswered)."""
    return [r for r in store.decisions_of_run(run_id)
            if r["requires_approval"] and r["approval_status"] == "pending" and r["status"] == "decided"]


def approval_text(rows: Sequence[Mapping[str, Any]], policy: Any, entry: str = "sweep") -> tuple[str, str]:
    """Return (subject, Markdown body) of the approval request for ``rows`` (``entry``: the way in asking)."""
    import json

    at_risk = sum(float(r["gpu_hours_at_risk"] or 0) for r in rows)
    gpus = sum(int(r["gpus"] or 0) for r in rows)
    subject = f"GPU cost agent: approve {len(rows)} action(s) on {gpus} GPU(s), {at_risk:.1f} GPU-h of work at risk?"
    lines = [
        f"{ASKER.get(entry, 'The agent wants')} to act on **{len(rows)}** target(s). *Approve* carries out every action below; "
        f"*Reject* (also the answer after {format_duration(policy.approval.timeout)} without one) does none of them, "
        "and they are not asked again in this episode.",
        "",
        "| action | target | owner | GPUs | at risk (GPU-h) | freed (GPU-h) | why |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| **{r['action']}** | `{r['target']}` | {r['user_name'] or '?'} | {r['gpus']} | "
            f"{float(r['gpu_hours_at_risk'] or 0):.1f} | {float(r['gpu_hours_saved'] or 0):.1f} | "
            f"{_cell(r['reason'])} |"
        )
    lines += ["", "Evidence:"]
    for r in rows:
        try:
            ev = json.loads(r["evidence"] or "{}")
        except ValueError:
            ev = {}
        keep = {k: v for k, v in ev.items() if k not in ("track",) and v not in (None, "", [])}
        lines.append(f"- `{r['target']}` (decision `{r['decision_id']}`, decided {iso(r['ts'])}): "
                     f"{_cell(json.dumps(keep, default=str))[:600]}")
    lines += ["", f"Policy: `{policy.source}`. Snooze instead: "
                  f"`{policy.notifications.snooze_hint.format(target='<target>')}`"]
    return subject, "\n".join(lines)


def _cell(text: Any) -> str:
    return str(text or "").replace("|", "\\|").replace("\n", " ")


def record_answer(store: Any, decision_ids: Sequence[str], status: str, by: str | None, at: float | None, *,
                  approver: Any = None) -> int:
    """Write the answer onto each decision; a rejected or timed-out decision gets status ``rejected``.

    :param approver: the store the approvals are written through (:func:`gpu_cost.airflow.runtime.approver_store`:
        on PostgreSQL the approver's role, since the agent's may not write one); None: ``store``
    """
    for did in decision_ids:
        (approver or store).set_approval(did, status, by, at)
        if status != APPROVED:
            store.set_decision_status(did, "rejected")
    return len(decision_ids)


class RecordingApprovalOperator(ApprovalOperator):
    """Ask a human to approve the run's pending decisions; record who answered, when and what.

    Skips itself when nothing awaits approval. On *Approve* downstream runs; on *Reject* or
    timeout the direct downstream tasks are skipped. Pushes XCom ``decision``:
    ``{chosen, by, at, timed_out, decision_ids}``. Without ``notifiers`` the request is announced
    on Slack with its link (:class:`gpu_cost.airflow.notifier.ApprovalSlackNotifier`; never fails the task).
    The policy is the one the run pinned; an answer from the requester of the actions, or from
    someone outside the permitted approvers, is recorded as ``refused`` and counts as a *Reject*.
    """

    #: Airflow can lose an answer that arrives while the parked task's process is still exiting (the
    #: task fails and is retried); a retry asks again, or replays the answer the audit store holds, so
    #: the request always gets this many retries, whatever the DAG's default, and a short delay
    MIN_RETRIES, RETRY_DELAY = 3, dt.timedelta(seconds=5)

    def __init__(self, **kwargs: Any) -> None:
        kwargs["retries"] = max(int(kwargs.get("retries") or 0), self.MIN_RETRIES)
        delay = kwargs.get("retry_delay") or self.RETRY_DELAY
        delay = delay if isinstance(delay, dt.timedelta) else dt.timedelta(seconds=float(delay))
        kwargs["retry_delay"] = min(delay, self.RETRY_DELAY)
        kwargs.setdefault("subject", "GPU cost agent: actions awaiting approval")
        kwargs.setdefault("defaults", self.REJECT)
        kwargs.setdefault("response_timeout", DEFAULT_TIMEOUT)
        if "notifiers" not in kwargs:
            from gpu_cost.airflow.notifier import approval_notifier

            kwargs["notifiers"] = [n for n in [approval_notifier()] if n is not None]
        super().__init__(**kwargs)

    def execute(self, context: Any) -> Any:
        from airflow.sdk.exceptions import AirflowSkipException

        from gpu_cost.airflow import runtime
        from gpu_cost.decide.engine import entry_of

        store = runtime.store()
        run_id = runtime.audit_run_id(context)
        policy = runtime.run_policy(store, run_id)  # the policy the run decided under, not today's file
        rows = pending_approvals(store, run_id)
        if not rows:
            answered = [r for r in store.decisions_of_run(run_id)
                        if r["requires_approval"] and r["approval_status"] not in (None, "pending")]
            if answered:
                return self._replay_answer(context, answered)
            raise AirflowSkipException("no decision of this run awaits approval")
        # the run waits for a human now: other sweeps may decide and act meanwhile (locks.run_conflict)
        store.execute("mark_run_awaiting", {"run_id": run_id})
        self.response_timeout = dt.timedelta(seconds=policy.approval.timeout)
        self.subject, self.body = approval_text(rows, policy, entry_of(run_id))
        named, _ = permitted_approvers(rows, policy)
        if named is not None:
            self.assigned_users = [{"id": u, "name": u} for u in named]
        logger.info("approval requested for %d decision(s) of %s; timeout %s, default Reject", len(rows), run_id,
                    format_duration(policy.approval.timeout))
        return super().execute(context)

    def _replay_answer(self, context: Any, rows: Sequence[Mapping[str, Any]]) -> Any:
        """A retried task whose request was answered already: give the recorded answer again, ask nobody.

        The answer lives in the audit store; without this a retry would find nothing pending and skip
        itself, and with it the approved actions (``act_approved``).
        """
        from airflow.sdk.exceptions import AirflowSkipException

        statuses = {str(r["approval_status"]) for r in rows}
        approved = statuses == {APPROVED}
        by = next((r.get("approved_by") for r in rows if r.get("approved_by")), None)
        context["ti"].xcom_push(key="decision", value={
            "chosen": [self.APPROVE if approved else self.REJECT], "by": by, "at": None, "timed_out": TIMED_OUT in statuses,
            "status": APPROVED if approved else sorted(statuses - {APPROVED})[0], "decision_ids": [r["decision_id"] for r in rows],
            "refused": None, "replayed": True})
        logger.info("approval for %d decision(s) was answered already (%s by %s): not asked again", len(rows),
                    ", ".join(sorted(statuses)), by)
        if not approved:
            raise AirflowSkipException(f"the approval was answered already: {', '.join(sorted(statuses))}")
        return None

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        from gpu_cost.airflow import runtime
        from gpu_cost.core.timeutil import epoch

        if "chosen_options" in event:
            store = runtime.store()
            run_id = runtime.audit_run_id(context)
            rows = pending_approvals(store, run_id)
            ids = [r["decision_id"] for r in rows]
            chosen = list(event["chosen_options"])
            user = event.get("responded_by_user")
            timed_out = bool(event.get("timedout")) or user is None
            by = (user.get("name") or user.get("id")) if user else None
            at = event.get("responded_at")
            at_ts = epoch(at) if at is not None else None
            named, requesters = permitted_approvers(rows, runtime.run_policy(store, run_id))
            refused = None
            if not timed_out and by is not None:
                ids_of_user = {str(user.get("id")), str(user.get("name"))} if user else set()
                if ids_of_user & requesters:
                    refused = f"{by} requested these actions and may not approve them"
                elif named is not None and not ids_of_user & set(named):
                    refused = f"{by} is not among the permitted approvers ({', '.join(named) or 'none'})"
            if refused:
                status = REFUSED
                logger.warning("approval answer for %s refused: %s; nothing acts", run_id, refused)
            elif chosen == [self.APPROVE] and not timed_out:
                status = APPROVED
            else:
                status = TIMED_OUT if timed_out else REJECTED
            record_answer(store, ids, status, by, at_ts, approver=runtime.approver_store(store))
            logger.info("approval answer for %s: %s by %s (%d decision(s))", run_id, status, by or "timeout", len(ids))
            context["ti"].xcom_push(key="decision", value={
                "chosen": chosen, "by": by, "at": iso(at_ts) if at_ts else None, "timed_out": timed_out,
                "status": status, "decision_ids": ids, "refused": refused,
            })
            if refused:
                # the answer was not one this person may give: downstream is skipped, as on a Reject
                event = {**event, "chosen_options": [self.REJECT]}
        return super().execute_complete(context=context, event=event)
