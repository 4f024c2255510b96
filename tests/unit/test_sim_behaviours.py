"""The simulator's hard behaviours: quiet services, checkpoint and data-loading phases, finished and
crashed jobs that keep their allocation, interactive sessions; their logs; and the basic mix unchanged."""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_cost.analyse.evidence import classify_log, tail_lines
from gpu_cost.cli.commands.simtrace import write_sim_trace
from gpu_cost.config.loader import load_policy
from gpu_cost.config.schema import InferenceConfig, JobLogConfig
from gpu_cost.core.errors import ScenarioError
from gpu_cost.perceive.live import log_candidates
from gpu_cost.sim.cluster import (
    MIXES,
    SimCluster,
    generate_scenario,
    scenario_from_dict,
    scenario_to_dict,
    sim_pid,
    snapshot,
)
from tests.fixtures.core import ROOT

END = 1767225600.0  # 2026-01-01T00:00:00Z
DAYS = 2
START = END - DAYS * 86400.0
H = 3600.0

# The default outputs as the simulator wrote them before the hard behaviours existed (sha256, first 16
# hex digits): samples and jobs (less the new batch column) of write_sim_trace(days=1, gpus=16, seed=0,
# end=END), and the jobs of generate_scenario(nodes=4) in the fields a job had then.
BASIC_SAMPLES_SHA = "02385c7d43c27ffe"
BASIC_JOBS_SHA = "44e59d1ab687608b"
BASIC_GENERATED_SHA = "517e3e0bf3786d96"
OLD_FIELDS = ("job_id", "user", "behaviour", "node", "gpus", "start", "end", "submit", "pending", "account", "partition",
              "qos", "name", "comment", "time_limit", "gpus_requested", "busy_first", "burst_every", "burst_length",
              "linger", "leak_mib_per_h")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass
class Trace:
    samples: pd.DataFrame
    jobs: pd.DataFrame
    logs: pd.DataFrame
    info: dict

    def series(self, job: pd.Series) -> pd.DataFrame:
        """The samples of the job's first GPU while the job holds it, in time order."""
        host, gpu = job["gpu_ids"].split(",")[0].split(":")
        s = self.samples
        end = job["end_ts"] if job["end_ts"] == job["end_ts"] else math.inf
        sel = s[(s["host"] == host) & (s["gpu"] == int(gpu)) & (s["ts"] >= job["start_ts"]) & (s["ts"] < end)]
        return sel.sort_values("ts").reset_index(drop=True)

    def log(self, job_id: str) -> pd.DataFrame:
        return self.logs[self.logs["job_id"] == job_id].reset_index(drop=True)

    def of(self, behaviour: str) -> list[pd.Series]:
        return [row for _, row in self.jobs[self.jobs["behaviour"] == behaviour].iterrows()]


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Trace:  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("hard")
    info = write_sim_trace(out, days=DAYS, gpus=32, seed=7, end=END, behaviours="hard")
    return Trace(
        samples=pd.read_parquet(info["samples"]),
        jobs=pd.read_csv(info["jobs_file"], dtype={"job_id": str}),
        logs=pd.read_csv(info["logs_file"], dtype={"job_id": str}),
        info=info,
    )


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """Return [start, stop) index pairs of the True runs of ``mask``."""
    padded = np.concatenate([[False], mask.astype(bool), [False]])
    edges = np.flatnonzero(np.diff(padded.astype(np.int8)))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True))


# -- the default mix ------------------------------------------------------------------------------------

