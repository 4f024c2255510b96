"""The audit store's grants (include/sql/grants.postgresql.sql), tried for real on PostgreSQL.

The tables are created by their owner (``gpu-cost db upgrade``, which applies the grants); the
agent role (connection ``gpu_cost_db``) then runs every named write of ``include/sql/queries.sql``
through :class:`AuditStore` and a whole sweep's writes, and fails to DELETE, TRUNCATE, DROP or
UPDATE anything of the run, decision and action history (rewriting a failed action as succeeded,
setting who approved, changing a run's status), and to write an approval at all: only the
approver's role (connection ``gpu_cost_db_approver``) does, and nothing else. The reader role
(Grafana) only reads.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fixtures.core import NOW, ROOT

pytestmark = pytest.mark.integration

SQL = ROOT / "include" / "sql"
#: every audit table of the schema file
TABLES = tuple(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", (SQL / "schema.postgresql.sql").read_text()))
#: the views of the current state
VIEWS = tuple(re.findall(r"CREATE OR REPLACE VIEW (\w+)", (SQL / "schema.postgresql.sql").read_text()))
#: run, decision and action history: the agent may only SELECT and INSERT (a decision's events: some columns)
HISTORY = ("gpu_cost_run_log", "gpu_cost_run_events", "gpu_cost_decision_log", "gpu_cost_decision_events",
           "gpu_cost_action_log", "gpu_cost_action_events")
#: the writes of the approver's role (the agent's may not run them)
APPROVER_WRITES = ("set_approval",)

#: text values that must make sense to a statement (a status, a LIKE pattern, JSON columns)
_TEXT = {"status": "ok", "approval_status": "approved", "track": "dry-run", "kind": "gpu", "mode": "dry-run",
         "pattern": "%", "problems": "[]", "counts": "{}", "evidence": "{}", "payload": "{}", "extra": "{}"}


def _params(sql: str, types: dict[str, str]) -> dict[str, Any]:
    """Return a value for each ``:name`` of ``sql``, typed after the audit column of that name."""
    from gpu_cost.audit import store

    out: dict[str, Any] = {}
    for name in re.findall(r"(?<!:):([a-z_][a-z_0-9]*)", sql):
        kind = types.get(name, "text")
        if name in store._TIME_COLUMNS or name in ("now", "since", "until", "until_ts") or "timestamp" in kind:
            out[name] = NOW
        elif kind in ("integer", "bigint", "smallint") or name == "max_attempts":
            out[name] = 1
        elif kind in ("double precision", "real", "numeric"):
            out[name] = 1.5
        else:
            out[name] = _TEXT.get(name, f"t-{name}")
    return out


def _writes() -> dict[str, str]:
    from gpu_cost.audit.store import queries

    return {n: q for n, q in queries().items() if re.match(r"\s*(INSERT|UPDATE)\b", q, re.I)}


def gpu_cost_db(*args: str) -> dict[str, Any]:
    """Run ``gpu-cost db ... --json`` as the deployment does; return its JSON object."""
    r = subprocess.run([sys.executable, "-m", "gpu_cost.cli.main", "db", *args, "--json"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)])})
    assert r.returncode == 0, f"gpu-cost db {args}: {r.stdout} {r.stderr[-2000:]}"
    return dict(json.loads(r.stdout))


def _roles_and_database(port: int, name: str) -> None:
    env = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(port), "POSTGRES_USER": "postgres",
           "GPU_COST_DB_NAME": name, "GPU_COST_OWNER_PASSWORD": "owner-pw", "GPU_COST_AGENT_PASSWORD": "agent'pw",
           "GPU_COST_APPROVER_PASSWORD": "approver\"pw", "GPU_COST_READER_PASSWORD": "reader pw"}
    r = subprocess.run(["bash", str(ROOT / "deploy" / "postgres" / "initdb.d" / "00-roles.sh")], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def audit_db(postgres_server: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A fresh audit database set up as docker-compose does it.

    deploy/postgres/initdb.d/00-roles.sh as the superuser (roles, database), then, as the owner,
    ``gpu-cost db upgrade`` (schema at head, then grants.postgresql.sql: service ``gpu-cost-db-init``;
    run twice here because every ``docker compose up`` runs it again).
    """
    port = int(postgres_server["port"])  # type: ignore[call-overload]
    name = f"grants_{uuid.uuid4().hex[:8]}"
    base = f"postgresql+psycopg2://{{}}@127.0.0.1:{port}/{name}"
    for i in range(2):
        _roles_and_database(port, name)
        out = gpu_cost_db("upgrade", "--url", base.format("gpu_cost_owner"))
        assert out["grants"] is True
        assert out["created"] is (i == 0)
    eng = sa.create_engine(base.format("gpu_cost_owner"))
    try:
        with eng.connect() as conn:
            types: dict[str, str] = dict(conn.execute(sa.text(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name LIKE 'gpu_cost%' ORDER BY table_name")).all())
    finally:
        eng.dispose()
    yield {"agent": base.format("gpu_cost_agent"), "reader": base.format("gpu_cost_reader"),
           "approver": base.format("gpu_cost_approver"), "owner": base.format("gpu_cost_owner"),
           "types": types}  # type: ignore[misc]


@pytest.fixture(scope="module")
def agent_store(audit_db: dict[str, str]):  # type: ignore[no-untyped-def]
    from gpu_cost.audit.store import AuditStore

    store = AuditStore(audit_db["agent"])
    # The owner created the schema; the agent runs no DDL (see test_store_as_agent_runs_no_ddl).
    store._ready = True
    return store


@pytest.fixture(scope="module")
def approver_store(audit_db: dict[str, str]):  # type: ignore[no-untyped-def]
    from gpu_cost.audit.store import AuditStore

    return AuditStore(audit_db["approver"]).ensure_schema()  # at head: no DDL


def _denied(url: str, sql: str) -> str:
    eng = sa.create_engine(url)
    try:
        with pytest.raises(sa.exc.ProgrammingError) as err, eng.begin() as conn:
            conn.exec_driver_sql(sql)
    finally:
        eng.dispose()
    return str(err.value.orig)


@pytest.mark.parametrize("name", sorted(_writes()), ids=str)
def test_agent_runs_every_named_write(agent_store, approver_store, audit_db, name: str) -> None:  # type: ignore[no-untyped-def]
    params = _params(_writes()[name], audit_db["types"])
    store = approver_store if name in APPROVER_WRITES else agent_store
    store.execute(name, params)
    store.execute(name, params)  # twice: upserts take their conflict (UPDATE) path


def test_agent_store_round_trip(agent_store) -> None:  # type: ignore[no-untyped-def]
    run_id = f"grants:{uuid.uuid4().hex[:6]}"
    agent_store.begin_run(run_id, dag_id="gpu_zombie_sweep", started_at=NOW, data_ts=NOW, source="sim", mode="dry-run")
    agent_store.save_snapshot(run_id, NOW, '{"a": 1}')
    agent_store.save_snapshot(run_id, NOW, '{"a": 2}')
    agent_store.action_started(action_id=f"{run_id}:d:0", decision_id=f"{run_id}:d", run_id=run_id, action="notify",
                               target="job:1", executor="test", dry_run=True, started_at=NOW)
    agent_store.action_finished(f"{run_id}:d:0", "succeeded", NOW + 1, output="ok")
    agent_store.finish_run(run_id, status="ok", finished_at=NOW + 2, counts={"decisions": 0})
    assert agent_store.get_run(run_id)["status"] == "ok"
    assert agent_store.load_snapshot(run_id) == '{"a": 2}'
    assert agent_store.get_action(f"{run_id}:d:0")["status"] == "succeeded"


def test_sweep_records_as_the_agent(agent_store, policy) -> None:  # type: ignore[no-untyped-def]
    """A whole sweep (runs, snapshot, usage, decisions, escalations) under the agent's grants."""
    from gpu_cost.loop import sweep

    summary = sweep.run_once(policy, NOW, agent_store, run_id=f"grants-sweep:{uuid.uuid4().hex[:6]}", source="sim")
    assert agent_store.get_run(summary["run_id"])["status"] in ("ok", "degraded", "capped")


@pytest.mark.parametrize("table", TABLES)
def test_agent_cannot_delete_or_truncate(audit_db, table: str) -> None:  # type: ignore[no-untyped-def]
    assert "permission denied" in _denied(audit_db["agent"], f"DELETE FROM {table}")
    assert "permission denied" in _denied(audit_db["agent"], f"TRUNCATE {table}")


@pytest.mark.parametrize("table", VIEWS)
def test_agent_cannot_write_the_views(audit_db, table: str) -> None:  # type: ignore[no-untyped-def]
    eng = sa.create_engine(audit_db["agent"])
    try:
        for sql in (f"DELETE FROM {table}", f"UPDATE {table} SET status = 'succeeded'", f"TRUNCATE {table}"):
            with pytest.raises(sa.exc.DBAPIError) as err, eng.begin() as conn:
                conn.exec_driver_sql(sql)
            message = str(err.value.orig)
            assert "permission denied" in message or "cannot" in message or "is not a table" in message, message
    finally:
        eng.dispose()


@pytest.mark.parametrize("sql", [
    "UPDATE gpu_cost_decision_log SET action = 'cancel'",
    "UPDATE gpu_cost_decision_log SET reason = 'rewritten', evidence = '{}'",
    "UPDATE gpu_cost_decision_log SET target = 'job:0', mode = 'enforce'",
    "UPDATE gpu_cost_decision_log SET status = 'acted', approval_status = 'approved'",
    "UPDATE gpu_cost_decision_events SET approved_by = 'someone-else', approval_status = 'approved'",
    "UPDATE gpu_cost_decision_events SET status = 'acted'",
    "UPDATE gpu_cost_action_log SET command = 'scancel 1'",
    "UPDATE gpu_cost_action_log SET target = 'job:0', dry_run = 0",
    "UPDATE gpu_cost_action_events SET status = 'succeeded', error = NULL WHERE status = 'failed'",
    "UPDATE gpu_cost_action_events SET attempt = 1",
    "INSERT INTO gpu_cost_schema_version VALUES ('0001_baseline')",
    "UPDATE gpu_cost_schema_version SET version_num = '0001_baseline'",
    "UPDATE gpu_cost_run_log SET started_at = now(), mode = 'enforce'",
    "UPDATE gpu_cost_run_events SET status = 'ok', problems = '[]'",
    "INSERT INTO gpu_cost_decision_events (decision_id, approval_status, approved_by) VALUES ('x', 'approved', 'me')",
    "INSERT INTO gpu_cost_decision_events (decision_id, status, approved_at) VALUES ('x', 'acted', now())",
    "UPDATE gpu_cost_savings SET usd = 1e9",
    "UPDATE gpu_cost_snoozes SET until_ts = now()",
    "UPDATE gpu_cost_usage SET host = 'elsewhere'",
    "DROP TABLE gpu_cost_action_log",
    "DROP VIEW gpu_cost_actions",
    "ALTER TABLE gpu_cost_decision_log DROP COLUMN reason",
    "CREATE TABLE gpu_cost_extra (x int)",
], ids=lambda s: " ".join(s.split()[:4]))
def test_agent_cannot_rewrite_history(audit_db, sql: str) -> None:  # type: ignore[no-untyped-def]
    message = _denied(audit_db["agent"], sql)
    assert "permission denied" in message or "must be owner" in message


def test_update_grants_match_queries_sql(audit_db) -> None:  # type: ignore[no-untyped-def]
    """Every column a named statement updates is granted, and no other column is."""
    needed: set[tuple[str, str]] = set()
    for q in _writes().values():
        m = re.match(r"\s*UPDATE\s+(\w+)\s+SET\s+(.*?)(?:\bWHERE\b|$)", q, re.I | re.S) or \
            re.search(r"INSERT\s+INTO\s+(\w+).*?DO\s+UPDATE\s+SET\s+(.*?)(?:\bWHERE\b|$)", q, re.I | re.S)
        if m:
            needed |= {(m.group(1), c) for c in re.findall(r"(\w+)\s*=(?!=)", m.group(2))}
    eng = sa.create_engine(audit_db["owner"])
    try:
        with eng.connect() as conn:
            granted = set(conn.execute(sa.text(
                "SELECT table_name, column_name FROM information_schema.column_privileges "
                "WHERE grantee = 'gpu_cost_agent' AND privilege_type = 'UPDATE'")).all())
    finally:
        eng.dispose()
    assert needed, "no UPDATE found in queries.sql: the parser is broken"
    assert sorted(needed - granted) == [], "grant these in include/sql/grants.postgresql.sql"
    assert sorted(granted - needed) == [], "granted but no statement updates them: revoke"


def test_history_is_select_and_insert_only(audit_db) -> None:  # type: ignore[no-untyped-def]
    """No UPDATE, DELETE or TRUNCATE on decision and action history, at table or column level, for anyone but the owner."""
    eng = sa.create_engine(audit_db["owner"])
    try:
        with eng.connect() as conn:
            tables = set(conn.execute(sa.text(
                "SELECT grantee, table_name, privilege_type FROM information_schema.table_privileges "
                "WHERE grantee IN ('gpu_cost_agent', 'gpu_cost_reader', 'PUBLIC')")).all())
            columns = set(conn.execute(sa.text(
                "SELECT DISTINCT grantee, table_name, privilege_type FROM information_schema.column_privileges "
                "WHERE grantee IN ('gpu_cost_agent', 'gpu_cost_reader', 'PUBLIC') AND privilege_type <> 'SELECT' "
                "AND privilege_type <> 'INSERT'")).all())
    finally:
        eng.dispose()
    for table in (*HISTORY, *VIEWS, "gpu_cost_savings", "gpu_cost_snoozes", "gpu_cost_run_policies"):
        agent = {p for g, t, p in tables if g == "gpu_cost_agent" and t == table}
        whole = {"SELECT"} if table in (*VIEWS, "gpu_cost_decision_events") else {"SELECT", "INSERT"}
        assert agent == whole, (table, agent)
        assert {p for g, t, p in tables if g == "gpu_cost_reader" and t == table} == {"SELECT"}, table
        assert not [c for c in columns if c[1] == table], (table, columns)
    assert {p for g, t, p in tables if t == "gpu_cost_schema_version" and g != "PUBLIC"} == {"SELECT"}
    # the approver's role reads, and writes nothing but approval events
    assert {(t, p) for g, t, p in tables if g == "gpu_cost_approver" and p != "SELECT"} == set()


def _insert_columns(audit_db, role: str, table: str) -> set[str]:  # type: ignore[no-untyped-def]
    eng = sa.create_engine(audit_db["owner"])
    try:
        with eng.connect() as conn:
            return {c for (c,) in conn.execute(sa.text(
                "SELECT column_name FROM information_schema.column_privileges WHERE grantee = :g "
                "AND table_name = :t AND privilege_type = 'INSERT'"), {"g": role, "t": table}).all()}
    finally:
        eng.dispose()


def test_only_the_approver_writes_approvals(audit_db) -> None:  # type: ignore[no-untyped-def]
    """A decision's events: the agent writes status changes, never an approval; the approver the reverse."""
    approval = {"approval_status", "approved_by", "approved_at"}
    agent = _insert_columns(audit_db, "gpu_cost_agent", "gpu_cost_decision_events")
    approver = _insert_columns(audit_db, "gpu_cost_approver", "gpu_cost_decision_events")
    assert "status" in agent and not agent & approval, agent
    assert approval <= approver and "status" not in approver, approver
    eng = sa.create_engine(audit_db["owner"])
    try:
        with eng.connect() as conn:
            others = conn.execute(sa.text(
                "SELECT DISTINCT table_name FROM information_schema.column_privileges WHERE grantee = 'gpu_cost_approver' "
                "AND privilege_type <> 'SELECT'")).scalars().all()
    finally:
        eng.dispose()
    assert others == ["gpu_cost_decision_events"]


def _decision(run_id: str, suffix: str = "d"):  # type: ignore[no-untyped-def]
    from gpu_cost.core.model import Decision

    return Decision(decision_id=f"{run_id}:{suffix}", ts=NOW, rule="idle_allocation", target_kind="job",
                    target=f"job:{run_id}", action="cancel", mode="enforce", requires_approval=True, gpus=4,
                    reason="idle")


def test_the_agent_cannot_approve(agent_store, audit_db) -> None:  # type: ignore[no-untyped-def]
    """Neither an approval event (refused, with what to configure) nor a log row that says approved (not an approval)."""
    from gpu_cost.audit.store import decision_row
    from gpu_cost.core.errors import AuditError

    run_id = f"forge:{uuid.uuid4().hex[:6]}"
    d = _decision(run_id)
    agent_store.record_decisions([d], run_id)
    with pytest.raises(AuditError, match=r"permission denied.*approver's role \(connection gpu_cost_db_approver"):
        agent_store.set_approval(d.decision_id, "approved", "mallory", NOW)
    message = _denied(audit_db["agent"], "INSERT INTO gpu_cost_decision_events (decision_id, approval_status, "
                                         f"approved_by, approved_at) VALUES ('{d.decision_id}', 'approved', 'mallory', now())")
    assert "permission denied" in message
    forged = {**decision_row(_decision(run_id, "forged"), run_id), "approval_status": "approved"}
    agent_store.execute("insert_decision", forged)  # the agent decides: it may write the log
    for did in (d.decision_id, forged["decision_id"]):
        got = agent_store.get_decision(did)
        assert got["approval_status"] in ("pending", None) and got["approved_by"] is None, got
    from gpu_cost.decide.engine import may_act

    assert not may_act(agent_store.get_decision(forged["decision_id"]))
    assert not may_act(agent_store.get_decision(forged["decision_id"]), approved_only=True)


def test_the_approval_path_records_approvals(agent_store, audit_db, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The approval operator's path (its connection resolved as in a worker) records approve and reject."""
    from gpu_cost.airflow import approval, runtime

    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB", audit_db["agent"].replace("postgresql+psycopg2", "postgresql"))
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB_APPROVER",
                       audit_db["approver"].replace("postgresql+psycopg2", "postgresql"))
    store = runtime.store()
    approver = runtime.approver_store(store)
    assert approver is not store and approver.url.startswith("postgresql+psycopg2://gpu_cost_approver@")
    run_id = f"approve:{uuid.uuid4().hex[:6]}"
    yes, no = _decision(run_id, "yes"), _decision(run_id, "no")
    store.record_decisions([yes, no], run_id)
    assert [r["decision_id"] for r in approval.pending_approvals(store, run_id)] == [no.decision_id, yes.decision_id]
    approval.record_answer(store, [yes.decision_id], approval.APPROVED, "lead", NOW + 60, approver=approver)
    approval.record_answer(store, [no.decision_id], approval.REJECTED, "lead", NOW + 61, approver=approver)
    got = {r["decision_id"]: r for r in store.decisions_of_run(run_id)}
    assert (got[yes.decision_id]["approval_status"], got[yes.decision_id]["approved_by"],
            got[yes.decision_id]["approved_at"], got[yes.decision_id]["status"]) == ("approved", "lead", NOW + 60, "decided")
    assert (got[no.decision_id]["approval_status"], got[no.decision_id]["status"]) == ("rejected", "rejected")
    assert approval.pending_approvals(store, run_id) == []
    # the approver's role writes approvals and nothing else
    for sql in (f"INSERT INTO gpu_cost_decision_events (decision_id, status) VALUES ('{yes.decision_id}', 'acted')",
                "INSERT INTO gpu_cost_run_events (run_id, status) VALUES ('x', 'ok')",
                "INSERT INTO gpu_cost_decision_log (decision_id, ts, rule, target_kind, target, action, mode) "
                "VALUES ('x', now(), 'r', 'job', 'job:1', 'cancel', 'enforce')",
                f"UPDATE gpu_cost_decision_events SET approved_by = 'x' WHERE decision_id = '{yes.decision_id}'"):
        assert "permission denied" in _denied(audit_db["approver"], sql)


def test_run_status_is_history_as_the_agent(agent_store, audit_db) -> None:  # type: ignore[no-untyped-def]
    """Status changes of a run are new rows the view reads; the agent can change no row of a run."""
    from tests.unit.test_run_history import check_run_story

    run_id = f"runs:{uuid.uuid4().hex[:6]}"
    check_run_story(agent_store, run_id)
    for sql in (f"UPDATE gpu_cost_runs SET status = 'ok' WHERE run_id = '{run_id}'",
                f"UPDATE gpu_cost_run_events SET status = 'ok' WHERE run_id = '{run_id}'",
                f"UPDATE gpu_cost_run_log SET mode = 'dry-run' WHERE run_id = '{run_id}'",
                f"DELETE FROM gpu_cost_run_events WHERE run_id = '{run_id}'"):
        eng = sa.create_engine(audit_db["agent"])
        try:
            with pytest.raises(sa.exc.DBAPIError) as err, eng.begin() as conn:
                conn.exec_driver_sql(sql)
        finally:
            eng.dispose()
        message = str(err.value.orig)
        assert "permission denied" in message or "cannot update view" in message, (sql, message)
    assert agent_store.get_run(run_id)["status"] == "failed"


def test_agent_writes_history_but_never_rewrites_it(agent_store, approver_store,  # type: ignore[no-untyped-def]
                                                    audit_db) -> None:
    """Decide, approve (the approver), act, fail, retry, succeed (the agent); then try to rewrite it and fail."""
    from gpu_cost.act import locks
    from gpu_cost.core.model import Decision

    run_id = f"hist:{uuid.uuid4().hex[:6]}"
    d = Decision(decision_id=f"{run_id}:d", ts=NOW, rule="zombie", target_kind="job", target=f"job:{run_id}",
                 action="cancel", mode="enforce", requires_approval=True, gpus=2, reason="idle")
    assert agent_store.record_decisions([d], run_id) == 1
    assert agent_store.record_decisions([d], run_id) == 0  # idempotent
    approver_store.set_approval(d.decision_id, "approved", "oncall@example.org", NOW + 10, run_id=run_id)
    aid = f"{d.decision_id}:cancel"
    row = {"action_id": aid, "decision_id": d.decision_id, "run_id": run_id, "action": "cancel", "target": d.target,
           "executor": "test", "dry_run": 0, "started_at": NOW + 20, "attempt": 1, "command": None}
    assert locks.start_effect(agent_store, d, row) == (True, None)
    agent_store.action_finished(aid, "failed", NOW + 21, error="slurmctld down")
    assert agent_store.execute("action_reopen", {"action_id": aid, "max_attempts": 3}) == 1
    agent_store.execute("action_retry", {"action_id": aid})
    agent_store.action_finished(aid, "succeeded", NOW + 30, output="$ scancel 1")
    agent_store.action_finished(aid, "failed", NOW + 31, error="late")  # an ended action keeps its outcome
    agent_store.set_decision_status(d.decision_id, "acted", run_id=run_id)
    got = agent_store.get_action(aid)
    assert (got["status"], got["attempt"], got["finished_at"]) == ("succeeded", 2, NOW + 30)
    dec = agent_store.get_decision(d.decision_id)
    assert (dec["status"], dec["approval_status"], dec["approved_by"]) == ("acted", "approved", "oncall@example.org")
    assert [(e["status"], e["approval_status"]) for e in agent_store.decision_events(d.decision_id)] == [
        (None, "approved"), ("acted", None)]
    assert agent_store.decisions_by_ids([d.decision_id, "unknown"]) == [dec]

    for sql in (f"UPDATE gpu_cost_action_events SET status = 'failed' WHERE action_id = '{aid}'",
                f"UPDATE gpu_cost_decision_events SET approved_by = 'mallory' WHERE decision_id = '{d.decision_id}'",
                f"DELETE FROM gpu_cost_action_events WHERE action_id = '{aid}'",
                f"DELETE FROM gpu_cost_decision_events WHERE decision_id = '{d.decision_id}'"):
        assert "permission denied" in _denied(audit_db["agent"], sql)
    assert agent_store.get_action(aid) == got and agent_store.get_decision(d.decision_id) == dec


def test_agent_on_an_old_schema_is_told_what_to_run(postgres_server) -> None:  # type: ignore[no-untyped-def]
    """A store left at the baseline: the agent may not migrate it; the error names the owner's command."""
    from gpu_cost.audit.migrations import baseline_statements, head
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.core.errors import AuditError

    port = int(postgres_server["port"])
    name = f"old_{uuid.uuid4().hex[:8]}"
    _roles_and_database(port, name)
    base = f"postgresql+psycopg2://{{}}@127.0.0.1:{port}/{name}"
    eng = sa.create_engine(base.format("gpu_cost_owner"))
    try:
        with eng.begin() as conn:
            for stmt in baseline_statements("postgresql"):
                conn.exec_driver_sql(stmt)
            conn.exec_driver_sql("GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA public TO gpu_cost_agent")
    finally:
        eng.dispose()
    with pytest.raises(AuditError, match=r"gpu-cost db upgrade"):
        AuditStore(base.format("gpu_cost_agent") + "?application_name=old").ensure_schema()
    assert gpu_cost_db("current", "--url", base.format("gpu_cost_owner"))["current"] is None
    out = gpu_cost_db("upgrade", "--url", base.format("gpu_cost_owner"))
    assert (out["from"], out["to"], out["created"]) == (None, head(), False)
    store = AuditStore(base.format("gpu_cost_agent") + "?application_name=new").ensure_schema()
    assert store.get_run("none") is None
    assert gpu_cost_db("current", "--url", base.format("gpu_cost_agent"))["at_head"] is True


def test_reader_only_reads(audit_db) -> None:  # type: ignore[no-untyped-def]
    eng = sa.create_engine(audit_db["reader"])
    try:
        with eng.connect() as conn:
            for table in (*TABLES, *VIEWS):
                conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one()
    finally:
        eng.dispose()
    assert "permission denied" in _denied(audit_db["reader"], "INSERT INTO gpu_cost_snoozes VALUES "
                                                             "('x', 't', now(), 'r', 'u', now())")
    assert "permission denied" in _denied(audit_db["reader"], "INSERT INTO gpu_cost_decision_events (decision_id, "
                                                             "status) VALUES ('x', 'acted')")
    for table in HISTORY:
        assert "permission denied" in _denied(audit_db["reader"], f"DELETE FROM {table}")
    assert "permission denied" in _denied(audit_db["reader"], "UPDATE gpu_cost_decision_log SET status = 'x'")


def test_store_as_agent_runs_no_ddl(audit_db) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.audit.store import AuditStore

    store = AuditStore(audit_db["agent"] + "?application_name=ddl-check").ensure_schema()
    assert store.get_run("none") is None


def _grafana_sql(raw: str) -> str:
    """Expand the Grafana macros and variables the dashboards use, as Grafana does for PostgreSQL."""
    sql = re.sub(r"\$__timeFilter\((\w+)\)", r"\1 BETWEEN '1970-01-01T00:00:00Z' AND '2100-01-01T00:00:00Z'", raw)
    sql = re.sub(r"\$__timeGroupAlias\((\w+),\s*'1([hd])'\)",
                 lambda m: f"floor(extract(epoch from {m.group(1)}) / {3600 if m.group(2) == 'h' else 86400}) "
                           f"* {3600 if m.group(2) == 'h' else 86400} AS \"time\"", sql)
    sql = sql.replace("$usd_per_gpu_hour", "2.50")
    assert "$" not in sql, f"unexpanded macro or variable in: {raw}"
    return sql


def _dashboard_queries() -> list[tuple[str, str]]:
    import json

    out = []
    for f in sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json")):
        for panel in json.loads(f.read_text())["panels"]:
            for t in panel.get("targets", []):
                if "rawSql" in t:
                    out.append((f"{f.stem}: {panel['title']}", t["rawSql"]))
    return out


@pytest.mark.parametrize(("panel", "raw"), _dashboard_queries(), ids=[p for p, _ in _dashboard_queries()])
def test_grafana_queries_run_as_the_reader(audit_db, agent_store, panel: str, raw: str) -> None:  # type: ignore[no-untyped-def]
    """Every SQL panel of the dashboards runs on the real schema with the reader's rights."""
    agent_store.execute("upsert_usage", _params(_writes()["upsert_usage"], audit_db["types"]))
    eng = sa.create_engine(audit_db["reader"])
    try:
        with eng.connect() as conn:
            rows = conn.execute(sa.text(_grafana_sql(raw))).all()
    finally:
        eng.dispose()
    if "gpu_cost_usage" in raw and "GROUP BY" not in raw:
        assert len(rows) == 1 and rows[0][0] is not None, panel  # a stat over the usage row just written
