"""Jobs files as schedulers export them: requeued jobs, jobs the file misses, float labels, another time zone, overlapping exports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_cost.core.errors import TraceError
from gpu_cost.sim.replay import (
    replay_files,
)
from tests.unit.replay.support import _kill_targets


def test_a_requeued_job_is_each_of_its_runs(truth_trace: Path, policy) -> None:  # type: ignore[no-untyped-def]
    """A requeued job is in an accounting export once per run, under one id. Each run holds its GPUs while it runs
    and is judged as itself. Before, the later run was read over the earlier one: the earlier run was no job at all,
    its idle GPUs judged by nobody (and its process open to the zombie rule's reading)."""
    jobs = pd.read_csv(truth_trace / "jobs.csv", dtype={"job_id": str})
    row = jobs[jobs["job_id"] == "103"].iloc[0]  # idle after its first 30 minutes, its memory held
    middle = float(row["start_ts"]) + 6 * 3600
    first, second = row.copy(), row.copy()
    first["end_ts"], second["start_ts"] = middle, middle
    split = pd.concat([jobs[jobs["job_id"] != "103"], first.to_frame().T, second.to_frame().T], ignore_index=True)
    split.to_csv(truth_trace.parent / "requeued.csv", index=False)
    res = replay_files(truth_trace / "samples.parquet", truth_trace.parent / "requeued.csv", policy).to_dict()
    assert not [x for x in res["actions"] if x["rule"] == "zombie" and x["target"].startswith("proc:g1:10103:")]
    mine = [x for x in res["actions"] if x["job_id"] == "103"]
    assert {x["rule"] for x in mine} <= {"idle_allocation", "low_efficiency"}  # judged as the job it is
    from gpu_cost.core.timeutil import epoch

    when = [epoch(x["ts"]) for x in mine]
    assert min(when) < middle <= max(when)  # each run
    assert res["false_kills"] == 0


@pytest.mark.parametrize("seed", range(4))
def test_a_job_the_jobs_file_misses_is_no_zombie_while_the_samples_label_it(truth_trace: Path, policy,
                                                                            seed: int) -> None:  # type: ignore[no-untyped-def]
    """A jobs file exported for less than the samples' span, or filtered (one partition, some users), misses
    jobs the exporter's labels name. Nothing says those jobs ended, so the GPUs they label are nobody's: never a
    false kill, and the notes name the jobs missed. (Before: each such job's process was a zombie, killed.)"""
    rng = np.random.default_rng(seed)
    jobs = pd.read_csv(truth_trace / "jobs.csv", dtype={"job_id": str})
    labelled = set(pd.read_parquet(truth_trace / "samples.parquet", columns=["job_id"])["job_id"].dropna().astype(str))
    drop = rng.random(len(jobs)) < rng.uniform(0.2, 0.8)
    jobs[~drop].to_csv(part := truth_trace.parent / f"part-{seed}.csv", index=False)
    res = replay_files(truth_trace / "samples.parquet", part, policy)
    assert res.false_kills == 0
    missed = sorted(set(jobs.loc[drop, "job_id"]) & labelled - {""})
    said = [n for n in res.notes if "not in the jobs file" in n]
    assert (said[0].startswith(f"{len(missed)} job(s) the samples label") if missed else not said)


def test_job_labels_read_as_floats_name_the_jobs_file_s_ids(truth_trace: Path, policy) -> None:  # type: ignore[no-untyped-def]
    """A job label column with blanks is read as floats by a CSV reader (``101.0``), and Parquet written from it keeps
    them so. Read as text, no label would name a job of the jobs file: each is read as the whole number it is, and
    the replay, placing jobs by their labels alone, decides as on the text labels."""
    s = pd.read_parquet(truth_trace / "samples.parquet")
    jobs = pd.read_csv(truth_trace / "jobs.csv", dtype={"job_id": str}).drop(columns=["gpu_ids"])
    jobs.to_csv(by_label := truth_trace.parent / "jobs-by-label.csv", index=False)
    as_float = pd.to_numeric(s["job_id"].replace("", np.nan), errors="raise").astype(float)
    assert as_float.isna().any() and (as_float.dropna() % 1 == 0).all()
    s.assign(job_id=as_float).to_parquet(floats := truth_trace.parent / "float-labels.parquet")
    s.assign(job_id=as_float).to_csv(texts := truth_trace.parent / "float-labels.csv", index=False)  # "101.0" as text
    assert ".0," in texts.read_text()
    b = replay_files(truth_trace / "samples.parquet", by_label, policy).to_dict()
    b.pop("seconds")
    for written in (floats, texts):
        a = replay_files(written, by_label, policy).to_dict()
        a.pop("seconds")
        assert a == b and b["kills"] == 2


@pytest.mark.parametrize("seed", range(6))
def test_a_jobs_file_in_another_time_zone_is_refused_and_a_skewed_one_is_not(truth_trace: Path, policy,
                                                                           seed: int) -> None:  # type: ignore[no-untyped-def]
    """sacct prints local time without its offset. A jobs file so written puts every job hours off its GPUs' labels:
    read so, a running job would be gone while its processes run, their GPUs zombies. A random zone (a whole
    number of quarter hours, 30 min to 12 h either way) is refused with the offset named; a few minutes of skew
    between the two sources replay as they are."""
    rng = np.random.default_rng(seed)
    jobs = pd.read_csv(truth_trace / "jobs.csv", dtype={"job_id": str})
    zone = float(rng.choice([-1, 1]) * 900 * rng.integers(2, 49))
    times = [c for c in ("submit_ts", "start_ts", "end_ts", "linger_end_ts") if c in jobs.columns]
    jobs.assign(**{c: jobs[c] + zone for c in times}).to_csv(off := truth_trace.parent / f"zone-{seed}.csv", index=False)
    with pytest.raises(TraceError, match=rf"zone-{seed}\.csv: the jobs' times run {abs(zone) / 3600:.2f} h "
                                         rf"{'ahead of' if zone > 0 else 'behind'} the samples'"):
        replay_files(truth_trace / "samples.parquet", off, policy)
    skew = float(rng.uniform(-300, 300))
    jobs.assign(**{c: jobs[c] + skew for c in times}).to_csv(near := truth_trace.parent / f"skew-{seed}.csv", index=False)
    assert replay_files(truth_trace / "samples.parquet", near, policy).sweeps > 0


@pytest.mark.parametrize("seed", range(4))
def test_a_start_before_the_samples_first_label_the_job_is_taken_at_its_first_label(truth_trace: Path, policy,
                                                                                    seed: int) -> None:  # type: ignore[no-untyped-def]
    """A jobs file whose ``start_ts`` is hours before the job held its GPUs (its submit time written as its start, a
    queue wait counted in) made the replay see the job running on GPUs it did not hold yet, idle, with its warm-up
    long past: a training job busy from its real start was notified, escalated to its manager and demoted (with a
    longer shift, terminated: a false kill no live sweep, reading Slurm's start, would make). Each job's start is
    the samples' word when they label its GPUs later than the file says: the kills are the trace's as written."""
    rng = np.random.default_rng(seed)
    jobs = pd.read_csv(truth_trace / "jobs.csv", dtype={"job_id": str})
    early = {jid: float(rng.uniform(3, 10)) * 3600 for jid in ("101", "103", "106")}
    jobs["start_ts"] = [float(s) - early.get(j, 0.0) for j, s in zip(jobs["job_id"], jobs["start_ts"], strict=True)]
    jobs.to_csv(path := truth_trace.parent / f"early-{seed}.csv", index=False)
    res = replay_files(truth_trace / "samples.parquet", path, policy)
    truth = replay_files(truth_trace / "samples.parquet", truth_trace / "jobs.csv", policy)
    assert _kill_targets(res.to_dict()) == _kill_targets(truth.to_dict()) == {"proc:g1:10102", "job:103"}
    assert res.false_kills == 0
    assert not [a for a in res.actions if a["job_id"] == "101"]  # busy from its real start: nothing at all
    assert {a["action"] for a in res.actions if a["job_id"] == "106"} <= {"advise"}
    note = next(n for n in res.notes if "first label" in n)
    assert "3 job(s)" in note and "101" in note


@pytest.mark.parametrize("seed", range(3))
def test_a_job_listed_twice_by_overlapping_exports_is_one_job(truth_trace: Path, policy, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Jobs files exported over overlapping spans and concatenated list some jobs twice, the earlier export while the
    job ran (no end yet). Each job is read once, with its latest known end: the replay decides as on the file with
    each job once. (Before: each repeated job was judged, and its owner told, twice.)"""
    rng = np.random.default_rng(seed)
    jobs = pd.read_csv(truth_trace / "jobs.csv", dtype={"job_id": str})
    # the earlier export: the first jobs, some still running then (no end); the later one: every job, each ended
    again = jobs.iloc[: int(rng.integers(2, len(jobs) + 1))]
    again = again.assign(end_ts=np.where(rng.random(len(again)) < 0.5, np.nan, again["end_ts"]))
    mixed = pd.concat([again, jobs], ignore_index=True) if seed % 2 else pd.concat([jobs, again], ignore_index=True)
    mixed.to_csv(twice := truth_trace.parent / f"twice-{seed}.csv", index=False)
    jobs.to_csv(once := truth_trace.parent / f"once-{seed}.csv", index=False)  # beside it: no logs.csv for either
    a = replay_files(truth_trace / "samples.parquet", twice, policy).to_dict()
    b = replay_files(truth_trace / "samples.parquet", once, policy).to_dict()
    notes = a.pop("notes")
    b.pop("notes"), a.pop("seconds"), b.pop("seconds")
    assert a == b and b["kills"] == 2
    assert any(n.startswith(f"{len(again)} job row(s) repeat") for n in notes)
