"""The trace source reads the design's trace format and sees what the simulator sees."""

from __future__ import annotations

import json

import numpy as np
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


def test_power_is_read_in_single_precision_where_asked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A replay reads the samples' watts as float32 (a week's column is 40 MB, not 80); other columns, and NaN, stay."""
    pd.DataFrame({"ts": [1, 2], "host": ["a", "a"], "gpu": [0, 0], "util": [5.0, 7.5], "mem_used_mib": [1.0, 2.0],
                  "power_w": [61.5, None]}).to_parquet(tmp_path / "s.parquet")
    df = trace.read_table(tmp_path / "s.parquet", "samples", single=("power_w",))
    assert df["power_w"].dtype == np.float32 and df["util"].dtype == np.float64
    assert df["power_w"].tolist()[0] == 61.5 and np.isnan(df["power_w"].tolist()[1])


# -- measures written with their units, and columns in the wrong scale ------------------------------------------
def _numeric_samples(rng) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    n = int(rng.integers(5, 200))
    return pd.DataFrame({
        "ts": 1_700_000_000 + 60 * np.arange(n), "host": rng.choice(["a", "b"], n), "gpu": rng.integers(0, 8, n),
        "util": np.where(rng.random(n) < 0.5, rng.integers(0, 101, n), np.round(rng.random(n) * 100, 2)),
        "mem_used_mib": np.round(rng.random(n) * 81_000, 1), "mem_total_mib": 81_559.0,
        "power_w": np.round(rng.random(n) * 700, 2)})


@pytest.mark.parametrize("seed", range(12))
def test_measures_written_with_units_read_as_the_numbers(tmp_path, seed: int) -> None:  # type: ignore[no-untyped-def]
    """nvidia-smi's CSV writes ``45 %``, ``1234 MiB``, ``61.5 W`` and ``[N/A]``: read as the format's percent, MiB and
    watts (GiB and KiB converted), each not-known cell as not known, whatever the mix of cells."""
    rng = np.random.default_rng(seed)
    want = _numeric_samples(rng)
    n = len(want)
    unknown = {c: rng.random(n) < 0.1 for c in ("util", "mem_used_mib", "power_w")}
    gib = rng.random(n) < 0.3
    text = want.astype({"util": object, "mem_used_mib": object, "power_w": object})
    text["util"] = [rng.choice(["[N/A]", "", "N/A"]) if unknown["util"][i] else f"{u:g} %"
                    for i, u in enumerate(want["util"])]
    text["mem_used_mib"] = ["[Not Supported]" if unknown["mem_used_mib"][i] else
                            (f"{m / 1024!r} GiB" if gib[i] else f"{m:g}MiB") for i, m in enumerate(want["mem_used_mib"])]
    text["power_w"] = ["[N/A]" if unknown["power_w"][i] else f" {p:g} W " for i, p in enumerate(want["power_w"])]
    text.to_csv(tmp_path / "s.csv", index=False)
    got = trace.read_samples(tmp_path / "s.csv")
    for col in ("util", "mem_used_mib", "power_w"):
        expect = np.where(unknown[col], np.nan, want[col].to_numpy(dtype=float))
        np.testing.assert_allclose(got[col].to_numpy(dtype=float), expect, rtol=1e-12, err_msg=col)


def test_a_trace_with_units_finds_what_the_numbers_find(tmp_path, policy, scenario) -> None:  # type: ignore[no-untyped-def]
    cluster = sim.SimCluster(scenario, anchor=NOW)
    samples = cluster.samples(NOW - policy.sweep.lookback, NOW)
    samples.to_csv(tmp_path / "numbers.csv", index=False)
    smi = samples.assign(util=[f"{u:g} %" for u in samples["util"]],
                         mem_used_mib=[f"{m:g} MiB" for m in samples["mem_used_mib"]])
    smi.to_csv(tmp_path / "smi.csv", index=False)
    cluster.jobs_trace(NOW - 86400, NOW).to_csv(tmp_path / "jobs.csv", index=False)
    found = [sorted(json.dumps(f.to_dict(), sort_keys=True, default=str)
                    for f in run_rules(trace.snapshot(policy, NOW, tmp_path / name, tmp_path / "jobs.csv"), policy))
             for name in ("numbers.csv", "smi.csv")]
    assert found[0] and found[0] == found[1]  # the same findings, evidence and all


@pytest.mark.parametrize("seed", range(12))
def test_util_in_fractions_is_refused_and_percent_never(tmp_path, seed: int) -> None:  # type: ignore[no-untyped-def]
    """DCGM's ratios (0-1) read as percent would make every GPU idle: refused, naming the column and a row. A trace in
    percent with any value above 1 is read, and so is one of whole percents at most 1 (a cluster idle throughout)."""
    rng = np.random.default_rng(seed)
    s = _numeric_samples(rng)
    s.loc[int(rng.integers(0, len(s))), "util"] = 37.5  # at least one fraction once divided
    s.to_csv(tmp_path / "percent.csv", index=False)
    assert trace.read_samples(tmp_path / "percent.csv")["util"].max() > 1
    s.assign(util=s["util"] / 100).to_csv(tmp_path / "fraction.csv", index=False)
    with pytest.raises(TraceError, match=r"fraction\.csv: column util holds fractions .*row \d+: 0\.\d+.*multiply it by 100"):
        trace.read_samples(tmp_path / "fraction.csv")
    s.assign(util=rng.integers(0, 2, len(s))).to_csv(tmp_path / "idle.csv", index=False)
    assert trace.read_samples(tmp_path / "idle.csv")["util"].max() <= 1


def test_memory_in_bytes_and_unknown_units_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    s = _numeric_samples(rng)
    s.assign(mem_used_mib=s["mem_used_mib"] * 2**20 + 1).to_csv(tmp_path / "bytes.csv", index=False)
    with pytest.raises(TraceError, match=r"bytes\.csv: column mem_used_mib is mostly above 2097152 MiB .*bytes or KiB"):
        trace.read_samples(tmp_path / "bytes.csv")
    s.assign(power_w=["12 kW", *["1 W"] * (len(s) - 1)]).to_csv(tmp_path / "kw.csv", index=False)
    with pytest.raises(TraceError, match=r"kw\.csv: column power_w, row 1: '12 kW' is not a number \(units read: W"):
        trace.read_samples(tmp_path / "kw.csv")
    s.assign(util=[*["5 %"] * (len(s) - 1), "busy"]).to_csv(tmp_path / "word.csv", index=False)
    with pytest.raises(TraceError, match=rf"word\.csv: column util, row {len(s)}: 'busy' is not a number"):
        trace.read_samples(tmp_path / "word.csv")


# -- hosts the exporter and the scheduler name differently -------------------------------------------------------
@pytest.mark.parametrize(("metric", "scheduler", "want"), [
    ({"gpu01.c.org", "gpu02.c.org"}, {"gpu01", "gpu02"}, {"gpu01.c.org": "gpu01", "gpu02.c.org": "gpu02"}),
    ({"gpu01", "gpu02"}, {"gpu01.c.org", "gpu02.c.org"}, {"gpu01": "gpu01.c.org", "gpu02": "gpu02.c.org"}),
    ({"gpu01", "gpu02"}, {"gpu01", "gpu02"}, {}),  # the same names: nothing to do
    ({"gpu01.a.org", "gpu01.b.org"}, {"gpu01"}, {}),  # two series onto one node: which one? neither
    ({"gpu01", "gpu01.c.org"}, {"gpu01"}, {}),  # the node's name is already a series' own
    ({"gpu01"}, {"gpu01.a.org", "gpu01.b.org"}, {}),  # two full names start so: neither
    ({"10.0.0.5", "gpu02.c.org"}, {"gpu02"}, {"gpu02.c.org": "gpu02"}),  # an address is no name: left alone
    ({"gpu01.c.org"}, set(), {}),  # nothing known of the scheduler: left alone
    ({"GPU01", "Gpu02.C.Org"}, {"gpu01", "gpu02"}, {"GPU01": "gpu01", "Gpu02.C.Org": "gpu02"}),  # letter case
    ({"gpu01"}, {"GPU01.c.org"}, {"gpu01": "GPU01.c.org"}),
    ({"GPU01"}, {"gpu01", "Gpu01"}, {}),  # two nodes differing in case alone: which one? neither
    # Prometheus's instance label (host:port): the port is no part of the name
    ({"gpu01:9400", "gpu02.c.org:9100"}, {"gpu01", "gpu02"}, {"gpu01:9400": "gpu01", "gpu02.c.org:9100": "gpu02"}),
    ({"gpu01:9400", "gpu01:9401"}, {"gpu01"}, {}),  # two exporters of one node: which one? neither
    ({"10.0.0.5:9400", "[fe80::1]:9400", "fe80::1"}, {"gpu01"}, {}),  # addresses: left alone
])
def test_hosts_named_twice_are_matched_only_when_the_match_is_one(metric, scheduler, want) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.perceive.correlate import host_names

    assert host_names(metric, scheduler) == want


def test_a_trace_whose_samples_name_hosts_in_full_finds_what_short_names_find(tmp_path, policy, scenario) -> None:  # type: ignore[no-untyped-def]
    cluster = sim.SimCluster(scenario, anchor=NOW)
    samples = cluster.samples(NOW - policy.sweep.lookback, NOW).drop(columns=["job_id"])  # the jobs' gpu_ids alone
    cluster.jobs_trace(NOW - 86400, NOW).to_csv(tmp_path / "jobs.csv", index=False)
    samples.to_csv(tmp_path / "short.csv", index=False)
    samples.assign(host=samples["host"] + ".cluster.example.org").to_csv(tmp_path / "full.csv", index=False)
    found = [sorted(json.dumps(f.to_dict(), sort_keys=True, default=str)
                    for f in run_rules(trace.snapshot(policy, NOW, tmp_path / name, tmp_path / "jobs.csv"), policy))
             for name in ("short.csv", "full.csv")]
    assert any('"rule": "idle_allocation"' in f for f in found[0]) and found[0] == found[1]


def test_the_live_sources_read_exporter_hosts_under_slurms_names() -> None:
    from gpu_cost.core.model import Job, Node
    from gpu_cost.perceive.live import _scheduler_names

    frame = pd.DataFrame({"host": ["gpu01.c.org", "gpu01.c.org", "gpu02.c.org"], "gpu": [0, 1, 0]})
    jobs = [Job(job_id="7", user="a", state="RUNNING", start_ts=0.0, gpu_alloc=(("gpu01", (0, 1)),))]
    nodes = [Node(name="gpu01"), Node(name="gpu02")]
    stats = {"gpu01.c.org": {"cpu_util": 5.0}, "gpu02.c.org": {"cpu_util": 7.0}}
    out, out_stats = _scheduler_names(frame, stats, jobs, nodes)
    assert out["host"].tolist() == ["gpu01", "gpu01", "gpu02"] and frame["host"][0] == "gpu01.c.org"  # a new frame
    assert out_stats == {"gpu01": {"cpu_util": 5.0}, "gpu02": {"cpu_util": 7.0}}
    same, _ = _scheduler_names(out, out_stats, jobs, nodes)
    assert same is out  # names that agree: nothing done


@pytest.mark.parametrize("seed", range(8))
def test_memory_in_gib_or_percent_is_refused_and_mib_never(tmp_path, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Memory in GiB (or a share of it, in percent) read as MiB makes every job's memory look like an unused GPU's:
    a service's resident memory, what tells it from an idle job, is gone (a generated day so: 6 false kills of 8).
    A busy GPU holds its context, hundreds of MiB: when no busy sample has over 200, refused, naming the column;
    a total under 1 GiB too. A trace in MiB is read, its busy GPUs using little or much."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(150, 400))
    s = pd.DataFrame({"ts": 1_700_000_000 + 60 * np.arange(n), "host": "a", "gpu": rng.integers(0, 8, n),
                      "util": rng.uniform(0, 100, n), "mem_used_mib": rng.uniform(300, 81_000, n),
                      "mem_total_mib": 81_559.0})
    s.to_csv(tmp_path / "mib.csv", index=False)
    assert trace.read_samples(tmp_path / "mib.csv")["mem_used_mib"].max() > 200
    for name, frame in (("gib", s.assign(mem_used_mib=s["mem_used_mib"] / 1024, mem_total_mib=np.nan)),
                        ("share", s.assign(mem_used_mib=s["mem_used_mib"] / 81_559 * 100, mem_total_mib=np.nan)),
                        ("zeros", s.assign(mem_used_mib=0.0, mem_total_mib=np.nan))):
        frame.to_csv(tmp_path / f"{name}.csv", index=False)
        with pytest.raises(TraceError, match=rf"{name}\.csv: column mem_used_mib is never above 200 on a busy GPU "
                                             r"\(row \d+: util [\d.]+ %.*GiB, a percentage, or not measured"):
            trace.read_samples(tmp_path / f"{name}.csv")
    s.assign(mem_total_mib=80.0).to_csv(tmp_path / "total.csv", index=False)
    with pytest.raises(TraceError, match=r"total\.csv: column mem_total_mib is under 1024 everywhere .*GiB"):
        trace.read_samples(tmp_path / "total.csv")


@pytest.mark.parametrize("per_second", [1e3, 1e6, 1e9])
def test_sample_times_in_milliseconds_are_read_as_seconds(tmp_path, per_second: float) -> None:  # type: ignore[no-untyped-def]
    """A samples file with epoch milliseconds as numbers (Grafana's CSV export, JavaScript), or micro- or nanoseconds:
    read in seconds, as the jobs file's are. (Before: read as seconds, the year 58800, and the replay failed on a
    date out of range.)"""
    s = _numeric_samples(np.random.default_rng(0))
    s.assign(ts=(s["ts"] * per_second).astype(np.int64)).to_csv(tmp_path / "ms.csv", index=False)
    np.testing.assert_allclose(trace.read_samples(tmp_path / "ms.csv")["ts"].to_numpy(), s["ts"].to_numpy())


@pytest.mark.parametrize("categorical", [False, True])
def test_spaces_around_host_names_are_not_part_of_them(tmp_path, categorical: bool) -> None:  # type: ignore[no-untyped-def]
    """A hand-made CSV writes ``ts, host, ...`` rows as ``1700000000, gpu01, 0``: the host is ``gpu01``, the node the
    jobs name, not `` gpu01`` (whose GPUs would be no job's). Read as text or as categories, as the replay reads
    them; ``gpu_ids`` items with spaces around their parts alike."""
    s = _numeric_samples(np.random.default_rng(1))
    s.assign(host=" " + s["host"] + " ").to_csv(tmp_path / "spaced.csv", index=False)
    frame = pd.read_csv(tmp_path / "spaced.csv", dtype={"host": "category"} if categorical else None)
    assert sorted(trace.normalise_samples(frame)["host"].astype(str).unique()) == sorted(s["host"].unique())
    assert trace.parse_gpu_ids(" a:0, a : 1 ,b:2") == [("a", 0), ("a", 1), ("b", 2)]


def test_a_host_a_job_runs_on_by_its_labels_alone_is_the_schedulers() -> None:
    """A jobs file that names nodes for some jobs but places another only by the exporter's label: that job's host is
    the scheduler's (its zombies are zombies), not outside it; a file naming no node says nothing."""
    jobs = pd.DataFrame({"job_id": ["1", "2"], "gpu_ids": ["a:0", ""]})
    samples = pd.DataFrame({"host": ["a", "b", "c"], "job_id": ["1", "2", "9"]})
    assert trace.managed_hosts(trace.named_hosts(jobs), trace.labelled_hosts(samples, jobs)) == {"a", "b"}
    assert trace.managed_hosts(set(), ["a"]) is None
