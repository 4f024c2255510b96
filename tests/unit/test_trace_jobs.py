"""A jobs trace as Slurm's accounting writes it: job steps, ``Unknown`` times, TRES and GRES GPU counts, Slurm time
limits. Read as the numbers the trace format means, each bad cell named by column and row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_cost.core.errors import TraceError
from gpu_cost.perceive import trace
from gpu_cost.perceive.slurm import gpus_of_text, time_limit_of_text
from gpu_cost.sim.replay import replay_files

SACCT = """job_id,user,account,partition,name,state,submit_ts,start_ts,end_ts,time_limit_s,gpus,nodes
1001,alice,nlp,gpu,train,COMPLETED,2026-12-01T00:00:00Z,2026-12-01T00:00:05Z,2026-12-01T02:00:05Z,2-00:00:00,4,1
1001.batch,,nlp,,batch,COMPLETED,2026-12-01T00:00:05Z,2026-12-01T00:00:05Z,2026-12-01T02:00:05Z,,4,1
1001.extern,,nlp,,extern,COMPLETED,2026-12-01T00:00:05Z,2026-12-01T00:00:05Z,2026-12-01T02:00:05Z,,4,1
1002,bob,cv,gpu,eval,RUNNING,2026-12-01T00:10:00Z,2026-12-01T00:10:05Z,Unknown,01:00:00,"cpu=8,mem=64G,gres/gpu=2,gres/gpu:a100=2,node=1",1
1003_1,carol,cv,gpu,sweep,CANCELLED by 1234,2026-12-01T00:20:00Z,2026-12-01T00:20:05Z,2026-12-01T01:20:05Z,UNLIMITED,gpu:a100:1,1
1003_1.0,carol,cv,gpu,python,CANCELLED,2026-12-01T00:20:05Z,2026-12-01T00:20:05Z,2026-12-01T01:20:05Z,,gpu:a100:1,1
1004,dan,cv,cpu,prep,COMPLETED,2026-12-01T00:30:00Z,2026-12-01T00:30:05Z,2026-12-01T00:40:05Z,30:00,cpu=4,1
1005,erin,cv,gpu,wait,PENDING,2026-12-01T00:40:00Z,Unknown,Unknown,1-00:00,gres:gpu:8,1
"""


def test_accounting_forms_read_as_the_trace_format_means_them(tmp_path: Path) -> None:
    (tmp_path / "jobs.csv").write_text(SACCT)
    jobs = trace.read_jobs(tmp_path / "jobs.csv").set_index("job_id")
    # the steps of 1001 and 1003_1 are parts of their jobs, not jobs holding the GPUs again
    assert list(jobs.index) == ["1001", "1002", "1003_1", "1004", "1005"]
    assert jobs["gpus"].tolist() == [4, 2, 1, 0, 8]  # typed TRES not counted twice; a CPU job holds none
    limits = jobs["time_limit_s"]
    assert (limits["1001"], limits["1002"], limits["1004"], limits["1005"]) == (172800.0, 3600.0, 1800.0, 86400.0)
    assert np.isnan(limits["1003_1"])  # UNLIMITED: none known
    assert np.isnan(jobs["end_ts"]["1002"]) and np.isnan(jobs["start_ts"]["1005"])  # Unknown: not known
    assert jobs["end_ts"]["1001"] - jobs["start_ts"]["1001"] == 7200.0
    res = replay_files(None, tmp_path / "jobs.csv", _policy())
    assert res.jobs == 5 and res.allocated_gpu_hours == pytest.approx(4 * 2 + 1 * 1)  # ended jobs: 1001, 1003_1


def _policy():  # type: ignore[no-untyped-def]
    from gpu_cost.config.loader import load_policy
    from tests.fixtures.core import ROOT

    return load_policy(ROOT / "include" / "policy" / "default.yaml")


@pytest.mark.parametrize("seed", range(30))
def test_slurm_time_limits_read_as_seconds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    d, h, m, s = (int(x) for x in (rng.integers(0, 30), rng.integers(0, 24), rng.integers(0, 60), rng.integers(0, 60)))
    want = ((d * 24 + h) * 60 + m) * 60 + s
    assert time_limit_of_text(f"{d}-{h:02d}:{m:02d}:{s:02d}") == want
    assert time_limit_of_text(f"{d * 24 + h:02d}:{m:02d}:{s:02d}") == want
    assert time_limit_of_text(f"{d}-{h:02d}:{m:02d}") == want - s
    assert time_limit_of_text(f"{d}-{h}") == want - s - 60 * m
    assert time_limit_of_text(f"{m}:{s:02d}") == 60 * m + s


@pytest.mark.parametrize(("text", "gpus"), [
    ("4", 4), ("gres/gpu=2", 2), ("cpu=8,mem=64G,gres/gpu=2,gres/gpu:a100=2,node=1", 2), ("gres/gpu:a100=3", 3),
    ("cpu=4,mem=1G", 0), ("gpu:a100:4", 4), ("gres:gpu:8", 8), ("gpu:4", 4), ("gpu", 1), ("gpu:a100", 1),
    ("gpu:a100:2,gpu:v100:1", 3), ("gpu:a100:4(S:0-1)", 4), ("banana", None), ("mps:100", None)])
def test_gpu_counts_as_accounting_writes_them(text: str, gpus: int | None) -> None:
    assert gpus_of_text(text) == gpus


@pytest.mark.parametrize(("column", "value", "message"), [
    ("gpus", "lots", r"column gpus, row 2: 'lots' is not a GPU count"),
    ("time_limit_s", "soon", r"column time_limit_s, row 2: 'soon' is neither seconds nor a Slurm time limit"),
    ("end_ts", "yesterday", r"column end_ts: not ISO 8601 or epoch seconds"),
    ("nodes", "gpu[01-02", r"column nodes, row 2: 'gpu\[01-02' is not a Slurm host list"),
    # read in part, a job's GPUs the cell names unreadably would be nobody's: a neighbour's idle one taken for theirs
    ("gpu_ids", "gpu01:gpu3", r"column gpu_ids, row 2: 'gpu01:gpu3' is not read whole \('gpu01:gpu3': 'gpu3' is no"),
    ("gpu_ids", "gpu01:0,gpu02:x", r"column gpu_ids, row 2: 'gpu01:0,gpu02:x' is not read whole"),
    ("gpu_ids", "gpu[01-02:0", r"column gpu_ids, row 2: 'gpu\[01-02:0' is not read whole \(.*names no host"),
])
def test_a_bad_cell_names_its_column_and_row(tmp_path: Path, column: str, value: str, message: str) -> None:
    frame = pd.DataFrame({"job_id": ["1", "2"], "user": ["a", "b"], "start_ts": [1.0, 2.0], "end_ts": [5.0, 6.0],
                          "gpus": ["1", "2"], "time_limit_s": ["60", "60"], "nodes": ["gpu01", "gpu[01-02]"],
                          "gpu_ids": ["gpu01:0", "N/A"]}, dtype=object)
    frame.loc[1, column] = value
    frame.to_csv(tmp_path / "jobs.csv", index=False)
    with pytest.raises(TraceError, match=message):
        trace.read_jobs(tmp_path / "jobs.csv")


@pytest.mark.parametrize(("unit", "per_second"), [("s", 1), ("ms", 1e3), ("us", 1e6), ("ns", 1e9)])
def test_epoch_times_in_any_unit_read_as_seconds(tmp_path: Path, unit: str, per_second: float) -> None:
    """Epoch milliseconds (what JavaScript, Java and many loggers write), micro- and nanoseconds (Arrow, pandas) are
    told by their size; a column holding a stray 0 or a missing cell is told by its typical row."""
    start = 1_795_000_000 + 60 * np.arange(50)
    frame = pd.DataFrame({"job_id": [str(i) for i in range(50)], "user": "a",
                          "start_ts": (start * per_second).astype(np.int64), "end_ts": (start + 3600) * per_second})
    frame.loc[3, "end_ts"] = np.nan
    frame.loc[4, "end_ts"] = 0
    frame.to_csv(tmp_path / "jobs.csv", index=False)
    jobs = trace.read_jobs(tmp_path / "jobs.csv")
    np.testing.assert_allclose(jobs["start_ts"].to_numpy(), start)
    # a 0 is "not known" (Slurm JSON), as a missing cell is
    assert np.isnan(jobs["end_ts"][3]) and np.isnan(jobs["end_ts"][4]) and jobs["end_ts"][5] == start[5] + 3600


@pytest.mark.parametrize(("text", "pairs"), [
    ("gpu01:0,gpu01:1,gpu02:3", [("gpu01", 0), ("gpu01", 1), ("gpu02", 3)]),
    ("gpu01:0-3", [("gpu01", 0), ("gpu01", 1), ("gpu01", 2), ("gpu01", 3)]),
    ("gpu01:0,2,gpu02:1-2", [("gpu01", 0), ("gpu01", 2), ("gpu02", 1), ("gpu02", 2)]),
    ("", []), (None, []), ("gpu01:x", []), ("n.example.org:2", [("n.example.org", 2)]),
    # a Slurm host list before the indices, as scontrol show job -d pairs Nodes= with IDX:
    ("gpu[01-02]:0-1", [("gpu01", 0), ("gpu01", 1), ("gpu02", 0), ("gpu02", 1)]),
    ("gpu[01,03]:2,gpu05:0", [("gpu01", 2), ("gpu03", 2), ("gpu05", 0)]),
    ("gpu[01-02:0", [])])
def test_gpu_ids_as_the_trace_format_and_slurm_write_them(text: str | None, pairs: list[tuple[str, int]]) -> None:
    assert trace.parse_gpu_ids(text) == pairs
    if pairs or not text:  # what reads whole reads the same when strict; the rest is refused
        assert trace.parse_gpu_ids(text, strict=True) == pairs
    else:
        with pytest.raises(ValueError):
            trace.parse_gpu_ids(text, strict=True)


def test_a_samples_gpu_column_of_device_names_is_refused_naming_the_row(tmp_path: Path) -> None:
    """DCGM's ``device`` label (nvidia3) is the device file's minor number, not always NVML's index: not guessed."""
    pd.DataFrame({"ts": [1.0, 1.0, 61.0], "host": "a", "gpu": ["0", "nvidia1", "0"], "util": 5.0,
                  "mem_used_mib": 100.0}).to_csv(tmp_path / "s.csv", index=False)
    with pytest.raises(TraceError, match=r"column gpu must hold GPU indices \(integers\); row 2 has 'nvidia1'"):
        trace.read_samples(tmp_path / "s.csv")


