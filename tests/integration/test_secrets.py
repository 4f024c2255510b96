"""Secrets live only in Airflow connections: never in a log line, never in an audit table.

Three connections carry recognisable secrets: the Slack webhook (its token path), the SMTP relay
(a password) and the audit store on the real PostgreSQL (the agent role's password). A sweep in
``notify`` mode runs on the simulated cluster, sends its notices to the local Slack sink, records
everything in PostgreSQL, and raises the degraded-run ops alert once; every log record of the
process (DEBUG and up, every logger) and every row of every ``gpu_cost_*`` table is then searched
for the secrets.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import pytest

from tests.fixtures.core import ROOT
from tests.fixtures.postgres import _as_postgres

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:8]
SLACK_TOKEN = f"SlackTok{TAG}XyZ"
SMTP_PASSWORD = f"SmtpPw{TAG}Qq"
PG_PASSWORD = f"PgPw{TAG}Zz"
SECRETS = (SLACK_TOKEN, SMTP_PASSWORD, PG_PASSWORD)


@pytest.fixture
def secret_connections(postgres_server, slack_sink, smtp_sink, monkeypatch):  # type: ignore[no-untyped-def]
    port = postgres_server["port"]
    role, db = f"agent_{TAG}", f"secrets_{TAG}"
    for sql in (f"CREATE ROLE {role} LOGIN PASSWORD '{PG_PASSWORD}'", f"CREATE DATABASE {db} OWNER {role}"):
        _as_postgres(["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-c", sql])
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB", json.dumps({
        "conn_type": "postgres", "host": "127.0.0.1", "port": port, "login": role, "password": PG_PASSWORD,
        "schema": db}))
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLACK", json.dumps({
        "conn_type": "slackwebhook", "password": slack_sink.webhook_url(f"/services/T0SECRET/B0SECRET/{SLACK_TOKEN}")}))
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SMTP", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": smtp_sink.port, "login": "mailer", "password": SMTP_PASSWORD,
        "extra": {"disable_ssl": True, "disable_tls": True, "from_email": "gpu-cost@example.org", "timeout": 5,
                  "retry_limit": 0}}))
    return slack_sink


def _rows_text(store: Any) -> str:
    tables = [r["table_name"] for r in store.query(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
        "AND table_name LIKE 'gpu_cost_%'")]
    assert {"gpu_cost_runs", "gpu_cost_decisions", "gpu_cost_actions"} <= set(tables)
    return "\n".join(json.dumps(store.query(f"SELECT * FROM {t}"), default=str) for t in sorted(tables))


def test_secrets_never_reach_logs_or_audit_tables(secret_connections, caplog) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from gpu_cost.act import dispatch
    from gpu_cost.airflow.sweep_tasks import action_context
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.config.loader import load_policy
    from gpu_cost.core.model import as_decisions
    from gpu_cost.loop import health
    from gpu_cost.loop.sweep import run_once
    from gpu_cost.sim.cluster import load_scenario
    from tests.fixtures.core import NOW

    sink = secret_connections
    base = load_policy(ROOT / "include" / "policy" / "default.yaml")
    policy = dataclasses.replace(base, mode="notify",
                                 notifications=dataclasses.replace(base.notifications, slack_channel="#gpu-ops"))
    with caplog.at_level(logging.DEBUG):
        store = AuditStore().ensure_schema()
        assert store.dialect == "postgresql" and PG_PASSWORD in store.url
        out = run_once(policy, NOW, store, run_id=f"secrets-{TAG}", source="sim",
                       scenario=load_scenario(ROOT / "include" / "scenarios" / "default.yaml"))
        acting = [d for d in out["decisions"] if d["mode"] != "dry-run" and d["action"] != "none"]
        assert acting, "notify mode on the default scenario must have notices to send"
        decisions = [d for d in as_decisions(_decision_dicts(store, out["run_id"])) if d.acts]
        results = dispatch.execute(decisions, action_context(policy, NOW, out["run_id"], store=store), store)
        assert any(r["status"] == "succeeded" for r in results), results
        # a degraded run, so the ops alert goes out too (its text quotes the problems)
        health.degraded_alert(store, policy, run_id=out["run_id"], dag_id="gpu-cost-cli", status="degraded",
                              problems=[f"prometheus: cannot reach {store!r}"], now=NOW)
    assert sink.requests, "the notices reached the Slack sink"
    logs = caplog.text + "\n".join(str(r.__dict__) for r in caplog.records)
    tables = _rows_text(store)
    sent = json.dumps([r.body for r in sink.requests])
    for secret in SECRETS:
        assert secret not in logs, f"{secret} in the logs"
        assert secret not in tables, f"{secret} in an audit table"
        assert secret not in sent, f"{secret} in a message"
    assert "T0SECRET" in str(sink.requests[0].path)  # the secret was really in use


def _decision_dicts(store: Any, run_id: str) -> list[dict[str, Any]]:
    """The run's decisions as Decision fields (from the audit rows)."""
    out = []
    for r in store.decisions_of_run(run_id):
        out.append({"decision_id": r["decision_id"], "ts": float(r["ts"]), "rule": r["rule"],
                    "target_kind": r["target_kind"], "target": r["target"], "action": r["action"], "mode": r["mode"],
                    "rung": int(r["rung"]), "episode": int(r["episode"]), "job_id": r["job_id"], "user": r["user_name"],
                    "account": r["account"], "partition": r["partition_name"], "host": r["host"],
                    "gpus": int(r["gpus"]), "reason": r["reason"] or "", "protection": r["protection"],
                    "requires_approval": bool(r["requires_approval"]),
                    "gpu_hours_at_risk": float(r["gpu_hours_at_risk"]), "gpu_hours_saved": float(r["gpu_hours_saved"]),
                    "evidence": json.loads(r["evidence"] or "{}")})
    return out
