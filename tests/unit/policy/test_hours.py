"""Working hours and holidays for notice rungs (``notifications.only_in_working_hours``)."""

from __future__ import annotations

import datetime as dt

import pytest

from gpu_cost.config.schema import NotificationConfig
from gpu_cost.decide.engine import in_working_hours, working_seconds
from tests.unit.policy.helpers import Effects, H, install, job_finding, policy_from, sweep_once

CFG = NotificationConfig(timezone="Europe/Berlin", working_hours="09:00-18:00", holidays=("2026-12-25",))


def ts(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


@pytest.mark.parametrize(("when", "inside"), [
    ("2026-12-01T10:00:00+01:00", True),    # Tuesday morning in Berlin
    ("2026-12-01T08:59:00+01:00", False),
    ("2026-12-01T18:00:00+01:00", False),   # the end is exclusive
    ("2026-12-05T11:00:00+01:00", False),   # Saturday
    ("2026-12-25T11:00:00+01:00", False),   # a holiday (Friday)
    ("2026-12-01T09:30:00+00:00", True),    # 10:30 in Berlin
], ids=["tue-10", "tue-0859", "tue-18", "sat", "holiday", "utc-input"])
def test_in_working_hours(when: str, inside: bool) -> None:
    assert in_working_hours(ts(when), CFG) is inside


def test_working_seconds_skip_nights_weekends_and_holidays() -> None:
    fri = ts("2026-12-04T17:30:00+01:00")
    mon = ts("2026-12-07T09:30:00+01:00")
    assert working_seconds(fri, mon, CFG) == pytest.approx(H)
    assert working_seconds(ts("2026-12-24T17:00:00+01:00"), ts("2026-12-28T10:00:00+01:00"), CFG) == pytest.approx(2 * H)
    assert working_seconds(mon, fri, CFG) == 0.0


def test_notice_rungs_wait_for_working_hours_destructive_rungs_do_not(store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    effects = Effects()
    install(monkeypatch, effects)
    policy = policy_from("mode: enforce\nnotifications: {only_in_working_hours: true, timezone: UTC}\n"
                         "rules: {idle_allocation: {ladder: [{action: notify}, {action: notify_manager, after: 1h}, "
                         "{action: cancel, after: 30m}]}}")
    sat = ts("2026-12-05T12:00:00+00:00")
    p = sweep_once(store, policy, [job_finding("1", now=sat)], sat)
    assert p.decisions == [] and p.waiting[0]["why"] == "outside working hours"
    mon9 = ts("2026-12-07T09:00:00+00:00")
    assert [d.action for d in sweep_once(store, policy, [job_finding("1", now=mon9)], mon9).decisions] == ["notify"]
    # an hour of working time later the manager rung is due
    m = ts("2026-12-07T10:00:00+00:00")
    assert [d.action for d in sweep_once(store, policy, [job_finding("1", now=m)], m).decisions] == ["notify_manager"]
    late = ts("2026-12-07T20:00:00+00:00")  # after hours: the destructive rung keeps wall-clock time
    assert [d.action for d in sweep_once(store, policy, [job_finding("1", now=late)], late).decisions] == ["cancel"]
    assert [a for a, _ in effects.calls] == ["notify", "notify_manager", "cancel"]
