"""WeCom, DingTalk, Feishu, Teams and the escalation ticket, through their Airflow providers, against loopback sinks.

Each test dispatches decisions with :func:`gpu_cost.act.dispatch.execute` (the audit rows are
the real ones) and reads what the service stand-in received (``tests/fixtures/chat_sinks.py``):

- DingTalk (DingdingHook) and the ticket (HttpHook) take their host from the connection: they post
  to the sink's loopback URL directly.
- WeCom, Feishu and Teams go through the Apprise provider, whose WeCom and Feishu plugins post only
  to the services' fixed public HTTPS hosts; the Teams Workflows URL names its host, given here in
  the real ``*.logic.azure.com`` form. All three reach the sink through ``chat_proxy``: a loopback
  HTTPS proxy (``HTTPS_PROXY``) that terminates TLS with a certificate from a CA made for the session
  (``REQUESTS_CA_BUNDLE``), so Apprise and requests run unmodified and verify the certificate.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpu_cost.act.base import ActionContext
from gpu_cost.act.dispatch import action_id, execute
from gpu_cost.config.schema import AccountRoute, NotificationConfig, Person, TicketConfig
from gpu_cost.core.model import Decision, decision_id
from tests.fixtures.core import NOW
from tests.fixtures.slack_sink import smtp_conn

pytestmark = pytest.mark.integration

WECOM_KEY = "wecom-key-SECRET123"
FEISHU_TOKEN = "feishu-token-SECRET456"
TEAMS_SIG = "teamsSIGSECRET789"
DING_TOKEN = "dingtoken-SECRET000"
TICKET_TOKEN = "Bearer tkt-SECRET-abcdef"
HOSTILE = "x <at id=all></at> <at>everyone</at> [click](http://evil.example) *b* `c` & done"


def _apprise(monkeypatch: pytest.MonkeyPatch, conn_id: str, url: str) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}",
                       json.dumps({"conn_type": "apprise", "extra": {"config": {"path": url}}}))


@pytest.fixture
def wecom(chat_proxy, monkeypatch):  # type: ignore[no-untyped-def]
    _apprise(monkeypatch, "gpu_cost_wecom", f"wecombot://{WECOM_KEY}")
    return chat_proxy


@pytest.fixture
def feishu(chat_proxy, monkeypatch):  # type: ignore[no-untyped-def]
    _apprise(monkeypatch, "gpu_cost_feishu", f"feishu://{FEISHU_TOKEN}")
    return chat_proxy


@pytest.fixture
def teams(chat_proxy, monkeypatch):  # type: ignore[no-untyped-def]
    _apprise(monkeypatch, "gpu_cost_teams", f"workflow://prod-00.westus.logic.azure.com:443/wf0123abcd/{TEAMS_SIG}")
    return chat_proxy


@pytest.fixture
def dingtalk(chat_sink, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DINGTALK",
                       json.dumps({"conn_type": "dingding", "host": chat_sink.url, "password": DING_TOKEN}))
    return chat_sink


@pytest.fixture
def smtp(smtp_sink, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SMTP", smtp_conn(smtp_sink.port))
    return smtp_sink


@pytest.fixture(autouse=True)
def _no_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the connections a test sets exist (autouse: runs before the fixtures that set them)."""
    for conn in ("SLACK", "SMTP", "WECOM", "FEISHU", "TEAMS", "DINGTALK", "TICKET"):
        monkeypatch.delenv(f"AIRFLOW_CONN_GPU_COST_{conn}", raising=False)


@pytest.fixture
def people(policy):  # type: ignore[no-untyped-def]
    return dataclasses.replace(policy, people={
        "bob": Person(via=("wecom", "email"), email="bob@example.org", manager="mei"),
        "mei": Person(via=("dingtalk",), dingtalk="+86-13800000001", feishu="ou_mei", teams="mei@example.org"),
        "dan": Person(via=("dingtalk", "email"), dingtalk="13800000002", email="dan@example.org"),
        "fay": Person(via=("feishu",), feishu="ou_fay0001"),
        "tom": Person(via=("teams",), teams="tom@example.org", manager="mei"),
        "val": Person(email="val@example.org"),  # no via of her own: her account's route
    })


def _decision(n: int = 0, **kw) -> Decision:  # type: ignore[no-untyped-def]
    target = kw.pop("target", f"job:{1003 + n}")
    base = dict(
        decision_id=decision_id("idle_allocation", target, 1, 0), ts=NOW, rule="idle_allocation", target_kind="job",
        target=target, action="notify", mode="enforce", job_id=target.split(":")[1], user="bob", gpus=2,
        account="vision", reason="all allocated GPUs idle",
        evidence={"util_mean": 0.3, "util_max": 1.0, "window_s": 900, "gpu_ids": ["gpu01:5"], "job_name": "finetune"},
    )
    base.update(kw)
    return Decision(**base)  # type: ignore[arg-type]


