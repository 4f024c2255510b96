"""``gpu-cost audit`` on the real PostgreSQL (times are TIMESTAMPTZ there): the same trail as on SQLite."""

from __future__ import annotations

import json

import pytest
from sqlalchemy.engine import make_url

from gpu_cost.cli import main as cli
from gpu_cost.core.timeutil import iso
from tests.fixtures.core import NOW
from tests.unit.policy.helpers import H
from tests.unit.test_audit_trail import fill

pytestmark = pytest.mark.integration


def test_the_trail_reads_back_from_postgres(pg_store, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    asked = fill(pg_store, monkeypatch)["asked"]
    url = make_url(pg_store.url)
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_DB", json.dumps({
        "conn_type": "postgres", "host": url.host, "port": url.port, "login": url.username, "schema": url.database}))
    assert cli.main(["audit", "--job", "42", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [(d["action"], d["ts"]) for d in got["decisions"]] == [("notify", iso(NOW)), ("terminate", iso(NOW + H))]
    last = got["decisions"][-1]
    assert last["decision_id"] == asked.decision_id
    assert last["approval"] == {"status": "rejected", "by": "dana", "at": iso(NOW + H + 600)}
    assert got["decisions"][0]["actions"][0]["status"] == "succeeded"
    assert cli.main(["audit", "--job", "41", "--since", iso(NOW + 1), "--json"]) == 0
    (only,) = json.loads(capsys.readouterr().out)["decisions"]
    assert only["action"] == "terminate" and only["savings"][0]["gpu_hours"] > 0
