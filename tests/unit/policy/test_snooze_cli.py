"""``gpu-cost snooze``: validation, the audit rows, ``--list``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_cost.decide.snooze import SnoozeError, normalise_target, snooze
from tests.fixtures.core import NOW, ROOT


@pytest.mark.parametrize(("raw", "key"), [("123", "job:123"), ("123_4", "job:123_4"), ("job:9", "job:9"),
                                          ("user:alice", "user:alice"), ("proc:g1:42:1700000000", "proc:g1:42:1700000000"),
                                          ("node:gpu01", "node:gpu01")])
def test_targets(raw: str, key: str) -> None:
    assert normalise_target(raw) == key


@pytest.mark.parametrize(("target", "until", "reason", "match"), [
    ("alice", NOW + 3600, "a good reason", "use job:<id>"),
    ("job:1", NOW + 3600, "short", "at least 8 characters"),
    ("job:1", NOW - 1, "a good reason", "not in the future"),
    ("job:1", NOW + 30 * 86400, "a good reason", "longer than snooze.max_duration=14d"),
], ids=["bad-target", "short-reason", "past", "too-long"])
def test_bad_snoozes_are_refused(store, target, until, reason, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SnoozeError, match=match):
        snooze(store, target, until, reason, "alice", now=NOW)
    assert store.active_snoozes(NOW) == []


@pytest.mark.slow  # a CLI or bench subprocess: more than ~5 s
def test_cli_snooze_and_list(tmp_path: Path) -> None:
    env = {**__import__("os").environ,
           "AIRFLOW_CONN_GPU_COST_DB": json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "a.db")})}
    cmd = [sys.executable, "-m", "gpu_cost.cli.main", "snooze"]
    r = subprocess.run([*cmd, "--target", "4242", "--for", "4h", "--reason", "eval rerun tomorrow", "--by", "bob",
                        "--json"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["target"] == "job:4242" and out["by"] == "bob"
    listed = json.loads(subprocess.run([*cmd, "--list", "--json"], capture_output=True, text=True, env=env,
                                       cwd=ROOT).stdout)
    (item,) = listed["snoozes"]
    assert item["reason"] == "eval rerun tomorrow" and item["target"] == "job:4242"
    until = time.mktime(time.strptime(item["until"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    assert 3.9 * 3600 < until - time.time() <= 4 * 3600
    bad = subprocess.run([*cmd, "--target", "job:1", "--for", "4h", "--json"], capture_output=True, text=True,
                         env=env, cwd=ROOT)
    assert bad.returncode == 2 and "--reason" in json.loads(bad.stdout)["error"]
