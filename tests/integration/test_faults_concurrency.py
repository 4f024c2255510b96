"""Concurrency: two sweeps never act at once; the manual reclaim and the sweep make ONE action on a job.

The manual reclaim's decision (rule ``manual``) and the sweep's (rule ``idle_allocation``) have
different decision ids, so per-decision idempotency alone would let both act. The effect guard
(:mod:`gpu_cost.act.locks`) makes the second one ``skipped``, naming the action that did it — in
sequence and when both workers race, on a real Slurm job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_cost.core.model import Decision, decision_id

pytestmark = pytest.mark.integration


def _policy() -> Any:
    from gpu_cost.config.loader import parse_policy

    return parse_policy("version: 1\nmode: enforce\nprotections: []\n", "policy.yaml")


def _decision(rule: str, job_id: str, action: str) -> Decision:
    target = f"job:{job_id}"
    return Decision(decision_id=decision_id(rule, target, 1, 3), ts=time.time(), rule=rule, target_kind="job",
                    target=target, action=action, mode="enforce", rung=3, job_id=job_id, user="root", gpus=1,
                    reason=f"{rule}: {action}")


def _ctx(slurm_cluster: Any, run_id: str) -> Any:  # type: ignore[no-untyped-def]
    from gpu_cost.act.base import ActionContext
    from gpu_cost.perceive.runner import LocalRunner

    return ActionContext(policy=_policy(), dry_run=False, now=time.time(), run_id=run_id,
                         slurm=LocalRunner(env=slurm_cluster.env), sleep=time.sleep, extra={"grace_s": 5})


@pytest.fixture
def job(slurm_cluster) -> Iterator[str]:  # type: ignore[no-untyped-def]
    jid = slurm_cluster.submit("sleep 600\n", "--job-name=faults-race", "--cpus-per-task=1", "--mem=100")
    slurm_cluster.wait_state(jid, "RUNNING", timeout=30)
    yield jid
    slurm_cluster.run("scancel", "--signal=KILL", jid)


def _effects(store: Any, target: str) -> list[dict[str, Any]]:
    return store.query("SELECT * FROM gpu_cost_actions WHERE target = :t ORDER BY started_at", {"t": target})


def test_manual_reclaim_after_the_sweep_is_one_action(slurm_cluster, job, store) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.act import dispatch

    sweep_d = _decision("idle_allocation", job, "terminate")
    manual_d = _decision("manual", job, "cancel")
    store.record_decisions([sweep_d], "gpu_zombie_sweep:r1")
    store.record_decisions([manual_d], "gpu_manual_reclaim:m1")
    (first,) = dispatch.execute([sweep_d], _ctx(slurm_cluster, "gpu_zombie_sweep:r1"), store)
    (second,) = dispatch.execute([manual_d], _ctx(slurm_cluster, "gpu_manual_reclaim:m1"), store)
    assert first["status"] == "succeeded" and "scancel" in (first["command"] or "")
    assert second["status"] == "skipped" and dispatch.action_id(sweep_d) in (second["error"] or ""), second
    rows = _effects(store, f"job:{job}")
    assert [r["status"] for r in rows] == ["succeeded", "skipped"]
    slurm_cluster.wait_state(job, ("COMPLETED", "CANCELLED", "FAILED", "GONE"), timeout=30)


def test_manual_reclaim_racing_the_sweep_is_one_action(slurm_cluster, job, store) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.act import dispatch

    decisions = [(_decision("idle_allocation", job, "cancel"), "gpu_zombie_sweep:r2"),
                 (_decision("manual", job, "cancel"), "gpu_manual_reclaim:m2")]
    for d, run_id in decisions:
        store.record_decisions([d], run_id)
    barrier = threading.Barrier(2)
    results: dict[str, dict[str, Any]] = {}

    def worker(d: Decision, run_id: str) -> None:
        barrier.wait()
        (results[d.rule],) = dispatch.execute([d], _ctx(slurm_cluster, run_id), store)

    threads = [threading.Thread(target=worker, args=a) for a in decisions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    statuses = sorted(r["status"] for r in results.values())
    assert statuses == ["skipped", "succeeded"], results
    winner = next(r for r in results.values() if r["status"] == "succeeded")
    loser = next(r for r in results.values() if r["status"] == "skipped")
    assert winner["action_id"] in loser["error"]
    assert sorted(r["status"] for r in _effects(store, f"job:{job}")) == ["skipped", "succeeded"]
    slurm_cluster.wait_state(job, ("COMPLETED", "CANCELLED", "FAILED", "GONE"), timeout=30)


def test_a_different_effect_on_the_same_job_is_not_blocked(slurm_cluster, job, store) -> None:  # type: ignore[no-untyped-def]
    """An operator's demote does not stop the sweep's later cancel: they are different effects."""
    from gpu_cost.act import dispatch

    (a,) = dispatch.execute([_decision("manual", job, "demote")], _ctx(slurm_cluster, "m3"), store)
    (b,) = dispatch.execute([_decision("idle_allocation", job, "cancel")], _ctx(slurm_cluster, "r3"), store)
    assert a["status"] == "succeeded" and b["status"] == "succeeded"
    slurm_cluster.wait_state(job, ("COMPLETED", "CANCELLED", "FAILED", "GONE"), timeout=30)


def test_run_guard_one_of_two_overlapping_sweeps_acts(store) -> None:  # type: ignore[no-untyped-def]
    from gpu_cost.act.locks import run_conflict

    now = time.time()
    dag = "gpu_zombie_sweep"
    store.begin_run(f"{dag}:scheduled", dag_id=dag, started_at=now - 20, data_ts=now - 300, source="sim", mode="enforce")
    store.begin_run(f"{dag}:manual", dag_id=dag, started_at=now - 10, data_ts=now - 100, source="sim", mode="enforce")
    assert run_conflict(store, f"{dag}:scheduled", dag, now=now) is None
    assert run_conflict(store, f"{dag}:manual", dag, now=now) == f"{dag}:scheduled"
    # once the first run finishes, the second may act
    store.finish_run(f"{dag}:scheduled", status="ok", finished_at=now)
    assert run_conflict(store, f"{dag}:manual", dag, now=now) is None
    # a run that already started acting blocks even an earlier-started one
    store.begin_run(f"{dag}:early", dag_id=dag, started_at=now - 30, data_ts=now, source="sim", mode="enforce")
    store.action_started(action_id="x:cancel", decision_id="x", run_id=f"{dag}:manual", action="cancel",
                         target="job:1", executor="test", dry_run=False, started_at=now)
    assert run_conflict(store, f"{dag}:early", dag, now=now) == f"{dag}:manual"
    # a 'running' row whose worker died long ago blocks nobody
    store.begin_run(f"{dag}:dead", dag_id=dag, started_at=now - 7200, data_ts=now - 7200, source="sim", mode="enforce")
    store.finish_run(f"{dag}:early", status="ok", finished_at=now)
    store.finish_run(f"{dag}:manual", status="ok", finished_at=now)
    store.begin_run(f"{dag}:next", dag_id=dag, started_at=now, data_ts=now, source="sim", mode="enforce")
    assert run_conflict(store, f"{dag}:next", dag, now=now) is None
    # a run waiting for a human's answer (the approval operator marks it) holds up nobody
    store.begin_run(f"{dag}:asking", dag_id=dag, started_at=now - 5, data_ts=now - 300, source="sim", mode="enforce")
    assert run_conflict(store, f"{dag}:next", dag, now=now) == f"{dag}:asking"
    store.execute("mark_run_awaiting", {"run_id": f"{dag}:asking"})
    assert store.get_run(f"{dag}:asking")["status"] == "awaiting_approval"
    assert run_conflict(store, f"{dag}:next", dag, now=now) is None
    # and the mark never overwrites a finished run's status
    store.execute("mark_run_awaiting", {"run_id": f"{dag}:next"})
    store.finish_run(f"{dag}:next", status="ok", finished_at=now)
    store.execute("mark_run_awaiting", {"run_id": f"{dag}:next"})
    assert store.get_run(f"{dag}:next")["status"] == "ok"
