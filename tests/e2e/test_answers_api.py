"""Answers reach a real api-server: signed Slack interactions and signed links, checked and recorded.

The session's deployment (``tests.fixtures.airflow_server``) serves the package's plugin from the
project's plugins folder. A sweep of the simulated cluster, run here on the deployment's audit
store under its ``ops`` policy, notifies carol about her idle job 1003. Then, over HTTP, as Slack
and a mail client would: a bad signature, a stale request, a replayed request, an expired link and
a non-owner are each refused and recorded; carol's "keep" changes what the next sweep does; her
manager's "this is wrong" stops the ladder; and carol's "release" starts the manual reclaim DAG as
carol, through its guards (which, on the simulator's data, refuse to cancel).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.config.loader import load_policy
from gpu_cost.decide import answers
from gpu_cost.loop import sweep
from tests.fixtures.airflow_server import ANSWERS_LINK_KEY, ANSWERS_SLACK_SECRET, AirflowServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

KEY = ANSWERS_LINK_KEY.encode()


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def _slack_body(user: str, token: str, reason: str = "", response_url: str | None = None) -> bytes:
    payload: dict[str, Any] = {"type": "block_actions", "user": {"id": user, "username": user.lower()},
                               "actions": [{"action_id": "answer", "type": "button", "value": token}],
                               "state": {"values": {"why": {"reason": {"type": "plain_text_input", "value": reason}}}}}
    if response_url:
        payload["response_url"] = response_url
    return urlencode({"payload": json.dumps(payload)}).encode()


def _slack_headers(body: bytes, ts: float | None = None, secret: str = ANSWERS_SLACK_SECRET) -> dict[str, str]:
    stamp = str(int(time.time() if ts is None else ts))
    sig = "v0=" + hmac.new(secret.encode(), b"v0:" + stamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    return {"Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": sig}


def _token(policy, decision_id: str, ts: float, choice: str, recipient: str | None = None, hours: float = 4) -> str:  # type: ignore[no-untyped-def]
    for o in answers.offers(decision_id, ts, policy, KEY, recipient=recipient):
        if o.choice == choice and (choice != "keep" or o.duration_s == hours * 3600):
            return o.token
    raise AssertionError(choice)


def _refusals(store: AuditStore) -> list[dict[str, Any]]:
    return store.query("SELECT channel, answered_by, refusal FROM gpu_cost_answers WHERE status = 'refused'")


def test_answers_are_verified_recorded_and_change_the_next_sweep(airflow_server: AirflowServer,
                                                                 _slack_server: Any) -> None:
    server = airflow_server
    base = f"{server.url}{answers.URL_PREFIX}"
    status, text = _get(f"{base}/health")
    assert status == 200 and json.loads(text) == {"ok": True, "links": True, "slack": True}, text

    policy = load_policy(server.env["GPU_COST_POLICY"])
    store = AuditStore(server.audit_url).ensure_schema()
    now = time.time()
    first = sweep.run_once(policy, now, store, source="sim", run_id="answers-sweep-1")
    d = next(x for x in first["decisions"] if x["target"] == "job:1003")
    assert (d["user"], d["action"]) == ("carol", "notify")
    did = d["decision_id"]
    decided_at = float(store.get_decision(did)["ts"])
    slack_url = f"{base}/slack"
    keep = _token(policy, did, decided_at, "keep", hours=8)

    # -- refused, each recorded with why -----------------------------------------------------------
    body = _slack_body("UCAROL", keep, "eval tonight")
    forged = _slack_headers(body, secret="not-the-secret")
    assert _post(slack_url, body, forged)[0] == 401
    assert _post(slack_url, body, _slack_headers(body, ts=time.time() - 3600))[0] == 403
    status, text = _post(slack_url, _slack_body("UERIN", keep), _slack_headers(_slack_body("UERIN", keep)))
    assert status == 403 and "erin is neither the owner of job:1003 (carol) nor their manager" in text
    refused = _refusals(store)
    assert refused[0]["refusal"].startswith("bad signature (from 127.0.0.1")
    assert refused[1]["refusal"].startswith("stale request: signed 1h")
    assert refused[2]["answered_by"] == "erin"
    assert store.active_snoozes(time.time()) == []

    # -- carol keeps it from Slack: a snooze, and Slack is told ------------------------------------
    response_url = _slack_server.webhook_url("/actions/T0/answers/1")
    body = _slack_body("UCAROL", keep, "eval runs tonight", response_url)
    headers = _slack_headers(body)
    status, text = _post(slack_url, body, headers)
    assert status == 200 and json.loads(text)["ok"] is True, text
    snoozes = store.active_snoozes(time.time())
    assert sorted((s["target"], s["created_by"], s["reason"]) for s in snoozes) == [
        (t, "carol", "eval runs tonight") for t in ("gpu:gpu01:5", "gpu:gpu01:6", "job:1003")]  # the job, its GPUs
    assert all(8 * 3600 - 120 < float(s["until_ts"]) - time.time() <= 8 * 3600 for s in snoozes)
    told = [r.body for r in list(_slack_server.requests) if r.path == "/actions/T0/answers/1"]
    assert told and told[-1]["response_type"] == "ephemeral" and "Kept: job:1003" in told[-1]["text"]
    # the same request again is a replay
    status, text = _post(slack_url, body, headers)
    assert status == 409 and "replay" in text

    second = sweep.run_once(policy, now + 600, store, source="sim", run_id="answers-sweep-2")
    assert [s["target"] for s in second["snoozed"]] == ["job:1003"]
    assert not [x for x in second["decisions"] if x["target"] == "job:1003"]

    # -- links: the page answers nothing; its form does, once; an expired link does not ------------
    wrong = _token(policy, did, decided_at, "wrong", recipient="dave")
    status, page = _get(f"{base}/link?{urlencode({'t': wrong})}")
    assert status == 200 and "This is wrong" in page and "<form method='post'>" in page
    assert store.query("SELECT COUNT(*) AS n FROM gpu_cost_answers WHERE choice = 'wrong'")[0]["n"] == 0
    form = urlencode({"t": wrong, "reason": "our evaluation server, idle between runs"}).encode()
    form_headers = {"Content-Type": "application/x-www-form-urlencoded"}
    status, page = _post(f"{base}/link", form, form_headers)
    assert status == 200 and "marked wrong" in page, page
    assert _post(f"{base}/link", form, form_headers)[0] == 409
    expired = _token(policy, did, decided_at - policy.answers.link_ttl - 60, "wrong", recipient="dave")
    status, page = _post(f"{base}/link", urlencode({"t": expired}).encode(), form_headers)
    assert status == 410 and "expired" in page
    assert [a["choice"] for a in answers.of_decision(store, did) if a["status"] == "accepted"] == ["keep", "wrong"]
    assert len(_refusals(store)) == 6  # forged, stale, erin, the Slack replay, the link replay, expired

    # -- carol releases it: the manual reclaim runs as carol ---------------------------------------
    release = _token(policy, did, decided_at, "release")
    body = _slack_body("UCAROL", release, "finished, thanks")
    status, text = _post(slack_url, body, _slack_headers(body))
    assert status == 200, text
    [row] = [a for a in answers.of_decision(store, did) if a["choice"] == "release" and a["status"] == "accepted"
             and a["reason"] == "finished, thanks"]
    run_id = row["effect"].rsplit(" ", 1)[-1]
    run = server.dag_run(policy.answers.release_dag, run_id)
    assert run["triggering_user_name"] == "carol"
    assert run["conf"]["target_ids"] == ["1003"] and run["conf"]["action"] == "cancel"

    def refused() -> list[dict[str, Any]]:
        return [r for r in store.query("SELECT * FROM gpu_cost_runs WHERE status = 'refused'")
                if run_id in str(r["run_id"])]

    # the deployment reads the simulator: its guards refuse to cancel on simulated data, as for anyone
    [ran] = server.wait_for(refused, "the release's manual reclaim run", timeout=240)
    assert "simulated data never drives a real executor (cancel)" in str(ran["problems"])


# -- what an unauthenticated request, a failed release and a foreign response_url do ------------------
def _carols_notice(server: AirflowServer) -> tuple[Any, AuditStore, str, float]:
    """Return the policy, the store and a notice about carol's job 1003 (a sweep makes one if none is there)."""
    policy = load_policy(server.env["GPU_COST_POLICY"])
    store = AuditStore(server.audit_url).ensure_schema()

    def notice() -> dict[str, Any] | None:
        rows = store.query("SELECT decision_id, ts FROM gpu_cost_decisions WHERE target = 'job:1003' "
                           "AND user_name = 'carol' AND action = 'notify' ORDER BY ts DESC")
        return rows[0] if rows else None

    if notice() is None:
        sweep.run_once(policy, time.time(), store, source="sim", run_id="answers-sweep-r10")
    row = notice()
    assert row is not None
    return policy, store, str(row["decision_id"]), float(row["ts"])


