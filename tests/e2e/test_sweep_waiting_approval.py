"""A sweep run waiting for a human does not hold up the sweep (real scheduler, api-server, dag-processor).

Its own Airflow deployment runs ``gpu_zombie_sweep`` alone, unpaused, with an enforce-mode policy on
the simulated cluster (manual triggers only: ``GPU_COST_SWEEP_SCHEDULE=none``): carol's idle job 1003 is to be demoted (2 GPUs x hours of work at risk: needs
approval), bob's zombie process gets a notice, then a second notice one rung later. The first run
asks about the demotion and waits. While it waits, a second run (triggered over REST) must start,
act on what is due (the zombie's second notice), not ask about the demotion again, and finish; the
first run's audit row says ``awaiting_approval`` meanwhile. Then a Reject over REST ends the first
run, nothing demoted.

The same deployment then runs the nightly forecast (``gpu_forecast_nightly``, mapped fits). Healthy
runs log no ERROR: neither the scheduler (whose log also holds what the task supervisors log, such
as a failed XCom read) nor the dag-processor nor any task of these runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from gpu_cost.audit.store import AuditStore
from tests.fixtures.airflow_server import AirflowServer, deployment
from tests.fixtures.core import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.timeout(600)]

DAG_ID = "gpu_zombie_sweep"
FORECAST_ID = "gpu_forecast_nightly"
POLICY = """
mode: enforce
approval: {gpu_hours_at_risk: 1, timeout: 20m}
caps: {max_actions_per_run: 20, max_gpu_share: 0.5}
rules:
  idle_allocation: {ladder: [{action: demote}]}
  zombie: {ladder: [{action: notify}, {action: notify, after: 1s}]}
  low_efficiency: {ladder: [{action: advise}]}
