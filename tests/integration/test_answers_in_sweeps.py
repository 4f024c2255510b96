"""Answers mean what they say, over real sweeps of the simulated cluster with their notices delivered.

Each sweep runs as the sweep DAG runs it (collect → detect → decide → record) and its notices go
out through the dispatcher to the loopback Slack stand-in, so the ladders advance as they do in a
deployment. Then the owner (or their manager) answers, and the later sweeps show what it changed:

- "keep" on a zombie's notice holds what the notice named — the process, the job it still
  names, its GPU — for the time chosen, even though the process carries its former job's id;
- "this is wrong" ends the episode and holds the target for at most ``snooze.max_duration``;
  after that the target is found and decided again from the first rung, and the answer labels
  only the episode it was given in.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from gpu_cost.act import dispatch
from gpu_cost.act.base import ActionContext
from gpu_cost.audit.store import AuditStore
from gpu_cost.config.loader import parse_policy
from gpu_cost.config.schema import Policy
from gpu_cost.core import paths
from gpu_cost.core.model import Decision
from gpu_cost.core.timeutil import iso
from gpu_cost.decide import answers
from gpu_cost.decide.answers import Answer
from gpu_cost.learn import outcomes
from gpu_cost.loop import sweep
from gpu_cost.sim import cluster as sim

pytestmark = pytest.mark.integration

KEY = b"test-link-key"
# the notice limit is not what these tests are about: every notice of their sweeps goes out
POLICY = """
mode: enforce
notifications: {max_per_user_per_hour: 100}
people:
  bob: {slack: UBOB, email: bob@example.org, manager: dave}
  carol: {slack: UCAROL, email: carol@example.org, manager: dave}
  dave: {slack: UDAVE, email: dave@example.org}
