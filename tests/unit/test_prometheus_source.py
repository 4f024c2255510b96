"""Prometheus source: connection parsing, PromQL shape, the exporter's exposition format."""

from __future__ import annotations

import json
import re

import pytest

from gpu_cost.core.errors import SourceError
from gpu_cost.core.model import Job
from gpu_cost.perceive import prometheus as prom
from gpu_cost.sim.exporter import ScenarioFeed, behaviour_of, exposition
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
               prom.lookback_query(sel, 21600, 60, 20), prom.chart_query(sel, 21600, 60)]
    for q in queries:
        names = re.findall(r"\b(DCGM_FI_\w+|nvidia_smi_\w+)\b(\{[^}]*\})?", q)
        # device-level utilisation is read only off MIG slices (GPU_I_ID unset): never a slice's
        assert names and all(m == (f'{{GPU_I_ID="",{sel}}}' if n == "DCGM_FI_DEV_GPU_UTIL" else f"{{{sel}}}")
                             for n, m in names), q
        assert q.count("(") == q.count(")")
    w = prom.windows_query(sel, [900], 900, 60)
    assert "[870000ms:60000ms]" in w  # steps t in (now-15m, now]: 15 samples, as the simulator
    lb = prom.lookback_query(sel, 21600, 60, 20)
    assert "[21570000ms:60000ms]" in lb and "[21510000ms:60000ms]" in lb and "offset 60000ms" in lb


def test_the_memory_trend_is_read_on_the_lookback_grid_in_the_same_query() -> None:
    lb = prom.lookback_query('cluster="a"', 21600, 60, 20)
    mem = prom.Dialects('cluster="a"').mem_used()
    grid = "[21570000ms:60000ms]"
    for part, stat in ((f"deriv(({mem}){grid}) * 3600", "mem_slope_lb"), (f"stdvar_over_time(({mem}){grid})", "mem_var_lb"),
                       (f"stdvar_over_time((timestamp({mem})){grid})", "mem_tvar_lb"),
                       (f"count_over_time(({mem}){grid})", "mem_n_lb"), (f"min_over_time((timestamp({mem})){grid})", "mem_t0_lb"),
                       (f"max_over_time((timestamp({mem})){grid})", "mem_t1_lb")):
        assert f'label_replace({part}, "stat", "{stat}", "", "")' in lb, stat


def test_the_memory_trend_from_promql_parts_equals_the_dense_one() -> None:
    """What deriv, stdvar_over_time, count_over_time and min/max of timestamp() return on the sample
    grid, put together by the source, equals aggregate.mem_trend_stats on the same samples."""
    import numpy as np

    from gpu_cost.perceive.aggregate import mem_trend_stats

    times = np.arange(NOW - 21600 + 60, NOW + 1, 60.0)
    hours = (times - times[0]) / 3600
    rng = np.random.default_rng(4)
    mem = rng.normal(30000, 800, (12, len(times))) + rng.uniform(-3000, 3000, (12, 1)) * hours
    mem[rng.random(mem.shape) < 0.2] = np.nan
    mem[0] = 20000 + 2048 * hours  # a clean leak
    mem[1] = 12288.0  # constant: deriv 0, stdvar 0
    mem[2, :-2] = np.nan  # two samples
    mem[3, :-1] = np.nan  # one sample
    mem[4] = np.nan  # no series at all: Prometheus answers nothing for it
    parts = {k: np.full(len(mem), np.nan) for k in ("slope", "var", "tvar", "n", "t0", "t1")}
    for i, row in enumerate(mem):
        ok = ~np.isnan(row)
        if not ok.any():
            continue
        x, y = times[ok], row[ok]
        parts["n"][i], parts["t0"][i], parts["t1"][i] = ok.sum(), x.min(), x.max()
        parts["var"][i], parts["tvar"][i] = y.var(), x.var()  # population variances, as stdvar_over_time
        if ok.sum() >= 2:  # deriv: the least-squares slope per second (0 for a constant)
            parts["slope"][i] = 0.0 if np.ptp(y) == 0 else np.polyfit(x - x.mean(), y, 1)[0] * 3600
    got = prom.mem_trend(parts["slope"], parts["var"], parts["tvar"], parts["n"], parts["t0"], parts["t1"])
    want = mem_trend_stats(times, mem, NOW, 21600)
    for col, values in want.items():
        np.testing.assert_allclose(got[col], values, rtol=1e-9, equal_nan=True, err_msg=col)
    assert want["mem_r2_lb"][0] == pytest.approx(1.0) and np.isnan(want["mem_r2_lb"][1:5]).all()


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


def test_the_notice_chart_is_twelve_maxima_of_the_lookback_in_a_query_of_its_own() -> None:
    lb = prom.chart_query('cluster="a"', 21600, 60)
    assert '"chart_' not in prom.lookback_query('cluster="a"', 21600, 60, 20)
    util = prom.Dialects('cluster="a"').util()
    for k in range(12):
        off = (11 - k) * 1800
        shift = f" offset {off * 1000}ms" if off else ""
        part = f"max_over_time(({util})[1770000ms:60000ms]{shift})"
        assert f'label_replace({part}, "stat", "chart_{k}", "", "")' in lb, k
