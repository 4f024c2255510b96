"""The replay's figures (GPU-hours held, idle, reclaimed) and real fleets' traces: without memory, averaged exports."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_cost.cli.commands.simtrace import write_scenario_trace, write_sim_trace
from gpu_cost.config.loader import load_policy
from gpu_cost.sim.replay import (
    replay_files,
)
from tests.unit.replay.support import DAY, END, _kill_targets, _scenario


def test_what_was_reclaimed_counts_for_the_jobs_that_were_killed(truth_trace: Path, policy) -> None:  # type: ignore[no-untyped-def]
    """One definition (issue 39, row 4): the GPU-hours reclaimed are counted per behaviour with the kills
    that freed them, so "training" is never credited with GPU time while its row says nothing was killed."""
    from gpu_cost.sim.replay import summary_text

    res = replay_files(truth_trace / "samples.parquet", truth_trace / "jobs.csv", policy).to_dict()
    rows = res["by_behaviour"]
    assert rows["zombie"]["killed"] == 1 and rows["zombie"]["reclaimed_gpu_hours"] > 0
    assert rows["training"]["killed"] == 0 and rows["training"]["reclaimed_gpu_hours"] == 0
    assert sum(r["reclaimed_gpu_hours"] for r in rows.values()) == pytest.approx(res["reclaimed_gpu_hours"], abs=0.01)
    text = summary_text(res)
    assert "reclaimed by kind of job" not in text, text
    for beh, row in rows.items():
        line = next(x for x in text.splitlines() if x.strip().startswith(f"{beh}:"))
        assert f"killed {row['killed']} " in line and f"reclaimed {row['reclaimed_gpu_hours']:,.1f} GPU-h" in line


@pytest.mark.parametrize("seed", range(5))
def test_idle_gpu_hours_count_every_held_idle_sample_across_blocks_of_gpus(seed: int) -> None:
    """The idle GPU-hours are counted a block of GPUs at a time without float copies of the matrices: the
    same count as over the whole matrix at once, missing samples (NaN) neither held by memory nor idle. A GPU of a
    host whose samples carry no job label is held while a job of the jobs file holds it (until a kill)."""
    import numpy as np

    from gpu_cost.sim.replay import _Alloc, _Replay

    rng = np.random.default_rng(seed)
    gpus, cols = int(rng.integers(1, 300)), int(rng.integers(1, 50))
    util = rng.choice([0.0, 0.2, 5.0, 80.0, np.nan], size=(gpus, cols))
    mem = rng.choice([0.0, 100.0, 4096.0, np.nan], size=(gpus, cols))
    job_code = rng.integers(0, 3, size=(gpus, cols)).astype(np.int32)
    unlabelled = rng.random(gpus) < 0.5
    job_code[unlabelled] = 0
    times = 1_000_000.0 + 60.0 * np.arange(cols)
    by_file = np.zeros((gpus, cols), dtype=bool)
    allocs = {}
    for k in range(int(rng.integers(0, 40))):
        rows = np.sort(rng.choice(gpus, size=int(rng.integers(1, min(gpus, 8) + 1)), replace=False))
        c0 = int(rng.integers(0, cols))
        c1 = int(rng.integers(c0, cols + 1))
        end = math.inf if c1 == cols and rng.random() < 0.5 else float(times[0]) + 60.0 * c1 - 30.0
        killed = int(rng.integers(c0, cols)) if rng.random() < 0.3 else None
        a = _Alloc(job=None, rows=rows, start=float(times[c0]) - 10.0, end=end)  # type: ignore[arg-type]
        if killed is not None:
            a.killed_at = float(times[killed]) + 5.0  # held through the kill's sample, free from the next on
            c1 = min(c1, killed + 1)
        allocs[str(k)] = a
        by_file[np.ix_(rows[unlabelled[rows]], np.arange(c0, c1))] = True
    eng = _Replay.__new__(_Replay)
    eng.policy, eng.idle_measure, eng.dt = load_policy(), (1.0, 1000.0), 60.0
    eng.util, eng.mem, eng.job_code = util, mem, job_code
    eng.times, eng.allocs, eng.unlabelled, eng.renumbered = times, allocs, unlabelled, {}
    held = (job_code != 0) | (np.nan_to_num(mem, nan=0.0) > 1000.0) | by_file
    idle = ~np.isnan(util) & (np.nan_to_num(util, nan=100.0) < 1.0)
    assert eng._idle_hours() == float((held & idle).sum() * 60.0 / 3600.0)


@pytest.mark.parametrize("drop", [["job_id", "pid", "user"], ["job_id", "pid", "user", "mem_used_mib"]])
def test_a_trace_without_job_labels_counts_the_gpus_the_jobs_file_holds(truth_trace: Path, policy,
                                                                         drop: list[str]) -> None:
    """An exporter without job labels (the common real export) leaves the jobs file alone to say which GPUs are
    held. The replay's figures counted labels only: such a trace held nothing (``allocated_gpu_hours`` 0) and its
    idle-held GPU-hours were those holding memory (none where memory is not measured either). They are the labelled
    trace's figures now."""
    s = pd.read_parquet(truth_trace / "samples.parquet")
    bare = s.drop(columns=drop)
    if "mem_used_mib" in drop:
        bare["mem_used_mib"] = np.nan
        s = s.assign(mem_used_mib=np.nan)
    s.to_parquet(labelled := truth_trace.parent / f"labelled-{len(drop)}.parquet")
    bare.to_parquet(path := truth_trace.parent / f"bare-{len(drop)}.parquet")
    a = replay_files(path, truth_trace / "jobs.csv", policy).to_dict()
    b = replay_files(labelled, truth_trace / "jobs.csv", policy).to_dict()
    assert b["allocated_gpu_hours"] > 0 and b["idle_gpu_hours"] > 0
    for k in ("gpu_hours", "allocated_gpu_hours", "idle_gpu_hours"):
        assert a[k] == pytest.approx(b[k], abs=0.05), k


