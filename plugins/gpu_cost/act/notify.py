"""Notifications: tell the owner (and their manager) what was found and what happens next.

The executor of the ``advise``, ``notify`` and ``notify_manager`` actions: render the notice
(:mod:`gpu_cost.act.notices.render`), find its recipients and their channels
(:mod:`gpu_cost.act.notices.recipients`), hold to the per-user limit
(:mod:`gpu_cost.act.notices.ratelimit`), and deliver through the channels (:mod:`gpu_cost.act.channels`).

Who has no ``via`` of their own or their team's gets today's default: Slack on ``gpu_cost_slack``,
and e-mail on ``gpu_cost_smtp`` as the fallback when Slack fails or they have no Slack handle
(``notifications.email_fallback``). Who has one gets its channels in order until one reaches them;
a channel without its connection is a failed delivery in the outcome, and the next one goes.
Escalations can also open a ticket (``notifications.ticket``). Dry-run sends nothing and returns
the rendered message. Connection secrets never reach a log line, an outcome or an audit row.

Policy example::

    people:
      alice: {slack: U012ABCDEF, email: alice@example.org, manager: carol}
      bob: {via: [wecom, email], email: bob@example.org, manager: carol}
      carol: {slack: U034GHIJKL, email: carol@example.org}
    notifications:
      max_per_user_per_hour: 4
      email_fallback: true
      accounts:
        vision: {via: [feishu, email]}
      ticket: {actions: [notify_manager], conn_id: gpu_cost_ticket}
      snooze_hint: "gpu-cost snooze --target {target} --for 4h --reason '...'"
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from gpu_cost.act.base import ActionContext, Outcome, register
from gpu_cost.act.channels import channel
from gpu_cost.act.channels.base import Delivery
from gpu_cost.act.channels.email import SMTP_CONN_ID, EmailChannel
from gpu_cost.act.channels.slack import SLACK_CONN_ID, SlackChannel
from gpu_cost.act.notices.ratelimit import rate_limited
from gpu_cost.act.notices.recipients import Recipient, recipients
from gpu_cost.act.notices.render import Message, render
from gpu_cost.config.schema import Policy
from gpu_cost.core.model import Decision
from gpu_cost.core.registry import KINDS, ActionSpec

if TYPE_CHECKING:
    from gpu_cost.audit.store import AuditStore

logger = logging.getLogger(__name__)

_ANY = KINDS  # a notice may be about anything
_NOTICES = ("notifications", "Notifications")
ADVISE = ActionSpec(
    "advise", rank=1, title="Advice", verb="advise", targets=_ANY, category=_NOTICES,
    notice=True, ladder=True,
    doc="Tell the owner how the job could use its GPUs better; a one-rung ladder, never followed by an "
        "action (the only action of ``low_efficiency`` and of inference services).",
    example="""
        rules:
          low_efficiency:
            ladder: [{action: advise}]
    """,
)
NOTIFY = ActionSpec(
    "notify", rank=2, title="Notice", verb="notify", form=True, targets=_ANY, category=_NOTICES,
    notice=True, ladder=True,
    doc="Tell the owner (Slack, e-mail as the fallback, or the channels ``people.<user>.via`` names) what was "
        "found and what comes next; rate-limited per user (``notifications.max_per_user_per_hour``).",
    example="""
        ladder:
          - {action: notify}
          - {action: cancel, after: 2h}
    """,
)
NOTIFY_MANAGER = ActionSpec(
    "notify_manager", rank=3, title="Escalation", verb="escalate", targets=_ANY, category=_NOTICES,
    notice=True, ladder=True,
    doc="Tell the owner and the owner's manager (``people.<user>.manager``).",
    example="""
        ladder:
          - {action: notify}
          - {action: notify_manager, after: 1h}
    """,
)


@register(ADVISE, NOTIFY, NOTIFY_MANAGER)
def notify(d: Decision, ctx: ActionContext) -> Outcome:
    """Send the notice for a decision through each recipient's channels; rate-limited per user."""
    policy = ctx.policy
    msg = render(d, policy, ctx.now, run_id=ctx.run_id, dry_run=ctx.dry_run,
                 answer_key=None if ctx.dry_run else _answer_key())
    rcpts = recipients(d, policy)
    who = ", ".join(f"{r.user} ({r.role})" for r in rcpts)
    if ctx.dry_run:
        return Outcome("skipped", output=f"dry-run: would notify {who}\n{msg.subject}\n\n{msg.text}",
                       command=f"notify {who}", details={"recipients": [r.user for r in rcpts]})
    if d.user:
        limited = rate_limited(_store(ctx), d, policy.notifications.max_per_user_per_hour)
        if limited:
            return Outcome("skipped", error=limited, command=f"notify {who}", details={"rate_limited": True})
    sleep = ctx.sleep or time.sleep
    conn_ids = {k[: -len("_conn_id")]: v for k, v in ctx.extra.items() if k.endswith("_conn_id") and isinstance(v, str)}
    conn_ids.setdefault("smtp", SMTP_CONN_ID)
    deliveries = deliver(msg, rcpts, policy, sleep=sleep, conn_ids=conn_ids)
    reached = {u for dl in deliveries if dl.ok for u in dl.to}
    missed = [r.user for r in rcpts if r.user not in reached]
    report = "\n".join(dl.describe() for dl in deliveries) or "no channel configured"
    details = {"deliveries": [dl.__dict__ for dl in deliveries], "missed": missed}
    owner = rcpts[0].user
    if owner not in reached:
        errors = "; ".join(dl.error for dl in deliveries if dl.error) or "no Slack handle or e-mail known"
        return Outcome("failed", output=report, error=f"{owner} was not reached: {errors}",
                       command=f"notify {who}", details=details)
    output = report + (f"\nnot reached: {', '.join(missed)}" if missed else "") + f"\n\n{msg.text}"
    return Outcome("succeeded", output=output, command=f"notify {who}", details=details)


