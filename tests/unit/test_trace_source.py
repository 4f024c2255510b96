"""The trace source reads the design's trace format and sees what the simulator sees."""

from __future__ import annotations

import pytest

from gpu_cost.errors import TraceError
from gpu_cost.rules import run_rules
from gpu_cost.sources import sim, trace
from gpu_cost.timeutil import iso
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


def test_bad_timestamps_are_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "j.csv").write_text("job_id,user,start_ts\n1,u,yesterday\n")
    with pytest.raises(TraceError, match=r"j\.csv: column start_ts"):
        trace.read_jobs(tmp_path / "j.csv")
