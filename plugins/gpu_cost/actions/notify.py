"""Notifications: tell the owner (and their manager) what was found and what happens next.

Executors for the ``advise``, ``notify`` and ``notify_manager`` actions. Slack goes through the
Airflow Slack provider on the connection ``gpu_cost_slack``: conn type ``slackwebhook`` (an
incoming webhook, :class:`SlackWebhookHook`, one post to the webhook's channel mentioning the
recipients) or ``slack`` (a bot token, :class:`SlackHook`, a direct message to each recipient's
Slack id). E-mail goes through the SMTP provider on ``gpu_cost_smtp``, as the fallback when Slack
fails or a recipient has no Slack handle (``notifications.email_fallback``).

Who is who comes from the policy's ``people`` (user → ``slack`` / ``email`` / ``manager``).
Message bodies are Jinja2 templates in ``include/templates/notify/``. Each user gets at most
``notifications.max_per_user_per_hour`` messages, counted from the audit store's
``gpu_cost_actions`` rows, so the limit holds however many workers send. Slack's 429 is retried
after its ``Retry-After``, 5xx with exponential backoff, both bounded; every attempt is reported
in the outcome. Dry-run sends nothing and returns the rendered message. Connection secrets (the
webhook URL, tokens, SMTP passwords) never reach a log line, an outcome or an audit row, and
Slack texts pass through :func:`gpu_cost.redact.redact`.

Policy example::

    people:
      alice: {slack: U012ABCDEF, email: alice@example.org, manager: carol}
      carol: {slack: U034GHIJKL, email: carol@example.org}
    notifications:
      max_per_user_per_hour: 4
      email_fallback: true
      snooze_hint: "gpu-cost snooze --target {target} --for 4h --reason '...'"
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_cost import paths, registry
from gpu_cost.actions.base import ActionContext, Outcome, register
from gpu_cost.connections import airflow_connection
from gpu_cost.errors import ActionError
from gpu_cost.model import Decision
from gpu_cost.policy.schema import Person, Policy
from gpu_cost.redact import redact
from gpu_cost.registry import ActionSpec
from gpu_cost.timeutil import format_duration, iso

if TYPE_CHECKING:
    from airflow.sdk import BaseNotifier

    from gpu_cost.audit.store import AuditStore

logger = logging.getLogger(__name__)

SLACK_CONN_ID = "gpu_cost_slack"
SMTP_CONN_ID = "gpu_cost_smtp"
#: the notices (derived from the registry: every action declared ``notice=True``)
NOTICE_ACTIONS = registry.names(notice=True)

#: Slack retries: attempts in all, the longest Retry-After honoured, the first 5xx backoff
MAX_ATTEMPTS = 4
MAX_RETRY_AFTER_S = 60.0
BACKOFF_S = 1.0

#: decision sources that are not rules, and what a message calls them (the rules' titles are registered)
SOURCE_TITLES = {
    "offhours": "an idle node during off-hours",
    "manual": "an operator's manual reclaim request",
}


def rule_title(rule: str) -> str:
    spec = registry.rule(rule)
    return spec.title if spec is not None else SOURCE_TITLES.get(rule, rule)


def action_title(action: str) -> str:
    spec = registry.action(action)
    return spec.title if spec is not None else action


_ANY = ("job", "user", "process", "node")
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
    doc="Tell the owner (Slack, e-mail as the fallback) what was found and what comes next; rate-limited "
        "per user (``notifications.max_per_user_per_hour``).",
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

# Rate-limit query: notices to one user that were sent (or are being sent) by any worker; the
# notice actions are bound parameters (:n0, :n1, ...), one per registered notice.
_SENT_TO_USER = """
SELECT a.action_id, a.status, a.started_at FROM gpu_cost_actions a
JOIN gpu_cost_decisions d ON d.decision_id = a.decision_id
WHERE d.user_name = :user AND a.action IN ({notices}) AND a.dry_run = 0
  AND a.status IN ('started', 'succeeded') AND a.started_at >= :since
"""


@dataclass(frozen=True)
class Recipient:
    """One person to reach: a policy user name with their Slack id and e-mail (either may be absent)."""

    user: str
    role: str  # owner | manager
    slack: str | None = None
    email: str | None = None


@dataclass(frozen=True)
class Message:
    """A rendered notification: Slack mrkdwn text, e-mail subject and HTML body."""

    subject: str
    text: str
    html: str


@dataclass
class Delivery:
    """What happened on one channel."""

    channel: str
    ok: bool
    to: list[str] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


# -- templates -------------------------------------------------------------------------------------
def template_dir() -> str:
    return str(paths.include_dir() / "templates" / "notify")


def slack_escape(value: Any) -> str:
    """Escape the three characters Slack's mrkdwn treats as control characters."""
    text = "" if value is None else str(value)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@functools.cache
