"""Deliver the weekly report to Slack through the Slack provider (connection ``gpu_cost_slack``).

Connection types:

``slack`` (Web API, bot token)   message + the main chart uploaded (``files_upload_v2``) to
                                 ``notifications.slack_channel`` (or the connection's ``channel`` extra)
``slackwebhook`` (Incoming Webhook)  the message only: webhooks cannot carry files, the message
                                 links the report instead

No connection: the delivery is skipped with a log line, the report itself is already written.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from gpu_cost.config.schema import Policy
from gpu_cost.core.connections import airflow_connection
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.redact import redact

logger = logging.getLogger(__name__)


def slack_text(kpis: Mapping[str, Any], link: str | None) -> str:
    """Return the Slack message (mrkdwn) for the report."""
    from gpu_cost.report.render import _env

    return str(_env().get_template("slack.txt.j2").render(k=kpis, link=link)).strip()


def post_report(result: Mapping[str, Any], policy: Policy, conn_id: str) -> dict[str, Any]:
    """Post the summary and the main chart of a written report; return what was done."""
    from gpu_cost.report.render import _root

    conn = airflow_connection(conn_id)
    if conn is None:
        logger.info("Slack connection %s is not configured: report not posted (it is at %s)", conn_id, result["report"])
        return {"posted": False, "why": f"connection {conn_id} not configured"}
    folder = _root(result["folder"])
    kpis = json.loads((folder / "kpis.json").read_text(encoding="utf-8"))
    text = redact(slack_text(kpis, str(result["report"])))  # the link may be a storage URL with credentials
    ctype = (conn.conn_type or "").lower()
    try:
        return _post(conn, conn_id, ctype, text, kpis, folder, policy)
    except GpuCostError:
        raise
    except Exception as exc:  # the Slack SDK's errors may quote the webhook URL or a token
        raise GpuCostError(f"report not posted through {conn_id}: {redact(f'{type(exc).__name__}: {exc}')[:300]}") from None


def _post(conn: Any, conn_id: str, ctype: str, text: str, kpis: Mapping[str, Any], folder: Any,
          policy: Policy) -> dict[str, Any]:
    """Post ``text`` (and, through the Web API, the main chart) on ``conn``."""
    from gpu_cost.report.charts import MAIN_CHART

    if ctype == "slackwebhook":
        from airflow.providers.slack.hooks.slack_webhook import SlackWebhookHook

        SlackWebhookHook(slack_webhook_conn_id=conn_id).send(text=text)
        logger.info("report summary posted through webhook %s (webhooks carry no files: chart not attached)", conn_id)
        return {"posted": True, "via": "webhook", "chart": False}
    if ctype == "slack":
        from airflow.providers.slack.hooks.slack import SlackHook

        extra = conn.extra_dejson if hasattr(conn, "extra_dejson") else {}
        channel = policy.notifications.slack_channel or extra.get("channel")
        png = (folder / "charts" / f"{MAIN_CHART}.png").read_bytes()
        SlackHook(slack_conn_id=conn_id).send_file_v2(
            channel_id=channel, initial_comment=text,
            file_uploads={"file": png, "filename": f"{MAIN_CHART}.png", "title": kpis["period"]["label"]},
        )
        logger.info("report summary and chart posted to %s through %s", channel or "(workspace)", conn_id)
        return {"posted": True, "via": "web-api", "chart": True, "channel": channel}
    raise GpuCostError(f"connection {conn_id}: type {ctype!r} is not a Slack connection (use slack or slackwebhook)")
