"""No write of the audit store goes back in time: an older run written after a newer one leaves the newer result.

Every upsert of ``include/sql/queries.sql`` (``ON CONFLICT ... DO UPDATE``) and every UPDATE of state
is tried here the same way: the newer write first, then the older one (a re-run of an older nightly or
sweep, a run cleared hours later), and the newer row must stay. A re-run of the same instant still
replaces its own rows. The same cases run on a real PostgreSQL in
``tests/integration/test_results_never_go_back_postgres.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from gpu_cost.audit.store import AuditStore, queries
from gpu_cost.core.errors import AuditError

T1, T2, T3 = 1_780_000_000.0, 1_780_003_600.0, 1_780_007_200.0


def _one(store: AuditStore, sql: str, **params: Any) -> dict[str, Any]:
    rows = store.query(sql, params)
    assert len(rows) == 1, rows
    return rows[0]


def _esc(store: AuditStore) -> dict[str, Any]:
    return _one(store, "SELECT * FROM gpu_cost_escalations WHERE rule = 'zombie' AND target = 'job:7' AND track = 'live'")


def _esc_params(now: float, **kw: Any) -> dict[str, Any]:
    return {"rule": "zombie", "target": "job:7", "track": "live", "now": now, **kw}


def _ladder_at_rung_2(store: AuditStore) -> dict[str, Any]:
    """Episode 1 of job 7 opened at T2 and climbed to rung 2 by T3 (the newer sweeps)."""
    store.execute("insert_escalation", _esc_params(T2, episode=1, job_id="7", user_name="alice"))
    for rung, at in ((0, T2), (1, T2 + 600), (2, T3)):
        store.execute("advance_escalation", _esc_params(at, episode=1, rung=rung))
    store.execute("touch_escalation", _esc_params(T3))
    row = _esc(store)
    assert (row["episode"], row["rung"], row["state"], row["last_seen"], row["last_action_at"]) == (1, 2, "open", T3, T3)
    return row


def case_escalation_reopened_by_an_older_sweep(store: AuditStore) -> None:
    """An older sweep that read the ladder closed (or before it was opened) must not restart it at rung -1."""
    before = _ladder_at_rung_2(store)
    store.execute("insert_escalation", _esc_params(T1, episode=1, job_id="7", user_name="alice"))
    store.execute("insert_escalation", _esc_params(T1, episode=2, job_id="7", user_name="alice"))
    assert _esc(store) == before


def case_escalation_reopened_twice_for_one_episode(store: AuditStore) -> None:
    """Two runs that both read the ladder closed: the second opening of the same episode changes nothing."""
    before = _ladder_at_rung_2(store)
    store.execute("insert_escalation", _esc_params(T3, episode=1, job_id="7", user_name="alice"))
    assert _esc(store) == before


def case_escalation_closed_then_reopened_by_an_older_sweep(store: AuditStore) -> None:
    _ladder_at_rung_2(store)
    store.execute("close_escalation", _esc_params(T3 + 300))
    closed = _esc(store)
    assert (closed["state"], closed["closed_at"]) == ("closed", T3 + 300)
    store.execute("insert_escalation", _esc_params(T3, episode=2, job_id="7", user_name="alice"))
    assert _esc(store) == closed
    # a newer sweep that finds the target again opens the next episode
    store.execute("insert_escalation", _esc_params(T3 + 600, episode=2, job_id="7", user_name="alice"))
    row = _esc(store)
    assert (row["episode"], row["rung"], row["state"], row["first_seen"]) == (2, -1, "open", T3 + 600)


def case_escalation_closed_by_an_older_sweep(store: AuditStore) -> None:
    """An older sweep that did not see the target must not close the ladder a newer sweep saw."""
    before = _ladder_at_rung_2(store)
    store.execute("close_escalation", _esc_params(T1))
    assert _esc(store) == before


def case_escalation_touched_by_an_older_sweep(store: AuditStore) -> None:
    before = _ladder_at_rung_2(store)
    store.execute("touch_escalation", _esc_params(T1))
    assert _esc(store) == before
    store.execute("touch_escalation", _esc_params(T3 + 300))
    assert _esc(store)["last_seen"] == T3 + 300


def case_escalation_advanced_by_an_older_run(store: AuditStore) -> None:
    """An older run acting later (it waited for an approval) may climb the rung, never move its time back."""
    _ladder_at_rung_2(store)
    store.execute("advance_escalation", _esc_params(T1, episode=1, rung=3))
    row = _esc(store)
    assert (row["rung"], row["last_action_at"]) == (3, T3)
    store.execute("advance_escalation", _esc_params(T1, episode=1, rung=1))
    assert _esc(store)["rung"] == 3


def case_snapshot(store: AuditStore) -> None:
    store.execute("save_snapshot", {"run_id": "r", "ts": T2, "payload": "newer"})
    store.execute("save_snapshot", {"run_id": "r", "ts": T1, "payload": "older"})
    assert store.load_snapshot("r") == "newer"
    store.execute("save_snapshot", {"run_id": "r", "ts": T2, "payload": "retried"})
    assert store.load_snapshot("r") == "retried"


def case_parked_release(store: AuditStore) -> None:
    store.execute("save_snapshot", {"run_id": "old", "ts": T1, "payload": "older"})
    store.execute("save_snapshot", {"run_id": "new", "ts": T2, "payload": "newer"})
    assert store.release_parked(T2) == 1  # parked for an instant before T2
    assert store.release_parked(T2) == 0  # already empty: not written again
    assert store.release_parked(T1) == 0  # an older release empties nothing newer
    assert store.load_snapshot("new") == "newer"
    with pytest.raises(AuditError, match=r"'old' was released .*sweep.keep_parked"):
        store.load_snapshot("old")
    store.execute("save_snapshot", {"run_id": "old", "ts": T1, "payload": "parked again"})  # a retried collect
    assert store.load_snapshot("old") == "parked again"


_USAGE = {"ts": T1, "interval_s": 300.0, "host": "n1", "gpu_model": "a100", "user_name": "alice", "account": "nlp",
          "partition_name": "gpu", "gpus": 4, "total_gpu_s": 1200.0, "allocated_gpu_s": 1200.0, "busy_gpu_s": 0.0,
          "idle_alloc_gpu_s": 1200.0, "zombie_gpu_s": 0.0, "util_sum": 0.0}
_JOB = {"ts": T1, "job_id": "7", "interval_s": 300.0, "user_name": "alice", "account": "nlp", "partition_name": "gpu",
        "gpu_model": "a100", "job_name": "train", "gpus": 4, "gpus_requested": 4, "gpus_busy": 0, "gpus_active": 0,
        "gpus_stale": 0, "work_gpus": 0.0, "time_limit_s": 86400.0, "start_ts": T1 - 3600, "gpus_needed": 0,
        "mem_max_mib": None, "mem_total_mib": None}


def case_usage(store: AuditStore) -> None:
    store.execute("upsert_usage", {**_USAGE, "busy_gpu_s": 900.0, "run_id": "newer", "data_ts": T2})
    store.execute("upsert_usage", {**_USAGE, "busy_gpu_s": 1.0, "run_id": "older", "data_ts": T1})
    row = _one(store, "SELECT * FROM gpu_cost_usage")
    assert (row["busy_gpu_s"], row["run_id"], row["data_ts"]) == (900.0, "newer", T2)


def case_job_usage(store: AuditStore) -> None:
    store.execute("upsert_job_usage", {**_JOB, "gpus_busy": 4, "run_id": "newer", "data_ts": T2})
    store.execute("upsert_job_usage", {**_JOB, "gpus_busy": 0, "run_id": "older", "data_ts": T1})
    row = _one(store, "SELECT * FROM gpu_cost_jobs_usage")
    assert (row["gpus_busy"], row["run_id"], row["data_ts"]) == (4, "newer", T2)


def _forecast(yhat: float, data_ts: float, run_id: str) -> dict[str, Any]:
    return {"series": "demand:cluster:all", "horizon_ts": T3 + 3600, "kind": "demand", "yhat": yhat,
            "yhat_lower": None, "yhat_upper": None, "model": "m", "created_at": data_ts, "extra": "{}",
            "run_id": run_id, "data_ts": data_ts}


def case_forecast(store: AuditStore) -> None:
    store.execute("upsert_forecast", _forecast(10.0, T2, "newer"))
    store.execute("upsert_forecast", _forecast(1.0, T1, "older"))
    row = _one(store, "SELECT * FROM gpu_cost_forecasts")
    assert (row["yhat"], row["run_id"], row["data_ts"]) == (10.0, "newer", T2)


def _member(seen_s: float, data_ts: float, run_id: str) -> dict[str, Any]:
    return {"job_id": "7", "class_key": "alice|nlp|gpu|train|4", "coarse_key": "nlp|gpu|4", "user_name": "alice",
            "account": "nlp", "partition_name": "gpu", "stem": "train", "gpus": 4, "start_ts": T1 - 3600,
            "first_seen": T1 - 3000, "last_seen": data_ts, "seen_s": seen_s, "active_s": seen_s, "idle_s": 0.0,
            "idle_mem_s": 0.0, "wakes": 0, "quiet_since": None, "longest_quiet_s": 0.0, "cpu_pct_s": 0.0,
            "cpu_active_s": 0.0, "run_id": run_id, "data_ts": data_ts}


def case_class_members(store: AuditStore) -> None:
    store.execute("upsert_class_members", _member(9000.0, T2, "newer"))
    store.execute("upsert_class_members", _member(600.0, T1, "older"))
    row = _one(store, "SELECT * FROM gpu_cost_class_members")
    assert (row["seen_s"], row["run_id"], row["data_ts"]) == (9000.0, "newer", T2)


def _outcome(outcome: str, data_ts: float, run_id: str) -> dict[str, Any]:
    return {"decision_id": "d1", "ts": T1, "rule": "zombie", "target": "job:7", "episode": 1, "job_id": "7",
            "user_name": "alice", "action": "cancel", "outcome": outcome, "outcome_ts": data_ts, "after_s": 60.0,
            "horizon_s": 3600.0, "run_id": run_id, "data_ts": data_ts}


def case_outcome(store: AuditStore) -> None:
    store.execute("upsert_outcome", _outcome("ended", T2, "newer"))
    store.execute("upsert_outcome", _outcome("too_recent", T1, "older"))
    row = _one(store, "SELECT * FROM gpu_cost_outcomes")
    assert (row["outcome"], row["run_id"], row["data_ts"]) == ("ended", "newer", T2)


def _advice(gpus_advice: int, data_ts: float, run_id: str) -> dict[str, Any]:
    return {"data_ts": data_ts, "scope": "user", "user_name": "alice", "stem": "", "status": "advice", "jobs": 5,
            "gpus_asked": 8, "gpus_need": gpus_advice, "gpus_advice": gpus_advice, "ask_min": gpus_advice + 1,
            "block_above": 0, "mem_peak_mib": None, "mem_total_mib": None, "time_jobs": 0, "time_asked_s": None,
            "runtime_s": None, "time_advice_s": 0.0, "time_ask_min_s": 0.0, "idle_gpu_hours": 1.0, "text": "t",
            "advice_file": None, "run_id": run_id}


def case_rightsize(store: AuditStore) -> None:
    """Advice rows are keyed by their instant: an older nightly adds its own set, the newest set stays in force."""
    store.execute("upsert_rightsize", _advice(1, T2, "newer"))
    store.execute("upsert_rightsize", _advice(4, T1, "older"))
    newest = store.fetch("rightsize_instants", {"until": T3, "limit": 1})
    assert [r["data_ts"] for r in newest] == [T2]
    (row,) = store.fetch("rightsize_between", {"since": T2, "until": T2})
    assert (row["gpus_advice"], row["run_id"]) == (1, "newer")


def _saving(usd: float, data_ts: float, run_id: str) -> dict[str, Any]:
    return {"saving_id": "gpu:job:7:1", "decision_id": "d1", "ts": T1, "kind": "gpu", "target": "job:7",
            "user_name": "alice", "account": "nlp", "gpu_model": "a100", "gpus": 4, "gpu_hours": usd / 2.5, "kwh": 0.0,
            "usd": usd, "basis": "b", "run_id": run_id, "data_ts": data_ts}


def case_saving(store: AuditStore) -> None:
    store.execute("insert_saving", _saving(20.0, T2, "newer"))
    store.execute("insert_saving", _saving(99.0, T1, "older"))
    row = _one(store, "SELECT * FROM gpu_cost_savings")
    assert (row["usd"], row["run_id"]) == (20.0, "newer")


#: every case, by name (the PostgreSQL test runs the same ones)
CASES: dict[str, Callable[[AuditStore], None]] = {
    name[len("case_"):]: fn for name, fn in sorted(globals().items()) if name.startswith("case_")}

#: the statements the cases write: every upsert and every UPDATE of state must be among them
COVERED = {"insert_escalation", "touch_escalation", "advance_escalation", "close_escalation", "save_snapshot",
           "upsert_usage", "upsert_job_usage", "upsert_forecast", "upsert_class_members", "upsert_outcome",
           "upsert_rightsize", "insert_saving", "release_parked"}
#: state writes that are not about instants: who snoozed what (an operator's command, not a run's result)
# rescale_*: a sweep recorded late shrinks the next sweep's share of time; it only ever lowers
# interval_s (WHERE interval_s > :interval_s), so an older write cannot undo a newer one either
# (tests/unit/report/test_usage_coverage.py::test_a_sweep_recorded_after_a_later_one_takes_its_share_back)
NOT_INSTANT = {"snooze_escalations", "rescale_usage", "rescale_job_usage"}


@pytest.fixture
def mem_store() -> AuditStore:
    return AuditStore("sqlite:///:memory:").ensure_schema()


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_older_write_after_a_newer_one_leaves_the_newer(mem_store: AuditStore, case: str) -> None:
    CASES[case](mem_store)


def test_every_upsert_and_state_update_has_a_case() -> None:
    writes = {name for name, sql in queries().items()
              if re.search(r"\bDO\s+UPDATE\b", sql, re.I) or re.match(r"\s*UPDATE\b", sql, re.I)}
    assert writes - NOT_INSTANT <= COVERED, f"add a case for {sorted(writes - NOT_INSTANT - COVERED)}"