def _envs(directory: str) -> tuple[Any, Any, Any]:
    import jinja2

    loader = jinja2.FileSystemLoader(directory)
    # Slack text: every {{ value }} is escaped for mrkdwn; literal template text is not.
    slack = jinja2.Environment(loader=loader, autoescape=False, undefined=jinja2.StrictUndefined,  # noqa: S701 - finalize escapes
                               finalize=slack_escape, keep_trailing_newline=False, trim_blocks=True,
                               lstrip_blocks=True)
    html = jinja2.Environment(loader=loader, autoescape=True, undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True)
    # e-mail subject: a plain-text header (whitespace folded by the caller), never HTML
    text = jinja2.Environment(loader=loader, autoescape=False, undefined=jinja2.StrictUndefined,  # noqa: S701
                              trim_blocks=True, lstrip_blocks=True)
    return slack, html, text


def recipients(d: Decision, policy: Policy) -> list[Recipient]:
    """Return the owner, plus the manager for ``notify_manager``, from ``policy.people``."""
    user = d.user or ""
    person = policy.people.get(user, Person()) if user else Person()
    out = [Recipient(user or "(unknown owner)", "owner", person.slack, person.email)]
    if d.action == "notify_manager" and person.manager:
        boss = policy.people.get(person.manager, Person())
        out.append(Recipient(person.manager, "manager", boss.slack, boss.email))
    return out


def next_step(d: Decision, policy: Policy, now: float) -> dict[str, Any] | None:
    """Return the next rung of the decision's ladder and when it falls due, or None."""
    if d.rule == "manual" or not hasattr(policy.rules, d.rule):
        return None
    ladder = list(policy.rule(d.rule).ladder)
    level = next((p.level for p in policy.protections if p.name == d.protection), None)
    if d.action == "advise" or d.evidence.get("inference"):
        return None  # advice (and inference services) is a one-rung ladder: nothing follows
    if level == "notify_only" or d.target_kind == "gpu":
        ladder = [r for r in ladder if r.action in NOTICE_ACTIONS]
    nxt = d.rung + 1
    if level == "never" or nxt >= len(ladder):
        return None
    rung = ladder[nxt]
    due = now + rung.after
    return {"action": rung.action, "what": action_title(rung.action), "after": rung.after,
            "in": format_duration(rung.after) if rung.after else "at the next sweep",
            "at": _local(due, policy.notifications.timezone)}


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
        "found_at": _local(d.ts, policy.notifications.timezone),
        **dict(extra or {}),
    }


def render(d: Decision, policy: Policy, now: float, **kwargs: Any) -> Message:
    """Render the Slack text, e-mail subject and e-mail HTML for a decision."""
    ctx = context_for(d, policy, now, **kwargs)
    slack_env, html_env, text_env = _envs(template_dir())
    subject = " ".join(text_env.get_template("subject.txt.j2").render(**ctx).split())  # one header line
    text = slack_env.get_template("message.slack.j2").render(**ctx).strip()
    body = html_env.get_template("message.html.j2").render(**ctx)
    return Message(subject=subject, text=text, html=body)


# -- the executor ----------------------------------------------------------------------------------
@register(ADVISE, NOTIFY, NOTIFY_MANAGER)
def notify(d: Decision, ctx: ActionContext) -> Outcome:
    """Send the notice for a decision: Slack first, e-mail as the fallback; rate-limited per user."""
    policy = ctx.policy
    msg = render(d, policy, ctx.now, run_id=ctx.run_id, dry_run=ctx.dry_run)
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
    deliveries = deliver(msg, rcpts, policy, sleep=sleep, slack_conn_id=ctx.extra.get("slack_conn_id", SLACK_CONN_ID),
                         smtp_conn_id=ctx.extra.get("smtp_conn_id", SMTP_CONN_ID))
    reached = {u for dl in deliveries if dl.ok for u in dl.to}
    missed = [r.user for r in rcpts if r.user not in reached]
    report = "\n".join(_describe(dl) for dl in deliveries) or "no channel configured"
    details = {"deliveries": [dl.__dict__ for dl in deliveries], "missed": missed}
    owner = rcpts[0].user
    if owner not in reached:
        errors = "; ".join(dl.error for dl in deliveries if dl.error) or "no Slack handle or e-mail known"
        return Outcome("failed", output=report, error=f"{owner} was not reached: {errors}",
                       command=f"notify {who}", details=details)
    output = report + (f"\nnot reached: {', '.join(missed)}" if missed else "") + f"\n\n{msg.text}"
    return Outcome("succeeded", output=output, command=f"notify {who}", details=details)


