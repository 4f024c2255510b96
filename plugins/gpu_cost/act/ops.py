"""The agent's own alerts to the operators: one post to the ops channel, through the one act path.

The executor of ``alert_ops``: a decision about the agent itself (target ``agent:<dag_id>``, rule
``agent_health``) is posted to ``notifications.slack_channel`` through the Slack connection
(``gpu_cost_slack``, a webhook or the API). It is dispatched like every other action
(:func:`gpu_cost.act.dispatch.execute`): the audit row before the post and after it, once per
decision id, so a retried task never posts twice. Without a channel it is recorded and skipped.
"""

from __future__ import annotations

import logging
import time

from gpu_cost.act.base import ActionContext, Outcome, register
from gpu_cost.core.connections import airflow_connection
from gpu_cost.core.model import Decision
from gpu_cost.core.registry import ActionSpec

logger = logging.getLogger(__name__)

ALERT_OPS = ActionSpec(
    "alert_ops", rank=15, title="Ops alert", verb="alert the operators about", targets=("agent",),
    category=("notifications", "Notifications"), notice=True,
    doc="Post the agent's own health alert (a degraded run: data missing, stale or malformed) to "
        "``notifications.slack_channel``; once per unhealthy episode, never on a ladder.",
    example="""
        notifications:
          slack_channel: "#gpu-ops"
    """,
)


@register(ALERT_OPS)
def alert_ops(d: Decision, ctx: ActionContext) -> Outcome:
    """Post the decision's alert text (``evidence.text``, else its reason) to the ops channel."""
    from gpu_cost.act.channels import slack
    from gpu_cost.core.redact import connection_secrets

    channel = ctx.policy.notifications.slack_channel
    text = str(d.evidence.get("text") or d.reason)
    if not channel:
        return Outcome("skipped", error="notifications.slack_channel is not configured: recorded only")
    if ctx.dry_run:
        return Outcome("skipped", output=f"dry-run: would post to {channel}\n{text}", command=f"slack {channel}")
    conn_id = str(ctx.extra.get("slack_conn_id") or slack.SLACK_CONN_ID)
    conn = airflow_connection(conn_id)
    if conn is None:
        return Outcome("failed", error=f"connection {conn_id} is not configured", command=f"slack {channel}")
    secrets = connection_secrets(conn)
    sleep = ctx.sleep or time.sleep
    if conn.conn_type == "slackwebhook":
        dl = slack.send_webhook(conn_id, text, sleep=sleep, secrets=secrets)
    else:
        dl = slack.send_api(conn_id, channel, text, sleep=sleep, secrets=secrets)
    dl.to = [channel]
    return Outcome("succeeded" if dl.ok else "failed", output=dl.describe(), error=dl.error, command=f"slack {channel}")
