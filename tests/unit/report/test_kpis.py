"""KPIs against hand-checked numbers on a small usage fixture (two sweeps, two hosts, three owners)."""

from __future__ import annotations

import json

import pytest

from gpu_cost.core.timeutil import iso
from gpu_cost.report import kpis

# Monday 2026-11-16 00:00 UTC .. Monday 2026-11-23 00:00 UTC
SINCE = 1794787200.0
UNTIL = SINCE + 7 * 86400
HOUR = 3600.0


def usage(ts: float, host: str, user: str, account: str, gpus: int, alloc: float, busy: float, idle: float,
          zombie: float, util: float, model: str = "a100") -> dict:
    return {"ts": ts, "interval_s": HOUR, "host": host, "gpu_model": model, "user_name": user, "account": account,
            "partition_name": "batch" if user else "", "gpus": gpus, "total_gpu_s": gpus * HOUR,
            "allocated_gpu_s": alloc * HOUR, "busy_gpu_s": busy * HOUR, "idle_alloc_gpu_s": idle * HOUR,
            "zombie_gpu_s": zombie * HOUR, "util_sum": util * HOUR}


# Tuesday 10:00-11:00 and 11:00-12:00 UTC. Per sweep, 8 GPUs on n1 (a100, $2/h) and 4 on n2 (h100, $4/h):
#   alice/nlp:   4 a100 GPUs allocated, all busy at 90 %           → util 3.6 GPU-h per hour
#   bob/vision:  2 a100 GPUs allocated, idle                       → idle 2 GPU-h per hour, $4
#   carol/nlp:   4 h100 GPUs allocated, 1 busy at 80 %, 3 idle      → idle 3, util 0.8 per hour, idle $12
#   unallocated: 2 a100 GPUs, one a zombie                         → zombie 1 GPU-h per hour, $2
T1 = SINCE + 86400 + 11 * HOUR
T2 = T1 + HOUR
ROWS = [
    r
    for t in (T1, T2)
    for r in (
        usage(t, "n1", "alice", "nlp", 4, 4, 4, 0, 0, 3.6),
        usage(t, "n1", "bob", "vision", 2, 2, 0, 2, 0, 0.0),
        usage(t, "n1", "", "", 2, 0, 0, 0, 1, 0.0),
        usage(t, "n2", "carol", "nlp", 4, 4, 1, 3, 0, 0.8, model="h100"),
    )
]


@pytest.fixture
def filled(store):  # type: ignore[no-untyped-def]
    store.execute("upsert_usage", ROWS)
    return store


def test_cluster_totals_match_hand_computation(filled, policy) -> None:  # type: ignore[no-untyped-def]
    k = kpis.compute(filled, policy, SINCE, UNTIL)
    c = k["cluster"]
    assert c["sweeps"] == 2
    assert c["gpu_hours"] == 24.0                      # 12 GPUs x 2 h
    assert c["allocated_gpu_hours"] == 20.0            # (4 + 2 + 4) x 2
    assert c["idle_alloc_gpu_hours"] == 10.0           # (2 + 3) x 2
    assert c["zombie_gpu_hours"] == 2.0
    assert c["waste_ratio"] == 0.5                     # 10 / 20
    assert c["util_all_pct"] == pytest.approx(100 * 8.8 / 24, abs=0.05)     # (3.6 + 0.8) x 2 / 24 = 36.7 %
    assert c["util_alloc_pct"] == pytest.approx(100 * 8.8 / 20, abs=0.05)   # 44 %
    assert c["idle_cost"] == 2 * 2 * 2.0 + 3 * 2 * 4.0  # bob on a100 + carol on h100 = 32
    assert c["zombie_cost"] == 4.0
    assert c["gpus_avg"] == 12.0 and c["measured_hours"] == 2.0  # the GPUs of the 2 h measured, not spread over the week


