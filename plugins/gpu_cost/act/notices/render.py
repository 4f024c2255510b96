"""Render a notice: titles, the templates' context, and one :class:`Message` per decision.

Message bodies are Jinja2 templates in ``include/templates/notify/`` (their variables are listed in
that folder's README). One template, ``message.slack.j2``, gives the chat text three times: escaped
for Slack's mrkdwn (``Message.text``), for Markdown (``Message.markdown``: DingTalk, Feishu, Teams,
tickets) and as plain text (``Message.plain``: WeCom's text message, where nothing is markup), so a
value quoted from a job (its name, a reason) can never become markup, a link or a mention on any channel. The e-mail subject and HTML body have their own templates.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_cost.act.notices.recipients import recipients
from gpu_cost.config.schema import Policy
from gpu_cost.core import paths, registry
from gpu_cost.core.model import FOREIGN, Decision, reservation_standing
from gpu_cost.core.timeutil import format_duration, iso

#: the notices (derived from the registry: every action declared ``notice=True``)
NOTICE_ACTIONS = registry.names(notice=True)

#: decision sources that are not rules, and what a message calls them (the rules' titles are registered)
SOURCE_TITLES = {
    "offhours": "an idle node during off-hours",
    "manual": "an operator's manual reclaim request",
}

#: how urgent a notice is, for channels that grade (a ticket's ``severity``)
SEVERITY = {"advise": "low", "notify": "medium", "notify_manager": "high"}


@dataclass(frozen=True)
class Message:
    """A rendered notice: the chat text (Slack mrkdwn, and Markdown), the e-mail subject and HTML
    body, and the decision it is about (a channel formats the message itself from these).

    :param subject: one header line (the e-mail subject, a card's or a ticket's title)
    :param text: Slack mrkdwn
    :param html: the e-mail body
    :param markdown: the same words as ``text``, escaped for Markdown
    :param plain: the same words unescaped, for plain-text channels
    :param decision_id: the decision the notice is about
    :param target: its target (``job:1003``)
    :param action: the notice action (``notify``, ``notify_manager``, ``advise``)
    :param buttons: the answers a chat tool with buttons offers (keep / release / wrong); the
        other channels carry them as links in ``markdown``, ``plain`` and ``html``
    """

    subject: str
    text: str
    html: str
    markdown: str = ""
    plain: str = ""
    decision_id: str = ""
    target: str = ""
    action: str = ""
    #: the answers offered as buttons (Slack): each carries its signed token (:mod:`gpu_cost.decide.answers`)
    buttons: tuple[Any, ...] = ()

    @property
    def severity(self) -> str:
        return SEVERITY.get(self.action, "medium")


def rule_title(rule: str) -> str:
    spec = registry.rule(rule)
    return spec.title if spec is not None else SOURCE_TITLES.get(rule, rule)


def action_title(action: str) -> str:
    spec = registry.action(action)
    return spec.title if spec is not None else action


# -- templates -------------------------------------------------------------------------------------
def template_dir() -> str:
    return str(paths.include_dir() / "templates" / "notify")


def slack_escape(value: Any) -> str:
    """Escape the three characters Slack's mrkdwn treats as control characters."""
    text = "" if value is None else str(value)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_MD_PUNCT = re.compile(r"([\\`*_{}\[\]()#+!|~])")


def markdown_escape(value: Any) -> str:
    """Escape a value for Markdown: punctuation backslashed, ``& < >`` as entities (no tags, no
    ``<at>`` mentions, no links can come out of a job's name)."""
    text = "" if value is None else str(value)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_PUNCT.sub(r"\\\1", text)


@functools.cache
def _envs(directory: str) -> tuple[Any, Any, Any, Any, Any]:
    import jinja2

    loader = jinja2.FileSystemLoader(directory)
    common: dict[str, Any] = {"loader": loader, "undefined": jinja2.StrictUndefined, "trim_blocks": True,
                              "lstrip_blocks": True}
    # Slack text: every {{ value }} is escaped for mrkdwn; literal template text is not.
    slack = jinja2.Environment(autoescape=False, finalize=slack_escape, keep_trailing_newline=False,  # noqa: S701 - finalize escapes
                               **common)
    # the same template for Markdown channels: values escaped for Markdown instead
    markdown = jinja2.Environment(autoescape=False, finalize=markdown_escape, keep_trailing_newline=False,  # noqa: S701
                                  **common)
    plain = jinja2.Environment(autoescape=False, finalize=_plain, keep_trailing_newline=False, **common)  # noqa: S701
    html = jinja2.Environment(autoescape=True, **common)
    # e-mail subject: a plain-text header (whitespace folded by the caller), never HTML
    text = jinja2.Environment(autoescape=False, **common)  # noqa: S701
    return slack, markdown, plain, html, text


def _plain(value: Any) -> str:
    return "" if value is None else str(value)


def next_step(d: Decision, policy: Policy, now: float) -> dict[str, Any] | None:
    """Return the next rung of the decision's ladder and when it falls due, or None."""
    if d.rule == "manual" or not hasattr(policy.rules, d.rule):
        return None
    ladder = list(policy.rule(d.rule).ladder)
    level = next((p.level for p in policy.protections if p.name == d.protection), None)
    if d.action == "advise" or d.evidence.get("inference"):
        return None  # advice (and inference services) is a one-rung ladder: nothing follows
    if level == "notify_only" or d.target_kind == "gpu" or reservation_standing(d.target_kind, d.evidence) == FOREIGN:
        ladder = [r for r in ladder if r.action in NOTICE_ACTIONS]  # as the engine's ladder
    if d.evidence.get("unsure"):
        ladder = [r for r in ladder if r.action in NOTICE_ACTIONS]  # a job the agent cannot classify: notices only
    nxt = d.rung + 1
    if level == "never" or nxt >= len(ladder):
        return None
    rung = ladder[nxt]
    due = now + rung.after
    return {"action": rung.action, "what": action_title(rung.action), "after": rung.after,
            "in": format_duration(rung.after) if rung.after else "at the next sweep",
            "at": local_time(due, policy.notifications.timezone)}


