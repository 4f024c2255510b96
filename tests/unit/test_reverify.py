"""Approved decisions are re-checked on fresh data before they act: an approval can come an hour late."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from gpu_cost.airflow import sweep_tasks
from gpu_cost.core.timeutil import iso
from gpu_cost.loop import sweep
from gpu_cost.sim.cluster import load_scenario
from tests.fixtures.core import NOW

HOUR = 3600.0


def _scenario(tmp_path: Path) -> Path:
    """Two idle jobs seen at NOW: ``2001`` ends 30 min later (its owner came back), ``2002`` stays idle."""
    data = {
        "seed": 3, "sample_interval": "60s", "anchor": iso(NOW),
        "nodes": [{"name": "g1", "gpus": 4, "model": "a100", "mem_total_mib": 81920}],
        "jobs": [
            {"job_id": "2001", "user": "ann", "account": "nlp", "partition": "batch", "name": "ft", "behaviour": "idle",
             "node": "g1", "gpus": [0, 1], "start": "-3h", "busy_first": "20m", "end": "30m", "time_limit": "3d"},
            {"job_id": "2002", "user": "bo", "account": "nlp", "partition": "batch", "name": "ft2", "behaviour": "idle",
             "node": "g1", "gpus": [2, 3], "start": "-3h", "busy_first": "20m", "time_limit": "3d"},
        ],
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def decided(tmp_path, policy, store):  # type: ignore[no-untyped-def]
    sc = load_scenario(_scenario(tmp_path))
    snap = sweep.collect(policy, NOW, "sim", scenario=sc)
    decisions = sweep.plan(sweep.detect(snap, policy), snap, policy, store, NOW, predicted_end={}).decisions
    idle = {d.job_id: d for d in decisions if d.rule == "idle_allocation"}
    assert set(idle) == {"2001", "2002"}, decisions  # both idle when the approval was asked
    return sc, idle


def test_a_decision_whose_target_changed_while_waiting_expires(decided, policy) -> None:  # type: ignore[no-untyped-def]
    sc, idle = decided
    still, expired = sweep.reverify(list(idle.values()), policy, NOW, NOW + HOUR, "sim", scenario=sc)
    assert [d.job_id for d in still] == ["2002"]
    (why,) = expired.values()
    assert list(expired) == [idle["2001"].decision_id]
    assert "idle_allocation no longer finds job:2001" in why and iso(NOW + HOUR) in why


def test_no_newer_data_means_no_second_look(decided, policy) -> None:  # type: ignore[no-untyped-def]
    sc, idle = decided
    still, expired = sweep.reverify(list(idle.values()), policy, NOW, NOW, "sim", scenario=sc)
    assert still == list(idle.values()) and expired == {}


def test_data_that_cannot_be_rechecked_expires_everything(decided, policy, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _, idle = decided
    # a Prometheus that is not there: the fresh look fails, nothing may act on the old data
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_PROMETHEUS", json.dumps({"conn_type": "http", "host": "127.0.0.1",
                                                                       "port": 9, "schema": "http"}))
    still, expired = sweep.reverify(list(idle.values()), policy, NOW, NOW + HOUR, "prometheus")
    assert still == [] and set(expired) == {d.decision_id for d in idle.values()}
    assert all("not re-checked" in why for why in expired.values())


def test_the_sweeps_approved_branch_rechecks_after_a_long_wait(tmp_path, decided, policy, store,  # type: ignore[no-untyped-def]
                                                               monkeypatch) -> None:
    """The run began two hours ago (the approval took that long): the re-check looks two hours on."""
    _, idle = decided
    monkeypatch.setenv("GPU_COST_SCENARIO", str(_scenario(tmp_path)))
    run_id = "gpu_zombie_sweep:manual__late"
    store.begin_run(run_id, dag_id="gpu_zombie_sweep", started_at=time.time() - 2 * HOUR, data_ts=NOW, source="sim",
                    mode="enforce")
    store.record_decisions(list(idle.values()), run_id)
    still, expired = sweep_tasks.reverify_approved(list(idle.values()), policy, store, {"run_id": run_id, "now": NOW,
                                                                                         "source": "sim"})
    assert [d.job_id for d in still] == ["2002"] and list(expired) == [idle["2001"].decision_id]
    rows = {r["job_id"]: r for r in store.decisions_of_run(run_id)}
    assert rows["2001"]["status"] == "expired" and rows["2002"]["status"] != "expired"


def test_an_approved_decision_of_an_episode_that_ended_meanwhile_expires(tmp_path, decided, policy, store,  # type: ignore[no-untyped-def]
                                                                         monkeypatch) -> None:
    """Later sweeps run while a request waits. One of them saw job 2002 recover (its episode closed)
    and the next found it idle again (episode 2, ladder from the start): the approval given for
    episode 1 must not act, although the job is idle right now. 2001's episode was never touched."""
    _, idle = decided
    monkeypatch.setenv("GPU_COST_SCENARIO", str(_scenario(tmp_path)))
    run_id = "gpu_zombie_sweep:manual__asked"
    store.begin_run(run_id, dag_id="gpu_zombie_sweep", started_at=time.time(), data_ts=NOW, source="sim",
                    mode="enforce")
    for d in idle.values():
        store.execute("insert_escalation", {"rule": d.rule, "target": d.target, "track": d.evidence["track"],
                                            "episode": d.episode, "now": NOW, "job_id": d.job_id, "user_name": d.user})
    store.record_decisions(list(idle.values()), run_id)
    d2 = idle["2002"]
    key = {"rule": d2.rule, "target": d2.target, "track": d2.evidence["track"]}
    store.execute("close_escalation", {**key, "now": NOW + 300})
    store.execute("insert_escalation", {**key, "episode": d2.episode + 1, "now": NOW + 600, "job_id": "2002",
                                        "user_name": d2.user})
    still, expired = sweep_tasks.reverify_approved(list(idle.values()), policy, store,
                                                   {"run_id": run_id, "now": NOW, "source": "sim"})
    assert [d.job_id for d in still] == ["2001"]  # no newer data for 2001 (the run just began): it holds
    assert list(expired) == [d2.decision_id]
    assert f"episode {d2.episode} of job:2002 ended while awaiting approval" in expired[d2.decision_id]
    assert store.get_decision(d2.decision_id)["status"] == "expired"
