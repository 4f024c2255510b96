"""Recording rules for the sweep: the rule file, the queries that read it, and when the source uses them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpu_cost.sources import recording
from gpu_cost.sources.prometheus import Dialects, Sample

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


def test_the_chunked_lookback_reads_each_chunk_at_the_rules_evaluations() -> None:
    at = AT + 37.025  # the rules' phase within the minute; AT is a multiple of 30 min
    q = recording.lookback_query_chunked(21600, 60, 1800, at)
    # 12 subquery steps on multiples of 30 min (…, AT - 30 min, AT), each read 37.025 s later
    assert "sum_over_time((last_over_time(gpu_cost:gpu_util:sum_30m[1ms] offset -37025ms))[19837025ms:1800000ms])" in q
    assert "DCGM" not in q and q.count("(") == q.count(")")
    stats = {s for s in ("util_sum_lb", "n_lb", "busy_sum_lb", "bursts_lb", "mem_n_lb", "mem_sy_lb", "mem_syy_lb",
                         "mem_sd_lb", "mem_sdd_lb", "mem_sdy_lb", "mem_t0_lb", "mem_t1_lb") if f'"{s}"' in q}
    chart = recording.chart_query_chunked(21600, 1800)
    assert len(stats) == 12 and all(f'"chart_{k}"' in chart for k in range(12)) and '"chart_' not in q
    assert "last_over_time(gpu_cost:gpu_util:max_30m[1ms] offset 19800000ms)" in chart  # the oldest chart bucket
    # a chunk's age is the base (the last multiple of 30 min) minus the step's time
    assert f"({AT!r} - time())" in q
    on_grid = recording.lookback_query_chunked(21600, 60, 1800, AT)
    assert "offset -" not in on_grid and "[19800000ms:1800000ms]" in on_grid


def test_queries_parse(tmp_path: Path) -> None:
    """promtool parses every query the recorded path sends (as rule expressions)."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    exprs = [recording.lookback_query_chunked(21600, 60, 1800, AT + 37.025),
             recording.lookback_query_chunked(43200, 60, 1800, AT + 12.5), recording.lookback_query_samples(10800, 60),
             recording.chart_query_chunked(21600, 1800), recording.chart_query_chunked(43200, 1800),
             recording.chart_query_samples(10800),
             recording.windows_query_recorded([900, 3600], 900),
             recording.windows_query_recorded([900, 3600, 7200], 900, 1800, AT + 37.025)]
    rules = {"groups": [{"name": "check", "rules": [{"record": f"q{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    f = tmp_path / "queries.yml"
    f.write_text(yaml.safe_dump(rules, width=10**9))
    r = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_command_writes_the_shipped_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert recording.main([]) == 0
    from gpu_cost.paths import ROOT

    assert capsys.readouterr().out == (ROOT / recording.SHIPPED).read_text()
    assert recording.main(["--busy-util", "30", "--selector", '{job="dcgm"}']) == 0
    text = capsys.readouterr().out
    assert "busy_util: '30'" in text and "selector: job=\"dcgm\"" in text.replace("'", "")


def test_the_connection_can_turn_them_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from gpu_cost.sources.prometheus import prometheus_config

    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_PROMETHEUS", json.dumps({"conn_type": "http", "host": "p", "port": 9090}))
    assert prometheus_config().recording_rules is True
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_PROMETHEUS",
                       json.dumps({"conn_type": "http", "host": "p", "port": 9090, "extra": {"recording_rules": "false"}}))
    assert prometheus_config().recording_rules is False
