from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpu_cost.config.loader import load_policy, parse_policy
from gpu_cost.config.schema import Policy
from gpu_cost.core.errors import PolicyError
from tests.fixtures.core import ROOT
from tests.unit.policy.helpers import assert_policy_error


def test_shipped_policies_load_and_are_inert() -> None:
    for path in sorted((ROOT / "include" / "policy").glob("*.yaml")):
        policy = load_policy(path)
        assert policy.mode == "dry-run", f"{path.name} must ship in dry-run"
        assert policy.source == str(path)


def test_defaults_are_frozen() -> None:
    p = Policy()
    with pytest.raises(AttributeError):
        p.mode = "enforce"  # type: ignore[misc]


def test_durations_and_dash_keys() -> None:
    p = parse_policy("sweep: {interval: 10m, lookback: 2h, max-staleness: 90s}\nrules: {zombie: {window: 1h30m}}")
    assert p.sweep.interval == 600
    assert p.sweep.max_staleness == 90
    assert p.rules.zombie.window == 5400


def test_rule_mode_is_never_stronger_than_global() -> None:
    p = parse_policy("mode: notify\nrules: {zombie: {mode: enforce}, idle_allocation: {mode: dry-run}}")
    assert p.rule_mode("zombie") == "notify"
    assert p.rule_mode("idle_allocation") == "dry-run"
    assert p.rule_mode("low_efficiency") == "notify"


BAD = [
    ("typo", "rules: {zombie: {util_mx: 3}}", r"rules\.zombie\.util_mx: unknown key \(did you mean 'util_max'\?\)"),
    ("wrong-type", "caps: {max_actions_per_run: many}", r"caps\.max_actions_per_run: must be an integer"),
    ("bool-as-int", "caps: {max_actions_per_run: true}", r"caps\.max_actions_per_run: must be an integer"),
    ("out-of-range", "rules: {zombie: {util_max: 300}}", r"rules\.zombie\.util_max: must be ≤ 100"),
    ("bad-duration", "sweep: {interval: soon}", r"sweep\.interval: not a duration"),
    ("bad-mode", "mode: yolo", r"mode: must be one of"),
    ("unknown-section", "rulez: {}", r"rulez: unknown key \(did you mean 'rules'\?\)"),
    ("empty-protection", "protections: [{name: x, level: never}]", r"protections\[0\]\.match: matches nothing"),
    ("bad-level", "protections: [{name: x, level: sometimes, match: {users: [a]}}]", r"protections\[0\]\.level"),
    ("dup-protection", "protections: [{name: x, level: never, match: {users: [a]}}, {name: x, level: never, match: {users: [b]}}]",
     r"protections\[1\]\.name: duplicate"),
    ("zombie-cannot-cancel", "rules: {zombie: {ladder: [{action: cancel}]}}", r"rules\.zombie\.ladder\[0\]\.action: 'cancel' is not possible"),
    ("kill-before-term", "rules: {idle_allocation: {ladder: [{action: kill}, {action: terminate}]}}", r"SIGKILL before SIGTERM"),
    ("idle-above-busy", "rules: {idle_allocation: {util_max: 30}}", r"rules\.idle_allocation\.util_max: idle threshold 30% is not below"),
    ("window-too-short", "rules: {zombie: {window: 90s}}", r"rules\.zombie\.window: 90s holds fewer than two samples"),
    ("enforce-without-actions", "mode: enforce\ncaps: {max_actions_per_run: 0}", r"caps\.max_actions_per_run: is 0 while mode is enforce"),
    ("bad-tz", "notifications: {timezone: Mars/Olympus}", r"notifications\.timezone: unknown time zone"),
    ("bad-hours", "notifications: {working_hours: '18:00-09:00'}", r"start must be before end"),
    ("bad-holiday", "notifications: {holidays: [christmas]}", r"notifications\.holidays\[0\]: not a date"),
    ("bad-window", "offhours: {windows: [{start: '25:00', end: '08:00'}]}", r"offhours\.windows\[0\]\.start"),
    ("nan", "caps: {max_gpu_share: .nan}", r"caps\.max_gpu_share: must be a finite number"),
    ("not-a-mapping", "- a\n- b", r"\(top\): must be a mapping"),
    ("yaml-syntax", "rules: {zombie: [", r"line \d+, column \d+: not valid YAML"),
    ("self-manager", "people: {alice: {manager: alice}}", r"people\.alice\.manager"),
]


@pytest.mark.parametrize(("text", "pattern"), [(t, p) for _, t, p in BAD], ids=[i for i, _, _ in BAD])
def test_bad_policy_names_file_path_and_reason(tmp_path: Path, text: str, pattern: str) -> None:
    assert_policy_error(tmp_path / "bad.yaml", text, pattern)


def test_missing_file() -> None:
    with pytest.raises(PolicyError, match="file not found"):
        load_policy("/nonexistent/policy.yaml")


def test_cli_policy_check(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("rules: {zombie: {util_max: -1}}\n")
    r = subprocess.run([sys.executable, "-m", "gpu_cost.cli.main", "policy", "check", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2
    assert f"{bad}: rules.zombie.util_max: must be ≥ 0" in r.stderr
    good = ROOT / "include" / "policy" / "default.yaml"
    r = subprocess.run([sys.executable, "-m", "gpu_cost.cli.main", "policy", "check", str(good), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    import json

    out = json.loads(r.stdout)
    assert out["ok"] is True and out["mode"] == "dry-run"