def test_the_basic_mix_writes_exactly_what_it_wrote_before(tmp_path: Path) -> None:
    info = write_sim_trace(tmp_path, days=1, gpus=16, seed=0, end=END)
    samples = pd.read_parquet(info["samples"])
    jobs = pd.read_csv(info["jobs_file"], dtype={"job_id": str})
    assert jobs["batch"].all()  # the new column: every basic job is a batch job
    assert _sha(samples.to_csv(index=False)) == BASIC_SAMPLES_SHA
    assert _sha(jobs.drop(columns=["batch"]).to_csv(index=False)) == BASIC_JOBS_SHA
    sc = generate_scenario(nodes=4)
    assert _sha(json.dumps([[getattr(j, k) for k in OLD_FIELDS] for j in sc.jobs], default=str)) == BASIC_GENERATED_SHA
    assert generate_scenario(nodes=4, behaviours="basic").jobs == sc.jobs
    assert {j.behaviour for j in sc.jobs} <= set(MIXES["basic"])
    # the logs of a basic trace: progress lines of its jobs, none of the hard behaviours' lines
    logs = pd.read_csv(info["logs_file"], dtype={"job_id": str})
    assert list(logs.columns) == ["ts", "job_id", "stream", "line"] and len(logs) == info["logs_rows"] > 0
    assert not logs["line"].str.contains("Traceback|saving checkpoint|loading shard").any()


def test_an_unknown_mix_is_an_error() -> None:
    with pytest.raises(ScenarioError, match="behaviours 'weird'"):
        generate_scenario(nodes=2, behaviours="weird")


# -- the hard mix -----------------------------------------------------------------------------------------

def test_the_hard_mix_has_every_behaviour_and_a_service_fleet(trace: Trace) -> None:
    assert set(trace.jobs["behaviour"]) == set(MIXES["hard"]) | {"service"}
    services = trace.jobs[trace.jobs["behaviour"] == "service"]
    assert len(services) >= 6  # about one per node, at least 6
    assert set(services["account"]) == {"serving"} and services["user"].nunique() <= 2
    assert services["gpus"].between(1, 2).all()
    globs = InferenceConfig().name_patterns
    assert not [n for n in services["name"] if any(fnmatch.fnmatch(n, g) for g in globs)]
    # started before the trace, running past its end
    assert (services["start_ts"] < START - H).all() and services["end_ts"].isna().all()
    assert (services["state"] == "RUNNING").all()
    # the service GPUs are theirs alone: no other job ever lands on them
    held = {g for ids in services["gpu_ids"] for g in ids.split(",")}
    others = trace.jobs[trace.jobs["behaviour"] != "service"]
    assert not held & {g for ids in others["gpu_ids"] for g in ids.split(",")}


def test_the_hard_mix_is_deterministic_and_any_range_sees_the_same() -> None:
    a = generate_scenario(nodes=3, days=1, seed=4, behaviours="hard", anchor=END)
    b = generate_scenario(nodes=3, days=1, seed=4, behaviours="hard", anchor=END)
    assert a.jobs == b.jobs
    assert generate_scenario(nodes=3, days=1, seed=5, behaviours="hard", anchor=END).jobs != a.jobs
    c = SimCluster(a, anchor=END)
    near, far = c.samples(END - 6 * H, END), c.samples(END - 20 * H, END)
    assert near.equals(far[far["ts"] > END - 6 * H].reset_index(drop=True))
    logs_near, logs_far = c.log_lines(END - 6 * H, END), c.log_lines(END - 20 * H, END)
    assert logs_near.equals(logs_far[logs_far["ts"] > END - 6 * H].reset_index(drop=True))
    assert logs_near.equals(SimCluster(b, anchor=END).log_lines(END - 6 * H, END))
    # a hard scenario written out loads back as the same cluster
    back = scenario_from_dict(scenario_to_dict(a))
    assert scenario_from_dict(scenario_to_dict(back)).jobs == back.jobs
    assert {j.job_id: j.behaviour for j in back.jobs} == {j.job_id: j.behaviour for j in a.jobs}
    assert [j.batch for j in back.jobs] == [j.batch for j in a.jobs]


