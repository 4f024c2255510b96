"""Notification messages: every field the templates promise is rendered, escaped for its channel."""

from __future__ import annotations

import dataclasses
import html

import pytest

from gpu_cost.act.channels.base import retry_wait
from gpu_cost.act.notices import render as notify
from gpu_cost.act.notices.recipients import recipients
from gpu_cost.config.schema import NotificationConfig, Person, Protection
from gpu_cost.core.model import Decision
from gpu_cost.core.redact import scrub
from tests.fixtures.core import NOW

NASTY = "x; rm -rf / && echo $(id) `uname` | cat > /tmp/p 'single' \"double\"\nsecond line <b>&amp; ✓ 日本語 🚀"


def _decision(**kw) -> Decision:  # type: ignore[no-untyped-def]
    base = dict(
        decision_id="d0123456789abcdef012", ts=NOW, rule="idle_allocation", target_kind="job", target="job:1003",
        action="notify", mode="enforce", rung=0, job_id="1003", user="carol", account="nlp", partition="batch",
        gpus=2, reason="job 1003: all 2 allocated GPU(s) ≤1.5% for 15 min",
        evidence={"util_mean": 0.4, "util_max": 1.5, "window_s": 900, "gpu_ids": ["gpu01:5", "gpu01:6"],
                  "runtime_s": 10800, "job_name": "finetune-bert"},
    )
    base.update(kw)
    return Decision(**base)  # type: ignore[arg-type]


@pytest.fixture
def people_policy(policy):  # type: ignore[no-untyped-def]
    return dataclasses.replace(policy, people={
        "carol": Person(slack="U0CAROL", email="carol@example.org", manager="mallory"),
        "mallory": Person(slack="U0MGR", email="mallory@example.org"),
    })


@pytest.mark.parametrize("action", ["advise", "notify", "notify_manager"])
def test_every_field_is_rendered(people_policy, action: str) -> None:  # type: ignore[no-untyped-def]
    d = _decision(action=action, rung={"advise": 0, "notify": 0, "notify_manager": 1}[action])
    msg = notify.render(d, people_policy, NOW, run_id="gpu_zombie_sweep:manual__1")
    for text in (msg.text, html.unescape(msg.html)):
        for expected in ("1003", "finetune-bert", "job:1003", "gpu01:5, gpu01:6", "mean 0.4%", "max 1.5%",
                         "15m", "carol", "nlp", "batch", "gpu-cost snooze --target job:1003", "d0123456789abcdef012",
                         "gpu_zombie_sweep:manual__1", "2026-11-29 14:00 UTC", "exemption"):
            assert expected in text, (action, expected, text)
    assert msg.subject.startswith("[gpu-cost] ") and "\n" not in msg.subject
    if action == "notify_manager":
        assert "mallory" in msg.text and "escalation" in msg.text.lower()
    if action == "advise":
        assert "nothing will be stopped" in msg.text


def test_next_rung_and_its_time_come_from_the_ladder(people_policy) -> None:  # type: ignore[no-untyped-def]
    # default idle ladder: notify → notify_manager after 1h → demote after 1h ...
    msg = notify.render(_decision(rung=0), people_policy, NOW)
    assert "(notify_manager) in 1h, not before 2026-11-29 15:00 UTC" in msg.text
    msg = notify.render(_decision(rung=1, action="notify_manager"), people_policy, NOW)
    assert "lower the job's priority (demote) in 1h" in msg.text
    zombie = _decision(rule="zombie", target_kind="process", target="proc:gpu01:4242:1795950000", job_id=None,
                       host="gpu01", evidence={"pid": 4242, "process_name": "python", "process_mem_mib": 30000,
                                               "util_max": 0.0, "window_s": 900, "gpu_ids": ["gpu01:4"]})
    text = notify.render(zombie, people_policy, NOW).text
    assert "PID 4242" in text and "30000 MiB" in text and "(kill_process) in 15m" in text


def test_protected_or_inference_targets_announce_no_destructive_step(people_policy) -> None:  # type: ignore[no-untyped-def]
    pol = dataclasses.replace(people_policy, protections=(Protection(name="vip", level="notify_only"),))
    text = notify.render(_decision(protection="vip"), pol, NOW).text
    assert "demote" not in text and "(notify_manager)" in text
    text = notify.render(_decision(evidence={"inference": "declared", "window_s": 900}), people_policy, NOW).text
    assert "nothing more is scheduled" in text and "inference service" in text


def test_manual_reclaim_message_says_an_operator_asked(people_policy) -> None:  # type: ignore[no-untyped-def]
    text = notify.render(_decision(rule="manual", reason="operator alice: cleanup"), people_policy, NOW).text
    assert "requested by an operator" in text and "operator alice: cleanup" in text


def test_hostile_job_name_is_escaped_per_channel_and_survives(people_policy) -> None:  # type: ignore[no-untyped-def]
    d = _decision(evidence={"job_name": NASTY, "window_s": 900, "gpu_ids": []})
    msg = notify.render(d, people_policy, NOW)
    # Slack: & < > escaped (so no fake mention or link), everything else verbatim
    assert "<b>" not in msg.text
    unescaped = msg.text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    assert NASTY in unescaped
    # e-mail HTML: autoescaped, and the exact name comes back
    assert "<b>&amp;" not in msg.html and NASTY in html.unescape(msg.html)
    # subject: one header line, no raw newline
    assert "\n" not in msg.subject and "rm -rf" in msg.subject


def test_snooze_hint_with_braces_does_not_break(people_policy) -> None:  # type: ignore[no-untyped-def]
    pol = dataclasses.replace(people_policy, notifications=NotificationConfig(
        snooze_hint="ask in #gpu {channel} or run gpu-cost snooze --target {target}"))
    assert "ask in #gpu {channel} or run gpu-cost snooze --target job:1003" in notify.render(_decision(), pol, NOW).text


def test_recipients_come_from_policy_people(people_policy) -> None:  # type: ignore[no-untyped-def]
    owner_only = recipients(_decision(action="notify"), people_policy)
    assert [(r.user, r.role, r.slack, r.email) for r in owner_only] == [("carol", "owner", "U0CAROL", "carol@example.org")]
    both = recipients(_decision(action="notify_manager"), people_policy)
    assert [r.user for r in both] == ["carol", "mallory"] and both[1].slack == "U0MGR"
    unknown = recipients(_decision(user="zed"), people_policy)
    assert unknown[0].slack is None and unknown[0].email is None


@pytest.mark.parametrize(
    ("status", "headers", "attempt", "expected"),
    [(429, {"Retry-After": "3"}, 1, 3.0), (429, {"retry-after": ["2"]}, 1, 2.0), (429, {"Retry-After": "3600"}, 1, None),
     (500, {}, 1, 1.0), (503, {}, 3, 4.0), (0, {}, 2, 2.0), (404, {}, 1, None), (200, {}, 1, None)],
    ids=["429", "429-list", "429-too-long", "500", "503-backoff", "network", "404-final", "ok"],
)
def test_retry_wait(status: int, headers: dict, attempt: int, expected: float | None) -> None:  # type: ignore[type-arg]
    assert retry_wait(status, headers, attempt) == expected


def test_scrub_removes_secrets() -> None:
    text = "POST https://hooks.slack.com/services/T1/B2/abc failed; token xoxb-123-456-abc; pw hunter22"
    out = scrub(text, ["hunter22"])
    assert "abc" not in out and "xoxb-123" not in out and "hunter22" not in out
