"""Prometheus source: connection parsing, PromQL shape, the exporter's exposition format."""

from __future__ import annotations

import json
import re

import pytest

from gpu_cost.errors import SourceError
from gpu_cost.model import Job
from gpu_cost.sources import prometheus as prom
from gpu_cost.sources.exporter import ScenarioFeed, behaviour_of, exposition
from tests.fixtures.core import NOW


@pytest.mark.parametrize(
    ("value", "url", "selector"),
    [("http://prom.example:9090", "http://prom.example:9090", ""),
     ("https://u:p%40ss@prom.example:443/?selector=job%3D%22dcgm%22", "https://prom.example:443", 'job="dcgm"'),
     (json.dumps({"conn_type": "http", "host": "10.0.0.5", "port": 9090, "extra": {"selector": '{cluster="a"}'}}),
      "http://10.0.0.5:9090", 'cluster="a"'),
     (json.dumps({"conn_type": "http", "host": "https://prom.example/", "extra": "{\"timeout\": 3}"}), "https://prom.example", "")],
    ids=["uri", "uri-auth-extra", "json", "json-url-host"],
)
def test_connection_forms(monkeypatch: pytest.MonkeyPatch, value: str, url: str, selector: str) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_PROMETHEUS", value)
    cfg = prom.prometheus_config()
    assert (cfg.url, cfg.selector) == (url, selector)


def test_connection_missing_or_bad(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_GPU_COST_PROMETHEUS", raising=False)
    monkeypatch.delenv("GPU_COST_PROMETHEUS_URL", raising=False)
    monkeypatch.setenv("GPU_COST_AIRFLOW_LOOKUP", "0")
    with pytest.raises(SourceError, match="no Prometheus configured"):
        prom.prometheus_config()
    assert not prom.configured()
    monkeypatch.setenv("GPU_COST_PROMETHEUS_URL", "http://p:9090/")
    assert prom.prometheus_config().url == "http://p:9090"
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_PROMETHEUS", "{not json")
    with pytest.raises(SourceError, match="AIRFLOW_CONN_GPU_COST_PROMETHEUS: not valid JSON"):
        prom.prometheus_config()


def test_queries_select_every_metric_and_match_the_aggregation_grid() -> None:
    sel = 'cluster="a"'
    queries = [prom.current_query(sel), prom.windows_query(sel, [900, 3600], 900, 60),
               prom.lookback_query(sel, 21600, 60, 20)]
    for q in queries:
        names = re.findall(r"\b(DCGM_FI_\w+|nvidia_smi_\w+)\b(\{[^}]*\})?", q)
        assert names and all(m == f"{{{sel}}}" for _, m in names), q
        assert q.count("(") == q.count(")")
    w = prom.windows_query(sel, [900], 900, 60)
    assert "[870000ms:60000ms]" in w  # steps t in (now-15m, now]: 15 samples, as the simulator
    lb = prom.lookback_query(sel, 21600, 60, 20)
    assert "[21570000ms:60000ms]" in lb and "[21510000ms:60000ms]" in lb and "offset 60000ms" in lb


@pytest.mark.parametrize(("name", "short"), [("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA H100 80GB HBM3", "h100"),
                                             ("Tesla T4", "t4"), ("NVIDIA GeForce RTX 4090", "rtx4090"), ("", "")])
def test_short_model(name: str, short: str) -> None:
    assert prom.short_model(name) == short


def test_exposition_is_dcgm_exporters(scenario) -> None:  # type: ignore[no-untyped-def]
    text = exposition(ScenarioFeed(scenario, started=NOW), NOW)
    assert "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge" in text
    assert "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active." in text
    lines = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_FB_USED{")]
    assert len(lines) == scenario.gpu_count
    labels = dict(re.findall(r'(\w+)="([^"]*)"', lines[0]))
    assert set(labels) >= {"gpu", "UUID", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}
    assert labels["modelName"] == "NVIDIA A100-SXM4-80GB" and labels["device"] == f"nvidia{labels['gpu']}"
    busy = [line for line in text.splitlines() if 'hpc_job="1001"' in line and line.startswith("DCGM_FI_PROF_GR_ENGINE_ACTIVE")]
    assert len(busy) == 4 and all(0.8 < float(line.rsplit(" ", 1)[1]) <= 1.0 for line in busy)


@pytest.mark.parametrize(
    ("name", "comment", "expected"),
    [("x", "gpu-cost-sim:zombie", ("zombie", {})), ("serve-inference", "", ("inference", {})),
     ("x", "gpu-cost:no-interrupt gpu-cost-sim:inference:burst_every=40s:burst_length=10s",
      ("inference", {"burst_every": 40.0, "burst_length": 10.0})), ("plain", "", ("training", {}))],
    ids=["comment", "name", "params", "default"],
)
def test_behaviour_of_a_real_job(name: str, comment: str, expected: tuple[str, dict[str, float]]) -> None:
    assert behaviour_of(Job(job_id="1", user="u", name=name, comment=comment)) == expected