def test_a_service_is_resident_quiet_for_hours_and_bursts_now_and_then(trace: Trace) -> None:
    longest_quiet = []
    for job in trace.of("service"):
        s = trace.series(job)
        assert len(s) == DAYS * 1440  # it holds its GPU over the whole trace
        share = s["mem_used_mib"] / s["mem_total_mib"]
        assert share.between(0.55, 0.66).all()  # the model stays resident, quiet or not
        assert (s["pid"] == sim_pid(job["job_id"])).all() and (s["job_id"] == job["job_id"]).all()
        burst = s["util"].to_numpy() >= 40
        assert ((s["util"] <= 0.5) | s["util"].between(40, 90)).all()  # quiet, or serving traffic
        bursts = [(a, b) for a, b in _runs(burst) if a > 0 and b < len(s)]
        assert bursts, "every endpoint gets some traffic in two days"
        assert all(2 <= b - a <= 16 for a, b in bursts)  # bursts of 3-15 min
        longest_quiet.append(max(b - a for a, b in _runs(~burst)) / 60.0)
        # an access line a minute while a burst lasts, nothing while quiet
        log = trace.log(job["job_id"])
        assert log["line"].str.startswith("POST /v1/completions 200").all()
        hot = s["ts"].to_numpy()[burst]
        near = np.abs(log["ts"].to_numpy()[:, None] - hot[None, :]).min(axis=1)
        assert (near <= 60).all()
        assert abs(len(log) - burst.sum()) <= 2 * len(_runs(burst))
    assert sum(q > 6 for q in longest_quiet) >= 3  # quiet for longer than the policy's 6 h lookback
    assert sum(q > 15 for q in longest_quiet) >= 2  # the once-a-day endpoints


def test_a_checkpointing_job_pauses_at_its_period_and_says_so(trace: Trace) -> None:
    seen = 0
    for job in trace.of("checkpoint"):
        s = trace.series(job)
        low = s["util"].to_numpy() < 5
        pauses = [(a, b) for a, b in _runs(low) if b < len(s)]
        if len(pauses) < 2:
            continue
        seen += 1
        assert all(10 - 1 <= b - a <= 25 + 1 for a, b in pauses)  # 10-25 min at 0-2 %
        assert (s["util"][low] <= 2).all() and (s["util"][~low] >= 85).all()
        assert ((s["mem_used_mib"] / s["mem_total_mib"])[low] > 0.8).all()  # memory held while writing
        starts = s["ts"].to_numpy()[[a for a, _ in pauses]]
        gaps = np.diff(starts)
        assert 1.5 * H - 120 <= gaps.min() and gaps.max() <= 3 * H + 120 and np.ptp(gaps) <= 120  # one period
        log = trace.log(job["job_id"])
        for (a, b), t0 in zip(pauses, starts, strict=True):
            t1 = s["ts"].iloc[b - 1]
            saving = log[log["line"].str.startswith("saving checkpoint step ") & log["ts"].between(t0 - 60, t0)]
            assert len(saving) == 1  # at the pause's start
            inside = log[(log["ts"] > t0) & (log["ts"] <= t1)]
            shards = inside[inside["line"].str.startswith("writing shard ")]
            assert len(shards) >= 2 and np.diff(shards["ts"]).min() >= 60 and np.diff(shards["ts"]).max() <= 120
            assert not inside["line"].str.startswith("epoch ").any()  # no training progress while paused
        progress = log[log["line"].str.startswith("epoch ")]
        steps = np.diff(progress["ts"])
        assert ((steps + 1) % 300 <= 2).all() and (steps <= 301).mean() > 0.8  # every 5 min, but for the pauses
    assert seen >= 2


def test_a_data_loading_job_reads_first_then_trains(trace: Trace) -> None:
    seen = 0
    for job in trace.of("dataload"):
        if job["start_ts"] < START:
            continue
        s = trace.series(job)
        loading = s["util"].to_numpy() < 5
        phase = _runs(loading)[0]
        assert phase[0] == 0  # at the start
        minutes = phase[1] - phase[0]
        assert 40 - 1 <= minutes <= 120 + 1
        head = s.iloc[: phase[1]]
        assert (head["util"] <= 2).all() and head["mem_used_mib"].between(2048, 5120 + 100).all()
        rest = s.iloc[phase[1]:]
        assert len(rest) and (rest["util"] >= 85).all() and (rest["mem_used_mib"] / rest["mem_total_mib"] > 0.8).all()
        log = trace.log(job["job_id"])
        shards = log[log["line"].str.startswith("loading shard ")]
        assert abs(len(shards) - minutes) <= 2 and set(np.diff(shards["ts"])) <= {59, 60, 61}
        assert shards["ts"].max() <= head["ts"].max() + 60
        first_epoch = log[log["line"].str.startswith("epoch ")]["ts"].min()
        assert first_epoch > shards["ts"].max()
        seen += 1
    assert seen >= 1