def _store(ctx: ActionContext) -> AuditStore:
    store = ctx.extra.get("store")
    if store is None:
        from gpu_cost.audit.store import AuditStore

        store = AuditStore().ensure_schema()
    return store  # type: ignore[no-any-return]


def rate_limited(store: AuditStore, d: Decision, limit: int, *, window_s: float = 3600.0) -> str | None:
    """Return why ``d.user`` may not get another notice this hour, or None.

    Counts the notices already sent to the user in the last hour, plus those other workers
    started before this one (ordered by start time, then action id, so of several concurrent
    notices exactly the first ``limit`` go out).
    """
    from gpu_cost.actions.dispatch import action_id

    me = action_id(d)
    mine = store.get_action(me)
    ref = float(mine["started_at"]) if mine else time.time()
    notices = {f"n{i}": a for i, a in enumerate(NOTICE_ACTIONS)}
    sql = _SENT_TO_USER.format(notices=", ".join(f":{k}" for k in notices))
    rows = store.query(sql, {"user": d.user, "since": ref - window_s, **notices})
    ahead = 0
    for r in rows:
        if r["action_id"] == me:
            continue
        if r["status"] == "succeeded" or (float(r["started_at"]), r["action_id"]) < (ref, me):
            ahead += 1
    if ahead >= limit:
        return (f"rate limit: {d.user} already got {ahead} notices in the last hour "
                f"(notifications.max_per_user_per_hour={limit}); not sent")
    return None


def deliver(msg: Message, rcpts: Sequence[Recipient], policy: Policy, *, sleep: Callable[[float], None],
            slack_conn_id: str = SLACK_CONN_ID, smtp_conn_id: str = SMTP_CONN_ID) -> list[Delivery]:
    """Send ``msg`` to ``rcpts``: Slack where possible, then e-mail to whoever Slack did not reach."""
    out: list[Delivery] = []
    slack_conn = airflow_connection(slack_conn_id)
    use_mail = policy.notifications.email_fallback or slack_conn is None
    mail_can_help = use_mail and any(r.email for r in rcpts)
    reached: set[str] = set()
    if slack_conn is not None:
        if slack_conn.conn_type == "slackwebhook":
            mentioned = [r for r in rcpts if r.slack]
            # a webhook posts to one channel: it reaches the people it mentions, or, when nobody
            # has a handle and e-mail cannot help, the channel itself stands in for the owner
            if mentioned or not mail_can_help:
                dl = send_webhook(slack_conn_id, _with_mentions(msg.text, mentioned), sleep=sleep,
                                  secrets=_secrets(slack_conn))
                dl.to = [r.user for r in mentioned] or [rcpts[0].user]
                out.append(dl)
        else:
            targets = [(r, r.slack) for r in rcpts if r.slack]
            if not targets and policy.notifications.slack_channel and not mail_can_help:
                targets = [(rcpts[0], policy.notifications.slack_channel)]
            for r, channel in targets:
                dl = send_api(slack_conn_id, channel, msg.text, sleep=sleep, secrets=_secrets(slack_conn))
                dl.to = [r.user]
                out.append(dl)
        reached = {u for dl in out if dl.ok for u in dl.to}
    rest = [r for r in rcpts if r.user not in reached and r.email]
    if rest and use_mail:
        smtp_conn = airflow_connection(smtp_conn_id)
        if smtp_conn is None:
            out.append(Delivery("email", False, [r.user for r in rest], error=f"connection {smtp_conn_id} is not configured"))
        else:
            dl = send_email(smtp_conn_id, msg, [r.email for r in rest if r.email], secrets=_secrets(smtp_conn))
            dl.to = [r.user for r in rest]
            out.append(dl)
    if slack_conn is None and not rest:
        out.append(Delivery("slack", False, [], error=f"connection {slack_conn_id} is not configured and no e-mail is known"))
    return out


def _with_mentions(text: str, people: Iterable[Recipient]) -> str:
    tags = " ".join(f"<@{slack_escape(r.slack)}>" for r in people)
    return f"{tags} {text}" if tags else text


