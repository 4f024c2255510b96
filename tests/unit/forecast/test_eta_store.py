"""``gpu-cost forecast eta --job ID`` without ``--jobs``: the job is looked up where the agent saw it.

As an operator runs it: two sweeps of a simulated cluster (two hours apart) write the agent's
per-sweep job rows into a fresh audit store, the nightly forecast (``--source sim``, the same
generated cluster the sweeps looked at) writes the per-job and per-class end-time forecasts, and
``forecast eta`` answers from them. A job the first sweep saw and the second did not has ended
(at its last sighting, as the nightly's history reads the same rows). ``--source sim`` looks the
job up in the shipped scenario instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_cost.core.timeutil import epoch

pytestmark = pytest.mark.slow  # CLI sweeps and a nightly forecast in subprocesses: 5-45 s

AT = "2025-01-15T12:00:00Z"
EARLIER = "2025-01-15T10:00:00Z"
#: the cluster the nightly forecast generates from ``--source sim`` (16 nodes, seed 0, the policy's
#: 21 days of history), pinned to ``AT`` so that the sweeps see the very same jobs
SCENARIO = f"anchor: {AT}\nseed: 0\ngenerate: {{nodes: 16, days: 21}}\n"


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_cost.cli.main", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one JSON line on stdout, got: {proc.stdout[:800]} / {proc.stderr[-800:]}"
    return json.loads(lines[0])  # type: ignore[no-any-return]


def _ok(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = _run(env, *args, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return _json(proc)


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A store filled by two CLI sweeps and one CLI nightly run; the job rows it holds."""
    from gpu_cost.audit.store import AuditStore

    d = tmp_path_factory.mktemp("eta-store")
    db = d / "audit.db"
    scenario = d / "cluster.yaml"
    scenario.write_text(SCENARIO, encoding="utf-8")
    env = {"AIRFLOW_CONN_GPU_COST_DB": json.dumps({"conn_type": "sqlite", "host": str(db)})}
    for at in (EARLIER, AT):
        out = _ok(env, "sweep", "--scenario", str(scenario), "--at", at)
        assert out["source"] == "sim" and out["jobs"] > 0
    nightly = _ok(env, "forecast", "nightly", "--source", "sim", "--at", AT)
    assert nightly["runtime"]["running_jobs"] > 0
    store = AuditStore(f"sqlite:///{db}")
    rows = store.query("SELECT job_id, ts, start_ts, time_limit_s FROM gpu_cost_jobs_usage ORDER BY ts, job_id")
    last: dict[str, dict[str, Any]] = {}
    for r in rows:
        last[str(r["job_id"])] = r
    running = sorted(j for j, r in last.items() if r["ts"] == epoch(AT))
    ended = sorted(j for j, r in last.items() if r["ts"] == epoch(EARLIER))
    assert running and ended, f"the two sweeps should see jobs running and jobs gone: {last}"
    return {"env": env, "db": db, "last": last, "running": running, "ended": ended}


def test_eta_of_a_running_job_from_the_store(swept: dict[str, Any]) -> None:
    jid = swept["running"][0]
    row = swept["last"][jid]
    start, limit = float(row["start_ts"]), float(row["time_limit_s"])
    eta = _ok(swept["env"], "forecast", "eta", "--job", jid, "--at", AT)
    assert eta["job_id"] == jid and eta["ended"] is False
    assert start <= eta["p50_end"] <= eta["p90_end"] <= start + limit, eta
    assert eta["limit_end"] == pytest.approx(start + limit)
    assert eta["basis"].startswith("job forecast"), eta["basis"]
    assert eta["p50_in_s"] == round(eta["p50_end"] - epoch(AT))
    # the human answer says the same
    proc = _run(swept["env"], "forecast", "eta", "--job", jid, "--at", AT)
    assert proc.returncode == 0 and f"job {jid}: likely ends" in proc.stdout and "job forecast" in proc.stdout


