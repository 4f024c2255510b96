"""A process whose job a trace cannot tell is reported, never killed.

Live, a process's job comes from its cgroup: Slurm lists every running job, so a process of none is an orphan. A
trace without job labels has only its jobs file to say whose a process is, and a jobs file exported by state
(``sacct -s CD``: completed jobs) leaves out every job that was running. Their processes then sat on GPUs no job
held, holding memory at 0 % between requests: on a generated hard day, 9 kills, 7 of them false (every serving
endpoint's process). Now a process is its GPU's job's when the jobs file has a job there when it started (as a
cgroup would say), and a process whose GPU no job held then is of a job unknown: not ours, reported only.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from gpu_cost.analyse.owners import foreign_owner, not_ours, owner_allowed, owner_evidence
from gpu_cost.analyse.rules.zombie import ZombieRule
from gpu_cost.cli.commands.simtrace import write_sim_trace
from gpu_cost.config.loader import load_policy
from gpu_cost.core.model import KILL_ACTIONS, GpuProcess
from gpu_cost.sim.replay import replay_files
from tests.fixtures.core import ROOT

END = 1795910400.0  # a Monday, 00:00 UTC


def _kills(res: dict) -> set[str]:
    return {a["target"] for a in res["actions"] if a["action"] in KILL_ACTIONS}


@pytest.mark.parametrize("seed", [3, 5, 8])
def test_a_jobs_file_without_its_running_jobs_kills_none_of_their_processes(tmp_path: Path, seed: int) -> None:
    """A generated hard day (services among training, idle, zombie and finished jobs, with PIDs), its samples
    without job labels. Its jobs file as exported by state, only the jobs that ended: no false kill, every kill
    one the whole jobs file makes too, and the notes say why the others' processes were only reported. With the
    whole jobs file, the same kills as with the labels: a process is its GPU's job's when it started."""
    policy = load_policy(ROOT / "include" / "policy" / "default.yaml")
    write_sim_trace(tmp_path, days=1.0, gpus=32, seed=seed, end=END, sample_interval=30.0, behaviours="hard")
    s = pd.read_parquet(tmp_path / "samples.parquet")
    assert s["pid"].notna().any()
    s.drop(columns=["job_id"]).to_parquet(bare := tmp_path / "unlabelled.parquet")
    jobs = pd.read_csv(tmp_path / "jobs.csv", dtype={"job_id": str})
    running = jobs["end_ts"].isna()
    assert running.any()
    jobs[~running].to_csv(ended := tmp_path / "ended.csv", index=False)
    labelled = replay_files(tmp_path / "samples.parquet", tmp_path / "jobs.csv", policy).to_dict()
    whole = replay_files(bare, tmp_path / "jobs.csv", policy).to_dict()
    part = replay_files(bare, ended, policy).to_dict()
    assert part["false_kills"] == 0, [a for a in part["actions"] if a["action"] in KILL_ACTIONS]
    assert _kills(part) <= _kills(whole)
    said = [n for n in part["notes"] if "their job is unknown, so they were reported, never killed" in n]
    assert said, part["notes"]
    assert _kills(whole) == _kills(labelled) and whole["false_kills"] == labelled["false_kills"] == 0
    assert not [n for n in whole["notes"] if "their job is unknown" in n]


def test_a_process_whose_job_is_unknown_is_not_ours_whatever_the_policy_says() -> None:
    cfg = ZombieRule(act_on_owners=("system", "ann"))
    p = GpuProcess(host="g1", pid=7, gpu=0, used_mib=4000.0, start_ts=1.0, user="ann", job_known=False)
    assert foreign_owner(p, cfg) == "job unknown" and owner_allowed("job unknown", "ann", cfg) is None
    why = not_ours(owner_evidence(p, cfg))
    assert why is not None and why.startswith("a process whose job is unknown, not ours")
    known = GpuProcess(host="g1", pid=7, gpu=0, used_mib=4000.0, start_ts=1.0, user="ann")
    assert not_ours(owner_evidence(known, cfg)) is None
    # a snapshot's record keeps it, and one of a known job reads as it always did
    assert GpuProcess.from_dict(p.to_dict()) == p and "job_known" not in known.to_dict()


def test_hosts_whose_exporter_labels_nothing_are_read_by_the_jobs_file_alone(tmp_path: Path) -> None:
    """Exporters of two kinds: half the hosts label their GPUs with jobs, half do not. An empty label is "no job"
    only where the exporter labels at all: the jobs file without its running jobs kills none of their processes
    on either half."""
    policy = load_policy(ROOT / "include" / "policy" / "default.yaml")
    write_sim_trace(tmp_path, days=1.0, gpus=32, seed=3, end=END, sample_interval=30.0, behaviours="hard")
    s = pd.read_parquet(tmp_path / "samples.parquet")
    half = sorted(s["host"].astype(str).unique())[:2]
    s["job_id"] = s["job_id"].astype(object).where(~s["host"].astype(str).isin(half), None)
    s.to_parquet(mixed := tmp_path / "mixed.parquet")
    jobs = pd.read_csv(tmp_path / "jobs.csv", dtype={"job_id": str})
    jobs[jobs["end_ts"].notna()].to_csv(ended := tmp_path / "ended.csv", index=False)
    res = replay_files(mixed, ended, policy).to_dict()
    whole = replay_files(tmp_path / "samples.parquet", tmp_path / "jobs.csv", policy).to_dict()
    assert res["false_kills"] == 0 and _kills(res) <= _kills(whole)
