"""History: reading job traces, and hourly demand series from jobs."""

from __future__ import annotations

import pandas as pd
import pytest

from gpu_cost.capacity.forecast import history
from gpu_cost.core.errors import TraceError
from gpu_cost.sim import cluster as sim_cluster

H = 3600.0


def test_demand_is_mean_gpus_running_plus_pending_per_hour() -> None:
    jobs = history.normalise_jobs(pd.DataFrame([
        # pending 00:30-01:00, running 01:00-02:30 with 4 GPUs
        {"job_id": "1", "user": "a", "account": "x", "submit_ts": 0.5 * H, "start_ts": 1 * H, "end_ts": 2.5 * H,
         "time_limit_s": 4 * H, "gpus": 4},
        # running from 01:00, not ended: counts until the end of the window
        {"job_id": "2", "user": "b", "account": "y", "submit_ts": 1 * H, "start_ts": 1 * H, "end_ts": None,
         "time_limit_s": 4 * H, "gpus": 2},
    ]))
    s = history.demand_series(jobs, 0.0, 4 * H, by=("account",))
    x = s[s["key"] == "account:x"].set_index("ts")["value"]
    y = s[s["key"] == "account:y"].set_index("ts")["value"]
    total = s[s["key"] == "cluster:all"].set_index("ts")["value"]
    assert list(x) == [2.0, 4.0, 2.0, 0.0]
    assert list(y) == [0.0, 2.0, 2.0, 2.0]
    assert list(total) == [2.0, 6.0, 4.0, 2.0]


def test_load_jobs_reads_iso_and_epoch_and_names_bad_input(tmp_path) -> None:  # type: ignore[no-untyped-def]
    good = tmp_path / "jobs.csv"
    good.write_text("job_id,user,start_ts,end_ts,time_limit_s\n1,a,2024-01-01T00:00:00Z,1704070800,7200\n")
    j = history.load_jobs(good)
    assert j.loc[0, "start_ts"] == 1704067200.0 and j.loc[0, "end_ts"] == 1704070800.0
    assert j.loc[0, "submit_ts"] == j.loc[0, "start_ts"]  # no submit time: submitted when it started
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,start_ts\n1,2024-01-01\n")
    with pytest.raises(TraceError, match=r"bad\.csv.*user"):
        history.load_jobs(bad)
    with pytest.raises(TraceError, match="not found"):
        history.load_jobs(tmp_path / "missing.csv")
    worse = tmp_path / "worse.csv"
    worse.write_text("job_id,user,start_ts\n1,a,yesterday\n")
    with pytest.raises(TraceError, match=r"worse\.csv: column start_ts"):
        history.load_jobs(worse)


def test_sim_history_is_deterministic_and_ends_by_now() -> None:
    now = 1_795_960_800.0
    a = sim_cluster.sim_jobs(now, 5)
    b = sim_cluster.sim_jobs(now, 5)
    assert len(a) > 50 and a.equals(b)
    assert (a["end_ts"].dropna() <= now).all()
    assert a["end_ts"].isna().any()  # some still running


def test_the_agents_own_job_rows_are_a_history(tmp_path, policy, store) -> None:  # type: ignore[no-untyped-def]
    """Sweeps write per-job rows; the nightly's ``store`` source reads them back as finished and running jobs."""
    import yaml

    from gpu_cost.capacity.forecast import nightly
    from gpu_cost.core.timeutil import iso
    from gpu_cost.loop import sweep
    from gpu_cost.sim.cluster import load_scenario
    from tests.fixtures.core import NOW

    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump({
        "seed": 1, "anchor": iso(NOW), "nodes": [{"name": "g1", "gpus": 4, "model": "a100"}],
        "jobs": [
            {"job_id": "3001", "user": "ann", "account": "nlp", "partition": "batch", "name": "short",
             "behaviour": "training", "node": "g1", "gpus": [0], "start": "-2h", "end": "-30m", "time_limit": "4h"},
            {"job_id": "3002", "user": "bo", "account": "cv", "partition": "batch", "name": "long",
             "behaviour": "training", "node": "g1", "gpus": [1, 2], "start": "-3h", "time_limit": "1d"},
        ]}))
    sc = load_scenario(path)
    for i, t in enumerate((NOW - H, NOW)):
        sweep.run_once(policy, t, store, run_id=f"r{i}", source="sim", scenario=sc)
    jobs = history.store_jobs(store, NOW - 6 * H, NOW).set_index("job_id")
    assert set(jobs.index) == {"3001", "3002"}
    assert jobs.loc["3001", "end_ts"] == NOW - H and jobs.loc["3001", "state"] == "COMPLETED"  # last seen
    assert pd.isna(jobs.loc["3002", "end_ts"]) and jobs.loc["3002", "state"] == "RUNNING"
    assert jobs.loc["3002", "user"] == "bo" and jobs.loc["3002", "time_limit_s"] == 86400
    assert jobs.loc["3002", "start_ts"] == NOW - 3 * H
    # the nightly's `store` source is that same reading
    assert len(nightly.load_history(policy, NOW, "store", store)) == 2
