"""Answers: what the people a notice reaches say back, checked, recorded, and made to count.

Every notice offers three answers:

- **keep** — "keep it, I am using it", for one of ``answers.keep_durations`` (4 h / 8 h / 24 h),
  with a reason: a snooze by the person answering, within ``snooze.max_duration``, of everything
  the notice was about (:func:`gpu_cost.decide.engine.target_keys`: the target, its job or the job
  a process still names, its GPUs). The next sweep leaves it alone until then.
- **release** — "release it now": the owner asks the agent to cancel. It triggers the manual
  reclaim DAG (``answers.release_dag``) as the owner, so it passes the same guards and caps as
  any other action (protections, the policy's mode, approvals, the per-run and rolling caps).
- **wrong** — "this is wrong": the episode ends and the answer is its label; the engine leaves the
  target alone for ``snooze.max_duration`` (like the longest snooze), then, if it is still found,
  decides it again in a new episode from the first rung.

Answers arrive two ways, both verified before anything is read:

- **Slack** interactive buttons: Slack signs each request with the app's signing secret
  (``v0=HMAC-SHA256(secret, "v0:<timestamp>:<body>")``); a request older than
  ``answers.slack_max_age`` is refused, and so is one seen before (its signature is its one-time
  id). The person is Slack's user id, looked up in the policy's ``people``.
- **Links** (e-mail, and chat tools without buttons): a token ``<claims>.<HMAC-SHA256>`` signed
  with the link key, naming the decision, the choice (and duration), the recipient and an expiry
  (``answers.link_ttl`` after the decision). Each link works once. Opening one shows a page; only
  its form's POST answers, so a mail scanner following links answers nothing.

Either way the person must own the target or be its manager (``answers.managers_may_answer``);
only the owner may release. Every answer, accepted or refused (expired, replayed, not the
owner...), is written to ``gpu_cost_answers`` with why; a request whose signature never checked
out is written at most once per source and minute (:func:`unauthenticated_row`). A one-time id
is used up only by an answer carried out (or refused for good): a release whose DAG could not be
triggered is recorded as refused and may be sent again. The secrets come from the Airflow
connection ``gpu_cost_answers``: ``password`` is the link key, ``extra.slack_signing_secret`` the
Slack app's signing secret.

The web endpoints are in :mod:`gpu_cost.airflow.answers_api` (an Airflow plugin served by the
api-server); this module is plain Python.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote

from gpu_cost.audit.store import AuditStore
from gpu_cost.config.schema import Policy
from gpu_cost.core import connections
from gpu_cost.core.errors import GpuCostError
from gpu_cost.core.timeutil import format_duration, iso

logger = logging.getLogger(__name__)

CONN_ID = "gpu_cost_answers"
CHOICES = ("keep", "release", "wrong")
#: where the api-server serves the plugin's app (``AirflowPlugin.fastapi_apps`` url_prefix)
URL_PREFIX = "/gpu-cost/answers"
LABELS = {"keep": "Keep it, I am using it", "release": "Release it now", "wrong": "This is wrong"}
#: the reason recorded for a "keep" given without one (the answer is the owner's own justification)
DEFAULT_KEEP_REASON = "the owner answered the notice: keep it, I am using it"
MAX_REASON = 500


class AnswerRefused(GpuCostError):
    """An answer that is not accepted: its signature, age, author or content is wrong.

    :param status: the HTTP status the endpoints answer with (403 not allowed, 400 malformed,
        409 a replay, 410 expired, 503 not configured).
    """

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Keys:
    """The secrets answers are checked with (connection ``gpu_cost_answers``)."""

    link_key: bytes | None = None
    slack_signing_secret: str | None = None


def keys(conn_id: str = CONN_ID) -> Keys:
    """Return the answer secrets from the connection, or empty :class:`Keys` when it is not configured."""
    conn = connections.lookup(conn_id, AnswerRefused)
    if not conn:
        return Keys()
    link = conn.get("password") or None
    extra = conn.get("extra") or {}
    slack = extra.get("slack_signing_secret") or None
    return Keys(link_key=link.encode() if link else None, slack_signing_secret=str(slack) if slack else None)


# -- tokens ----------------------------------------------------------------------------------------
def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(claims: Mapping[str, Any], key: bytes) -> str:
    """Return the token for ``claims``: base64url(JSON) ``.`` base64url(HMAC-SHA256)."""
    body = _b64(json.dumps(dict(claims), sort_keys=True, separators=(",", ":")).encode())
    mac = hmac.new(key, body.encode(), hashlib.sha256).digest()
    return f"{body}.{_b64(mac)}"


def read_token(token: str, key: bytes | None, now: float) -> dict[str, Any]:
    """Return the claims of a valid, unexpired token; raise :class:`AnswerRefused` saying what is wrong.

    Its status tells whether the signature checked out: 401, 400 and 503 before it did (nothing in
    the request can be trusted), 410 after (an expired link of ours).
    """
    if not key:
        raise AnswerRefused(f"answer links are not configured (connection {CONN_ID} has no password)", 503)
    body, _, mac = (token or "").strip().partition(".")
    if not body or not mac:
        raise AnswerRefused("malformed token", 400)
    want = hmac.new(key, body.encode(), hashlib.sha256).digest()
    try:
        got = _unb64(mac)
    except ValueError:
        raise AnswerRefused("malformed token", 400) from None
    if not hmac.compare_digest(want, got):
        raise AnswerRefused("bad signature", 401)
    try:
        claims = json.loads(_unb64(body))
    except ValueError:
        raise AnswerRefused("malformed token", 400) from None
    if not isinstance(claims, dict) or claims.get("c") not in CHOICES or not claims.get("d"):
        raise AnswerRefused("malformed token", 400)
    if float(claims.get("x") or 0) < now:
        raise AnswerRefused(f"expired at {iso(float(claims.get('x') or 0))}", 410)
    return claims


@dataclass(frozen=True)
class Offer:
    """One answer a notice offers: its label, the signed token, and (with a base URL) its link."""

    choice: str
    label: str
    token: str
    duration_s: float | None = None
    url: str | None = None


def offers(decision_id: str, decided_at: float, policy: Policy, key: bytes | None, *,
           recipient: str | None = None) -> list[Offer]:
    """Return the answers a notice offers, or none when answers are off or no link key is set.

    Tokens are deterministic (the same notice renders the same links), each expires
    ``answers.link_ttl`` after the decision, and each carries its one-time id. ``recipient``
    binds a link to the person it is sent to; Slack buttons leave it out (Slack says who clicked).
    """
    cfg = policy.answers
    if not cfg.enabled or not key:
        return []
    expires = float(decided_at) + cfg.link_ttl
    out = []
    choices: list[tuple[str, float | None]] = [("keep", float(s)) for s in cfg.keep_durations
                                               if s <= policy.snooze.max_duration]
    choices += [("release", None), ("wrong", None)]
    for choice, dur in choices:
        claims: dict[str, Any] = {"d": decision_id, "c": choice, "x": int(expires), "u": recipient}
        if dur is not None:
            claims["s"] = int(dur)
        claims["n"] = _b64(hmac.new(key, json.dumps(claims, sort_keys=True).encode(), hashlib.sha256).digest()[:12])
        token = sign(claims, key)
        label = f"Keep it {format_duration(dur)}" if dur is not None else LABELS[choice]
        url = f"{cfg.base_url.rstrip('/')}{URL_PREFIX}/link?t={quote(token)}" if cfg.base_url else None
        out.append(Offer(choice, label, token, dur, url))
    return out


# -- Slack -----------------------------------------------------------------------------------------
def verify_slack(body: bytes, timestamp: str | None, signature: str | None, secret: str | None, *,
                 now: float, max_age: float) -> str:
    """Check a Slack request's signature and age; return its one-time id (from the signature)."""
    if not secret:
        raise AnswerRefused(f"Slack answers are not configured (connection {CONN_ID} has no "
                            "extra.slack_signing_secret)", 503)
    if not timestamp or not signature:
        raise AnswerRefused("missing X-Slack-Request-Timestamp or X-Slack-Signature", 400)
    try:
        ts = float(timestamp)
    except ValueError:
        raise AnswerRefused(f"X-Slack-Request-Timestamp {timestamp[:40]!r} is not a number", 400) from None
    if abs(now - ts) > max_age:
        raise AnswerRefused(f"stale request: signed {format_duration(abs(now - ts))} ago "
                            f"(answers.slack_max_age={format_duration(max_age)})")
    base = b"v0:" + timestamp.encode() + b":" + body
    want = b"v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest().encode()
    # bytes, not str: compare_digest refuses a str with non-ASCII characters (a header may hold any)
    got = signature.strip().encode("utf-8", "replace")
    if not hmac.compare_digest(want, got):
        raise AnswerRefused("bad signature", 401)
    return "slack:" + hashlib.sha256(got).hexdigest()[:32]


