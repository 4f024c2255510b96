"""The audit store's grants (include/sql/grants.postgresql.sql), tried for real on PostgreSQL.

The tables are created by their owner; the agent role (connection ``gpu_cost_db``) then runs every
named write of ``include/sql/queries.sql`` through :class:`AuditStore`, and fails to DELETE,
TRUNCATE, DROP or UPDATE a column that records what was decided or done. The reader role (Grafana)
only reads.
"""

from __future__ import annotations

import os
import re
import subprocess
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

#: text values that must make sense to a statement (a status, a LIKE pattern, JSON columns)
_TEXT = {"status": "ok", "approval_status": "approved", "track": "dry-run", "kind": "gpu", "mode": "dry-run",
         "pattern": "%", "problems": "[]", "counts": "{}", "evidence": "{}", "payload": "{}", "extra": "{}"}


def _params(sql: str, types: dict[str, str]) -> dict[str, Any]:
    """Return a value for each ``:name`` of ``sql``, typed after the audit column of that name."""
    from gpu_cost.audit import store

    out: dict[str, Any] = {}
    for name in re.findall(r"(?<!:):([a-z_]+)", sql):
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


def _psql(port: int, user: str, db: str, *args: str) -> None:
    r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(port), "-U", user,
                        "-d", db, *args], capture_output=True, text=True)
    assert r.returncode == 0, f"psql {args} as {user}: {r.stderr.strip()}"


@pytest.fixture(scope="module")
def audit_db(postgres_server: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A fresh audit database set up as docker-compose does it.

    deploy/postgres/initdb.d/00-roles.sh as the superuser (roles, database), then, as the owner,
    schema.postgresql.sql and grants.postgresql.sql (service ``gpu-cost-db-init``; run twice here
    because every ``docker compose up`` runs it again).
    """
    port = int(postgres_server["port"])  # type: ignore[call-overload]
    name = f"grants_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(port), "POSTGRES_USER": "postgres",
           "GPU_COST_DB_NAME": name, "GPU_COST_OWNER_PASSWORD": "owner-pw", "GPU_COST_AGENT_PASSWORD": "agent'pw",
           "GPU_COST_READER_PASSWORD": "reader pw"}
    for _ in range(2):
        r = subprocess.run(["bash", str(ROOT / "deploy" / "postgres" / "initdb.d" / "00-roles.sh")], env=env,
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        _psql(port, "gpu_cost_owner", name, "-f", str(SQL / "schema.postgresql.sql"),
              "-f", str(SQL / "grants.postgresql.sql"))
    base = f"postgresql+psycopg2://{{}}@127.0.0.1:{port}/{name}"
    eng = sa.create_engine(base.format("gpu_cost_owner"))
    try:
        with eng.connect() as conn:
            types = dict(conn.execute(sa.text(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name LIKE 'gpu_cost%' ORDER BY table_name")).all())
    finally:
        eng.dispose()
    yield {"agent": base.format("gpu_cost_agent"), "reader": base.format("gpu_cost_reader"),
           "owner": base.format("gpu_cost_owner"), "types": types}  # type: ignore[misc]


@pytest.fixture(scope="module")
def agent_store(audit_db: dict[str, str]):  # type: ignore[no-untyped-def]
    from gpu_cost.audit.store import AuditStore

    store = AuditStore(audit_db["agent"])
    # The owner created the schema; the agent runs no DDL (see test_store_as_agent_runs_no_ddl).
    store._ready = True
    return store


def _denied(url: str, sql: str) -> str:
    eng = sa.create_engine(url)
    try:
        with pytest.raises(sa.exc.ProgrammingError) as err, eng.begin() as conn:
            conn.exec_driver_sql(sql)
    finally:
        eng.dispose()
    return str(err.value.orig)


@pytest.mark.parametrize("name", sorted(_writes()), ids=str)
def test_agent_runs_every_named_write(agent_store, audit_db, name: str) -> None:  # type: ignore[no-untyped-def]
    params = _params(_writes()[name], audit_db["types"])
    agent_store.execute(name, params)
    agent_store.execute(name, params)  # twice: upserts take their conflict (UPDATE) path


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
    from gpu_cost import sweep

    summary = sweep.run_once(policy, NOW, agent_store, run_id=f"grants-sweep:{uuid.uuid4().hex[:6]}", source="sim")
    assert agent_store.get_run(summary["run_id"])["status"] in ("ok", "degraded", "capped")


@pytest.mark.parametrize("table", TABLES)
def test_agent_cannot_delete_or_truncate(audit_db, table: str) -> None:  # type: ignore[no-untyped-def]
    assert "permission denied" in _denied(audit_db["agent"], f"DELETE FROM {table}")
    assert "permission denied" in _denied(audit_db["agent"], f"TRUNCATE {table}")


@pytest.mark.parametrize("sql", [
    "UPDATE gpu_cost_decisions SET action = 'cancel'",
    "UPDATE gpu_cost_decisions SET reason = 'rewritten', evidence = '{}'",
    "UPDATE gpu_cost_decisions SET target = 'job:0', mode = 'enforce'",
    "UPDATE gpu_cost_actions SET command = 'scancel 1'",
    "UPDATE gpu_cost_actions SET target = 'job:0', dry_run = 0",
    "UPDATE gpu_cost_runs SET started_at = now(), mode = 'enforce'",
    "UPDATE gpu_cost_savings SET usd = 1e9",
    "UPDATE gpu_cost_snoozes SET until_ts = now()",
    "UPDATE gpu_cost_usage SET host = 'elsewhere'",
    "DROP TABLE gpu_cost_actions",
    "ALTER TABLE gpu_cost_decisions DROP COLUMN reason",
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


def test_reader_only_reads(audit_db) -> None:  # type: ignore[no-untyped-def]
    eng = sa.create_engine(audit_db["reader"])
    try:
        with eng.connect() as conn:
            for table in TABLES:
                conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one()
    finally:
        eng.dispose()
    assert "permission denied" in _denied(audit_db["reader"], "INSERT INTO gpu_cost_snoozes VALUES "
                                                             "('x', 't', now(), 'r', 'u', now())")
    assert "permission denied" in _denied(audit_db["reader"], "UPDATE gpu_cost_decisions SET status = 'x'")


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
