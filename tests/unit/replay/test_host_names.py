"""Hosts as the samples name them: full names, other names, hosts outside the scheduler."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_cost.core.model import KILL_ACTIONS
from gpu_cost.sim.replay import (
    replay_files,
)
from tests.unit.replay.support import _kill_targets


def test_hosts_the_samples_name_by_their_full_name_replay_under_the_jobs_names(truth_trace: Path, policy) -> None:  # type: ignore[no-untyped-def]
    """An exporter labelling its series ``gpu01.cluster.example.org`` where the scheduler says ``gpu01``: the jobs'
    GPUs are theirs again, and the replay decides as on the trace where both say ``gpu01``."""
    s = pd.read_parquet(truth_trace / "samples.parquet")
    assert "gpu_ids" in pd.read_csv(truth_trace / "jobs.csv").columns
    s.assign(host=s["host"].astype(str) + ".cluster.example.org", job_id="").to_parquet(
        full := truth_trace.parent / "fqdn.parquet")
    s.assign(job_id="").to_parquet(short := truth_trace.parent / "short.parquet")  # no exporter job label to fall back on
    a = replay_files(full, truth_trace / "jobs.csv", policy).to_dict()
    b = replay_files(short, truth_trace / "jobs.csv", policy).to_dict()
    assert any("read under the name the jobs give them" in n for n in a.pop("notes"))
    b.pop("notes"), a.pop("seconds"), b.pop("seconds")
    assert a == b and b["kills"] == 2


#: how exporters name a node the scheduler calls ``h``: each the replay can read under the scheduler's name ...
_MATCHED = (lambda h, i: f"{h}.cluster.example.org", lambda h, i: f"{h}:9400", lambda h, i: h.upper(),
            lambda h, i: f"{h.upper()}.Cluster.Example.org:9100")
#: ... and each it cannot (Prometheus's instance as an address; an inventory name)
_UNMATCHED = (lambda h, i: f"10.0.{i}.1:9400", lambda h, i: f"rack7-slot{i}")


@pytest.mark.parametrize("seed", range(6))
def test_a_node_named_otherwise_in_the_samples_never_gets_its_jobs_processes_killed(truth_trace: Path, policy,
                                                                                      seed: int) -> None:  # type: ignore[no-untyped-def]
    """Random hosts of the samples renamed as exporters name them, the jobs placed by ``gpu_ids`` or by ``nodes``
    alone, no exporter job label: a name the scheduler's can be read from (a DNS domain, Prometheus's ``:port``,
    letter case) replays as the scheduler's name does. One it cannot (an address) leaves that node's jobs unseen,
    so its GPUs are nobody's zombies and the sweeps that see it act on nothing destructive. A node relabelled
    halfway (``n01`` then ``n01.cluster.example.org``) is two series; the second name's GPUs are nobody's. Never a
    false kill. (Before: a host written ``n01:9400``, or named only by ``nodes``, or relabelled, made running jobs'
    processes zombies.)"""
    rng = np.random.default_rng(seed)
    mode = ("matched", "unmatched", "relabelled")[seed // 2]
    s = pd.read_parquet(truth_trace / "samples.parquet").assign(job_id="")
    jobs = pd.read_csv(truth_trace / "jobs.csv", dtype={"job_id": str})
    if seed % 2:  # an accounting export: the nodes, no GPU indices
        nodes = jobs["gpu_ids"].fillna("").map(lambda t: ",".join(sorted({p.rpartition(":")[0] for p in t.split(",") if p})))
        jobs = jobs.assign(nodes=nodes).drop(columns=["gpu_ids"])
    jobs.to_csv(jobs_csv := truth_trace.parent / f"jobs-{seed}.csv", index=False)
    hosts = sorted(s["host"].astype(str).unique())
    chosen = rng.choice(len(hosts), size=int(rng.integers(1, len(hosts) + 1)), replace=False)
    names = {}
    for k, i in enumerate(sorted(chosen)):
        schemes = _UNMATCHED if mode == "unmatched" and k == 0 else _MATCHED
        names[hosts[i]] = schemes[int(rng.integers(len(schemes)))](hosts[i], int(i))
    s.to_parquet(plain := truth_trace.parent / f"plain-{seed}.parquet")
    after = s["ts"] > (float(rng.uniform(s["ts"].min(), s["ts"].max())) if mode == "relabelled" else -np.inf)
    s.assign(host=s["host"].astype(str).where(~after, s["host"].astype(str).map(lambda h: names.get(h, h)))).to_parquet(
        named := truth_trace.parent / f"named-{seed}.parquet")
    a = replay_files(named, jobs_csv, policy).to_dict()
    b = replay_files(plain, jobs_csv, policy).to_dict()
    assert a["false_kills"] == 0
    if mode == "matched":
        assert any("read under the name the jobs give them" in n for n in a.pop("notes"))
        b.pop("notes"), a.pop("seconds"), b.pop("seconds")
        assert a == b
        return
    killed = {x["target"] for x in a["actions"] if x["action"] in KILL_ACTIONS}
    assert killed <= {x["target"] for x in b["actions"] if x["action"] in KILL_ACTIONS}
    if mode == "unmatched":
        # the unreadable node ran GPU jobs in this trace: the sweeps that saw them were degraded, and said so
        assert a["degraded_sweeps"] > b["degraded_sweeps"]
        assert any("no sample names" in n for n in a["notes"])
    else:
        assert any("second name of a node the samples also name" in n for n in a["notes"])


@pytest.mark.parametrize("seed", range(4))
def test_hosts_outside_the_scheduler_are_left_alone(truth_trace: Path, policy, seed: int) -> None:  # type: ignore[no-untyped-def]
    """The samples also hold hosts no job of the jobs file names (inference servers, workstations the same
    Prometheus scrapes), each a copy of a real host's samples, processes and idle memory and all, without job
    labels: no action touches them, and the replay acts as on the plain trace (their GPUs are not the cluster's,
    so no cap on a share of it loosens). (Before: their processes were zombies; on a generated day, 3 kills, 1 of a
    serving process, and the caps held nothing back.)"""
    rng = np.random.default_rng(seed)
    s = pd.read_parquet(truth_trace / "samples.parquet")
    s["host"] = s["host"].astype(str)
    extra = [s[s["host"] == rng.choice(sorted(s["host"].unique()))].assign(host=f"inf{i}", job_id="",
                                                                               pid=s["pid"] + 40_000 * (i + 1))
             for i in range(int(rng.integers(1, 4)))]
    pd.concat([s, *extra]).to_parquet(path := truth_trace.parent / f"outside-{seed}.parquet")
    a = replay_files(path, truth_trace / "jobs.csv", policy).to_dict()
    b = replay_files(truth_trace / "samples.parquet", truth_trace / "jobs.csv", policy).to_dict()
    assert not [x for x in a["actions"] if x["target"].startswith("proc:inf") or ":inf" in x["target"]]
    assert _kill_targets(a) == _kill_targets(b) and a["capped_sweeps"] == b["capped_sweeps"]
    assert any(f"{len(extra)} sampled host(s) no job of the jobs file names" in n for n in a["notes"])
    # the cluster's figures are the scheduler's GPUs'
    assert [a[k] for k in ("gpus", "gpu_hours", "idle_gpu_hours")] == [b[k] for k in ("gpus", "gpu_hours", "idle_gpu_hours")]
