"""The weekly report DAG runs through Airflow (``dag.test()``): KPIs → charts → files → Slack.

Slack is a local HTTP sink standing in for the Incoming Webhook endpoint (connection
``gpu_cost_slack`` of type ``slackwebhook``), so the provider's real client posts to it.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.core.timeutil import iso
from tests.fixtures.core import NOW, free_port

pytestmark = pytest.mark.e2e


@pytest.fixture
def slack_sink():  # type: ignore[no-untyped-def]
    received: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            received.append({"path": self.path, "body": json.loads(body or b"{}")})
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
            pass

    port = free_port()
    server = HTTPServer(("127.0.0.1", port), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    os.environ["AIRFLOW_CONN_GPU_COST_SLACK"] = json.dumps(
        {"conn_type": "slackwebhook", "password": f"http://127.0.0.1:{port}/services/T0/B0/X"})
    yield received
    os.environ.pop("AIRFLOW_CONN_GPU_COST_SLACK", None)
    server.shutdown()


def test_report_dag_writes_the_report_and_posts_to_slack(airflow_db, dagbag, slack_sink, tmp_path,  # type: ignore[no-untyped-def]
                                                         monkeypatch) -> None:
    from gpu_cost.config.loader import load_policy
    from gpu_cost.sim.week import seed_week

    store = AuditStore().ensure_schema()   # the session's audit store, as the DAG sees it
    since, until = NOW - 2 * 86400, NOW
    seed_week(store, load_policy(None), until, nodes=2)
    dag = dagbag.dags["gpu_weekly_cost_report"]
    monkeypatch.setenv("GPU_COST_REPORT_DIR", str(tmp_path))  # the report root; out_dir names a folder in it
    out_dir = tmp_path / "reports"
    dr = dag.test(run_conf={"since": iso(since), "until": iso(until), "out_dir": "reports"})
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert dr.state == "success", states
    index = next(out_dir.glob("*/index.html"))
    assert index.stat().st_size > 50_000 and index.read_text().count("data:image/png;base64,") == 4
    assert (index.parent / "summary.md").exists() and len(list((index.parent / "charts").glob("*.png"))) == 4
    kpis = json.loads((index.parent / "kpis.json").read_text())
    assert kpis["period"]["since"] == iso(since) and kpis["cluster"]["sweeps"] == 48
    assert len(slack_sink) == 1
    text = slack_sink[0]["body"]["text"]
    assert text.startswith("*GPU cost report") and str(index) in text
    files_ti = next(ti for ti in dr.get_task_instances() if ti.task_id == "files")
    assert files_ti.state == "success"


def test_slack_delivery_skips_cleanly_without_a_connection(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.config.loader import load_policy
    from gpu_cost.report.delivery import post_report

    os.environ.pop("AIRFLOW_CONN_GPU_COST_SLACK", None)
    with caplog.at_level("INFO"):
        out = post_report({"report": str(tmp_path / "index.html"), "folder": str(tmp_path)}, load_policy(None),
                          "gpu_cost_slack")
    assert out == {"posted": False, "why": "connection gpu_cost_slack not configured"}
    assert "not configured" in caplog.text
    assert not Path(tmp_path / "kpis.json").exists()