"""


@pytest.fixture(scope="module")
def server(session_tmp: Path, _slack_server: Any) -> Iterator[AirflowServer]:
    home = session_tmp / "sweep-airflow"
    home.mkdir(parents=True, exist_ok=True)
    policy = home / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    # the nightly's policy (a policy of the deployment's directory, the default policy's folder): a small history
    nightly = yaml.safe_load((ROOT / "include" / "policy" / "default.yaml").read_text())
    nightly["forecast"].update({"series_per_task": 2, "sim_days": 15, "history": "15d"})
    (home / "nightly.yaml").write_text(yaml.safe_dump(nightly), encoding="utf-8")
    # the default cluster pinned to the minute this deployment starts: its runs, minutes apart, see one cluster
    # whose ladders advance even when they straddle 00:00 UTC (where the default anchor, the start of the UTC
    # day, moves and the zombie's episode starts over)
    scenario = home / "scenario.yaml"
    pinned = datetime.fromtimestamp(time.time() // 60 * 60, tz=UTC).isoformat()
    scenario.write_text((ROOT / "include" / "scenarios" / "default.yaml").read_text()
                        .replace("seed: 7", f"seed: 7\nanchor: {pinned}", 1), encoding="utf-8")
    with deployment(home, (f"{DAG_ID}.py", f"{FORECAST_ID}.py"), _slack_server.webhook_url("/services/T0/B0/SWEEPSECRET"),
                    {"GPU_COST_POLICY": str(policy), "GPU_COST_SCENARIO": str(scenario),
                     "GPU_COST_APPROVAL_NOTIFY": "0", "GPU_COST_SWEEP_SCHEDULE": "none"}) as s:
        yield s


def _runs(server: AirflowServer) -> list[dict[str, Any]]:
    return server.api(f"/api/v2/dags/{DAG_ID}/dagRuns?order_by=run_after&limit=50")["dag_runs"]  # type: ignore[no-any-return]


def _waiting_run(server: AirflowServer) -> str | None:
    """Return the run whose ``approve`` task waits for a human, if any."""
    for run in _runs(server):
        if run["state"] == "running" and server.task_state(DAG_ID, run["dag_run_id"], "approve") in (
                "awaiting_input", "deferred"):
            return str(run["dag_run_id"])
    return None


def _pending_requests(server: AirflowServer) -> list[dict[str, Any]]:
    details = server.api(f"/api/v2/dags/{DAG_ID}/dagRuns/~/hitlDetails")["hitl_details"]
    return [d for d in details if d.get("response_received") is False or d.get("responded_at") is None]


def _trigger(server: AirflowServer) -> str:
    return str(server.api(f"/api/v2/dags/{DAG_ID}/dagRuns", "POST", {"logical_date": None, "conf": {}})["dag_run_id"])


def test_a_run_waiting_for_approval_does_not_hold_up_the_next(server: AirflowServer) -> None:
    store = AuditStore(server.audit_url)
    assert _runs(server) == []  # no schedule: only the runs this test triggers
    first = _trigger(server)
    assert server.wait_for(lambda: _waiting_run(server), "the first run to ask for approval", timeout=240) == first
    asked = store.decisions_of_run(f"{DAG_ID}:{first}")
    demote = [d for d in asked if d["action"] == "demote"]
    assert [d["job_id"] for d in demote] == ["1003"] and demote[0]["approval_status"] == "pending", asked
    assert store.get_run(f"{DAG_ID}:{first}")["status"] == "awaiting_approval"

    # a second run, while the first still waits, on data at least one sample later
    data_ts = float(store.get_run(f"{DAG_ID}:{first}")["data_ts"])
    time.sleep(max(0.0, data_ts + 61 - time.time()))
    second = _trigger(server)
    server.wait_for(lambda: server.dag_run(DAG_ID, second)["state"] in ("success", "failed"),
                    "the second run to finish while the first waits", timeout=300)
    assert server.dag_run(DAG_ID, second)["state"] == "success", server.logs_tail()
    assert server.dag_run(DAG_ID, first)["state"] == "running"
    assert server.task_state(DAG_ID, second, "approve") == "skipped"  # nothing new to ask
    run2 = store.get_run(f"{DAG_ID}:{second}")
    assert run2["status"] == "ok", run2
    mine = store.decisions_of_run(f"{DAG_ID}:{second}")
    assert not [d for d in mine if d["action"] == "demote"], mine  # not asked again
    notices = [d for d in mine if d["rule"] == "zombie" and d["rung"] == 1]
    assert notices and all(d["status"] == "acted" for d in notices), mine  # the second run acted
    assert len(_pending_requests(server)) == 1

    # the answer ends the first run: rejected, nothing demoted
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(first, safe='')}/taskInstances/approve/-1/hitlDetails"
    server.api(path, "PATCH", {"chosen_options": ["Reject"], "params_input": {}})
    server.wait_for(lambda: server.dag_run(DAG_ID, first)["state"] in ("success", "failed"),
                    "the first run to finish after the answer", timeout=180)
    assert server.dag_run(DAG_ID, first)["state"] == "success", server.logs_tail()
    row = store.get_decision(demote[0]["decision_id"])
    assert row is not None and row["approval_status"] == "rejected" and row["approved_by"] == "admin"
    assert store.query("SELECT * FROM gpu_cost_actions WHERE decision_id = :d",
                       {"d": demote[0]["decision_id"]}) == []
    assert store.get_run(f"{DAG_ID}:{first}")["status"] == "ok"
    assert json.loads(store.get_run(f"{DAG_ID}:{first}")["counts"])["approval"] == "rejected"
    # nothing went wrong, and nothing says so: no ERROR from the scheduler, the dag-processor or a sweep task
    errors = server.error_lines(DAG_ID)
    assert not errors, "\n".join(errors)


def test_a_nightly_forecast_run_logs_no_error(server: AirflowServer) -> None:
    run = str(server.api(f"/api/v2/dags/{FORECAST_ID}/dagRuns", "POST",
                         {"logical_date": None, "conf": {"policy": "nightly", "source": "sim"}})["dag_run_id"])
    state = server.wait_for(lambda: server.dag_run(FORECAST_ID, run)["state"] in ("success", "failed")
                            and server.dag_run(FORECAST_ID, run)["state"], "the forecast run to finish", timeout=300,
                            every=2.0)
    assert state == "success", server.logs_tail()
    tis = server.api(f"/api/v2/dags/{FORECAST_ID}/dagRuns/{quote(run, safe='')}/taskInstances?limit=100")
    fits = [ti for ti in tis["task_instances"] if ti["task_id"] == "fit_demand"]
    assert len(fits) >= 2 and all(ti["state"] == "success" for ti in fits), fits  # really mapped
    # the scheduler's whole log (the sweeps' runs too when this module ran them) and the nightly's tasks
    errors = server.error_lines(FORECAST_ID)
    assert not errors, "\n".join(errors)