@pytest.mark.parametrize("seed", range(30))
def test_whole_nodes_are_placed_only_when_the_job_is_alone_on_them(seed: int) -> None:
    """Random jobs on random 4- and 8-GPU nodes: a job is placed exactly when it names nodes of one size, asks for
    all their GPUs, holds none placed, and no other job overlaps it on any of them; then on every GPU they have."""
    from gpu_cost.perceive.trace import whole_nodes

    rng = np.random.default_rng(seed)
    node_gpus = {f"n{i}": list(range(int(rng.choice([4, 8])))) for i in range(6)}
    jobs = []
    for k in range(int(rng.integers(1, 12))):
        nodes = tuple(sorted(rng.choice(list(node_gpus), size=int(rng.integers(1, 3)), replace=False).tolist()))
        start = float(rng.integers(0, 100))
        full = sum(len(node_gpus[h]) for h in nodes)
        gpus = full if rng.random() < 0.6 else int(rng.integers(1, full + 1))
        placed = {nodes[0]: [0]} if rng.random() < 0.2 else {}
        jobs.append((str(k), start, start + float(rng.integers(1, 60)), nodes, gpus, placed))
    got = whole_nodes(jobs, node_gpus)
    for jid, start, end, nodes, gpus, placed in jobs:
        sizes = {len(node_gpus[h]) for h in nodes}
        alone = not any(o != jid and s < end and start < e and set(nodes) & ({*n, *p})
                        for o, s, e, n, _, p in jobs)
        want = not placed and len(sizes) == 1 and gpus == sum(len(node_gpus[h]) for h in nodes) and alone
        assert (jid in got) == want, (jid, jobs)
        if want:
            assert got[jid] == {h: node_gpus[h] for h in nodes}