def test_every_running_job_in_the_store_has_an_answer(swept: dict[str, Any]) -> None:
    """The store's running jobs are the nightly's running jobs: each has its own stored forecast."""
    from gpu_cost.audit.store import AuditStore

    store = AuditStore(f"sqlite:///{swept['db']}")
    own = {str(r["series"]).removeprefix("runtime:job:")
           for r in store.query("SELECT series FROM gpu_cost_forecasts WHERE series LIKE 'runtime:job:%'")}
    assert set(swept["running"]) <= own, set(swept["running"]) - own
    jid = swept["running"][-1]
    eta = _ok(swept["env"], "forecast", "eta", "--job", jid, "--at", AT)
    assert eta["job_id"] == jid and not eta["ended"] and eta["p50_end"] <= eta["p90_end"] <= eta["limit_end"]


def test_a_job_gone_from_the_last_sweep_has_ended(swept: dict[str, Any]) -> None:
    jid = swept["ended"][0]
    eta = _ok(swept["env"], "forecast", "eta", "--job", jid, "--at", AT)
    store = eta.pop("store")  # every command names the store it read, run as `python -m` too
    assert eta == {"job_id": jid, "ended": True, "end_ts": epoch(EARLIER)}
    assert store["origin"] == "connection" and store["url"].endswith("audit.db")
    proc = _run(swept["env"], "forecast", "eta", "--job", jid, "--at", AT)
    assert proc.returncode == 0 and f"job {jid} already ended at {EARLIER}" in proc.stdout


def test_an_unknown_job_is_a_clear_error(swept: dict[str, Any]) -> None:
    proc = _run(swept["env"], "forecast", "eta", "--job", "4242424", "--at", AT, "--json")
    assert proc.returncode == 2
    err = _json(proc)["error"]
    assert "4242424" in err and "audit store" in err
    # without --json the error goes to stderr, naming the job too
    proc = _run(swept["env"], "forecast", "eta", "--job", "4242424", "--at", AT)
    assert proc.returncode == 2 and "4242424" in proc.stderr


def test_source_sim_looks_the_job_up_in_the_shipped_scenario(tmp_path: Path) -> None:
    """``--source sim``: job 1002 of the shipped scenario ended an hour before its day's anchor."""
    env = {"AIRFLOW_CONN_GPU_COST_DB": json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "audit.db")})}
    eta = _ok(env, "forecast", "eta", "--job", "1002", "--source", "sim", "--at", AT)
    assert eta["ended"] is True and eta["job_id"] == "1002" and eta["end_ts"] <= epoch(AT)
    proc = _run(env, "forecast", "eta", "--job", "4242424", "--source", "sim", "--at", AT, "--json")
    assert proc.returncode == 2 and "4242424" in _json(proc)["error"] and "simulated" in _json(proc)["error"]


def test_the_nightly_forecasts_the_shipped_scenarios_running_jobs(tmp_path: Path) -> None:
    """On the embedded default the sweep watches the shipped scenario: after a sim nightly and a sweep
    at the same instant, each of its running jobs (e.g. 1003, idle for hours) has its own end forecast,
    and ``forecast eta`` answers from the agent's job rows, within the job's start and time limit."""
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.sim.cluster import SimCluster, load_scenario

    db = tmp_path / "audit.db"
    env = {"AIRFLOW_CONN_GPU_COST_DB": json.dumps({"conn_type": "sqlite", "host": str(db)})}
    assert _ok(env, "sweep", "--at", AT)["source"] == "sim"
    _ok(env, "forecast", "nightly", "--source", "sim", "--at", AT)
    running = {j.job_id: j for j in SimCluster(load_scenario(), epoch(AT)).jobs_at(epoch(AT))
               if j.start_ts is not None}
    assert "1003" in running
    own = {str(r["series"]).removeprefix("runtime:job:") for r in AuditStore(f"sqlite:///{db}").query(
        "SELECT series FROM gpu_cost_forecasts WHERE series LIKE 'runtime:job:%'")}
    assert set(running) <= own, set(running) - own
    eta = _ok(env, "forecast", "eta", "--job", "1003", "--at", AT)
    job = running["1003"]
    assert eta["job_id"] == "1003" and eta["ended"] is False and eta["basis"].startswith("job forecast"), eta
    assert epoch(AT) <= eta["p50_end"] <= eta["p90_end"] <= job.start_ts + job.time_limit_s
