"""The CLI contract: --json prints exactly one JSON object on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def run_cli(*args: str, env_extra: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "gpu_cost.cli.main", *args], capture_output=True, text=True, env=env, timeout=timeout)


def one_json(stdout: str) -> dict:  # type: ignore[type-arg]
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one JSON line on stdout, got: {stdout[:500]}"
    return json.loads(lines[0])


@pytest.mark.slow  # a CLI or bench subprocess: more than ~5 s
def test_sweep_sim_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {"AIRFLOW_CONN_GPU_COST_DB": json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "a.db")})}
    r = run_cli("sweep", "--source", "sim", "--json", "--at", "2026-11-30T14:00:00Z", env_extra=env)
    assert r.returncode == 0, r.stderr
    out = one_json(r.stdout)
    rules = {d["rule"] for d in out["decisions"]}
    assert {"zombie", "idle_allocation", "low_efficiency"} <= rules
    assert all(d["mode"] == "dry-run" for d in out["decisions"])
    assert out["audit_db"] == str(tmp_path / "a.db")
    # a second sweep at the same instant decides nothing new: the ladder waits
    r2 = run_cli("sweep", "--source", "sim", "--json", "--at", "2026-11-30T14:00:00Z", env_extra=env)
    assert one_json(r2.stdout)["decisions"] == []


def test_error_is_json_too(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("sweep", "--json", "--policy", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2
    assert "file not found" in one_json(r.stdout)["error"]
