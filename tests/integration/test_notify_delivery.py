"""Notifications through the real Slack and SMTP providers, against loopback stand-ins.

Each test dispatches decisions with :func:`gpu_cost.act.dispatch.execute`, so the audit rows
before and after are the real ones, and reads what the fake Slack endpoint / SMTP sink received.
"""

from __future__ import annotations

import dataclasses
import html
import json
import logging
import re
import time
from types import SimpleNamespace

import pytest

from gpu_cost.act.base import ActionContext
from gpu_cost.act.channels.base import MAX_ATTEMPTS
from gpu_cost.act.dispatch import action_id, execute
from gpu_cost.act.notices.ratelimit import rate_limited
from gpu_cost.airflow.notifier import approval_notifier
from gpu_cost.config.schema import NotificationConfig, Person
from gpu_cost.core.model import Decision, decision_id
from tests.fixtures.core import NOW
from tests.fixtures.slack_sink import smtp_conn

pytestmark = pytest.mark.integration

SECRET_PATH = "/services/T000/B000/XXXXSECRETXXXX"
NASTY = "x; rm -rf / && echo $(id) `uname` | cat > /tmp/p 'single' \"double\"\nline two <@U999> &amp; ✓ 日本語 🚀"


@pytest.fixture
def people(policy):  # type: ignore[no-untyped-def]
    return dataclasses.replace(policy, people={
        "carol": Person(slack="U0CAROL", email="carol@example.org", manager="mallory"),
        "mallory": Person(slack="U0MGR", email="mallory@example.org"),
        "dave": Person(email="dave@example.org"),
    })


@pytest.fixture
def webhook(slack_sink, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLACK",
                       json.dumps({"conn_type": "slackwebhook", "password": slack_sink.webhook_url(SECRET_PATH)}))
    return slack_sink


