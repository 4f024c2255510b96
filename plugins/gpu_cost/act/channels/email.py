"""E-mail, through the Airflow SMTP provider on ``gpu_cost_smtp``: the subject and HTML body."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpu_cost.act.channels.base import Channel, Delivery
from gpu_cost.act.notices.recipients import Recipient
from gpu_cost.act.notices.render import Message
from gpu_cost.core.redact import connection_secrets, scrub

SMTP_CONN_ID = "gpu_cost_smtp"


class EmailChannel(Channel):
    """One e-mail to every recipient with an address (``people.<user>.email``)."""

    name = "email"
    default_conn_id = SMTP_CONN_ID

    def post(self, message: Message, recipients: Sequence[Recipient], conn: Any, *,
             stand_in: bool = False) -> list[Delivery]:
        known = [r for r in recipients if r.email]
        out = []
        if known:
            dl = send_email(self.conn_id, message, [r.email for r in known if r.email],
                            secrets=connection_secrets(conn))
            dl.to = [r.user for r in known]
            out.append(dl)
        unknown = [r.user for r in recipients if not r.email]
        if unknown:
            out.append(Delivery(self.name, False, unknown, error="no e-mail address known"))
        return out


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
        dl.error = scrub(f"{type(exc).__name__}: {exc}", secrets)[:300]
    return dl


__all__ = ["SMTP_CONN_ID", "EmailChannel", "send_email"]
