"""A key given twice in one mapping is an error naming the file and both lines, never "last one wins"."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_cost.config.loader import parse_policy
from tests.unit.policy.helpers import assert_policy_error

DUPLICATES = [
    ("top-level-mode", "version: 1\nmode: dry-run\nsweep: {interval: 5m}\nmode: enforce\n",
     r"line 4: duplicate key 'mode' \(first at line 2\)$"),
    ("second-protections-list", "protections:\n  - name: a\n    match: {users: [ann]}\nprotections: []\n",
     r"line 4: duplicate key 'protections' \(first at line 1\)$"),
    ("nested-mapping", "rules:\n  zombie:\n    window: 15m\n    util_max: 5\n    window: 1m\n",
     r"line 5: duplicate key 'rules\.zombie\.window' \(first at line 3\)$"),
    ("flow-mapping", "caps: {max_actions_per_run: 5, max_actions_per_run: 500}\n",
     r"line 1: duplicate key 'caps\.max_actions_per_run' \(first at line 1\)$"),
    ("inside-a-list-item", "protections:\n  - name: a\n    match: {users: [ann]}\n  - name: b\n    match: {users: [bob]}\n"
                           "    match: {users: ['*']}\n",
     r"line 6: duplicate key 'protections\[1\]\.match' \(first at line 5\)$"),
    ("quoted-and-plain", "mode: dry-run\n\"mode\": enforce\n", r"line 2: duplicate key 'mode' \(first at line 1\)$"),
    ("earliest-of-several", "mode: dry-run\nrules:\n  zombie: {window: 15m, window: 1m}\nmode: enforce\n",
     r"line 3: duplicate key 'rules\.zombie\.window' \(first at line 3\)$"),
]


@pytest.mark.parametrize(("text", "pattern"), [(t, p) for _, t, p in DUPLICATES], ids=[i for i, _, _ in DUPLICATES])
def test_duplicate_key_names_file_and_both_lines(tmp_path: Path, text: str, pattern: str) -> None:
    assert_policy_error(tmp_path / "policy.yaml", text, pattern)


def test_same_key_in_different_mappings_is_fine() -> None:
    policy = parse_policy("rules:\n  zombie: {window: 15m}\n  idle_allocation: {window: 30m}\n")
    assert policy.rules.zombie.window == 900 and policy.rules.idle_allocation.window == 1800


def test_a_merge_key_may_override() -> None:
    text = "rules:\n  zombie: &z {window: 15m, util_max: 5}\n  idle_allocation:\n    <<: *z\n    window: 30m\n"
    assert parse_policy(text).rules.idle_allocation.window == 1800


def test_policy_check_prints_the_duplicate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_cost.cli.main import main

    path = tmp_path / "policy.yaml"
    path.write_text("version: 1\nmode: dry-run\ncaps: {max_actions_per_run: 5}\nmode: enforce\n")
    assert main(["policy", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: line 4: duplicate key 'mode' (first at line 2)" in err
