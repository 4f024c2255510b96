"""Tiny runs of every benchmark so they do not rot (figures are printed by `make bench`, not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.core import ROOT, need


def run_bench(module: str, *args: str) -> dict:  # type: ignore[type-arg]
    r = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["bench"] and last["results"]
    return last


@pytest.mark.slow  # a CLI or bench subprocess: more than ~5 s
def test_sweep_bench_smoke() -> None:
    r = subprocess.run([sys.executable, "-m", "bench.sweep", "--sizes", "80,160", "--sharded", "160:4"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    whole, split = (json.loads(line) for line in r.stdout.splitlines() if line.startswith("{"))
    sizes = [r["gpus"] for r in whole["results"]]
    assert sizes == [80, 160]
    assert all(r["findings"] >= 0 and r["total_s"] > 0 and r["usage_s"] > 0 for r in whole["results"])
    # the parked snapshot: written and read back, and twice the GPUs write more of it
    assert all(r["park_s"] > 0 and r["read_s"] > 0 and r["findings_plan_s"] > 0 and r["size_s"] > 0
               for r in whole["results"])
    assert whole["results"][1]["park_mb"] > whole["results"][0]["park_mb"] > 0
    # the sharded sweep of the same cluster: every GPU once, the same findings and decisions
    (s,) = split["results"]
    assert (s["gpus"], s["shards"], s["gpus_merged"]) == (160, 4, 160)
    assert (s["findings"], s["decisions"]) == (whole["results"][1]["findings"], whole["results"][1]["decisions"])
    assert s["critical_s"] <= s["cpu_s"]


@pytest.mark.slow  # a CLI or bench subprocess: more than ~5 s
def test_soak_bench_smoke() -> None:
    out = run_bench("bench.soak", "--hours", "1")
    r = out["results"][0]
    assert r["runs"] == 12 and r["duplicate_decisions"] == 0


@pytest.mark.slow
def test_parse_bench_smoke() -> None:
    out = run_bench("bench.parse", "--repeat", "1")
    assert {r["dag_file"] for r in out["results"]} >= {"gpu_zombie_sweep.py"}
    assert all(r["errors"] == 0 and r["sql"] == 0 and r["lookups"] == 0 for r in out["results"])
    # parsing a DAG file must not import pandas, numpy, the sweep or the audit store (they load in tasks)
    assert {r["dag_file"]: r["heavy_imports"] for r in out["results"]} == {r["dag_file"]: "-" for r in out["results"]}
    assert {"(trivial DAG)", "(import airflow.sdk)"} <= {r["dag_file"] for r in out["results"]}


def test_parse_bench_sees_what_a_dag_file_imports(tmp_path: Path) -> None:
    # a parse in a forked child is seen importing what the DAG processor had not imported before it forked
    dag = tmp_path / "heavy_dag.py"
    dag.write_text("import pandas  # noqa\nimport gpu_cost.audit.store  # noqa\nfrom airflow.sdk import dag\n\n\n"
                   "@dag(schedule=None)\ndef heavy():\n    pass\n\n\nheavy()\n")
    probe = "import json, sys; import bench.parse as b; b._parser_imports(); print(json.dumps(b.forked(sys.argv[1])))"
    r = subprocess.run([sys.executable, "-c", probe, str(dag)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert {"pandas", "numpy", "gpu_cost.audit.store"} <= set(row["imported_heavy"])
    assert (row["errors"], row["dags"]) == (0, 1)


@pytest.mark.slow  # a CLI or bench subprocess: more than ~5 s
def test_replay_bench_smoke(tmp_path: Path) -> None:
    out = run_bench("bench.replay", "--gpus", "16", "--days", "0.25", "--cache", str(tmp_path))
    r = out["results"][0]
    assert r["gpus"] == 16 and r["rows"] == 16 * 6 * 60  # 6 h of 1-minute samples per GPU
    assert r["sweeps"] > 0 and r["peak_mb"] > 0 and r["false_kills"] <= r["kills"]
    assert (tmp_path / "g16-d0.25-s0" / "trace.json").exists()  # the trace is cached for the next run


@pytest.mark.slow  # a CLI or bench subprocess: more than ~5 s
def test_replay_stages_bench_times_every_stage_without_changing_the_replay(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "bench.replay_stages", "--gpus", "16", "--days", "1",
                        "--cache", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    stages, (floor,) = (json.loads(line)["results"] for line in r.stdout.splitlines() if line.startswith("{"))
    seen = {s["stage"]: s for s in stages}
    for stage in ("snapshot", "class baselines", "rules", "plan", "record", "usage rows", "act"):
        assert seen[stage]["s"] > 0, stage  # every stage of a sweep was timed
    assert seen["act"]["store_calls"] > 0 and seen["usage rows"]["store_calls"] > 0 and seen["rules"]["store_calls"] == 0
    assert 0 < floor["store_writes_s"] <= floor["store_s"] < floor["wall_s"]
    assert floor["per_decision_and_row_s"] < floor["wall_s"]
    # the rows the replay kept, written again in bulk by the bare driver: less than the store's own writes took
    assert floor["rows_kept"] > floor["sweeps"] and 0 < floor["driver_floor_s"] < floor["store_writes_s"]
    # the timers change nothing the replay decides: the plain replay of the same trace kills the same jobs
    plain = run_bench("bench.replay", "--gpus", "16", "--days", "1", "--cache", str(tmp_path))["results"][0]
    assert (floor["sweeps"], floor["kills"], floor["false_kills"]) == (plain["sweeps"], plain["kills"], plain["false_kills"])
    assert floor["kills"] > 0


@pytest.mark.slow
@pytest.mark.integration
def test_queries_bench_smoke() -> None:
    need("prometheus", "promtool")
    out = run_bench("bench.queries", "--sizes", "8,32", "--sweeps", "2", "--history", "600", "--slurm", "argv")
    small, big = out["results"]
    assert (small["gpus_seen"], big["gpus_seen"]) == (8, 32)  # the real Prometheus scraped every simulated GPU
    assert small["promql_per_sweep"] == big["promql_per_sweep"] > 0
    assert small["promql_per_sweep"] == small["promql_client"]  # the server counted what the source sent
    assert small["constant_over_sweeps"] and big["constant_over_sweeps"]
    assert small["slurm_cmds_per_sweep"] == big["slurm_cmds_per_sweep"] > 0
    # only nodes that can hold a zombie are inspected over SSH: never more than one call per node
    assert small["node_cmds_per_sweep"] <= 1 and big["node_cmds_per_sweep"] <= 4


@pytest.mark.slow
def test_forecast_bench_smoke() -> None:
    out = run_bench("bench.forecast", "--series", "2", "--workers", "1", "--nodes", "1")
    r = out["results"][0]
    assert r["series"] >= 2 and r["prophet_fits"] > 0 and r["prophet_failed"] == 0 and r["forecast_rows"] > 0


@pytest.mark.slow
def test_replay_hard_bench_smoke() -> None:
    out = run_bench("bench.replay_hard", "--days", "0.5", "--gpus", "16")
    runs = {r["run"] for r in out["results"]}
    assert runs == {"baselines on", "baselines off"}
    assert all(r["idle_gpu_h"] > 0 for r in out["results"])


@pytest.mark.slow
def test_verifier_month_bench_smoke() -> None:
    out = run_bench("bench.verifier_month", "--days", "1.5", "--test-days", "0.5", "--gpus", "16")
    assert [r["run"] for r in out["results"]] == ["without verifier", "with verifier"]


def test_slurm_json_bench_smoke() -> None:
    out = run_bench("bench.slurm_json", "--jobs", "40", "--nodes", "8", "--repeat", "1")
    versions = [r["version"] for r in out["results"]]
    assert versions[0].startswith("23.02") and versions[-1] == "index check"
    assert all(r["nodes_s"] > 0 for r in out["results"])


@pytest.mark.slow
def test_approval_skip_bench_smoke() -> None:
    out = run_bench("bench.approval_skip", "--repeat", "1", "--dags", "gpu_offhours_power")
    r = out["results"][0]
    assert r["dag"] == "gpu_offhours_power" and r["approve_state"] == "skipped" and r["upstream_median_s"] > 0


@pytest.mark.slow  # a bench subprocess: more than ~5 s
def test_power_frontier_bench_cuts_a_jobs_trace_into_months(tmp_path: Path) -> None:
    import numpy as np
    import pandas as pd

    # 16-GPU jobs from every morning to every evening, 2026-03-01 to 2026-04-30, on a trace that counts nodes
    start = 1_772_323_200 + 86400 * np.arange(31 + 30) + 9 * 3600  # 2026-03-01T09:00Z, then every day
    jobs = pd.DataFrame({"job_id": np.arange(len(start)), "user": "u", "account": "a", "submit_ts": start,
                         "start_ts": start, "end_ts": start + 9 * 3600, "time_limit_s": 43200, "gpus": 2, "nodes": 2,
                         "state": "Pass"})
    path = tmp_path / "jobs.csv"
    jobs.to_csv(path, index=False)
    out = run_bench("bench.power_frontier", "--jobs", str(path), "--gpus-per-unit", "8", "--nodes", "4",
                    "--quantiles", "0.9")
    # two months, 4 nodes each, from the first submit to the last end
    assert "2 keys" in out["bench"] and f"{4 * ((31 * 24 - 9) + (30 * 24 - 6))} node-hours" in out["bench"]
    (row,) = out["results"]
    assert row["quantile"] == 0.9 and row["node_hours_off"] > 0
    assert row["keys_below"] == "-" or set(row["keys_below"].split(",")) <= {"month-2026-03", "month-2026-04"}
