"""The usage rows computed for every GPU and job at once equal the rows written one GPU and one job at a time.

A 100,000-GPU sweep has a usage row to sum per GPU and a job row per running job; the record is now
computed over arrays (:func:`gpu_cost.report.usage.usage_columns`, :func:`~gpu_cost.report.usage.job_usage_columns`)
and handed to the store column by column (:class:`gpu_cost.audit.store.Columns`). Here, over random
frames (jobs on several GPUs and nodes, GPUs of no job or of a job no longer running, stale and missing
data, mixed and unknown models, memory unknown), both are held to the definitions written plainly, and the
rows the store keeps to those it keeps when the same rows are given one by one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from gpu_cost.audit.store import AuditStore, Columns
from gpu_cost.config.schema import Policy
from gpu_cost.core.model import Job, Snapshot, empty_gpu_frame
from gpu_cost.report.usage import JOB_USAGE_KEYS, USAGE_KEYS, gpus_needed, job_usage_columns, record_usage
from tests.unit.report.rows import job_usage_rows, usage_rows

NOW = 1_795_960_800.0
POLICY = Policy()


def random_snapshot(seed: int) -> Snapshot:
    rng = np.random.default_rng(seed)
    hosts = [f"n{h:02d}" for h in range(int(rng.integers(1, 7)))]
    slots = [(h, i) for h in hosts for i in range(int(rng.integers(1, 9)))]
    n = len(slots)
    jobs, owner = [], np.full(n, "", dtype=object)
    free = list(rng.permutation(n))
    for k in range(int(rng.integers(0, 6))):
        take = [free.pop() for _ in range(min(len(free), int(rng.integers(1, 10))))]
        if not take:
            break
        jid = str(100 + k)
        owner[take] = jid
        by_host: dict[str, list[int]] = {}
        for t in take:
            by_host.setdefault(slots[t][0], []).append(slots[t][1])
        state = "RUNNING" if rng.random() < 0.85 else "COMPLETED"  # a finished job's GPUs still named by the frame
        jobs.append(Job(job_id=jid, user=str(rng.choice(["ann", "bo", "cy"])), account=str(rng.choice(["ml", "nlp"])),
                        partition=str(rng.choice(["batch", "long"])), name=f"job-{k}", state=state,
                        start_ts=NOW - 7200, time_limit_s=float(rng.choice([3600 * 24, 3600 * 48])),
                        gpu_alloc=tuple((h, tuple(sorted(i))) for h, i in by_host.items()),
                        gpus_requested=int(rng.choice([0, len(take), len(take) + 2]))))
    g = empty_gpu_frame().reindex(range(n))
    util = rng.choice([0.0, 0.5, 3.0, 40.0, 97.3, 100.0], size=n) + rng.random(n)
    util[rng.random(n) < 0.1] = np.nan
    g["host"] = [h for h, _ in slots]
    g["gpu"] = [i for _, i in slots]
    g["model"] = rng.choice(np.array(["a100", "h100", "", None], dtype=object), size=n, p=[0.5, 0.3, 0.1, 0.1])
    g["job_id"] = owner
    g["util_mean"] = util
    g["util_max"] = np.where(rng.random(n) < 0.05, np.nan, util + rng.random(n) * 3)
    g["mem_min_mib"] = rng.choice([0.0, 300.0, 15000.0], size=n)
    mem_max = rng.random(n) * 80000
    mem_max[rng.random(n) < 0.15] = np.nan
    g["mem_max_mib"] = mem_max
    g["mem_total_mib"] = rng.choice([81920.0, 40960.0, np.nan, 0.0], size=n, p=[0.6, 0.2, 0.15, 0.05])
    g["stale"] = rng.random(n) < 0.1
    return Snapshot(ts=NOW, window_s=900, lookback_s=6 * 3600, source="test", gpus=g, jobs=tuple(jobs))


def model_of(r: dict[str, Any]) -> str:
    """A GPU's model; none known (None, NaN, empty) is ""."""
    m = r["model"]
    return "" if m is None or m != m else str(m)


def plain_usage(snap: Snapshot, interval: float) -> list[dict[str, Any]]:
    """The usage rows by their definition, GPU after GPU (the module's docstring)."""
    cfg = POLICY.rules
    jobs = {j.job_id: j for j in snap.running_jobs()}
    acc: dict[tuple[str, ...], dict[str, float]] = {}
    for r in snap.gpus.to_dict("records"):
        job = jobs.get(r["job_id"]) if r["job_id"] else None
        fresh = not r["stale"] and not math.isnan(r["util_max"])
        top = 100.0 if math.isnan(r["util_max"]) else r["util_max"]
        active = fresh and top >= cfg.idle_allocation.util_max
        zombie = fresh and top < cfg.zombie.util_max and (0.0 if math.isnan(r["mem_min_mib"]) else r["mem_min_mib"]) > \
            cfg.zombie.mem_min_mib
        key = (str(r["host"]), model_of(r), job.user if job else "", job.account if job else "",
               job.partition if job else "")
        a = acc.setdefault(key, dict.fromkeys(("gpus", "total", "alloc", "busy", "idle", "zombie", "util"), 0.0))
        a["gpus"] += 1
        a["total"] += interval
        a["alloc"] += interval if job else 0.0
        a["idle"] += interval if job and fresh and not active else 0.0
        a["zombie"] += interval if not job and zombie else 0.0
        a["busy"] += interval if active else 0.0
        a["util"] += interval * (0.0 if not fresh or math.isnan(r["util_mean"]) else r["util_mean"]) / 100.0
    return [dict(zip(USAGE_KEYS, (NOW, interval, *k, int(v["gpus"]), v["total"], v["alloc"], v["busy"], v["idle"],
                                  v["zombie"], round(v["util"], 3)), strict=True)) for k, v in acc.items()]


