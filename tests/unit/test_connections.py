"""Airflow connections from the environment, in the one shape every reader gets."""

from __future__ import annotations

import json

import pytest

from gpu_cost.core import connections
from gpu_cost.core.errors import AuditError, SourceError


def test_json_and_uri_forms_give_the_same_dict() -> None:
    as_json = connections.parse(json.dumps({"conn_type": "http", "host": "prom.example", "port": 9090,
                                            "login": "u", "password": "p@ss", "extra": '{"timeout": 5}'}), "x")
    extra = json.dumps({"timeout": 5})
    as_uri = connections.parse(f"http://u:p%40ss@prom.example:9090/?__extra__={extra}", "x")
    for key in ("conn_type", "host", "port", "login", "password", "extra"):
        assert as_json[key] == as_uri[key], key
    assert as_uri["extra"] == {"timeout": 5}
    assert connections.parse("http://h:1/?selector=job%3D%22dcgm%22", "x")["extra"] == {"selector": 'job="dcgm"'}


@pytest.mark.parametrize(("raw", "host"), [("sqlite:////var/lib/a.db", "/var/lib/a.db"), ("sqlite:///rel.db", "rel.db"),
                                           ("sqlite://%2Ftmp%2Fb.db", "/tmp/b.db")])
def test_sqlite_uris(raw: str, host: str) -> None:
    assert connections.parse(raw, "gpu_cost_db") == {"conn_type": "sqlite", "host": host, "extra": {}}


def test_postgresql_scheme_is_the_postgres_type() -> None:
    c = connections.parse("postgresql://agent:pw@db:5432/gpu_cost", "gpu_cost_db")
    assert (c["conn_type"], c["host"], c["port"], c["schema"]) == ("postgres", "db", 5432, "gpu_cost")


@pytest.mark.parametrize(("raw", "why"), [("{not json", "not valid JSON"),
                                          ('{"host": "h", "extra": "{bad"}', "extra is not valid JSON"),
                                          ('{"host": "h", "extra": [1]}', "extra must be a JSON object")])
def test_bad_values_name_the_variable_in_the_callers_error(raw: str, why: str) -> None:
    with pytest.raises(SourceError, match=f"AIRFLOW_CONN_GPU_COST_PROMETHEUS: {why}"):
        connections.parse(raw, "gpu_cost_prometheus", SourceError)
    with pytest.raises(AuditError, match=why):
        connections.parse(raw, "gpu_cost_db", AuditError)


def test_lookup_reads_the_environment_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_TEST_X", '{"conn_type": "http", "host": "h"}')
    assert connections.lookup("gpu_cost_test_x")["host"] == "h"  # type: ignore[index]
    monkeypatch.delenv("AIRFLOW_CONN_GPU_COST_TEST_X")
    monkeypatch.setenv("GPU_COST_AIRFLOW_LOOKUP", "0")
    assert connections.lookup("gpu_cost_test_x") is None
