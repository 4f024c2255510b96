"""Migrations of the audit store on a real PostgreSQL: the shipped-before-migrations schema, with rows in
every table, reaches head keeping every row and the same current state; the schema file describes the head."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from tests.unit.test_audit_migrations import check_migrated, fill_baseline

pytestmark = pytest.mark.integration


def _database(server: dict[str, Any]) -> str:
    name = f"mig_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(str(server["url"]), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
    finally:
        admin.dispose()
    return f"postgresql+psycopg2://postgres@127.0.0.1:{server['port']}/{name}"


def _shape(url: str) -> dict[str, Any]:
    eng = sa.create_engine(url)
    try:
        with eng.connect() as conn:
            columns = conn.exec_driver_sql(
                "SELECT table_name, ordinal_position, column_name, data_type, is_nullable, column_default, "
                "is_identity FROM information_schema.columns WHERE table_schema = 'public' "
                "ORDER BY table_name, ordinal_position").all()
            kinds = conn.exec_driver_sql(
                "SELECT table_name, table_type FROM information_schema.tables WHERE table_schema = 'public' "
                "ORDER BY table_name").all()
            indexes = conn.exec_driver_sql(
                "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
                "ORDER BY indexname").all()
            constraints = conn.exec_driver_sql(
                "SELECT conrelid::regclass::text, contype, pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2, 3").all()
            views = conn.exec_driver_sql(
                "SELECT viewname, pg_get_viewdef(viewname::regclass) FROM pg_views WHERE schemaname = 'public' "
                "ORDER BY viewname").all()
    finally:
        eng.dispose()
    # names PostgreSQL makes up for a constraint's index differ with history, their definitions do not
    assert [v for v, _d in views] == ["gpu_cost_actions", "gpu_cost_decisions", "gpu_cost_runs"]
    return {"columns": columns, "kinds": kinds, "constraints": constraints, "views": views,
            "indexes": sorted((t, d.split(" ON ", 1)[1]) for t, _n, d in indexes)}


def test_upgrade_keeps_every_row_on_postgresql(postgres_server) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.audit.store import AuditStore

    url = _database(postgres_server)
    eng = sa.create_engine(url)
    try:
        fill_baseline(eng)
    finally:
        eng.dispose()
    store = AuditStore(url)
    assert store.schema_state()["state"] == "behind"
    store.ensure_schema()  # a superuser may migrate
    check_migrated(store)


def test_the_schema_file_describes_the_head(postgres_server) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.audit.store import AuditStore

    fresh = _database(postgres_server)
    AuditStore(fresh).ensure_schema()
    migrated = _database(postgres_server)
    eng = sa.create_engine(migrated)
    try:
        fill_baseline(eng)
    finally:
        eng.dispose()
    AuditStore(migrated).ensure_schema()
    a, b = _shape(fresh), _shape(migrated)
    for key in a:
        assert a[key] == b[key], key
