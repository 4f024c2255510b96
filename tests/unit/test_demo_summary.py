"""The demo shows what the README promises, the same on every run, with one definition per number
(issue 39 rows 2, 3, 4 and 6; issue 35 item 7): its instant, its summary, its first sweep of the shipped
cluster, its night, and the report the demo and ``gpu-cost report --since 7d`` write from the same store."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.config.loader import load_policy
from gpu_cost.sim.week import WEEK, demo_instant

HOUR = 3600.0


def _utc(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()


# -- row 2: the same week whenever it runs --------------------------------------------------------
@pytest.mark.parametrize("now", ["2026-11-29T03:00:00", "2026-11-30T10:17:00", "2026-12-03T23:59:59",
                                 "2026-12-06T02:59:59"])
def test_the_demo_week_ends_at_the_same_instant_whenever_in_the_week_it_runs(now: str) -> None:
    end = demo_instant(_utc(now))
    assert end == _utc("2026-11-29T03:00:00")  # a Sunday night, inside the shipped off-hours windows
    assert demo_instant(_utc("2026-12-06T03:00:00")) == end + WEEK


def test_prophets_bounds_are_the_same_on_every_run() -> None:
    """Prophet samples its uncertainty from NumPy's global generator: unseeded, the power plan's upper
    bound (and so its decisions) changed from run to run."""
    import numpy as np
    import pandas as pd

    from gpu_cost.capacity.forecast import prophet_util

    ts = pd.date_range("2026-11-01", periods=96, freq="h")
    y = 10 + 5 * np.sin(np.arange(96) / 24 * 2 * np.pi) + np.arange(96) % 3
    m = prophet_util.fit(pd.DataFrame({"ds": ts, "y": y}), prophet_util.FitStats(), daily_seasonality=True,
                         weekly_seasonality=False, yearly_seasonality=False, uncertainty_samples=200)
    future = pd.DataFrame({"ds": pd.date_range("2026-11-05", periods=6, freq="h")})
    np.random.seed(1)
    a = prophet_util.predict(m, future)["yhat_upper"].to_numpy()
    np.random.seed(2)  # whatever the global state was before
    b = prophet_util.predict(m, future)["yhat_upper"].to_numpy()
    assert np.array_equal(a, b)


# -- row 3: every decision, in full -----------------------------------------------------------------
def _decision(rule: str, target: str, user: str, action: str, reason: str) -> dict[str, Any]:
    job = target.split(":", 1)[1] if target.startswith("job:") else None
    return {"rule": rule, "target": target, "job_id": job, "user": user, "action": action, "mode": "dry-run",
            "reason": reason, "gpus": 1}


DECISIONS = [
    _decision("zombie", "proc:gpu01:11002:1795906800", "bob", "notify",
              "1 GPU(s) hold 36874.0 MiB at ≤0.0% for 15 min with no running job"),
    _decision("idle_allocation", "job:1003", "carol", "notify", "job 1003: all 2 allocated GPU(s) ≤0.4% for 15 min"),
    _decision("low_efficiency", "job:1004", "dave", "advise",
              "job 1004: mean utilisation 14.9% over 60 min while its processes use 14.0 CPU cores and read and "
              "write 420 MiB/s: its GPUs wait for data — more data-loader workers, faster storage, or fewer GPUs"),
    _decision("idle_allocation", "job:1005", "erin", "advise", "job 1005: all 2 allocated GPU(s) ≤0.3% for 15 min — "
              "inference service (4 bursts of activity in the lookback): advice only"),
    _decision("low_efficiency", "job:1005", "erin", "advise", "job 1005: mean utilisation 17.2% over 60 min"),
    _decision("idle_allocation", "job:100312", "oscar", "advise", "job 100312: all 1 allocated GPU(s) ≤0.3% for 15 min "
              "— inference service (name matches *serve*): advice only"),
    _decision("idle_allocation", "job:1007", "grace", "none", "job 1007: all 1 allocated GPU(s) ≤0.4% for 15 min; "
              "protected (no-interrupt label): recorded only"),
]


def test_the_summary_lists_every_decision_on_a_line_with_its_whole_reason(tmp_path: Path) -> None:
    from gpu_cost.cli.commands.demo import summary

    result = {"mode": "dry-run", "decisions": DECISIONS, "cluster": {"gpus": 88, "nodes": 11}, "days": 14.0,
              "week_end": _utc("2026-11-29T03:00:00"), "audit_db": str(tmp_path / "audit.db"),
              "log": str(tmp_path / "demo.log"), "power": "dry-run: would power down 4 node(s)",
              "report_headline": {"currency": "USD", "idle_alloc_gpu_hours": 10.0, "zombie_gpu_hours": 2.0,
                                  "would_have_gpu_hours": 5.0, "would_have_cost": 10.0}}
    lines = summary(result, tmp_path)
    text = "\n".join(lines)
    assert len(lines) <= 30, text
    assert lines[1].startswith("sweep     7 decision(s) now: would advise 4, would notify 2, no action 1"), text
    for d in DECISIONS:  # one line each, the reason whole (only the "job N:" the line already names dropped)
        reason = d["reason"].removeprefix(f"job {d['job_id']}: ")
        assert sum(1 for line in lines if d["target"] in line and reason in line) == 1, (d["target"], text)
    assert "…" not in text
    protected = next(line for line in lines if "job:1007" in line)
    assert "no action" in protected and "protected (no-interrupt label)" in protected
    assert "data-loader workers, faster storage, or fewer GPUs" in next(line for line in lines if "job:1004" in line)
    assert "Sun 29 Nov 03:00 UTC" in lines[0]


# -- row 3 / issue 35 item 7: the first hour shows the seed's three rules ----------------------------
@pytest.fixture(scope="module")
def demo_cluster() -> tuple[Any, float]:
    from gpu_cost.cli.demo import DEMO_DAYS
    from gpu_cost.sim.week import demo_scenario

    end = _utc("2026-11-29T03:00:00")
    return demo_scenario(end, days=DEMO_DAYS), end


def test_the_demos_sweep_finds_a_zombie_an_idle_job_and_a_data_loader_bound_one(
        demo_cluster: tuple[Any, float], tmp_path: Path) -> None:
    """A: a zombie and an idle allocation; B: the data-loader job's advice names its evidence and what to
    change; and the protected job is decided on (no action), so the summary can say why."""
    from gpu_cost.loop import sweep

    cluster, end = demo_cluster
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}").ensure_schema()
    out = sweep.run_once(load_policy(None), end, store, run_id="gpu_zombie_sweep:t", source="sim",
                         dag_id="gpu_zombie_sweep", scenario=cluster)
    by = {(d["rule"], d["target"]): d for d in out["decisions"]}
    assert ("zombie", "proc:gpu01:11002:1795906800") in by, sorted(by)
    assert by[("idle_allocation", "job:1003")]["action"] == "notify"
    loader = by[("low_efficiency", "job:1004")]
    assert loader["action"] == "advise"
    assert "CPU cores" in loader["reason"] and "MiB/s" in loader["reason"], loader["reason"]
    assert "more data-loader workers, faster storage, or fewer GPUs" in loader["reason"]
    row = next(r for r in store.decisions_of_run("gpu_zombie_sweep:t") if r["target"] == "job:1004")
    evidence = row["evidence"] if isinstance(row["evidence"], dict) else json.loads(row["evidence"])
    assert any(s["what"] == "Input pipeline" for s in evidence["signals"])
    protected = by[("idle_allocation", "job:1007")]
    assert protected["action"] == "none" and "protected" in protected["reason"]
    # the advice is given once per episode: a second sweep of the same instant decides nothing again
    again = sweep.run_once(load_policy(None), end, store, run_id="gpu_zombie_sweep:t2", source="sim",
                           dag_id="gpu_zombie_sweep", scenario=cluster)
    assert again["decisions"] == []


def test_the_demos_night_has_idle_nodes_the_agent_would_power_down(demo_cluster: tuple[Any, float]) -> None:
    """C: at the demo's instant (Sunday 03:00 UTC) the off-hours window is open, the cluster is quiet and
    idle nodes beyond the warm reserve would be powered down."""
    from gpu_cost.capacity.offhours import plan_power
    from gpu_cost.loop import sweep

    cluster, end = demo_cluster
    policy = load_policy(None)
    plan = plan_power(sweep.collect(policy, end, "sim", scenario=cluster), policy, end)
    assert plan.in_window and not plan.held, plan.held
    assert len(plan.down) >= 2, plan.skipped


# -- row 4: one period, one would-have-freed, for the demo and the CLI ------------------------------
@pytest.fixture
def past_week(tmp_path: Path) -> tuple[Path, AuditStore, float]:
    """A small seeded history ending a week before this week's demo instant (in the past, whatever the clock)."""
    from gpu_cost.sim.week import seed_week

    end = demo_instant(time.time()) - WEEK
    db = tmp_path / "store" / "audit.db"
    db.parent.mkdir()
    store = AuditStore(f"sqlite:///{db}").ensure_schema()
    seed_week(store, load_policy(None), end, nodes=2, days=2, mode="dry-run")
    return db, store, end