# -- Slack -----------------------------------------------------------------------------------------
def send_webhook(conn_id: str, text: str, *, sleep: Callable[[float], None], secrets: Sequence[str] = ()) -> Delivery:
    """Post ``text`` through the incoming webhook of ``conn_id``; retry 429 and 5xx (bounded)."""
    from airflow.providers.slack.hooks.slack_webhook import SlackWebhookHook

    dl = Delivery("slack-webhook", False)
    text = redact(text)  # a notice or alert quoting an error must not carry its credentials out
    try:
        # our own retry loop reports every attempt; the SDK's own handlers would hide them
        client = SlackWebhookHook(slack_webhook_conn_id=conn_id, retry_handlers=[]).client
    except Exception as exc:
        dl.error = _scrub(f"{type(exc).__name__}: {exc}", secrets)
        return dl
    body = {"text": text, "unfurl_links": False}

    def attempt() -> tuple[int, dict[str, Any], str]:
        try:
            resp = client.send_dict(body)
            return int(resp.status_code), dict(resp.headers or {}), str(resp.body or "")
        except Exception as exc:
            return 0, {}, _scrub(f"{type(exc).__name__}: {exc}", secrets)

    return _with_retries(dl, attempt, "Slack webhook", sleep, secrets)


def send_api(conn_id: str, channel: str, text: str, *, sleep: Callable[[float], None],
             secrets: Sequence[str] = ()) -> Delivery:
    """Post ``text`` to ``channel`` (a user id opens a DM) with the bot token of ``conn_id``."""
    from airflow.providers.slack.hooks.slack import SlackHook
    from slack_sdk.errors import SlackApiError

    dl = Delivery("slack-api", False)
    text = redact(text)  # a notice or alert quoting an error must not carry its credentials out
    try:
        client = SlackHook(slack_conn_id=conn_id, retry_handlers=[]).client
    except Exception as exc:
        dl.error = _scrub(f"{type(exc).__name__}: {exc}", secrets)
        return dl

    def attempt() -> tuple[int, dict[str, Any], str]:
        try:
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

    return _with_retries(dl, attempt, "Slack API", sleep, secrets)


def _with_retries(dl: Delivery, attempt: Callable[[], tuple[int, dict[str, Any], str]], what: str,
                  sleep: Callable[[float], None], secrets: Sequence[str]) -> Delivery:
    """Call ``attempt`` (→ HTTP status, headers, answer) until a 2xx or a final answer, at most
    :data:`MAX_ATTEMPTS` times, waiting as :func:`_retry_wait` says; every attempt is recorded in ``dl``."""
    for n in range(1, MAX_ATTEMPTS + 1):
        status, headers, answer = attempt()
        wait = _retry_wait(status, headers, n)
        dl.attempts.append({"attempt": n, "status": status, "retry_in_s": wait})
        if 200 <= status < 300:
            dl.ok = True
            return dl
        dl.error = f"HTTP {status or 'error'}: {_scrub(answer, secrets)[:200]}"
        if wait is None or n == MAX_ATTEMPTS:
            return dl
        logger.warning("%s answered %s; retrying in %.1fs (attempt %d/%d)", what, status or "error", wait, n,
                       MAX_ATTEMPTS)
        sleep(wait)
    return dl


def _retry_wait(status: int, headers: Mapping[str, Any], attempt: int) -> float | None:
    """Return seconds to wait before the next attempt, or None when the answer is final."""
    if 200 <= status < 300:
        return None
    if status == 429:
        raw = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
        if isinstance(raw, list):
            raw = raw[0] if raw else None
        try:
            wait = float(raw) if raw is not None else BACKOFF_S * 2 ** (attempt - 1)
        except ValueError:
            wait = BACKOFF_S * 2 ** (attempt - 1)
        return max(0.0, wait) if wait <= MAX_RETRY_AFTER_S else None
    if status == 0 or 500 <= status < 600:
        return BACKOFF_S * 2 ** (attempt - 1)
    return None


def _status_of(exc: Exception) -> int:
    import json

    if isinstance(exc, json.JSONDecodeError):
        return 502  # an HTML error page instead of Slack's JSON: a server-side failure
    return 0


# -- e-mail ----------------------------------------------------------------------------------------
def send_email(conn_id: str, msg: Message, to: Sequence[str], *, secrets: Sequence[str] = ()) -> Delivery:
    """Send ``msg`` by e-mail through the SMTP provider's hook on ``conn_id``."""
    from airflow.providers.smtp.hooks.smtp import SmtpHook

    dl = Delivery("email", False)
    try:
        with SmtpHook(smtp_conn_id=conn_id) as hook:
            hook.send_email_smtp(to=list(to), subject=msg.subject, html_content=msg.html,
                                 from_email=hook.from_email or "gpu-cost@localhost")
        dl.ok = True
        dl.attempts.append({"attempt": 1, "status": 250})
    except Exception as exc:
        dl.attempts.append({"attempt": 1, "status": int(getattr(exc, "smtp_code", 0) or 0)})
        dl.error = _scrub(f"{type(exc).__name__}: {exc}", secrets)[:300]
    return dl


