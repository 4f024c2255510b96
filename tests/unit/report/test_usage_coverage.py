"""Usage counts the time each sweep really covers, whatever the schedule that runs it.

A deployment swept every 3 minutes with the shipped ``sweep.interval: 5m`` used to write rows of
300 s each: 5/3 too many GPU-hours, silently. The sweep is driven here at 3- and 5-minute data
instants over the same simulated hour (the CLI's ``run_once`` and the DAG's task callables, in
this process, on a real SQLite audit store).
"""

from __future__ import annotations

import datetime as dt
import json
import types
from pathlib import Path
from typing import Any

import pendulum
import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.loop import sweep
from gpu_cost.report.usage import MAX_COVER, record_usage
from tests.fixtures.core import NOW

HOUR = 3600.0
CADENCE = "usage counts the time between sweeps"


def _sweep_hour(policy, store: AuditStore, every_s: float) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """Run the sweep at every ``every_s`` data instant of the hour ending at NOW; return the summaries."""
    n = int(HOUR // every_s)
    return [sweep.run_once(policy, NOW - HOUR + k * every_s, store, source="sim") for k in range(1, n + 1)]


def _gpu_hours(store: AuditStore) -> float:
    return float(store.query("SELECT SUM(total_gpu_s) AS s FROM gpu_cost_usage")[0]["s"]) / HOUR


def _store(tmp_path: Path, name: str) -> AuditStore:
    return AuditStore(f"sqlite:///{tmp_path / name}").ensure_schema()


def test_a_3_minute_schedule_counts_the_gpu_hours_of_a_5_minute_one(policy, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert policy.sweep.interval == 300
    five, three = _store(tmp_path, "five.db"), _store(tmp_path, "three.db")
    by_five, by_three = _sweep_hour(policy, five, 300), _sweep_hour(policy, three, 180)
    gpus = by_five[0]["gpus"]
    assert gpus == 24 and _gpu_hours(five) == pytest.approx(gpus * 1.0)
    # the same hour, within one sweep interval's worth of every GPU (the first sweep counts sweep.interval)
    assert abs(_gpu_hours(three) - _gpu_hours(five)) <= gpus * policy.sweep.interval / HOUR, \
        (_gpu_hours(three), _gpu_hours(five))
    assert {r["interval_s"] for r in three.query("SELECT DISTINCT interval_s FROM gpu_cost_jobs_usage "
                                                 "WHERE ts > :since", {"since": NOW - HOUR + 180})} == {180.0}
    # the schedule disagrees with sweep.interval: a warning in the run's problems, not a degradation
    assert not any(CADENCE in p for s in by_five for p in s["problems"])
    warned = [s for s in by_three if any(CADENCE in p for p in s["problems"])]
    assert warned and warned[-1]["run_id"] == by_three[-1]["run_id"] and not any(s["degraded"] for s in by_three)
    assert "3m, 3m, 3m apart but the policy's sweep.interval is 5m" in warned[-1]["problems"][-1]
    run = three.get_run(by_three[-1]["run_id"])
    assert run is not None and run["status"] == "ok" and CADENCE in run["problems"]


def test_an_outage_counts_at_most_two_intervals(policy, scenario, store: AuditStore) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.sim.cluster import snapshot

    first = record_usage(store, snapshot(policy, NOW - 3 * HOUR, scenario), policy)
    later = record_usage(store, snapshot(policy, NOW, scenario), policy)
    assert first["interval_s"] == policy.sweep.interval      # nothing before it: one interval
    assert later["interval_s"] == MAX_COVER * policy.sweep.interval and later["warnings"] == []
    # a retried sweep measures the same gap: it rewrites the same rows
    assert record_usage(store, snapshot(policy, NOW, scenario), policy)["interval_s"] == later["interval_s"]


def test_a_sweep_recorded_after_a_later_one_takes_its_share_back(policy, scenario, store: AuditStore) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.sim.cluster import snapshot

    for t in (NOW - 300, NOW + 300, NOW):      # the run at NOW finished after the next one (runs overlap)
        record_usage(store, snapshot(policy, t, scenario), policy)
    rows = store.query("SELECT ts, MAX(interval_s) AS i, SUM(total_gpu_s) AS s FROM gpu_cost_usage GROUP BY ts "
                       "ORDER BY ts")
    assert [r["i"] for r in rows] == [300.0, 300.0, 300.0]
    assert [r["s"] for r in rows] == [24 * 300.0] * 3
    jobs = store.query("SELECT DISTINCT interval_s FROM gpu_cost_jobs_usage WHERE ts = :ts", {"ts": NOW + 300})
    assert [r["interval_s"] for r in jobs] == [300.0]


# -- the DAG: its cron is the schedule ---------------------------------------------------------------
@pytest.fixture
def dag_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB",
                       json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "audit.db")}))
    monkeypatch.setenv("GPU_COST_POLICY_DIR", str(tmp_path))
    monkeypatch.delenv("GPU_COST_SCENARIO", raising=False)
    (tmp_path / "shipped.yaml").write_text((Path(__file__).parents[3] / "include/policy/default.yaml").read_text())
    return tmp_path


def _collect(schedule: Any, when: float, run: str) -> dict[str, Any]:
    """Run the DAG's check_policy → shards → collect → merge for the instant ``when``; return merge's XCom."""
    from airflow.sdk import DAG

    from gpu_cost.airflow import sweep_tasks

    dag = DAG("gpu_zombie_sweep", schedule=schedule, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))
    params = {"policy": "shipped", "source": "sim"}
    ctx = {"dag": dag, "dag_run": types.SimpleNamespace(dag_id="gpu_zombie_sweep", run_id=run,
                                                        run_after=pendulum.from_timestamp(when)),
           "logical_date": pendulum.from_timestamp(when), "params": params}
    cfg = sweep_tasks.check_policy(params, ctx)
    return sweep_tasks.merge(cfg, [sweep_tasks.collect(cfg, p, ctx) for p in sweep_tasks.shards(cfg, ctx)], ctx)


def test_the_dags_cron_disagreeing_with_sweep_interval_is_a_warning(dag_env: Path) -> None:
    from gpu_cost.airflow import runtime

    assert runtime.schedule_period({"dag": types.SimpleNamespace(timetable=None)}, NOW) is None
    first = _collect("*/3 * * * *", NOW, "a")
    second = _collect("*/3 * * * *", NOW + 180, "b")
    assert not first["degraded"] and any("schedule fires every 3m" in p and CADENCE in p for p in first["problems"])
    store = AuditStore()
    intervals = store.query("SELECT ts, MAX(interval_s) AS i FROM gpu_cost_usage GROUP BY ts ORDER BY ts")
    assert [r["i"] for r in intervals] == [300.0, 180.0] and second["problems"] == first["problems"]
    # a schedule that agrees, and a DAG only ever triggered by hand, warn of nothing
    assert _collect(dt.timedelta(minutes=5), NOW + 480, "c")["problems"] == []
    assert _collect("*/5 * * * *", NOW + 780, "d")["problems"] == []
    assert _collect(None, NOW + 840, "e")["problems"] == []
