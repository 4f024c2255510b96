"""The slurmrestd connection: HTTPS unless the connection says plain HTTP in so many words."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_cost.core.errors import SourceError
from gpu_cost.perceive import slurmrestd

TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJncHVjb3N0In0.c2ln"


def configure(monkeypatch: pytest.MonkeyPatch, **fields: Any) -> slurmrestd.RestConfig:
    conn = {"conn_type": "http", "host": "slurmrestd.example", "login": "gpucost", "password": TOKEN, **fields}
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLURMRESTD", json.dumps(conn))
    return slurmrestd.rest_config()


def test_a_connection_without_a_scheme_is_https(monkeypatch: pytest.MonkeyPatch) -> None:
    assert configure(monkeypatch).url == "https://slurmrestd.example:6820"
    # conn_type "http" is Airflow's type of every HTTP connection, not a request for plain HTTP
    assert configure(monkeypatch, port=443, extra={"api_version": "v0.0.42"}).url == "https://slurmrestd.example:443"


def test_a_uri_connection_without_a_scheme_is_https(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLURMRESTD", f"http://gpucost:{TOKEN}@slurmrestd.example:6820")
    assert slurmrestd.rest_config().url == "https://slurmrestd.example:6820"


@pytest.mark.parametrize("fields", [
    {"extra": {"scheme": "http"}},
    {"schema": "http"},
    {"host": "http://slurmrestd.example"},
    {"extra": {"scheme": "HTTP"}, "schema": "http"},
], ids=["extra.scheme", "schema", "host-url", "both-agree"])
def test_plain_http_only_when_the_connection_says_so(monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any]) -> None:
    assert configure(monkeypatch, **fields).url == "http://slurmrestd.example:6820"


@pytest.mark.parametrize(("fields", "why"), [
    ({"extra": {"scheme": "ftp"}}, r"scheme must be http or https, not 'ftp' \(extra\.scheme\)"),
    ({"extra": {"scheme": "http"}, "schema": "https"}, r"extra\.scheme says 'http', schema says 'https'"),
    ({"host": "https://slurmrestd.example", "extra": {"scheme": "http"}}, r"host says 'https', extra\.scheme says"),
], ids=["unknown", "extra-vs-schema", "host-vs-extra"])
def test_a_scheme_that_is_unknown_or_contradicted_is_refused(monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any],
                                                             why: str) -> None:
    with pytest.raises(SourceError, match=f"connection gpu_cost_slurmrestd: {why}"):
        configure(monkeypatch, **fields)