def test_idle_by_team_and_user(filled, policy) -> None:  # type: ignore[no-untyped-def]
    k = kpis.compute(filled, policy, SINCE, UNTIL)
    teams = {t["account"]: t for t in k["by_team"]}
    assert teams["nlp"]["allocated_gpu_hours"] == 16.0 and teams["nlp"]["idle_gpu_hours"] == 6.0
    assert teams["nlp"]["waste_ratio"] == 0.375 and teams["nlp"]["idle_cost"] == 24.0
    assert teams["vision"]["waste_ratio"] == 1.0
    assert [t["account"] for t in k["by_team"]] == ["nlp", "vision"]     # most idle first
    users = {u["user"]: u for u in k["by_user"]}
    assert users["carol"]["idle_gpu_hours"] == 6.0 and users["carol"]["util_pct"] == 20.0
    assert users["alice"]["idle_gpu_hours"] == 0.0 and users["alice"]["util_pct"] == 90.0
    assert k["users_with_idle"] == 2


def test_heatmap_puts_each_sweep_in_its_hour(filled, policy) -> None:  # type: ignore[no-untyped-def]
    grid = kpis.compute(filled, policy, SINCE, UNTIL)["heatmap"]
    assert len(grid) == 7 and all(len(row) == 24 for row in grid)
    # the sweep at 11:00 describes 10:00-11:00, the one at 12:00 describes 11:00-12:00 (Tuesday)
    assert grid[1][10] == pytest.approx(100 * 4.4 / 12, abs=0.05)
    assert grid[1][11] == pytest.approx(100 * 4.4 / 12, abs=0.05)
    assert sum(v is not None for row in grid for v in row) == 2


def test_rows_outside_the_period_are_ignored(filled, policy) -> None:  # type: ignore[no-untyped-def]
    filled.execute("upsert_usage", [usage(UNTIL + HOUR, "n1", "alice", "nlp", 4, 4, 0, 4, 0, 0.0)])
    assert kpis.compute(filled, policy, SINCE, UNTIL)["cluster"]["idle_alloc_gpu_hours"] == 10.0


def test_change_against_previous_week(filled, policy) -> None:  # type: ignore[no-untyped-def]
    before = SINCE - 7 * 86400 + 86400 + 11 * HOUR
    filled.execute("upsert_usage", [usage(before, "n1", "alice", "nlp", 4, 4, 2, 2, 0, 1.0)])
    k = kpis.compute(filled, policy, SINCE, UNTIL)
    assert k["change"]["waste_ratio"]["vs_last_week"] == pytest.approx(0.5 - 0.5)
    assert k["change"]["idle_alloc_gpu_hours"]["vs_last_week"] == pytest.approx(10.0 - 2.0)
    # the trend shows only weeks with data (the week before and this one), not empty weeks as 0 %
    assert [w["since"] for w in k["trend"]] == [iso(SINCE - 7 * 86400), iso(SINCE)]
    assert all(w["has_data"] for w in k["trend"])


def _decision(i: int, action: str, mode: str, ts: float, **extra) -> dict:  # type: ignore[no-untyped-def]
    return {"decision_id": f"d{i}", "run_id": "r", "ts": ts, "rule": "idle_allocation", "target_kind": "job",
            "target": f"job:{i}", "action": action, "mode": mode, "rung": 0, "episode": 1, "job_id": str(i),
            "user_name": "bob", "account": "vision", "partition_name": "batch", "host": "n1", "gpus": 2,
            "reason": "", "protection": None, "requires_approval": 0, "approval_status": None, "status": "decided",
            "gpu_hours_at_risk": 1.0, "gpu_hours_saved": 10.0, "evidence": json.dumps({"window_s": 3600}), **extra}


