"""The usage record on the default simulated cluster, and the savings ledger's arithmetic."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from gpu_cost.act import savings
from gpu_cost.act.base import ActionContext, Outcome
from gpu_cost.core.model import Decision
from gpu_cost.report.usage import JOB_USAGE_KEYS, USAGE_KEYS, record_usage
from tests.fixtures.core import NOW
from tests.unit.report.rows import job_usage_rows, usage_rows


@pytest.fixture
def snap(policy, scenario):  # type: ignore[no-untyped-def]
    from gpu_cost.sim.cluster import snapshot

    return snapshot(policy, NOW, scenario)


def test_usage_rows_match_the_default_cluster(snap, policy) -> None:  # type: ignore[no-untyped-def]
    rows = usage_rows(snap, policy, 300)
    assert all(tuple(r) == USAGE_KEYS for r in rows)
    by_owner = {(r["host"], r["user_name"]): r for r in rows}
    assert sum(r["gpus"] for r in rows) == 24 and sum(r["total_gpu_s"] for r in rows) == 24 * 300
    carol = by_owner[("gpu01", "carol")]          # job 1003: 2 GPUs allocated, idle
    assert carol["allocated_gpu_s"] == 600 and carol["idle_alloc_gpu_s"] == 600 and carol["busy_gpu_s"] == 0
    alice = by_owner[("gpu01", "alice")]          # job 1001: 4 GPUs training
    assert alice["busy_gpu_s"] == 1200 and alice["idle_alloc_gpu_s"] == 0 and 0.85 * 1200 < alice["util_sum"] < 1200
    free = by_owner[("gpu01", "")]                # GPU 4 holds bob's zombie process, GPU 7 is empty
    assert free["gpus"] == 2 and free["zombie_gpu_s"] == 300 and free["allocated_gpu_s"] == 0
    h100 = [r for r in rows if r["gpu_model"] == "h100"]
    assert {r["host"] for r in h100} == {"gpu03"}


def test_stale_gpus_are_neither_busy_nor_idle(snap, policy) -> None:  # type: ignore[no-untyped-def]
    snap.gpus.loc[snap.gpus["host"] == "gpu01", "stale"] = True
    rows = {(r["host"], r["user_name"]): r for r in usage_rows(snap, policy, 300)}
    assert rows[("gpu01", "carol")]["idle_alloc_gpu_s"] == 0 and rows[("gpu01", "carol")]["allocated_gpu_s"] == 600
    assert rows[("gpu01", "alice")]["busy_gpu_s"] == 0 and rows[("gpu01", "alice")]["util_sum"] == 0
    assert rows[("gpu01", "")]["zombie_gpu_s"] == 0


def test_gpus_outside_the_scheduler_are_not_the_clusters_hours(snap, policy) -> None:  # type: ignore[no-untyped-def]
    """gpu03's GPUs read as a host outside the scheduler (an inference server the same Prometheus scrapes): no
    usage row counts them, and the other hosts' rows are as they were."""
    before = [r for r in usage_rows(snap, policy, 300) if r["host"] != "gpu03"]
    # a snapshot is not edited once read (its columns are read once): each case is a copy with its own frame
    some = snap.gpus.copy()
    some.loc[some["host"] == "gpu03", "attribution"] = "outside"
    rows = usage_rows(dataclasses.replace(snap, gpus=some), policy, 300)
    assert rows == before and rows
    assert usage_rows(dataclasses.replace(snap, gpus=snap.gpus.assign(attribution="outside")), policy, 300) == []


def test_job_usage_rows_count_busy_gpus_and_work(snap, policy) -> None:  # type: ignore[no-untyped-def]
    jobs = {r["job_id"]: r for r in job_usage_rows(snap, policy, 300)}
    assert all(tuple(r) == JOB_USAGE_KEYS for r in jobs.values())
    assert jobs["1001"]["gpus"] == 4 and jobs["1001"]["gpus_busy"] == 4 and jobs["1001"]["work_gpus"] > 3.4
    assert jobs["1003"]["gpus_busy"] == 0 and jobs["1003"]["gpus_active"] == 0
    assert jobs["1004"]["gpus_busy"] < 4 and 0.2 < jobs["1004"]["work_gpus"] < 1.0   # data-loader bound
    assert "1008" not in jobs   # pending


def test_record_usage_is_idempotent(store, snap, policy) -> None:  # type: ignore[no-untyped-def]
    first = record_usage(store, snap, policy)
    record_usage(store, snap, policy)
    counts = store.table_counts()
    assert counts["gpu_cost_usage"] == first["usage_rows"]
    assert store.query("SELECT COUNT(*) AS n FROM gpu_cost_jobs_usage")[0]["n"] == first["job_rows"] == 6


def _decision(action: str, gpus: int = 2, ts: float = NOW, **kw) -> Decision:  # type: ignore[no-untyped-def]
    """Job 1003 started 10 h before NOW with a 20 h limit, idle for the rule's 2 h window at NOW."""
    evidence = {"job_start_ts": NOW - 10 * 3600, "time_limit_s": 20 * 3600, "window_s": 2 * 3600, **kw}
    return Decision(decision_id="abc", ts=ts, rule="idle_allocation", target_kind="job", target="job:1003",
                    action=action, mode="enforce", episode=1, job_id="1003", user="carol", account="nlp", host="gpu01",
                    gpus=gpus, gpu_hours_saved=20.0, evidence=evidence)


