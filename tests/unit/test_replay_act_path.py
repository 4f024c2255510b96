"""The replay acts through the one act path (:func:`gpu_cost.act.dispatch.execute`), as every way in does.

Each action the replay lists has its audit row written by the dispatcher (``gpu_cost_actions``, executor
``gpu_cost.sim.replay``: the trace's executor, stamped in trace time); nothing is carried out that the
sweep's own rule would not (:func:`gpu_cost.decide.engine.may_act` on the decision as it stood when its
action started: live, not capped, approved when it asked); and the rolling caps are the dispatcher's,
counted in trace time with the replay counted as the sweep (``caps.entry_points.sweep``). The trace and
the store are real; only the GPUs are simulated.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gpu_cost.act import dispatch
from gpu_cost.act.base import REGISTRY, ActionContext, Outcome
from gpu_cost.audit.store import AuditStore
from gpu_cost.cli.commands.simtrace import write_scenario_trace
from gpu_cost.config.loader import load_policy
from gpu_cost.config.schema import Caps, RollingCaps
from gpu_cost.core.model import DESTRUCTIVE_ACTIONS, Decision
from gpu_cost.core.timeutil import epoch
from gpu_cost.decide.engine import may_act
from gpu_cost.sim.cluster import scenario_from_dict
from gpu_cost.sim.replay import replay_files
from tests.fixtures.core import ROOT

END = 1795910400.0
SPAN = 10 * 3600.0  # the destructive rungs fall due in its last hours
#: six jobs idle after 30 min of work, started together (their destructive rungs fall due in the same sweeps),
#: one of them asking for approval, beside one job at work
JOBS = [{"job_id": f"30{i}", "user": f"u{i}", "behaviour": "idle", "node": "g1", "gpus": [i], "start": "-9h",
         "busy_first": "30m", "name": f"eval{i}", **({"comment": "gpu-cost:approval-required"} if i == 0 else {})}
        for i in range(6)]
JOBS.append({"job_id": "399", "user": "cat", "behaviour": "training", "node": "g1", "gpus": [6, 7], "start": "-9h",
             "name": "train"})
WIDE = RollingCaps(max_actions_per_hour=1000, max_actions_per_day=1000, max_gpu_share_per_hour=1.0,
                   max_gpu_share_per_day=1.0)


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("act-path")
    sc = scenario_from_dict({"seed": 5, "anchor": END, "jobs": JOBS,
                             "nodes": [{"name": "g1", "gpus": 8, "model": "a100", "mem_total_mib": 40960}]})
    write_scenario_trace(out, sc, END - SPAN, END)
    return out


def _policy(sweep_per_hour: int | None = None) -> Any:
    shipped = load_policy(ROOT / "include" / "policy" / "default.yaml")
    entry = {} if sweep_per_hour is None else {"sweep": dataclasses.replace(WIDE, max_actions_per_hour=sweep_per_hour)}
    p = dataclasses.replace(shipped, caps=Caps(max_actions_per_run=20, max_gpu_share=1.0, rolling=WIDE,
                                               entry_points=entry))  # type: ignore[arg-type]
    object.__setattr__(p, "source", shipped.source)
    return p


def _replay(trace: Path, policy: Any, tmp: Path) -> tuple[dict[str, Any], AuditStore]:
    store = AuditStore(f"sqlite:///{tmp / 'replay.db'}").ensure_schema()
    res = replay_files(trace / "samples.parquet", trace / "jobs.csv", policy, store=store).to_dict()
    return res, store


def _as_it_stood(store: AuditStore, decision_id: str) -> dict[str, Any]:
    """Return the decision row as it stood when its action started (before the dispatcher marked it acted)."""
    row = dict(store.query("SELECT * FROM gpu_cost_decision_log WHERE decision_id = :d", {"d": decision_id})[0])
    for e in store.decision_events(decision_id):
        if e["status"] == "acted":
            break
        if e["status"] is not None:
            row["status"] = e["status"]
        if e["approval_status"] is not None:
            row["approval_status"] = e["approval_status"]
    return row


def test_every_replayed_action_went_through_the_dispatcher_and_the_sweeps_rule(trace: Path, tmp_path: Path) -> None:
    res, store = _replay(trace, _policy(), tmp_path)
    rows = store.query("SELECT * FROM gpu_cost_actions ORDER BY started_at, action_id")
    done = [r for r in rows if r["status"] == "succeeded"]
    assert res["kills"] > 0 and res["human_asked_count"] > 0  # a case that kills, and asks a human first
    # one audit row per listed action, written by the dispatcher for the trace's executor, in trace time
    assert sorted((a["target"], a["action"], epoch(a["ts"])) for a in res["actions"]) == sorted(
        (r["target"], r["action"], epoch(r["started_at"])) for r in done)
    assert {r["executor"] for r in rows} == {"gpu_cost.sim.replay"} and {r["dry_run"] for r in rows} == {0}
    assert all(r["run_id"] == f"replay:{int(epoch(r['started_at']))}" for r in rows)
    # the sweep's own rule allowed each of them, as the decision stood then (the simulated approver's answer
    # is in the store, as a human's would be)
    for r in done:
        assert may_act(_as_it_stood(store, r["decision_id"])), r
    approved = {r["decision_id"] for r in done if _as_it_stood(store, r["decision_id"])["requires_approval"]}
    assert approved and all(_as_it_stood(store, d)["approval_status"] == "approved" for d in approved)
    # the ladder moved with each action (the dispatcher advances it), and the ledger booked each kill once
    kills = [r for r in done if r["action"] in ("terminate", "kill", "cancel", "kill_process")]
    assert res["ledger"]["savings"] == len({r["target"] for r in kills}) > 0


def test_the_rolling_caps_are_the_dispatchers_counted_in_trace_time_as_the_sweep(trace: Path, tmp_path: Path) -> None:
    free, _ = _replay(trace, _policy(), tmp_path / "free")
    res, store = _replay(trace, _policy(sweep_per_hour=2), tmp_path / "capped")
    destructive = [a for a in free["actions"] if a["action"] in DESTRUCTIVE_ACTIONS]
    assert max(sum(1 for b in destructive if 0 <= epoch(a["ts"]) - epoch(b["ts"]) < 3600) for a in destructive) > 2
    rows = store.query("SELECT * FROM gpu_cost_actions ORDER BY started_at")
    started = [epoch(r["started_at"]) for r in rows if r["action"] in DESTRUCTIVE_ACTIONS and r["status"] != "skipped"]
    # never more than 2 destructive actions in any hour of the trace
    assert started and all(sum(1 for s in started if t - 3600 < s <= t) <= 2 for t in started)
    capped = [r for r in rows if r["status"] == "skipped"]
    assert capped and all("caps.entry_points.sweep.max_actions_per_hour=2" in r["error"] for r in capped)
    assert res["rolling_capped"] == len(capped)
    listed = [a for a in res["actions"] if a["action"] in DESTRUCTIVE_ACTIONS]
    assert len(listed) == len(started)
    # a cap is a rate, not a verdict: each rung it held back was carried out by a later sweep that proposed it
    # again (a new attempt row, counted when it started), never earlier than without the cap
    assert sorted((a["target"], a["action"]) for a in listed) == sorted((a["target"], a["action"]) for a in destructive)
    when = {(a["target"], a["action"]): epoch(a["ts"]) for a in listed}
    delays = [when[(a["target"], a["action"])] - epoch(a["ts"]) for a in destructive]
    assert min(delays) >= 0 and max(delays) >= 3600
    retried = [r for r in rows if "~" in r["action_id"] and r["status"] == "succeeded"]
    assert retried and all(store.get_action(r["action_id"].split("~")[0])["status"] == "skipped" for r in retried)


def test_a_simulated_clusters_executor_acts_on_simulated_data_in_its_own_time(tmp_path: Path) -> None:
    """The dispatcher side: an executor that says it acts on a simulated cluster is not refused on simulated
    data, and its rows and caps are in the context's time; a real executor still is refused."""

    def on_trace(d: Decision, ctx: ActionContext) -> Outcome:
        return Outcome("succeeded", output="simulated")

    on_trace.touches_cluster = True  # type: ignore[attr-defined]
    on_trace.simulated = True  # type: ignore[attr-defined]
    store = AuditStore(f"sqlite:///{tmp_path / 'a.db'}").ensure_schema()
    policy = _policy(sweep_per_hour=1)
    t = END - SPAN
    ds = [Decision(decision_id=f"k{i}", ts=t, rule="idle_allocation", target_kind="job", target=f"job:{i}",
                   action="cancel", mode="enforce", gpus=1, user="ann", reason="idle") for i in range(3)]
    store.record_decisions(ds, "replay:1")
    saved = dict(REGISTRY)
    try:
        dispatch.load_executors()
        real = REGISTRY["cancel"]
        REGISTRY["cancel"] = on_trace
        out = [dispatch.execute_one(d, ActionContext(policy=policy, dry_run=False, now=now, run_id="replay:1",
                                                     source="trace", cluster_gpus=8), store)
               for d, now in zip(ds, (t, t + 1800, t + 3700), strict=True)]
        REGISTRY["cancel"] = real
        refused = dispatch.execute_one(dataclasses.replace(ds[0], decision_id="k9", target="job:9"), ActionContext(
            policy=policy, dry_run=False, now=t + 7200, run_id="replay:2", source="trace", cluster_gpus=8), store)
    finally:
        REGISTRY.clear()
        REGISTRY.update(saved)
    assert [o["status"] for o in out] == ["succeeded", "skipped", "succeeded"]  # the second within the hour
    assert "caps.entry_points.sweep.max_actions_per_hour=1" in str(out[1]["error"])
    assert [epoch(r["started_at"]) for r in store.query("SELECT started_at FROM gpu_cost_actions ORDER BY action_id")
            ][:3] == [t, t + 1800, t + 3700]
    assert refused["status"] == "skipped" and "simulated data never drives a real executor" in str(refused["error"])


