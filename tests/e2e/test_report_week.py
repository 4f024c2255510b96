"""A replayed simulator week → the weekly report: totals reconcile with the audit tables, the
charts have their sizes, and the HTML renders in headless Chromium."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from gpu_cost.audit.store import AuditStore
from gpu_cost.core.timeutil import epoch
from gpu_cost.report import charts, kpis
from gpu_cost.report.render import build_report
from gpu_cost.sim.week import WEEK, seed_week
from tests.fixtures.core import NOW, ROOT, need

pytestmark = pytest.mark.e2e

END = NOW  # 2026-11-29, a Sunday, 14:00 UTC


@pytest.fixture(scope="module")
def week(tmp_path_factory):  # type: ignore[no-untyped-def]
    from gpu_cost.config.loader import load_policy

    tmp = tmp_path_factory.mktemp("report-week")
    store = AuditStore(f"sqlite:///{tmp / 'audit.db'}").ensure_schema()
    policy = load_policy(ROOT / "include" / "policy" / "default.yaml")
    counts = seed_week(store, policy, END)
    out = build_report(store, policy, END - WEEK, END + 1, tmp / "reports")
    k = json.loads(Path(out["kpis"]).read_text())
    return store, policy, counts, out, k


def test_the_week_was_replayed_and_acted_on(week) -> None:  # type: ignore[no-untyped-def]
    _, _, counts, _, k = week
    assert counts["sweeps"] == 168 and k["cluster"]["sweeps"] == 168
    assert counts["executed"] > 0 and k["events"]["live"]["cancels"] > 0 and k["events"]["live"]["process_kills"] > 0
    assert k["savings"]["freed"]["count"] > 0


def test_every_action_is_counted_once(week) -> None:  # type: ignore[no-untyped-def]
    store, _, _, _, k = week
    rows = store.query("SELECT a.action_id, a.action FROM gpu_cost_actions a JOIN gpu_cost_decisions d "
                       "ON a.decision_id = d.decision_id WHERE a.status = 'succeeded' AND a.dry_run = 0")
    assert len(rows) == len({r["action_id"] for r in rows})
    by_cat = Counter(kpis.category_of(r["action"]) for r in rows)
    assert {c: n for c, n in k["events"]["live"].items() if n} == dict(by_cat)
    assert k["events"]["live_total"] == len(rows) == k["data"]["actions"]
    assert sum(sum(v) for v in k["daily"]["live"].values()) == len(rows)
    # decisions the seed approved or rejected are the approvals the report shows
    asked = store.query("SELECT approval_status, COUNT(*) AS n FROM gpu_cost_decisions WHERE requires_approval = 1 "
                        "AND mode <> 'dry-run' AND status <> 'capped' GROUP BY approval_status")
    assert k["events"]["approvals"]["requested"] == sum(int(r["n"]) for r in asked)


def test_usage_totals_reconcile_with_the_usage_table(week) -> None:  # type: ignore[no-untyped-def]
    store, _, _, _, k = week
    t = store.query("SELECT SUM(total_gpu_s) AS total, SUM(allocated_gpu_s) AS alloc, SUM(idle_alloc_gpu_s) AS idle, "
                    "SUM(zombie_gpu_s) AS zombie FROM gpu_cost_usage")[0]
    c = k["cluster"]
    assert c["gpu_hours"] == pytest.approx(t["total"] / 3600, abs=0.01)
    assert c["allocated_gpu_hours"] == pytest.approx(t["alloc"] / 3600, abs=0.01)
    assert c["idle_alloc_gpu_hours"] == pytest.approx(t["idle"] / 3600, abs=0.01)
    assert c["zombie_gpu_hours"] == pytest.approx(t["zombie"] / 3600, abs=0.01)
    assert sum(team["idle_gpu_hours"] for team in k["by_team"]) == pytest.approx(c["idle_alloc_gpu_hours"], abs=0.1)
    assert c["gpus_avg"] == 64.0


def test_savings_reconcile_and_never_exceed_allocated_time(week) -> None:  # type: ignore[no-untyped-def]
    store, _, _, _, k = week
    savings = store.query("SELECT * FROM gpu_cost_savings")
    realized = k["savings"]["freed"]
    owner = realized["by_kind"].get("owner", {"count": 0, "gpu_hours": 0.0, "cost": 0.0})  # computed, not stored
    assert realized["count"] - owner["count"] == len(savings)
    assert realized["gpu_hours"] - owner["gpu_hours"] == pytest.approx(sum(s["gpu_hours"] for s in savings), abs=0.02)
    assert realized["cost"] - owner["cost"] == pytest.approx(sum(s["usd"] for s in savings), abs=0.02)
    from gpu_cost.act.savings import week_end as cap_of

    for s in savings:
        d = store.get_decision(s["decision_id"])
        assert d is not None and d["status"] == "acted" and d["action"] in kpis.FREEING
        ts = float(s["ts"])
        assert s["gpu_hours"] <= s["gpus"] * (cap_of(ts) - ts) / 3600 + 1e-4, s  # ledger figures are rounded to 4 decimals
        if d["target_kind"] == "job":
            job = store.query("SELECT start_ts, time_limit_s FROM gpu_cost_jobs_usage WHERE job_id = :j LIMIT 1",
                              {"j": d["job_id"]})[0]
            limit_end = float(job["start_ts"]) + float(job["time_limit_s"])
            assert s["gpu_hours"] <= s["gpus"] * max(0.0, limit_end - ts) / 3600 + 1e-4, s  # ledger figures are rounded to 4 decimals
    # one saving per target and episode: a terminate then a kill of the same job is one saving
    assert len({s["saving_id"] for s in savings}) == len(savings)
    assert all(s["saving_id"].startswith(f"gpu:{s['target']}:") for s in savings)
    assert realized["gpu_hours"] <= k["cluster"]["gpu_hours"]
    # the headline is what other jobs re-used, never more than what was freed
    assert k["savings"]["reused"]["gpu_hours"] <= realized["gpu_hours"] + 1e-6
    assert k["savings"]["headline_cost"] <= realized["cost"] + k["savings"]["power_cost"] + 0.01
    # a saving never exceeds the waste the sweeps saw on its target before the action
    for s in savings:
        d = store.get_decision(s["decision_id"])
        if d["target_kind"] == "job":
            idle = store.query("SELECT SUM(interval_s * (gpus - gpus_active)) AS s FROM gpu_cost_jobs_usage "
                               "WHERE job_id = :j AND ts <= :until", {"j": d["job_id"], "until": float(s["ts"])})[0]["s"] or 0
            window = float(json.loads(d["evidence"]).get("window_s") or 0) if isinstance(d["evidence"], str) else 0.0
            assert s["gpu_hours"] <= (float(idle) + window * s["gpus"]) / 3600 + 1e-3, (s, idle)


def test_chart_pngs_exist_with_their_sizes(week) -> None:  # type: ignore[no-untyped-def]
    from PIL import Image

    _, _, _, out, _ = week
    assert set(out["charts"]) == set(charts.SIZES)
    for name, path in out["charts"].items():
        p = Path(path)
        assert p.stat().st_size > 5000, name
        with Image.open(p) as im:
            assert im.format == "PNG" and im.size == charts.SIZES[name], name


def test_html_and_markdown_carry_the_figures(week) -> None:  # type: ignore[no-untyped-def]
    _, _, _, out, k = week
    html = Path(out["index"]).read_text()
    assert html.count("data:image/png;base64,") == len(charts.SIZES)
    assert k["period"]["label"] in html and "Right-sizing suggestions" in html
    notices = k["events"]["live"]["notifications"]
    assert "What people answered" in html and f"0 of {k['answers']['notices']}" in html and notices > 0
    for team in k["by_team"][:3]:
        assert f"<td>{team['account']}</td>" in html
    md = Path(out["summary"]).read_text()
    assert md.startswith("# GPU cost report") and f"{k['cluster']['idle_alloc_gpu_hours']:,.0f}" in md
    assert epoch(k["period"]["since"]) == END - WEEK


@pytest.mark.browser
def test_report_renders_in_headless_chromium(week, artifacts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    need("/usr/bin/chromium")
    from PIL import Image, ImageStat

    _, _, _, out, _ = week
    shot = artifacts / "weekly_report.png"
    shot.unlink(missing_ok=True)
    subprocess.run(
        ["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
         "--window-size=1280,2400", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'chromium'}",
         Path(out["index"]).as_uri()],
        check=True, capture_output=True, timeout=120,
    )
    assert shot.stat().st_size > 50_000
    with Image.open(shot) as im:
        assert im.size == (1280, 2400)
        stat = ImageStat.Stat(im.convert("L"))
        assert stat.stddev[0] > 20, "the screenshot is (nearly) blank"