@dataclass(frozen=True)
class SlackAnswer:
    """What one Slack button press says: who pressed it, which answer (its token), the reason typed."""

    user_id: str
    token: str
    reason: str = ""
    response_url: str | None = None


def parse_slack(body: bytes) -> SlackAnswer:
    """Parse a ``block_actions`` interaction (form-encoded ``payload=<JSON>``)."""
    try:
        form = parse_qs(body.decode("utf-8"), strict_parsing=False)
        payload = json.loads(form["payload"][0])
    except (KeyError, IndexError, ValueError, UnicodeDecodeError):
        raise AnswerRefused("not a Slack interaction payload (payload=<JSON> form field)", 400) from None
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        raise AnswerRefused(f"unsupported Slack interaction type {str(payload.get('type') if isinstance(payload, dict) else '')[:40]!r}", 400)
    user = payload.get("user") or {}
    actions = payload.get("actions") or []
    if not isinstance(user, dict) or not user.get("id") or not actions or not isinstance(actions[0], dict):
        raise AnswerRefused("Slack payload has no user or action", 400)
    token = str(actions[0].get("value") or "")
    reason = ""
    state = (payload.get("state") or {}).get("values") or {}
    for block in state.values() if isinstance(state, dict) else ():
        for value in (block or {}).values():
            if isinstance(value, dict) and value.get("type") == "plain_text_input" and value.get("value"):
                reason = str(value["value"])
    return SlackAnswer(str(user["id"]), token, reason, payload.get("response_url"))


