"""The per-user notice limit (``notifications.max_per_user_per_hour``), counted in the audit store.

The count is the audit store's ``gpu_cost_actions`` rows, so the limit holds however many
workers send at once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpu_cost.act.notices.render import NOTICE_ACTIONS
from gpu_cost.core.model import Decision

if TYPE_CHECKING:
    from gpu_cost.audit.store import AuditStore

# Notices to one user that were sent (or are being sent) by any worker; the notice actions are
# bound parameters (:n0, :n1, ...), one per registered notice.
_SENT_TO_USER = """
SELECT a.action_id, a.status, a.started_at FROM gpu_cost_actions a
JOIN gpu_cost_decisions d ON d.decision_id = a.decision_id
WHERE d.user_name = :user AND a.action IN ({notices}) AND a.dry_run = 0
  AND a.status IN ('started', 'succeeded') AND a.started_at >= :since
"""


def rate_limited(store: AuditStore, d: Decision, limit: int, *, window_s: float = 3600.0) -> str | None:
    """Return why ``d.user`` may not get another notice this hour, or None.

    Counts the notices already sent to the user in the last hour, plus those other workers
    started before this one (ordered by start time, then action id, so of several concurrent
    notices exactly the first ``limit`` go out).
    """
    from gpu_cost.act.dispatch import action_id

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


__all__ = ["rate_limited"]