def plain_jobs(snap: Snapshot, interval: float) -> list[dict[str, Any]]:
    """The job rows by their definition, job after job, its GPUs in the frame's order."""
    rows = []
    recs = snap.gpus.to_dict("records")
    for job in snap.running_jobs():
        mine = [r for r in recs if r["job_id"] == job.job_id]
        if not mine:
            continue
        fresh = [not r["stale"] and not math.isnan(r["util_max"]) for r in mine]
        util = [0.0 if not f or math.isnan(r["util_mean"]) else r["util_mean"] for r, f in zip(mine, fresh, strict=True)]
        busy = sum(f and u >= POLICY.sweep.busy_util for f, u in zip(fresh, util, strict=True))
        active = sum(f and r["util_max"] >= POLICY.rules.idle_allocation.util_max for r, f in zip(mine, fresh, strict=True))
        stale = sum(not f for f in fresh)
        work = 0.0
        for u in util:
            work += u
        work /= 100.0
        mem = [r["mem_max_mib"] for r in mine]
        total = [r["mem_total_mib"] for r in mine]
        finite_mem = [m for m in mem if math.isfinite(m)]
        finite_total = [t for t in total if math.isfinite(t)]
        sizes = [t for t in finite_total if t > 0]
        used = 0.0
        for m in mem:
            used += 0.0 if math.isnan(m) else m
        need = max(busy + stale, math.ceil(work - 1e-9))
        if sizes:
            need = max(need, math.ceil(used / min(sizes) - 1e-9))
        rows.append(dict(zip(JOB_USAGE_KEYS, (
            NOW, job.job_id, interval, job.user, job.account, job.partition,
            ",".join(sorted({model_of(r) for r in mine} - {""})), job.name, len(mine),
            int(job.gpus_requested or len(mine)), busy, active, stale, round(work, 4), job.time_limit_s, job.start_ts,
            int(min(len(mine), max(0, need))), round(max(finite_mem), 1) if finite_mem else None,
            round(min(finite_total), 1) if finite_total else None), strict=True)))
    return rows


@pytest.mark.parametrize("seed", range(60))
def test_the_rows_over_arrays_are_the_rows_by_definition(seed: int) -> None:
    snap = random_snapshot(seed)
    assert usage_rows(snap, POLICY, 287.5) == plain_usage(snap, 287.5)
    assert job_usage_rows(snap, POLICY, 287.5) == plain_jobs(snap, 287.5)


@pytest.mark.parametrize("seed", range(8))
def test_the_store_keeps_the_same_rows_given_by_column_or_by_row(seed: int) -> None:
    snap = random_snapshot(seed)
    by_column, by_row = AuditStore.scratch().ensure_schema(), AuditStore.scratch().ensure_schema()
    record_usage(by_column, snap, POLICY, 300.0, run_id="r1")
    origin = {"run_id": "r1", "data_ts": NOW}
    by_row.execute("upsert_usage", [{**r, **origin} for r in usage_rows(snap, POLICY, 300.0)])
    by_row.execute("upsert_job_usage", [{**r, **origin} for r in job_usage_rows(snap, POLICY, 300.0)])
    for table in ("gpu_cost_usage", "gpu_cost_jobs_usage"):
        rows = [store.query(f"SELECT * FROM {table} ORDER BY 1, 2, 3, 4, 5, 6") for store in (by_column, by_row)]
        assert rows[0] == rows[1]
    assert len(by_column.query("SELECT * FROM gpu_cost_jobs_usage")) == len(job_usage_rows(snap, POLICY, 300.0))


def test_columns_of_different_lengths_or_lacking_a_parameter_are_refused_naming_the_write() -> None:
    from gpu_cost.core.errors import AuditError

    store = AuditStore.scratch().ensure_schema()
    cols = job_usage_columns(random_snapshot(3), POLICY, 300.0)
    assert cols["job_id"], "the seed gives running jobs"
    with pytest.raises(AuditError, match="upsert_job_usage: columns of different lengths"):
        store.execute("upsert_job_usage", Columns({**cols, "job_id": cols["job_id"] + ["x"], "run_id": "r", "data_ts": NOW}))
    del cols["user_name"]
    with pytest.raises(AuditError, match="upsert_job_usage: no value for its parameter 'user_name'"):
        store.execute("upsert_job_usage", Columns(cols))
    assert store.query("SELECT COUNT(*) AS n FROM gpu_cost_jobs_usage")[0]["n"] == 0


def test_gpus_needed_of_one_job_reads_its_memory_as_the_columns_do() -> None:
    # 3 GPUs of 80 GiB holding 100 GiB between them, idle: the memory needs 2
    assert gpus_needed(3, 0, 0, 0.0, [50 * 1024.0, 50 * 1024.0, np.nan], [81920.0, np.nan, 0.0]) == 2
    assert gpus_needed(3, 0, 0, 0.0, [50 * 1024.0], []) == 0  # no framebuffer size known: memory says nothing