def test_the_demo_report_and_report_since_7d_print_the_same_figures(
        past_week: tuple[Path, AuditStore, float], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's report and `gpu-cost report --since 7d`, run later on the same store, read the same period
    (the 7 days of data ending at its newest sweep) and print the same would-have-freed; the report goes
    beside the store it came from (row 6)."""
    from gpu_cost.cli.main import main
    from gpu_cost.core.timeutil import iso
    from gpu_cost.sim.week import demo_report

    db, store, end = past_week
    result: dict[str, Any] = {"week_end": end}
    demo_report(store, tmp_path / "demo-home", result)
    monkeypatch.delenv("GPU_COST_REPORT_DIR", raising=False)
    assert main(["report", "--since", "7d", "--db", str(db), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    demo_h, cli_h = result["report_headline"], cli["headline"]
    assert demo_h["would_have_gpu_hours"] > 0
    for key in ("would_have_gpu_hours", "would_have_cost", "idle_alloc_gpu_hours", "zombie_gpu_hours", "idle_cost"):
        assert cli_h[key] == demo_h[key], key
    # the period is the data's: it ends at the newest sweep, not hours after it
    assert cli["period"]["until"] == iso(end) and cli["period"]["since"] == iso(end - WEEK)
    kpis = json.loads(Path(result["report"]).with_name("kpis.json").read_text())
    assert kpis["period"] == cli["period"]
    assert Path(cli["index"]).is_relative_to(db.parent / "reports"), cli["index"]


# -- row 6: the report reads right ------------------------------------------------------------------
def test_the_actions_chart_counts_from_zero() -> None:
    from gpu_cost.report.charts import actions_axes
    from gpu_cost.report.kpis import CATEGORIES

    days = ["2026-11-23", "2026-11-24", "2026-11-25"]
    k = {"daily": {"days": days, "live": {key: [0, 0, 0] for key, _, _ in CATEGORIES}, "would_have": [15, 18, 21]}}
    plt, fig, ax = actions_axes(k)
    try:
        assert ax.get_ylim()[0] == 0
    finally:
        plt.close(fig)


def test_no_answers_and_an_untrained_verifier_read_in_words(past_week: tuple[Path, AuditStore, float]) -> None:
    from gpu_cost.report.charts import render_all
    from gpu_cost.report.kpis import compute
    from gpu_cost.report.render import render_html

    _, store, end = past_week
    store.execute("insert_verifier_model", {
        "model_id": "v1", "trained_at": end - HOUR, "since_ts": end - WEEK, "until_ts": end - HOUR, "labels": 3,
        "false_positives": 0, "confirmed": 3, "backtest_precision": None, "backtest_recall": None,
        "false_kills_prevented": None, "gpu_hours_given_up": None, "status": "too_few_labels", "note": "",
        "model": None, "run_id": "t"})
    k = compute(store, load_policy(None), end - WEEK, end)
    assert k["answers"]["median_answer_h"] is None
    html = render_html(k, render_all(k))
    assert "no data h" not in html and "no answers yet" in html
    assert "too_few_labels" not in html.lower().replace("too few", "")
    assert "Not in use yet: too few decisions with a known outcome to learn from" in html
