"""Resolve the audit store's Airflow connection (``gpu_cost_db``) to a SQLAlchemy URL.

Order: the ``AIRFLOW_CONN_GPU_COST_DB`` environment variable (URI or JSON, as Airflow reads it);
inside an Airflow process, Airflow's own connection lookup (secrets backends); otherwise a SQLite
file under ``GPU_COST_HOME`` (``~/.gpu_cost/audit.db``). Passwords never reach logs: print a URL
through :func:`gpu_cost.core.redact.redact` (re-exported here as ``redact``).

Approvals are written through their own connection, ``gpu_cost_db_approver`` (:func:`approver_url`):
on PostgreSQL the agent's role may record decisions, actions and run status but no approval.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gpu_cost.core import connections, paths
from gpu_cost.core.errors import AuditError
from gpu_cost.core.redact import redact

logger = logging.getLogger(__name__)

CONN_ID = "gpu_cost_db"
#: the approval operator's connection to the same store: on PostgreSQL the role ``gpu_cost_approver``, the
#: only one that may write an approval (the agent's role may not); unset: the agent's connection
APPROVER_CONN_ID = "gpu_cost_db_approver"

__all__ = ["APPROVER_CONN_ID", "CONN_ID", "approver_url", "audit_url", "connection_url", "default_path", "redact",
           "url_from_conn", "url_from_text"]


def audit_url(conn_id: str = CONN_ID) -> str:
    """Return the SQLAlchemy URL of the audit store."""
    url = connection_url(conn_id)
    if url is not None:
        return url
    path = default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def approver_url() -> str | None:
    """Return the URL approvals are written through (connection ``gpu_cost_db_approver``); None: the audit store's own."""
    return connection_url(APPROVER_CONN_ID)


def connection_url(conn_id: str = CONN_ID) -> str | None:
    """Return the URL of the ``conn_id`` connection, or None when it is not configured."""
    conn = connections.lookup(conn_id, AuditError)
    return url_from_conn(conn) if conn is not None else None


def default_path() -> Path:
    """Return the SQLite file used when no store is configured (``GPU_COST_HOME/audit.db``)."""
    return paths.state_dir() / "audit.db"


def url_from_text(text: str) -> str:
    """Return a SQLAlchemy URL for what a person types: a URL, an Airflow-style URI, or a SQLite file path.

    ``postgres://`` / ``postgresql://`` (as in ``AIRFLOW_CONN_GPU_COST_DB``) get the driver SQLAlchemy
    uses here; a path without a scheme is a SQLite file, made absolute so the URL says where it is.
    """
    text = text.strip()
    if not text:
        raise AuditError("the audit store's URL or path is empty")
    if text.startswith(("postgres://", "postgresql://")):
        return "postgresql+psycopg2://" + text.split("://", 1)[1]
    if "://" in text:
        return text
    return url_from_conn({"conn_type": "sqlite", "host": str(Path(text).expanduser().resolve())})


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
