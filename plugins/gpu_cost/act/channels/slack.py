"""Slack, through the Airflow Slack provider on ``gpu_cost_slack``.

Conn type ``slackwebhook``: an incoming webhook (:class:`SlackWebhookHook`), one post to the
webhook's channel mentioning the recipients. Conn type ``slack``: a bot token (:class:`SlackHook`),
a direct message to each recipient's Slack id. Texts pass through :func:`gpu_cost.core.redact.redact`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gpu_cost.act.channels.base import Answer, Channel, Delivery, with_retries
from gpu_cost.act.notices.recipients import Recipient
from gpu_cost.act.notices.render import Message, slack_escape
from gpu_cost.core.connections import SLACK_CONN_ID
from gpu_cost.core.redact import connection_secrets, redact, scrub


class SlackChannel(Channel):
    """Slack: a webhook post mentioning the recipients, or a bot's direct message to each.

    :param slack_channel: with a bot token, where a notice for nobody with a Slack id goes
        when it stands in (``notifications.slack_channel``)
    """

    name = "slack"
    default_conn_id = SLACK_CONN_ID

    def __init__(self, *, conn_id: str | None = None, sleep: Callable[[float], None] | None = None,
                 slack_channel: str | None = None) -> None:
        super().__init__(conn_id=conn_id, sleep=sleep)
        self.slack_channel = slack_channel

    def post(self, message: Message, recipients: Sequence[Recipient], conn: Any, *,
             stand_in: bool = False) -> list[Delivery]:
        out: list[Delivery] = []
        secrets = connection_secrets(conn)
        if conn.conn_type == "slackwebhook":
            mentioned = [r for r in recipients if r.slack]
            # a webhook posts to one channel: it reaches the people it mentions, or, when nobody
            # has a handle and nothing later can reach them, the channel itself stands in for the owner
            if mentioned or stand_in:
                text = with_mentions(message.text, mentioned)
                dl = send_webhook(self.conn_id, text, sleep=self.sleep, secrets=secrets,
                                  blocks=answer_blocks(text, message.buttons))
                dl.to = [r.user for r in mentioned] or [recipients[0].user]
                out.append(dl)
            return out
        targets = [(r, r.slack) for r in recipients if r.slack]
        if not targets and self.slack_channel and stand_in:
            targets = [(recipients[0], self.slack_channel)]
        for r, channel in targets:
            dl = send_api(self.conn_id, channel, message.text, sleep=self.sleep, secrets=secrets,
                          blocks=answer_blocks(message.text, message.buttons))
            dl.to = [r.user]
            out.append(dl)
        return out


def answer_blocks(text: str, buttons: Sequence[Any]) -> list[dict[str, Any]] | None:
    """Return Block Kit blocks for a notice with answer buttons, or None without buttons.

    The text, an optional reason field, and one button per answer whose value is the answer's
    signed token; Slack posts the press, with the reason typed, to the app's interactivity
    Request URL (``/gpu-cost/answers/slack`` on the api-server).
    """
    if not buttons:
        return None
    elements = []
    for b in buttons:
        el: dict[str, Any] = {"type": "button", "action_id": f"gpu_cost_{b.choice}_{int(b.duration_s or 0)}",
                              "text": {"type": "plain_text", "text": b.label[:75]}, "value": b.token}
        if b.choice == "release":
            el["style"] = "danger"
            el["confirm"] = {"title": {"type": "plain_text", "text": "Release it now?"},
                             "text": {"type": "plain_text", "text": "The job is cancelled, through the policy's checks."},
                             "confirm": {"type": "plain_text", "text": "Release"},
                             "deny": {"type": "plain_text", "text": "Keep it"}}
        elements.append(el)
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": redact(text)[:3000]}},
        {"type": "input", "block_id": "gpu_cost_reason", "optional": True,
         "label": {"type": "plain_text", "text": "Reason (recorded)"},
         "element": {"type": "plain_text_input", "action_id": "reason", "max_length": 500}},
        {"type": "actions", "block_id": "gpu_cost_answer", "elements": elements},
    ]


def with_mentions(text: str, people: Iterable[Recipient]) -> str:
    tags = " ".join(f"<@{slack_escape(r.slack)}>" for r in people)
    return f"{tags} {text}" if tags else text


def send_webhook(conn_id: str, text: str, *, sleep: Callable[[float], None], secrets: Sequence[str] = (),
                 blocks: list[dict[str, Any]] | None = None) -> Delivery:
    """Post ``text`` through the incoming webhook of ``conn_id``; retry 429 and 5xx (bounded)."""
    from airflow.providers.slack.hooks.slack_webhook import SlackWebhookHook

    dl = Delivery("slack-webhook", False)
    text = redact(text)  # a notice or alert quoting an error must not carry its credentials out
    try:
        # our own retry loop reports every attempt; the SDK's own handlers would hide them
        client = SlackWebhookHook(slack_webhook_conn_id=conn_id, retry_handlers=[]).client
    except Exception as exc:
        dl.error = scrub(f"{type(exc).__name__}: {exc}", secrets)
        return dl
    body: dict[str, Any] = {"text": text, "unfurl_links": False}
    if blocks:
        body["blocks"] = blocks

    def attempt() -> Answer:
        try:
            resp = client.send_dict(body)
            return int(resp.status_code), dict(resp.headers or {}), str(resp.body or "")
        except Exception as exc:
            return 0, {}, scrub(f"{type(exc).__name__}: {exc}", secrets)

    return with_retries(dl, attempt, "Slack webhook", sleep, secrets)


def send_api(conn_id: str, channel: str, text: str, *, sleep: Callable[[float], None],
             secrets: Sequence[str] = (), blocks: list[dict[str, Any]] | None = None) -> Delivery:
    """Post ``text`` to ``channel`` (a user id opens a DM) with the bot token of ``conn_id``."""
    from airflow.providers.slack.hooks.slack import SlackHook
    from slack_sdk.errors import SlackApiError

    dl = Delivery("slack-api", False)
    text = redact(text)  # a notice or alert quoting an error must not carry its credentials out
    try:
        client = SlackHook(slack_conn_id=conn_id, retry_handlers=[]).client
    except Exception as exc:
        dl.error = scrub(f"{type(exc).__name__}: {exc}", secrets)
        return dl

    def attempt() -> Answer:
        try:
            if blocks:
                client.chat_postMessage(channel=channel, text=text, unfurl_links=False, blocks=blocks)
            else:
                client.chat_postMessage(channel=channel, text=text, unfurl_links=False)
            return 200, {}, ""
        except SlackApiError as exc:
            status = int(getattr(exc.response, "status_code", 0) or 0)
            headers = dict(getattr(exc.response, "headers", {}) or {})
            answer = str(exc.response.get("error", "")) if exc.response is not None else str(exc)
            # Slack said ok=false (channel_not_found, not_authed...): not retryable
            return (400 if status == 200 else status), headers, answer
        except Exception as exc:
            return _status_of(exc), {}, f"{type(exc).__name__}: {exc}"

    return with_retries(dl, attempt, "Slack API", sleep, secrets)


def _status_of(exc: Exception) -> int:
    import json

    if isinstance(exc, json.JSONDecodeError):
        return 502  # an HTML error page instead of Slack's JSON: a server-side failure
    return 0


__all__ = ["SLACK_CONN_ID", "SlackChannel", "answer_blocks", "send_api", "send_webhook", "with_mentions"]