def _run(decisions, policy, store):  # type: ignore[no-untyped-def]
    sleeps: list[float] = []
    store.record_decisions(decisions, "test-run")
    ctx = ActionContext(policy=policy, dry_run=False, now=NOW, run_id="test-run", sleep=sleeps.append,
                        extra={"store": store})
    return execute(decisions, ctx, store), sleeps


def _row(store, d: Decision) -> dict:  # type: ignore[no-untyped-def, type-arg]
    row = store.get_action(action_id(d))
    assert row is not None
    return row


def test_wecom_robot_gets_a_text_message_and_email_is_not_needed(wecom, chat_sink, smtp, people, store) -> None:  # type: ignore[no-untyped-def]
    d = _decision(evidence={"job_name": HOSTILE, "window_s": 900})
    (res,), sleeps = _run([d], people, store)
    assert res["status"] == "succeeded", res
    (req,) = chat_sink.to("qyapi.weixin.qq.com")
    assert req.path == "/cgi-bin/webhook/send" and req.query == {"key": [WECOM_KEY]}
    assert req.body["msgtype"] == "text" and set(req.body) == {"msgtype", "text"}
    content = req.body["text"]["content"]
    assert content.startswith("[gpu-cost] Notice: job 1003")  # the subject: a robot text has no title of its own
    assert "*GPU cost notice* for bob" in content and "job:1003" in content
    assert HOSTILE in content  # plain text: the name as it is, no escapes (nothing in a WeCom text is markup)
    assert smtp.mails == [] and sleeps == []
    row = _row(store, d)
    assert "wecom → bob: delivered after 1 attempt(s) [200]" in row["output"]
    assert WECOM_KEY not in json.dumps(row) + json.dumps(res)


def test_a_channel_without_its_connection_is_a_delivery_error_and_the_next_one_goes(chat_sink, smtp, people,
                                                                                       store) -> None:  # type: ignore[no-untyped-def]
    d = _decision()
    (res,), _ = _run([d], people, store)
    assert res["status"] == "succeeded" and chat_sink.requests == []
    assert [m.recipients for m in smtp.mails] == [["bob@example.org"]]
    out = _row(store, d)["output"]
    assert "wecom → bob: failed (connection gpu_cost_wecom is not configured)" in out
    assert "email → bob: delivered" in out


def test_apprise_5xx_is_retried_with_backoff(wecom, chat_sink, smtp, people, store) -> None:  # type: ignore[no-untyped-def]
    chat_sink.queue(502)
    d = _decision()
    (res,), sleeps = _run([d], people, store)
    assert res["status"] == "succeeded" and sleeps == [1.0] and smtp.mails == []
    assert len(chat_sink.to("qyapi.weixin.qq.com")) == 2
    assert "wecom → bob: delivered after 2 attempt(s) [502, 200]" in _row(store, d)["output"]


def test_dingtalk_robot_gets_markdown_mentioning_the_phones(dingtalk, people, store) -> None:  # type: ignore[no-untyped-def]
    d = _decision(user="dan", evidence={"job_name": HOSTILE, "window_s": 900})
    (res,), _ = _run([d], people, store)
    assert res["status"] == "succeeded", res
    (req,) = dingtalk.requests
    assert req.path == "/robot/send" and req.query == {"access_token": [DING_TOKEN]}
    assert req.body["msgtype"] == "markdown"
    assert req.body["at"] == {"atMobiles": ["13800000002"], "isAtAll": False}
    md = req.body["markdown"]
    assert md["title"].startswith("[gpu-cost] Notice: job 1003")
    assert md["text"].startswith("@13800000002\n\n*GPU cost notice* for dan")
    # the job's name cannot make a link or markup: brackets, stars and backticks come escaped
    assert "[click](http" not in md["text"] and r"\[click\]\(http://evil.example\)" in md["text"]
    assert r"\*b\*" in md["text"] and "&lt;at id=all&gt;" in md["text"]
    assert DING_TOKEN not in json.dumps(_row(store, d))


def test_dingtalk_too_fast_is_retried_then_email_takes_over(dingtalk, smtp, people, store) -> None:  # type: ignore[no-untyped-def]
    for _ in range(4):
        dingtalk.queue(200, body=json.dumps({"errcode": 130101, "errmsg": "send too fast"}))
    d = _decision(user="dan")
    (res,), sleeps = _run([d], people, store)
    assert res["status"] == "succeeded" and len(dingtalk.requests) == 4 and sleeps == [1.0, 2.0, 4.0]
    assert [m.recipients for m in smtp.mails] == [["dan@example.org"]]
    out = _row(store, d)["output"]
    assert "dingtalk → dan: failed (HTTP 429" in out and "[429, 429, 429, 429]" in out and "email → dan: delivered" in out


