"""The savings ledger's *re-used* and owner-release figures, and its invariant over replayed weeks:
re-used <= freed <= the waste observed on the acted targets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.report import kpis, ledger
from tests.fixtures.core import NOW

H = 3600.0


def _usage(store: AuditStore, ts: float, host: str, host_gpus: int, allocated: int, interval: float = 300.0) -> None:
    store.execute("upsert_usage", [{
        "ts": ts, "interval_s": interval, "host": host, "gpu_model": "a100", "user_name": "", "account": "",
        "partition_name": "", "gpus": host_gpus, "total_gpu_s": host_gpus * interval,
        "allocated_gpu_s": allocated * interval, "busy_gpu_s": 0.0, "idle_alloc_gpu_s": 0.0, "zombie_gpu_s": 0.0,
        "util_sum": 0.0, "run_id": "r", "data_ts": ts}])


def _decision(store: AuditStore, did: str, action: str, job: str, gpus: int, ts: float, **kw: Any) -> dict[str, Any]:
    row = {"decision_id": did, "run_id": "r", "ts": ts, "rule": "idle_allocation", "target_kind": "job",
           "target": f"job:{job}", "action": action, "mode": "enforce", "rung": 0, "episode": 1, "job_id": job,
           "user_name": "carol", "account": "nlp", "partition_name": "batch", "host": "g1", "gpus": gpus,
           "reason": "", "protection": None, "requires_approval": 0, "approval_status": None, "status": "acted",
           "gpu_hours_at_risk": 1.0, "gpu_hours_saved": 1.0,
           "evidence": json.dumps({"gpu_ids": [f"g1:{i}" for i in range(gpus)], "window_s": 2 * H,
                                   "job_start_ts": ts - 10 * H, "time_limit_s": 48 * H, **kw.pop("evidence", {})}),
           **kw}
    store.execute("insert_decision", [row])
    return row


def _saving(did: str, ts: float, gpus: int, gpu_hours: float) -> dict[str, Any]:
    return {"saving_id": f"gpu:{did}", "decision_id": did, "ts": ts, "kind": "gpu", "target": "job:1", "user_name": "c",
            "account": "a", "gpu_model": "a100", "gpus": gpus, "gpu_hours": gpu_hours, "kwh": 0.0, "usd": gpu_hours * 2,
            "basis": "x"}


def test_re_used_counts_only_what_others_could_not_have_had(store) -> None:  # type: ignore[no-untyped-def]
    # 2 of g1's 8 GPUs freed at NOW for 2 h (4 GPU-h): the host was full, 6 others allocated
    _decision(store, "d1", "cancel", "1", 2, NOW)
    for k in range(1, 25):                 # 24 sweeps of 5 min after the action
        allocated = 6 if k <= 6 else (7 if k <= 12 else 8)   # 30 min nothing, 30 min one GPU, then both
        _usage(store, NOW + 300 * k, "g1", 8, allocated)
    got = ledger.reused(store, [_saving("d1", NOW, 2, 4.0)], NOW + 3 * H)
    assert got["gpu:d1"] == pytest.approx(0.5 * 1 + 1.0 * 2)


def test_the_sweep_stamped_after_a_span_ends_counts_its_last_minutes(store) -> None:  # type: ignore[no-untyped-def]
    # 2 GPUs freed at NOW for 1 h on a host that stays full; the sweeps fall 100 s after each 5 minutes, so the
    # span's last 200 s are in the sweep stamped at NOW + 3,700 s, after the span (the latest one here) ends
    _decision(store, "d1", "cancel", "1", 2, NOW)
    for k in range(0, 30):
        _usage(store, NOW + 100 + 300 * k, "g1", 8, 8)
    assert ledger.reused(store, [_saving("d1", NOW, 2, 2.0)], NOW + 3 * H)["gpu:d1"] == 2.0
    # a report at the span's end reads no sweep after its own instant: the last 200 s are not known yet
    assert ledger.reused(store, [_saving("d1", NOW, 2, 2.0)], NOW + H)["gpu:d1"] == pytest.approx(2.0 - 2 * 200 / H,
                                                                                                abs=1e-4)


def test_a_host_with_spare_gpus_re_uses_nothing(store) -> None:  # type: ignore[no-untyped-def]
    _decision(store, "d1", "cancel", "1", 2, NOW)
    for k in range(1, 25):                 # 12 of 16 GPUs busy: the new jobs did not need the freed two
        _usage(store, NOW + 300 * k, "g1", 16, 12)
    assert ledger.reused(store, [_saving("d1", NOW, 2, 4.0)], NOW + 3 * H)["gpu:d1"] == 0.0


def test_re_used_never_exceeds_freed(store) -> None:  # type: ignore[no-untyped-def]
    _decision(store, "d1", "cancel", "1", 2, NOW)
    for k in range(1, 49):
        _usage(store, NOW + 300 * k, "g1", 8, 8)
    assert ledger.reused(store, [_saving("d1", NOW, 2, 4.0)], NOW + 5 * H)["gpu:d1"] == 4.0


def _job_seen(store: AuditStore, job: str, first: float, last: float, gpus: int = 2, active: int = 0) -> None:
    t = first
    while t <= last:
        store.execute("upsert_job_usage", [{
            "ts": t, "job_id": job, "interval_s": 300.0, "user_name": "carol", "account": "nlp",
            "partition_name": "batch", "gpu_model": "a100", "job_name": "train", "gpus": gpus, "gpus_requested": gpus,
            "gpus_busy": active, "gpus_active": active, "gpus_stale": 0, "work_gpus": 0.0, "time_limit_s": 48 * H,
            "start_ts": first - 10 * H, "run_id": "r", "data_ts": t}])
        t += 300.0


def test_a_notice_saves_nothing_until_the_owner_releases(store, policy) -> None:  # type: ignore[no-untyped-def]
    d = _decision(store, "n1", "notify", "7", 2, NOW)
    _job_seen(store, "9", NOW - H, NOW + 6 * H)       # another job keeps the sweeps going
    _job_seen(store, "7", NOW - H, NOW + 6 * H)       # still running at the last sweep: no release
    assert ledger.owner_releases(store, [d], policy, NOW - H, NOW + 7 * H, acted_jobs=()) == []
    d = _decision(store, "n2", "notify", "8", 2, NOW)
    _job_seen(store, "8", NOW - H, NOW + H)           # carol cancels job 8 an hour after its notice
    (row,) = ledger.owner_releases(store, [d], policy, NOW - H, NOW + 7 * H, acted_jobs=())
    # released at NOW + 1 h + half a sweep; credited no longer than the waste seen (2 h window + 1 h)
    assert row["kind"] == "owner" and row["gpus"] == 2
    assert row["gpu_hours"] == pytest.approx(2 * (2 * H + H + 150) / H, abs=1e-3), row
    # a job busy until it ended finished its work: no release to credit
    busy = _decision(store, "n3", "notify", "10", 2, NOW)
    _job_seen(store, "10", NOW - H, NOW + H, active=2)
    assert ledger.owner_releases(store, [busy], policy, NOW - H, NOW + 7 * H, acted_jobs=()) == []
    # a job the agent itself ended is the agent's saving, not the owner's
    assert ledger.owner_releases(store, [d], policy, NOW - H, NOW + 7 * H, acted_jobs=("8",)) == []


def test_the_report_headline_is_re_used_and_freed_is_beside_it(store, policy) -> None:  # type: ignore[no-untyped-def]
    _decision(store, "d1", "cancel", "1", 2, NOW)
    store.execute("insert_saving", [{**_saving("d1", NOW, 2, 4.0), "run_id": "r", "data_ts": NOW}])
    for k in range(1, 25):
        _usage(store, NOW + 300 * k, "g1", 8, 7)      # one of the two freed GPUs taken for 2 h
    s = kpis.ledger_savings(store, policy, store.fetch("decisions_between", {"since": NOW - H, "until": NOW + 3 * H}),
                            NOW - H, NOW + 3 * H)
    assert s["freed"]["gpu_hours"] == 4.0 and s["reused"]["gpu_hours"] == 2.0
    assert s["headline_cost"] == pytest.approx(2.0 * 2)   # re-used GPU-h at the saving's own rate
    assert s["reused"]["share_of_freed"] == pytest.approx(0.5)


@pytest.mark.slow  # two replayed generated spans of 3 days on 16 GPUs (the bounds hold at any length)
@pytest.mark.parametrize("seed", [1, 2])
def test_over_replayed_days_savings_never_exceed_the_waste_seen(tmp_path: Path, seed: int) -> None:
    import dataclasses

    from gpu_cost.cli.commands.simtrace import write_sim_trace
    from gpu_cost.config.loader import load_policy
    from gpu_cost.sim.replay import replay_files
    from tests.fixtures.core import ROOT

    end = 1795910400.0  # a Monday, 00:00 UTC
    write_sim_trace(tmp_path, days=3.0, gpus=16, seed=seed, end=end)
    policy = load_policy(ROOT / "include" / "policy" / "default.yaml")
    # the ledger's bounds hold whatever decided the kills: judged job by job (no class baselines,
    # which the replay learns at every step and which double its time), as before they existed
    policy = dataclasses.replace(policy, baselines=dataclasses.replace(policy.baselines, enabled=False))
    res = replay_files(tmp_path / "samples.parquet", tmp_path / "jobs.csv", policy, mode="enforce")
    led = res.ledger
    assert res.kills > 0 and led["savings"] > 0, "the generated days must give the ledger something to book"
    one_sample = 16 * res.sample_interval_s / H   # a kill instant may fall between two samples
    for t in led["targets"]:
        assert t["reused_gpu_hours"] <= t["freed_gpu_hours"] + 1e-9, t
        assert t["freed_gpu_hours"] <= t["observed_waste_gpu_hours"] + one_sample, t
    assert led["reused_gpu_hours"] <= led["freed_gpu_hours"] <= led["observed_waste_gpu_hours"] + one_sample
    # the ledger books what was knowable, never the trace's hindsight of each job's real end
    assert led["freed_gpu_hours"] <= res.idle_gpu_hours


def _re_used_by_definition(sweeps: list[tuple[float, float, str, int, int]], savings: list[dict[str, Any]],
                           freed_on: dict[str, dict[str, int]], until: float) -> dict[str, float]:
    """Re-used GPU-hours per saving by its definition: every sweep of every host it freed GPUs on, each one's overlap
    with the freed span, the GPUs allocated beyond what the host could have offered (at most the freed ones). Every
    sweep up to the report's instant is read: the one stamped after a span's end covers its last minutes."""
    sweeps = [x for x in sweeps if x[0] <= until + 1]
    out = {}
    for s in savings:
        t0 = float(s["ts"])
        t1 = min(t0 + s["gpu_hours"] * H / s["gpus"], until)
        total = 0.0
        for host, freed in freed_on[s["decision_id"]].items():
            for ts, interval, h, host_gpus, allocated in sorted(sweeps):
                lo, hi = max(ts - interval, t0), min(ts, t1)
                if h == host and ts > t0 and hi > lo:
                    total += min(freed, max(0.0, allocated - (host_gpus - freed))) * (hi - lo)
        out[s["saving_id"]] = round(min(total / H, s["gpu_hours"]), 4)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_re_used_reads_only_the_sweeps_that_overlap_a_span_and_finds_what_every_sweep_gives(store, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Each saving reads only its host's sweeps that can overlap its span (found by time, not read through a week
    of sweeps): over random hosts, sweeps of uneven intervals (a missed sweep covers up to three) and spans that
    start and end between sweeps, past the last one or before the first, the figures equal the definition's."""
    import numpy as np

    rng = np.random.default_rng(seed)
    hosts = {f"g{k}": int(rng.choice([4, 8])) for k in range(3)}
    sweeps = []
    for host, n in hosts.items():
        ts = NOW - float(rng.integers(0, 3 * H))  # whole seconds: the store keeps times to the second
        while ts < NOW + 10 * H:
            interval = float(rng.choice([300.0, 300.0, 600.0, 900.0]))
            ts += interval + float(rng.choice([0.0, 1.0, 17.0]))
            allocated = int(rng.integers(0, n + 1))
            sweeps.append((ts, interval, host, n, allocated))
            _usage(store, ts, host, n, allocated, interval)
    savings, freed_on = [], {}
    for k in range(8):
        host = str(rng.choice(list(hosts)))
        gpus = int(rng.integers(1, hosts[host] + 1))
        t = NOW + float(rng.uniform(-4 * H, 9 * H))
        _decision(store, f"d{k}", "cancel", str(k), gpus, t, evidence={"gpu_ids": [f"{host}:{i}" for i in range(gpus)]})
        freed_on[f"d{k}"] = {host: gpus}
        savings.append(_saving(f"d{k}", t, gpus, float(rng.uniform(0.1, 12.0)) * gpus))
    until = NOW + float(rng.choice([6 * H, 12 * H]))
    want = _re_used_by_definition(sweeps, savings, freed_on, until)
    assert ledger.reused(store, savings, until) == want
    assert any(v > 0 for v in want.values())  # the draw re-uses something: the sum is exercised
