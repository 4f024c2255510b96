"""The trace source reads the design's trace format and sees what the simulator sees."""

from __future__ import annotations

import pandas as pd
import pytest

from gpu_cost.analyse.rules import run_rules
from gpu_cost.core.errors import TraceError
from gpu_cost.core.timeutil import iso
from gpu_cost.perceive import trace
from gpu_cost.sim import cluster as sim
from tests.fixtures.core import NOW


def test_trace_snapshot_finds_what_the_simulator_finds(tmp_path, policy, scenario) -> None:  # type: ignore[no-untyped-def]
    cluster = sim.SimCluster(scenario, anchor=NOW)
    samples = cluster.samples(NOW - policy.sweep.lookback, NOW)
    samples["ts"] = samples["ts"].map(iso)  # ISO 8601 text, as traces from other tools have it
    samples.to_csv(tmp_path / "samples.csv", index=False)
    cluster.jobs_trace(NOW - 86400, NOW).to_csv(tmp_path / "jobs.csv", index=False)
    snap = trace.snapshot(policy, NOW, tmp_path / "samples.csv", tmp_path / "jobs.csv")
    assert not snap.degraded and len(snap.gpus) == scenario.gpu_count
    got = {(f.rule, f.job_id or f.target) for f in run_rules(snap, policy)}
    want = {(f.rule, f.job_id or f.target) for f in run_rules(sim.snapshot(policy, NOW, scenario), policy)
            if f.target_kind != "process"}
    # a trace has no process list: the zombie is reported per GPU instead of per process
    assert want <= got
    assert any(r == "zombie" and t.startswith("gpu:gpu01:4") for r, t in got)


def test_missing_column_names_file_and_column(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "s.csv").write_text("ts,host,gpu,util\n1,a,0,5\n")
    with pytest.raises(TraceError, match=r"s\.csv: samples lack column\(s\) mem_used_mib"):
        trace.read_samples(tmp_path / "s.csv")


def test_gpu_indices_must_be_whole_numbers_from_zero(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "s.csv").write_text("ts,host,gpu,util,mem_used_mib\n1,a,0,5,1\n1,a,x,5,1\n")
    with pytest.raises(TraceError, match=r"s\.csv: column gpu must hold GPU indices \(integers\)"):
        trace.read_samples(tmp_path / "s.csv")
    (tmp_path / "s.csv").write_text("ts,host,gpu,util,mem_used_mib\n1,a,0,5,1\n1,a,-1,5,1\n")
    with pytest.raises(TraceError, match=r"s\.csv: column gpu must hold GPU indices \(0 or more\); row 2 has -1"):
        trace.read_samples(tmp_path / "s.csv")


def test_bad_timestamps_are_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "j.csv").write_text("job_id,user,start_ts\n1,u,yesterday\n")
    with pytest.raises(TraceError, match=r"j\.csv: column start_ts"):
        trace.read_jobs(tmp_path / "j.csv")


def test_text_columns_read_as_categories_keep_their_text(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # a job label column with empty cells would be read as floats ("101.0"); as a category it stays "101"
    (tmp_path / "s.csv").write_text("ts,host,gpu,util,mem_used_mib,job_id\n1,7,0,5,1,101\n2,7,0,5,1,\n")
    df = trace.read_table(tmp_path / "s.csv", "samples", categories=("host", "job_id"))
    assert isinstance(df["job_id"].dtype, pd.CategoricalDtype)
    assert str(df["job_id"][0]) == "101" and df["job_id"].isna().tolist() == [False, True]
    assert [str(h) for h in df["host"]] == ["7", "7"]
    pd.DataFrame({"ts": [1, 2], "host": ["7", "7"], "gpu": [0, 0], "util": [5.0, 5.0], "mem_used_mib": [1.0, 1.0],
                  "job_id": pd.Series(["101", None], dtype="string")}).to_parquet(tmp_path / "s.parquet")
    pq = trace.read_table(tmp_path / "s.parquet", "samples", categories=("host", "job_id"))
    assert isinstance(pq["job_id"].dtype, pd.CategoricalDtype)
    assert pq["job_id"].tolist()[0] == "101" and pq["job_id"].isna().tolist() == [False, True]