def test_feishu_bot_gets_an_interactive_card_mentioning_the_open_id(feishu, chat_sink, people, store) -> None:  # type: ignore[no-untyped-def]
    d = _decision(user="fay", evidence={"job_name": HOSTILE, "window_s": 900})
    (res,), _ = _run([d], people, store)
    assert res["status"] == "succeeded", res
    (req,) = chat_sink.to("open.feishu.cn")
    assert req.path == f"/open-apis/bot/v2/hook/{FEISHU_TOKEN}/"
    assert req.body["msg_type"] == "interactive"
    card = req.body["card"]
    assert card["header"]["title"]["content"].startswith("[gpu-cost] Notice: job 1003")
    (element,) = card["elements"]
    assert element["text"]["tag"] == "lark_md"
    text = element["text"]["content"]
    assert text.startswith("<at id=ou_fay0001></at> *GPU cost notice* for fay")
    assert text.count("<at") == 1  # the job's name mentions nobody
    assert FEISHU_TOKEN not in json.dumps(_row(store, d))


def test_a_team_route_reaches_members_without_a_via_of_their_own(feishu, chat_sink, smtp, people, store) -> None:  # type: ignore[no-untyped-def]
    pol = dataclasses.replace(people, notifications=NotificationConfig(
        accounts={"vision": AccountRoute(via=("feishu", "email"))}))
    d = _decision(user="val")
    other = _decision(1, user="val", account="nlp")  # another team: the default route (no Slack here, so e-mail)
    results, _ = _run([d, other], pol, store)
    assert [r["status"] for r in results] == ["succeeded", "succeeded"]
    assert len(chat_sink.to("open.feishu.cn")) == 1 and [m.recipients for m in smtp.mails] == [["val@example.org"]]
    assert "feishu → val: delivered" in _row(store, d)["output"]
    assert "email → val: delivered" in _row(store, other)["output"]


def test_teams_workflow_gets_an_adaptive_card_with_the_mention_entity(teams, chat_sink, people, store) -> None:  # type: ignore[no-untyped-def]
    d = _decision(user="tom", evidence={"job_name": HOSTILE, "window_s": 900})
    (res,), _ = _run([d], people, store)
    assert res["status"] == "succeeded", res
    (req,) = chat_sink.to("prod-00.westus.logic.azure.com")
    assert req.path == "/workflows/wf0123abcd/triggers/manual/paths/invoke" and req.query["sig"] == [TEAMS_SIG]
    assert req.body["type"] == "message"
    (att,) = req.body["attachments"]
    assert att["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = att["content"]
    assert card["type"] == "AdaptiveCard"
    blocks = {b.get("id"): b for b in card["body"] if b["type"] == "TextBlock"}
    assert blocks["title"]["text"].startswith("[gpu-cost] Notice: job 1003")
    assert blocks["body"]["text"].startswith("<at>tom@example.org</at> *GPU cost notice* for tom")
    assert card["msteams"]["entities"] == [
        {"type": "mention", "text": "<at>tom@example.org</at>", "mentioned": {"id": "tom@example.org", "name": "tom@example.org"}}]
    assert TEAMS_SIG not in json.dumps(_row(store, d))


def test_escalation_opens_a_ticket_and_each_person_gets_their_own_channel(teams, dingtalk, chat_sink, people,
                                                                          store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_TICKET", json.dumps(
        {"conn_type": "http", "host": f"{chat_sink.url}/api/tickets", "extra": {"Authorization": TICKET_TOKEN}}))
    pol = dataclasses.replace(people, notifications=NotificationConfig(ticket=TicketConfig()))
    d = _decision(user="tom", action="notify_manager", rung=1)
    notice = _decision(1, user="tom")  # a plain notice opens no ticket
    results, _ = _run([d, notice], pol, store)
    assert [r["status"] for r in results] == ["succeeded", "succeeded"]
    assert len(chat_sink.to("prod-00.westus.logic.azure.com")) == 2  # tom, on Teams, twice
    (ding,) = [r for r in chat_sink.requests if r.path == "/robot/send"]  # mei, his manager, on DingTalk
    assert ding.body["at"]["atMobiles"] == ["+86-13800000001"] and "manager: mei" in ding.body["markdown"]["text"]
    (ticket,) = [r for r in chat_sink.requests if r.path == "/api/tickets"]
    assert ticket.headers["Authorization"] == TICKET_TOKEN and ticket.headers["Content-Type"] == "application/json"
    body = ticket.body
    assert {k: body[k] for k in ("target", "decision_id", "owner", "manager", "severity", "action")} == {
        "target": "job:1003", "decision_id": d.decision_id, "owner": "tom", "manager": "mei", "severity": "high",
        "action": "notify_manager"}
    assert body["title"].startswith("[gpu-cost] Escalation") and "*GPU cost escalation* for tom" in body["body"]
    out = _row(store, d)["output"]
    assert "ticket → ticket:job:1003: delivered after 1 attempt(s) [201]" in out
    assert "tkt-SECRET" not in json.dumps(_row(store, d))
