"""The audit store on SQLite (here) and on a real PostgreSQL server (integration, same tests)."""

from __future__ import annotations

import json

import pytest

from gpu_cost.core.model import Decision, decision_id
from tests.fixtures.core import NOW


def _decision(rung: int = 0, **kw) -> Decision:  # type: ignore[no-untyped-def]
    base = dict(decision_id=decision_id("idle_allocation", "job:7", 1, rung), ts=NOW, rule="idle_allocation",
                target_kind="job", target="job:7", action="notify", mode="dry-run", rung=rung, job_id="7",
                user="o'brien; rm -rf /", gpus=2, reason="r", evidence={"util_max": 0.1, "note": "ünïcode\n\"q\""})
    base.update(kw)
    return Decision(**base)  # type: ignore[arg-type]


def check_store(store) -> None:  # type: ignore[no-untyped-def]
    d = _decision()
    assert store.record_decisions([d], "run-1") == 1
    assert store.record_decisions([d], "run-2") == 0, "the same decision id keeps one row"
    row = store.get_decision(d.decision_id)
    assert row["user_name"] == "o'brien; rm -rf /" and row["run_id"] == "run-1"
    assert abs(row["ts"] - NOW) < 1
    assert json.loads(row["evidence"])["note"] == "ünïcode\n\"q\""
    assert store.action_started(action_id=d.decision_id + ":1", decision_id=d.decision_id, run_id="run-1",
                                action="notify", target="job:7", executor="test", dry_run=False, started_at=NOW)
    assert not store.action_started(action_id=d.decision_id + ":1", decision_id=d.decision_id, run_id="run-1",
                                    action="notify", target="job:7", executor="test", dry_run=False, started_at=NOW)
    store.action_finished(d.decision_id + ":1", "succeeded", NOW + 1, output="ok")
    store.action_finished(d.decision_id + ":1", "failed", NOW + 2, error="late")  # only a started row is updated
    a = store.get_action(d.decision_id + ":1")
    assert a["status"] == "succeeded" and a["output"] == "ok"
    store.execute("insert_escalation", {"rule": "idle_allocation", "target": "job:7", "track": "live", "episode": 1,
                                        "now": NOW, "job_id": "7", "user_name": "u"})
    store.execute("advance_escalation", {"rule": "idle_allocation", "target": "job:7", "track": "live", "episode": 1,
                                         "rung": 0, "now": NOW})
    store.execute("advance_escalation", {"rule": "idle_allocation", "target": "job:7", "track": "live", "episode": 1,
                                         "rung": 0, "now": NOW + 50})  # not past rung 0 again
    esc = store.escalation("idle_allocation", "job:7", "live")
    assert esc["rung"] == 0 and abs(esc["last_action_at"] - NOW) < 1
    store.execute("close_escalation", {"rule": "idle_allocation", "target": "job:7", "track": "live", "now": NOW + 60})
    assert store.open_escalations("live") == []
    store.execute("upsert_usage", [{"ts": NOW, "interval_s": 300, "host": "h", "gpu_model": "a100", "user_name": "u",
                                    "account": "a", "partition_name": "p", "gpus": 2, "total_gpu_s": 600,
                                    "allocated_gpu_s": 600, "busy_gpu_s": 300, "idle_alloc_gpu_s": 300,
                                    "zombie_gpu_s": 0, "util_sum": 100}] * 2)
    assert len(store.fetch("usage_between", {"since": NOW - 1, "until": NOW + 1})) == 1
    counts = store.table_counts()
    assert counts["gpu_cost_decisions"] == 1 and counts["gpu_cost_actions"] == 1
    # a row without one of the statement's values is refused by name, and nothing of the batch is written
    from gpu_cost.core.errors import AuditError

    with pytest.raises(AuditError, match="upsert_usage: no value for its parameter 'gpu_model'"):
        store.execute("upsert_usage", [{"ts": NOW + 300, "interval_s": 300, "host": "h", "gpu_model": "a100",
                                        "user_name": "u", "account": "a", "partition_name": "p", "gpus": 2,
                                        "total_gpu_s": 600, "allocated_gpu_s": 600, "busy_gpu_s": 300,
                                        "idle_alloc_gpu_s": 300, "zombie_gpu_s": 0, "util_sum": 100},
                                       {"ts": NOW + 300, "interval_s": 300, "host": "h2"}])
    assert len(store.fetch("usage_between", {"since": NOW - 1, "until": NOW + 301})) == 1
    # a read without one of its values is refused by name too
    with pytest.raises(AuditError, match="usage_between: no value for its parameter 'until'"):
        store.fetch("usage_between", {"since": NOW - 1})
    # a batch the database refuses part-way (gpus is NOT NULL) is named, writes nothing, and leaves no transaction
    # open: the store's next write and read on its pooled connections work
    with pytest.raises(AuditError, match="audit write upsert_usage failed on"):
        store.execute("upsert_usage", [{**USAGE, "ts": NOW + 600}, {**USAGE, "ts": NOW + 600, "host": "h2", "gpus": None}])
    assert store.fetch("usage_between", {"since": NOW + 599, "until": NOW + 601}) == []
    assert store.execute("upsert_usage", [{**USAGE, "ts": NOW + 900}]) == 1
    assert [r["host"] for r in store.fetch("usage_between", {"since": NOW + 899, "until": NOW + 901})] == ["h"]


