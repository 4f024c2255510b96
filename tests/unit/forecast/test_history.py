"""History: reading job traces, and hourly demand series from jobs."""

from __future__ import annotations

import pandas as pd
import pytest

from gpu_cost.errors import TraceError
from gpu_cost.forecast import history

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
    a = history.sim_jobs(now, 5)
    b = history.sim_jobs(now, 5)
    assert len(a) > 50 and a.equals(b)
    assert (a["end_ts"].dropna() <= now).all()
    assert a["end_ts"].isna().any()  # some still running