def _answer_key() -> bytes | None:
    """The link key answers are signed with, or None when ``gpu_cost_answers`` is not configured
    (the notice then goes out without answers rather than not at all)."""
    from gpu_cost.decide import answers

    try:
        return answers.keys().link_key
    except answers.AnswerRefused as exc:
        logger.warning("notices go out without answers: %s", exc)
        return None


def _store(ctx: ActionContext) -> AuditStore:
    store = ctx.extra.get("store")
    if store is None:
        from gpu_cost.audit.store import AuditStore

        store = AuditStore().ensure_schema()
    return store  # type: ignore[no-any-return]


def deliver(msg: Message, rcpts: Sequence[Recipient], policy: Policy, *, sleep: Callable[[float], None],
            conn_ids: Mapping[str, str] | None = None) -> list[Delivery]:
    """Send ``msg`` to ``rcpts``, each on their channels, plus the escalation ticket the policy asks for.

    ``conn_ids`` overrides a channel's connection (``{"slack": ..., "smtp": ..., "wecom": ...}``).
    """
    ids = dict(conn_ids or {})
    out: list[Delivery] = []
    default = [r for r in rcpts if not r.via]
    if default:
        out += _default_route(msg, default, policy, sleep=sleep, slack_conn_id=ids.get("slack", SLACK_CONN_ID),
                              smtp_conn_id=ids.get("smtp", SMTP_CONN_ID))
    routes: dict[tuple[str, ...], list[Recipient]] = {}
    for r in rcpts:
        if r.via:
            routes.setdefault(r.via, []).append(r)
    for via, group in routes.items():
        out += _route(msg, group, via, policy, sleep=sleep, conn_ids=ids)
    ticket = policy.notifications.ticket
    if ticket is not None and msg.action in ticket.actions:
        out += channel("ticket", conn_id=ids.get("ticket", ticket.conn_id), sleep=sleep).send(msg, rcpts)
    return out


def _conn_id(name: str, ids: Mapping[str, str]) -> str | None:
    return ids.get("smtp" if name == "email" else name)


def _route(msg: Message, group: Sequence[Recipient], via: Sequence[str], policy: Policy, *,
           sleep: Callable[[float], None], conn_ids: Mapping[str, str]) -> list[Delivery]:
    """Try ``via``'s channels in order, each for whoever the earlier ones did not reach."""
    out: list[Delivery] = []
    reached: set[str] = set()
    for i, name in enumerate(via):
        todo = [r for r in group if r.user not in reached]
        if not todo:
            break
        ch = channel(name, conn_id=_conn_id(name, conn_ids), sleep=sleep,
                     slack_channel=policy.notifications.slack_channel)
        dls = ch.send(msg, todo, stand_in=i == len(via) - 1)
        out += dls
        reached |= {u for dl in dls if dl.ok for u in dl.to}
    return out


def _default_route(msg: Message, rcpts: Sequence[Recipient], policy: Policy, *, sleep: Callable[[float], None],
                   slack_conn_id: str, smtp_conn_id: str) -> list[Delivery]:
    """Slack where possible, then e-mail to whoever Slack did not reach (the route without ``via``)."""
    out: list[Delivery] = []
    slack = SlackChannel(conn_id=slack_conn_id, sleep=sleep, slack_channel=policy.notifications.slack_channel)
    slack_conn = slack.connection()
    use_mail = policy.notifications.email_fallback or slack_conn is None
    mail_can_help = use_mail and any(r.email for r in rcpts)
    if slack_conn is not None:
        out += slack.post(msg, rcpts, slack_conn, stand_in=not mail_can_help)
    reached = {u for dl in out if dl.ok for u in dl.to}
    rest = [r for r in rcpts if r.user not in reached and r.email]
    if rest and use_mail:
        out += EmailChannel(conn_id=smtp_conn_id, sleep=sleep).send(msg, rest)
    if slack_conn is None and not rest:
        out.append(Delivery("slack", False, [], error=f"connection {slack_conn_id} is not configured and no e-mail is known"))
    return out


__all__ = ["ADVISE", "NOTIFY", "NOTIFY_MANAGER", "deliver", "notify"]
