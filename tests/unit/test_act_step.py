"""The one act step (:func:`gpu_cost.act.step.act_run`): every way in carries out exactly what the sweep would.

A property test over random runs: decisions on every target kind (job, process, node, reservation),
in every mode, with and without a human's answer, in every decision status, on clusters of known and
unknown size. Whichever way in hands the run to the step (the sweep's two branches, the manual
reclaim's two, the power DAG's one per action), what reaches an executor is exactly the decisions
the sweep's own rule allows (:func:`gpu_cost.decide.engine.may_act`, the batch caps) — never more,
never twice. The executors are a recorder: the cluster is what this test simulates, the store is real.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_cost.act import dispatch
from gpu_cost.act.base import REGISTRY, ActionContext, Outcome
from gpu_cost.act.step import CapExceeded, act_run
from gpu_cost.audit.store import AuditStore
from gpu_cost.config.loader import load_policy
from gpu_cost.core.model import Decision, Snapshot
from gpu_cost.decide.engine import check_caps, may_act
from tests.fixtures.core import NOW, ROOT

BASE = load_policy(ROOT / "include" / "policy" / "default.yaml")
ACTIONS_BY_KIND = {"job": ("notify", "demote", "cancel"), "process": ("notify", "kill_process"),
                   "node": ("power_down", "power_up"), "reservation": ("notify", "release_reservation")}


class Recorder:
    """An executor for every action: records what reached it (the simulated cluster)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, d: Decision, ctx: ActionContext) -> Outcome:
        self.calls.append(d.decision_id)
        return Outcome("succeeded", output="recorded")


@contextlib.contextmanager
def recording() -> Iterator[Recorder]:
    dispatch.load_executors()
    saved = dict(REGISTRY)
    rec = Recorder()
    try:
        for name in saved:
            REGISTRY[name] = rec
        yield rec
    finally:
        REGISTRY.clear()
        REGISTRY.update(saved)


@st.composite
def runs(draw: Any) -> tuple[list[tuple[Decision, str, str | None]], int, int]:
    """A run's decisions (each with its stored status and answer), the cluster's size, the per-run cap."""
    n = draw(st.integers(1, 8))
    out = []
    for i in range(n):
        kind = draw(st.sampled_from(sorted(ACTIONS_BY_KIND)))
        action = draw(st.sampled_from(ACTIONS_BY_KIND[kind] + ("none",)))
        d = Decision(decision_id=f"d{i}", ts=NOW, rule=draw(st.sampled_from(["idle_allocation", "offhours", "zombie"])),
                     target_kind=kind, target=f"{kind}:{i}", action=action,
                     mode=draw(st.sampled_from(["dry-run", "notify", "enforce"])),
                     gpus=draw(st.integers(0, 8)), user="alice",
                     requires_approval=draw(st.booleans()), reason="test")
        status = draw(st.sampled_from(["decided", "decided", "recorded", "snoozed", "capped", "expired", "failed"]))
        answer = draw(st.sampled_from([None, "approved", "rejected", "timed_out"])) if d.requires_approval else None
        out.append((d, status, answer))
    return out, draw(st.sampled_from([0, 16, 64, 1024])), draw(st.integers(1, 10))


def _store(tmp: Any, decisions: list[tuple[Decision, str, str | None]], gpus: int, run_id: str) -> AuditStore:
    store = AuditStore(f"sqlite:///{tmp}").ensure_schema()
    store.begin_run(run_id, dag_id=run_id.split(":", 1)[0], started_at=NOW, data_ts=NOW, source="sim", mode="enforce")
    if gpus:
        import pandas as pd

        frame = pd.DataFrame({"host": [f"n{i // 8}" for i in range(gpus)], "gpu": [i % 8 for i in range(gpus)]})
        store.save_snapshot(run_id, NOW, Snapshot(ts=NOW, window_s=300.0, lookback_s=3600.0, source="sim",
                                                  gpus=frame).to_json())
    for d, status, answer in decisions:
        store.record_decisions([d], run_id, status=status)
        if answer is not None:
            store.set_approval(d.decision_id, answer, "lead", NOW)
    return store


