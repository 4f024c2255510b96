"""Resolve the audit store's Airflow connection (``gpu_cost_db``) to a SQLAlchemy URL.

Order: the ``AIRFLOW_CONN_GPU_COST_DB`` environment variable (URI or JSON, as Airflow reads it);
inside an Airflow process, Airflow's own connection lookup (secrets backends); otherwise a SQLite
file under ``GPU_COST_HOME`` (``~/.gpu_cost/audit.db``). Passwords never reach logs: use
:func:`redact` to print a URL.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from gpu_cost import paths
from gpu_cost.errors import AuditError

logger = logging.getLogger(__name__)

CONN_ID = "gpu_cost_db"


def conn_env_var(conn_id: str) -> str:
    return f"AIRFLOW_CONN_{conn_id.upper()}"


def audit_url(conn_id: str = CONN_ID) -> str:
    """Return the SQLAlchemy URL of the audit store."""
    raw = os.environ.get(conn_env_var(conn_id))
    if raw:
        return url_from_conn(_parse_env(raw, conn_id))
    if "airflow" in sys.modules and os.environ.get("GPU_COST_AIRFLOW_LOOKUP", "1") == "1":
        conn = _airflow_lookup(conn_id)
        if conn is not None:
            return url_from_conn(conn)
    path = paths.state_dir() / "audit.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def _parse_env(raw: str, conn_id: str) -> dict[str, Any]:
    raw = raw.strip()
    if raw.startswith("{"):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise AuditError(f"{conn_env_var(conn_id)}: not valid JSON: {exc.msg}") from None
        return dict(data)
    parts = urlsplit(raw)
    scheme = parts.scheme.split("+")[0]
    if scheme == "sqlite":
        # Airflow: sqlite://<path as host>; SQLAlchemy: sqlite:////abs/path
        path = unquote(parts.netloc + parts.path) if parts.netloc else unquote(parts.path)
        if raw.startswith("sqlite:////"):
            path = "/" + raw[len("sqlite:////"):]
        elif raw.startswith("sqlite:///"):
            path = raw[len("sqlite:///"):]
        return {"conn_type": "sqlite", "host": path}
    return {
        "conn_type": "postgres" if scheme in ("postgres", "postgresql") else scheme,
        "host": parts.hostname,
        "port": parts.port,
        "login": unquote(parts.username) if parts.username else None,
        "password": unquote(parts.password) if parts.password else None,
        "schema": parts.path.lstrip("/") or None,
    }


def _airflow_lookup(conn_id: str) -> dict[str, Any] | None:
    try:
        from airflow.sdk import BaseHook

        c = BaseHook.get_connection(conn_id)
    except Exception as exc:
        logger.debug("no Airflow connection %s: %s", conn_id, type(exc).__name__)
        return None
    return {"conn_type": c.conn_type, "host": c.host, "port": c.port, "login": c.login, "password": c.password,
            "schema": c.schema, "extra": c.extra_dejson}


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


def redact(url: str) -> str:
    """Return the URL with any password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@").replace(f":{quote(parts.password, safe='')}@", ":***@")
    return url
