"""`gpu-cost demo` as a new user runs it, twice in the same week: the same summary, word for word (issue
39 row 2), the figures `gpu-cost report --since 7d` prints for the same store (row 4), and the next
commands it suggests work as printed.

The first run is the new user's, at the wall clock, from a fresh folder with nothing configured; the
second runs in the same folder as of another instant of the same week (``--at``, halfway between the
week's end and the first run). Both replay one day of history (``--days 1``: what varied between runs,
the DAGs reading the clock's minute and the week ending at the hour the demo ran, does not depend on
the history's length) and run every DAG of the demo through Airflow. The demo's week and Prophet's
seeding on the full two weeks are held by ``tests/unit/test_demo_summary.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_cost.sim.week import demo_instant

#: days of history each run replays (the demo's default is 14: the same code, a longer seeded week)
DAYS = "1"


def _demo(cwd: Path, env: dict[str, str], *args: str) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "gpu_cost.cli.main", "demo", "--days", DAYS, *args], cwd=cwd,
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    assert "[info" not in r.stdout + r.stderr and " INFO " not in r.stdout + r.stderr, "logs belong in the log file"
    return r.stdout.strip().splitlines()


@pytest.mark.e2e
@pytest.mark.slow  # two demos through Airflow, then the commands the summary suggests: a few minutes
def test_demo_as_a_new_user_runs_it_and_prints_the_same_summary_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`gpu-cost demo` from a fresh folder, nothing configured: a short summary with the value in GPU-hours
    and money, one simulated cluster for every DAG, the same summary again later in the week, and three
    next commands that work as printed."""
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.cli.main import main

    monkeypatch.delenv("GPU_COST_REPORT_DIR", raising=False)
    # as after `make demo`: gpu-cost is not on PATH, the summary names the one beside the interpreter
    env = {k: v for k, v in os.environ.items() if k not in ("AIRFLOW_CONN_GPU_COST_DB", "GPU_COST_DB")}
    env.update({"GPU_COST_HOME": str(tmp_path / "home")})
    started = time.time()
    lines = _demo(tmp_path, env)
    assert len(lines) <= 30, "\n".join(lines)
    assert "simulated cluster" in lines[0] and "mode dry-run" in lines[0], lines[0]
    value = next(line for line in lines if line.startswith("value"))
    assert "GPU-h" in value and "$" in value, value
    log = tmp_path / ".demo" / "demo.log"
    assert log.is_file() and "gpu_zombie_sweep" in log.read_text() and any(str(log) in line for line in lines)
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
    store.engine.dispose()
    # the report says the data is simulated and which mode produced the actions
    html = Path(next(line for line in lines if line.startswith("report")).split(None, 1)[1]).read_text()
    assert "Simulated data." in html and "dry-run" in html

    # the same week, seen from another instant of it (halfway between the week's end and the first
    # run, both in the past): the same summary, word for word
    end = demo_instant(started)
    again = _demo(tmp_path, env, "--at", str(int(end + (started - end) / 2)))
    assert again == lines, "\n".join(f"{a!r}\n{b!r}" for a, b in zip(lines, again, strict=False) if a != b)

    # the summary's figures are those `gpu-cost report --since 7d` prints for the same store
    assert main(["report", "--since", "7d", "--db", str(tmp_path / ".demo" / "audit.db"), "--json"]) == 0
    h = json.loads(capsys.readouterr().out)["headline"]
    assert f"would have freed {h['would_have_gpu_hours']:,.0f} GPU-h (${h['would_have_cost']:,.0f})" in value, (value, h)
    week = next(line for line in lines if line.startswith("week"))
    assert f"{h['idle_alloc_gpu_hours']:,.0f} GPU-h allocated but idle" in week, (week, h)

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
