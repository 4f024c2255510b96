"""The demo twice, at two different times of the same week: the same summary, word for word (issue 39
row 2), and the figures `gpu-cost report --since 7d` prints for the same store (row 4).

On a short history (one day) and the DAGs whose runs used to look at the wall clock (the sweep and the
power plan): what varied between runs (the DAGs reading the clock's minute, the week ending at the
hour the demo ran) does not depend on the history's length; Prophet's seeding is held by
``tests/unit/test_demo_summary.py``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpu_cost.sim.week import WEEK, demo_instant


@pytest.mark.e2e
@pytest.mark.slow  # two demos through Airflow: a few minutes
def test_two_demo_runs_print_the_same_summary_and_the_report_agrees(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_cost.cli.commands.demo import summary
    from gpu_cost.cli.demo import run_demo
    from gpu_cost.cli.main import main

    monkeypatch.delenv("GPU_COST_REPORT_DIR", raising=False)
    home = tmp_path / ".demo"
    dags = [("gpu_zombie_sweep", {}), ("gpu_offhours_power", {})]
    first = demo_instant(time.time()) - WEEK + 2 * 3600.0  # Sunday 05:00 a week ago: in the past, whatever the clock
    texts = []
    for now in (first, first + 4 * 86400.0 + 1234.0):  # Sunday and Thursday of the same week
        result = run_demo(home, dags=dags, now=now, days=1.0)
        texts.append("\n".join(summary(result, home)))
    assert texts[0] == texts[1]
    lines = texts[0].splitlines()
    assert len(lines) <= 30, texts[0]
    assert main(["report", "--since", "7d", "--db", str(home / "audit.db"), "--json"]) == 0
    h = json.loads(capsys.readouterr().out)["headline"]
    value = next(line for line in lines if line.startswith("value"))
    assert f"would have freed {h['would_have_gpu_hours']:,.0f} GPU-h (${h['would_have_cost']:,.0f})" in value, (value, h)
    week = next(line for line in lines if line.startswith("week"))
    assert f"{h['idle_alloc_gpu_hours']:,.0f} GPU-h allocated but idle" in week, (week, h)
