"""A notice held back by the per-user rate limit is sent by a later sweep, never lost, never doubled."""

from __future__ import annotations

import pytest

from gpu_cost.act import base, dispatch
from gpu_cost.act.base import ActionContext, Outcome
from gpu_cost.core.model import Decision, decision_id
from tests.fixtures.core import NOW


@pytest.fixture
def flaky_notify():  # type: ignore[no-untyped-def]
    dispatch.load_executors()
    calls: list[str] = []
    answers = [Outcome("skipped", error="rate limit: u already got 4 notices in the last hour"), Outcome("succeeded", output="sent")]

    def executor(d, ctx):  # type: ignore[no-untyped-def]
        calls.append(d.decision_id)
        return answers[min(len(calls) - 1, 1)]

    saved = base.REGISTRY.get("notify")
    base.REGISTRY["notify"] = executor
    yield calls
    if saved is None:
        base.REGISTRY.pop("notify", None)
    else:
        base.REGISTRY["notify"] = saved


def test_rate_limited_notice_is_retried_once_then_final(store, policy, flaky_notify) -> None:  # type: ignore[no-untyped-def]
    d = Decision(decision_id=decision_id("idle_allocation", "job:1", 1, 0), ts=NOW, rule="idle_allocation",
                 target_kind="job", target="job:1", action="notify", mode="enforce", job_id="1", user="u", gpus=1)
    store.record_decisions([d], "r1")
    ctx = ActionContext(policy=policy, dry_run=False, now=NOW, run_id="r1")
    first = dispatch.execute_one(d, ctx, store)
    assert first["status"] == "skipped"
    second = dispatch.execute_one(d, ctx, store)
    assert second["status"] == "succeeded"
    third = dispatch.execute_one(d, ctx, store)
    assert third["status"] == "succeeded" and third["repeated"] is False
    assert len(flaky_notify) == 2
    row = store.get_action(dispatch.action_id(d))
    assert row["status"] == "succeeded" and row["attempt"] == 2


def test_failed_action_is_retried_a_bounded_number_of_times(store, policy) -> None:  # type: ignore[no-untyped-def]
    dispatch.load_executors()
    calls: list[str] = []

    def broken(d, ctx):  # type: ignore[no-untyped-def]
        calls.append(d.decision_id)
        return Outcome("failed", error="slurm controller unreachable")

    saved = base.REGISTRY.get("demote")
    base.REGISTRY["demote"] = broken
    try:
        d = Decision(decision_id=decision_id("idle_allocation", "job:2", 1, 2), ts=NOW, rule="idle_allocation",
                     target_kind="job", target="job:2", action="demote", mode="enforce", rung=2, job_id="2", user="u",
                     gpus=1)
        store.record_decisions([d], "r1")
        ctx = ActionContext(policy=policy, dry_run=False, now=NOW, run_id="r1")
        statuses = [dispatch.execute_one(d, ctx, store)["status"] for _ in range(5)]
    finally:
        if saved is None:
            base.REGISTRY.pop("demote", None)
        else:
            base.REGISTRY["demote"] = saved
    assert statuses == ["failed"] * 5
    assert len(calls) == dispatch.MAX_ATTEMPTS, "retried, but only a bounded number of times"
    assert store.get_action(dispatch.action_id(d))["attempt"] == dispatch.MAX_ATTEMPTS
