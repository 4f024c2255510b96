"""Where a trace places its jobs: unplaced jobs, whole nodes, another unit, samples covering part of the cluster."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from gpu_cost.cli.commands.simtrace import write_scenario_trace
from gpu_cost.core.model import KILL_ACTIONS
from gpu_cost.sim.replay import (
    replay_files,
)
from tests.unit.replay.support import DAY, END, _scenario


def test_jobs_the_trace_does_not_place_leave_their_nodes_gpus_to_nobody(truth_trace: Path, policy) -> None:  # type: ignore[no-untyped-def]
    """An accounting export names a job's nodes and GPU count, not its GPU indices; without the exporter's job labels
    nothing says which GPUs are the job's. Its idle GPUs holding memory are then no zombie: no process is killed
    on them (before: every such job's process was decided for kill_process, "with no running job")."""
    jobs = pd.read_csv(truth_trace / "jobs.csv")
    nodes = jobs["gpu_ids"].fillna("").map(lambda t: ",".join(sorted({p.rpartition(":")[0] for p in t.split(",") if p})))
    jobs.assign(nodes=nodes).drop(columns=["gpu_ids"]).to_csv(truth_trace.parent / "accounting.csv", index=False)
    s = pd.read_parquet(truth_trace / "samples.parquet")
    s.assign(job_id="").to_parquet(bare := truth_trace.parent / "unlabelled.parquet")
    res = replay_files(bare, truth_trace.parent / "accounting.csv", policy)
    assert any("hold GPUs the trace does not place" in n for n in res.notes)
    assert not res.decisions.get("kill_process") and res.kills == 0
    assert res.idle_gpu_hours and res.idle_gpu_hours > 0  # the idle GPUs are still counted as idle


def test_a_gpus_column_in_another_unit_is_named_in_the_notes(truth_trace: Path, policy) -> None:  # type: ignore[no-untyped-def]
    """A ``gpus`` column written as a percentage of a GPU (a scheduler's plan: 100 for one GPU) counts more GPUs than
    the job's ``gpu_ids`` place. The rest are nobody's, so nothing on their nodes is a zombie; the note names a job
    and its two counts, where it said before that the file placed nothing."""
    jobs = pd.read_csv(truth_trace / "jobs.csv", dtype={"job_id": str})
    jobs["gpus"] = jobs["gpu_ids"].fillna("").map(lambda t: 100 * len([x for x in t.split(",") if x]))
    jobs.to_csv(path := truth_trace.parent / "percent.csv", index=False)
    res = replay_files(truth_trace / "samples.parquet", path, policy)
    placed = [n for n in res.notes if "count more GPUs in their gpus column than their gpu_ids or labels place" in n]
    assert len(placed) == 1, res.notes
    counts = re.search(r"\(job \S+: gpus (\d+), placed (\d+)\)", placed[0])
    assert counts is not None and int(counts[1]) == 100 * int(counts[2]) > 0, placed[0]
    assert not [n for n in res.notes if "hold GPUs the trace does not place" in n]
    assert not res.decisions.get("kill_process")


def test_a_job_taking_whole_nodes_is_placed_on_them_when_the_trace_does_not_say(tmp_path: Path, policy) -> None:  # type: ignore[no-untyped-def]
    """An accounting export's job of 4 GPUs on a 4-GPU node, alone there while it runs, holds every GPU of the node:
    the replay judges it as if the trace placed it (the same actions as with its gpu_ids); a job sharing its node
    stays unplaced and is judged by nobody."""
    whole = [{"job_id": "201", "user": "gus", "behaviour": "idle", "node": "g1", "gpus": [0, 1, 2, 3], "start": "-20h",
              "end": "-2h", "busy_first": "30m", "name": "finetune"},
             {"job_id": "202", "user": "hal", "behaviour": "training", "node": "g2", "gpus": [0, 1], "start": "-20h",
              "name": "train"},
             {"job_id": "203", "user": "ivy", "behaviour": "idle", "node": "g2", "gpus": [2, 3], "start": "-20h",
              "end": "-2h", "busy_first": "30m", "name": "finetune"}]
    write_scenario_trace(tmp_path, _scenario(whole), END - DAY, END)
    jobs = pd.read_csv(tmp_path / "jobs.csv")
    nodes = jobs["gpu_ids"].fillna("").map(lambda t: ",".join(sorted({p.rpartition(":")[0] for p in t.split(",") if p})))
    jobs.assign(nodes=nodes).drop(columns=["gpu_ids"]).to_csv(tmp_path / "accounting.csv", index=False)
    s = pd.read_parquet(tmp_path / "samples.parquet")
    s.assign(job_id="").to_parquet(tmp_path / "unlabelled.parquet")
    placed = replay_files(tmp_path / "samples.parquet", tmp_path / "jobs.csv", policy)
    guessed = replay_files(tmp_path / "unlabelled.parquet", tmp_path / "accounting.csv", policy)
    mine = [a for a in placed.actions if a["job_id"] == "201"]
    assert {a["rule"] for a in mine} == {"idle_allocation", "low_efficiency"}
    assert [a for a in guessed.actions if a["job_id"] == "201"] == mine
    assert any(a["job_id"] == "203" for a in placed.actions)
    assert not any(a["job_id"] == "203" for a in guessed.actions)  # shares g2 with 202: not placed, not judged
    assert any(n.startswith("2 job(s) hold GPUs the trace does not place") for n in guessed.notes)  # 202 and 203


@pytest.mark.parametrize(("left_out", "labels"), [("g1", True), ("g2", True), ("g1", False), ("g2", False)])
def test_samples_that_cover_part_of_the_cluster_judge_the_part_they_cover(truth_trace: Path, policy, left_out: str,
                                                                          labels: bool) -> None:  # type: ignore[no-untyped-def]
    """A dataset of some racks beside the whole cluster's jobs file: the nodes the samples never show ran jobs. Every
    sampled host is one the jobs file names, so none can be an unseen node under another name: the unseen nodes'
    jobs are judged by no rule, the notes say so, and the covered nodes are judged as in the whole trace. (Before,
    every sweep was degraded: nothing destructive acted anywhere, 0 kills where the whole trace made 2.) A sampled
    host the jobs do not name still degrades the sweeps: it may be an unseen node under another name."""
    s = pd.read_parquet(truth_trace / "samples.parquet")
    if not labels:
        s = s.assign(job_id="")
    jobs = pd.read_csv(truth_trace / "jobs.csv", dtype={"job_id": str})
    s.to_parquet(whole := truth_trace.parent / f"whole-{labels}.parquet")
    part = s[s["host"].astype(str) != left_out]
    part.to_parquet(covered := truth_trace.parent / f"part-{left_out}-{labels}.parquet")
    a = replay_files(covered, truth_trace / "jobs.csv", policy).to_dict()
    b = replay_files(whole, truth_trace / "jobs.csv", policy).to_dict()
    on = {f"job:{j}" for j, ids in zip(jobs["job_id"], jobs["gpu_ids"].fillna(""), strict=True)
          if ids.startswith(f"{left_out}:")}
    killed_b = {x["target"] for x in b["actions"] if x["action"] in KILL_ACTIONS}
    assert a["degraded_sweeps"] == 0 and a["false_kills"] == 0
    assert {x["target"] for x in a["actions"] if x["action"] in KILL_ACTIONS} == {
        t for t in killed_b if t not in on and not (t.startswith("proc:") and t.split(":")[1] == left_out)}
    assert any(n.startswith(f"jobs ran on 1 node(s) no sample shows ({left_out})") for n in a["notes"]), a["notes"]
    if labels:
        return  # a host the exporter labels with the file's jobs is the scheduler's, whatever its name
    # a stranger among the sampled hosts: it may be the unseen node, so the sweeps that see jobs there stay degraded
    part.assign(host=part["host"].astype(str).replace({"g1": "10.0.0.1", "g2": "10.0.0.2"})).to_parquet(
        odd := truth_trace.parent / f"odd-{left_out}-{labels}.parquet")
    c = replay_files(odd, truth_trace / "jobs.csv", policy).to_dict()
    assert c["degraded_sweeps"] > 0 and not [x for x in c["actions"] if x["action"] in KILL_ACTIONS]
