"""Delivery channels: one small class per service, each sending a rendered notice through an
Airflow provider's hook on its own connection.

=========  ====================================  =====================  ==================
channel    provider (hook)                       connection             mentions
=========  ====================================  =====================  ==================
slack      slack (SlackWebhookHook / SlackHook)  ``gpu_cost_slack``     ``people.<u>.slack``
email      smtp (SmtpHook)                       ``gpu_cost_smtp``      (the address)
wecom      apprise (``wecombot://``)             ``gpu_cost_wecom``     none: text message
dingtalk   dingding (DingdingHook)               ``gpu_cost_dingtalk``  ``people.<u>.dingtalk``
feishu     apprise (``feishu://`` / ``lark://``)  ``gpu_cost_feishu``    ``people.<u>.feishu``
teams      apprise (``workflow://``)             ``gpu_cost_teams``     ``people.<u>.teams``
ticket     http (HttpHook)                       ``gpu_cost_ticket``    (owner, manager in the JSON)
=========  ====================================  =====================  ==================

:func:`channel` builds one by name; :mod:`gpu_cost.act.notify` chooses which.
"""

from __future__ import annotations

from collections.abc import Callable

from gpu_cost.act.channels.base import Channel


def channel(name: str, *, conn_id: str | None = None, sleep: Callable[[float], None] | None = None,
            slack_channel: str | None = None) -> Channel:
    """Return the channel called ``name`` (``slack``, ``email``, ``wecom``, ...) on ``conn_id`` (default: its own)."""
    from gpu_cost.act.channels.apprise import FeishuChannel, TeamsChannel, WeComChannel
    from gpu_cost.act.channels.dingtalk import DingTalkChannel
    from gpu_cost.act.channels.email import EmailChannel
    from gpu_cost.act.channels.slack import SlackChannel
    from gpu_cost.act.channels.ticket import TicketChannel

    classes: dict[str, type[Channel]] = {c.name: c for c in (SlackChannel, EmailChannel, WeComChannel, DingTalkChannel,
                                                              FeishuChannel, TeamsChannel, TicketChannel)}
    if name not in classes:
        raise KeyError(f"unknown channel {name!r}; known: {', '.join(sorted(classes))}")
    cls = classes[name]
    if cls is SlackChannel:
        return SlackChannel(conn_id=conn_id, sleep=sleep, slack_channel=slack_channel)
    return cls(conn_id=conn_id, sleep=sleep)


__all__ = ["Channel", "channel"]