@pytest.mark.parametrize(("mix", "seed"), [("hard", 3), ("hard", 11), ("serving-fleet", 1), ("serving-fleet", 4)])
def test_a_trace_without_memory_kills_no_service(tmp_path: Path, policy, mix: str, seed: int) -> None:  # type: ignore[no-untyped-def]
    """A trace of utilisation alone (memory not measured: a dataset without it, an exporter without the framebuffer
    metric), a generated day of the hard mix (a service fleet among training, idle and finished jobs) or of a serving
    fleet (replicas of a few deployments). Memory is what tells a waiting model from a finished job, so memory not
    measured counts as memory held: no false kill, and nothing killed that the whole trace does not kill (its
    zombies' processes are not seen as zombies without memory). (Before, hard seed 3: 8 kills, 6 of them services:
    their class baselines never saw memory resident. Serving seeds 1 and 4: 3 of 3 and 3 of 4 kills false, replicas
    starved overnight: a replica set was told by its members' resident memory alone.)"""
    write_sim_trace(tmp_path, days=1.0, gpus=32, seed=seed, end=END, sample_interval=30.0, behaviours=mix)
    s = pd.read_parquet(tmp_path / "samples.parquet")
    s.assign(mem_used_mib=np.nan).to_parquet(blind := tmp_path / "no-memory.parquet")
    a = replay_files(blind, tmp_path / "jobs.csv", policy).to_dict()
    b = replay_files(tmp_path / "samples.parquet", tmp_path / "jobs.csv", policy).to_dict()
    assert a["false_kills"] == 0 == b["false_kills"]
    assert {t for t in _kill_targets(a)} <= {t for t in _kill_targets(b) if t.startswith("job:")}
    # the notes say what reading without memory means; with memory they do not
    said = [n for n in a["notes"] if n.startswith("the samples measure no GPU memory")]
    assert len(said) == 1 and not [n for n in b["notes"] if n.startswith("the samples measure no GPU memory")]


@pytest.mark.parametrize("seed", range(6))
def test_work_the_next_job_starts_in_an_averaged_sample_does_not_make_a_kill_false(tmp_path: Path, policy,
                                                                                  seed: int) -> None:
    """An export averaged per bucket (a minute, five) and labelled with the bucket's start puts the first seconds
    of the next job on a GPU into its predecessor's last sample. An idle job killed before its end, followed on its
    GPU at once by a job that computes, was a good kill: the replay must not call it false. A control job that
    really works again late in its life still is."""
    rng = np.random.default_rng(seed)
    end_h = float(rng.uniform(2.5, 4.0))  # the idle job's end, hours before the trace's end, off any bucket
    bucket = float(rng.choice([60.0, 120.0, 300.0]))
    sc = _scenario([
        {"job_id": "301", "user": "hal", "behaviour": "idle", "node": "g1", "gpus": [0], "start": "-20h",
         "end": f"-{end_h * 3600:.0f}s", "busy_first": "30m", "name": "finetune"},
        {"job_id": "302", "user": "ida", "behaviour": "training", "node": "g1", "gpus": [0],
         "start": f"-{end_h * 3600:.0f}s", "name": "train"},
        # the control: idle for hours, then busy again for its last stretch (woken up): killed, the kill was false
        {"job_id": "303", "user": "jon", "behaviour": "idle", "node": "g2", "gpus": [0], "start": "-20h",
         "end": "-1h", "busy_first": "30m", "name": "debug"},
        {"job_id": "304", "user": "jon", "behaviour": "training", "node": "g2", "gpus": [1], "start": "-20h",
         "name": "other"},
    ])
    write_scenario_trace(tmp_path, sc, END - DAY, END)
    s = pd.read_parquet(tmp_path / "samples.parquet").drop(columns=["job_id", "pid", "user"], errors="ignore")
    g2 = (s["host"].astype(str) == "g2") & (s["gpu"] == 0)
    late = g2 & (s["ts"] >= END - 4 * 3600) & (s["ts"] < END - 3600)
    s.loc[late, "util"] = 90.0  # job 303 works again in its last hours
    s["ts"] = (s["ts"] // bucket) * bucket
    agg = s.groupby(["ts", "host", "gpu"], as_index=False, observed=True).agg(
        util=("util", "mean"), mem_used_mib=("mem_used_mib", "max"), mem_total_mib=("mem_total_mib", "first"))
    agg.to_csv(samples := tmp_path / "averaged.csv", index=False)
    res = replay_files(samples, tmp_path / "jobs.csv", policy).to_dict()
    killed = _kill_targets(res)
    assert "job:301" in killed, res["actions"]
    assert "job:301" not in res["false_kill_targets"]
    assert "job:302" not in killed
    assert "job:303" in res["false_kill_targets"]
