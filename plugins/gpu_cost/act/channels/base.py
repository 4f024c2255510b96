"""What every channel shares: the :class:`Channel` base, the :class:`Delivery` it reports, and the
bounded retry loop (HTTP 429 after its ``Retry-After``, 5xx and network errors with exponential
backoff, every attempt recorded).

A channel formats a :class:`~gpu_cost.act.notices.render.Message` itself and sends it through its
provider's hook on its connection; credentials come from the connection only, and every error text
it reports passes through :func:`gpu_cost.core.redact.scrub` with that connection's secrets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpu_cost.act.notices.recipients import Recipient
from gpu_cost.act.notices.render import Message
from gpu_cost.core.connections import airflow_connection
from gpu_cost.core.redact import connection_secrets, scrub

logger = logging.getLogger(__name__)

#: retries: attempts in all, the longest Retry-After honoured, the first 5xx backoff
MAX_ATTEMPTS = 4
MAX_RETRY_AFTER_S = 60.0
BACKOFF_S = 1.0

#: one attempt's answer: HTTP status (0: no answer), headers, the answer's text
Answer = tuple[int, dict[str, Any], str]


@dataclass
class Delivery:
    """What happened on one channel."""

    channel: str
    ok: bool
    to: list[str] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def describe(self) -> str:
        """Return one line for the outcome: ``slack-webhook → carol: delivered after 1 attempt(s) [200]``."""
        tries = len(self.attempts)
        codes = ", ".join(str(a["status"]) for a in self.attempts)
        state = "delivered" if self.ok else f"failed ({self.error})"
        return f"{self.channel} → {', '.join(self.to) or '-'}: {state} after {tries} attempt(s) [{codes}]"


class Channel:
    """Send a :class:`Message` to some :class:`Recipient` s through one service.

    Subclasses set :attr:`name` and :attr:`default_conn_id` and implement :meth:`post`.

    :param conn_id: the Airflow connection (default :attr:`default_conn_id`)
    :param sleep: how to wait between attempts (tests pass a recorder)
    """

    name: ClassVar[str] = ""
    default_conn_id: ClassVar[str] = ""

    def __init__(self, *, conn_id: str | None = None, sleep: Callable[[float], None] | None = None) -> None:
        self.conn_id = conn_id or self.default_conn_id
        self.sleep = sleep or time.sleep

    def connection(self) -> Any:
        """Return the channel's connection, or None when it is not configured."""
        return airflow_connection(self.conn_id)

    def send(self, message: Message, recipients: Sequence[Recipient], *, stand_in: bool = False) -> list[Delivery]:
        """Send ``message`` to ``recipients``; a missing connection is a failed delivery naming it.

        ``stand_in``: nothing later can reach the people this channel cannot address by name,
        so a group post may stand in for them (Slack's webhook channel does).
        """
        conn = self.connection()
        if conn is None:
            return [Delivery(self.name, False, [r.user for r in recipients],
                             error=f"connection {self.conn_id} is not configured")]
        return self.post(message, recipients, conn, stand_in=stand_in)

    def post(self, message: Message, recipients: Sequence[Recipient], conn: Any, *,
             stand_in: bool = False) -> list[Delivery]:
        raise NotImplementedError

    def scrub(self, text: str, conn: Any) -> str:
        """Return ``text`` with this connection's secrets (and any other credential) blanked."""
        return scrub(text, connection_secrets(conn) if conn is not None else [])


def with_retries(dl: Delivery, attempt: Callable[[], Answer], what: str, sleep: Callable[[float], None],
                 secrets: Sequence[str]) -> Delivery:
    """Call ``attempt`` (→ HTTP status, headers, answer) until a 2xx or a final answer, at most
    :data:`MAX_ATTEMPTS` times, waiting as :func:`retry_wait` says; every attempt is recorded in ``dl``."""
    for n in range(1, MAX_ATTEMPTS + 1):
        status, headers, answer = attempt()
        wait = retry_wait(status, headers, n)
        dl.attempts.append({"attempt": n, "status": status, "retry_in_s": wait})
        if 200 <= status < 300:
            dl.ok = True
            return dl
        dl.error = f"HTTP {status or 'error'}: {scrub(answer, secrets)[:200]}"
        if wait is None or n == MAX_ATTEMPTS:
            return dl
        logger.warning("%s answered %s; retrying in %.1fs (attempt %d/%d)", what, status or "error", wait, n,
                       MAX_ATTEMPTS)
        sleep(wait)
    return dl


def retry_wait(status: int, headers: Mapping[str, Any], attempt: int) -> float | None:
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


__all__ = ["BACKOFF_S", "MAX_ATTEMPTS", "MAX_RETRY_AFTER_S", "Channel", "Delivery", "retry_wait", "with_retries"]
