"""Secrets never leave their connection: one redaction, applied wherever text leaves the agent."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpu_cost.core.errors import SourceError
from gpu_cost.core.redact import redact
from gpu_cost.perceive import prometheus as prom

SECRET = "s3cr3tPw"
URL = f"http://agent:{SECRET}@prom.example:9090"

FORMS = [
    ("userinfo", f"Prometheus at {URL} down", "Prometheus at http://agent:***@prom.example:9090 down"),
    ("userinfo-at-in-password", "https://u:p@ss@w0rd@host/x", "https://u:***@host/x"),
    ("userinfo-quoted", "postgresql+psycopg2://agent:pw%40x@db:5432/gpu", "postgresql+psycopg2://agent:***@db:5432/gpu"),
    ("userinfo-no-user", "redis://:pw@cache:6379", "redis://:***@cache:6379"),
    ("query-password", "https://h/api?password=hunter2&x=1", "https://h/api?password=***&x=1"),
    ("query-token", "http://h:9090/api/v1/query?query=up&token=abc123", "http://h:9090/api/v1/query?query=up&token=***"),
    ("query-apikey", "https://h/?apikey=K1&api_key=K2&access_token=K3", "https://h/?apikey=***&api_key=***&access_token=***"),
    ("slack-webhook", "POST https://hooks.slack.com/services/T0/B0/XyZ failed",
     "POST https://hooks.slack.com/services/*** failed"),
    ("slack-token", "token xoxb-1234-abcd rejected", "token xox*-*** rejected"),
    ("bearer", "Authorization: Bearer eyJhbGciOi.x-y", "Authorization: Bearer ***"),
]
KEPT = [
    ("no-password", "http://agent@prom.example:9090/"),
    ("port-only", "http://prom.example:9090/api/v1/query?query=up"),
    ("sqlite", "sqlite:////var/lib/gpu_cost/audit.db"),
    ("harmless-words", "design=3 author=ann Bearer authentication failed"),
]


@pytest.mark.parametrize(("text", "expected"), [(t, e) for _, t, e in FORMS], ids=[i for i, _, _ in FORMS])
def test_every_credential_form_is_redacted(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert redact(expected) == expected


@pytest.mark.parametrize("text", [t for _, t in KEPT], ids=[i for i, _ in KEPT])
def test_text_without_credentials_is_kept(text: str) -> None:
    assert redact(text) == text


def test_the_audit_connection_uses_the_same_redaction() -> None:
    from gpu_cost.audit import connection

    assert connection.redact is redact
    assert connection.redact("postgresql+psycopg2://a:b%2Fc@h/db") == "postgresql+psycopg2://a:***@h/db"


class _Failing:
    """A Prometheus client whose every query fails with ``exc`` (or answers these bytes)."""

    def __init__(self, exc: Exception | bytes) -> None:
        self.exc = exc

    def post(self, *args: Any, **kwargs: Any) -> Any:
        if isinstance(self.exc, bytes):
            return self.exc
        raise self.exc

    ask = post  # the small queries (PrometheusConnect's) fail the same way


@pytest.mark.parametrize("make", [
    lambda: __import__("requests").exceptions.ConnectionError(f"cannot connect to {URL}/api/v1/query"),
    lambda: __import__("requests").exceptions.Timeout("read timed out"),
    lambda: prom.PromHttpError(f"HTTP 400 from {URL}"),
    lambda: f"<html>proxy error at {URL}</html>".encode(),
    lambda: f'{{"status": "success", "data": {{"result": "{URL}"}}}}'.encode(),
], ids=["unreachable", "timeout", "refused", "bad-json", "no-vector"])
def test_prometheus_errors_name_the_server_without_its_password(make: Any) -> None:
    source = prom.PrometheusSource(prom.PromConfig(url=URL, auth=("agent", SECRET)), client=_Failing(make()))
    with pytest.raises(SourceError, match=r"Prometheus at http://agent:\*\*\*@prom\.example:9090") as exc:
        source.query("up", 0.0, "current")
    assert SECRET not in str(exc.value)
    assert SECRET not in repr(source.config)


def test_live_snapshot_problems_and_freshness_are_redacted(policy: Any, caplog: pytest.LogCaptureFixture) -> None:
    from gpu_cost.perceive import live

    class Slurm:
        def jobs(self) -> list[Any]:
            return []

        def nodes(self) -> list[Any]:
            return []

        def reservations(self) -> list[Any]:
            return []

    def source() -> prom.PrometheusSource:
        from requests.exceptions import ConnectionError as Refused

        return prom.PrometheusSource(prom.PromConfig(url=URL), client=_Failing(Refused("refused")))

    with caplog.at_level(logging.INFO, logger="gpu_cost"):
        snap = live.snapshot(policy, 1e9, prometheus=source(), slurm=Slurm(), processes=False)
        fresh, why = live.check_fresh(policy, 1e9, prometheus=source())
    assert snap.problems and snap.problems[0].startswith("prometheus: Prometheus at http://agent:***@")
    assert not fresh and "agent:***@" in why
    assert SECRET not in " ".join(snap.problems) + why + caplog.text


def test_snapshot_problems_are_redacted(policy: Any) -> None:
    from gpu_cost.perceive.snapshot import from_samples

    samples = pd.DataFrame({"ts": [1e9], "host": ["g1"], "gpu": [0], "util": [0.0], "mem_used_mib": [0.0]})
    snap = from_samples(policy=policy, now=1e9, source="trace", samples=samples, jobs=[],
                        problems=[f"trace: {URL}/samples.csv unreadable"])
    assert snap.problems[0] == "trace: http://agent:***@prom.example:9090/samples.csv unreadable"


def test_health_alert_is_redacted(store: Any, policy: Any, monkeypatch: pytest.MonkeyPatch,
                                  caplog: pytest.LogCaptureFixture, slack_sink: Any) -> None:
    import dataclasses
    import json

    from gpu_cost.loop import health

    # the ops channel is a local Slack webhook sink: the alert goes through the one act path
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLACK",
                       json.dumps({"conn_type": "slackwebhook", "password": slack_sink.webhook_url()}))
    policy = dataclasses.replace(policy, notifications=dataclasses.replace(policy.notifications, slack_channel="#ops"))
    store.begin_run("r1", dag_id="gpu_zombie_sweep", started_at=1.0, data_ts=1.0, source="prometheus", mode="dry-run")
    with caplog.at_level(logging.INFO, logger="gpu_cost"):
        out = health.degraded_alert(store, policy, run_id="r1", dag_id="gpu_zombie_sweep", status="degraded",
                                    problems=[f"prometheus: Prometheus at {URL} cannot be reached"], now=1.0)
    sent = slack_sink.texts()
    assert out is not None and out["sent"] and sent
    rows = store.query("SELECT reason, evidence FROM gpu_cost_decisions")
    (action,) = store.query("SELECT action, status, output FROM gpu_cost_actions")
    assert (action["action"], action["status"]) == ("alert_ops", "succeeded")
    assert SECRET not in str(action)
    assert "agent:***@" in sent[0] and "agent:***@" in rows[0]["reason"]
    assert SECRET not in sent[0] + str(rows) + caplog.text


def test_log_records_of_every_package_logger_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("gpu_cost.perceive.prometheus")
    with caplog.at_level(logging.INFO, logger="gpu_cost"):
        log.warning("Prometheus at %s down", URL)
        try:
            raise SourceError(f"cannot reach {URL}")
        except SourceError:
            log.exception("query failed")
        logging.getLogger("gpu_cost").info("webhook %s", "https://hooks.slack.com/services/T0/B0/XyZ")
    text = caplog.text
    assert "agent:***@prom.example" in text and "services/***" in text
    assert SECRET not in text and "XyZ" not in text
    assert all(SECRET not in r.getMessage() for r in caplog.records)


def test_notify_scrub_uses_the_same_redaction() -> None:
    from gpu_cost.core.redact import scrub

    assert scrub(f"ConnectionError: {URL} and tok-abcdef", ["tok-abcdef"]) == \
        "ConnectionError: http://agent:***@prom.example:9090 and ***"


def test_report_delivery_errors_are_redacted(tmp_path: Path, policy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from gpu_cost.core.errors import GpuCostError
    from gpu_cost.report import delivery

    hook = "https://hooks.slack.com/services/T0/B0/XyZsecret"
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLACK", json.dumps({"conn_type": "slackwebhook", "password": hook}))
    (tmp_path / "kpis.json").write_text("{}")
    monkeypatch.setattr(delivery, "slack_text", lambda kpis, link: f"report at {link}")

    result = {"report": f"s3://key:{SECRET}@bucket/r.html", "folder": str(tmp_path)}
    posted: list[str] = []

    def post(conn: Any, conn_id: str, ctype: str, text: str, *args: Any) -> dict[str, Any]:
        posted.append(text)
        return {"posted": True}

    monkeypatch.setattr(delivery, "_post", post)
    assert delivery.post_report(result, policy, "gpu_cost_slack") == {"posted": True}
    assert posted == ["report at s3://key:***@bucket/r.html"]

    def fail(*args: Any) -> Any:
        raise RuntimeError(f"POST {hook} failed")

    monkeypatch.setattr(delivery, "_post", fail)
    with pytest.raises(GpuCostError, match=r"services/\*\*\*") as exc:
        delivery.post_report(result, policy, "gpu_cost_slack")
    assert "XyZsecret" not in str(exc.value)