def test_the_ledger_names_the_model_of_the_freed_gpus_host(tmp_path: Path) -> None:
    """A kill of a process of no job is booked at its host's GPU model, as the usage record of the last two
    days names it (read for that host alone: the replay's and the live agent's savings hook run per kill)."""
    from gpu_cost.act import savings

    store = AuditStore(f"sqlite:///{tmp_path / 'a.db'}").ensure_schema()
    zero = dict.fromkeys(("total_gpu_s", "allocated_gpu_s", "busy_gpu_s", "idle_alloc_gpu_s", "zombie_gpu_s",
                          "util_sum"), 0.0)
    for ts, host, model in ((END - 3600, "g1", "a100"), (END - 3600, "g2", "h100"), (END - 3 * 86400, "g2", "b200"),
                            (END - 60, "g2", "")):
        store.execute("upsert_usage", {"ts": ts, "interval_s": 300.0, "host": host, "gpu_model": model,
                                       "user_name": "u", "account": "", "partition_name": "", "gpus": 8,
                                       "run_id": "r", "data_ts": ts, **zero})
    d = Decision(decision_id="z", ts=END, rule="zombie", target_kind="process", target="proc:g2:4242",
                 action="kill_process", mode="enforce", episode=1, user="bob", gpus=1,
                 evidence={"window_s": 900, "gpu_ids": ["g2:3"]})
    row = savings.saving_row(d, _policy(), store, END)
    assert row is not None and row["gpu_model"] == "h100"
