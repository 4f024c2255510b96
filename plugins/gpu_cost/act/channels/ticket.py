"""An escalation ticket: a JSON document POSTed through the Airflow HTTP provider's :class:`HttpHook`.

The connection ``gpu_cost_ticket`` (conn type ``http``) names the endpoint as its host, the whole
URL with its path (``https://tickets.example.org/api/gpu-cost``): the path cannot go in an extra,
because the HTTP provider sends the connection's extras as request headers (which is where a token
goes: ``{"Authorization": "Bearer ..."}``). Login and password, when set, are sent as basic auth.
The body::

    {"title": ..., "body": <Markdown>, "target": "job:1003", "decision_id": ..., "action": "notify_manager",
     "owner": "alice", "manager": "carol", "severity": "high"}

A 2xx is success; 429 and 5xx are retried (bounded), anything else is final. Jira is not used: its
provider speaks Jira's own issue API (project keys, issue types, fields per site), far more than a
JSON document a webhook or an automation rule can take.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpu_cost.act.channels.base import Answer, Channel, Delivery, with_retries
from gpu_cost.act.notices.recipients import Recipient
from gpu_cost.act.notices.render import Message
from gpu_cost.core.redact import connection_secrets, redact, scrub


class TicketChannel(Channel):
    """One ticket per escalation, naming the owner and manager among the recipients."""

    name = "ticket"
    default_conn_id = "gpu_cost_ticket"

    def ticket(self, message: Message, recipients: Sequence[Recipient]) -> dict[str, Any]:
        """Return the ticket's JSON document."""
        by_role = {r.role: r.user for r in recipients}
        return {"title": message.subject, "body": redact(message.markdown), "target": message.target,
                "decision_id": message.decision_id, "action": message.action, "owner": by_role.get("owner"),
                "manager": by_role.get("manager"), "severity": message.severity}

    def post(self, message: Message, recipients: Sequence[Recipient], conn: Any, *,
             stand_in: bool = False) -> list[Delivery]:
        from airflow.providers.http.hooks.http import HttpHook

        secrets = connection_secrets(conn)
        dl = Delivery(self.name, False, [f"ticket:{message.target}"])
        hook = HttpHook(method="POST", http_conn_id=self.conn_id)
        doc = self.ticket(message, recipients)

        def attempt() -> Answer:
            try:
                resp = hook.run(json=doc, extra_options={"check_response": False, "timeout": 30})
                return int(resp.status_code), dict(resp.headers or {}), str(resp.text or "")[:300]
            except Exception as exc:
                return 0, {}, scrub(f"{type(exc).__name__}: {exc}", secrets)

        return [with_retries(dl, attempt, "ticket endpoint", self.sleep, secrets)]


__all__ = ["TicketChannel"]