def test_events_live_once_and_dry_run_apart(store, policy) -> None:  # type: ignore[no-untyped-def]
    t = T1
    store.execute("insert_decision", [
        _decision(1, "notify", "enforce", t), _decision(2, "cancel", "enforce", t),
        _decision(3, "kill_process", "enforce", t), _decision(4, "demote", "enforce", t, requires_approval=1,
                                                              approval_status="approved"),
        _decision(5, "cancel", "dry-run", t), _decision(6, "notify", "dry-run", t),
        _decision(7, "cancel", "enforce", t, requires_approval=1, approval_status="rejected"),
        _decision(8, "cancel", "enforce", t),
    ])
    # approvals are events of the approver's path, never columns of the decision log
    store.set_approval("d4", "approved", "lead", t + 1)
    store.set_approval("d7", "rejected", "lead", t + 1)
    for i, action, status in ((1, "notify", "succeeded"), (2, "cancel", "succeeded"), (3, "kill_process", "succeeded"),
                              (4, "demote", "succeeded"), (8, "cancel", "failed")):
        store.action_started(action_id=f"d{i}:{action}", decision_id=f"d{i}", run_id="r", action=action,
                             target=f"job:{i}", executor="x", dry_run=False, started_at=t + 5)
        store.action_finished(f"d{i}:{action}", status, t + 6)
    ev = kpis.compute(store, policy, SINCE, UNTIL)["events"]
    assert ev["live"] == {"notifications": 1, "demotions": 1, "cancels": 1, "holds": 0, "process_kills": 1,
                          "power_downs": 0, "power_ups": 0, "reservations": 0, "reservations_released": 0}
    assert ev["would_have"]["cancels"] == 1 and ev["would_have"]["notifications"] == 1
    assert ev["approvals"] == {"requested": 2, "approved": 1, "rejected": 1, "timed_out": 0, "pending": 0}
    assert ev["failed"] == 1 and ev["live_total"] == 4 and ev["would_have_total"] == 2
    k = kpis.compute(store, policy, SINCE, UNTIL)
    # dry-run cancel of 2 GPUs, seen idle for its 1 h window (its end unknown): 2 GPU-h potential, nothing freed
    assert k["savings"]["potential"]["gpu_hours"] == 2.0 and k["savings"]["freed"]["gpu_hours"] == 0.0


def test_freed_savings_by_kind(store, policy) -> None:  # type: ignore[no-untyped-def]
    store.execute("insert_saving", [
        {"saving_id": "gpu:job:1:1", "decision_id": "d1", "ts": T1, "kind": "gpu", "target": "job:1", "user_name": "bob",
         "account": "vision", "gpu_model": "a100", "gpus": 2, "gpu_hours": 12.0, "kwh": 0.0, "usd": 24.0, "basis": "x"},
        {"saving_id": "power:n3:1", "decision_id": None, "ts": T2, "kind": "power", "target": "node:n3", "user_name": None,
         "account": None, "gpu_model": "a100", "gpus": 0, "gpu_hours": 0.0, "kwh": 3.2, "usd": 0.48, "basis": "y"},
        {"saving_id": "gpu:job:9:1", "decision_id": "d9", "ts": UNTIL + 10, "kind": "gpu", "target": "job:9",
         "user_name": "x", "account": "y", "gpu_model": "a100", "gpus": 1, "gpu_hours": 5.0, "kwh": 0, "usd": 10.0,
         "basis": "next week"},
    ])
    s = kpis.compute(store, policy, SINCE, UNTIL)["savings"]["freed"]
    assert s["count"] == 2 and s["gpu_hours"] == 12.0 and s["kwh"] == 3.2 and s["cost"] == 24.48
    assert s["by_kind"]["power"]["kwh"] == 3.2 and s["by_kind"]["gpu"]["cost"] == 24.0