def test_a_non_ascii_signature_is_a_401_not_a_crash(airflow_server: AirflowServer) -> None:
    policy, store, did, decided_at = _carols_notice(airflow_server)
    body = _slack_body("UCAROL", _token(policy, did, decided_at, "wrong"), "a non-ASCII signature")
    headers = {**_slack_headers(body), "X-Slack-Signature": "v0=" + "\u00e9" * 64}
    status, reply = _post(f"{airflow_server.url}{answers.URL_PREFIX}/slack", body, headers)
    assert (status, json.loads(reply)["error"]) == (401, "bad signature"), reply
    assert [r for r in store.query("SELECT refusal FROM gpu_cost_answers WHERE status = 'refused'")
            if str(r["refusal"]).startswith("bad signature (from 127.0.0.1")]


def test_forged_requests_are_recorded_once_per_source_and_minute(airflow_server: AirflowServer) -> None:
    policy, store, did, decided_at = _carols_notice(airflow_server)
    if time.time() % 60 > 40:
        time.sleep(61 - time.time() % 60)  # the burst below within one minute
    start = time.time()
    for n in range(6):
        body = _slack_body("UCAROL", _token(policy, did, decided_at, "wrong"), f"forged {n}")
        status, _ = _post(f"{airflow_server.url}{answers.URL_PREFIX}/slack", body,
                          _slack_headers(body, secret="not-the-secret"))
        assert status == 401
    minutes = {int(start // 60), int(time.time() // 60)}
    rows = [r for r in store.query("SELECT ts, refusal FROM gpu_cost_answers WHERE channel = 'slack' "
                                   "AND status = 'refused'")
            if float(r["ts"]) >= min(minutes) * 60 and str(r["refusal"]).startswith("bad signature")]
    assert len(rows) == len(minutes), rows  # one row a minute, not one per request


def test_a_release_whose_trigger_fails_can_be_sent_again(airflow_server: AirflowServer) -> None:
    server = airflow_server
    policy, store, did, decided_at = _carols_notice(server)
    slack_url = f"{server.url}{answers.URL_PREFIX}/slack"
    body = _slack_body("UCAROL", _token(policy, did, decided_at, "release"), "done with it, really")
    headers = _slack_headers(body)
    path = Path(server.env["GPU_COST_POLICY"])
    text = path.read_text()
    assert text.count("release_dag: gpu_manual_reclaim ") == 1
    try:  # the release DAG is not there (renamed, not yet deployed): the trigger fails
        path.write_text(text.replace("release_dag: gpu_manual_reclaim ", "release_dag: gpu_manual_reclaim_gone "))
        status, reply = _post(slack_url, body, headers)
    finally:
        path.write_text(text)
    assert status == 502 and "can be sent again" in reply, reply
    mine = [a for a in answers.of_decision(store, did) if a["reason"] == "done with it, really"]
    assert [(a["status"], "gpu_manual_reclaim_gone could not be triggered" in str(a["refusal"]))
            for a in mine] == [("refused", True)]

    status, reply = _post(slack_url, body, headers)  # the same request again, now that the DAG is there
    assert status == 200, reply
    [row] = [a for a in answers.of_decision(store, did) if a["reason"] == "done with it, really"
             and a["status"] == "accepted"]
    run_id = row["effect"].rsplit(" ", 1)[-1]
    assert server.dag_run(policy.answers.release_dag, run_id)["triggering_user_name"] == "carol"
    assert _post(slack_url, body, headers)[0] == 409  # carried out, it is used up
    server.wait_for(lambda: server.dag_run(policy.answers.release_dag, run_id)["state"] in ("success", "failed"),
                    "the release's manual reclaim run to end", timeout=240)


def test_the_confirmation_goes_to_no_host_but_slack_or_the_configured_webhook(airflow_server: AirflowServer,
                                                                             _slack_server: Any) -> None:
    policy, _store, did, decided_at = _carols_notice(airflow_server)
    port = _slack_server.port
    # the configured webhook is http://127.0.0.1:<port>/...: "localhost" on the same port is another host
    for host, path in (("localhost", "/actions/T0/elsewhere"), ("127.0.0.1", "/actions/T0/configured")):
        body = _slack_body("UERIN", _token(policy, did, decided_at, "wrong"), f"not hers ({host})",
                           response_url=f"http://{host}:{port}{path}")
        status, reply = _post(f"{airflow_server.url}{answers.URL_PREFIX}/slack", body, _slack_headers(body))
        assert status == 403, reply  # erin is not carol's manager: refused, and told so
    told = {r.path for r in list(_slack_server.requests)}
    assert "/actions/T0/configured" in told and "/actions/T0/elsewhere" not in told
