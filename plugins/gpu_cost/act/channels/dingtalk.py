"""DingTalk (钉钉) custom robot, through the Airflow DingTalk provider's :class:`DingdingHook`.

The connection ``gpu_cost_dingtalk`` (conn type ``dingding``) holds the robot's access token as its
password; its host is ``https://oapi.dingtalk.com`` unless set. The robot gets ``msgtype: markdown``
(the subject as title, the Markdown text) with ``at.atMobiles``: the recipients' mobile numbers
(``people.<user>.dingtalk``), each also written as ``@<number>`` in the text, as DingTalk requires
for the mention to show. The hook takes mobile numbers only (no ``atUserIds``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gpu_cost.act.channels.base import Answer, Channel, Delivery, with_retries
from gpu_cost.act.notices.recipients import Recipient
from gpu_cost.act.notices.render import Message
from gpu_cost.core.redact import connection_secrets, redact, scrub

_MOBILE = re.compile(r"^\+?[0-9][0-9 -]{4,31}$")
#: DingTalk's "sending too fast" errcode: a 429 in all but name
_TOO_FAST = 130101
_STATUS = re.compile(r"^(\d{3}):")
_ERRCODE = re.compile(r'"errcode"\s*:\s*(\d+)')


class DingTalkChannel(Channel):
    """One markdown post to the robot's group, mentioning the recipients' mobile numbers."""

    name = "dingtalk"
    default_conn_id = "gpu_cost_dingtalk"

    def post(self, message: Message, recipients: Sequence[Recipient], conn: Any, *,
             stand_in: bool = False) -> list[Delivery]:
        from airflow.providers.dingding.hooks.dingding import DingdingHook

        secrets = connection_secrets(conn)
        mobiles = [h for r in recipients if (h := r.handle("dingtalk")) and _MOBILE.match(h)]
        tags = " ".join(f"@{m}" for m in mobiles)
        text = redact(f"{tags}\n\n{message.markdown}" if tags else message.markdown)
        dl = Delivery(self.name, False, [r.user for r in recipients])
        hook = DingdingHook(dingding_conn_id=self.conn_id, message_type="markdown",
                            message={"title": message.subject, "text": text}, at_mobiles=mobiles)

        def attempt() -> Answer:
            try:
                hook.send()
                return 200, {}, ""
            except Exception as exc:
                said = f"{type(exc).__name__}: {exc}"
                status = _STATUS.match(str(exc))  # the HTTP provider raises "429:Too Many Requests"
                if status:
                    return int(status[1]), {}, said
                code = _ERRCODE.search(str(exc))  # HTTP 200 with a non-zero errcode: DingTalk refused it
                if code:
                    return (429 if int(code[1]) == _TOO_FAST else 400), {}, said
                return 0, {}, scrub(said, secrets)

        return [with_retries(dl, attempt, "DingTalk", self.sleep, secrets)]


__all__ = ["DingTalkChannel"]
