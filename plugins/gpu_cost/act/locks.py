"""Guards in the audit store that keep two workers from doing the same thing twice.

**Run guard** (:func:`run_conflict`): sweeps overlap when one waits for a human's answer (the DAG
lets the next runs start), when a run is slower than the schedule, on a manual ``airflow dags
test``, a second deployment or a run cleared while another is acting. Every sweep run has a
``gpu_cost_runs`` row with status ``running`` from ``collect`` until ``finish``, except while it
waits for an approval (``awaiting_approval``: it then acts only on its own approved decisions,
which no other run asks about again, so it neither blocks nor is blocked). Before acting, a run looks for other ``running``
rows of the same DAG started within ``max_age_s`` (older ones are runs whose worker died): it
refuses to act when one of them started first (ordered by ``(started_at, run_id)``, the same
order for every reader, so of two overlapping runs exactly one acts) or has already started an
action.

**Effect guard** (:func:`start_effect`): a decision id is per rule, so the sweep's
``idle_allocation`` decision and an operator's ``manual`` decision on the same job are different
ids, and per-decision idempotency cannot stop both. A destructive action's ``started`` row is
written together with a look at the other rows of its target, in one transaction serialised per
target (SQLite: the database's single write lock, taken by the insert; PostgreSQL: a transaction
advisory lock on the target). When another non-dry-run row with the same *effect* on the same
target is ``started`` (in flight) or ``succeeded`` within ``window_s``, this one must not act: it
ends ``skipped``, naming the action that owns the effect. Of two workers racing, exactly one
writes its row first and acts; the other sees it. The effect of ``terminate``, ``kill`` and
``cancel`` on a job is one ("end the job"); other actions are their own effect (an operator's
``demote`` does not stop the sweep's later ``cancel``). Rows of decisions of the *same rule* never
block each other: that is the escalation ladder (``terminate`` then ``kill``), and a rule's own
repeats are stopped by its decision ids. A row left ``started`` by a worker that
died blocks the same effect for ``window_s`` at most: the safe side.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_cost.core.model import KILL_ACTIONS, Decision

if TYPE_CHECKING:
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.config.schema import Policy

logger = logging.getLogger(__name__)

#: how long a ``running`` run row blocks others (older: its worker died; the run is not waited for)
RUN_MAX_AGE_S = 3600.0
#: how long an action on a target blocks the same effect on it from another decision
EFFECT_WINDOW_S = 3600.0

_RUNNING = """
SELECT r.run_id, r.started_at,
       (SELECT COUNT(*) FROM gpu_cost_actions a WHERE a.run_id = r.run_id AND a.dry_run = 0) AS actions
FROM gpu_cost_runs r
WHERE r.dag_id = :dag_id AND r.status = 'running' AND r.run_id <> :run_id AND r.started_at >= :since
"""

#: (the decisions' rule and GPUs never change: read from their log, not through the view of their status, which a
#: join would build whole for every action)
_SAME_TARGET = """
SELECT a.action_id, a.decision_id, a.run_id, a.action, a.status, a.started_at FROM gpu_cost_actions a
LEFT JOIN gpu_cost_decision_log d ON d.decision_id = a.decision_id
WHERE a.target = :target AND a.dry_run = 0 AND a.status IN ('started', 'succeeded') AND a.started_at >= :since
  AND a.action_id <> :action_id AND (d.rule IS NULL OR d.rule <> :rule)
"""


def run_conflict(store: AuditStore, run_id: str, dag_id: str, *, now: float | None = None,
                 max_age_s: float = RUN_MAX_AGE_S) -> str | None:
    """Return the id of another running run of ``dag_id`` that has the right to act, or None."""
    now = time.time() if now is None else now
    me = store.get_run(run_id)
    mine = (float(me["started_at"]), run_id) if me and me.get("started_at") is not None else (now, run_id)
    for row in store.query(_RUNNING, {"dag_id": dag_id, "run_id": run_id, "since": now - max_age_s}):
        theirs = (float(row["started_at"]), str(row["run_id"]))
        if theirs < mine or int(row["actions"] or 0) > 0:
            return str(row["run_id"])
    return None


def effect_lock_key(target: str) -> str:
    """Return the text whose ``hashtext`` keys the PostgreSQL advisory lock of ``target``'s effects."""
    return f"gpu_cost_effect:{target}"


#: takes the transaction advisory lock of a target (``:key`` from :func:`effect_lock_key`)
EFFECT_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtext(:key))"


def effect_of(action: str) -> str:
    """Return the effect class of an action: the kill family is one effect."""
    return "end" if action in KILL_ACTIONS else action


def _owner(rows: Any, d: Decision) -> dict[str, Any] | None:
    effect = effect_of(d.action)
    mine = [dict(r) for r in rows if effect_of(str(r["action"])) == effect]
    done = [r for r in mine if r["status"] == "succeeded"]
    found = done or mine
    return found[0] if found else None


def owner_message(d: Decision, owner: dict[str, Any]) -> str:
    """Return the error of an action skipped because ``owner`` has its effect on ``d.target`` (or a cap)."""
    if owner.get("cap"):
        return str(owner["cap"])
    return (f"{d.target}: already {owner['status']} by action {owner['action_id']} (run {owner.get('run_id')}): "
            "one effect per target")


@dataclass(frozen=True)
class CapCheck:
    """What the rolling caps need to judge one more destructive action (see :func:`start_effect`)."""

    policy: Policy
    entry: str
    total_gpus: int
    now: float


#: takes the one transaction advisory lock every destructive start shares, for the rolling caps
CAPS_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtext('gpu_cost_caps'))"