def test_a_finished_job_keeps_its_memory_at_zero_after_saying_so(trace: Trace) -> None:
    cfg = JobLogConfig()
    seen = 0
    for job in trace.of("finished"):
        log = trace.log(job["job_id"])
        done = log[log["line"].str.startswith("Training finished")]
        if done.empty:
            continue
        t = done["ts"].iloc[0]
        s = trace.series(job)
        before, after = s[s["ts"] < t], s[s["ts"] > t + 60]
        if len(after) < 30:
            continue
        seen += 1
        assert (before["util"] >= 85).all() if len(before) else True
        assert (after["util"] == 0).all()
        assert (after["mem_used_mib"] / after["mem_total_mib"]).between(0.42, 0.49).all()
        assert (after["pid"] == sim_pid(job["job_id"])).all() and (after["job_id"] == job["job_id"]).all()
        # the allocation stays until the job's end (or the trace's)
        end = job["end_ts"] if job["end_ts"] == job["end_ts"] else END
        assert after["ts"].max() >= end - 60
        # the log ends there, on the final checkpoint
        assert log["line"].iloc[-1].startswith("saved final checkpoint to /scratch/") and log["ts"].iloc[-1] - t <= 60
        state = classify_log({"text": "\n".join(log["line"]), "mtime": float(log["ts"].iloc[-1])}, cfg, end, 900)
        assert state["state"] == "finished"
    assert seen >= 2


def test_a_crashed_job_leaves_its_gpus_empty_but_allocated(trace: Trace) -> None:
    cfg = JobLogConfig()
    seen = 0
    for job in trace.of("crashed"):
        log = trace.log(job["job_id"])
        tb = log[log["line"] == "Traceback (most recent call last):"]
        if tb.empty:
            continue
        t = tb["ts"].iloc[0]
        s = trace.series(job)
        before, after = s[s["ts"] < t], s[s["ts"] > t + 60]
        if len(after) < 30:
            continue
        seen += 1
        assert len(before) == 0 or ((before["util"] >= 85).all() and (before["pid"] == sim_pid(job["job_id"])).all())
        assert (after["util"] == 0).all() and (after["mem_used_mib"] == 0).all() and (after["pid"] == 0).all()
        assert (after["job_id"] == job["job_id"]).all()  # the wrapper sleeps: the allocation is held
        # the log ends with the traceback, on stderr, the exception last
        tail = log[log["ts"] >= t]
        assert (tail["stream"] == "stderr").all() and log["ts"].iloc[-1] == t
        assert re.search(r"OutOfMemoryError: CUDA out of memory|NCCL watchdog timeout", log["line"].iloc[-1])
        assert classify_log({"text": "\n".join(log["line"]), "mtime": float(t)}, cfg, END, 900)["state"] == "crashed"
    assert seen >= 2


def test_an_interactive_session_is_mostly_idle_with_short_bursts(trace: Trace) -> None:
    sessions = trace.jobs[trace.jobs["behaviour"] == "interactive"]
    assert (sessions["partition"] == "interactive").all() and (~sessions["batch"]).all()
    assert (sessions["gpus"] == 1).all() and set(sessions["name"]) <= {"jupyter", "interactive", "bash"}
    assert trace.jobs.loc[trace.jobs["behaviour"] != "interactive", "batch"].all()
    ended = sessions.dropna(subset=["end_ts"])
    assert ((ended["end_ts"] - ended["start_ts"]) / H).between(2, 8).all()
    long_gaps = 0
    for _, job in sessions.iterrows():
        s = trace.series(job)
        busy = s["util"].to_numpy() > 5
        assert busy.mean() < 0.25 and (s["util"][~busy] == 0).all()
        assert s["mem_used_mib"].between(1024, 8192 + 50).all()
        bursts = [(a, b) for a, b in _runs(busy) if a > 0 and b < len(s)]
        assert all(1 <= b - a <= 6 for a, b in bursts)  # 1-5 min
        inner = [b - a for a, b in _runs(~busy) if a > 0 and b < len(s)]
        long_gaps += any(g > 60 for g in inner)
        # nothing written after the start (a notebook server's banner at most)
        assert len(trace.log(job["job_id"])) <= 1
    assert long_gaps >= 1


