"""The nightly forecast DAG runs through Airflow (``dag.test()``) on the simulator, with mapped fits."""

from __future__ import annotations

import json
from pathlib import Path

import pendulum
import pytest
import yaml

from gpu_cost.audit.store import AuditStore
from gpu_cost.capacity.forecast.demand import expected_demand
from tests.fixtures.core import ROOT

pytestmark = pytest.mark.e2e

#: the run's data instant, fixed: the history and the horizon do not move with the wall clock
WHEN = pendulum.datetime(2026, 11, 30, 2, 0, tz="UTC")  # a Monday, at the nightly's 02:00


def _policy(tmp_path: Path) -> Path:
    data = yaml.safe_load((ROOT / "include" / "policy" / "default.yaml").read_text())
    data["forecast"].update({"series_per_task": 2, "sim_days": 15, "history": "15d"})
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_forecast_dag_maps_fits_and_fills_the_forecasts_table(airflow_db, dagbag, tmp_path,  # type: ignore[no-untyped-def]
                                                              monkeypatch) -> None:
    dag = dagbag.dags["gpu_forecast_nightly"]
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(tmp_path))
    dr = dag.test(run_conf={"policy": _policy(tmp_path).stem, "source": "sim"}, logical_date=WHEN)
    tis = dr.get_task_instances()
    states = {(ti.task_id, ti.map_index): ti.state for ti in tis}
    assert dr.state == "success", states
    mapped = [ti for ti in tis if ti.task_id == "fit_demand"]
    assert len(mapped) >= 2 and all(ti.map_index >= 0 for ti in mapped), states  # really mapped, batches of 2

    store = AuditStore()
    kinds = {r["kind"]: r["n"] for r in store.query("SELECT kind, COUNT(*) AS n FROM gpu_cost_forecasts GROUP BY kind")}
    assert kinds.get("demand", 0) >= 4 * 48 and kinds.get("runtime", 0) > 0 and kinds.get("backtest", 0) >= 1
    # one row per series and horizon hour, even though every batch wrote its own
    dup = store.query("SELECT series, horizon_ts, COUNT(*) AS n FROM gpu_cost_forecasts GROUP BY series, horizon_ts "
                      "HAVING COUNT(*) > 1")
    assert dup == []
    bt = store.query("SELECT * FROM gpu_cost_forecasts WHERE series = 'backtest:demand' ORDER BY horizon_ts DESC")
    figures = json.loads(bt[0]["extra"])
    assert figures["series"] >= 4 and figures["prophet_fits"] > 0
    now = float(bt[0]["horizon_ts"])
    assert (expected_demand(store, now, 48 * 3600) or 0) > 0