@pytest.fixture
def smtp(smtp_sink, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SMTP", smtp_conn(smtp_sink.port))
    return smtp_sink


def _decision(n: int = 0, **kw) -> Decision:  # type: ignore[no-untyped-def]
    target = kw.pop("target", f"job:{1003 + n}")
    base = dict(
        decision_id=decision_id("idle_allocation", target, 1, 0), ts=NOW, rule="idle_allocation", target_kind="job",
        target=target, action="notify", mode="enforce", job_id=target.split(":")[1], user="carol", gpus=2,
        reason="all allocated GPUs idle", evidence={"util_mean": 0.3, "util_max": 1.0, "window_s": 900,
                                                    "gpu_ids": ["gpu01:5", "gpu01:6"], "job_name": "finetune"},
    )
    base.update(kw)
    return Decision(**base)  # type: ignore[arg-type]


def _run(decisions, policy, store, *, dry_run=False):  # type: ignore[no-untyped-def]
    sleeps: list[float] = []
    store.record_decisions(decisions, "test-run")
    ctx = ActionContext(policy=policy, dry_run=dry_run, now=NOW, run_id="test-run", sleep=sleeps.append,
                        extra={"store": store})
    return execute(decisions, ctx, store), sleeps


def _row(store, d: Decision) -> dict:  # type: ignore[no-untyped-def, type-arg]
    row = store.get_action(action_id(d))
    assert row is not None
    return row


def test_webhook_posts_the_message_and_the_audit_row_says_so(webhook, people, store) -> None:  # type: ignore[no-untyped-def]
    d = _decision()
    (res,), sleeps = _run([d], people, store)
    assert res["status"] == "succeeded", res
    assert len(webhook.requests) == 1
    req = webhook.requests[0]
    assert req.path == SECRET_PATH and req.headers["Content-Type"].startswith("application/json")
    text = req.body["text"]
    assert text.startswith("<@U0CAROL> ") and "job:1003" in text and "mean 0.3%" in text
    assert "(notify_manager) in 1h" in text and "gpu-cost snooze --target job:1003" in text
    row = _row(store, d)
    assert row["status"] == "succeeded" and "slack-webhook → carol: delivered after 1 attempt(s) [200]" in row["output"]
    assert sleeps == []


def test_429_honours_retry_after_then_500_backs_off_and_the_outcome_is_recorded(webhook, people, store) -> None:  # type: ignore[no-untyped-def]
    webhook.queue(429, retry_after=3)
    webhook.queue(500)
    d = _decision()
    (res,), sleeps = _run([d], people, store)
    assert res["status"] == "succeeded"
    assert sleeps == [3.0, 2.0]  # Retry-After, then exponential backoff for the 2nd attempt
    assert len(webhook.requests) == 3 and len({json.dumps(r.body) for r in webhook.requests}) == 1
    assert "after 3 attempt(s) [429, 500, 200]" in _row(store, d)["output"]


def test_persistent_5xx_is_bounded_and_falls_back_to_email(webhook, smtp, people, store) -> None:  # type: ignore[no-untyped-def]
    for _ in range(MAX_ATTEMPTS):
        webhook.queue(503)
    d = _decision()
    (res,), sleeps = _run([d], people, store)
    assert len(webhook.requests) == MAX_ATTEMPTS and sleeps == [1.0, 2.0, 4.0]
    assert res["status"] == "succeeded"
    assert [m.recipients for m in smtp.mails] == [["carol@example.org"]]
    out = _row(store, d)["output"]
    assert "slack-webhook → carol: failed (HTTP 503" in out and "email → carol: delivered" in out


def test_without_any_channel_the_action_fails_and_says_why(people, store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("AIRFLOW_CONN_GPU_COST_SLACK", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_GPU_COST_SMTP", raising=False)
    d = _decision(user="zed")
    (res,), _ = _run([d], people, store)
    row = _row(store, d)
    assert res["status"] == "failed" and row["status"] == "failed" and "zed was not reached" in row["error"]


def test_user_without_slack_handle_gets_email(webhook, smtp, people, store) -> None:  # type: ignore[no-untyped-def]
    d = _decision(user="dave")
    (res,), _ = _run([d], people, store)
    assert res["status"] == "succeeded" and webhook.requests == []
    (mail,) = smtp.mails
    assert mail.recipients == ["dave@example.org"] and mail.sender == "gpu-cost@example.org"
    assert mail.message["Subject"].startswith("[gpu-cost] Notice: job 1003")
    assert "job:1003" in mail.html() and "What happens next" in mail.html()


def test_manager_escalation_mentions_both(webhook, people, store) -> None:  # type: ignore[no-untyped-def]
    d = _decision(action="notify_manager", rung=1)
    (res,), _ = _run([d], people, store)
    assert res["status"] == "succeeded"
    text = webhook.requests[0].body["text"]
    assert text.startswith("<@U0CAROL> <@U0MGR> ") and "manager: mallory" in text


def test_bot_token_sends_a_dm_to_each_recipient_and_retries_429(slack_sink, people, store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLACK", json.dumps(
        {"conn_type": "slack", "password": "xoxb-test-BOTSECRET", "extra": {"base_url": slack_sink.url + "/api/"}}))
    slack_sink.queue(429, retry_after=1)
    d = _decision(action="notify_manager", rung=1)
    (res,), sleeps = _run([d], people, store)
    assert res["status"] == "succeeded" and sleeps == [1.0]
    posts = [r for r in slack_sink.requests if r.path == "/api/chat.postMessage"]
    assert [p.body["channel"] for p in posts] == ["U0CAROL", "U0CAROL", "U0MGR"]
    assert all(p.headers["Authorization"] == "Bearer xoxb-test-BOTSECRET" for p in posts)
    row = _row(store, d)
    assert "xoxb" not in json.dumps(row)


@pytest.fixture(params=["sqlite", "postgres"])
def shared_store(request):  # type: ignore[no-untyped-def]
    """The audit store workers share: SQLite locally, PostgreSQL in a deployment."""
    return request.getfixturevalue("store" if request.param == "sqlite" else "pg_store")


def test_rate_limit_counts_audit_rows_from_every_worker(webhook, people, shared_store) -> None:  # type: ignore[no-untyped-def]
    store = shared_store
    pol = dataclasses.replace(people, notifications=NotificationConfig(max_per_user_per_hour=2))
    # another worker already sent carol one notice (its row is in the shared audit store)
    other = _decision(9, target="job:2001")
    store.record_decisions([other], "other-run")
    store.action_started(action_id=action_id(other), decision_id=other.decision_id, run_id="other-run",
                         action="notify", target=other.target, executor="x", dry_run=False, started_at=time.time() - 60)
    store.action_finished(action_id(other), "succeeded", time.time() - 59, output="sent")
    mine = [_decision(i) for i in range(3)]
    results, _ = _run(mine, pol, store)
    assert [r["status"] for r in results] == ["succeeded", "skipped", "skipped"]
    assert len(webhook.requests) == 1
    row = _row(store, mine[1])
    assert "rate limit: carol already got 2 notices in the last hour" in row["error"]
    # the notices are not repeated by a retried task
    again, _ = _run(mine, pol, store)
    assert [r["status"] for r in again] == ["succeeded", "skipped", "skipped"] and len(webhook.requests) == 1


def test_concurrent_workers_each_count_the_others_started_rows(people, shared_store) -> None:  # type: ignore[no-untyped-def]
    store = shared_store
    ds = [_decision(i) for i in range(3)]
    store.record_decisions(ds, "r")
    t = time.time()
    for i, d in enumerate(ds):  # three workers wrote their 'started' rows; none has finished
        store.action_started(action_id=action_id(d), decision_id=d.decision_id, run_id="r", action="notify",
                             target=d.target, executor="x", dry_run=False, started_at=t + i)
    verdicts = [rate_limited(store, d, 2) for d in ds]
    assert verdicts[0] is None and verdicts[1] is None and verdicts[2] is not None


def test_dry_run_sends_nothing_and_records_the_rendered_message(webhook, smtp, people, store) -> None:  # type: ignore[no-untyped-def]
    d = _decision(mode="dry-run")
    (res,), _ = _run([d], people, store, dry_run=True)
    assert res["status"] == "skipped"
    assert webhook.requests == [] and smtp.mails == []
    row = _row(store, d)
    assert row["dry_run"] == 1 and "dry-run: would notify carol (owner)" in row["output"] and "job:1003" in row["output"]


def test_hostile_job_name_flows_through_slack_and_email_unharmed(webhook, smtp, people, store) -> None:  # type: ignore[no-untyped-def]
    pol = dataclasses.replace(people, people={**people.people, "carol": Person(slack="U0CAROL", email="carol@example.org"),
                                              "erin": Person(email="erin@example.org")})
    a = _decision(evidence={"job_name": NASTY, "window_s": 900, "gpu_ids": ["gpu01:1"]})
    b = _decision(1, user="erin", evidence={"job_name": NASTY, "window_s": 900, "gpu_ids": ["gpu01:2"]})
    results, _ = _run([a, b], pol, store)
    assert [r["status"] for r in results] == ["succeeded", "succeeded"]
    text = webhook.requests[0].body["text"]
    assert "<@U999>" not in text  # the name cannot mention anyone or inject a link
    assert NASTY in text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    (mail,) = smtp.mails
    assert NASTY in html.unescape(mail.html())
    assert "rm -rf" in str(mail.message["Subject"]) and "日本語" in str(mail.message["Subject"])


def test_secrets_never_reach_logs_outcomes_or_audit_rows(slack_sink, smtp_sink, people, store, monkeypatch,  # type: ignore[no-untyped-def]
                                                         caplog) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLACK",
                       json.dumps({"conn_type": "slackwebhook", "password": slack_sink.webhook_url(SECRET_PATH)}))
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SMTP", smtp_conn(smtp_sink.port, password_hint="unused"))
    for _ in range(MAX_ATTEMPTS):
        slack_sink.queue(500, body=f"echo of {SECRET_PATH}")  # even a server echoing the URL is scrubbed
    smtp_sink.refuse = True
    d = _decision()
    with caplog.at_level(logging.INFO):
        (res,), _ = _run([d], people, store)
    assert res["status"] == "failed"
    dumped = json.dumps(_row(store, d)) + json.dumps(res) + caplog.text
    assert "XXXXSECRETXXXX" not in dumped


def test_approval_notifier_posts_the_link_and_never_raises(webhook, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://airflow.example:8080")
    approve = ApprovalOperator(task_id="approve", subject="Cancel job 1003?")
    ti = SimpleNamespace(dag_id="gpu_manual_reclaim", run_id="manual__1", task_id="approve", map_index=-1)
    context = {"task": approve, "task_instance": ti, "ti": ti, "run_id": "manual__1",
               "dag": SimpleNamespace(dag_id="gpu_manual_reclaim")}
    notifier = approval_notifier()
    assert notifier is not None
    notifier.notify({**context})
    text = webhook.requests[0].body["text"]
    assert "http://airflow.example:8080/dags/gpu_manual_reclaim/runs/manual__1/tasks/approve/required_actions" in text
    # a broken or missing connection only logs
    webhook.reset()
    webhook.queue(404)
    notifier.notify({**context})
    monkeypatch.delenv("AIRFLOW_CONN_GPU_COST_SLACK")
    notifier.notify({**context})
    monkeypatch.setenv("GPU_COST_APPROVAL_NOTIFY", "0")
    assert approval_notifier() is None


def test_without_a_handle_the_webhook_channel_stands_in(webhook, smtp, people, store) -> None:  # type: ignore[no-untyped-def]
    # unknown user: nobody to mention, no e-mail: the team channel gets the notice naming the user
    unknown = _decision(user="zed")
    # dave has only e-mail, but the policy turned the e-mail fallback off
    no_mail = dataclasses.replace(people, notifications=NotificationConfig(email_fallback=False))
    dave = _decision(1, user="dave")
    (r1,), _ = _run([unknown], people, store)
    (r2,), _ = _run([dave], no_mail, store)
    assert r1["status"] == r2["status"] == "succeeded"
    assert smtp.mails == [] and len(webhook.requests) == 2
    assert "for zed" in webhook.texts()[0] and "<@" not in webhook.texts()[0]
    assert "for dave" in webhook.texts()[1]


def test_a_notice_offers_its_answers_as_slack_buttons_and_e_mail_links(webhook, smtp, people, store,  # type: ignore[no-untyped-def]
                                                                        monkeypatch) -> None:
    from gpu_cost.decide import answers

    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_ANSWERS", json.dumps({"conn_type": "generic", "password": "k3y"}))
    linked = dataclasses.replace(people, answers=dataclasses.replace(people.answers,
                                                                     base_url="https://airflow.example.org"))
    d, dave = _decision(), _decision(1, user="dave")  # carol has a Slack id; dave only an e-mail
    results, _ = _run([d, dave], linked, store)
    assert [r["status"] for r in results] == ["succeeded", "succeeded"]
    [post] = [r.body for r in webhook.requests]
    section, reason, buttons = post["blocks"]
    assert section["text"]["text"] == post["text"] and reason["element"]["type"] == "plain_text_input"
    labels = [b["text"]["text"] for b in buttons["elements"]]
    assert labels == ["Keep it 4h", "Keep it 8h", "Keep it 1d", "Release it now", "This is wrong"]
    claims = [answers.read_token(b["value"], b"k3y", NOW) for b in buttons["elements"]]
    assert {c["d"] for c in claims} == {d.decision_id} and {c["u"] for c in claims} == {None}  # Slack says who
    assert buttons["elements"][3]["style"] == "danger" and "confirm" in buttons["elements"][3]
    [mail] = smtp.mails
    hrefs = [html.unescape(h) for h in re.findall(r'href="([^"]+/gpu-cost/answers/link\?t=[^"]+)"', mail.html())]
    assert len(hrefs) == 5 and all(h.startswith("https://airflow.example.org/gpu-cost/answers/link?t=") for h in hrefs)
    from urllib.parse import parse_qs, urlsplit

    tokens = [parse_qs(urlsplit(h).query)["t"][0] for h in hrefs]
    assert {answers.read_token(t, b"k3y", NOW)["u"] for t in tokens} == {"dave"}  # a link is its recipient's
    # without the connection the notice still goes out, without answers
    monkeypatch.delenv("AIRFLOW_CONN_GPU_COST_ANSWERS")
    results, _ = _run([_decision(2)], linked, store)
    assert results[0]["status"] == "succeeded" and "blocks" not in webhook.requests[-1].body
