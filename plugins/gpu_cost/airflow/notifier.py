"""Airflow notifiers of the GPU cost agent, declared at module level as Airflow's providers declare theirs.

:class:`ApprovalSlackNotifier` announces a HITL approval request on Slack with the link to its
Required Actions page. It is a :class:`~airflow.sdk.BaseNotifier` (like the Slack provider's
``SlackNotifier``), so an operator takes it in ``notifiers=[...]`` and Airflow renders its
``text`` template; :func:`approval_notifier` is the default the approval operator uses.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseNotifier

from gpu_cost.core.connections import SLACK_CONN_ID, airflow_connection
from gpu_cost.core.errors import ActionError
from gpu_cost.core.redact import connection_secrets, scrub

logger = logging.getLogger(__name__)

#: the default announcement (an Airflow template, rendered with the task's context)
APPROVAL_TEXT = "Approval needed: {{ task.subject }} (DAG {{ dag.dag_id }}, run {{ run_id }})"


class ApprovalSlackNotifier(BaseNotifier):
    """Post "approval needed" with a link to the Required Actions page; never raises.

    Reads no connection until it notifies. At notify time it picks the Slack provider's
    ``SlackWebhookNotifier`` or ``SlackNotifier`` by the connection's type; when the connection is
    not configured, or Slack fails, it logs and returns, so a missing or broken Slack never fails
    the approval task (a raising notifier would).

    :param slack_conn_id: the Slack connection (``slackwebhook`` or ``slack``)
    :param text: the announcement, an Airflow template
    :param channel: with a bot token, where to post (default ``#gpu-cost``); a webhook posts to its own channel
    """

    template_fields = ("text",)

    def __init__(self, *, slack_conn_id: str = SLACK_CONN_ID, text: str = APPROVAL_TEXT,
                 channel: str | None = None) -> None:
        super().__init__()
        self.slack_conn_id = slack_conn_id
        self.text = text
        self.channel = channel

    def notify(self, context: Any) -> None:
        try:
            self._notify(context)
        except Exception as exc:
            conn = airflow_connection(self.slack_conn_id)
            logger.warning("approval notice not sent: %s",
                           scrub(f"{type(exc).__name__}: {exc}", connection_secrets(conn) if conn else []))

    def _notify(self, context: Any) -> None:
        conn = airflow_connection(self.slack_conn_id)
        if conn is None:
            logger.info("no %s connection: approval request not announced on Slack", self.slack_conn_id)
            return
        try:
            text = f"{self.text}\n<{approval_link(context)}|Approve or reject in Airflow>"
        except ActionError as exc:
            logger.warning("%s; announcing without a link", exc)
            text = self.text
        if conn.conn_type == "slackwebhook":
            from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier

            SlackWebhookNotifier(slack_webhook_conn_id=self.slack_conn_id, text=text).notify(context)
        else:
            from airflow.providers.slack.notifications.slack import SlackNotifier

            SlackNotifier(slack_conn_id=self.slack_conn_id, text=text, channel=self.channel or "#gpu-cost").notify(context)


def approval_notifier(conn_id: str = SLACK_CONN_ID, channel: str | None = None) -> ApprovalSlackNotifier | None:
    """Return the approval operator's default notifier, or None when ``GPU_COST_APPROVAL_NOTIFY=0``.

    Safe to call at parse time: it reads no connection.
    """
    if os.environ.get("GPU_COST_APPROVAL_NOTIFY", "1") == "0":
        return None
    return ApprovalSlackNotifier(slack_conn_id=conn_id, channel=channel)


def approval_link(context: Mapping[str, Any]) -> str:
    """Return the link to the HITL task's Required Actions page (``[api] base_url`` based)."""
    from airflow.providers.standard.operators.hitl import HITLOperator

    try:
        return HITLOperator.generate_link_to_ui_from_context(context=context)  # type: ignore[arg-type]
    except Exception as exc:
        raise ActionError(f"cannot build the approval link: {exc}") from exc


__all__ = ["APPROVAL_TEXT", "ApprovalSlackNotifier", "approval_link", "approval_notifier"]