def test_the_trace_source_places_a_whole_node_job_and_leaves_a_partial_one_unplaced() -> None:
    t = 1_800_000_000.0
    samples = pd.DataFrame({"ts": t + 100.0, "host": ["g1"] * 4 + ["g2"] * 4, "gpu": [0, 1, 2, 3] * 2, "util": 0.0,
                            "mem_used_mib": 0.0})
    jobs = trace.normalise_jobs(pd.DataFrame({"job_id": ["1", "2"], "user": "a", "start_ts": [t, t],
                                              "gpus": [4, 2], "nodes": ["g1", "g2"]}))
    got = {j.job_id: j for j in trace.jobs_at(jobs, samples, t + 100.0)}
    assert got["1"].gpu_alloc == (("g1", (0, 1, 2, 3)),) and got["1"].gpu_count == 4
    assert got["2"].gpu_alloc == () and got["2"].gpus_requested == 2 and got["2"].nodes == ("g2",)


@pytest.mark.parametrize(("column", "value"), [("gpus", "lots"), ("time_limit_s", "soon"), ("nodes", "gpu[0")])
def test_a_bad_cell_below_job_steps_is_named_by_its_row_in_the_file(tmp_path: Path, column: str, value: str) -> None:
    """The step rows are left out before the cells are read; the row an error names is still the file's (the last
    job, 1005, is the file's 8th row, the 5th job)."""
    frame = pd.read_csv(pd.io.common.StringIO(SACCT), dtype=str, keep_default_na=False)
    frame.loc[len(frame) - 1, column] = value
    frame.to_csv(tmp_path / "jobs.csv", index=False)
    with pytest.raises(TraceError, match=rf"column {column}, row 8: "):
        trace.read_jobs(tmp_path / "jobs.csv")


