"""``gpu_policy_tune`` runs through Airflow (``dag.test()``) on an audit store seeded by simulated sweeps.

The trace is rebuilt from the store's usage rows; the run replays the policy and the candidates of
a small search space of the deployment's tune folder and writes its report (table, Pareto plot,
the proposed policy) under the report root; the running policy file is never touched.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pendulum
import pytest

from gpu_cost.core import paths
from tests.fixtures.airflow_db import fresh_dag

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

DAG_ID = "gpu_policy_tune"
WHEN = pendulum.datetime(2026, 11, 30, 12, 0, tz="UTC")
SPACE = "rules.idle_allocation.window: [15m, 30m]\nrules.zombie.ladder[1].after: [5m, 15m]\n"


def _policy(folder: Path) -> str:
    """Write the shipped policy with a 15-minute sweep (a third of the replayed sweeps: a short test); return its name."""
    import yaml

    data = yaml.safe_load(paths.default_policy().read_text())
    data["sweep"]["interval"] = "15m"
    folder.mkdir()
    (folder / "fast.yaml").write_text(yaml.safe_dump(data))
    return "fast"


def test_tune_dag_replays_candidates_on_the_usage_rows_and_writes_its_report(  # type: ignore[no-untyped-def]
        airflow_db, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.config.loader import load_policy
    from gpu_cost.sim.week import seed_week

    db = tmp_path / "audit.db"
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB", json.dumps({"conn_type": "sqlite", "host": str(db)}))
    monkeypatch.setenv("GPU_COST_REPORT_DIR", str(tmp_path / "reports"))
    spaces = tmp_path / "spaces"
    spaces.mkdir()
    (spaces / "small.yaml").write_text(SPACE)
    monkeypatch.setenv("GPU_COST_TUNE_DIR", str(spaces))  # read when the run starts, never when the file is parsed
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(tmp_path / "policies"))
    policy = _policy(tmp_path / "policies")
    running = paths.default_policy()
    before = hashlib.sha256(running.read_bytes()).hexdigest()
    seed_week(AuditStore(f"sqlite:///{db}").ensure_schema(), load_policy(None), WHEN.timestamp(), nodes=2, days=1)

    dag = fresh_dag(DAG_ID)
    assert dag.params.get_param("space").schema["examples"] == ["default"]  # the shipped names, not the folder's
    dr = dag.test(run_conf={"days": 1, "space": "small", "max_candidates": 4, "policy": policy}, logical_date=WHEN)
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert dr.state == "success", states

    folder = tmp_path / "reports" / "tune" / "2026-11-30_small_1d"
    payload = json.loads((folder / "tune.json").read_text())
    assert payload["search"] == "grid" and {c["name"] for c in payload["candidates"]} >= {"base", "c01"}
    assert len(payload["candidates"]) == 4  # the base and the three combinations that differ from it
    assert payload["trace"]["gpus"] == 16 and "usage rows" in payload["trace"]["notes"][0]
    assert set(payload["pareto"]) <= {c["name"] for c in payload["candidates"]} and payload["pareto"]
    assert payload["window"] == {"since": "2026-11-29T12:00:00Z", "until": "2026-11-30T12:00:00Z", "days": 1}
    index = (folder / "index.html").read_text()
    assert "data:image/png;base64," in index and "<table>" in index
    assert (folder / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| candidate |" in (folder / "summary.md").read_text()
    if payload["chosen"]:
        proposed = (folder / "proposed.yaml").read_text()
        assert proposed.startswith("# Proposed by `gpu-cost tune`") and "NOT IN USE" in proposed
        load_policy(folder / "proposed.yaml")
    else:
        assert not (folder / "proposed.yaml").exists() and payload["reason"]
    tune_ti = next(ti for ti in dr.get_task_instances() if ti.task_id == "tune")
    assert tune_ti.state == "success"
    assert hashlib.sha256(running.read_bytes()).hexdigest() == before  # the running policy is unchanged
