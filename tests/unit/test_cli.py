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


@pytest.mark.e2e
@pytest.mark.slow
def test_demo_as_a_new_user_runs_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`gpu-cost demo` from a fresh folder, nothing configured: a short summary with the value in GPU-hours
    and money, one simulated cluster for every DAG, and three next commands that work as printed."""
    from pathlib import Path

    from gpu_cost.audit.store import AuditStore

    # as after `make demo`: gpu-cost is not on PATH, the summary names the one beside the interpreter
    env = {k: v for k, v in os.environ.items() if k not in ("AIRFLOW_CONN_GPU_COST_DB", "GPU_COST_DB")}
    env.update({"GPU_COST_HOME": str(tmp_path / "home")})
    r = subprocess.run([sys.executable, "-m", "gpu_cost.cli.main", "demo"], cwd=tmp_path, capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) <= 30, r.stdout
    assert "simulated cluster" in lines[0] and "mode dry-run" in lines[0], lines[0]
    assert "[info" not in r.stdout + r.stderr and " INFO " not in r.stdout + r.stderr, "logs belong in the log file"
    value = next(line for line in lines if line.startswith("value"))
    assert "GPU-h" in value and "$" in value, value
    log = tmp_path / ".demo" / "demo.log"
    assert log.is_file() and "gpu_zombie_sweep" in log.read_text() and str(log) in r.stdout
    # one cluster: the DAGs read the demo's scenario file, and the report's week holds the sweep's run
    store = AuditStore(f"sqlite:///{tmp_path / '.demo' / 'audit.db'}")
    runs = store.query("SELECT dag_id, source FROM gpu_cost_runs")
    assert {"gpu_zombie_sweep", "gpu_offhours_power", "gpu-cost-seed"} <= {x["dag_id"] for x in runs}
    assert all(str(x["source"]).startswith("sim") for x in runs), runs
    sweep = store.query("SELECT run_id FROM gpu_cost_runs WHERE dag_id = 'gpu_zombie_sweep'")[0]["run_id"]
    assert sweep.startswith("gpu_zombie_sweep:"), sweep
    rules = {d["rule"] for d in store.query("SELECT DISTINCT rule FROM gpu_cost_decisions")}
    assert {"zombie", "idle_allocation", "low_efficiency"} <= rules
    seen_nodes = {x["host"] for x in store.query("SELECT DISTINCT host FROM gpu_cost_usage")}
    assert {"gpu01", "gpu02", "gpu03"} <= seen_nodes and any(h.startswith("n0") for h in seen_nodes)
    # the report says the data is simulated and which mode produced the actions
    html = Path(next(line for line in lines if line.startswith("report")).split(None, 1)[1]).read_text()
    assert "Simulated data." in html and "dry-run" in html
    # the three suggested commands, run as printed from the same folder
    i = lines.index("next")
    commands = [line.strip() for line in lines[i + 1:] if line.startswith("  ") and "gpu-cost " in line]
    assert len(commands) == 3, lines[i:]
    for cmd in commands:
        c = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
        assert c.returncode == 0, (cmd, c.stdout[-2000:], c.stderr[-2000:])
        if " audit --job" in cmd:
            assert "decision(s) for job" in c.stdout, c.stdout
            assert c.stdout.splitlines()[-1].endswith(f"(project file {tmp_path / 'gpu-cost.toml'})"), c.stdout
        if "replay" in cmd:
            assert "false kills" in c.stdout, c.stdout
    # the demo named its store in the folder's project file: a read elsewhere (power plan) creates no
    # other store, and the job the summary names is still found (issue 39)
    assert (tmp_path / "gpu-cost.toml").read_text().endswith('[store]\ndb = ".demo/audit.db"\n')
    exe = Path(sys.executable).with_name("gpu-cost")
    plan = subprocess.run([str(exe), "power", "plan"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert plan.returncode == 0 and not (tmp_path / "home" / "audit.db").exists(), plan.stderr[-2000:]
    job = next(cmd for cmd in commands if " audit --job" in cmd).split("--job ")[1].split()[0]
    eta = subprocess.run([str(exe), "forecast", "eta", "--job", job], cwd=tmp_path, capture_output=True, text=True,
                         env=env, timeout=300)
    assert eta.returncode == 0 and f"job {job}" in eta.stdout, eta.stderr[-2000:]
