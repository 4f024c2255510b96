"""The answers endpoint: a FastAPI app the Airflow api-server serves (see :mod:`gpu_cost.airflow.plugin`).

Routes, under ``/gpu-cost/answers``:

- ``POST /slack`` — Slack's interactivity Request URL. Verified with the signing secret and the
  request's timestamp before anything is parsed; answers 200 with what was done (and posts the
  same to the interaction's ``response_url``), or the refusal with its status.
- ``GET /link?t=<token>`` — the page an answer link opens: what the answer will do, a reason
  field and a button. Side-effect free, so a mail scanner that follows links answers nothing.
- ``POST /link`` — the page's form (``t``, ``reason``): the answer itself.
- ``GET /health`` — ``{"ok": true}`` and whether each secret is configured (never the secrets).

Airflow's own authentication does not cover plugin apps; the signatures are the authentication
here. Every answer, accepted or refused, is recorded (:func:`gpu_cost.decide.answers.apply`); a request
refused before its signature checked out is a 401 (or 400, 403 stale, 413, 503) recorded at most
once per source address, status and minute (:func:`gpu_cost.decide.answers.unauthenticated_row`). The
confirmation goes only to Slack's own response host or the configured Slack webhook's host
(:func:`response_url_allowed`).
"""

from __future__ import annotations

import hashlib
import html
import json
import logging
import time
import urllib.request
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse

from gpu_cost.audit.store import AuditStore
from gpu_cost.config.schema import Policy
from gpu_cost.core import connections
from gpu_cost.core.timeutil import format_duration, iso
from gpu_cost.decide import answers
from gpu_cost.decide.answers import Answer, AnswerRefused

logger = logging.getLogger(__name__)

#: the largest request body read (a Slack interaction is a few KiB)
MAX_BODY = 64 * 1024
#: where Slack's interaction ``response_url`` points (https, its default port)
SLACK_RESPONSE_HOST = "hooks.slack.com"

app = FastAPI(title="GPU Cost Agent answers", docs_url=None, redoc_url=None, openapi_url=None)


def _policy() -> Policy:
    from gpu_cost.airflow.runtime import policy_from

    return policy_from(None)


def _store() -> AuditStore:
    return AuditStore().ensure_schema()


def trigger_release(conf: dict[str, Any], owner: str, *, dag_id: str, run_id: str) -> str:
    """Trigger ``dag_id`` (the manual reclaim) as ``owner`` with ``conf``; return the run id.

    Runs inside the api-server, which holds the metadata database; the run is Airflow's own,
    with the owner as its triggering user, so the DAG's guards see who asked. ``run_id`` comes
    from the answer's one-time id: a run that exists already is this answer's, triggered by an
    earlier try. Any other failure raises :class:`AnswerRefused` (502): nothing was started,
    and the answer may be sent again.
    """
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import DagRunAlreadyExists
    from airflow.utils.types import DagRunTriggeredByType

    try:
        run = trigger_dag(dag_id, triggered_by=DagRunTriggeredByType.REST_API, triggering_user_name=owner,
                          run_id=run_id, conf=conf, note=f"released by {owner} from a notice")
    except DagRunAlreadyExists:
        logger.info("release run %s of %s exists already (an earlier try of the same answer)", run_id, dag_id)
        return run_id
    except Exception as exc:  # whatever Airflow refuses (no such DAG, bad params, database): not started
        logger.warning("release of %s by %s: triggering %s failed: %s", conf.get("target_ids"), owner, dag_id, exc)
        raise AnswerRefused(f"release failed: {dag_id} could not be triggered ({type(exc).__name__}: "
                            f"{str(exc)[:200]}); nothing was started, and this answer can be sent again", 502) from None
    return str(run.run_id if run is not None else run_id)


def _release_for(policy: Policy, nonce: str) -> answers.Release:
    run_id = "answer_release__" + hashlib.sha256(nonce.encode()).hexdigest()[:16]
    return lambda conf, owner: trigger_release(conf, owner, dag_id=policy.answers.release_dag, run_id=run_id)


