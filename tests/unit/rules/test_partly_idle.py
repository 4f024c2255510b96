"""The partly-idle rule judges every job's GPUs at once; its findings equal the rule read job by job.

Over random frames: jobs of one to eight GPUs on one or several nodes, some GPUs idle, some busy, stale,
unseen (NaN) or missing from the frame, a device shared by two jobs, jobs too young, and thresholds drawn
per case, so that each of the rule's conditions decides some job.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from gpu_cost.analyse.rules.partly_idle import PartlyIdleRule, partly_idle, window_of
from gpu_cost.config.schema import Policy
from gpu_cost.core.model import Job, Snapshot, empty_gpu_frame

NOW = 1_795_960_800.0
POLICY = Policy()


def random_case(seed: int) -> tuple[Snapshot, PartlyIdleRule]:
    rng = np.random.default_rng(seed)
    cfg = PartlyIdleRule(util_max=float(rng.choice([5.0, 20.0])), min_idle_gpus=int(rng.choice([1, 2])),
                         min_idle_share=float(rng.choice([0.0, 0.25, 0.5])))
    hosts = [f"n{h:02d}" for h in range(int(rng.integers(2, 7)))]
    slots = [(h, i) for h in hosts for i in range(8)]
    free = list(rng.permutation(len(slots)))
    jobs, owner, sharers, how = [], np.full(len(slots), "", dtype=object), np.full(len(slots), "", dtype=object), \
        np.full(len(slots), "none", dtype=object)
    for k in range(int(rng.integers(3, 12))):
        take = [int(free.pop()) for _ in range(min(len(free), int(rng.integers(1, 9))))]
        if not take:
            break
        jid = str(100 + k)
        owner[take] = jid
        how[take] = "slurm"
        by_host: dict[str, list[int]] = {}
        for t in take:
            by_host.setdefault(slots[t][0], []).append(slots[t][1])
        if rng.random() < 0.15:  # a GPU Slurm gives it that the frame does not show
            by_host.setdefault(hosts[0], []).append(99)
        start = NOW - float(rng.choice([1800.0, 7200.0, 86400.0])) if rng.random() < 0.95 else None
        jobs.append(Job(job_id=jid, user="ann", account="ml", partition="batch", name=f"job-{k}", state="RUNNING",
                        start_ts=start, gpu_alloc=tuple((h, tuple(sorted(i))) for h, i in by_host.items())))
    n = len(slots)
    g = empty_gpu_frame().reindex(range(n))
    g["host"] = [h for h, _ in slots]
    g["gpu"] = [i for _, i in slots]
    util = rng.choice([0.0, 1.0, 4.9, 5.0, 19.0, 60.0, 98.0], size=n) + rng.choice([0.0, 0.5], size=n)
    g["util_max"] = np.where(rng.random(n) < 0.05, np.nan, util)
    g["util_mean"] = util / 2
    g["stale"] = rng.random(n) < 0.05
    held = np.flatnonzero(owner != "")
    if len(held) > 1 and rng.random() < 0.5:  # one device two jobs share: nobody's alone
        a, b = rng.choice(held, size=2, replace=False)
        sharers[a] = ",".join(sorted({owner[a], owner[b]}))
        how[a], owner[a] = "shared", None
    g["job_id"] = owner
    g["attribution"] = how
    if (sharers != "").any():
        g["sharers"] = sharers
    window = window_of(cfg, POLICY)
    return Snapshot(ts=NOW, window_s=window, lookback_s=6 * 3600, source="test", gpus=g, jobs=tuple(jobs)), cfg


def by_definition(snap: Snapshot, cfg: PartlyIdleRule, why: Counter[str] | None = None) -> dict[str, tuple[int, list[str]]]:
    """job id -> (idle GPUs, their ids) for each job the rule should advise on, read job by job (``why``: counts the
    reason each other job is left)."""
    why = Counter() if why is None else why
    g = snap.gpus
    window = window_of(cfg, POLICY)
    out = {}
    for job in snap.running_jobs():
        keys = job.gpu_keys()
        if len(keys) < 2 or job.start_ts is None or snap.ts - job.start_ts < max(cfg.min_runtime, window):
            why["one GPU or young"] += 1
            continue
        mine = g[g["job_id"] == job.job_id]
        on_shared = "sharers" in g and any(job.job_id in str(s).split(",") for s in g["sharers"] if s)
        if on_shared or mine.empty or len(mine) < len(keys):
            why["shared or unseen GPU"] += 1
            continue
        if mine["stale"].any() or mine["util_max"].isna().any():
            why["stale"] += 1
            continue
        idle = mine[mine["util_max"] < cfg.util_max]
        if len(idle) == len(mine):
            why["all idle"] += 1
            continue
        if len(idle) < cfg.min_idle_gpus or len(idle) / len(mine) < cfg.min_idle_share:
            why["too few idle"] += 1
            continue
        out[job.job_id] = (len(idle), [f"{h}:{i}" for h, i in zip(idle["host"], idle["gpu"], strict=True)])
    return out


@pytest.mark.parametrize("seed", range(60))
def test_findings_equal_the_rule_read_job_by_job(seed: int) -> None:
    snap, cfg = random_case(seed)
    got = {f.job_id: (f.gpus, list(f.gpu_ids)) for f in partly_idle(snap, cfg, POLICY)}
    assert got == by_definition(snap, cfg)


def test_the_cases_reach_every_condition() -> None:
    """Over the seeds some jobs are advised on and some are left for each reason: the test above can fail."""
    why: Counter[str] = Counter()
    advised = sum(len(by_definition(*random_case(seed), why)) for seed in range(60))
    assert advised >= 20 and len(why) == 5 and min(why.values()) >= 5, (advised, why)