"""
#: a fixed day of the simulated cluster (its jobs are offsets from it)
ANCHOR = 1_795_392_000.0  # 2026-11-22T00:00:00Z
T0 = ANCHOR + 12 * 3600


@pytest.fixture
def policy() -> Policy:
    return parse_policy(POLICY)


@pytest.fixture
def webhook(slack_sink: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AIRFLOW_CONN_GPU_COST_SLACK",
                       json.dumps({"conn_type": "slackwebhook", "password": slack_sink.webhook_url()}))
    return slack_sink


def _scenario(*, anchor: float | str, zombie_keeps_job_id: bool = False) -> sim.Scenario:
    data = yaml.safe_load(paths.default_scenario().read_text())
    data["anchor"] = anchor if isinstance(anchor, str) else iso(anchor)
    for job in data["jobs"]:
        if job["job_id"] == "1002":
            job["keeps_job_id"] = zombie_keeps_job_id
    return sim.scenario_from_dict(data, "default.yaml (test)")


def _sweep(policy: Policy, store: AuditStore, now: float, run_id: str, scenario: sim.Scenario) -> dict[str, Any]:
    """One sweep, then its act step for the notices (what the sweep DAG does)."""
    run_id = f"gpu_zombie_sweep:{run_id}"
    out = sweep.run_once(policy, now, store, run_id=run_id, source="sim", scenario=scenario)
    notices = [Decision.from_row(r) for r in store.decisions_of_run(run_id)
               if r["status"] == "decided" and r["action"] == "notify"]
    ctx = ActionContext(policy=policy, dry_run=False, now=now, run_id=run_id, sleep=lambda s: None, source="sim")
    for result in dispatch.execute(notices, ctx, store):
        assert result["status"] == "succeeded", result
    return out


def _answer(policy: Policy, decision_id: str, decided_at: float, choice: str, who: str, *, hours: float = 4,
            reason: str = "") -> Answer:
    for o in answers.offers(decision_id, decided_at, policy, KEY, recipient=who):
        if o.choice == choice and (choice != "keep" or o.duration_s == hours * 3600):
            claims = answers.read_token(o.token, KEY, decided_at)
            return Answer("link", claims, f"link:{claims['n']}", who, who, reason=reason)
    raise AssertionError(f"no {choice} offer")


def _of(run: dict[str, Any], target: str) -> list[tuple[str, int]]:
    return [(d["action"], d["rung"]) for d in run["decisions"] if d["target"] == target]


def test_keep_on_a_zombie_notice_holds_the_process_its_former_job_and_its_gpu(policy, webhook, store) -> None:  # type: ignore[no-untyped-def]
    scenario = _scenario(anchor=ANCHOR, zombie_keeps_job_id=True)
    first = _sweep(policy, store, T0, "z1", scenario)
    [zombie] = [d for d in first["decisions"] if d["rule"] == "zombie"]
    # the process outlived job 1002 and still names it (SLURM_JOB_ID in its environment)
    assert zombie["target"].startswith("proc:gpu01:") and zombie["job_id"] == "1002"
    assert (zombie["user"], zombie["action"]) == ("bob", "notify")
    assert any("bob" in str(r.body) or "UBOB" in str(r.body) for r in webhook.requests)  # bob was told

    keep = _answer(policy, zombie["decision_id"], T0, "keep", "bob", reason="copying results off it")
    row = answers.apply(store, policy, keep, now=T0 + 60)
    assert row["status"] == "accepted"
    held = {s["target"] for s in store.active_snoozes(T0 + 120)}
    assert held == {zombie["target"], "job:1002", "gpu:gpu01:4"}

    # the kill rung is due 15 min after the notice: the keep holds it for its 4 h
    for k, at in enumerate((T0 + 1800, T0 + 2 * 3600, T0 + 60 + 4 * 3600 - 300)):
        run = _sweep(policy, store, at, f"z{k + 2}", scenario)
        assert _of(run, zombie["target"]) == [], f"decided at +{(at - T0) / 60:.0f} min despite the keep"
        assert zombie["target"] in [s["target"] for s in run["snoozed"]]
    # after it, the ladder goes on where it stood
    later = _sweep(policy, store, T0 + 60 + 4 * 3600 + 300, "z9", scenario)
    assert _of(later, zombie["target"]) == [("kill_process", 1)]


def test_wrong_ends_the_episode_expires_and_labels_once(policy, webhook, store) -> None:  # type: ignore[no-untyped-def]
    scenario = _scenario(anchor="day")  # every observed day looks the same: job 1003 idles on each
    first = _sweep(policy, store, T0, "w1", scenario)
    [notice] = [d for d in first["decisions"] if d["target"] == "job:1003"]
    assert (notice["user"], notice["action"], notice["rung"]) == ("carol", "notify", 0)

    wrong = _answer(policy, notice["decision_id"], T0, "wrong", "dave", reason="our evaluation server")
    row = answers.apply(store, policy, wrong, now=T0 + 60)
    hold = policy.snooze.max_duration
    assert row["status"] == "accepted" and float(row["until_ts"]) == T0 + 60 + hold

    for k, at in enumerate((T0 + 3600, T0 + 86400, T0 + 60 + hold - 300)):
        run = _sweep(policy, store, at, f"w{k + 2}", scenario)
        assert _of(run, "job:1003") == [], f"decided {(at - T0) / 86400:.1f} d after 'this is wrong'"
        [why] = [w["why"] for w in run["waiting"] if w["target"] == "job:1003"]
        assert why.startswith("answered 'this is wrong' by dave: left alone until ")
    # the answer has expired: a new episode, from the first rung (not the manager's notice that came next)
    after = _sweep(policy, store, T0 + 60 + hold + 300, "w9", scenario)
    [again] = [d for d in after["decisions"] if d["target"] == "job:1003"]
    assert (again["action"], again["rung"]) == ("notify", 0)
    assert store.get_decision(again["decision_id"])["episode"] == 2

    # the verifier learns from the answer once: the episode it was given in, not the next one
    labels = {o["decision_id"]: o["outcome"]
              for o in outcomes.compute(store, T0 + 60 + hold + 600, policy.verifier.horizon, T0 - 1)
              if o["target"] == "job:1003"}
    assert labels[notice["decision_id"]] == "wrong"
    assert labels[again["decision_id"]] != "wrong"
    assert list(labels.values()).count("wrong") == 1
