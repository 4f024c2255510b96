"""WeCom, Feishu/Lark and Microsoft Teams, through the Airflow Apprise provider.

Each channel's connection (conn type ``apprise``) holds its Apprise URL in ``extra.config``, as the
provider's :class:`AppriseHook` reads it (``{"path": "wecombot://<key>"}``); the URL carries the
service's secret, so it lives in the connection only, never in the policy or a log line.

=========  ==============================  ===================================================
channel    Apprise URL                     what the service gets
=========  ==============================  ===================================================
wecom      ``wecombot://<key>``            group robot, ``msgtype: text`` (the plain text; Apprise
                                           sends no ``mentioned_list``, so nobody is mentioned)
feishu     ``feishu://<token>`` or         bot, ``msg_type: interactive`` card: the subject as its
           ``lark://<token>``              header, the Markdown text, ``<at id=...>`` mentions
teams      ``workflow://<host>/<id>/<sig>``  Power Automate / Workflows, an Adaptive Card: the subject
                                           as heading, the Markdown text, ``<at>...</at>`` mentions
=========  ==============================  ===================================================

The hook's own ``notify`` drops Apprise's result, so a failed post would pass unseen: the channel
lets the hook load the connection's URLs into an :class:`apprise.Apprise` object and calls its
``notify``, which says whether the service took the message; the HTTP status comes from Apprise's
warning (``error=429``) and drives the shared retry loop.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from gpu_cost.act.channels.base import Answer, Channel, Delivery, with_retries
from gpu_cost.act.notices.recipients import Recipient
from gpu_cost.act.notices.render import Message
from gpu_cost.core.redact import connection_secrets, redact, scrub

_STATUS = re.compile(r"error=(\d{3})")
#: what a handle in a mention may hold: ids and user principal names, nothing that closes a tag
_HANDLE = re.compile(r"^[A-Za-z0-9_.@+-]{1,128}$")


class AppriseChannel(Channel):
    """A service Apprise drives: one post to the connection's group, mentioning who has a handle.

    A group post reaches every recipient routed to it: ``via`` chose this group for them.
    """

    #: Apprise's body format for :meth:`body` (``markdown`` or ``text``)
    body_format: ClassVar[str] = "markdown"

    def body(self, message: Message, recipients: Sequence[Recipient]) -> str:
        """Return the text the service gets: mentions, then the Markdown message."""
        tags = " ".join(self.mention(h) for r in recipients if (h := r.handle(self.name)) and _HANDLE.match(h))
        return f"{tags} {message.markdown}" if tags else message.markdown

    def mention(self, handle: str) -> str:
        raise NotImplementedError

    def post(self, message: Message, recipients: Sequence[Recipient], conn: Any, *,
             stand_in: bool = False) -> list[Delivery]:
        import apprise
        from airflow.providers.apprise.hooks.apprise import AppriseHook

        secrets = connection_secrets(conn)
        dl = Delivery(self.name, False, [r.user for r in recipients])
        targets = apprise.Apprise()
        try:
            AppriseHook(apprise_conn_id=self.conn_id).set_config_from_conn(conn=conn, apprise_obj=targets)
        except Exception as exc:
            dl.error = scrub(f"connection {self.conn_id}: {type(exc).__name__}: {exc}", secrets)
            return [dl]
        if len(targets) == 0:
            dl.error = f"connection {self.conn_id}: extra.config holds no Apprise URL Apprise can use"
            return [dl]
        body = redact(self.body(message, recipients))
        fmt = apprise.NotifyFormat.MARKDOWN if self.body_format == "markdown" else apprise.NotifyFormat.TEXT

        def attempt() -> Answer:
            with apprise.LogCapture(level=logging.WARNING) as logs:
                ok = targets.notify(body=body, title=message.subject, body_format=fmt)
            if ok:
                return 200, {}, ""
            said = [line for line in str(logs.getvalue()).splitlines() if line.strip()]
            found = _STATUS.search(" ".join(said))
            if found:
                return int(found[1]), {}, said[-1]
            # no HTTP status: a connection error is worth another try; a refusal is final
            network = any("connection error" in line.lower() for line in said)
            return (0 if network else 400), {}, said[-1] if said else "Apprise reported a failure"

        return [with_retries(dl, attempt, f"{self.name} (Apprise)", self.sleep, secrets)]


class WeComChannel(AppriseChannel):
    """WeCom (企业微信) group robot: ``msgtype: text``, the plain text."""

    name = "wecom"
    default_conn_id = "gpu_cost_wecom"
    body_format = "text"

    def body(self, message: Message, recipients: Sequence[Recipient]) -> str:
        return message.plain


class FeishuChannel(AppriseChannel):
    """Feishu/Lark bot: an interactive card, mentions as ``<at id=open_id></at>``."""

    name = "feishu"
    default_conn_id = "gpu_cost_feishu"

    def mention(self, handle: str) -> str:
        return f"<at id={handle}></at>"


class TeamsChannel(AppriseChannel):
    """Microsoft Teams through a Workflows (Power Automate) webhook: an Adaptive Card, mentions as
    ``<at>user</at>`` (Apprise adds the card's ``msteams.entities``)."""

    name = "teams"
    default_conn_id = "gpu_cost_teams"

    def mention(self, handle: str) -> str:
        return f"<at>{handle}</at>"


__all__ = ["AppriseChannel", "FeishuChannel", "TeamsChannel", "WeComChannel"]
