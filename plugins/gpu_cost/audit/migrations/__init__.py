"""Schema migrations of the audit store (Alembic), run on the store's own connection.

Revisions live in ``versions/``: ``0001_baseline`` is the schema that shipped before migrations
(so a store created by an earlier version is adopted as it is), later ones change it, keeping
every row. ``include/sql/schema.*.sql`` describe the head: a store with no audit table at all is
created from that file and stamped at head in one step, every other store is upgraded.

SQLite stores are brought to head by :meth:`gpu_cost.audit.store.AuditStore.ensure_schema`; a
PostgreSQL store is upgraded by its tables' owner (``gpu-cost db upgrade``), since the agent's
role may not run DDL. The version is kept in ``gpu_cost_schema_version`` (never in Airflow's
``alembic_version``: the audit store is its own database, but a shared one must not mix them).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

logger = logging.getLogger(__name__)

VERSION_TABLE = "gpu_cost_schema_version"
#: a relation every store has had since the first release (a table, a view since 0008): present without a
#: version = a pre-migration store
_LEGACY_MARKER = "gpu_cost_runs"
#: key of the transaction advisory lock that serialises migrations on PostgreSQL
_PG_LOCK = "gpu_cost_schema_migration"


@dataclass(frozen=True)
class SchemaState:
    """Where a store stands: its revision (None: none recorded), the head, and whether it has tables."""

    current: str | None
    head: str
    has_tables: bool

    @property
    def at_head(self) -> bool:
        return self.current == self.head

    def as_dict(self) -> dict[str, Any]:
        return {"current": self.current, "head": self.head, "at_head": self.at_head,
                "state": "head" if self.at_head else ("behind" if self.has_tables else "empty")}


def _config(connection: Any | None = None) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def head() -> str:
    """Return the newest revision."""
    from alembic.script import ScriptDirectory

    rev = ScriptDirectory.from_config(_config()).get_current_head()
    assert rev is not None
    return rev


def revisions() -> list[str]:
    """Return every revision, oldest first."""
    from alembic.script import ScriptDirectory

    return [s.revision for s in reversed(list(ScriptDirectory.from_config(_config()).walk_revisions()))]


def baseline_statements(dialect: str) -> list[str]:
    """Return the DDL of the schema that shipped before migrations (revision ``0001_baseline``), for tests and tools."""
    from alembic.script import ScriptDirectory

    module = ScriptDirectory.from_config(_config()).get_revision("0001_baseline").module
    ddl = module.SQLITE if dialect == "sqlite" else module.POSTGRESQL
    text = "\n".join(line.split("--", 1)[0] for line in ddl.splitlines())
    return [stmt.strip() for stmt in text.split(";") if stmt.strip()]


def state(conn: sa.Connection) -> SchemaState:
    """Return where the store behind ``conn`` stands."""
    from alembic.runtime.migration import MigrationContext

    inspector = sa.inspect(conn)
    names = set(inspector.get_table_names()) | set(inspector.get_view_names())
    current = None
    if VERSION_TABLE in names:
        current = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
    return SchemaState(current=current, head=head(), has_tables=_LEGACY_MARKER in names)


def can_migrate(conn: sa.Connection) -> bool:
    """Return True when the connected role may run the migrations (PostgreSQL: owner or superuser)."""
    if conn.dialect.name == "sqlite":
        return True
    row = conn.exec_driver_sql(
        "SELECT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user), "
        f"(SELECT pg_has_role(current_user, c.relowner, 'MEMBER') FROM pg_class c "
        f"WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = '{_LEGACY_MARKER}'), "
        "has_schema_privilege(current_schema(), 'CREATE')").one()
    superuser, owner, create = row
    return bool(superuser) or (bool(owner) if owner is not None else bool(create))


def upgrade(engine: sa.Engine, schema_statements: list[str]) -> dict[str, Any]:
    """Bring the store to head in one transaction; return ``{from, to, created}``.

    :param schema_statements: the head's DDL (``include/sql/schema.<dialect>.sql``), for a store
        with no audit table at all.
    """
    from alembic import command

    with engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            # the write lock first: two processes opening the same new file migrate one after the other
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.begin()
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock(hashtext('{_PG_LOCK}'))")
        try:
            before = state(conn)  # read under the lock: another process may have just migrated
            created = False
            if not before.at_head:
                cfg = _config(conn)
                if before.current is None and not before.has_tables:
                    for stmt in schema_statements:
                        conn.exec_driver_sql(stmt)
                    command.stamp(cfg, "head")
                    created = True
                else:
                    command.upgrade(cfg, "head")
            if conn.dialect.name == "sqlite":
                conn.exec_driver_sql("COMMIT")
            else:
                conn.commit()
        except BaseException:
            if conn.dialect.name == "sqlite":
                conn.exec_driver_sql("ROLLBACK")
            else:
                conn.rollback()
            raise
    out = {"from": before.current, "to": head(), "created": created}
    if not before.at_head:
        logger.info("audit store migrated: %s → %s%s", before.current or ("nothing" if not before.has_tables else
                                                                          "pre-migration schema"),
                    out["to"], " (created at head)" if created else "")
    return out


__all__ = ["VERSION_TABLE", "SchemaState", "baseline_statements", "can_migrate", "head", "revisions", "state",
           "upgrade"]