def test_a_trace_that_places_jobs_on_nodes_no_sample_names_is_degraded() -> None:
    """The trace source sees job 1 on g2 and job 2 on g1, and GPU samples from g1 and 10.0.0.2:9400 only: what runs
    on g2 is not seen, so the snapshot is degraded (nothing destructive acts) as a live sweep's is, and the
    address's GPUs, which may be g2's, are nobody's zombies; g1's GPU no job holds is still "no job's"."""
    from gpu_cost.analyse.rules import run_rules

    now = 1_800_000_000.0
    ts = np.arange(now - 3600, now + 1, 60.0)
    samples = pd.concat([pd.DataFrame({"ts": ts, "host": host, "gpu": gpu, "util": 0.0, "mem_used_mib": 30_000.0,
                                       "pid": 42})
                         for host in ("g1", "10.0.0.2:9400") for gpu in (0, 1)], ignore_index=True)
    jobs = pd.DataFrame({"job_id": ["1", "2"], "user": ["ann", "bob"], "start_ts": [now - 7200] * 2,
                         "end_ts": [np.nan] * 2, "gpus": [1, 1], "gpu_ids": ["g2:0", "g1:0"]})
    snap = trace.snapshot(_policy(), now, samples, jobs)
    assert snap.degraded and "no GPU series for node(s) running GPU jobs: g2 (exporter missing?)" in snap.problems
    seen = snap.gpus.set_index(["host", "gpu"])["attribution"].to_dict()
    assert seen == {("g1", 0): "slurm", ("g1", 1): "none", ("10.0.0.2:9400", 0): "unplaced",
                    ("10.0.0.2:9400", 1): "unplaced"}
    zombies = [f.target for f in run_rules(snap, _policy()) if f.rule == "zombie"]
    assert zombies == ["gpu:g1:1"]  # the samples have pids, but a trace has no process list: the GPU is the target
    # named as the jobs name it, g2 is seen: nothing is missing
    snap = trace.snapshot(_policy(), now, samples.replace({"host": {"10.0.0.2:9400": "g2:9400"}}), jobs)
    assert not snap.degraded and set(snap.gpus["host"]) == {"g1", "g2"}


def test_the_trace_source_leaves_a_gpu_labelled_with_a_job_the_file_misses_to_nobody() -> None:
    """g1:0 is labelled with job 9, which the jobs file does not list; g1:1 with job 3, which it lists as ended. Only
    the second holds memory for no job: a zombie. The first may be job 9's, still running."""
    from gpu_cost.analyse.rules import run_rules

    now = 1_800_000_000.0
    ts = np.arange(now - 3600, now + 1, 60.0)
    samples = pd.concat([pd.DataFrame({"ts": ts, "host": "g1", "gpu": gpu, "util": 0.0, "mem_used_mib": 30_000.0,
                                       "job_id": label}) for gpu, label in ((0, "9"), (1, "3"))], ignore_index=True)
    jobs = pd.DataFrame({"job_id": ["3"], "user": ["ann"], "start_ts": [now - 9000], "end_ts": [now - 7200],
                         "gpus": [1], "gpu_ids": ["g1:1"]})
    snap = trace.snapshot(_policy(), now, samples, jobs)
    assert snap.gpus.set_index("gpu")["attribution"].to_dict() == {0: "unplaced", 1: "none"}
    assert [f.target for f in run_rules(snap, _policy()) if f.rule == "zombie"] == ["gpu:g1:1"]