def test_right_sizing_lists_the_advice_rows_most_waste_first() -> None:
    """The report's right-sizing is the advice rightsize.compute gives (tests/unit/test_rightsize.py holds
    it equal to `gpu-cost rightsize show`): rows with advice only, most GPU time held beyond need first."""
    from gpu_cost.capacity.rightsize import Advice

    def row(user: str, status: str, idle: float, stem: str = "") -> Advice:
        return Advice(scope="class" if stem else "user", user=user, stem=stem, status=status, jobs=5, gpus_asked=8,
                      gpus_need=2, gpus_advice=2 if status == "advice" else 0, ask_min=3, block_above=0,
                      mem_peak_mib=None, mem_total_mib=None, time_jobs=0, time_asked_s=None, runtime_s=None,
                      time_advice_s=0.0, time_ask_min_s=0.0, idle_gpu_hours=idle, head=f"advice for {user}",
                      gpus_text="ask for 2")

    out = kpis.right_sizing([row("alice", "fits", 0.0), row("dave", "advice", 60.0), row("erin", "advice", 90.0,
                                                                                         stem="train-#")])
    assert [(r["who"], r["held_beyond_need_gpu_hours"]) for r in out] == [("erin / train-#", 90.0), ("dave", 60.0)]
    assert out[1]["text"] == "advice for dave ask for 2" and (out[1]["requested"], out[1]["suggest"]) == (8, 2)


def test_week_bounds_follow_the_report_time_zone() -> None:
    at = UNTIL + 8 * HOUR   # Monday 2026-11-23 08:00 UTC
    assert kpis.week_bounds(at, "UTC") == (SINCE, UNTIL)
    since, until = kpis.week_bounds(at, "Europe/Paris")
    assert since == SINCE - HOUR and until == UNTIL - HOUR    # midnight in Paris is 23:00 UTC in November


def test_empty_period_is_an_error(store, policy) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.core.errors import GpuCostError

    with pytest.raises(GpuCostError, match="not before"):
        kpis.compute(store, policy, UNTIL, SINCE)


