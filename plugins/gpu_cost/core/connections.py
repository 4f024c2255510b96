"""Airflow connections, read the way Airflow reads them, for code that also runs outside Airflow.

Order for a connection id: the ``AIRFLOW_CONN_<ID>`` environment variable (a JSON object or a
URI, as Airflow accepts), else -- when Airflow is loaded and ``GPU_COST_AIRFLOW_LOOKUP`` is not
``0`` -- Airflow's own lookup (metadata DB, secrets backends). Every connection comes back as one
dict shape: ``conn_type, host, port, login, password, schema, extra`` (``extra`` a dict). Errors
name the variable and what is wrong, in the caller's exception class.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from gpu_cost.core.errors import GpuCostError

logger = logging.getLogger(__name__)

#: the Slack connection (webhook or bot token) of notices, approvals and the weekly report
SLACK_CONN_ID = "gpu_cost_slack"


def env_var(conn_id: str) -> str:
    """Return the environment variable Airflow reads ``conn_id`` from."""
    return f"AIRFLOW_CONN_{conn_id.upper()}"


def parse(raw: str, conn_id: str, error: type[Exception] = GpuCostError) -> dict[str, Any]:
    """Return the connection dict of an ``AIRFLOW_CONN_*`` value (JSON object or URI)."""
    raw = raw.strip()
    var = env_var(conn_id)
    if raw.startswith("{"):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise error(f"{var}: not valid JSON: {exc.msg}") from None
        if not isinstance(data, dict):
            raise error(f"{var}: must be a JSON object")
        return {**data, "extra": _extra(data.get("extra"), var, error)}
    parts = urlsplit(raw)
    scheme = parts.scheme.split("+")[0]
    query = dict(parse_qsl(parts.query))
    extra = _extra(query["__extra__"], var, error) if "__extra__" in query else query
    if scheme == "sqlite":
        # Airflow: sqlite://<path as host>; SQLAlchemy: sqlite:////abs/path
        path = unquote(parts.netloc + parts.path) if parts.netloc else unquote(parts.path)
        if raw.startswith("sqlite:////"):
            path = "/" + raw[len("sqlite:////"):]
        elif raw.startswith("sqlite:///"):
            path = raw[len("sqlite:///"):]
        return {"conn_type": "sqlite", "host": path, "extra": extra}
    return {
        "conn_type": "postgres" if scheme == "postgresql" else scheme,
        "host": parts.hostname, "port": parts.port,
        "login": unquote(parts.username) if parts.username else None,
        "password": unquote(parts.password) if parts.password else None,
        "schema": parts.path.lstrip("/") or None, "extra": extra,
    }


def _extra(value: Any, var: str, error: type[Exception]) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise error(f"{var}: extra is not valid JSON: {exc.msg}") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise error(f"{var}: extra must be a JSON object")
    return value


def airflow_connection(conn_id: str) -> Any | None:
    """Return Airflow's ``Connection`` object (for hooks that need one), or None when it is not configured."""
    try:
        from airflow.sdk import BaseHook

        return BaseHook.get_connection(conn_id)
    except Exception as exc:  # not found / no secrets backend: both mean "not configured"
        logger.info("connection %s is not configured (%s)", conn_id, type(exc).__name__)
        return None


def airflow_lookup(conn_id: str) -> dict[str, Any] | None:
    """Return the connection from Airflow's own lookup as a dict, or None when Airflow does not know it."""
    c = airflow_connection(conn_id)
    if c is None:
        return None
    return {"conn_type": c.conn_type, "host": c.host, "port": c.port, "login": c.login, "password": c.password,
            "schema": c.schema, "extra": c.extra_dejson}


def lookup(conn_id: str, error: type[Exception] = GpuCostError) -> dict[str, Any] | None:
    """Return the connection ``conn_id`` (environment first, then Airflow), or None when it is not set."""
    raw = os.environ.get(env_var(conn_id))
    if raw:
        return parse(raw, conn_id, error)
    if "airflow" in sys.modules and os.environ.get("GPU_COST_AIRFLOW_LOOKUP", "1") == "1":
        return airflow_lookup(conn_id)
    return None


__all__ = ["airflow_connection", "airflow_lookup", "env_var", "lookup", "parse"]