def test_the_trace_source_refuses_a_jobs_file_in_another_time_zone() -> None:
    """Six jobs, each labelled on its GPU from its start to its end; the jobs file written 8 h ahead (local time in
    UTC+8, no offset) is refused; written in UTC it reads."""
    now = 1_800_000_000.0
    ts = np.arange(now - 12 * 3600, now + 1, 60.0)
    starts = now - 11 * 3600 + 3600 * np.arange(6)
    rows = []
    for k, start in enumerate(starts):
        on = (ts >= start) & (ts < start + 3 * 3600)
        rows.append(pd.DataFrame({"ts": ts, "host": "g1", "gpu": k, "util": 50.0, "mem_used_mib": 1000.0,
                                  "job_id": np.where(on, str(100 + k), "")}))
    samples = pd.concat(rows, ignore_index=True)
    jobs = pd.DataFrame({"job_id": [str(100 + k) for k in range(6)], "user": "ann", "start_ts": starts,
                         "end_ts": starts + 3 * 3600, "gpus": 1})
    assert not trace.snapshot(_policy(), now, samples, jobs).degraded
    with pytest.raises(TraceError, match=r"the jobs' times run 8.0\d h ahead of the samples'"):
        trace.snapshot(_policy(), now, samples, jobs.assign(start_ts=starts + 8 * 3600, end_ts=starts + 11 * 3600))


def test_the_trace_source_takes_a_job_at_its_first_label_when_its_start_is_earlier() -> None:
    """Job 100's GPU is labelled from 9 minutes ago, idle since; the jobs file says it started 5 h ago (its submit
    time). Read so, its idle GPU was an idle allocation past any warm-up; taken at its first label, a step before
    it, the job is 10 minutes old, younger than the rule's window. Job 101, labelled from the samples' first, is
    left as the file says."""
    from gpu_cost.analyse.rules import run_rules

    now = 1_800_000_000.0
    ts = np.arange(now - 3 * 3600, now + 1, 60.0)
    samples = pd.concat([
        pd.DataFrame({"ts": ts, "host": "g1", "gpu": 0, "util": 0.0, "mem_used_mib": 30_000.0,
                      "job_id": np.where(ts > now - 600, "100", "")}),
        pd.DataFrame({"ts": ts, "host": "g1", "gpu": 1, "util": 90.0, "mem_used_mib": 30_000.0, "job_id": "101"}),
    ], ignore_index=True)
    jobs = pd.DataFrame({"job_id": ["100", "101"], "user": "ann", "start_ts": [now - 5 * 3600, now - 6 * 3600],
                         "end_ts": np.nan, "gpus": 1, "gpu_ids": ["g1:0", "g1:1"]})
    snap = trace.snapshot(_policy(), now, samples, jobs)
    assert {j.job_id: j.start_ts for j in snap.jobs} == {"100": now - 600, "101": now - 6 * 3600}
    assert not [f for f in run_rules(snap, _policy()) if f.job_id == "100"]
    agreed = trace.snapshot(_policy(), now, samples, jobs.assign(start_ts=[now - 600] * 2))
    assert [j.start_ts for j in agreed.jobs] == [now - 600] * 2  # a start the samples agree with is as written


