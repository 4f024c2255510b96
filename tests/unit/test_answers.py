"""Answers to notices: signed tokens and Slack requests, who may answer, and what each answer changes.

The endpoints themselves run in a real api-server in ``tests/e2e/test_answers_api.py``; here the
same checks run on a real SQLite audit store and real sweeps of the simulated cluster.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from urllib.parse import urlencode

import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.config.loader import parse_policy
from gpu_cost.decide import answers
from gpu_cost.decide.answers import Answer, AnswerRefused
from gpu_cost.loop import sweep

KEY = b"test-link-key"
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
POLICY = """
mode: enforce
people:
  carol: {slack: UCAROL, email: carol@example.org, manager: dave}
  dave: {slack: UDAVE, email: dave@example.org}
  erin: {slack: UERIN, email: erin@example.org}
"""


@pytest.fixture
def policy():  # type: ignore[no-untyped-def]
    return parse_policy(POLICY)


@pytest.fixture
def swept(policy):  # type: ignore[no-untyped-def]
    """A store after one enforce sweep: job 1003 (carol's) got its first notice."""
    store = AuditStore("sqlite:///:memory:").ensure_schema()
    now = time.time()
    run = sweep.run_once(policy, now, store, source="sim", run_id="s1")
    d = next(x for x in run["decisions"] if x["target"] == "job:1003")
    assert d["action"] == "notify" and d["user"] == "carol"
    return store, now, d["decision_id"]


def _offer(policy, decision_id: str, now: float, choice: str, recipient: str | None = None, hours: float = 4):  # type: ignore[no-untyped-def]
    for o in answers.offers(decision_id, now, policy, KEY, recipient=recipient):
        if o.choice == choice and (choice != "keep" or o.duration_s == hours * 3600):
            return o
    raise AssertionError(f"no {choice} offer")


def _link(policy, decision_id: str, now: float, choice: str, who: str, hours: float = 4, reason: str = ""):  # type: ignore[no-untyped-def]
    o = _offer(policy, decision_id, now, choice, recipient=who, hours=hours)
    claims = answers.read_token(o.token, KEY, now)
    return Answer("link", claims, f"link:{claims['n']}", who, who, reason=reason)


# -- tokens ------------------------------------------------------------------------------------------
def test_a_token_carries_its_claims_and_refuses_tampering_and_age(policy) -> None:  # type: ignore[no-untyped-def]
    now = 1_800_000_000.0
    offers = answers.offers("d1", now, policy, KEY, recipient="carol")
    assert [(o.choice, o.duration_s) for o in offers] == [
        ("keep", 4 * 3600), ("keep", 8 * 3600), ("keep", 86400), ("release", None), ("wrong", None)]
    assert answers.offers("d1", now, policy, KEY, recipient="carol") == offers  # deterministic: one notice, one set
    assert len({o.token for o in offers}) == 5 and all(o.url is None for o in offers)  # no base_url: no links
    claims = answers.read_token(offers[0].token, KEY, now)
    assert claims["d"] == "d1" and claims["c"] == "keep" and claims["s"] == 14400 and claims["u"] == "carol"
    _body, mac = offers[0].token.split(".")
    forged = answers._b64(json.dumps({**claims, "s": 86400 * 30}).encode()) + "." + mac
    with pytest.raises(AnswerRefused, match="bad signature"):
        answers.read_token(forged, KEY, now)
    with pytest.raises(AnswerRefused, match="bad signature"):
        answers.read_token(offers[0].token, b"another key", now)
    with pytest.raises(AnswerRefused, match="expired") as exc:
        answers.read_token(offers[0].token, KEY, now + policy.answers.link_ttl + 1)
    assert exc.value.status == 410
    with pytest.raises(AnswerRefused, match="malformed"):
        answers.read_token("garbage", KEY, now)
    with pytest.raises(AnswerRefused, match="not configured"):
        answers.read_token(offers[0].token, None, now)
    linked = parse_policy(POLICY + "answers: {base_url: 'https://airflow.example.org/'}\n")
    url = answers.offers("d1", now, linked, KEY)[3].url
    assert url is not None and url.startswith("https://airflow.example.org/gpu-cost/answers/link?t=")


def _slack_sig(body: bytes, ts: str, secret: str = SLACK_SECRET) -> str:
    return "v0=" + hmac.new(secret.encode(), b"v0:" + ts.encode() + b":" + body, hashlib.sha256).hexdigest()


def test_slack_requests_are_checked_by_signature_and_age() -> None:
    now = 1_800_000_000.0
    body = b"payload=%7B%7D"
    ts = str(int(now))
    nonce = answers.verify_slack(body, ts, _slack_sig(body, ts), SLACK_SECRET, now=now, max_age=300)
    assert nonce.startswith("slack:")
    with pytest.raises(AnswerRefused, match="bad signature"):
        answers.verify_slack(body + b"x", ts, _slack_sig(body, ts), SLACK_SECRET, now=now, max_age=300)
    with pytest.raises(AnswerRefused, match="bad signature"):
        answers.verify_slack(body, ts, _slack_sig(body, ts, "other"), SLACK_SECRET, now=now, max_age=300)
    old = str(int(now - 301))
    with pytest.raises(AnswerRefused, match="stale request"):
        answers.verify_slack(body, old, _slack_sig(body, old), SLACK_SECRET, now=now, max_age=300)
    with pytest.raises(AnswerRefused, match="missing"):
        answers.verify_slack(body, None, None, SLACK_SECRET, now=now, max_age=300)


def test_a_slack_block_action_names_the_presser_the_token_and_the_reason() -> None:
    payload = {"type": "block_actions", "user": {"id": "UCAROL"}, "response_url": "https://hooks.slack.com/actions/x",
               "actions": [{"action_id": "keep_4h", "value": "tok.en"}],
               "state": {"values": {"why": {"reason": {"type": "plain_text_input", "value": "eval tonight"}}}}}
    got = answers.parse_slack(urlencode({"payload": json.dumps(payload)}).encode())
    assert (got.user_id, got.token, got.reason) == ("UCAROL", "tok.en", "eval tonight")
    with pytest.raises(AnswerRefused, match="unsupported Slack interaction type 'view_submission'"):
        answers.parse_slack(urlencode({"payload": json.dumps({**payload, "type": "view_submission"})}).encode())
    with pytest.raises(AnswerRefused, match="not a Slack interaction payload"):
        answers.parse_slack(b"text=hello")


# -- who may answer, and what each answer does --------------------------------------------------------
def test_keep_snoozes_the_job_and_the_next_sweep_leaves_it_alone(policy, swept) -> None:  # type: ignore[no-untyped-def]
    store, now, did = swept
    row = answers.apply(store, policy, _link(policy, did, now, "keep", "carol", hours=8, reason="eval runs at night"),
                        now=now + 60)
    assert row["status"] == "accepted" and row["role"] == "owner" and row["duration_s"] == 8 * 3600
    snoozes = store.active_snoozes(now + 120)
    # the job and its GPUs: everything the notice was about
    assert sorted((s["target"], s["created_by"], s["reason"]) for s in snoozes) == [
        ("gpu:gpu01:5", "carol", "eval runs at night"), ("gpu:gpu01:6", "carol", "eval runs at night"),
        ("job:1003", "carol", "eval runs at night")]
    later = sweep.run_once(policy, now + 3600, store, source="sim", run_id="s2")
    assert [s["target"] for s in later["snoozed"]] == ["job:1003"]
    assert not [d for d in later["decisions"] if d["target"] == "job:1003"]
    assert [a["choice"] for a in answers.of_decision(store, did)] == ["keep"]
    # the audit trail of the job shows the answer under its notice
    from gpu_cost.audit import trail

    text = trail.render(trail.trail(store, job="1003"), "job 1003")
    assert "answer keep by carol (owner) via link at" in text and "(eval runs at night): snooze " in text


def test_wrong_stops_the_ladder_for_the_episode(policy, swept) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.core.timeutil import iso

    store, now, did = swept
    answers.apply(store, policy, _link(policy, did, now, "wrong", "dave", reason="this is our eval server"), now=now + 60)
    later = sweep.run_once(policy, now + 2 * 3600, store, source="sim", run_id="s2")
    assert not [d for d in later["decisions"] if d["target"] == "job:1003"]
    why = [w["why"] for w in later["waiting"] if w["target"] == "job:1003"]
    assert why == [f"answered 'this is wrong' by dave: left alone until {iso(now + 60 + policy.snooze.max_duration)}"]
    # without the answer the ladder goes on (the notice was never sent here, so rung 0 is due again)
    fresh = AuditStore("sqlite:///:memory:").ensure_schema()
    sweep.run_once(policy, now, fresh, source="sim", run_id="s1")
    went_on = sweep.run_once(policy, now + 2 * 3600, fresh, source="sim", run_id="s2")
    assert [d["action"] for d in went_on["decisions"] if d["target"] == "job:1003"] == ["notify"]


def test_nobody_but_the_owner_or_manager_may_answer_and_each_refusal_is_recorded(policy, swept) -> None:  # type: ignore[no-untyped-def]
    store, now, did = swept
    with pytest.raises(AnswerRefused, match="erin is neither the owner of job:1003 \\(carol\\) nor their manager"):
        answers.apply(store, policy, _link(policy, did, now, "keep", "erin"), now=now + 60)
    # a link sent to carol, presented as someone else's answer
    carol = _link(policy, did, now, "wrong", "carol")
    with pytest.raises(AnswerRefused, match="this link was sent to carol, not erin"):
        answers.apply(store, policy, Answer("link", carol.claims, carol.nonce, "erin", "erin"), now=now + 60)
    with pytest.raises(AnswerRefused, match="only the owner \\(carol\\) may release"):
        answers.apply(store, policy, _link(policy, did, now, "release", "dave"), now=now + 60)
    with pytest.raises(AnswerRefused, match="nobody the policy's people know"):
        answers.apply(store, policy, Answer("slack", carol.claims | {"u": None}, "slack:x", None, "UNKNOWN"),
                      now=now + 60)
    rows = store.query("SELECT status, answered_by, refusal FROM gpu_cost_answers ORDER BY rowid")
    assert [(r["status"], r["answered_by"]) for r in rows] == [
        ("refused", "erin"), ("refused", "erin"), ("refused", "dave"), ("refused", "UNKNOWN")]
    assert store.active_snoozes(now + 120) == []


def test_a_link_works_once(policy, swept) -> None:  # type: ignore[no-untyped-def]
    store, now, did = swept
    answers.apply(store, policy, _link(policy, did, now, "keep", "carol"), now=now + 60)
    with pytest.raises(AnswerRefused, match="a replay") as exc:
        answers.apply(store, policy, _link(policy, did, now, "keep", "carol"), now=now + 120)
    assert exc.value.status == 409
    assert len({s["snooze_id"] for s in store.active_snoozes(now + 180)}) == 3  # job:1003 and its 2 GPUs, once


def test_release_goes_to_the_manual_reclaim_as_the_owner(policy, swept) -> None:  # type: ignore[no-untyped-def]
    store, now, did = swept
    asked: list[tuple[dict, str]] = []

    def release(conf, owner):  # type: ignore[no-untyped-def]
        asked.append((conf, owner))
        return "run-1"

    row = answers.apply(store, policy, _link(policy, did, now, "release", "carol", reason="done with it"),
                        now=now + 60, release=release)
    assert asked == [({"target_kind": "job", "target_ids": ["1003"], "action": "cancel", "dry_run": False,
                       "reason": "released by its owner from the notice: done with it"}, "carol")]
    assert row["effect"] == "gpu_manual_reclaim run run-1"
    # the manual reclaim's own checks accept it as the owner's request
    from gpu_cost.loop import reclaim

    req = reclaim.parse_request(asked[0][0], asked[0][1])
    assert req.requested_by == "carol" and req.action == "cancel" and not req.dry_run


def test_keep_durations_must_fit_the_snooze_limit() -> None:
    from gpu_cost.core.errors import PolicyError

    short = parse_policy("snooze: {max_duration: 10h}\n")
    assert [o.duration_s for o in answers.offers("d1", 0.0, short, KEY) if o.choice == "keep"] == [4 * 3600, 8 * 3600]
    with pytest.raises(PolicyError, match=r"answers\.keep_durations.*none is within snooze\.max_duration"):
        parse_policy("snooze: {max_duration: 2h}\n")
    with pytest.raises(PolicyError, match=r"answers\.base_url"):
        parse_policy("answers: {base_url: 'airflow.example.org'}\n")


# -- what may not go wrong: a signature Python cannot compare, a release that failed, a foreign host -----
def test_a_signature_with_non_ascii_characters_is_a_bad_signature() -> None:
    now = 1_800_000_000.0
    body, ts = b"payload=%7B%7D", str(int(now))
    with pytest.raises(AnswerRefused, match="bad signature") as exc:
        answers.verify_slack(body, ts, "v0=" + "\u00e9" * 64, SLACK_SECRET, now=now, max_age=300)
    assert exc.value.status == 401


def test_a_release_that_could_not_be_triggered_can_be_sent_again(policy, swept) -> None:  # type: ignore[no-untyped-def]
    store, now, did = swept
    release = _link(policy, did, now, "release", "carol", reason="done with it")

    def down(conf, owner):  # type: ignore[no-untyped-def]
        raise AnswerRefused("release failed: gpu_manual_reclaim could not be triggered", 502)

    with pytest.raises(AnswerRefused, match="release failed") as exc:
        answers.apply(store, policy, release, now=now + 60, release=down)
    assert exc.value.status == 502
    started: list[str] = []

    def up(conf, owner):  # type: ignore[no-untyped-def]
        started.append(owner)
        return "run-1"

    row = answers.apply(store, policy, release, now=now + 120, release=up)
    assert row["status"] == "accepted" and started == ["carol"]
    assert [(a["status"], a["refusal"]) for a in answers.of_decision(store, did)] == [
        ("refused", "release failed: gpu_manual_reclaim could not be triggered"), ("accepted", None)]
    with pytest.raises(AnswerRefused, match="a replay"):
        answers.apply(store, policy, release, now=now + 180, release=up)
    assert started == ["carol"]


WEBHOOK = "http://127.0.0.1:8765/services/T0/B0/SECRET"


@pytest.mark.parametrize(("url", "allowed"), [
    ("https://hooks.slack.com/actions/T0/1/abc", True),
    ("https://HOOKS.slack.com:443/actions/T0/1/abc", True),
    ("http://127.0.0.1:8765/actions/T0/1/abc", True),
    ("http://localhost.evil/actions", False),
    ("http://localhost:8765/actions", False),
    ("http://127.0.0.1:8766/actions", False),
    ("http://127.0.0.1/actions", False),
    ("http://127.0.0.1.evil.example:8765/actions", False),
    ("https://hooks.slack.com.evil.example/actions", False),
    ("https://hooks.slack.com@evil.example/actions", False),
    ("https://user@hooks.slack.com/actions", False),
    ("https://evil.example/?to=https://hooks.slack.com/", False),
    ("http://hooks.slack.com/actions", False),
    ("https://hooks.slack.com:8443/actions", False),
    ("https://[::1/actions", False),
    ("file:///etc/passwd", False),
    ("", False),
    (None, False),
], ids=["slack", "slack-case-port", "configured-webhook", "localhost-prefix", "localhost-not-configured",
        "other-port", "default-port", "ip-prefix", "slack-prefix", "userinfo-host", "userinfo-on-slack", "in-query",
        "slack-over-http", "slack-other-port", "malformed", "file", "empty", "none"])
def test_a_confirmation_goes_only_to_slack_or_the_configured_webhook(url, allowed, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.airflow.answers_api import response_url_allowed

    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLACK", json.dumps({"conn_type": "slackwebhook", "password": WEBHOOK}))
    assert response_url_allowed(url) is allowed
