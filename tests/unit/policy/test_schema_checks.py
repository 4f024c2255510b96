"""Contradictions and absurd values the types cannot catch: each names file, path and reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_cost.config.loader import parse_policy
from tests.unit.policy.helpers import assert_policy_error

BAD = [
    ("demote-after-kill", "rules: {idle_allocation: {ladder: [{action: kill}, {action: demote}]}}",
     r"rules\.idle_allocation\.ladder\[1\]: 'demote' after 'kill': the target is gone"),
    ("notify-after-terminate", "rules: {idle_allocation: {ladder: [{action: terminate}, {action: notify}]}}",
     r"ladder\[1\]: 'notify' after 'terminate': only kill or cancel"),
    ("rung-after-kill-process", "rules: {zombie: {ladder: [{action: kill_process}, {action: notify}]}}",
     r"rules\.zombie\.ladder\[1\]"),
    ("demote-does-nothing", "demote: {nice: 0}", r"demote: rules\.idle_allocation\.ladder has a demote rung"),
    ("low-eff-below-idle", "rules: {low_efficiency: {util_mean_max: 5}}",
     r"rules\.low_efficiency\.util_mean_max: 5% is not above"),
    ("share-zero-enforce", "mode: enforce\ncaps: {max_gpu_share: 0}", r"caps\.max_gpu_share: is 0 while mode is enforce"),
    ("manager-loop", "people: {a: {manager: b}, b: {manager: c}, c: {manager: a}}",
     r"people\.a\.manager: managers form a loop: a → b → c → a"),
    ("no-working-days", "notifications: {working_days: []}", r"notifications\.working_days: no working days"),
    ("dup-working-day", "notifications: {working_days: [mon, mon]}", r"notifications\.working_days: lists a day twice"),
    ("snooze-too-short", "snooze: {max_duration: 2m}", r"snooze\.max_duration: is shorter than sweep\.interval"),
    ("inference-everything", "inference: {name_patterns: ['*']}", r"inference\.name_patterns\[0\]: '\*' would declare every job"),
    ("dup-approver", "approval: {assigned_users: [ann, ann]}", r"approval\.assigned_users: lists a user twice"),
    ("approval-timeout-silly", "approval: {timeout: 10s}", r"approval\.timeout: must be ≥ 60"),
    ("on-timeout-approve", "approval: {on_timeout: approve}", r"approval\.on_timeout: must be one of 'reject'"),
    ("snooze-reason-zero", "snooze: {min_reason_chars: 0}", r"snooze\.min_reason_chars: must be ≥ 1"),
    ("parked-gone-before-the-answer", "approval: {timeout: 2d}\nsweep: {keep_parked: 2d}",
     r"sweep\.keep_parked: 2d is shorter than approval\.timeout \(2d\) plus an hour: a run awaiting an answer"),
    ("parked-kept-a-minute", "sweep: {keep_parked: 1m}", r"sweep\.keep_parked: must be ≥ 3600"),
]


@pytest.mark.parametrize(("text", "pattern"), [(t, p) for _, t, p in BAD], ids=[i for i, _, _ in BAD])
def test_contradictions_name_file_path_and_reason(tmp_path: Path, text: str, pattern: str) -> None:
    assert_policy_error(tmp_path / "p.yaml", text, pattern)


GOOD = [
    ("terminate-then-kill", "rules: {idle_allocation: {ladder: [{action: notify}, {action: terminate}, {action: kill, after: 5m}]}}"),
    ("demote-by-qos", "demote: {nice: 0, qos: preemptible}"),
    ("managers-chain", "people: {a: {manager: b}, b: {manager: c}}"),
    ("disabled-low-eff", "rules: {low_efficiency: {enabled: false, util_mean_max: 5}}"),
    ("share-zero-notify", "mode: notify\ncaps: {max_gpu_share: 0}"),
    ("parked-past-the-longest-wait", "approval: {timeout: 7d}\nsweep: {keep_parked: 7d 1h}"),
    ("every-protection-criterion", "protections: [{name: x, level: approval, match: {users: [a], accounts: [b], "
                                   "partitions: [c], qos: [d], name_patterns: ['e*'], labels: [f], nodes: ['g[0-9]']}}]"),
]


@pytest.mark.parametrize("text", [t for _, t in GOOD], ids=[i for i, _ in GOOD])
def test_sensible_policies_load(text: str) -> None:
    parse_policy(text, "<good>")


def test_manager_lookup() -> None:
    p = parse_policy("people: {alice: {manager: carol, slack: U1}}")
    assert p.manager_of("alice") == "carol" and p.manager_of("zed") is None and p.manager_of(None) is None