async def _body(request: Request) -> bytes:
    body = await request.body()
    if len(body) > MAX_BODY:
        raise AnswerRefused(f"request body of {len(body)} bytes is over {MAX_BODY}", 413)
    return body


def _done_text(row: dict[str, Any]) -> str:
    choice, target = row["choice"], row["target"]
    if choice == "keep":
        return f"Kept: {target} is left alone for {format_duration(float(row['duration_s']))} ({row['effect']})."
    if choice == "release":
        return f"Release requested: {target} ({row['effect']})."
    return f"Thanks: {target} is marked wrong and left alone until {iso(float(row['until_ts']))}."


@app.get("/health")
def health() -> dict[str, Any]:
    k = answers.keys()
    return {"ok": True, "links": k.link_key is not None, "slack": k.slack_signing_secret is not None}


@app.post("/slack")
async def slack(request: Request) -> JSONResponse:
    now = time.time()
    store, policy = _store(), _policy()
    k = answers.keys()
    row_user: str | None = None
    try:
        body = await _body(request)
        nonce = answers.verify_slack(body, request.headers.get("X-Slack-Request-Timestamp"),
                                     request.headers.get("X-Slack-Signature"), k.slack_signing_secret, now=now,
                                     max_age=policy.answers.slack_max_age)
    except AnswerRefused as exc:
        _record_unauthenticated(store, "slack", exc, request, now)
        return JSONResponse({"ok": False, "error": str(exc)}, status_code=exc.status)
    try:
        pressed = answers.parse_slack(body)
        row_user = pressed.user_id
        claims = answers.read_token(pressed.token, k.link_key, now)
        answer = Answer("slack", claims, nonce, answers.user_of_slack(pressed.user_id, policy), pressed.user_id,
                        reason=pressed.reason)
    except AnswerRefused as exc:
        _record_unread(store, "slack", str(exc), row_user)
        return JSONResponse({"ok": False, "error": str(exc)}, status_code=exc.status)
    try:
        row = answers.apply(store, policy, answer, now=now, release=_release_for(policy, nonce))
    except AnswerRefused as exc:
        _respond(pressed.response_url, f"Not done: {exc}")
        return JSONResponse({"ok": False, "error": str(exc)}, status_code=exc.status)
    text = _done_text(row)
    _respond(pressed.response_url, text)
    return JSONResponse({"ok": True, "text": text, "answer_id": row["answer_id"]})


def _record_unauthenticated(store: AuditStore, channel: str, refusal: AnswerRefused, request: Request,
                            now: float) -> None:
    """Record a request refused before its signature checked out: once per source, status and minute."""
    source = request.client.host if request.client is not None else "unknown"
    written = store.execute("insert_answer", answers.unauthenticated_row(channel, refusal, source, now))
    if written:
        logger.warning("answer refused (%s, from %s): %s", channel, source, refusal)


def _record_unread(store: AuditStore, channel: str, why: str, given_as: str | None) -> None:
    """Record a signed request refused before its answer could be read (malformed, an expired link)."""
    now = time.time()
    store.execute("insert_answer", {
        "answer_id": answers.answer_id(now), "ts": now, "channel": channel, "choice": "", "status": "refused",
        "refusal": why[:500], "decision_id": None, "rule": None, "target": None, "episode": None, "job_id": None,
        "answered_by": given_as, "owner": None, "role": None, "duration_s": None, "reason": None, "until_ts": None,
        "effect": None, "nonce": None})
    logger.warning("answer refused (%s): %s", channel, why)


def _origin(url: str | None) -> tuple[str, str, int] | None:
    """Return ``(scheme, host, port)`` of an http(s) URL without credentials, or None."""
    try:
        parts = urlsplit(url or "")
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("https", "http") or not host or parts.username is not None or parts.password is not None:
        return None
    return parts.scheme, host, port or (443 if parts.scheme == "https" else 80)


def _configured_slack_origin() -> tuple[str, str, int] | None:
    """Return the origin of the configured Slack webhook (connection ``gpu_cost_slack``), if it is a URL."""
    conn = connections.lookup(connections.SLACK_CONN_ID, AnswerRefused) or {}
    for value in (conn.get("password"), conn.get("host")):
        if value and "://" in str(value):
            return _origin(str(value))
    return None