def context_for(d: Decision, policy: Policy, now: float, *, run_id: str | None = None, dry_run: bool = False,
                extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return every value the templates use (documented in ``include/templates/notify/README.md``)."""
    ev = dict(d.evidence)
    window = ev.get("window_s")
    mem = ev.get("process_mem_mib", ev.get("mem_min_mib"))
    rcpts = recipients(d, policy)
    owner = rcpts[0]
    manager = rcpts[1] if len(rcpts) > 1 else None
    snooze = policy.notifications.snooze_hint.replace("{target}", d.target)
    return {
        "action": d.action,
        "action_title": action_title(d.action),
        "rule": d.rule,
        "rule_title": rule_title(d.rule),
        "target": d.target,
        "target_kind": d.target_kind,
        "job_id": d.job_id,
        "job_name": ev.get("job_name"),
        "user": d.user,
        "owner": owner,
        "manager": manager,
        "account": d.account,
        "partition": d.partition,
        "host": d.host,
        "gpus": d.gpus,
        "gpu_ids": list(ev.get("gpu_ids") or []),
        "util_mean": ev.get("util_mean"),
        "util_max": ev.get("util_max"),
        "mem_mib": mem,
        "window": format_duration(float(window)) if window else None,
        "runtime": format_duration(float(ev["runtime_s"])) if ev.get("runtime_s") else None,
        "pid": ev.get("pid"),
        "process_name": ev.get("process_name"),
        "inference": ev.get("inference"),
        "unsure": ev.get("unsure"),
        "replica_set": ev.get("replica_set"),
        "signals": [x for x in ev.get("signals") or [] if isinstance(x, Mapping)],
        "confidence": ev.get("confidence"),
        "chart": ev.get("chart") or None,
        "chart_span": format_duration(float(ev["chart_span_s"])) if ev.get("chart_span_s") else None,
        "reason": d.reason,
        "protection": d.protection,
        "gpu_hours_at_risk": d.gpu_hours_at_risk,
        "gpu_hours_saved": d.gpu_hours_saved,
        "next": next_step(d, policy, now),
        "snooze_hint": snooze,
        "decision_id": d.decision_id,
        "run_id": run_id,
        "mode": d.mode,
        "dry_run": dry_run,
        "found_at": local_time(d.ts, policy.notifications.timezone),
        "link_ttl": format_duration(policy.answers.link_ttl),
        "answer_links": [],
        **dict(extra or {}),
    }


def render(d: Decision, policy: Policy, now: float, *, answer_key: bytes | None = None, **kwargs: Any) -> Message:
    """Render the chat text (mrkdwn and Markdown), e-mail subject and e-mail HTML for a decision.

    :param answer_key: the link key of :mod:`gpu_cost.decide.answers`: with it, the notice offers its
        answers (Slack buttons; links bound to the owner elsewhere, when ``answers.base_url`` is set).
    """
    from gpu_cost.decide import answers

    ctx = context_for(d, policy, now, **kwargs)
    buttons: tuple[Any, ...] = ()
    links: list[dict[str, str]] = []
    if answer_key and d.user and d.rule != "manual" and not ctx.get("dry_run"):
        buttons = tuple(answers.offers(d.decision_id, d.ts, policy, answer_key))
        links = [{"label": o.label, "url": o.url} for o in answers.offers(d.decision_id, d.ts, policy, answer_key,
                                                                          recipient=d.user) if o.url]
    ctx["answer_links"] = links
    slack_env, md_env, plain_env, html_env, text_env = _envs(template_dir())
    subject = " ".join(text_env.get_template("subject.txt.j2").render(**ctx).split())  # one header line
    text = slack_env.get_template("message.slack.j2").render(**ctx).strip()
    markdown = md_env.get_template("message.slack.j2").render(**ctx).strip()
    plain = plain_env.get_template("message.slack.j2").render(**ctx).strip()
    if links:
        markdown += "\n\n" + " · ".join(f"[{markdown_escape(x['label'])}]({x['url']})" for x in links)
        plain += "\n\n" + "\n".join(f"{x['label']}: {x['url']}" for x in links)
    body = html_env.get_template("message.html.j2").render(**ctx)
    return Message(subject=subject, text=text, html=body, markdown=markdown, plain=plain, decision_id=d.decision_id,
                   target=d.target, action=d.action, buttons=buttons)


def local_time(ts: float, tz: str) -> str:
    """Return ``ts`` as ``YYYY-MM-DD HH:MM TZ`` in ``tz`` (ISO UTC when the zone is unknown)."""
    try:
        from zoneinfo import ZoneInfo

        when = dt.datetime.fromtimestamp(ts, tz=ZoneInfo(tz))
        return when.strftime("%Y-%m-%d %H:%M %Z")
    except Exception:
        return iso(ts)


__all__ = ["NOTICE_ACTIONS", "Message", "action_title", "context_for", "markdown_escape", "next_step", "render",
           "rule_title", "slack_escape"]
