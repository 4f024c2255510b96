"""The audit trail of a target: what the agent decided about it, what it did, and why.

Read-only, from ``gpu_cost_decisions`` with their ``gpu_cost_actions`` and ``gpu_cost_savings``
rows: the answer to "why was my job cancelled?". Filters (all optional, combined with AND): a job
(its job decisions and those naming the job id), a target, a user, a rule, a start instant.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpu_cost.core.timeutil import iso

if TYPE_CHECKING:
    from gpu_cost.audit.store import AuditStore

#: the most decisions one call returns (newest first before they are put back in time order)
MAX_LIMIT = 1000


def trail(store: AuditStore, *, job: str | None = None, target: str | None = None, user: str | None = None,
          rule: str | None = None, since: float | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Return the newest ``limit`` matching decisions, oldest first, each with its actions and saving."""
    where: list[str] = []
    params: dict[str, Any] = {}
    if job:
        where.append("(job_id = :job OR target = :job_target)")
        params.update({"job": str(job), "job_target": f"job:{job}"})
    if target:
        where.append("target = :target")
        params["target"] = target
    if user:
        where.append("user_name = :user")
        params["user"] = user
    if rule:
        where.append("rule = :rule")
        params["rule"] = rule
    if since is not None:
        where.append("ts >= :since")
        params["since"] = float(since)
    limit = max(1, min(int(limit), MAX_LIMIT))
    sql = "SELECT * FROM gpu_cost_decisions" + (" WHERE " + " AND ".join(where) if where else "")
    rows = store.query(sql + f" ORDER BY ts DESC, rung DESC, decision_id LIMIT {limit}", params)
    rows = sorted(rows, key=lambda r: (float(r["ts"]), int(r["rung"] or 0), str(r["decision_id"])))
    ids = [str(r["decision_id"]) for r in rows]
    actions = _by_decision(store, "gpu_cost_actions", ids, "started_at")
    savings = _by_decision(store, "gpu_cost_savings", ids, "ts")
    answers = _by_decision(store, "gpu_cost_answers", ids, "answer_id")
    return [entry(r, actions.get(str(r["decision_id"]), []), savings.get(str(r["decision_id"]), []),
                  answers.get(str(r["decision_id"]), [])) for r in rows]


