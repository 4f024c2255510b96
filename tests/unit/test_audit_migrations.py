"""Migrations of the audit store: a store of the schema that shipped before them reaches head with every row.

The same checks run on a real PostgreSQL in tests/integration/test_audit_migrations_postgres.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gpu_cost.audit import migrations
from gpu_cost.audit.store import AuditStore, _bind, _row

T0 = 1_780_000_000.0

#: rows of every table of the baseline schema, as the statements of that version wrote them
BASELINE_ROWS: dict[str, list[dict[str, Any]]] = {
    "gpu_cost_runs": [
        {"run_id": "sweep:1", "dag_id": "gpu_zombie_sweep", "started_at": T0, "finished_at": T0 + 60, "data_ts": T0,
         "source": "sim", "mode": "enforce", "status": "ok", "problems": "[]", "counts": "{}"},
        {"run_id": "sweep:2", "dag_id": "gpu_zombie_sweep", "started_at": T0 + 300, "finished_at": None,
         "data_ts": T0 + 300, "source": "sim", "mode": "enforce", "status": "awaiting_approval", "problems": None,
         "counts": None},
        {"run_id": "sweep:3", "dag_id": "gpu_zombie_sweep", "started_at": T0 + 600, "finished_at": None,
         "data_ts": T0 + 600, "source": "sim", "mode": "enforce", "status": "running", "problems": None,
         "counts": None},
    ],
    "gpu_cost_snapshots": [{"run_id": "sweep:1", "ts": T0, "payload": '{"gpus": []}'}],
    "gpu_cost_decisions": [
        {"decision_id": "d-approved", "run_id": "sweep:1", "ts": T0, "rule": "zombie", "target_kind": "job",
         "target": "job:7", "action": "cancel", "mode": "enforce", "rung": 1, "episode": 2, "job_id": "7",
         "user_name": "alice", "account": "nlp", "partition_name": "gpu", "host": "n1", "gpus": 4, "reason": "idle",
         "protection": None, "requires_approval": 1, "approval_status": "approved", "approved_by": "bob",
         "approved_at": T0 + 30, "status": "acted", "gpu_hours_at_risk": 1.5, "gpu_hours_saved": 8.0,
         "evidence": '{"util": 0}'},
        {"decision_id": "d-pending", "run_id": "sweep:1", "ts": T0 + 1, "rule": "idle_allocation",
         "target_kind": "job", "target": "job:8", "action": "notify", "mode": "dry-run", "rung": 0, "episode": 1,
         "job_id": "8", "user_name": "carol", "account": "cv", "partition_name": "gpu", "host": "n2", "gpus": 1,
         "reason": "low", "protection": "qos", "requires_approval": 0, "approval_status": None, "approved_by": None,
         "approved_at": None, "status": "recorded", "gpu_hours_at_risk": 0.0, "gpu_hours_saved": 0.0,
         "evidence": "{}"},
    ],
    "gpu_cost_actions": [
        {"action_id": "d-approved:cancel", "decision_id": "d-approved", "run_id": "sweep:1", "action": "cancel",
         "target": "job:7", "executor": "gpu_cost.act.slurm", "dry_run": 0, "status": "succeeded",
         "started_at": T0 + 40, "finished_at": T0 + 41, "attempt": 2, "command": "scancel 7", "output": "$ scancel 7",
         "error": None},
        {"action_id": "d-pending:notify", "decision_id": "d-pending", "run_id": "sweep:1", "action": "notify",
         "target": "job:8", "executor": "gpu_cost.act.notify", "dry_run": 1, "status": "failed",
         "started_at": T0 + 42, "finished_at": T0 + 43, "attempt": 1, "command": None, "output": None,
         "error": "slack down"},
        {"action_id": "d-pending:hold", "decision_id": "d-pending", "run_id": "sweep:1", "action": "hold",
         "target": "job:8", "executor": "x", "dry_run": 0, "status": "started", "started_at": T0 + 44,
         "finished_at": None, "attempt": 1, "command": None, "output": None, "error": None},
    ],
    "gpu_cost_escalations": [
        {"rule": "zombie", "target": "job:7", "track": "live", "episode": 2, "rung": 1, "state": "open",
         "first_seen": T0 - 600, "last_seen": T0, "last_action_at": T0 + 41, "closed_at": None,
         "snoozed_until": None, "snooze_reason": None, "snoozed_by": None, "job_id": "7", "user_name": "alice"},
    ],
    "gpu_cost_snoozes": [
        {"snooze_id": "s1", "target": "job:9", "until_ts": T0 + 3600, "reason": "demo", "created_by": "ops",
         "created_at": T0},
    ],
    "gpu_cost_forecasts": [
        {"series": "demand:account:nlp", "horizon_ts": T0 + 3600, "kind": "demand", "yhat": 3.5, "yhat_lower": 2.0,
         "yhat_upper": 5.0, "model": "prophet", "created_at": T0, "extra": "{}"},
    ],
    "gpu_cost_usage": [
        {"ts": T0, "interval_s": 300.0, "host": "n1", "gpu_model": "a100", "user_name": "alice", "account": "nlp",
         "partition_name": "gpu", "gpus": 4, "total_gpu_s": 1200.0, "allocated_gpu_s": 1200.0, "busy_gpu_s": 0.0,
         "idle_alloc_gpu_s": 1200.0, "zombie_gpu_s": 0.0, "util_sum": 0.0},
    ],
    "gpu_cost_savings": [
        {"saving_id": "gpu:job:7:2", "decision_id": "d-approved", "ts": T0 + 41, "kind": "gpu", "target": "job:7",
         "user_name": "alice", "account": "nlp", "gpu_model": "a100", "gpus": 4, "gpu_hours": 8.0, "kwh": 0.0,
         "usd": 20.0, "basis": "limit"},
    ],
    "gpu_cost_jobs_usage": [
        {"ts": T0, "job_id": "7", "interval_s": 300.0, "user_name": "alice", "account": "nlp",
         "partition_name": "gpu", "gpu_model": "a100", "job_name": "train", "gpus": 4, "gpus_requested": 4,
         "gpus_busy": 0, "gpus_active": 0, "gpus_stale": 0, "work_gpus": 0.0, "time_limit_s": 86400.0,
         "start_ts": T0 - 3600},
    ],
}

#: the key each table's rows are ordered by when compared
ORDER = {"gpu_cost_runs": "run_id", "gpu_cost_snapshots": "run_id", "gpu_cost_decisions": "decision_id",
         "gpu_cost_actions": "action_id", "gpu_cost_escalations": "rule, target, track",
         "gpu_cost_snoozes": "snooze_id", "gpu_cost_forecasts": "series, horizon_ts",
         "gpu_cost_usage": "ts, host", "gpu_cost_savings": "saving_id", "gpu_cost_jobs_usage": "ts, job_id"}
#: where a result row written before the migration takes its data instant from
INSTANT = {"gpu_cost_forecasts": "created_at", "gpu_cost_usage": "ts", "gpu_cost_savings": "ts",
           "gpu_cost_jobs_usage": "ts"}
#: columns later migrations added, with what they hold for a row written before them (0007 backfills
#: gpus_needed from the busy, stale and work columns: alice's job 7 held 4 GPUs, all idle, no work)
ADDED = {"gpu_cost_jobs_usage": {"gpus_needed": 0, "mem_max_mib": None, "mem_total_mib": None}}


def fill_baseline(engine: sa.Engine) -> None:
    """Create the pre-migration schema and write :data:`BASELINE_ROWS` as that version did."""
    with engine.begin() as conn:
        for stmt in migrations.baseline_statements(engine.dialect.name):
            conn.exec_driver_sql(stmt)
        for table, rows in BASELINE_ROWS.items():
            cols = list(rows[0])
            sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(':' + c for c in cols)})"
            conn.execute(sa.text(sql), [_bind(r) for r in rows])


def read_all(store: AuditStore) -> dict[str, list[dict[str, Any]]]:
    """Return every row of every contract table (views included), times as epoch seconds."""
    return {t: store.query(f"SELECT * FROM {t} ORDER BY {ORDER[t]}") for t in ORDER}


def expected_after() -> dict[str, list[dict[str, Any]]]:
    """Return what the contract tables hold after the migration: the same rows, results with run and instant."""
    out = {}
    for table, rows in BASELINE_ROWS.items():
        rows = sorted(rows, key=lambda r: tuple(str(r[k.strip()]) for k in ORDER[table].split(",")))
        if table in INSTANT:
            rows = [{**r, "run_id": None, "data_ts": r[INSTANT[table]]} for r in rows]
        rows = [{**r, **ADDED.get(table, {})} for r in rows]
        out[table] = [_row(_bind(r)) for r in rows]
    return out


def check_migrated(store: AuditStore) -> None:
    """Assert that a store filled by :func:`fill_baseline` and then migrated kept every row and its state."""
    assert store.schema_state()["at_head"]
    assert read_all(store) == expected_after()
    # one first event per decision and per action, carrying the state it had
    events = store.query("SELECT * FROM gpu_cost_decision_events ORDER BY event_id")
    assert [(e["decision_id"], e["status"], e["approval_status"], e["approved_by"]) for e in events] == [
        ("d-approved", "acted", "approved", "bob"), ("d-pending", "recorded", None, None)]
    assert store.decision_events("d-approved")[0]["approved_at"] == T0 + 30
    acts = store.query("SELECT * FROM gpu_cost_action_events ORDER BY event_id")
    assert [(a["action_id"], a["status"], a["attempt"], a["prev_event_id"]) for a in acts] == [
        ("d-approved:cancel", "succeeded", 2, 0), ("d-pending:notify", "failed", 1, 0),
        ("d-pending:hold", "started", 1, 0)]
    # one first event per run, carrying the state it had (0008: runs are history too)
    runs = store.query("SELECT * FROM gpu_cost_run_events ORDER BY event_id")
    assert [(r["run_id"], r["status"], r["finished_at"], r["problems"], r["counts"]) for r in runs] == [
        ("sweep:1", "ok", T0 + 60, "[]", "{}"), ("sweep:2", "awaiting_approval", None, None, None),
        ("sweep:3", "running", None, None, None)]
    # and the store works on: the history grows, the views follow
    store.finish_run("sweep:1", status="failed", finished_at=T0 + 70, problems=["late"])
    store.execute("mark_run_awaiting", {"run_id": "sweep:3"})
    store.finish_run("sweep:2", status="ok", finished_at=T0 + 900)
    assert [(r["run_id"], r["status"]) for r in store.query("SELECT * FROM gpu_cost_runs ORDER BY run_id")] == [
        ("sweep:1", "failed"), ("sweep:2", "ok"), ("sweep:3", "awaiting_approval")]
    assert store.query("SELECT COUNT(*) AS n FROM gpu_cost_run_log")[0]["n"] == 3
    store.action_finished("d-pending:hold", "succeeded", T0 + 50, output="held")
    store.action_finished("d-approved:cancel", "failed", T0 + 50, error="must not land")
    store.set_decision_status("d-pending", "acted")
    assert (store.get_action("d-pending:hold") or {}).get("status") == "succeeded"
    assert (store.get_action("d-approved:cancel") or {}).get("status") == "succeeded"
    assert (store.get_decision("d-pending") or {}).get("status") == "acted"
    assert [d["decision_id"] for d in store.decisions_by_ids(["d-pending", "d-approved"])] == ["d-approved", "d-pending"]


def sqlite_shape(engine: sa.Engine) -> dict[str, Any]:
    """Return tables, views, columns and indexes of a SQLite store (what a reader of the schema sees)."""
    with engine.connect() as conn:
        objects = conn.exec_driver_sql(
            "SELECT type, name, tbl_name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name").all()
        shape: dict[str, Any] = {"objects": sorted((t, n, tbl) for t, n, tbl in objects)}
        for _t, name, _tbl in objects:
            if _t in ("table", "view"):
                shape[name] = conn.exec_driver_sql(f"PRAGMA table_xinfo({name})").all()
            else:
                shape[name] = conn.exec_driver_sql(f"PRAGMA index_xinfo({name})").all()
    return shape


def test_a_new_store_is_created_at_head(tmp_path: Path) -> None:
    store = AuditStore(f"sqlite:///{tmp_path / 'new.db'}").ensure_schema()
    st = store.schema_state()
    assert st == {"current": migrations.head(), "head": migrations.head(), "at_head": True, "state": "head"}
    assert migrations.revisions()[0] == "0001_baseline" and migrations.revisions()[-1] == migrations.head()


def test_upgrade_keeps_every_row_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    fill_baseline(sa.create_engine(url))
    store = AuditStore(url)
    assert store.schema_state()["current"] is None and not store.schema_state()["at_head"]
    store.ensure_schema()  # SQLite: migrated on open
    check_migrated(store)


def test_the_schema_file_describes_the_head(tmp_path: Path) -> None:
    """A store created from include/sql/schema.sqlite.sql and one migrated up from the baseline are alike."""
    fresh = AuditStore(f"sqlite:///{tmp_path / 'fresh.db'}").ensure_schema()
    url = f"sqlite:///{tmp_path / 'migrated.db'}"
    fill_baseline(sa.create_engine(url))
    migrated = AuditStore(url).ensure_schema()
    a, b = sqlite_shape(fresh.engine), sqlite_shape(migrated.engine)
    assert a["objects"] == b["objects"]
    for name in a:
        assert a[name] == b[name], name


#: what every sweep or every action reads from a history table, with parameters as they come (SQL, params)
def _hot_path() -> dict[str, tuple[str, dict[str, Any]]]:
    from gpu_cost.act import locks
    from gpu_cost.audit.store import queries

    q = queries()
    return {
        "decisions_of_run": (q["decisions_of_run"], {"run_id": "sweep:1"}),
        "open_escalations": (q["open_escalations"], {"track": "live"}),
        "class_members_since": (q["class_members_since"], {"since": "2026-12-01T00:00:00Z"}),
        "snooze_escalations": (q["snooze_escalations"], {"until_ts": "2026-12-02T00:00:00Z", "reason": "r",
                                                         "created_by": "u", "target": "job:7"}),
        "caps: recent destructive": (locks._RECENT_DESTRUCTIVE.replace(":destructive", "(:d1, :d2)"),
                                     {"since": "2026-12-01T00:00:00Z", "action_id": "a", "d1": "kill", "d2": "terminate"}),
        "effect: same target": (locks._SAME_TARGET, {"target": "job:7", "action_id": "a",
                                                      "since": "2026-12-01T00:00:00Z", "rule": "zombie"}),
        "saving: a host's GPU model": (q["gpu_models_of_host"], {"host": "gpu01", "since": "2026-12-01T00:00:00Z",
                                                                 "until": "2026-12-03T00:00:00Z"}),
        "saving: a job's last usage": (q["job_usage_of"], {"job_id": "7", "until": "2026-12-03T00:00:00Z"}),
        # the runtime forecasts of a sweep's running jobs and their classes (two series here)
        "plan: runtime forecasts": (q["forecasts_of_series"].replace(":series", "(:s1, :s2)"),
                                    {"s1": "runtime:job:7", "s2": "runtime:class:a", "since": "2026-12-01T00:00:00Z"}),
        # the sweep's rejections, for its findings' targets (two here: an IN list as the store expands it)
        "plan: rejected decisions": (q["rejected_of_targets"].replace(":targets", "(:t1, :t2)"),
                                     {"t1": "job:7", "t2": "job:8"}),
        # the end of each run empties the parked state gone past sweep.keep_parked: a year's runs stay in the table
        "end of a run: release parked": (q["release_parked"], {"until": "2026-12-01T00:00:00Z"}),
    }


@pytest.mark.parametrize("how", ["created", "migrated"])
def test_what_every_sweep_and_action_reads_is_found_by_index_not_by_reading_a_whole_table(tmp_path: Path,
                                                                                          how: str) -> None:
    """A store of many months holds every decision, action, episode and class member ever seen: a read of the
    sweep's or the act step's that scans one of them (or builds a view of them whole) costs more every day."""
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    if how == "migrated":
        fill_baseline(sa.create_engine(url))
    store = AuditStore(url).ensure_schema()
    with store.engine.connect() as conn:
        for name, (sql, params) in _hot_path().items():
            steps = [str(r[-1]) for r in conn.execute(sa.text("EXPLAIN QUERY PLAN " + sql), params)]
            whole = [s for s in steps if s.startswith(("SCAN", "MATERIALIZE"))]  # a SEARCH is a lookup
            assert not whole, (name, steps)
        steps = [str(r[-1]) for r in conn.execute(sa.text("EXPLAIN QUERY PLAN " + _hot_path()["decisions_of_run"][0]),
                                                  {"run_id": "sweep:1"})]
    assert any("ix_gpu_cost_decision_log_run (run_id=?)" in s for s in steps), steps
    assert any("ix_gpu_cost_decision_events_run (run_id=? AND status=?)" in s for s in steps), steps
    with store.engine.connect() as conn:  # a range of instants over every host is a SEARCH too: the host's index
        sql, params = _hot_path()["saving: a host's GPU model"]
        steps = [str(r[-1]) for r in conn.execute(sa.text("EXPLAIN QUERY PLAN " + sql), params)]
    assert any("ix_gpu_cost_usage_host (host=? AND ts>? AND ts<?)" in s for s in steps), steps
    with store.engine.connect() as conn:  # the caps read the day's destructive actions, not the day's notices
        sql, params = _hot_path()["caps: recent destructive"]
        steps = [str(r[-1]) for r in conn.execute(sa.text("EXPLAIN QUERY PLAN " + sql), params)]
    assert any("ix_gpu_cost_action_log_action (action=? AND started_at>?)" in s for s in steps), steps
    with store.engine.connect() as conn:  # only the rows not released yet: the partial index
        sql, params = _hot_path()["end of a run: release parked"]
        steps = [str(r[-1]) for r in conn.execute(sa.text("EXPLAIN QUERY PLAN " + sql), params)]
    assert any("ix_gpu_cost_snapshots_parked (ts<?)" in s for s in steps), steps
    with store.engine.connect() as conn:  # ... which holds the rows not released yet, not every run ever parked
        index = conn.execute(sa.text("SELECT sql FROM sqlite_master WHERE name = 'ix_gpu_cost_snapshots_parked'")).scalar()
    assert str(index).endswith("WHERE payload <> ''"), index


def test_an_upgrade_twice_changes_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'twice.db'}"
    fill_baseline(sa.create_engine(url))
    store = AuditStore(url)
    first = store.upgrade()
    assert (first["from"], first["to"], first["created"]) == (None, migrations.head(), False)
    assert store.upgrade() == {"from": migrations.head(), "to": migrations.head(), "created": False}
    check_migrated(store)


def test_db_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from gpu_cost.cli.main import main

    url = f"sqlite:///{tmp_path / f'cli-{uuid.uuid4().hex[:6]}.db'}"
    fill_baseline(sa.create_engine(url))
    assert main(["db", "current", "--url", url, "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert (before["current"], before["at_head"], before["state"]) == (None, False, "behind")
    assert main(["db", "upgrade", "--url", url, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["from"], out["to"], out["created"], out["grants"]) == (None, migrations.head(), False, False)
    assert main(["db", "current", "--url", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["at_head"] is True


# -- results name their run and data instant; an older run never replaces a newer one ---------------------
def _forecast(series: str, horizon: float, yhat: float, data_ts: float, run_id: str) -> dict[str, Any]:
    return {"series": series, "horizon_ts": horizon, "kind": "demand", "yhat": yhat, "yhat_lower": None,
            "yhat_upper": None, "model": "m", "created_at": data_ts, "extra": "{}", "run_id": run_id,
            "data_ts": data_ts}


def test_an_older_forecast_run_never_replaces_a_newer_one(store: AuditStore) -> None:
    newer, older = T0 + 7200, T0
    # the manual run on newer data first, then the nightly that started on older data
    store.execute("upsert_forecast", [_forecast("demand:cluster:all", newer + h * 3600, 10.0 + h, newer, "manual")
                                      for h in range(3)])
    store.execute("upsert_forecast", [_forecast("demand:cluster:all", older + h * 3600, 1.0, older, "nightly")
                                      for h in range(6)])
    rows = store.fetch("forecasts_of", {"pattern": "demand:%", "since": 0})
    assert [(r["horizon_ts"], r["yhat"], r["run_id"], r["data_ts"]) for r in rows] == [
        (newer + h * 3600, 10.0 + h, "manual", newer) for h in range(3)]
    # a re-run on the same data instant does replace its own rows
    store.execute("upsert_forecast", [_forecast("demand:cluster:all", newer, 42.0, newer, "manual-retry")])
    assert store.fetch("forecasts_of", {"pattern": "demand:%", "since": 0})[0]["yhat"] == 42.0


def test_an_older_usage_row_never_replaces_a_newer_one(store: AuditStore) -> None:
    usage = {**BASELINE_ROWS["gpu_cost_usage"][0]}
    job = {**BASELINE_ROWS["gpu_cost_jobs_usage"][0]}
    store.execute("upsert_usage", {**usage, "busy_gpu_s": 900.0, "run_id": "new", "data_ts": T0 + 60})
    store.execute("upsert_usage", {**usage, "busy_gpu_s": 1.0, "run_id": "old", "data_ts": T0})
    store.execute("upsert_job_usage", {**job, "gpus_busy": 4, "run_id": "new", "data_ts": T0 + 60})
    store.execute("upsert_job_usage", {**job, "gpus_busy": 0, "run_id": "old", "data_ts": T0})
    (u,) = store.fetch("usage_between", {"since": T0 - 1, "until": T0 + 1})
    (j,) = store.fetch("job_usage_between", {"since": T0 - 1, "until": T0 + 1, "min_gpus": 0})
    assert (u["busy_gpu_s"], u["run_id"], u["data_ts"]) == (900.0, "new", T0 + 60)
    assert (j["gpus_busy"], j["run_id"], j["data_ts"]) == (4, "new", T0 + 60)


def test_a_result_without_run_takes_its_own_instant(store: AuditStore) -> None:
    store.execute("insert_saving", BASELINE_ROWS["gpu_cost_savings"][0])
    (row,) = store.fetch("savings_between", {"since": 0, "until": T0 + 3600})
    assert (row["run_id"], row["data_ts"]) == (None, T0 + 41)