# -- connections and secrets -----------------------------------------------------------------------
def _secrets(conn: Any) -> list[str]:
    out = []
    for value in (getattr(conn, "password", None), getattr(conn, "host", None) if "://" in str(getattr(conn, "host", "")) else None):
        if value and len(str(value)) >= 4:
            out.append(str(value))
    password = str(getattr(conn, "password", "") or "")
    if "://" in password:
        from urllib.parse import urlsplit

        path = urlsplit(password).path
        out += [p for p in (path, path.rsplit("/", 1)[-1]) if len(p) >= 6]
    extra = getattr(conn, "extra_dejson", {}) or {}
    for k, v in extra.items():
        if isinstance(v, str) and len(v) >= 4 and re.search(r"token|secret|password|key", k, re.I):
            out.append(v)
    return out


def _scrub(text: str, secrets: Sequence[str]) -> str:
    for s in sorted(secrets, key=len, reverse=True):
        text = text.replace(s, "***")
    # anything that still looks like a credential: URL passwords, webhook paths, tokens
    return redact(text)


def _describe(dl: Delivery) -> str:
    tries = len(dl.attempts)
    codes = ", ".join(str(a["status"]) for a in dl.attempts)
    state = "delivered" if dl.ok else f"failed ({dl.error})"
    return f"{dl.channel} → {', '.join(dl.to) or '-'}: {state} after {tries} attempt(s) [{codes}]"


def _local(ts: float, tz: str) -> str:
    try:
        from zoneinfo import ZoneInfo

        when = dt.datetime.fromtimestamp(ts, tz=ZoneInfo(tz))
        return when.strftime("%Y-%m-%d %H:%M %Z")
    except Exception:
        return iso(ts)


# -- approvals ---------------------------------------------------------------------------------------
def approval_notifier(conn_id: str = SLACK_CONN_ID, channel: str | None = None) -> BaseNotifier | None:
    """Return a notifier for HITL approval requests that posts the link to the approval page.

    Safe to call at parse time: it reads no connection. At notify time it picks the provider's
    :class:`SlackWebhookNotifier` or :class:`SlackNotifier` by the connection's type; when
    ``conn_id`` is not configured, or Slack fails, it logs and returns, so a missing or broken
    Slack never fails the approval task (a raising notifier would). Set
    ``GPU_COST_APPROVAL_NOTIFY=0`` to get None (no notifier at all). ``channel`` is used with a
    bot token only (default ``#gpu-cost``); a webhook posts to its own channel.
    """
    import os

    if os.environ.get("GPU_COST_APPROVAL_NOTIFY", "1") == "0":
        return None
    from airflow.sdk import BaseNotifier

    class ApprovalSlackNotifier(BaseNotifier):
        """Post "approval needed" with a link to the Required Actions page; never raises."""

        template_fields = ("text",)

        def __init__(self, *, slack_conn_id: str, text: str, channel: str | None = None) -> None:
            super().__init__()
            self.slack_conn_id = slack_conn_id
            self.text = text
            self.channel = channel

        def notify(self, context: Any) -> None:
            try:
                self._notify(context)
            except Exception as exc:
                conn = airflow_connection(self.slack_conn_id)
                logger.warning("approval notice not sent: %s", _scrub(f"{type(exc).__name__}: {exc}",
                                                                      _secrets(conn) if conn else []))

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

                SlackNotifier(slack_conn_id=self.slack_conn_id, text=text,
                              channel=self.channel or "#gpu-cost").notify(context)

    text = ("Approval needed: {{ task.subject }} (DAG {{ dag.dag_id }}, run {{ run_id }})")
    return ApprovalSlackNotifier(slack_conn_id=conn_id, text=text, channel=channel)


def approval_link(context: Mapping[str, Any]) -> str:
    """Return the link to the HITL task's Required Actions page (``[api] base_url`` based)."""
    from airflow.providers.standard.operators.hitl import HITLOperator

    try:
        return HITLOperator.generate_link_to_ui_from_context(context=context)  # type: ignore[arg-type]
    except Exception as exc:
        raise ActionError(f"cannot build the approval link: {exc}") from exc


__all__ = ["Message", "Recipient", "approval_notifier", "deliver", "notify", "rate_limited", "recipients", "render"]
