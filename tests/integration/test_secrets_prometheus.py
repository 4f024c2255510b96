"""A Prometheus URL with ``user:password@`` in it: the password reaches no error, row, XCom, log or alert.

The connection ``gpu_cost_prometheus`` names the server as ``http://agent:<secret>@127.0.0.1:<port>``.
Two faults: nothing listens on the port (Prometheus down), and the real Prometheus of ``prom_lab``
refuses the query (a selector that is not valid PromQL: HTTP 400). Each time a sweep runs in-process
(``run_once``: its summary is what the DAG returns to XCom), records a degraded run and raises the
ops alert through the Slack sink; the secret must appear in none of them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from typing import Any

import pytest

from tests.fixtures.core import free_port

pytestmark = pytest.mark.integration

SECRET = f"PromPw{uuid.uuid4().hex[:8]}"


class NoSlurm:
    """Slurm answers with an empty cluster (this test is about the Prometheus URL, not Slurm)."""

    def jobs(self) -> list[Any]:
        return []

    def nodes(self) -> list[Any]:
        return []

    def reservations(self) -> list[Any]:
        return []


@pytest.mark.parametrize("fault", ["down", "error"])
def test_prometheus_password_never_leaves_its_connection(fault: str, prom_lab, store, policy, slack_sink,  # type: ignore[no-untyped-def]
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    from gpu_cost.core.errors import SourceError
    from gpu_cost.loop.sweep import run_once
    from gpu_cost.perceive.prometheus import PrometheusSource

    port = free_port() if fault == "down" else prom_lab.port
    selector = 'job=~"(' if fault == "error" else ""  # an unclosed regex group: Prometheus answers 400
    monkeypatch.setenv("GPU_COST_AIRFLOW_LOOKUP", "0")
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_PROMETHEUS", json.dumps({
        "conn_type": "http", "host": f"http://agent:{SECRET}@127.0.0.1:{port}",
        "extra": {"selector": selector, "timeout": 5}}))
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLACK", json.dumps({
        "conn_type": "slackwebhook", "password": slack_sink.webhook_url()}))
    policy = dataclasses.replace(policy, notifications=dataclasses.replace(policy.notifications, slack_channel="#ops"))
    now = time.time()
    run_id = f"secret-{fault}-{uuid.uuid4().hex[:6]}"

    with caplog.at_level(logging.DEBUG):
        with pytest.raises(SourceError) as raised:
            PrometheusSource().newest_sample_ts(now)
        out = run_once(policy, now, store, run_id=run_id, source="prometheus", dag_id="gpu_zombie_sweep",
                       slurm=NoSlurm(), processes=False)

    error = str(raised.value)
    expected = "cannot be reached" if fault == "down" else "refused the freshness query"
    assert f"Prometheus at http://agent:***@127.0.0.1:{port}" in error and expected in error, error
    assert out["degraded"] and any("agent:***@" in p for p in out["problems"]), out["problems"]
    row = store.get_run(run_id)
    assert row["status"] == "degraded"
    alerts = slack_sink.texts()
    assert len(alerts) == 1 and "agent:***@" in alerts[0], alerts
    decisions = json.dumps(store.query("SELECT * FROM gpu_cost_decisions"), default=str)
    logs = caplog.text + "\n".join(str(r.__dict__) for r in caplog.records)
    for where, text in [("the raised error", error), ("the run's problems", str(row["problems"])),
                        ("the returned summary", json.dumps(out, default=str)), ("the logs", logs),
                        ("the health alert", alerts[0]), ("the alert's decision", decisions)]:
        assert SECRET not in text, f"the password is in {where}"
