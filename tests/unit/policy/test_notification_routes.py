"""The policy's notice routes: ``people.<user>.via``, ``notifications.accounts`` and ``notifications.ticket``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpu_cost.act.notices.recipients import recipients
from gpu_cost.config.loader import parse_policy
from gpu_cost.core.model import Decision
from tests.fixtures.core import NOW
from tests.unit.policy.helpers import assert_policy_error

ROUTES = """
people:
  bob: {via: [wecom, email], email: bob@example.org, manager: mei}
  mei: {dingtalk: "+86-13800000001", feishu: ou_mei, teams: mei@example.org}
notifications:
  accounts:
    vision: {via: [feishu, email]}
  ticket: {actions: [notify_manager, notify], conn_id: my_tickets}
"""


def test_routes_are_read_and_each_person_gets_their_own_or_their_teams() -> None:
    p = parse_policy(ROUTES)
    assert p.people["bob"].via == ("wecom", "email")
    assert p.notifications.ticket is not None and p.notifications.ticket.actions == ("notify_manager", "notify")
    assert p.notifications.ticket.conn_id == "my_tickets"
    d = Decision(decision_id="d1", ts=NOW, rule="idle_allocation", target_kind="job", target="job:1", action="notify_manager",
                 mode="enforce", user="bob", account="vision")
    owner, manager = recipients(d, p)
    assert owner.via == ("wecom", "email")  # his own
    assert manager.via == ("feishu", "email") and manager.handle("feishu") == "ou_mei"  # the team's
    other = recipients(dataclasses.replace(d, account="nlp"), p)
    assert other[1].via == ()  # another team: the default route (Slack, then e-mail)


def test_without_a_ticket_section_no_ticket_is_opened() -> None:
    assert parse_policy("notifications: {max_per_user_per_hour: 3}").notifications.ticket is None


@pytest.mark.parametrize(
    ("text", "pattern"),
    [("people: {bob: {via: [wechat]}}", r"people\.bob\.via\[0\].*must be one of 'slack', 'email', 'wecom'"),
     ("people: {bob: {via: [email, wecom, email]}}", r"people\.bob\.via: names email twice"),
     ("notifications: {accounts: {vision: {via: [telegram]}}}", r"notifications\.accounts\.vision\.via\[0\]"),
     ("notifications: {accounts: {vision: {via: [teams, teams]}}}", r"notifications\.accounts\.vision\.via: names teams twice"),
     ("notifications: {accounts: {vision: {channels: [teams]}}}", r"notifications\.accounts\.vision.*channels"),
     ("notifications: {ticket: {actions: [cancel]}}", r"notifications\.ticket\.actions\[0\]"),
     ("notifications: {ticket: {conn: x}}", r"notifications\.ticket.*conn"),
     ("people: {bob: {wecom: U1}}", r"people\.bob.*wecom")],
    ids=["unknown-channel", "channel-twice", "unknown-team-channel", "team-channel-twice", "unknown-team-key",
         "ticket-not-a-notice", "unknown-ticket-key", "no-wecom-handle"],
)
def test_a_bad_route_names_the_key_and_where(tmp_path: Path, text: str, pattern: str) -> None:
    assert_policy_error(tmp_path / "policy.yaml", text, pattern)
