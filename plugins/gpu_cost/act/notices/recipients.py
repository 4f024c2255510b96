"""Whom a notice reaches, and on which channels.

The owner of the decision's target, plus the owner's manager for ``notify_manager``, from the
policy's ``people``. Each person's channels (``via``) are their own (``people.<user>.via``), else
their team's (``notifications.accounts.<account>.via``, a team being a Slurm account), else the
default: Slack, then e-mail (``notifications.email_fallback``).

Policy example::

    people:
      alice: {slack: U012ABCDEF, email: alice@example.org, manager: carol}
      bob: {via: [wecom, email], email: bob@example.org}
      carol: {via: [dingtalk], dingtalk: "+86-13800000000"}
    notifications:
      accounts:
        vision: {via: [feishu, email]}
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_cost.config.schema import Person, Policy
from gpu_cost.core.model import Decision


@dataclass(frozen=True)
class Recipient:
    """One person to reach: a policy user name, their handle on each channel (any may be absent),
    and the channels that reach them (empty: the default, Slack then e-mail)."""

    user: str
    role: str  # owner | manager | administrator
    slack: str | None = None
    email: str | None = None
    dingtalk: str | None = None
    feishu: str | None = None
    teams: str | None = None
    via: tuple[str, ...] = ()

    def handle(self, channel: str) -> str | None:
        """Return the person's id on ``channel`` (who a group post mentions), or None."""
        value = getattr(self, channel, None) if channel in _HANDLES else None
        return value if isinstance(value, str) and value else None


#: the channels on which a person has a handle of their own (WeCom's robot, as Apprise drives it, mentions nobody)
_HANDLES = ("slack", "email", "dingtalk", "feishu", "teams")


def _recipient(user: str, role: str, person: Person, account: str | None, policy: Policy) -> Recipient:
    team = policy.notifications.accounts.get(account or "")
    via = person.via or (team.via if team is not None else ())
    return Recipient(user, role, person.slack, person.email, person.dingtalk, person.feishu, person.teams, tuple(via))


def recipients(d: Decision, policy: Policy) -> list[Recipient]:
    """Return the owner, plus the manager for ``notify_manager``, from ``policy.people``.

    Someone else's idle reservation (``rules.idle_reservation.administrators``, carried in the
    decision's evidence) goes to those administrators instead, then to its owner when
    ``people`` knows them.
    """
    admins = [str(a) for a in d.evidence.get("administrators") or () if a]
    if admins:
        out = [_recipient(a, "administrator", policy.people.get(a, Person()), None, policy) for a in admins]
        if d.user and d.user in policy.people and d.user not in admins:
            out.append(_recipient(d.user, "owner", policy.people[d.user], d.account, policy))
        return out
    user = d.user or ""
    person = policy.people.get(user, Person()) if user else Person()
    out = [_recipient(user or "(unknown owner)", "owner", person, d.account, policy)]
    if d.action == "notify_manager" and person.manager:
        boss = policy.people.get(person.manager, Person())
        out.append(_recipient(person.manager, "manager", boss, d.account, policy))
    return out


__all__ = ["Recipient", "recipients"]