def response_url_allowed(url: str | None) -> bool:
    """Return whether the api-server may post to ``url``: Slack's own response host over https, or the
    host the configured Slack webhook points at (a self-hosted Slack-compatible server) — scheme, host
    and port compared exactly after parsing, never a prefix of the text."""
    origin = _origin(url)
    if origin is None:
        return False
    return origin == ("https", SLACK_RESPONSE_HOST, 443) or origin == _configured_slack_origin()


def _respond(response_url: str | None, text: str) -> None:
    """Tell the person in Slack what happened (best effort: the answer is recorded either way)."""
    if not response_url_allowed(response_url):
        if response_url:
            logger.warning("not posting to the interaction's response_url: its host is neither %s nor the "
                           "configured Slack webhook's", SLACK_RESPONSE_HOST)
        return
    data = json.dumps({"response_type": "ephemeral", "replace_original": False, "text": text}).encode()
    req = urllib.request.Request(str(response_url), data=data, method="POST",  # noqa: S310 - checked above
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=3):  # noqa: S310 - Slack's host or the configured webhook's
            pass
    except OSError as exc:
        logger.warning("could not post to the Slack response_url: %s", type(exc).__name__)


_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>GPU Cost Agent</title>
<style>body{{font-family:sans-serif;max-width:40em;margin:3em auto;line-height:1.4}}
textarea{{width:100%}}button{{font-size:1.1em;padding:.4em 1.2em}}</style></head><body>{body}</body></html>"""


def _page(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(_PAGE.format(body=body), status_code=status)


@app.get("/link")
def link_page(t: str = "") -> HTMLResponse:
    try:
        claims = answers.read_token(t, answers.keys().link_key, time.time())
    except AnswerRefused as exc:
        return _page(f"<h1>This link does not work</h1><p>{html.escape(str(exc))}</p>", exc.status)
    decision = _store().get_decision(str(claims["d"])) or {}
    what = answers.LABELS[claims["c"]]
    if claims["c"] == "keep":
        what = f"Keep it, I am using it — for {format_duration(float(claims.get('s') or 0))}"
    target = html.escape(str(decision.get("target") or claims["d"]))
    return _page(f"<h1>{html.escape(what)}</h1><p>About <b>{target}</b> "
                 f"({html.escape(str(decision.get('reason') or ''))}).</p>"
                 f"<form method='post'><input type='hidden' name='t' value='{html.escape(t, quote=True)}'>"
                 "<p><label>Reason (recorded, shown to operators)<br><textarea name='reason' rows='3'>"
                 "</textarea></label></p><button type='submit'>Send this answer</button></form>")


@app.post("/link")
async def link_answer(request: Request) -> HTMLResponse:
    now = time.time()
    store, policy = _store(), _policy()
    try:
        body = await _body(request)
        form = parse_qs(body.decode("utf-8", "replace"))
        token = (form.get("t") or [""])[0]
        claims = answers.read_token(token, answers.keys().link_key, now)
    except AnswerRefused as exc:
        if exc.status == 410:  # a link of ours, expired: its signature checked out
            _record_unread(store, "link", str(exc), None)
        else:
            _record_unauthenticated(store, "link", exc, request, now)
        return _page(f"<h1>Not done</h1><p>{html.escape(str(exc))}</p>", exc.status)
    recipient = str(claims.get("u") or "")
    answer = Answer("link", claims, f"link:{claims.get('n') or ''}", recipient or None, recipient or "(no recipient)",
                    reason=(form.get("reason") or [""])[0])
    try:
        row = answers.apply(store, policy, answer, now=now, release=_release_for(policy, answer.nonce))
    except AnswerRefused as exc:
        return _page(f"<h1>Not done</h1><p>{html.escape(str(exc))}</p>", exc.status)
    return _page(f"<h1>Done</h1><p>{html.escape(_done_text(row))}</p>")


__all__ = ["app", "trigger_release"]