# -- the CLI and the live snapshot ------------------------------------------------------------------------

def test_sim_trace_behaviours_hard_writes_logs_and_the_batch_column(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.cli.main import main

    rc = main(["sim-trace", "--days", "1", "--gpus", "32", "--seed", "7", "--end", "2026-01-01T00:00:00Z",
               "--behaviours", "hard", "--format", "csv", "--out", str(tmp_path), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["logs_file"] == str(tmp_path / "logs.csv") and out["logs_rows"] > 0
    assert {"service", "interactive", "crashed"} <= set(out["behaviours"])
    jobs = pd.read_csv(tmp_path / "jobs.csv", dtype={"job_id": str})
    assert (jobs["batch"] == (jobs["behaviour"] != "interactive")).all() and (~jobs["batch"]).any()
    logs = pd.read_csv(tmp_path / "logs.csv", dtype={"job_id": str})
    assert len(logs) == out["logs_rows"] and set(logs["stream"]) == {"stdout", "stderr"}
    assert logs["ts"].is_monotonic_increasing and logs["ts"].between(END - 86400, END).all()
    assert set(logs["job_id"]) <= set(jobs["job_id"])


def test_the_live_snapshot_reads_the_log_tails_of_idle_looking_jobs() -> None:
    shipped = load_policy(ROOT / "include" / "policy" / "default.yaml")
    ev = shipped.evidence
    policy = dataclasses.replace(shipped, evidence=dataclasses.replace(
        ev, job_log=dataclasses.replace(ev.job_log, max_bytes=512)))
    sc = generate_scenario(nodes=4, seed=19, behaviours="hard")
    snap = snapshot(policy, END, sc)
    behaviour = {j.job_id: j.behaviour for j in sc.jobs}
    wanted = {j.job_id for j in log_candidates(snap, policy)}
    assert wanted and set(snap.job_logs) == wanted
    # busy jobs' logs are not read
    assert not {jid for jid in snap.job_logs if behaviour[jid] in ("training", "memleak", "checkpoint")}
    cluster = SimCluster(sc, anchor=END)
    states = {}
    for jid, log in snap.job_logs.items():
        job = next(j for j in sc.jobs if j.job_id == jid)
        assert log["path"] == f"/home/{job.user}/slurm-{jid}.out"
        lines = cluster.log_lines(-math.inf, END)
        mine = lines[lines["job_id"] == jid]
        assert len(log["text"].encode()) <= 512
        assert log["text"] == tail_lines(mine["line"], 512)
        assert log["size"] == sum(len(x.encode()) + 1 for x in mine["line"])
        assert log["mtime"] == (float(mine["ts"].iloc[-1]) if len(mine) else None)
        assert log["mtime"] is None or log["mtime"] <= END
        states[behaviour[jid]] = classify_log(log, policy.evidence.job_log, END, 900)["state"]
    assert states.get("finished") == "finished" and states.get("crashed") == "crashed"
    assert "service" in states and states["service"] is None
    big = [log for jid, log in snap.job_logs.items() if log["size"] > 512]
    assert big and all(log["text"] and len(log["text"].encode()) <= 512 for log in big)  # a bounded tail
    # the jobs carry Slurm's batch flag
    batch = {j.job_id: j.batch for j in snap.jobs if j.running}
    assert all(batch[jid] is (behaviour[jid] != "interactive") for jid in batch)
    assert False in batch.values()
