"""Samples as exporters and files write them: text columns, frames handed over, Parquet from a filtered frame, ISO times and CSV, off the step, own phases, lost samples, too fine to hold."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_cost.core.errors import TraceError
from gpu_cost.sim.replay import (
    _text_codes,
    normalise_jobs,
    process_starts,
    read_logs,
    replay,
    replay_files,
)
from tests.unit.replay.support import _kill_targets


def test_iso_times_and_csv_samples_work(tmp_path: Path, truth_trace: Path, policy) -> None:  # type: ignore[no-untyped-def]
    s = pd.read_parquet(truth_trace / "samples.parquet")
    s["ts"] = pd.to_datetime(s["ts"], unit="s", utc=True).dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    s.to_csv(tmp_path / "samples.csv", index=False)
    a = replay_files(tmp_path / "samples.csv", truth_trace / "jobs.csv", policy)
    b = replay_files(truth_trace / "samples.parquet", truth_trace / "jobs.csv", policy)
    assert a.reclaimed_gpu_hours == pytest.approx(b.reclaimed_gpu_hours) and a.kills == b.kills == 2


def test_text_columns_read_as_categories_replay_as_plain_text(truth_trace: Path, policy) -> None:  # type: ignore[no-untyped-def]
    # replay_files reads host, job and user as categoricals; a frame handed over keeps plain text
    s = pd.read_parquet(truth_trace / "samples.parquet")
    plain = s.astype({c: object for c in ("host", "job_id", "user") if c in s.columns})
    a = replay([plain], normalise_jobs(pd.read_csv(truth_trace / "jobs.csv")), policy,
               logs=read_logs(truth_trace / "logs.csv")).to_dict()
    b = replay_files(truth_trace / "samples.parquet", truth_trace / "jobs.csv", policy).to_dict()
    for r in (a, b):
        r.pop("seconds"), r.pop("notes")
    assert a == b and b["kills"] == 2


def test_a_frame_handed_over_is_emptied_and_replays_as_one_kept(truth_trace: Path, policy) -> None:  # type: ignore[no-untyped-def]
    # a one-element list hands the samples over: each column leaves the frame once it is in its matrix
    # (a week's trace need not be held twice); a frame passed as it is stays the caller's, untouched
    s = pd.read_parquet(truth_trace / "samples.parquet")
    jobs = normalise_jobs(pd.read_csv(truth_trace / "jobs.csv"))
    logs = read_logs(truth_trace / "logs.csv")
    kept = s.copy()
    holder = [s]
    a = replay(holder, jobs, policy, logs=logs).to_dict()
    b = replay(kept, jobs, policy, logs=logs).to_dict()
    assert holder == [] and not {"ts", "host", "gpu", "util", "mem_used_mib", "job_id", "pid", "user"} & set(s.columns)
    assert list(kept.columns) == list(pd.read_parquet(truth_trace / "samples.parquet").columns)
    for r in (a, b):
        r.pop("seconds")
    assert a == b and a["kills"] == 2


def test_text_codes_name_each_distinct_text_once() -> None:
    col = pd.Series(["b", 1, None, "1", "a", "b"], dtype=object)
    codes, names = _text_codes(col)
    assert list(names) == ["", "1", "a", "b"]
    assert [names[c] for c in codes] == ["b", "1", "", "1", "a", "b"]
    cat_codes, cat_names = _text_codes(pd.Series(["b", None, "a"], dtype="category"), missing="nan")
    assert [cat_names[c] for c in cat_codes] == ["b", "nan", "a"]
    # the replay's job codes rely on it: the missing text is always name 0, even when nothing is missing
    assert list(_text_codes(pd.Series(["b", "a"]))[1]) == ["", "a", "b"]


@pytest.mark.parametrize("keep", ["g2", "every other row"])
def test_a_parquet_written_from_a_filtered_frame_reads_its_own_rows(truth_trace: Path, policy, keep: str) -> None:  # type: ignore[no-untyped-def]
    """pandas writes a frame's index into Parquet: a filtered frame's starts past 0 (5760, 5761...) or skips rows.
    The replay reads a file a column at a time into a frame of its own; aligned on the file's index, most cells were
    NaN and the file was refused ("column gpu must hold GPU indices") or read as other rows. It reads as the same
    rows written with a fresh index."""
    s = pd.read_parquet(truth_trace / "samples.parquet")
    part = s[s["host"].astype(str) == keep] if keep == "g2" else s.iloc[::2]
    assert not part.index.equals(pd.RangeIndex(len(part)))
    part.to_parquet(filtered := truth_trace.parent / f"filtered-{len(part)}.parquet")
    part.reset_index(drop=True).to_parquet(fresh := truth_trace.parent / f"fresh-{len(part)}.parquet")
    a = replay_files(filtered, truth_trace / "jobs.csv", policy).to_dict()
    b = replay_files(fresh, truth_trace / "jobs.csv", policy).to_dict()
    a.pop("seconds"), b.pop("seconds")
    assert a == b and a["gpu_hours"] > 0


@pytest.mark.parametrize("seed", range(3))
def test_samples_off_the_step_replay_as_the_samples_on_it(truth_trace: Path, policy, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Each host's exporter on its own clock and a scrape's jitter put a trace's GPUs a few seconds apart: the replay
    reads every sample at its step and decides as on the aligned trace (it read each GPU as its own time before:
    1 s "samples", every sweep degraded, nothing found)."""
    s = pd.read_parquet(truth_trace / "samples.parquet")
    rng = np.random.default_rng(seed)
    offset = {h: float(rng.uniform(0, 20)) for h in s["host"].unique()}  # under half the 60 s step, with the jitter
    s["ts"] = s["ts"] + s["host"].map(offset) + rng.uniform(0, 9, len(s))
    s.to_parquet(tmp := truth_trace.parent / f"off-step-{seed}.parquet")
    a = replay_files(tmp, truth_trace / "jobs.csv", policy).to_dict()
    b = replay_files(truth_trace / "samples.parquet", truth_trace / "jobs.csv", policy).to_dict()
    assert any("do not line up" in n for n in a.pop("notes")) and not any("line up" in n for n in b.pop("notes"))
    a.pop("seconds"), b.pop("seconds")
    assert a == b and b["kills"] == 2 and b["degraded_sweeps"] == 0