def test_freed_is_bounded_by_the_waste_already_seen(store, policy) -> None:  # type: ignore[no-untyped-def]
    # found idle (2 h window) at NOW, acted on 1 h later: 3 h of waste seen, 9 h left to the limit
    ctx = ActionContext(policy=policy, dry_run=False, now=NOW + 3600)
    savings.record_action_saving(store, _decision("terminate"), Outcome("succeeded"), ctx)
    (row,) = store.query("SELECT * FROM gpu_cost_savings")
    assert row["gpu_hours"] == 6.0 and row["usd"] == 12.0 and row["kind"] == "gpu" and row["kwh"] == 0
    assert "waste already seen (3.00 h)" in row["basis"], row["basis"]
    # the same episode's kill adds nothing
    savings.record_action_saving(store, _decision("kill"), Outcome("succeeded"), ctx)
    assert store.table_counts()["gpu_cost_savings"] == 1


def test_the_escalation_first_finding_counts_as_waste_seen(store, policy) -> None:  # type: ignore[no-untyped-def]
    # the episode began 6 h before the decision: 6 h + the window seen, more than the 9 h left
    store.execute("insert_escalation", {"rule": "idle_allocation", "target": "job:1003", "track": "live",
                                        "episode": 1, "now": NOW - 6 * 3600, "job_id": "1003", "user_name": "carol"})
    row = savings.saving_row(_decision("cancel"), policy, store, NOW + 3600, "a100")
    assert row is not None and row["gpu_hours"] == 18.0 and "time limit" in row["basis"], row


def test_forecast_p50_end_wins_and_week_end_caps(store, policy) -> None:  # type: ignore[no-untyped-def]
    d = _decision("cancel", p50_end=NOW + 1800, window_s=4 * 3600)
    row = savings.saving_row(d, policy, store, NOW, "a100")
    assert row is not None and row["gpu_hours"] == 1.0 and "forecast p50 end" in row["basis"], row
    # a job idle for days with days left: the week's end caps the credit
    far = _decision("cancel", time_limit_s=40 * 86400, window_s=20 * 86400)
    row = savings.saving_row(far, policy, store, NOW, "h100")
    assert row is not None
    assert row["gpu_hours"] == pytest.approx(2 * (savings.week_end(NOW) - NOW) / 3600, abs=1e-3)
    assert row["usd"] == pytest.approx(row["gpu_hours"] * 4.0, abs=0.01) and "end of the week" in row["basis"]


def test_a_zombie_is_credited_as_long_as_it_had_been_one(store, policy) -> None:  # type: ignore[no-untyped-def]
    d = Decision(decision_id="z", ts=NOW, rule="zombie", target_kind="process", target="proc:gpu01:4242",
                 action="kill_process", mode="enforce", episode=1, job_id=None, user="bob", account="", host="gpu01",
                 gpus=1, gpu_hours_saved=24.0, evidence={"window_s": 900})
    row = savings.saving_row(d, policy, store, NOW + 900, "a100")
    assert row is not None and row["gpu_hours"] == 0.5 and "waste already seen" in row["basis"], row


def test_a_job_of_unknown_end_is_credited_only_the_waste_already_seen(store, policy) -> None:  # type: ignore[no-untyped-def]
    d = _decision("cancel", job_start_ts=None, time_limit_s=None)
    row = savings.saving_row(d, policy, store, NOW, "a100")
    assert row is not None and row["gpu_hours"] == 4.0 and "waste already seen (2.00 h)" in row["basis"], row


@pytest.mark.parametrize(("action", "outcome", "dry_run"), [
    ("notify", "succeeded", False), ("demote", "succeeded", False), ("cancel", "failed", False),
    ("cancel", "skipped", False), ("cancel", "succeeded", True)],
    ids=["notify-frees-nothing", "demote-frees-nothing", "failed", "skipped", "dry-run"])
def test_no_saving_without_a_live_freeing_success(store, policy, action, outcome, dry_run) -> None:  # type: ignore[no-untyped-def]
    ctx = ActionContext(policy=policy, dry_run=dry_run, now=NOW)
    savings.record_action_saving(store, _decision(action), Outcome(outcome), ctx)
    assert store.table_counts()["gpu_cost_savings"] == 0


def test_dispatcher_loads_the_ledger() -> None:
    from gpu_cost.act import dispatch

    dispatch.load_executors()
    assert savings.record_action_saving in dispatch.SAVINGS_HOOKS
    assert dispatch.SAVINGS_HOOKS.count(savings.record_action_saving) == 1


@pytest.mark.slow  # a CLI or bench subprocess: more than ~5 s
def test_report_command_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = dict(os.environ)
    env["AIRFLOW_CONN_GPU_COST_DB"] = json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "a.db")})
    # a report only reads: the store is made first, as an operator's `gpu-cost db upgrade` makes it
    made = subprocess.run([sys.executable, "-m", "gpu_cost.cli.main", "db", "upgrade", "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert made.returncode == 0, made.stderr
    r = subprocess.run([sys.executable, "-m", "gpu_cost.cli.main", "report", "--since", "2026-11-16T00:00:00Z",
                        "--until", "2026-11-23T00:00:00Z", "--out", str(tmp_path / "out"), "--json"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if x.strip()]
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["index"] == str(tmp_path / "out" / "2026-11-16_2026-11-22" / "index.html")
    assert os.path.exists(out["index"]) and out["headline"]["live_events"] == 0
    assert out["period"]["label"].startswith("Week 47, 2026")
    bad = subprocess.run([sys.executable, "-m", "gpu_cost.cli.main", "report", "--since", "yesterday", "--json"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "--since" in json.loads(bad.stdout)["error"]
