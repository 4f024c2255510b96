"""Recording rules for the sweep: the rule file, the queries that read it, and when the source uses them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from gpu_cost.perceive import recording
from gpu_cost.perceive.prometheus import Sample
from gpu_cost.perceive.promql import Dialects

AT = 1_795_960_800.0


def _rows(info: dict[str, str], evaluated: float, since: dict[str, str] | None) -> list[Sample]:
    rows = [Sample(metric={**info, "stat": "rules"}, value=(AT + 59, str(evaluated)))]
    if since is not None:
        rows.append(Sample(metric={"__name__": recording.INFO, **since, "stat": "rules_since"}, value=(AT + 59, "1")))
    return rows


DEFAULT = {"step": "60", "busy_util": "20", "chunk": "1800"}


@pytest.mark.parametrize(
    ("info", "evaluated", "since", "lookback", "selector", "expect"),
    [(DEFAULT, AT + 12.5, DEFAULT, 21600.0, "", ("chunks", AT + 12.5)),
     (DEFAULT, AT + 12.5, DEFAULT, 10800.0, "", ("samples", AT + 12.5)),  # 15-min chart buckets: not whole chunks
     (DEFAULT, AT + 12.5, DEFAULT, 43200.0, "", ("chunks", AT + 12.5)),  # 1-h buckets: two chunks each
     (DEFAULT, AT + 12.5, None, 21600.0, "", None),  # the rules are younger than the lookback
     (DEFAULT, AT - 47.5, DEFAULT, 21600.0, "", None),  # their last evaluation is before the grid step: lagging
     ({**DEFAULT, "busy_util": "30"}, AT + 1, {**DEFAULT, "busy_util": "30"}, 21600.0, "", None),
     ({**DEFAULT, "step": "30"}, AT + 1, {**DEFAULT, "step": "30"}, 21600.0, "", None),
     (DEFAULT, AT + 1, DEFAULT, 21600.0, 'job="dcgm"', None),  # the agent selects GPUs the rules did not
     ({**DEFAULT, "selector": 'job="dcgm"'}, AT + 1, {**DEFAULT, "selector": 'job="dcgm"'}, 21600.0, 'job="dcgm"',
      ("chunks", AT + 1)),
     (DEFAULT, AT + 1, {**DEFAULT, "busy_util": "30"}, 21600.0, "", None)],  # a lookback ago they were other rules
    ids=["fit", "3h-lookback", "12h-lookback", "younger", "lagging", "other-busy", "other-step", "selector-not-ruled",
         "selector-ruled", "changed-within-lookback"],
)
def test_plan(info, evaluated, since, lookback, selector, expect) -> None:  # type: ignore[no-untyped-def]
    got = recording.plan(_rows(info, evaluated, since), step=60.0, busy=20.0, lookback=lookback, selector=selector,
                         at=AT, now=AT + 59)
    assert (got.mode, got.at) == expect if expect else got is None


def test_the_rules_use_the_sources_own_expressions() -> None:
    doc = recording.recording_rules()
    [group] = doc["groups"]
    assert group["interval"] == "1m"
    rules = {r["record"]: r for r in group["rules"]}
    d = Dialects("")
    assert rules[recording.UTIL]["expr"] == d.util() and rules[recording.MEM]["expr"] == d.mem_used()
    assert rules[recording.INFO]["labels"] == {"step": "60", "busy_util": "20", "chunk": "1800"}
    # every chunk rule reads a per-sample rule defined before it in the group (evaluated first)
    order = list(rules)
    for name, r in rules.items():
        for src in (recording.UTIL, recording.BUSY, recording.BURST, recording.MEM, recording.MEM_T):
            if f"{src}[" in r["expr"]:
                assert order.index(src) < order.index(name), name
    other = recording.recording_rules(busy=30, selector='job="dcgm"')
    o = {r["record"]: r for r in other["groups"][0]["rules"]}
    assert o[recording.INFO]["labels"]["selector"] == 'job="dcgm"' and "> bool 30" in o[recording.BUSY]["expr"]
    assert 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{job="dcgm"}' in o[recording.UTIL]["expr"] and 'job="dcgm"' in o[recording.MEM]["expr"]
    with pytest.raises(ValueError, match="whole number of steps"):
        recording.recording_rules(step=60, chunk=1830)


def test_the_chunk_reads_land_on_the_rules_evaluations() -> None:
    at = AT + 37.025  # the rules' phase within the minute
    start, end, step = recording.chunk_range(at, 1800, 12)
    # twelve steps a chunk apart, the newest the rules' last evaluation, exact to the millisecond
    assert (start, end, step) == (f"{AT + 37.025 - 11 * 1800:.3f}", f"{AT + 37.025:.3f}", "1800.000")
    assert recording.chunk_range(1_795_960_837.0249999, 1800, 2)[1] == "1795960837.025"
    q = recording.chunk_read("gpu_util", "sum", 1800)
    assert q == "last_over_time(gpu_cost:gpu_util:sum_30m[1ms])"
    assert {f"{m}:{op}" for m, op in recording.CHUNK_READS} >= {"gpu_util:sum", "gpu_fb_used:tysum", "gpu_util:max"}
    # a 2-hour window of 30-minute chunks comes from them too (not the primary window, which wants power)
    assert recording.chunk_steps(21600, [3600, 7200], 900, 1800) == 12
    assert recording.chunk_steps(21600, [28800], 900, 1800) == 16
    assert not recording.chunk_window(1800, 1800, 1800) and not recording.chunk_window(2700, 900, 1800)
    w = recording.windows_query_recorded([900, 3600, 7200], 900, 1800, 21600, 60)
    assert '"util_mean@900"' in w and '"power@900"' in w and "@3600" not in w and "@7200" not in w
    assert '"burst_edge"' in w and "offset 21540000ms" in w and "DCGM" not in w


def _chunks_of(times: np.ndarray, util: np.ndarray, mem: np.ndarray, at: float, chunk: float, k: int, busy: float):
    """What the shipped rules record for each chunk j (samples in (at-(j+1)chunk, at-j chunk]), from samples."""
    out: dict[tuple[str, str], np.ndarray] = {key: np.full((1, k), np.nan) for key in recording.CHUNK_READS}
    for j in range(k):
        end = at - j * chunk
        sel = (times > end - chunk) & (times <= end)
        if not sel.any():
            continue
        u, y, t = util[sel], mem[sel], times[sel] - end
        prev = np.concatenate([[np.nan], util])[:-1][sel]  # the sample a step before each
        bursts = int(((u > busy) & (prev < busy / 4)).sum())
        n = float(len(y))
        cov = float(np.mean((t - t.mean()) * (y - y.mean())))
        vals = {("gpu_util", "sum"): u.sum(), ("gpu_util", "count"): n, ("gpu_util", "max"): u.max(),
                ("gpu_util_busy", "sum"): float((u > busy).sum()), ("gpu_fb_used", "count"): n,
                ("gpu_fb_used", "min"): y.min(), ("gpu_fb_used", "max"): y.max(), ("gpu_fb_used", "sum"): y.sum(),
                ("gpu_fb_used", "sumsq"): (y * y).sum(), ("gpu_fb_used", "tsum"): t.sum(),
                ("gpu_fb_used", "tsumsq"): (t * t).sum(), ("gpu_fb_used", "tysum"): n * (cov + t.mean() * y.mean()),
                ("gpu_fb_used_timestamp", "min"): times[sel].min(), ("gpu_fb_used_timestamp", "max"): times[sel].max()}
        if bursts:
            vals[("gpu_util_burst", "count")] = bursts
        for key, v in vals.items():
            out[key][0, j] = v
    return out


def test_chunks_put_together_equal_the_one_pass_lookback() -> None:
    rng = np.random.default_rng(7)
    step, chunk, lookback, at = 60.0, 1800.0, 21600.0, AT + 37.0
    times = at - step * np.arange(400)[::-1]
    util = np.where(rng.random(400) < 0.3, rng.uniform(50, 100, 400), rng.uniform(0, 3, 400))
    util[150:190] = np.nan  # an exporter gap: two chunks without samples
    mem = 1000 + 5.0 * np.arange(400) + rng.normal(0, 30, 400)
    keep = ~np.isnan(util)
    t_k, u_k, m_k = times[keep], util[keep], mem[keep]
    mats = _chunks_of(t_k, u_k, m_k, at, chunk, 16, busy=20.0)
    cols = recording.chunk_columns(mats, 1, chunk=chunk, lookback=lookback, windows=[3600.0, 28800.0], primary=900.0)
    recording.finish(cols, 1)
    lb = (times > at - lookback) & keep
    assert cols["n_lb"][0] == lb.sum()
    assert cols["util_mean_lb"][0] == pytest.approx(util[lb].mean(), rel=1e-12)
    assert cols["util_max_lb"][0] == util[lb].max()
    assert cols["busy_share_lb"][0] == pytest.approx((util[lb] > 20).mean(), rel=1e-12)
    # the memory trend: the same slope and variances as a least-squares fit over the lookback's samples
    t, y = times[lb], mem[lb]
    slope = np.polyfit(t, y, 1)[0] * 3600
    assert cols["mem_slope_lb"][0] == pytest.approx(slope, rel=1e-9)
    assert cols["mem_var_lb"][0] == pytest.approx(y.var(), rel=1e-9)
    assert cols["mem_tvar_lb"][0] == pytest.approx(t.var(), rel=1e-9)
    assert (cols["mem_t0_lb"][0], cols["mem_t1_lb"][0]) == (t.min(), t.max())
    # windows of whole chunks, one longer than the lookback (16 chunks read)
    for w in (3600.0, 28800.0):
        sel = (times > at - w) & keep
        assert cols[f"n@{w:g}"][0] == sel.sum() and cols[f"util_max@{w:g}"][0] == util[sel].max()
        assert cols[f"util_mean@{w:g}"][0] == pytest.approx(util[sel].mean(), rel=1e-12)
        assert (cols[f"mem_min@{w:g}"][0], cols[f"mem_max@{w:g}"][0]) == (mem[sel].min(), mem[sel].max())
    # the chart: twelve 30-minute maxima, empty where the gap left a chunk without samples
    charts = [cols[f"chart_{b}"][0] for b in range(12)]
    for b, v in enumerate(charts):
        end = at - (11 - b) * chunk
        sel = (times > end - chunk) & (times <= end) & keep
        assert (np.isnan(v) and not sel.any()) or v == util[sel].max()
    assert any(np.isnan(charts))
    # no chunk at all: NaN, never 0 (a GPU unseen is not idle)
    none = recording.chunk_columns({}, 2, chunk=chunk, lookback=lookback, windows=[], primary=900.0)
    assert np.isnan(none["n_lb"]).all() and np.isnan(none["util_sum_lb"]).all()


def test_queries_parse(tmp_path: Path) -> None:
    """promtool parses every query the recorded path sends (as rule expressions)."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    exprs = [recording.lookback_query_samples(10800, 60), recording.chart_query_samples(10800),
             recording.windows_query_recorded([900, 3600], 900),
             recording.windows_query_recorded([900, 3600, 7200], 900, 1800, 21600, 60),
             *(recording.chunk_read(m, op, 1800) for m, op in recording.CHUNK_READS)]
    rules = {"groups": [{"name": "check", "rules": [{"record": f"q{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    f = tmp_path / "queries.yml"
    f.write_text(yaml.safe_dump(rules, width=10**9))
    r = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_command_writes_the_shipped_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert recording.main([]) == 0
    from gpu_cost.core.paths import ROOT

    assert capsys.readouterr().out == (ROOT / recording.SHIPPED).read_text()
    assert recording.main(["--busy-util", "30", "--selector", '{job="dcgm"}']) == 0
    text = capsys.readouterr().out
    assert "busy_util: '30'" in text and "selector: job=\"dcgm\"" in text.replace("'", "")


def test_the_connection_can_turn_them_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from gpu_cost.perceive.prometheus import prometheus_config

    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_PROMETHEUS", json.dumps({"conn_type": "http", "host": "p", "port": 9090}))
    assert prometheus_config().recording_rules is True
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_PROMETHEUS",
                       json.dumps({"conn_type": "http", "host": "p", "port": 9090, "extra": {"recording_rules": "false"}}))
    assert prometheus_config().recording_rules is False