#: the destructive actions of the last day (``:destructive``: their names, an expanding list): read by the
#: ``gpu_cost_action_log (action, started_at)`` index, not through the day's notices, which outnumber them
_RECENT_DESTRUCTIVE = """
SELECT a.action_id, a.action, a.target, a.run_id, a.started_at, d.gpus FROM gpu_cost_actions a
LEFT JOIN gpu_cost_decision_log d ON d.decision_id = a.decision_id
WHERE a.action IN :destructive AND a.started_at >= :since AND a.dry_run = 0 AND a.action_id <> :action_id
  AND a.status <> 'skipped'
"""


def recent_destructive(rows: Any) -> list[dict[str, Any]]:
    """Return the destructive action rows of ``rows`` with their way in (``entry``)."""
    from gpu_cost.core.model import DESTRUCTIVE_ACTIONS
    from gpu_cost.core.timeutil import epoch
    from gpu_cost.decide.engine import entry_of

    return [{**dict(r), "entry": entry_of(r["run_id"]), "started_at": epoch(r["started_at"])}
            for r in rows if r["action"] in DESTRUCTIVE_ACTIONS]


def start_effect(store: AuditStore, d: Decision, row: dict[str, Any], *,
                 window_s: float = EFFECT_WINDOW_S,
                 caps: CapCheck | None = None) -> tuple[bool, dict[str, Any] | None]:
    """Write the ``started`` row of a destructive action and find the action owning its effect, atomically.

    A loser's row is ended ``skipped`` (naming the owner) in the same transaction, so no later
    racer ever sees it in flight: every loser names the one action that owns the effect.

    With ``caps``, the same transaction counts the destructive actions every way in started in
    the last day (PostgreSQL: under one advisory lock shared by all of them; SQLite: under the
    database's write lock, taken by the insert) and ends this row ``skipped`` with the cap's
    reason when one more would exceed a rolling cap: parallel runs and workers see one count.

    :param row: the parameters of the ``action_started`` statement.
    :returns: ``(created, owner)``: ``created`` is False when the row existed already (another
        worker has this very action); ``owner`` is the other action row that owns the effect, or
        None when this action may act.
    """
    import sqlalchemy as sa

    from gpu_cost.audit.store import _bind, queries
    from gpu_cost.core.errors import AuditError

    store.ensure_schema()
    try:
        with store.engine.begin() as conn:
            if store.dialect == "postgresql":
                if caps is not None:
                    conn.execute(sa.text(CAPS_LOCK_SQL))
                conn.execute(sa.text(EFFECT_LOCK_SQL), {"key": effect_lock_key(d.target)})
            created = conn.execute(sa.text(queries()["action_started"]), _bind(row)).rowcount > 0
            if not created:
                return False, None
            rows = conn.execute(sa.text(_SAME_TARGET), _bind({
                "target": d.target, "action_id": row["action_id"], "since": float(row["started_at"]) - window_s,
                "rule": d.rule,
            })).mappings().all()
            owner = _owner(rows, d)
            if owner is None and caps is not None:
                from gpu_cost.core.model import DESTRUCTIVE_ACTIONS
                from gpu_cost.decide.engine import rolling_cap_violation

                recent = sa.text(_RECENT_DESTRUCTIVE).bindparams(sa.bindparam("destructive", expanding=True))
                history = conn.execute(recent, _bind({
                    "since": caps.now - 86400.0, "action_id": row["action_id"],
                    "destructive": sorted(DESTRUCTIVE_ACTIONS)})).mappings().all()
                why = rolling_cap_violation(recent_destructive(history), d, caps.policy, entry=caps.entry,
                                            total_gpus=caps.total_gpus, now=caps.now)
                if why:
                    owner = {"cap": why, "action_id": None, "status": "capped", "run_id": None}
            if owner is not None:
                conn.execute(sa.text(queries()["action_finished"]), _bind({
                    "action_id": row["action_id"], "status": "skipped", "finished_at": time.time(), "output": None,
                    "error": owner_message(d, owner)}))
    except sa.exc.SQLAlchemyError as exc:
        raise AuditError(f"audit write action_started failed: {str(getattr(exc, 'orig', exc)).splitlines()[0][:300]}") from exc
    if owner is not None and owner.get("cap"):
        logger.warning("%s on %s not done: %s", d.action, d.target, owner["cap"])
    elif owner is not None:
        logger.warning("%s on %s: %s already %s by action %s (run %s): not done twice", d.action, d.target,
                       effect_of(d.action), owner["status"], owner["action_id"], owner.get("run_id"))
    return True, owner


def effect_done(store: AuditStore, action_id: str, d: Decision, *, window_s: float = EFFECT_WINDOW_S,
                now: float | None = None) -> dict[str, Any] | None:
    """Return another action row that already *succeeded* in the same effect on ``d.target``, or None.

    For an action resumed after its worker died: rows started after it yielded to it, so only
    one that completed can own the effect.
    """
    now = time.time() if now is None else now
    rows = store.query(_SAME_TARGET, {"target": d.target, "action_id": action_id, "since": now - window_s,
                                      "rule": d.rule})
    owner = _owner([r for r in rows if r["status"] == "succeeded"], d)
    return owner


__all__ = [
    "CAPS_LOCK_SQL",
    "EFFECT_LOCK_SQL",
    "EFFECT_WINDOW_S",
    "RUN_MAX_AGE_S",
    "CapCheck",
    "effect_done",
    "effect_lock_key",
    "effect_of",
    "owner_message",
    "run_conflict",
    "start_effect",
]