def user_of_slack(slack_id: str, policy: Policy) -> str | None:
    """Return the policy user whose ``people.<user>.slack`` is ``slack_id``."""
    for name, person in policy.people.items():
        if person.slack and person.slack == slack_id:
            return name
    return None


# -- applying --------------------------------------------------------------------------------------
@dataclass
class Answer:
    """One answer to record: who (``user``: a policy user, or None when unknown), what, and how it came."""

    channel: str  # slack | link
    claims: Mapping[str, Any]
    nonce: str
    user: str | None
    given_as: str  # the identity as the request gave it (a Slack id, a link's recipient)
    reason: str = ""
    duration_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def answer_id(now: float) -> str:
    """Return a new answer id that sorts by time (milliseconds, then randomness)."""
    return f"{int(now * 1000):013d}-{uuid.uuid4().hex[:12]}"


def unauthenticated_row(channel: str, refusal: AnswerRefused, source: str, now: float) -> dict[str, Any]:
    """Return the ``gpu_cost_answers`` row of a request refused before it could be read.

    Its id is the same for every such request from ``source`` (the peer's address) on ``channel``
    with the same status within one minute, so a flood of forged requests writes one row a minute,
    not one each (``insert_answer`` keeps the first).
    """
    minute = int(now // 60) * 60
    key = hashlib.sha256(f"{channel}|{source}|{refusal.status}".encode()).hexdigest()[:12]
    return {"answer_id": f"{minute * 1000:013d}-{key}", "ts": now, "channel": channel, "choice": "",
            "status": "refused", "refusal": f"{refusal} (from {source}; refused again within the minute: not "
                                             "recorded again)"[:MAX_REASON],
            "decision_id": None, "rule": None, "target": None, "episode": None, "job_id": None,
            "answered_by": None, "owner": None, "role": None, "duration_s": None, "reason": None, "until_ts": None,
            "effect": None, "nonce": None}


#: who triggers a release: ``(conf, owner) -> run id``; the api-server's is in gpu_cost.airflow.answers_api.
#: It raises :class:`AnswerRefused` (502) when the run could not be triggered; triggering again with the
#: same one-time id must not start a second run.
Release = Callable[[dict[str, Any], str], str]


def release_conf(decision: Mapping[str, Any], reason: str) -> dict[str, Any]:
    """Return the manual reclaim params that release a decision's target: cancel its job."""
    job = decision.get("job_id")
    if not job:
        raise AnswerRefused(f"{decision.get('target')} is not a job: only a job can be released")
    why = " ".join(f"released by its owner from the notice: {reason or 'release it now'}".split())[:MAX_REASON]
    return {"target_kind": "job", "target_ids": [str(job)], "action": "cancel", "reason": why, "dry_run": False}


def apply(store: AuditStore, policy: Policy, answer: Answer, *, now: float | None = None,
          release: Release | None = None) -> dict[str, Any]:
    """Check ``answer`` against its decision and the policy, carry it out, and record it.

    Returns the ``gpu_cost_answers`` row written. A refused answer is recorded too, and raises
    :class:`AnswerRefused` after it is written. The one-time id is claimed after the answer is
    carried out, so an answer that could not be carried out (a release whose DAG trigger failed)
    may be sent again; a second request racing the first is refused as a replay when it claims.
    """
    now = time.time() if now is None else float(now)
    claims = answer.claims
    choice = str(claims.get("c") or "")
    row: dict[str, Any] = {
        "answer_id": answer_id(now), "ts": now, "channel": answer.channel, "choice": choice, "status": "refused",
        "refusal": None, "decision_id": claims.get("d"), "rule": None, "target": None, "episode": None, "job_id": None,
        "answered_by": answer.user or answer.given_as, "owner": None, "role": None, "duration_s": None,
        "reason": " ".join((answer.reason or "").split())[:MAX_REASON] or None, "until_ts": None, "effect": None,
        "nonce": answer.nonce,
    }
    try:
        decision = _check(store, policy, answer, row)
        replay = AnswerRefused("already answered: this request was used before (a replay)", 409)
        if store.fetch("answer_nonce_used", {"nonce": answer.nonce}):
            raise replay
        row["effect"] = _carry_out(store, policy, decision, row, now, release)
        claimed = store.execute("claim_answer_nonce", {"nonce": answer.nonce, "answer_id": row["answer_id"], "ts": now})
        if claimed == 0:
            raise replay
        row["status"] = "accepted"
    except AnswerRefused as exc:
        row["refusal"] = str(exc)
        store.execute("insert_answer", row)
        logger.warning("answer refused (%s, %s by %s): %s", answer.channel, choice or "?", row["answered_by"], exc)
        raise
    store.execute("insert_answer", row)
    logger.info("answer accepted: %s %s by %s (%s): %s", choice, row["target"], row["answered_by"], row["role"],
                row["effect"])
    return row


def _check(store: AuditStore, policy: Policy, answer: Answer, row: dict[str, Any]) -> Mapping[str, Any]:
    """Fill ``row`` with the decision's identity; raise unless ``answer`` may be carried out."""
    cfg = policy.answers
    if not cfg.enabled:
        raise AnswerRefused("answers are turned off (answers.enabled: false)", 503)
    decision = store.get_decision(str(row["decision_id"]))
    if decision is None:
        raise AnswerRefused(f"no decision {row['decision_id']!r} in the audit store", 404)
    owner = decision.get("user_name")
    row.update(rule=decision.get("rule"), target=decision.get("target"), episode=decision.get("episode"),
               job_id=decision.get("job_id"), owner=owner)
    bound = answer.claims.get("u")
    if bound and answer.user != bound:
        raise AnswerRefused(f"this link was sent to {bound}, not {answer.user or answer.given_as}")
    if answer.user is None:
        raise AnswerRefused(f"{answer.given_as} is nobody the policy's people know")
    if owner and answer.user == owner:
        row["role"] = "owner"
    elif owner and cfg.managers_may_answer and policy.manager_of(owner) == answer.user:
        row["role"] = "manager"
    else:
        raise AnswerRefused(f"{answer.user} is neither the owner of {decision.get('target')} ({owner or 'unknown'}) "
                            f"nor {'their manager' if cfg.managers_may_answer else 'allowed to answer'}")
    choice = row["choice"]
    if choice == "keep":
        dur = float(answer.duration_s if answer.duration_s is not None else answer.claims.get("s") or 0)
        allowed = [float(s) for s in cfg.keep_durations]
        if not any(abs(dur - s) < 1 for s in allowed):
            raise AnswerRefused(f"keep for {format_duration(dur)}: answers.keep_durations allows "
                                f"{', '.join(format_duration(s) for s in allowed)}")
        if dur > policy.snooze.max_duration + 1:
            raise AnswerRefused(f"keep for {format_duration(dur)} is longer than snooze.max_duration")
        row["duration_s"] = dur
        row["until_ts"] = float(row["ts"]) + dur
        if row["reason"] and len(row["reason"]) < policy.snooze.min_reason_chars:
            raise AnswerRefused(f"reason {row['reason']!r}: give at least {policy.snooze.min_reason_chars} characters")
    elif choice == "wrong":
        # it holds the target like the longest snooze, then expires (gpu_cost.decide.engine.dispute_until)
        row["duration_s"] = policy.snooze.max_duration
        row["until_ts"] = float(row["ts"]) + policy.snooze.max_duration
    elif choice == "release":
        if row["role"] != "owner":
            raise AnswerRefused(f"only the owner ({owner}) may release {decision.get('target')}")
        release_conf(decision, row["reason"] or "")
    return decision


def _carry_out(store: AuditStore, policy: Policy, decision: Mapping[str, Any], row: dict[str, Any], now: float,
               release: Release | None) -> str:
    """Do what an accepted answer asks; return what was done (recorded as its ``effect``)."""
    from gpu_cost.decide import snooze

    choice = row["choice"]
    if choice == "keep":
        keys = keep_keys(decision)
        why = row["reason"] or DEFAULT_KEEP_REASON
        try:
            for key in keys:
                snooze.normalise_target(key)  # all or none: a bad key refuses before anything is written
            ids = [snooze.snooze(store, key, float(row["until_ts"]), why, str(row["answered_by"]), now=now,
                                 policy=policy)["snooze_id"] for key in keys]
        except snooze.SnoozeError as exc:
            raise AnswerRefused(str(exc)) from None
        return f"snooze {', '.join(ids)}: {', '.join(keys)} until {iso(float(row['until_ts']))}"
    if choice == "release":
        if release is None:
            raise AnswerRefused("release is not available here (it needs the Airflow api-server)")
        run_id = release(release_conf(decision, row["reason"] or ""), str(row["answered_by"]))
        return f"{policy.answers.release_dag} run {run_id}"
    return (f"episode {decision['episode']} of {decision['target']} ({decision['rule']}) ended; left alone until "
            f"{iso(float(row['until_ts']))}")


def keep_keys(decision: Mapping[str, Any]) -> list[str]:
    """Return what a "keep" on ``decision``'s notice snoozes: everything the decision touches."""
    from gpu_cost.decide.engine import target_keys

    evidence = decision.get("evidence") or {}
    if isinstance(evidence, str):
        try:
            evidence = json.loads(evidence)
        except ValueError:
            evidence = {}
    gpus = evidence.get("gpu_ids") if isinstance(evidence, Mapping) else None
    return target_keys(str(decision["target"]), decision.get("job_id"),
                       [str(g) for g in gpus] if isinstance(gpus, list) else [])


def disputed(store: AuditStore, targets: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """Return ``(rule, target)`` → the latest accepted "this is wrong" answer, for ``targets``.

    Expired answers are returned too: the engine still needs to know the episode they ended.
    """
    if not targets:
        return {}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in store.fetch("disputed_episodes", {"targets": sorted(set(targets))}):
        key = (str(r["rule"]), str(r["target"]))
        if key not in out or float(r["ts"]) > float(out[key]["ts"]):
            out[key] = r
    return out


def of_decision(store: AuditStore, decision_id: str) -> list[dict[str, Any]]:
    """Return the answers given to a decision's notice, oldest first."""
    return store.fetch("answers_of_decision", {"decision_id": decision_id})


def owner_releases(store: AuditStore, targets: list[str]) -> dict[str, float]:
    """Return target → when its owner's "release it now" was accepted (the earliest), for ``targets``."""
    if not targets:
        return {}
    out: dict[str, float] = {}
    for r in store.fetch("owner_releases", {"targets": sorted(set(targets))}):
        out[str(r["target"])] = min(float(r["ts"]), out.get(str(r["target"]), float("inf")))
    return out