@pytest.mark.parametrize("seed", range(25))
def test_a_start_moves_only_later_and_only_where_the_samples_contradict_it(seed: int) -> None:
    """Random jobs files against random label spans (a step of 15 s to 5 min): a start is moved only when the job's
    first label lies more than two steps after it and after the samples' first time, and then to a step before
    that label; every other row (no label, labelled from the samples' first time, within two steps of its label, a
    requeued run after its label, no start) is as written, and the note counts the jobs moved."""
    rng = np.random.default_rng(seed)
    step = float(rng.choice([15.0, 30.0, 60.0, 300.0]))
    first_ts = 1_800_000_000.0
    n = int(rng.integers(1, 40))
    ids = [str(int(x)) for x in rng.integers(100, 100 + max(2, n // 2), n)]  # some ids repeat: requeued runs
    starts = first_ts + rng.uniform(-6, 30, n) * 3600
    starts[rng.random(n) < 0.1] = np.nan
    spans = {}
    for jid in set(ids):
        if rng.random() < 0.8:
            a = first_ts if rng.random() < 0.2 else first_ts + float(rng.uniform(0, 30)) * 3600
            spans[jid] = (a, a + 3600.0)
    jobs = pd.DataFrame({"job_id": ids, "user": "u", "start_ts": starts})
    jobs.attrs["source"] = "jobs.csv"
    out, note = trace.labelled_starts(jobs, spans, first_ts, step)
    moved = set()
    for jid, before, after in zip(ids, starts, out["start_ts"], strict=True):
        if before != before:
            assert after != after
            continue
        first = spans.get(jid, (None,))[0]
        if first is not None and first > first_ts + 2 * step and first - before > 2 * step:
            assert after == first - step > before
            moved.add(jid)
        else:
            assert after == before
    assert out.attrs["source"] == "jobs.csv" and jobs["start_ts"].equals(pd.Series(starts))  # the input is not changed
    assert (note is None) == (not moved)
    if moved:
        assert note.startswith(f"{len(moved)} job(s) start in the jobs file before the samples first label")


def test_slurm_json_s_zero_times_read_as_not_known_and_an_end_before_its_start_is_refused(tmp_path: Path) -> None:
    """sacct --json writes 0 for a time not known yet: a pending job's start, a running job's end. Read as 1970, the
    pending job would run forever holding GPUs no source places, and the running one would have ended before it
    began, its processes zombies. A real end before its start is bad data: refused, its row named."""
    frame = pd.DataFrame({"job_id": ["1", "2", "3"], "user": ["a", "b", "c"],
                          "start_ts": [1_800_000_000.0, 1_800_000_100.0, 0.0], "end_ts": [1_800_003_600.0, 0.0, 0.0],
                          "gpus": [1, 2, 8]})
    frame.to_csv(tmp_path / "jobs.csv", index=False)
    jobs = trace.read_jobs(tmp_path / "jobs.csv").set_index("job_id")
    assert jobs.loc["1", "end_ts"] == 1_800_003_600.0 and np.isnan(jobs.loc["2", "end_ts"])
    assert np.isnan(jobs.loc["3", "start_ts"]) and np.isnan(jobs.loc["3", "end_ts"])
    frame.loc[1, "end_ts"] = 1_799_999_000.0
    frame.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(TraceError, match=r"bad\.csv: row 2 \(job 2\): end_ts 1799999000 is before start_ts 1800000100"):
        trace.read_jobs(tmp_path / "bad.csv")


def test_the_trace_source_refuses_two_samples_of_one_gpu_at_one_time_that_differ() -> None:
    now = 1_800_000_000.0
    ts = np.arange(now - 3600, now + 1, 60.0)
    busy = pd.DataFrame({"ts": ts, "host": "g1", "gpu": 0, "util": 90.0, "mem_used_mib": 30_000.0})
    jobs = pd.DataFrame({"job_id": ["1"], "user": ["ann"], "start_ts": [now - 7200], "gpus": [1], "gpu_ids": ["g1:0"]})
    assert not trace.snapshot(_policy(), now, pd.concat([busy, busy.iloc[::5]]), jobs).degraded  # replicas agree
    with pytest.raises(TraceError, match=r"\(g1 GPU 0 at 2027-01-15T07:00:00Z: util 90 and 0, memory 30000 and 30000 MiB\)"):
        trace.snapshot(_policy(), now, pd.concat([busy, busy.assign(util=0.0)]), jobs)


def test_a_requeued_job_s_run_ends_when_its_next_run_starts() -> None:
    """Job 7 was written while its first run ran (no end), then requeued and run again; job 8's first run is written
    ending after its second began. Slurm runs one job id once at a time: each first run is read as ended when the
    second started, so at any instant one run of each is running (the trace source's jobs_at)."""
    t = 1_800_000_000.0
    jobs = trace.normalise_jobs(pd.DataFrame({
        "job_id": ["7", "8", "7", "8", "9"], "user": "a", "start_ts": [t, t, t + 3600, t + 3600, t],
        "end_ts": [np.nan, t + 5000, t + 7200, t + 7200, np.nan], "gpus": 1,
        "gpu_ids": ["g1:0", "g1:1", "g1:2", "g1:3", "g2:0"]}))
    ends = {(j, s): e for j, s, e in zip(jobs["job_id"], jobs["start_ts"], jobs["end_ts"], strict=True)}
    assert ends[("7", t)] == t + 3600 and ends[("8", t)] == t + 3600 and np.isnan(ends[("9", t)])
    assert ends[("7", t + 3600)] == t + 7200 and jobs.attrs["runs_cut"] == 2
    samples = pd.DataFrame({"ts": t + 4000, "host": ["g1"] * 4 + ["g2"], "gpu": [0, 1, 2, 3, 0], "util": 50.0,
                            "mem_used_mib": 100.0})
    running = trace.jobs_at(jobs, samples, t + 4000)
    assert sorted((j.job_id, j.gpu_alloc) for j in running) == [
        ("7", (("g1", (2,)),)), ("8", (("g1", (3,)),)), ("9", (("g2", (0,)),))]