ENTRIES = [("gpu_zombie_sweep", "automatic"), ("gpu_zombie_sweep", "approved"), ("gpu_manual_reclaim", "automatic"),
           ("gpu_manual_reclaim", "approved"), ("gpu_offhours_power", "all")]


@pytest.mark.parametrize(("dag_id", "branch"), ENTRIES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(case=runs())
def test_every_way_in_acts_exactly_where_the_sweep_would(tmp_path_factory: Any, dag_id: str, branch: str,
                                                         case: Any) -> None:
    decisions, gpus, per_run = case
    policy = dataclasses.replace(BASE, mode="enforce", caps=dataclasses.replace(BASE.caps, max_actions_per_run=per_run))
    run_id = f"{dag_id}:r"
    store = _store(tmp_path_factory.mktemp("s") / "audit.db", decisions, gpus, run_id)
    rows = {r["decision_id"]: r for r in store.decisions_of_run(run_id)}
    # the sweep's own rule, written out independently of the step
    in_branch = {did for did, r in rows.items()
                 if r["mode"] != "dry-run" and r["action"] != "none" and r["status"] not in ("recorded", "snoozed")
                 and (branch == "all" or bool(r["requires_approval"]) == (branch == "approved"))
                 and may_act(r, approved_only=branch == "approved")}
    plan = [Decision.from_row(r) for r in rows.values()
            if r["mode"] != "dry-run" and r["action"] != "none" and r["status"] in ("decided", "failed", "acted", "capped")]
    capped = check_caps(plan, policy, gpus)  # the caps hold the run's whole plan, whichever branch acts

    def ctx(now: float, total: int, run: Any) -> ActionContext:
        assert total == gpus  # the size the run's snapshot recorded, never a caller's
        return ActionContext(policy=policy, dry_run=False, now=now, run_id=run_id, extra={"store": store})

    with recording() as rec:
        if capped:
            with pytest.raises(CapExceeded):
                act_run(store, run_id, policy, branch, context=ctx)  # type: ignore[arg-type]
            assert rec.calls == []
            assert {r["decision_id"] for r in store.decisions_of_run(run_id) if r["status"] == "capped"} >= {
                d.decision_id for d in plan}
            return
        out = act_run(store, run_id, policy, branch, context=ctx)  # type: ignore[arg-type]
        assert sorted(rec.calls) == sorted(in_branch)
        assert {d.decision_id for d in out.chosen} == in_branch
        # a retried task (a worker lost after acting) carries out nothing twice
        act_run(store, run_id, policy, branch, context=ctx)  # type: ignore[arg-type]
        assert sorted(rec.calls) == sorted(in_branch)


def test_an_unknown_cluster_size_refuses_destructive_actions_at_every_way_in(tmp_path: Any) -> None:
    d = Decision(decision_id="k", ts=NOW, rule="idle_allocation", target_kind="job", target="job:1", action="cancel",
                 mode="enforce", gpus=4, user="alice", reason="idle")
    for dag_id, branch in ENTRIES:
        if branch == "approved":
            continue
        run_id = f"{dag_id}:unknown"
        store = _store(tmp_path / f"{dag_id}.db", [(d, "decided", None)], 0, run_id)
        with recording() as rec, pytest.raises(CapExceeded, match="unknown size"):
            act_run(store, run_id, dataclasses.replace(BASE, mode="enforce"), branch,  # type: ignore[arg-type]
                    context=lambda now, total, run: ActionContext(policy=BASE, dry_run=False, now=now, run_id=run_id))
        assert rec.calls == [] and store.decisions_of_run(run_id)[0]["status"] == "capped"


def test_the_health_alert_is_an_action_of_the_one_path(tmp_path: Any, slack_sink: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from gpu_cost.loop import health

    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLACK",
                       json.dumps({"conn_type": "slackwebhook", "password": slack_sink.webhook_url()}))
    slack_sink.reset()
    policy = dataclasses.replace(BASE, notifications=dataclasses.replace(BASE.notifications, slack_channel="#ops"))
    store = AuditStore(f"sqlite:///{tmp_path / 'a.db'}").ensure_schema()
    store.begin_run("gpu_zombie_sweep:h", dag_id="gpu_zombie_sweep", started_at=NOW, data_ts=NOW, source="sim",
                    mode="enforce")
    for _ in range(2):  # a retried finish task posts once
        health.degraded_alert(store, policy, run_id="gpu_zombie_sweep:h", dag_id="gpu_zombie_sweep",
                              status="degraded", problems=["prometheus: down"], now=NOW)
    (row,) = store.query("SELECT action, status, executor FROM gpu_cost_actions")
    assert row["action"] == "alert_ops" and row["status"] == "succeeded" and row["executor"] == "gpu_cost.act.ops"
    assert len(slack_sink.texts()) == 1 and "prometheus: down" in slack_sink.texts()[0]


def test_a_rung_a_rolling_cap_held_back_is_carried_out_by_the_next_sweep_that_proposes_it(tmp_path: Any) -> None:
    """A cap is a rate, not a verdict (the sweep, live): of three cancels due at once under a cap of one per
    hour, one acts; the next sweep proposes the other two again and the step acts on one of them an hour later,
    under a new attempt row; a human's yes given to the first run carries over without a second question."""
    from gpu_cost.config.schema import Caps, RollingCaps
    from gpu_cost.decide.engine import Plan
    from gpu_cost.loop.sweep import record

    wide = RollingCaps(max_actions_per_hour=1000, max_actions_per_day=1000, max_gpu_share_per_hour=1.0,
                       max_gpu_share_per_day=1.0)
    policy = dataclasses.replace(BASE, mode="enforce", caps=Caps(  # type: ignore[arg-type]
        max_actions_per_run=20, max_gpu_share=1.0, rolling=wide,
        entry_points={"sweep": dataclasses.replace(wide, max_actions_per_hour=1)}))
    ds = [Decision(decision_id=f"k{i}", ts=NOW, rule="idle_allocation", target_kind="job", target=f"job:{i}",
                   action="cancel", mode="enforce", gpus=1, user="ann", reason="idle", requires_approval=i == 2)
          for i in range(3)]
    store = _store(tmp_path / "a.db", [], 16, "gpu_zombie_sweep:1")
    record(Plan(decisions=ds), store, "gpu_zombie_sweep:1", NOW)
    store.set_approval("k2", "approved", "lead", NOW)

    class OnCluster(Recorder):
        touches_cluster = True
        simulated = True  # the test's cluster: its clock is the run's data instant

    def act(run_id: str, branch: str) -> list[str]:
        rec = OnCluster()
        dispatch.load_executors()
        saved = dict(REGISTRY)
        try:
            REGISTRY["cancel"] = rec
            act_run(store, run_id, policy, branch, simulated_gpus=16,  # type: ignore[arg-type]
                    context=lambda now, total, run: ActionContext(policy=policy, dry_run=False, now=now,
                                                                  run_id=run_id, source="sim", cluster_gpus=total))
        finally:
            REGISTRY.clear()
            REGISTRY.update(saved)
        return rec.calls

    assert act("gpu_zombie_sweep:1", "automatic") == ["k0"]
    assert act("gpu_zombie_sweep:1", "approved") == []  # k2's yes: held back by the same cap
    assert {r["decision_id"]: r["status"] for r in store.decisions_of_run("gpu_zombie_sweep:1")} == {
        "k0": "acted", "k1": "capped", "k2": "capped"}
    # an hour and a minute later the next sweep proposes the two again (their ladder has not moved)
    later = NOW + 3660.0
    store.begin_run("gpu_zombie_sweep:2", dag_id="gpu_zombie_sweep", started_at=later, data_ts=later, source="sim",
                    mode="enforce")
    record(Plan(decisions=[dataclasses.replace(d, ts=later) for d in ds[1:]]), store, "gpu_zombie_sweep:2", later)
    assert sorted(r["decision_id"] for r in store.decisions_of_run("gpu_zombie_sweep:2")) == ["k1", "k2"]
    assert act("gpu_zombie_sweep:2", "automatic") == ["k1"]  # one an hour, and k2 (approved before) waits on it
    rows = {r["action_id"]: r for r in store.query("SELECT * FROM gpu_cost_actions")}
    assert rows["k1:cancel"]["status"] == "skipped" and rows["k1:cancel~2"]["status"] == "succeeded"
    assert rows["k2:cancel~2"]["status"] == "skipped" and "max_actions_per_hour=1" in rows["k2:cancel~2"]["error"]
    # the run after that: k2, whose yes carries over (the approved branch has nothing to ask)
    last = later + 3660.0
    store.begin_run("gpu_zombie_sweep:3", dag_id="gpu_zombie_sweep", started_at=last, data_ts=last, source="sim",
                    mode="enforce")
    record(Plan(decisions=[dataclasses.replace(ds[2], ts=last)]), store, "gpu_zombie_sweep:3", last)
    assert act("gpu_zombie_sweep:3", "approved") == []
    assert act("gpu_zombie_sweep:3", "automatic") == ["k2"]
    assert store.get_decision("k2")["status"] == "acted"


class _OnCluster(Recorder):
    touches_cluster = True
    simulated = True  # the test's cluster: its clock is the run's data instant


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(due=st.integers(1, 8), per_hour=st.integers(1, 4), gap_min=st.sampled_from([5, 20, 45, 61]))
def test_under_any_rolling_cap_every_held_rung_acts_later_and_no_hour_holds_more(
        tmp_path_factory: Any, due: int, per_hour: int, gap_min: int) -> None:
    """A property of the retry: ``due`` cancels fall due at once under a cap of ``per_hour`` an hour, and sweeps
    every ``gap_min`` minutes propose what has not acted yet. Every one acts, exactly once, never more than
    ``per_hour`` in any hour, and none waits longer than the cap makes it."""
    from gpu_cost.config.schema import Caps, RollingCaps
    from gpu_cost.decide.engine import Plan
    from gpu_cost.loop.sweep import record

    wide = RollingCaps(max_actions_per_hour=1000, max_actions_per_day=1000, max_gpu_share_per_hour=1.0,
                       max_gpu_share_per_day=1.0)
    policy = dataclasses.replace(BASE, mode="enforce", caps=Caps(  # type: ignore[arg-type]
        max_actions_per_run=20, max_gpu_share=1.0, rolling=wide,
        entry_points={"sweep": dataclasses.replace(wide, max_actions_per_hour=per_hour)}))
    ds = [Decision(decision_id=f"k{i}", ts=NOW, rule="idle_allocation", target_kind="job", target=f"job:{i}",
                   action="cancel", mode="enforce", gpus=1, user="ann", reason="idle") for i in range(due)]
    store = _store(tmp_path_factory.mktemp("retry") / "a.db", [], 64, "gpu_zombie_sweep:0")
    acted: dict[str, float] = {}
    hour_in_sweeps = -(-60 // gap_min)  # the sweeps from one act until the next hour's first sweep
    dispatch.load_executors()
    saved = dict(REGISTRY)
    try:
        for k in range(-(-due // per_hour) * hour_in_sweeps + 2):  # the cap's wait, and two sweeps more
            now, run_id = NOW + k * gap_min * 60.0, f"gpu_zombie_sweep:{k}"
            if k:
                store.begin_run(run_id, dag_id="gpu_zombie_sweep", started_at=now, data_ts=now, source="sim",
                                mode="enforce")
            left = [dataclasses.replace(d, ts=now) for d in ds if d.decision_id not in acted]
            if not left:
                break
            record(Plan(decisions=left), store, run_id, now)
            rec = _OnCluster()
            REGISTRY["cancel"] = rec
            act_run(store, run_id, policy, "automatic", simulated_gpus=64,  # type: ignore[arg-type]
                    context=lambda now, total, run, run_id=run_id: ActionContext(
                        policy=policy, dry_run=False, now=now, run_id=run_id, source="sim", cluster_gpus=total))
            assert not set(rec.calls) & set(acted)  # never twice
            acted.update(dict.fromkeys(rec.calls, now))
    finally:
        REGISTRY.clear()
        REGISTRY.update(saved)
    assert sorted(acted) == sorted(d.decision_id for d in ds)
    times = sorted(acted.values())
    assert all(sum(1 for s in times if t - 3600 < s <= t) <= per_hour for t in times)
    # each hour-long wait lets per_hour more act, at the first sweep after it
    hours = -(-due // per_hour) - 1
    assert times[-1] - NOW <= hours * hour_in_sweeps * gap_min * 60