def _by_decision(store: AuditStore, table: str, ids: Sequence[str], order: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for start in range(0, len(ids), 200):
        chunk = ids[start:start + 200]
        names = {f"d{i}": did for i, did in enumerate(chunk)}
        marks = ", ".join(f":{n}" for n in names)
        for row in store.query(f"SELECT * FROM {table} WHERE decision_id IN ({marks}) ORDER BY {order}", names):
            out.setdefault(str(row["decision_id"]), []).append(dict(row))
    return out


def _when(value: Any) -> str | None:
    return iso(float(value)) if value not in (None, "") else None


def _command(a: Mapping[str, Any]) -> str | None:
    """Return the command an action ran: its own column, else the ``$ ...`` line the dispatcher wrote."""
    if a.get("command"):
        return str(a["command"])
    first = str(a.get("output") or "").split("\n", 1)[0]
    return first[2:] if first.startswith("$ ") else None


def _clip(text: Any, limit: int = 2000) -> str | None:
    if text in (None, ""):
        return None
    text = str(text)
    return text if len(text) <= limit else text[: limit - 15] + "...[truncated]"


def entry(d: Mapping[str, Any], actions: Sequence[Mapping[str, Any]], savings: Sequence[Mapping[str, Any]],
          answers: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Return one decision of the trail as plain data (times as ISO 8601)."""
    try:
        evidence = json.loads(d.get("evidence") or "{}")
    except ValueError:
        evidence = {"unreadable": str(d.get("evidence"))[:200]}
    approval = None
    if d.get("requires_approval"):
        approval = {"status": d.get("approval_status"), "by": d.get("approved_by"), "at": _when(d.get("approved_at"))}
    return {
        "decision_id": d["decision_id"], "ts": _when(d["ts"]), "run_id": d.get("run_id"), "rule": d["rule"],
        "target": d["target"], "job_id": d.get("job_id"), "user": d.get("user_name"), "account": d.get("account"),
        "host": d.get("host"), "gpus": int(d.get("gpus") or 0), "action": d["action"], "mode": d["mode"],
        "rung": int(d.get("rung") or 0), "episode": int(d.get("episode") or 1), "status": d["status"],
        "reason": d.get("reason"), "protection": d.get("protection"), "approval": approval,
        "gpu_hours_at_risk": float(d.get("gpu_hours_at_risk") or 0), "gpu_hours_saved": float(d.get("gpu_hours_saved") or 0),
        "evidence": evidence,
        "actions": [{"action_id": a["action_id"], "action": a["action"], "status": a["status"],
                     "dry_run": bool(a.get("dry_run")), "started_at": _when(a.get("started_at")),
                     "finished_at": _when(a.get("finished_at")), "attempt": int(a.get("attempt") or 1),
                     "executor": a.get("executor"), "command": _command(a), "output": _clip(a.get("output")),
                     "error": a.get("error")}
                    for a in actions],
        "savings": [{"saving_id": s["saving_id"], "gpu_hours": float(s.get("gpu_hours") or 0),
                     "usd": float(s.get("usd") or 0), "basis": s.get("basis")} for s in savings],
        "answers": [{"ts": _when(a.get("ts")), "choice": a.get("choice"), "status": a.get("status"),
                     "by": a.get("answered_by"), "role": a.get("role"), "channel": a.get("channel"),
                     "reason": a.get("reason"), "effect": a.get("effect"), "refusal": a.get("refusal")}
                    for a in answers],
    }


def evidence_lines(ev: Mapping[str, Any]) -> list[str]:
    """Return a decision's evidence in plain words: the chart, each signal, the confidence."""
    out = []
    if ev.get("chart"):
        out.append(f"utilisation over the lookback: {ev['chart']}")
    for sig in ev.get("signals") or []:
        if isinstance(sig, Mapping):
            out.append(f"evidence: {sig.get('what')}: {sig.get('value')} — {sig.get('counted')}")
    if ev.get("confidence") is not None:
        why = "; ".join(str(x) for x in ev.get("confidence_why") or [])
        out.append(f"confidence: {float(ev['confidence']):.2f}" + (f" ({why})" if why else ""))
    if not out:
        shown = {k: v for k, v in ev.items() if k not in ("gpu_ids", "track", "stakes_basis", "job_name",
                                                            "job_start_ts", "time_limit_s") and v not in (None, "")}
        if shown:
            out.append("evidence: " + ", ".join(f"{k}={v}" for k, v in sorted(shown.items()))[:300])
    return out


def render(entries: Sequence[Mapping[str, Any]], what: str, currency: str = "USD") -> str:
    """Return the trail as text, one decision per block, oldest first."""
    if not entries:
        return f"no decision recorded for {what}"
    lines = [f"{len(entries)} decision(s) for {what}, oldest first:"]
    for e in entries:
        who = f" ({e['user']})" if e.get("user") else ""
        lines.append(f"{e['ts']}  {e['target']}{who}  {e['rule']} rung {e['rung']} (episode {e['episode']}): "
                     f"{e['action']} [{e['mode']}] → {e['status']}")
        lines.append(f"    why: {e.get('reason') or '-'}")
        lines.extend(f"    {x}" for x in evidence_lines(e.get("evidence") or {}))
        lines.append(f"    stakes: {e['gpu_hours_at_risk']:.1f} GPU-h of work at risk, {e['gpu_hours_saved']:.1f} GPU-h left "
                     "to its end (the most acting could free; the ledger books only the waste seen)")
        ap = e.get("approval")
        if ap:
            lines.append(f"    approval: {ap['status'] or 'pending'}" + (f" by {ap['by']}" if ap.get("by") else "")
                         + (f" at {ap['at']}" if ap.get("at") else ""))
        for a in e["actions"]:
            done = a["finished_at"] or "not finished"
            tail = f": {a['error']}" if a.get("error") else (f": {a['command']}" if a.get("command") else "")
            dry = " (dry-run)" if a["dry_run"] else ""
            lines.append(f"    action {a['action']}{dry} → {a['status']} ({a['started_at']} … {done}, "
                         f"attempt {a['attempt']}){tail}")
        for a in e.get("answers") or ():
            said = f" ({a['reason']})" if a.get("reason") else ""
            what = a["effect"] if a["status"] == "accepted" else f"refused: {a['refusal']}"
            lines.append(f"    answer {a['choice'] or '?'} by {a['by'] or '?'}"
                         f"{' (' + a['role'] + ')' if a.get('role') else ''} via {a['channel']} at {a['ts']}{said}: {what}")
        for s in e["savings"]:
            lines.append(f"    saved: {s['gpu_hours']:.1f} GPU-h, {s['usd']:.2f} {currency} ({s['basis']})")
    return "\n".join(lines)