def test_an_empty_week_reads_no_data_not_none(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.audit.store import AuditStore
    from gpu_cost.cli import main as cli
    from gpu_cost.report.render import fmt_money, fmt_num, fmt_pct

    assert fmt_pct(None) == fmt_num(None) == fmt_money(None) == "no data"
    assert fmt_num(12345.678, 1) == "12,345.7" and fmt_pct(0.1234, 1, True) == "12.3 %" and fmt_money(2078.4) == "$2,078"
    AuditStore(f"sqlite:///{tmp_path / 'empty.db'}").ensure_schema()  # a store with nothing in it (a read creates none)
    code = cli.main(["report", "--db", str(tmp_path / "empty.db"), "--out", str(tmp_path / "r"),
                     "--since", "2026-11-16T00:00:00Z"])
    text = capsys.readouterr().out
    assert code == 0 and "None" not in text and "utilisation: no data of all GPUs" in text, text
    html = next((tmp_path / "r").rglob("index.html")).read_text()
    assert "None" not in html.replace("display:none", "")


def test_a_period_longer_than_a_week_is_compared_with_the_one_before_it_not_an_overlap(filled, policy) -> None:  # type: ignore[no-untyped-def]
    # a 7 d + 2 h period: the week before must end where it starts, or the period's first 2 h count twice
    filled.execute("upsert_usage", [usage(SINCE + HOUR, "n9", "alice", "nlp", 4, 4, 2, 2, 0, 1.0)])
    k = kpis.compute(filled, policy, SINCE, UNTIL + 2 * HOUR)
    assert [w["has_data"] for w in k["trend"]] == [True]
    assert k["change"]["util_all_pct"]["vs_last_week"] is None


def test_the_report_names_a_shipped_policy_by_its_place_in_the_package() -> None:
    from gpu_cost.core import paths

    shipped = str(paths.include_dir() / "policy" / "default.yaml")
    assert kpis._shown_path(shipped) == "include/policy/default.yaml"
    assert kpis._shown_path("/etc/gpu-cost/policy.yaml") == "/etc/gpu-cost/policy.yaml"


def test_answers_counted_by_choice_share_and_time_to_answer() -> None:
    actions = [{"decision_id": f"d{i}", "action": "notify", "dry_run": 0, "status": "succeeded"} for i in range(4)]
    actions.append({"decision_id": "d9", "action": "notify", "dry_run": 1, "status": "skipped"})  # dry-run: no notice
    decided = {f"d{i}": SINCE + i * HOUR for i in range(4)}
    given = [
        {"decision_id": "d0", "choice": "keep", "status": "accepted", "ts": SINCE + 0.5 * HOUR},
        {"decision_id": "d1", "choice": "wrong", "status": "accepted", "ts": SINCE + 3 * HOUR},
        {"decision_id": "d1", "choice": "keep", "status": "refused", "ts": SINCE + 3.1 * HOUR},
        {"decision_id": "d2", "choice": "release", "status": "accepted", "ts": SINCE + 6 * HOUR},
        {"decision_id": None, "choice": "", "status": "refused", "ts": SINCE + HOUR},  # a bad signature
    ]
    a = kpis.answer_kpis(given, actions, decided)
    assert (a["kept"], a["released"], a["wrong"], a["refused"]) == (1, 1, 1, 2)
    assert (a["notices"], a["answered"], a["answered_share"], a["wrong_share"]) == (4, 3, 0.75, 0.25)
    # waits: 0.5 h, 2 h, 4 h
    assert (a["median_answer_h"], a["p90_answer_h"]) == (2.0, 4.0)
    none = kpis.answer_kpis([], [], {})
    assert none["wrong_share"] is None and none["median_answer_h"] is None


def test_the_report_counts_the_answers_given_in_the_period(store, policy) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.decide import answers

    row = {"answer_id": answers.answer_id(SINCE + HOUR), "ts": SINCE + HOUR, "channel": "slack", "choice": "wrong",
           "status": "accepted", "refusal": None, "decision_id": "dx", "rule": "idle_allocation", "target": "job:1",
           "episode": 1, "job_id": "1", "answered_by": "carol", "owner": "carol", "role": "owner", "duration_s": None,
           "reason": None, "until_ts": None, "effect": "ladder stopped", "nonce": "n1"}
    store.execute("insert_answer", row)
    store.execute("insert_answer", {**row, "answer_id": answers.answer_id(UNTIL + HOUR), "ts": UNTIL + HOUR})  # next week
    k = kpis.compute(store, policy, SINCE, UNTIL)
    assert (k["answers"]["wrong"], k["answers"]["kept"]) == (1, 0)


def test_the_report_shows_the_verifier_in_use_and_what_it_held(store, policy, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert kpis.compute(store, policy, SINCE, UNTIL)["verifier"] is None  # never trained: no section
    model = {"model_id": "v1", "trained_at": SINCE - HOUR, "since_ts": SINCE - 30 * 86400, "until_ts": SINCE - HOUR,
             "labels": 412, "false_positives": 150, "confirmed": 262, "backtest_precision": 0.91,
             "backtest_recall": 0.88, "false_kills_prevented": 6, "gpu_hours_given_up": 12.5, "status": "active",
             "note": None, "model": "{}", "run_id": "nightly"}
    store.execute("insert_verifier_model", model)
    store.execute("insert_verifier_model", {**model, "model_id": "v2", "trained_at": UNTIL + HOUR})  # after the period
    v = kpis.compute(store, policy, SINCE, UNTIL)["verifier"]
    assert (v["model_id"], v["labels"], v["precision"], v["false_kills_prevented"], v["held"]) == ("v1", 412, 0.91, 6, 0)
    from gpu_cost.report.render import build_report

    out = build_report(store, policy, SINCE, UNTIL, tmp_path / "reports")
    html = open(out["index"]).read()
    assert "The verifier (a second opinion learnt from outcomes)" in html and "91 % / 88 %" in html
