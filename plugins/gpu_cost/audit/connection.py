"""Resolve the audit store's Airflow connection (``gpu_cost_db``) to a SQLAlchemy URL.

Order: the ``AIRFLOW_CONN_GPU_COST_DB`` environment variable (URI or JSON, as Airflow reads it);
inside an Airflow process, Airflow's own connection lookup (secrets backends); otherwise a SQLite
file under ``GPU_COST_HOME`` (``~/.gpu_cost/audit.db``). Passwords never reach logs: print a URL
through :func:`gpu_cost.redact.redact` (re-exported here as ``redact``).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from gpu_cost import connections, paths
from gpu_cost.errors import AuditError
from gpu_cost.redact import redact

logger = logging.getLogger(__name__)

CONN_ID = "gpu_cost_db"

__all__ = ["CONN_ID", "audit_url", "redact", "url_from_conn"]


def audit_url(conn_id: str = CONN_ID) -> str:
    """Return the SQLAlchemy URL of the audit store."""
    conn = connections.lookup(conn_id, AuditError)
    if conn is not None:
        return url_from_conn(conn)
    path = paths.state_dir() / "audit.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def url_from_conn(conn: dict[str, Any]) -> str:
    """Return a SQLAlchemy URL for an Airflow-style connection dict (sqlite or postgres)."""
    ctype = (conn.get("conn_type") or "").lower()
    if ctype == "sqlite":
        host = conn.get("host") or ""
        if not host:
            raise AuditError("gpu_cost_db: a sqlite connection needs the database file path as host")
        return f"sqlite:///{host}"
    if ctype in ("postgres", "postgresql"):
        login = quote(conn.get("login") or "", safe="")
        password = conn.get("password")
        auth = f"{login}:{quote(password, safe='')}@" if password else (f"{login}@" if login else "")
        port = f":{conn['port']}" if conn.get("port") else ""
        return f"postgresql+psycopg2://{auth}{conn.get('host') or 'localhost'}{port}/{conn.get('schema') or 'gpu_cost'}"
    raise AuditError(f"gpu_cost_db: connection type {ctype!r} is not supported (use sqlite or postgres)")