@pytest.mark.parametrize("seed", range(6))
def test_hosts_scraped_at_their_own_phase_and_interval_replay_as_one_fleet(truth_trace: Path, policy,
                                                                          seed: int) -> None:  # type: ignore[no-untyped-def]
    """Random hosts scraped 2, 3 or 5 times more slowly than the trace's step, every host at its own phase of the
    step (some exactly half a step off, in whole seconds) with a second or two of jitter: the replay kills what it
    kills on the plain trace, and nothing falsely. (Before: a host half a step off lost every other sample, a slower
    host read as half empty, and a generated day of either made 2 false kills.)"""
    rng = np.random.default_rng(seed)
    s = pd.read_parquet(truth_trace / "samples.parquet")
    s["host"] = s["host"].astype(str)
    hosts = sorted(s["host"].unique())
    slow = {h: int(rng.choice([2, 3, 5])) for h in hosts if rng.random() < 0.6}
    for h, k in slow.items():
        first = s.loc[s["host"] == h, "ts"].min()
        s = s[(s["host"] != h) | (((s["ts"] - first) // 60) % k == 0)]
    phase = {h: 30.0 if rng.random() < 0.4 else float(rng.uniform(0, 60)) for h in hosts}
    s = s.assign(ts=(s["ts"] + s["host"].map(phase) + rng.uniform(-2, 2, len(s))).round(0 if seed % 2 else 3))
    s.to_parquet(shifted := truth_trace.parent / f"phased-{seed}.parquet")
    a = replay_files(shifted, truth_trace / "jobs.csv", policy).to_dict()
    b = replay_files(truth_trace / "samples.parquet", truth_trace / "jobs.csv", policy).to_dict()
    assert a["false_kills"] == 0 and a["degraded_sweeps"] == 0
    assert _kill_targets(a) == _kill_targets(b) and len(_kill_targets(b)) == 2
    if slow and len(slow) < len(hosts):
        assert any("slower than its 60s" in n for n in a["notes"])


@pytest.mark.parametrize("seed", range(4))
def test_samples_lost_at_random_do_not_make_a_zombie_several_processes(truth_trace: Path, policy,
                                                                      seed: int) -> None:  # type: ignore[no-untyped-def]
    """Random samples (1 % to 10 %) missing, as scrapes fail on a real cluster: the zombie is one process, killed
    once, as on the whole trace. (Before: each missed sample started a new process of the same PID, whose ladder
    began again: the kill came hours late, and the process lived on after it to be killed twice more.)"""
    rng = np.random.default_rng(seed)
    s = pd.read_parquet(truth_trace / "samples.parquet")
    s[rng.random(len(s)) >= rng.uniform(0.01, 0.1)].to_parquet(lossy := truth_trace.parent / f"lossy-{seed}.parquet")
    a = replay_files(lossy, truth_trace / "jobs.csv", policy).to_dict()
    b = replay_files(truth_trace / "samples.parquet", truth_trace / "jobs.csv", policy).to_dict()
    assert a["false_kills"] == 0 and a["kills"] == b["kills"] == 2
    assert _kill_targets(a) == _kill_targets(b)
    assert a["reclaimed_gpu_hours"] >= 0.9 * b["reclaimed_gpu_hours"]  # not hours late


def test_a_process_starts_where_a_sample_shows_another_pid_not_where_one_is_missing() -> None:
    pid = np.array([[7, 7, 0, 7, 8, 0, 0, 8, 0, 7], [0, 0, 5, 5, 0, 5, 6, 6, 0, 0]], dtype=np.int32)
    seen = np.array([[1, 1, 0, 1, 1, 0, 1, 1, 0, 1], [0, 0, 1, 1, 0, 1, 1, 1, 0, 1]], dtype=bool)
    # row 0: 7 through a missed sample, 8 from column 4 (through a missed one and a sample with no process at 6:
    # that is another "PID", 0), then 8 again at 7 is new, 7 at 9 new; row 1: 5 from 2 through a miss, 6 from 6
    assert process_starts(pid, seen, block=1).tolist() == [[0, 0, 0, 0, 4, 4, 6, 7, 7, 9],
                                                            [0, 0, 2, 2, 2, 2, 6, 6, 6, 9]]


@pytest.mark.parametrize("cells", [20_000, 3_000])
def test_a_trace_too_fine_to_hold_is_read_at_a_coarser_step(truth_trace: Path, policy, monkeypatch,
                                                            cells: int) -> None:  # type: ignore[no-untyped-def]
    """A trace sampled every 5 s, over more GPU × time cells than the replay holds (here a few thousand; 25 million
    as shipped, a week of a hundred GPUs at 1 s is 60 million): read at the least usual step that fits, each GPU's
    latest sample of the step standing for it, with a note; it finds what the minute trace finds. (Before: the
    matrices were made whatever their size, and a fine trace of a real fleet ran out of memory.)"""
    from gpu_cost.perceive import aggregate

    s = pd.read_parquet(truth_trace / "samples.parquet")
    fine = pd.concat([s.assign(ts=s["ts"] - 55 + 5 * i) for i in range(12)])  # each minute's sample, every 5 s
    fine.to_parquet(path := truth_trace.parent / f"fine-{cells}.parquet")
    monkeypatch.setattr(aggregate, "MAX_CELLS", cells)
    a = replay_files(path, truth_trace / "jobs.csv", policy).to_dict()
    b = replay_files(truth_trace / "samples.parquet", truth_trace / "jobs.csv", policy).to_dict()
    step = a["sample_interval_s"]
    assert step in aggregate.NOMINAL_STEPS and step > 5 and 8 * (86400 / step) <= cells
    assert any(f"read at a {step:g}s step" in n for n in a["notes"])
    assert a["false_kills"] == 0 and _kill_targets(a) == _kill_targets(b)


def test_two_samples_of_one_gpu_at_one_time_that_differ_are_refused(truth_trace: Path, policy) -> None:  # type: ignore[no-untyped-def]
    """MIG instances exported without their instance, or two exporters on one GPU, give a GPU several samples at
    one time. Read as one, the last would stand for the GPU: an idle instance listed after the busy one made busy
    jobs look idle, and the replay, judging kills on the same matrix, counted none false. Refused, the first such
    GPU and time named; duplicates that agree (two Prometheus replicas) replay as the samples once."""
    s = pd.read_parquet(truth_trace / "samples.parquet")
    host, gpu = str(s["host"].iloc[0]), int(s["gpu"].iloc[0])
    idle = s[(s["host"] == host) & (s["gpu"] == gpu)].assign(util=0.0, mem_used_mib=500.0)
    pd.concat([s, idle], ignore_index=True).to_parquet(two := truth_trace.parent / "two-series.parquet")
    with pytest.raises(TraceError, match=rf"sample\(s\) share their GPU and time with another that differs "
                                         rf"\({host} GPU {gpu} at "):
        replay_files(two, truth_trace / "jobs.csv", policy)
    pd.concat([s, s.iloc[::7]], ignore_index=True).to_parquet(again := truth_trace.parent / "replicas.parquet")
    a = replay_files(again, truth_trace / "jobs.csv", policy).to_dict()
    b = replay_files(truth_trace / "samples.parquet", truth_trace / "jobs.csv", policy).to_dict()
    a.pop("seconds"), b.pop("seconds")
    assert a == b