USAGE = {"interval_s": 300, "host": "h", "gpu_model": "a100", "user_name": "u", "account": "a", "partition_name": "p",
         "gpus": 2, "total_gpu_s": 600, "allocated_gpu_s": 600, "busy_gpu_s": 300, "idle_alloc_gpu_s": 300,
         "zombie_gpu_s": 0, "util_sum": 100}


def test_sqlite_store(store) -> None:  # type: ignore[no-untyped-def]
    check_store(store)
    assert store.path and store.path.endswith(".db")


@pytest.mark.integration
def test_postgres_store(pg_store) -> None:  # type: ignore[no-untyped-def]
    check_store(pg_store)
    tables = {r["table_name"] for r in pg_store.query(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")}
    assert {"gpu_cost_decisions", "gpu_cost_actions", "gpu_cost_escalations", "gpu_cost_forecasts", "gpu_cost_usage",
            "gpu_cost_savings"} <= tables


def test_store_unreachable_is_an_audit_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.core.errors import AuditError

    bad = AuditStore("postgresql+psycopg2://nobody:secret@127.0.0.1:1/none")
    with pytest.raises(AuditError, match="unavailable") as exc:
        bad.ensure_schema()
    assert "secret" not in str(exc.value)


def test_a_scratch_store_lives_in_a_file_removed_with_it() -> None:
    import gc
    from pathlib import Path

    from gpu_cost.audit.store import AuditStore
    from gpu_cost.core.errors import AuditError

    store = AuditStore.scratch().ensure_schema()
    path = Path(str(store.path))
    assert path.is_file() and store.dialect == "sqlite"
    check_store(store)
    # a failed batch still rolls back whole (the journal is kept in memory, not switched off)
    row = {"ts": NOW + 600, "interval_s": 300, "host": "h", "gpu_model": "a100", "user_name": "u", "account": "a",
           "partition_name": "p", "gpus": 2, "total_gpu_s": 600, "allocated_gpu_s": 600, "busy_gpu_s": 300,
           "idle_alloc_gpu_s": 300, "zombie_gpu_s": 0, "util_sum": 100}
    with pytest.raises(AuditError):
        store.execute("upsert_usage", [row, {**row, "host": "h2", "gpus": None}])  # gpus is NOT NULL
    assert store.fetch("usage_between", {"since": NOW + 599, "until": NOW + 601}) == []
    # scan gives the rows query gives, one at a time
    assert list(store.scan("SELECT * FROM gpu_cost_usage ORDER BY ts")) == store.query(
        "SELECT * FROM gpu_cost_usage ORDER BY ts")
    assert AuditStore.scratch().path != store.path  # each one its own
    del store
    gc.collect()
    assert not path.exists() and not path.parent.exists()
